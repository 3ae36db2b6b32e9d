//! A worker's conversation with the controller.

use serde::{Deserialize, Serialize};

/// What a worker tells the controller: its reports and timings, checkpoints written or not, failures, profile traces, and its end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromWorker {
    WorkerHello {
        rank: u32,
        attempt: u32,
        pid: u32,
    },
    Heartbeat,
    /// This many of the worker's reports were dropped before they were
    /// sent: the controller fell behind and the worker's bound on unsent
    /// reports (`UNSENT_REPORT_BYTES` of the worker client) was full.
    ReportsShed {
        count: u64,
    },
    /// A `meshrun.report`; `checkpoint` when it came with the state to save,
    /// so the controller knows a preemption can end in a checkpoint.
    Report {
        step: Option<u64>,
        metrics: serde_json::Value,
        #[serde(default)]
        checkpoint: bool,
        /// Where this worker's time went up to this report (see
        /// `meshrun_record::goodput`); sent with saves and at most once a
        /// second.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timing: Option<meshrun_record::Timing>,
        /// A save of this step began at this report.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        saving: bool,
        /// How many steps the program will run, when it says so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total_steps: Option<u64>,
    },
    /// Where the worker's time went, sent once more when its program ends.
    Timing {
        timing: meshrun_record::Timing,
    },
    /// Worker to controller: one file of its trace, `name` relative to the
    /// trace's folder; its `size` bytes follow in raw frames.
    ProfileFile {
        capture: String,
        name: String,
        size: u64,
    },
    /// Worker to controller: every file of the capture was sent, or the
    /// trace failed (`error`).
    ProfileDone {
        capture: String,
        error: Option<String>,
    },
    /// Worker to controller, before the save starts: this rank saves `step`
    /// for the preemption, then waits (so no rank trains past the
    /// checkpoint that ends the run).
    PreemptSave {
        step: u64,
    },
    /// The user's code raised; sent before the worker tries to exit.
    Failure {
        kind: String,
        message: String,
        traceback: String,
    },
    /// The user's code raised `SystemExit` with a non-zero code; sent
    /// before the worker tries to exit, since JAX's shutdown barrier can
    /// hold an exiting process for minutes. `argument`: what was passed to
    /// `sys.exit`, as Python writes it (`3`, `'no data'`); `traceback`:
    /// where it was called, the user's frames only.
    ExitRequested {
        code: i32,
        argument: String,
        traceback: String,
    },
    /// This rank has written and synced its shards of checkpoint `step`
    /// into `checkpoints/tmp-<step>` (`leaves`), or a copy of the folder it
    /// handed over (`files`, a directory checkpoint); `extra`: its metrics
    /// and info (rank 0's for a sharded state).
    CheckpointWritten {
        step: u64,
        leaves: Vec<meshrun_record::manifest::Leaf>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        files: Option<Vec<meshrun_record::manifest::FileRecord>>,
        extra: Option<serde_json::Value>,
    },
    /// This rank could not write its shards of checkpoint `step` (the
    /// storage failed or refused them): that step is not committed. Sent
    /// when the run's policy is to train on (`--on-save-error continue`).
    SaveFailed {
        step: u64,
        error: String,
    },
    /// What became of one of this rank's jitted functions (`meshrun.jit`)
    /// at its first call: see `meshrun_record::event::Event::Executable`.
    Executable {
        name: String,
        outcome: meshrun_record::event::ExecutableOutcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        seconds: f64,
    },
    /// A program this rank compiled or loaded that runs on devices of
    /// every process and communicates between them; sent before its first
    /// call (see `meshrun_record::program`).
    Program {
        program: meshrun_record::program::Program,
    },
    /// This rank's call `n` (from 1, in this attempt) of the programs that
    /// run on every process: the program's fingerprint, and the Python
    /// line of the call. `n` = 0 (sent once, before any call): this rank's
    /// recorder is on, so the calls it makes, or does not, are compared.
    Call {
        n: u64,
        fingerprint: String,
        site: String,
    },
    /// Worker to controller: this rank wrote its shards of memory
    /// checkpoint `step` into its host's memory; `extra` as for
    /// [`FromWorker::CheckpointWritten`] (rank 0's).
    MemoryWritten {
        step: u64,
        leaves: Vec<meshrun_record::manifest::Leaf>,
        extra: Option<serde_json::Value>,
    },
    /// What the program's state needs on each device, from its
    /// `meshrun.sharding.describe`: an out-of-memory failure of this rank
    /// is explained with it.
    StateNeed {
        need: meshrun_record::memory::StateNeed,
    },
    /// Bytes in use on the worker's first device and their peak (where
    /// the backend counts them), sent with reports at most every 2 s.
    DeviceMemory {
        current: u64,
        peak: u64,
    },
    /// The worker's program finished; its connection closes next.
    Bye,
    /// Bytes of a file in transfer (never JSON: see `frame`).
    #[serde(skip)]
    Raw(bytes::Bytes),
}

/// What the controller tells a worker: checkpoints committed or not, save now (preemption), go on, and profile captures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToWorker {
    /// Controller to worker: trace `steps` steps with `jax.profiler` from
    /// the next report (of step `from_step` or later, when given), then
    /// send the trace files as `ProfileFile`s and `ProfileDone`, naming
    /// `capture`.
    Profile {
        capture: String,
        steps: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_step: Option<u64>,
    },
    /// Controller to worker: save a checkpoint at the next `report` that
    /// carries the state (preemption), whatever the checkpoint interval.
    CheckpointNow,
    /// Controller to worker: preemption saves of steps up to `step` cannot
    /// all commit (some rank went past them without saving): go on.
    Resume { step: u64 },
    /// Controller to every worker: checkpoint `step` is committed, at
    /// `path` (its folder, or its URL in an object store). What
    /// `meshrun.wait_committed` and a restore of the newest wait for.
    StepCommitted { step: u64, path: String },
    /// Controller to every worker: checkpoint `step` will never be
    /// committed, and why (a rank could not write its part, the commit
    /// failed, or the ranks' parts cannot make one checkpoint).
    StepNotCommitted { step: u64, error: String },
}
