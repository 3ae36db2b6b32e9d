//! The agent's conversation with the controller, and with its buddy's agent (memory checkpoints' replicas).

use serde::{Deserialize, Serialize};

use super::{ExitInfo, SpawnProblem, Stream, WorkerLaunch};

/// What an agent tells the controller: that it joined, its workers' starts, output, exits and stacks, their steps and heartbeats, its memory checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromAgent {
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
    /// Agent to controller: what it found at the marker's path (`None`
    /// when it matched).
    StorageChecked { problem: Option<String> },
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
    MemoryPrepared {
        step: u64,
        /// Where it came from ("this host", "host 1 (replica)"); `None`:
        /// neither copy is there (`why`).
        source: Option<String>,
        why: Option<String>,
        bytes: u64,
    },
    /// Agent to controller, once a second: when its workers reached their
    /// steps, as `(rank, step, Unix ns)` on the controller's clock (the
    /// agent applies its estimate of the offset, see `ClockProbe`). One
    /// message per host rather than one per rank and step.
    StepTimes { times: Vec<(u32, u64, i64)> },
    /// Agent to controller, once a second: the ranks of this host whose
    /// heartbeat (`names::beat_file`) moved since the last such message.
    /// Workers under an agent beat into a file instead of sending a
    /// heartbeat each: one message per host, not one per rank.
    WorkerBeats { ranks: Vec<u32> },
    /// Agent to controller: the agent's clock (Unix ns) as it sent this;
    /// answered at once with [`ToAgent::ClockEcho`], from which the agent
    /// estimates how far its host's clock is from the controller's.
    ClockProbe { sent_ns: i64 },
    /// Agent to controller: the stacks a worker wrote on SIGUSR1, read
    /// from the host's scratch space (hosts need not share a filesystem).
    Stacks { rank: u32, text: String },
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
        /// Its peak, its limit, and whether the kernel's out-of-memory
        /// killer ended it, where the agent could read them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory: Option<meshrun_record::memory::MemoryEnd>,
    },
    /// Agent to controller, every few seconds while workers run: the
    /// memory of each of this host's workers that changed.
    WorkerMemory {
        ranks: Vec<meshrun_record::memory::RankMemory>,
    },
    /// A second with nothing else to say (no worker beat): the agent is
    /// there.
    Heartbeat,
}

/// What the controller tells an agent: its host rank (or why not), the storage check, the function and the launch, memory checkpoints to commit, prepare or release, and when to stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToAgent {
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
    /// answer [`FromAgent::MemoryHeld`].
    MemoryCommit {
        step: u64,
        manifest: meshrun_record::manifest::Manifest,
    },
    /// Controller to agent: memory checkpoint `step` is committed on every
    /// host: older ones (own and replicas) can go.
    MemoryRelease {
        step: u64,
    },
    /// Controller to agent, before a launch: make memory checkpoint `step`
    /// of this host ready to restore (from its own memory, else from the
    /// buddy's replica) and answer [`FromAgent::MemoryPrepared`].
    MemoryPrepare {
        run_id: String,
        step: u64,
    },
    ClockEcho {
        sent_ns: i64,
        controller_ns: i64,
    },
    /// Every rank of the attempt has trained a step: an agent starts its
    /// next warm spares now, when they no longer slow the start.
    Training,
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
}

/// What an agent asks of its buddy's agent (the keeper of its memory checkpoints' replica): take a replica, or send one back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReplicaRequest {
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
    /// Agent to agent: `host` holds these travelling executables (file
    /// name, size); the keeper answers with those it lacks
    /// ([`ReplicaReply::ExecutablesWanted`]), which then follow in raw
    /// frames, in order.
    ExecutablesOffer {
        run_id: String,
        host: u32,
        files: Vec<(String, u64)>,
    },
    /// Agent to agent: send back every executable kept for `host`.
    ExecutablesGet { run_id: String, host: u32 },
    /// Bytes of a file in transfer (never JSON: see `frame`).
    #[serde(skip)]
    Raw(bytes::Bytes),
}

/// What the keeper answers: a replica taken (or refused), or the files of one asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReplicaReply {
    /// Agent to agent: a replica was taken (or refused, with `error`).
    ReplicaAck { step: u64, error: Option<String> },
    /// The files of the replica asked for follow, as these (name, size) in
    /// raw frames, in order.
    ReplicaFiles {
        step: u64,
        files: Vec<(String, u64)>,
    },
    /// The offered executables the keeper lacks (none: nothing follows).
    ExecutablesWanted { files: Vec<String> },
    /// The wanted executables were taken (or refused, with `error`).
    ExecutablesTaken { error: Option<String> },
    /// The executables kept for the host asked for follow, as these (name,
    /// size) in raw frames, in order.
    ExecutablesFiles { files: Vec<(String, u64)> },
    /// Bytes of a file in transfer (never JSON: see `frame`).
    #[serde(skip)]
    Raw(bytes::Bytes),
}
