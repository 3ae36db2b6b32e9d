//! `events.jsonl`: what happened to a run, one JSON object per line, each
//! with its time and its kind under `"event"`.

use serde::{Deserialize, Serialize};

use crate::failure::{ExitInfo, FailureRecord};
use crate::run::RunState;

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventLine {
    /// Unix seconds.
    pub time: f64,
    #[serde(flatten)]
    pub event: Event,
}

/// Every kind of event, named in snake case under `"event"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    AttemptStarted {
        attempt: u32,
        nprocs: u32,
        hosts: u32,
        control_addr: String,
    },
    AgentJoined {
        host: u32,
        ip: String,
        pid: u32,
        gpus: Vec<String>,
    },
    /// A host that joined by itself went away before the launch; it may
    /// join again.
    AgentLeft {
        host: u32,
        error: String,
    },
    /// An agent that offered to join was turned away.
    AgentRefused {
        ip: String,
        reason: String,
    },
    /// Every agent was sent its workers.
    Launched {
        attempt: u32,
        coordinator: String,
    },
    WorkerStarted {
        attempt: u32,
        rank: u32,
        host: u32,
        pid: u32,
        /// A warm spare took the attempt over.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        warm: bool,
    },
    WorkerExited {
        attempt: u32,
        rank: u32,
        exit: ExitInfo,
        stopped_by_meshrun: bool,
    },
    /// Processes a worker left behind were ended with it.
    LeftoversEnded {
        attempt: u32,
        rank: u32,
        host: u32,
        count: usize,
        pids: Vec<u32>,
        how: String,
    },
    /// The attempt's first failure.
    WorkerFailed(FailureRecord),
    StopRequested {
        attempt: u32,
        now: bool,
    },
    /// SIGTERM: every worker saves at its next report.
    Preempting {
        attempt: u32,
        grace_s: u64,
    },
    PreemptTimeout {
        attempt: u32,
        waited_s: u64,
    },
    /// The cluster holds back resources the run asked for (`what`, as the
    /// cluster describes it); `None` when nothing waits any more.
    WaitingForResources {
        attempt: u32,
        what: Option<String>,
    },
    Stopping {
        attempt: u32,
        reason: String,
    },
    StacksDumped {
        attempt: u32,
        dir: String,
    },
    CheckpointCommitted {
        attempt: u32,
        step: u64,
        path: String,
    },
    CheckpointFailed {
        attempt: u32,
        step: u64,
        error: String,
    },
    CheckpointsDeleted {
        steps: Vec<u64>,
        reason: String,
    },
    RetentionFailed {
        error: String,
    },
    /// An uncommitted checkpoint folder removed when an attempt opened.
    CheckpointDiscarded {
        path: String,
        reason: String,
    },
    /// A committed checkpoint that does not verify, passed over.
    CheckpointSkipped {
        attempt: u32,
        step: u64,
        path: String,
        reason: String,
        resume_step: Option<u64>,
    },
    CheckpointSetAside {
        attempt: u32,
        step: u64,
        path: String,
        moved_to: String,
        reason: String,
    },
    Resuming {
        attempt: u32,
        step: u64,
        /// The step was asked for (`--resume-from`), not the newest.
        requested: bool,
    },
    /// A rank's jitted function (`meshrun.jit`): its executable was
    /// loaded from the run's host folder (`loaded`) or compiled, and why
    /// one there was not used (`reason`: none for this key, another mesh
    /// or JAX, damaged). `stale`: a loaded executable whose program, traced
    /// again in the background, turned out not to be the one it was
    /// compiled from (the attempt then fails before it saves).
    Executable {
        attempt: u32,
        rank: u32,
        name: String,
        outcome: ExecutableOutcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        seconds: f64,
    },
    /// A program across processes that rank `rank` compiled or loaded
    /// (see `program`): every one of rank 0's, and another rank's where no
    /// rank had described it before (a program only some ranks run). The
    /// checks of replicated values are not kept here.
    Program {
        attempt: u32,
        rank: u32,
        #[serde(flatten)]
        program: crate::program::Program,
    },
    /// Rank 0 reported the attempt's first step: `timing`, its own figures
    /// then (when the report carried them), split the time from the
    /// attempt's start to that step into start-up, the join, restore,
    /// compilation and the step itself (see `docs/architecture.md`,
    /// Goodput; `bench/recovery.py` reads a restart's time from it).
    FirstStep {
        attempt: u32,
        step: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timing: Option<crate::goodput::Timing>,
    },
    /// Every host holds memory checkpoint `step` (and, with more than one
    /// host, its buddy the replica).
    MemoryCheckpointCommitted {
        attempt: u32,
        step: u64,
        /// Each host's own bytes of the step, by host rank.
        host_bytes: Vec<u64>,
        replicated: bool,
    },
    /// A host could not keep memory checkpoint `step` (or send its
    /// replica): the step is not committed in memory.
    MemoryCheckpointFailed {
        attempt: u32,
        step: u64,
        host: u32,
        error: String,
    },
    /// The attempt restores memory checkpoint `step`; `sources`: where
    /// each host's copy came from, by host rank.
    ResumingFromMemory {
        attempt: u32,
        step: u64,
        sources: Vec<String>,
    },
    /// Memory checkpoint `step` could not be made whole on every host: the
    /// attempt resumes from durable storage instead.
    MemoryUnavailable {
        attempt: u32,
        step: u64,
        why: String,
        /// The durable step resumed from instead (`None`: the beginning).
        resume_step: Option<u64>,
    },
    /// An elastic run's attempt runs on another host count than the one
    /// before it (or, the first, on fewer than the most): `reason` says
    /// why, in words.
    Resized {
        attempt: u32,
        hosts: u32,
        nprocs: u32,
        /// The previous attempt's host count (`None`: the first attempt).
        previous_hosts: Option<u32>,
        max_hosts: u32,
        reason: String,
    },
    /// A host joined an elastic run while its attempt was running: it
    /// waits to be taken in at the next resize.
    HostWaiting {
        attempt: u32,
        ip: String,
        /// Hosts running the attempt, and those waiting (this one too).
        running: u32,
        waiting: u32,
    },
    /// A waiting host went away before it was taken in.
    HostWaitingLeft {
        attempt: u32,
        ip: String,
        error: String,
    },
    /// Enough hosts are there to grow: every worker saves at its next
    /// report, and the run restarts on `to_hosts` once that is committed.
    Growing {
        attempt: u32,
        from_hosts: u32,
        to_hosts: u32,
    },
    /// A rank reached its steps later than the median rank by more than
    /// the run's threshold, for the run's window of steps (see
    /// [`crate::lag`]): it holds the others back.
    Straggler {
        attempt: u32,
        rank: u32,
        host: u32,
        /// How much later than the median rank it reached each step, as a
        /// fraction of a step's time (median over the window).
        slower: f64,
        /// Its lag behind the first rank to reach the step, in ms (median
        /// over the window); and the median rank's.
        lag_ms: f64,
        median_lag_ms: f64,
        /// The window's last step, and its length in steps.
        step: u64,
        steps: u32,
    },
    /// A profile capture began: `ranks` trace `steps` steps from their
    /// next report into `dir` (under the run folder).
    ProfileStarted {
        attempt: u32,
        dir: String,
        ranks: Vec<u32>,
        steps: u32,
        /// "asked" (`meshrun profile`), "launch" (`--profile-steps`) or
        /// "straggler rank R" (`--profile-stragglers`).
        reason: String,
    },
    /// A profile capture ended: the traces of `ranks` are in `dir`;
    /// `missing` names the ranks that sent none, and why.
    ProfileSaved {
        attempt: u32,
        dir: String,
        ranks: Vec<u32>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        missing: Vec<(u32, String)>,
    },
    AttemptEnded {
        attempt: u32,
        state: RunState,
        /// Each rank's memory at the attempt's end, its peak included.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        memory: Vec<crate::memory::RankMemory>,
    },
    Restarting {
        after_attempt: u32,
        failures: u32,
        max_failures: u32,
        from_step: Option<u64>,
    },
    /// A control frame that failed authentication after its connection's
    /// handshake (altered or replayed on the network, or forged); that
    /// connection was closed. `peer` is the address it came from.
    FrameRejected {
        attempt: u32,
        peer: String,
        reason: String,
    },
    RunEnded {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        state: RunState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A kind this version does not know (written by a newer meshrun).
    #[serde(other)]
    Other,
}

