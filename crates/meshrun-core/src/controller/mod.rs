//! The controller: owns one run from start to end.
//!
//! [`execute`] creates the run directory, starts one agent per host, hands
//! out ranks and the environment contract, streams logs and metrics into the
//! run directory, and stops the whole group at the first failure. The
//! pieces: `server` accepts and authenticates connections, `output`
//! writes logs and tees them to the terminal, `summary` explains a
//! failure; the crate `meshrun-machine` makes every decision of an attempt
//! without I/O, `driver` carries them out (commits on the `committer`'s
//! thread), and `supervisor` runs attempts until the run ends. Each
//! worker's command and environment are built by `meshrun_plan::launch`.

mod agents;
mod checkpoints;
mod committer;
mod driver;
mod joining;
mod memory_use;
mod observe;
mod output;
mod profiles;
pub mod progress;
mod rank_logs;
pub mod remote;
mod restarts;
mod save_health;
mod server;
mod stacks;
mod summary;
mod supervisor;
mod tensorboard;
pub mod terminal;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::error::CoreError;
use meshrun_plan::RunPlan;

pub use meshrun_machine::{Outcome, OutcomeStatus, EXIT_PREEMPTED, EXIT_STOPPED, STOP_GRACE_MS};
pub use summary::{Cause, FailureRecord};

/// Options of [`execute`] that are not part of the plan.
#[derive(Default)]
pub struct ExecOptions {
    /// Handle SIGINT/SIGTERM here (the CLI). The Python API turns Ctrl-C
    /// into [`StopHandle::stop`] instead.
    pub handle_signals: bool,
    /// The pickled function of `Trainer(...).fit()`.
    pub payload: Option<std::sync::Arc<[u8]>>,
    /// Lets another thread ask the run to stop.
    pub stop: Option<StopHandle>,
    /// The live status line (a bar on a terminal, plain lines otherwise).
    pub progress: progress::ProgressMode,
}

/// A cloneable request to stop a run, usable from any thread.
#[derive(Clone, Default)]
pub struct StopHandle(Arc<StopInner>);

#[derive(Default)]
struct StopInner {
    requested: AtomicBool,
    notify: Notify,
}

impl StopHandle {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stop(&self) {
        self.0.requested.store(true, Ordering::SeqCst);
        self.0.notify.notify_one();
    }

    pub fn is_requested(&self) -> bool {
        self.0.requested.load(Ordering::SeqCst)
    }

    async fn wait(&self) {
        while !self.is_requested() {
            self.0.notify.notified().await;
        }
    }
}

/// Runs a plan to its end on a private tokio runtime.
pub fn execute(plan: RunPlan, opts: ExecOptions) -> Result<Outcome, CoreError> {
    // A connection per worker and per host, and up to 512 open logs; the
    // limit is raised to twice that, for room.
    let needed = u64::from(plan.nprocs) + u64::from(plan.hosts) + 600;
    if let Some(limit) = crate::limits::raise_open_files_to(needed * 2).filter(|&l| l < needed) {
        tracing::warn!(
            "this run of {} ranks needs about {needed} open files and the limit is {limit}: connections may be refused (raise it with ulimit -n)",
            plan.nprocs
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("meshrun-controller")
        .enable_all()
        .build()
        .map_err(|source| CoreError::Net {
            what: "cannot start the controller runtime",
            source,
        })?;
    runtime.block_on(supervisor::supervise(plan, opts))
}
