//! `--tensorboard`: a Python process of its own (`meshrun._tensorboard`,
//! which writes with tensorboardX) follows `metrics.jsonl` for the length of
//! the run, so writing event files costs the workers nothing.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::error::CoreError;
use meshrun_plan::RunPlan;

pub struct TensorBoard(Child);

impl TensorBoard {
    /// Starts the writer at the current end of `metrics.jsonl` (records of
    /// an earlier invocation of this run were written by its own writer).
    pub fn start(plan: &RunPlan) -> Result<Self, CoreError> {
        let offset = std::fs::metadata(plan.run_dir.join("metrics.jsonl")).map_or(0, |m| m.len());
        let child = Command::new(&plan.python)
            .args(["-m", "meshrun._tensorboard"])
            .arg(&plan.run_dir)
            .arg(offset.to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(CoreError::io(
                "cannot start the TensorBoard writer",
                Path::new(&plan.python),
            ))?;
        Ok(Self(child))
    }

    /// Lets it write what is left (SIGTERM), then waits for it.
    pub async fn stop(mut self) {
        if let Some(pid) = self.0.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(15), self.0.wait())
            .await
            .is_err()
        {
            let _ = self.0.kill().await;
        }
    }
}
