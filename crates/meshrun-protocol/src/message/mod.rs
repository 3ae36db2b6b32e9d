//! The messages of the control protocol: one enum per conversation and
//! direction (as pueue splits its requests from its responses), so every
//! receiver matches exactly what its peer may send, without a catch-all.
//!
//! - [`agent`]: agent and controller ([`FromAgent`], [`ToAgent`]); an
//!   agent and its buddy's agent ([`ReplicaRequest`], [`ReplicaReply`]);
//! - [`worker`]: a worker and the controller ([`FromWorker`], [`ToWorker`]);
//! - [`client`]: `meshrun stop` / `meshrun profile` and the controller
//!   ([`ClientRequest`], [`ClientReply`]).

use serde::{Deserialize, Serialize};

pub mod agent;
pub mod client;
pub mod worker;

pub use agent::{FromAgent, ReplicaReply, ReplicaRequest, ToAgent};
pub use client::{ClientReply, ClientRequest};
pub use worker::{FromWorker, ToWorker};

/// Which output stream a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

pub use meshrun_record::ExitInfo;

/// How long workers get to write their stacks before they are stopped
/// (`ToAgent::Stop { dump_stacks }`): faulthandler writes from the signal handler,
/// in a few milliseconds. The agent waits this long; the controller counts
/// it into the stop's deadline.
pub const STACK_DUMP_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What an agent needs to start one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLaunch {
    pub rank: u32,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

impl WorkerLaunch {
    /// The script a worker started through meshrun's bootstrap runs
    /// (`PYTHON -m meshrun._bootstrap script PATH ...`, as
    /// `meshrun_plan::launch::worker_argv` builds it), as
    /// given: relative to `cwd` unless absolute.
    pub fn script(&self) -> Option<&str> {
        match self.argv.as_slice() {
            [_, m, bootstrap, kind, path, ..]
                if m == "-m" && bootstrap == "meshrun._bootstrap" && kind == "script" =>
            {
                Some(path)
            }
            _ => None,
        }
    }
}

/// Why a worker could not be started, where the agent can tell: the
/// controller decides from it whether another attempt could start it
/// (see [`SpawnProblem::lasting`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnProblem {
    /// Anything else: the system out of processes, memory or files, the
    /// function's file not written. It may pass.
    #[default]
    Other,
    /// The run's working folder is not on the host.
    NoWorkingFolder,
    /// The program to start (the interpreter, or the script it is to run)
    /// does not exist on the host.
    NoProgram,
    /// The interpreter exists but cannot be executed (no permission, not
    /// an executable format).
    NotExecutable,
    /// `--memory-per-proc` cannot be set on the host (no memory cgroup
    /// this agent may write).
    NoMemoryLimit,
}

impl SpawnProblem {
    /// Whether a restart would meet it again: it is a fact of the host's
    /// files, which nothing in meshrun changes between attempts.
    pub fn lasting(self) -> bool {
        !matches!(self, SpawnProblem::Other)
    }
}
