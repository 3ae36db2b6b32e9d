//! `run.json`: the run, the plan it was started with, and its attempts.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::failure::FailureRecord;

/// Where a run, or one of its attempts, stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    /// Stopped by a signal to meshrun, Ctrl-C, or a controller that went
    /// away (see [`RunState::shown`]).
    Interrupted,
    /// Stopped after SIGTERM at a committed checkpoint: resumable.
    Preempted,
    /// The engine itself failed (not a worker): an I/O or placement error.
    Errored,
    /// An elastic run's attempt stopped at a committed checkpoint to go
    /// on with more hosts (only attempts end so; the run goes on).
    Resized,
    /// Stopped as asked by `meshrun stop` without a checkpoint to end at
    /// (`--now`, or a program that saves none): not a crash. Run again
    /// under its name, it goes on from its newest checkpoint, if any.
    Stopped,
}

impl RunState {
    /// Every state, in the order the CLI documents them.
    pub const ALL: [RunState; 8] = [
        RunState::Running,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Interrupted,
        RunState::Preempted,
        RunState::Errored,
        RunState::Resized,
        RunState::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Interrupted => "interrupted",
            RunState::Preempted => "preempted",
            RunState::Errored => "errored",
            RunState::Resized => "resized",
            RunState::Stopped => "stopped",
        }
    }

    /// The state to show for one recorded as `self`: `running` without a
    /// live controller (the run's lock is not held) was cut short, and is
    /// `interrupted`. A controller killed with SIGKILL leaves `running` in
    /// `run.json` for ever.
    #[must_use]
    pub fn shown(self, live: bool) -> RunState {
        if self == RunState::Running && !live {
            RunState::Interrupted
        } else {
            self
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The versions that wrote a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    pub meshrun: String,
    pub protocol: u8,
}

/// Where an attempt's control port listened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    pub bind: String,
    pub loopback_only: bool,
}

/// One attempt: started, ended and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    /// RFC 3339, seconds precision (events have the precise times).
    pub started: String,
    pub state: RunState,
    /// The hosts it ran on: the plan's count, or an elastic attempt's own
    /// once it was sized (absent before that, and in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<Control>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The attempt's first failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureRecord>,
    /// How many reports each rank sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reports: Vec<u64>,
    /// How many reports each rank dropped before sending them (the
    /// controller was behind); absent when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reports_shed: Vec<u64>,
    /// The engine error that ended an `errored` attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The name the run was started under (the folder's name is the one
    /// commands take: a renamed copy keeps the old name here).
    pub name: String,
    pub run_id: String,
    pub state: RunState,
    /// RFC 3339 time of the run's first attempt.
    pub created: String,
    /// The plan as `meshrun-core` serializes it. Kept as JSON here, so this
    /// crate does not depend on the engine; [`RunRecord::plan_u64`] and
    /// [`RunRecord::plan_str`] read its fields for display.
    pub plan: serde_json::Value,
    pub versions: Versions,
    pub attempts: Vec<AttemptRecord>,
}

impl RunRecord {
    /// A number of the plan (`nprocs`, `hosts`, ...), or a nested one by
    /// JSON pointer (`/ray/address`).
    pub fn plan_u64(&self, key: &str) -> Option<u64> {
        self.plan_value(key)?.as_u64()
    }

    pub fn plan_str(&self, key: &str) -> Option<&str> {
        self.plan_value(key)?.as_str()
    }

    /// The folder of run `run_dir` in its storage, where `checkpoints/`
    /// is: `STORAGE/NAME` when the run was given a storage, else the run
    /// folder itself. A storage URL (`s3://bucket/prefix`) gives a URL.
    pub fn storage_dir(&self, run_dir: &std::path::Path) -> String {
        match self.plan_str("storage") {
            Some(root) if root.contains("://") => {
                format!("{}/{}", root.trim_end_matches('/'), self.name)
            }
            Some(root) => std::path::Path::new(root)
                .join(&self.name)
                .display()
                .to_string(),
            None => run_dir.display().to_string(),
        }
    }

    fn plan_value(&self, key: &str) -> Option<&serde_json::Value> {
        if key.starts_with('/') {
            self.plan.pointer(key)
        } else {
            self.plan.get(key)
        }
    }

    /// The attempt numbered `n`.
    pub fn attempt(&self, n: u32) -> Option<&AttemptRecord> {
        self.attempts.iter().find(|a| a.attempt == n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_spelled_as_serde_spells_them() {
        for state in RunState::ALL {
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json, state.as_str());
            let back: RunState = serde_json::from_value(json).unwrap();
            assert_eq!(back, state);
        }
        assert_eq!(RunState::Running.shown(false), RunState::Interrupted);
        assert_eq!(RunState::Running.shown(true), RunState::Running);
        assert_eq!(RunState::Failed.shown(false), RunState::Failed);
    }

    #[test]
    fn an_unknown_state_is_an_error_that_names_it() {
        let err = serde_json::from_str::<RunState>("\"paused\"").unwrap_err();
        assert!(err.to_string().contains("paused"), "{err}");
    }
}
