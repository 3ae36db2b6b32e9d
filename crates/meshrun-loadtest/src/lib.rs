//! Load test of the controller (see `tests/load.rs`): the `fake-worker`
//! binary stands in for the Python interpreter a run starts, and speaks the
//! control protocol through the same Rust client the real workers use.

/// The environment the fake worker reads besides meshrun's own contract.
pub const RATE_ENV: &str = "MESHRUN_LOAD_RATE";
pub const SECONDS_ENV: &str = "MESHRUN_LOAD_SECONDS";
/// Where to connect instead of `MESHRUN_CONTROL_ADDR`: a test's proxy
/// between the worker and the controller.
pub const CONNECT_ENV: &str = "MESHRUN_LOAD_CONNECT";
/// A JSON object of metrics added to every record.
pub const METRICS_ENV: &str = "MESHRUN_LOAD_METRICS";
/// At which record (from 0) a fake worker writes its part of a checkpoint
/// of that step, in attempts after the first (the scale rig's scenario).
pub const CHECKPOINT_AT_ENV: &str = "MESHRUN_LOAD_CHECKPOINT_AT";

pub mod proc_stats;
pub mod scale;

use std::path::{Path, PathBuf};

use meshrun_plan::FailurePolicy;
use meshrun_plan::{Entry, PlatformChoice, RunSpec, Tee};

/// A run of `nprocs` fake workers (the binary at `fake_worker`, standing
/// in for Python) with `env`, on one host, its folder under `runs_dir`.
pub fn spec(
    name: &str,
    nprocs: u32,
    runs_dir: &Path,
    fake_worker: &str,
    env: Vec<(String, String)>,
) -> RunSpec {
    RunSpec {
        nprocs,
        hosts: 1,
        devices_per_proc: None,
        gpus_per_proc: None,
        cpus_per_proc: None,
        memory_per_proc: None,
        platform: PlatformChoice::Cpu,
        name: Some(name.into()),
        runs_dir: runs_dir.to_path_buf(),
        tee: Tee::None,
        // The fake worker ignores its script; the plan needs one that exists.
        entry: Some(Entry::Script {
            path: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"),
            args: vec![],
        }),
        python: fake_worker.into(),
        agent_command: vec![],
        env,
        retention: None,
        checkpoint_every: None,
        recovery: meshrun_plan::Recovery::default(),
        on_save_error: meshrun_plan::SaveErrorPolicy::Continue,
        tensorboard: false,
        loss_metric: None,
        metrics_file: None,
        failure: FailurePolicy::default(),
        ray: None,
        control_host: None,
        control_port: None,
        resume_from: None,
        storage: None,
        listen: None,
        join_timeout_s: None,
        elastic: None,
        observe: meshrun_plan::Observe::default(),
    }
}

/// Runs `plan` to its end with no progress line, as the load tests do
/// (their output is the figures they print).
pub fn execute_quietly(plan: meshrun_plan::RunPlan) -> meshrun_core::Outcome {
    meshrun_core::execute(
        plan,
        meshrun_core::ExecOptions {
            progress: meshrun_core::controller::progress::ProgressMode::Off,
            ..meshrun_core::ExecOptions::default()
        },
    )
    .expect("the run ends")
}
