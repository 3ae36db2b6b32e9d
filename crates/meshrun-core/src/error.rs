//! Errors of the engine: [`CoreError`] is what can go wrong while running
//! a run (exit status 1). What a user can get wrong before it starts is
//! `meshrun_plan::UsageError` (exit status 2).

use std::io;
use std::path::PathBuf;

use meshrun_plan::UsageError;

/// What to do when the runs directory fills up during a run: the run
/// stops, and everything committed so far is there to resume from.
fn full_disk_hint(source: &io::Error) -> &'static str {
    if source.kind() == io::ErrorKind::StorageFull {
        "; the runs directory's file system is full: free some space, then run again with the \
         same --name to resume from the newest checkpoint"
    } else {
        ""
    }
}

/// A failure of the engine itself while a run is being set up or supervised.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("{0}")]
    Usage(#[from] UsageError),
    #[error("{what} '{path}': {source}{}", full_disk_hint(source))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Net {
        what: &'static str,
        source: io::Error,
    },
    #[error(transparent)]
    Protocol(#[from] meshrun_protocol::ProtocolError),
    #[error(transparent)]
    Attempt(#[from] meshrun_machine::AttemptError),
    #[error(transparent)]
    Agent(#[from] meshrun_agent::AgentError),
    #[error("cannot start the agent of host {host} ({program}): {source}")]
    AgentSpawn {
        host: u32,
        program: String,
        source: io::Error,
    },
    #[error(transparent)]
    Token(#[from] meshrun_protocol::token::TokenError),
    #[error(transparent)]
    Checkpoint(#[from] meshrun_ckpt::CkptError),
    #[error("could not place the run on Ray: {0}")]
    RayPlacement(String),
    #[error("run '{name}' is not running (no live controller holds '{}')", path.display())]
    NotRunning { name: String, path: PathBuf },
    /// The run's controller would not do what was asked, and said why.
    #[error("{0}")]
    Declined(String),
    #[error("the run's controller did not accept the token in '{}' ({why}); it must be the one the run wrote", path.display())]
    TokenRefused { path: PathBuf, why: String },
}

impl CoreError {
    /// The helper every file operation uses, so messages always carry the path.
    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| CoreError::Io { what, path, source }
    }

    /// Usage errors exit with status 2, everything else with 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            CoreError::Usage(_) => 2,
            _ => 1,
        }
    }
}
