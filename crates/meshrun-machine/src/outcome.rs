//! How an attempt, and a run, ends: the status, the exit code a scheduler
//! reads, and how long a stopped worker is given.

use std::path::PathBuf;

use meshrun_record::FailureRecord;
use serde_json::Value;

/// How long a stopped worker gets between SIGTERM and SIGKILL. JAX workers
/// catch SIGTERM, so this is usually the time a stop takes; it is kept
/// short so the whole group is gone within 2 seconds of a failure.
pub const STOP_GRACE_MS: u64 = 1000;

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

/// The signals the machine names, by number: POSIX fixes these two, and
/// the machine needs no system crate to know them.
pub(crate) const SIGTERM: i32 = 15;
pub(crate) const SIGKILL: i32 = 9;
