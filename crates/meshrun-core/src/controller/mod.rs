//! The controller: owns one run from start to end.
//!
//! [`execute`] creates the run directory, starts one agent per host, hands
//! out ranks and the environment contract, streams logs and metrics into the
//! run directory, and stops the whole group at the first failure. The
//! pieces: [`server`] accepts and authenticates connections, [`launch`]
//! builds each worker's command and environment, [`output`] writes logs and
//! tees them to the terminal, [`summary`] explains a failure; [`machine`]
//! makes every decision of an attempt without I/O, `driver` carries them
//! out, and `supervisor` runs attempts until the run ends.

mod agents;
mod checkpoints;
mod committer;
mod driver;
pub mod gather;
mod joining;
mod launch;
pub mod machine;
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
mod stragglers;
mod summary;
mod supervisor;
mod tensorboard;
pub mod terminal;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Notify;

use crate::error::CoreError;
use crate::plan::RunPlan;

pub use summary::{Cause, FailureRecord};

/// How long a stopped worker gets between SIGTERM and SIGKILL. JAX workers
/// catch SIGTERM, so this is usually the time a stop takes; it is kept
/// short so the whole group is gone within 2 seconds of a failure.
pub const STOP_GRACE_MS: u64 = 1000;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeStatus {
    Succeeded,
    Failed,
    /// Stopped by a signal to meshrun (or Ctrl-C in Python).
    Interrupted {
        signal: i32,
    },
    /// SIGTERM, answered by a checkpoint at `step`: resumable.
    Preempted {
        step: u64,
    },
    /// An elastic attempt stopped to go on with `hosts` hosts (the run
    /// goes on: never a run's outcome).
    Resized {
        hosts: u32,
    },
    /// Stopped as asked by `meshrun stop` without a checkpoint to end at:
    /// `--now` (`now`), or a program that saves none.
    Stopped {
        now: bool,
    },
}

impl OutcomeStatus {
    /// The state `run.json` records for it.
    pub fn state(self) -> meshrun_record::RunState {
        use meshrun_record::RunState;
        match self {
            OutcomeStatus::Succeeded => RunState::Succeeded,
            OutcomeStatus::Failed => RunState::Failed,
            OutcomeStatus::Interrupted { .. } => RunState::Interrupted,
            OutcomeStatus::Preempted { .. } => RunState::Preempted,
            OutcomeStatus::Resized { .. } => RunState::Resized,
            OutcomeStatus::Stopped { .. } => RunState::Stopped,
        }
    }
}

/// The exit status of a preempted run: `EX_TEMPFAIL` from sysexits.h, "a
/// temporary failure; the user is invited to retry later", which is what a
/// scheduler should do: start it again under the same name.
pub const EXIT_PREEMPTED: i32 = 75;

/// The exit status of a run stopped with `meshrun stop --now` (or a plain
/// stop with no checkpoint to end at). Not 0: the program did not finish,
/// and what follows a success must not take its output for a result. Not
/// 1: nothing failed, and a retry-on-failure must not start it again. Not
/// 75: nothing was saved at the stop for a retry to resume from. Not
/// 128+N: no signal stopped meshrun. A status of its own lets a scheduler
/// tell it apart (Kubernetes' `podFailurePolicy`, Slurm's requeue rules).
pub const EXIT_STOPPED: i32 = 3;

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: OutcomeStatus,
    pub name: String,
    pub run_dir: PathBuf,
    /// The first failure, when there was one.
    pub failure: Option<FailureRecord>,
    /// A human-readable account of the failure, as printed by the CLI.
    pub summary: Option<String>,
    /// Rank 0's most recent `report`.
    pub last_metrics: Option<Value>,
    /// Attempts made by this invocation (1 + restarts).
    pub attempts: u32,
}

impl Outcome {
    /// 0 on success, 1 on failure, 128 + signal when interrupted,
    /// [`EXIT_PREEMPTED`] when preempted with a checkpoint,
    /// [`EXIT_STOPPED`] when stopped as asked without one.
    pub fn exit_code(&self) -> i32 {
        match self.status {
            OutcomeStatus::Succeeded => 0,
            OutcomeStatus::Failed | OutcomeStatus::Resized { .. } => 1,
            OutcomeStatus::Interrupted { signal } => 128 + signal,
            OutcomeStatus::Preempted { .. } => EXIT_PREEMPTED,
            OutcomeStatus::Stopped { .. } => EXIT_STOPPED,
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