/// What became of a rank's jitted function at its first call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutableOutcome {
    Loaded,
    Compiled,
    Stale,
}

impl Event {
    /// The attempt an event belongs to, when it names one.
    pub fn attempt(&self) -> Option<u32> {
        match self {
            Event::AttemptStarted { attempt, .. }
            | Event::Straggler { attempt, .. }
            | Event::ProfileStarted { attempt, .. }
            | Event::ProfileSaved { attempt, .. }
            | Event::Launched { attempt, .. }
            | Event::WorkerStarted { attempt, .. }
            | Event::WorkerExited { attempt, .. }
            | Event::LeftoversEnded { attempt, .. }
            | Event::StopRequested { attempt, .. }
            | Event::Preempting { attempt, .. }
            | Event::PreemptTimeout { attempt, .. }
            | Event::WaitingForResources { attempt, .. }
            | Event::Stopping { attempt, .. }
            | Event::StacksDumped { attempt, .. }
            | Event::CheckpointCommitted { attempt, .. }
            | Event::CheckpointFailed { attempt, .. }
            | Event::CheckpointSkipped { attempt, .. }
            | Event::CheckpointSetAside { attempt, .. }
            | Event::Resuming { attempt, .. }
            | Event::MemoryCheckpointCommitted { attempt, .. }
            | Event::MemoryCheckpointFailed { attempt, .. }
            | Event::ResumingFromMemory { attempt, .. }
            | Event::MemoryUnavailable { attempt, .. }
            | Event::Resized { attempt, .. }
            | Event::HostWaiting { attempt, .. }
            | Event::HostWaitingLeft { attempt, .. }
            | Event::Growing { attempt, .. }
            | Event::AttemptEnded { attempt, .. }
            | Event::FrameRejected { attempt, .. }
            | Event::Executable { attempt, .. }
            | Event::Program { attempt, .. }
            | Event::FirstStep { attempt, .. } => Some(*attempt),
            Event::WorkerFailed(f) => Some(f.attempt),
            Event::RunEnded { attempt, .. } => *attempt,
            Event::AgentJoined { .. }
            | Event::AgentRefused { .. }
            | Event::AgentLeft { .. }
            | Event::CheckpointsDeleted { .. }
            | Event::RetentionFailed { .. }
            | Event::CheckpointDiscarded { .. }
            | Event::Restarting { .. }
            | Event::Other => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::failure::Cause;

    #[test]
    fn a_line_is_flat_json_with_its_kind_under_event() {
        let line = EventLine {
            time: 12.5,
            event: Event::WorkerStarted {
                attempt: 1,
                rank: 3,
                host: 1,
                pid: 42,
                warm: false,
            },
        };
        let v = serde_json::to_value(&line).unwrap();
        assert_eq!(
            v,
            json!({"time": 12.5, "event": "worker_started", "attempt": 1, "rank": 3, "host": 1, "pid": 42})
        );
        let back: EventLine = serde_json::from_value(v).unwrap();
        assert_eq!(back, line);
    }

    #[test]
    fn a_failure_is_its_record_with_the_kind_beside_it() {
        let record = FailureRecord {
            rank: 2,
            host: 1,
            attempt: 3,
            cause: Cause::ConnectionLost,
            exit: None,
        };
        let line = EventLine {
            time: 1.0,
            event: Event::WorkerFailed(record.clone()),
        };
        let v = serde_json::to_value(&line).unwrap();
        assert_eq!(v["event"], "worker_failed");
        assert_eq!(v["rank"], 2);
        assert_eq!(v["cause"]["kind"], "connection_lost");
        let back: EventLine = serde_json::from_value(v).unwrap();
        assert_eq!(back.event, Event::WorkerFailed(record));
        assert_eq!(back.event.attempt(), Some(3));
    }

    #[test]
    fn a_kind_from_a_newer_version_reads_as_other() {
        let v = json!({"time": 3.0, "event": "rank_promoted", "rank": 1});
        let line: EventLine = serde_json::from_value(v).unwrap();
        assert_eq!(line.event, Event::Other);
        assert!((line.time - 3.0).abs() < f64::EPSILON);
    }
}
