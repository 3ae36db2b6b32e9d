//! The messages of the control protocol. One enum for every role, so a
//! frame means the same thing wherever it is read.

use serde::{Deserialize, Serialize};

/// Which output stream a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

pub use meshrun_record::ExitInfo;

/// How long workers get to write their stacks before they are stopped
/// (`Stop { dump_stacks }`): faulthandler writes from the signal handler,
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
}

impl SpawnProblem {
    /// Whether a restart would meet it again: it is a fact of the host's
    /// files, which nothing in meshrun changes between attempts.
    pub fn lasting(self) -> bool {
        !matches!(self, SpawnProblem::Other)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    // --- agent <-> controller ---
    AgentHello {
        /// This host's rank; `None` when it joined (`meshrun join`) without
        /// one: the controller assigns the next free rank.
        host: Option<u32>,
        host_ip: String,
        pid: u32,
        gpus: Vec<String>,
        /// A port found free on this host, for the JAX coordinator when
        /// rank 0 lives here.
        free_port: u16,
        /// The controller address this agent reached: its workers are
        /// given the same (the controller may listen on every interface).
        #[serde(default)]
        controller: Option<String>,
        /// Where this agent takes replicas of other hosts' memory
        /// checkpoints (on `host_ip`); `None`: it keeps none.
        #[serde(default)]
        replica_port: Option<u16>,
    },
    /// Controller to a joining agent: the host rank it was given.
    HostAssigned {
        host: u32,
        /// The run's name, for what `meshrun join` says.
        #[serde(default)]
        run: String,
    },
    /// Controller to a joining agent: it cannot take part, and why (the
    /// run has all its hosts, its rank is taken or out of range). The
    /// agent gives up instead of trying again.
    Refused {
        reason: String,
    },
    /// Controller to agent: read back the marker file at `path`; every
    /// host must see the run's storage (checkpoints are written there by
    /// every rank and committed by the controller).
    CheckStorage {
        path: String,
        expect: String,
    },
    /// Agent to controller: what it found at the marker's path (`None`
    /// when it matched).
    StorageChecked {
        problem: Option<String>,
    },
    /// Controller to agent: a piece of the pickled function of
    /// `Trainer.fit` (base64), sent before the launch; `last` ends it.
    /// It travels here because hosts need not share a filesystem.
    FunctionPart {
        data: String,
        last: bool,
    },
    /// Start these workers (attempt numbers count from 1).
    Launch {
        attempt: u32,
        /// Names the run's folder in the host's scratch space.
        #[serde(default)]
        run_id: String,
        workers: Vec<WorkerLaunch>,
        /// Keep a warm spare per worker, importing these modules; `None`:
        /// no spares.
        #[serde(default)]
        spares: Option<Vec<String>>,
    },
    /// Controller to agent: the host that keeps this host's memory
    /// checkpoints' replica, and where its agent takes them.
    Buddy {
        host: u32,
        addr: String,
    },
    /// Controller to agent: every rank wrote memory checkpoint `step`;
    /// commit this host's part with `manifest`, send it to the buddy, and
    /// answer [`Message::MemoryHeld`].
    MemoryCommit {
        step: u64,
        manifest: meshrun_record::manifest::Manifest,
    },
    /// Agent to controller: this host holds memory checkpoint `step` (and
    /// its buddy the replica), or why not.
    MemoryHeld {
        step: u64,
        /// This host's bytes of the step.
        bytes: u64,
        /// Whether the buddy acknowledged its replica (false without one).
        replicated: bool,
        error: Option<String>,
    },
    /// Controller to agent: memory checkpoint `step` is committed on every
    /// host: older ones (own and replicas) can go.
    MemoryRelease {
        step: u64,
    },
    /// Controller to agent, before a launch: make memory checkpoint `step`
    /// of this host ready to restore (from its own memory, else from the
    /// buddy's replica) and answer [`Message::MemoryPrepared`].
    MemoryPrepare {
        run_id: String,
        step: u64,
    },
    MemoryPrepared {
        step: u64,
        /// Where it came from ("this host", "host 1 (replica)"); `None`:
        /// neither copy is there (`why`).
        source: Option<String>,
        why: Option<String>,
        bytes: u64,
    },
    /// Worker to controller: this rank wrote its shards of memory
    /// checkpoint `step` into its host's memory; `extra` as for
    /// [`Message::CheckpointWritten`] (rank 0's).
    MemoryWritten {
        step: u64,
        leaves: Vec<meshrun_record::manifest::Leaf>,
        extra: Option<serde_json::Value>,
    },
    /// Agent to agent: a replica of `host`'s memory checkpoint `step`
    /// follows, as these files (name, size) in raw frames, in order.
    ReplicaPut {
        run_id: String,
        host: u32,
        step: u64,
        files: Vec<(String, u64)>,
    },
    /// Agent to agent: send back the replica of `host`'s step `step`.
    ReplicaGet {
        run_id: String,
        host: u32,
        step: u64,
    },
    /// Agent to agent: a replica was taken (or refused, with `error`).
    ReplicaAck {
        step: u64,
        error: Option<String>,
    },
    /// Bytes of a file in transfer (never JSON: see `frame`).
    #[serde(skip)]
    Raw(bytes::Bytes),
    /// Agent to controller, once a second: when its workers reached their
    /// steps, as `(rank, step, Unix ns)` on the controller's clock (the
    /// agent applies its estimate of the offset, see `ClockProbe`). One
    /// message per host rather than one per rank and step.
    StepTimes {
        times: Vec<(u32, u64, i64)>,
    },
    /// Agent to controller, once a second: the ranks of this host whose
    /// heartbeat (`names::beat_file`) moved since the last such message.
    /// Workers under an agent beat into a file instead of sending a
    /// heartbeat each: one message per host, not one per rank.
    WorkerBeats {
        ranks: Vec<u32>,
    },
    /// Agent to controller: the agent's clock (Unix ns) as it sent this;
    /// answered at once with [`Message::ClockEcho`], from which the agent
    /// estimates how far its host's clock is from the controller's.
    ClockProbe {
        sent_ns: i64,
    },
    ClockEcho {
        sent_ns: i64,
        controller_ns: i64,
    },
    /// Every rank of the attempt has trained a step: an agent starts its
    /// next warm spares now, when they no longer slow the start.
    Training,
    /// Agent to controller: the stacks a worker wrote on SIGUSR1, read
    /// from the host's scratch space (hosts need not share a filesystem).
    Stacks {
        rank: u32,
        text: String,
    },
    /// Stop every worker: SIGTERM to its process group, SIGKILL after the
    /// grace. With `dump_stacks`, each worker first gets SIGUSR1, on which
    /// meshrun's worker code writes every thread's Python stack to its
    /// stacks file.
    Stop {
        grace_ms: u64,
        #[serde(default)]
        dump_stacks: bool,
    },
    /// The attempt is over. With `again`, another attempt follows: an
    /// agent that joined by itself (`meshrun join`) joins that one too;
    /// otherwise the run is over and the agent exits.
    Shutdown {
        #[serde(default)]
        again: bool,
        /// Without `again`: how the run ended (a `RunState` name), which
        /// `meshrun join` says and turns into its exit status.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<String>,
    },

    // --- `meshrun stop` <-> controller ---
    /// Stop the run: at once with `now`, else as on SIGTERM (a checkpoint
    /// first, when the program saves through `meshrun.report`).
    StopRun {
        now: bool,
    },
    /// What the controller will do about it.
    StopAccepted {
        what: String,
    },

    // --- `meshrun profile` <-> controller ---
    /// Trace `steps` steps of `ranks` (`None`: every rank) with
    /// `jax.profiler`, from their next report.
    ProfileRun {
        ranks: Option<Vec<u32>>,
        steps: u32,
    },
    /// The capture began: the traces come to `dir`.
    ProfileAccepted {
        dir: String,
        ranks: Vec<u32>,
    },
    /// The capture ended: `ranks` sent their traces, `missing` did not (and
    /// why). Sent on the same connection as `ProfileAccepted`.
    ProfileSaved {
        dir: String,
        ranks: Vec<u32>,
        missing: Vec<(u32, String)>,
    },
    /// Controller to a requester: it cannot do that, and why.
    Declined {
        reason: String,
    },
    WorkerStarted {
        rank: u32,
        pid: u32,
        /// A warm spare took the attempt over (no new interpreter).
        #[serde(default)]
        warm: bool,
    },
    /// A worker could not be started at all.
    SpawnFailed {
        rank: u32,
        error: String,
        #[serde(default)]
        problem: SpawnProblem,
    },
    /// One line of a worker's output, without its newline. A line longer
    /// than a frame should carry comes in pieces: every piece but the last
    /// has `more`.
    Log {
        rank: u32,
        stream: Stream,
        line: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        more: bool,
    },
    /// Processes the worker of `rank` left running when it ended, which
    /// the agent has killed; `how` says how they were found ("cgroup",
    /// "process group", "process group and subreaper"). Sent before that
    /// worker's `WorkerExited`, and only when there were some.
    LeftoversEnded {
        rank: u32,
        pids: Vec<u32>,
        how: String,
    },
    WorkerExited {
        rank: u32,
        exit: ExitInfo,
    },

    // --- worker <-> controller ---
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
    /// Controller to worker: save a checkpoint at the next `report` that
    /// carries the state (preemption), whatever the checkpoint interval.
    CheckpointNow,
    /// Worker to controller, before the save starts: this rank saves `step`
    /// for the preemption, then waits (so no rank trains past the
    /// checkpoint that ends the run).
    PreemptSave {
        step: u64,
    },
    /// Controller to worker: preemption saves of steps up to `step` cannot
    /// all commit (some rank went past them without saving): go on.
    Resume {
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
    /// Controller to every worker: checkpoint `step` is committed, at
    /// `path` (its folder, or its URL in an object store). What
    /// `meshrun.wait_committed` and a restore of the newest wait for.
    StepCommitted {
        step: u64,
        path: String,
    },
    /// Controller to every worker: checkpoint `step` will never be
    /// committed, and why (a rank could not write its part, the commit
    /// failed, or the ranks' parts cannot make one checkpoint).
    StepNotCommitted {
        step: u64,
        error: String,
    },
    /// The worker's program finished; its connection closes next.
    Bye,
}
