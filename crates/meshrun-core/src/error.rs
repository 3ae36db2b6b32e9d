//! Errors of the engine. [`UsageError`] is everything a user can get wrong
//! before a run starts (exit status 2); [`CoreError`] is what can go wrong
//! while running one (exit status 1).

use std::io;
use std::path::PathBuf;

/// A request that cannot be run as given. Every message says what was
/// wrong, the value seen, and what would be accepted.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("-n/--nprocs must be at least 1, got {0}")]
    NoProcesses(u32),
    #[error("--straggler-threshold must be a share of a step above 0 (0.2: 20% of a step later than the median rank), got {0}")]
    BadStragglerThreshold(f64),
    #[error("--straggler-steps must be at least 1, got {0}")]
    BadStragglerSteps(u32),
    #[error("--profile-steps takes A:B, two steps with A below B (5:8 traces from the report of step 5 to that of step 8), got '{0}'")]
    BadProfileSteps(String),
    #[error("--hosts must be at least 1, got {0}")]
    NoHosts(u32),
    #[error(
        "--hosts {hosts} does not divide -n {nprocs}: every host runs the same number of \
         workers; use a host count that divides {nprocs} (one of: {divisors})"
    )]
    HostsDoNotDivide {
        hosts: u32,
        nprocs: u32,
        divisors: String,
    },
    #[error("--hosts {hosts} is more than the local backend supports ({max}); loopback addresses 127.0.0.2 ... 127.0.0.{last} are used", last = max + 1)]
    TooManyHosts { hosts: u32, max: u32 },
    #[error("--devices-per-proc must be at least 1, got {0}")]
    NoDevices(u32),
    #[error("--gpus-per-proc must be at least 1 when given, got {0}")]
    NoGpus(u32),
    #[error("--devices-per-proc {0} applies to the cpu platform only; with cuda every worker gets --gpus-per-proc whole GPUs")]
    DevicesOnCuda(u32),
    #[error("--gpus-per-proc {0} needs --platform cuda or auto, not cpu")]
    GpusOnCpu(u32),
    #[error("{0}")]
    Gpu(#[from] crate::gpu::GpuError),
    #[error("script '{path}' not found (looked from {cwd}); give the path of a Python file, or -m MODULE")]
    ScriptNotFound { path: PathBuf, cwd: PathBuf },
    #[error("script '{0}' is a directory, not a Python file")]
    ScriptIsDirectory(PathBuf),
    #[error("no program given: pass a SCRIPT path or -m MODULE")]
    NoEntry,
    #[error("module name '{0}' is not a dotted Python module name (like 'pkg.train')")]
    BadModule(String),
    #[error(
        "run name '{0}' is not accepted: use 1 to 100 letters, digits, '.', '_' and '-', not \
         starting with '.' or '-' and with no '..'"
    )]
    BadRunName(String),
    #[error("runs directory '{path}' cannot be used: {reason}")]
    RunsDirUnusable { path: PathBuf, reason: String },
    #[error("run name '{name}' is in use by a running run (pid {pid}) in '{path}'; wait for it, stop it (meshrun stop {name}), or pick another --name")]
    NameInUse {
        name: String,
        pid: String,
        path: PathBuf,
    },
    #[error("--keep-checkpoints must be at least 1 (the newest checkpoint is always kept), got 0")]
    KeepNone,
    #[error("--keep-every-n-steps must be at least 1, got 0")]
    KeepEveryZero,
    #[error("--checkpoint-every must be at least 1 step, got 0")]
    CheckpointEveryZero,
    #[error("--memory-checkpoint-every must be at least 1 step, got 0")]
    MemoryEveryZero,
    #[error(
        "--spare-imports: '{0}' is not a module name (dotted Python identifiers, e.g. jax.numpy)"
    )]
    BadSpareImport(String),
    #[error("--hang-timeout must be a positive number of seconds, got {0}")]
    BadHangTimeout(f64),
    #[error("--join-timeout must be a positive number of seconds, got {0}")]
    BadJoinTimeout(f64),
    #[error("--hosts {min}:{max}: MIN must be at least 1 and at most MAX")]
    BadHostRange { min: u32, max: u32 },
    #[error("--rejoin-timeout must be a positive number of seconds, got {0}")]
    BadRejoinTimeout(f64),
    #[error("--rejoin-timeout and --any-host-count are for elastic runs; give --hosts MIN:MAX")]
    ElasticOptionsWithoutRange,
    #[error("storage '{path}' cannot be used: {reason}")]
    StorageUnusable { path: PathBuf, reason: String },
    #[error("--listen {0} is for hosts that join by themselves; with --ray, Ray places the agents: use one or the other")]
    ListenWithRay(std::net::SocketAddr),
    #[error("--listen {0} waits for other hosts to join, but the run has one host; give --hosts 2 or more")]
    ListenOneHost(std::net::SocketAddr),
    #[error("--listen {0} already says where the controller listens; leave out --control-host and --control-port")]
    ListenWithControl(std::net::SocketAddr),
    #[error("--listen {0}: the other hosts must reach this address, so give one of this machine's addresses (e.g. 10.0.0.1:29400), not an unspecified one")]
    ListenUnspecified(std::net::SocketAddr),
    #[error("--listen {host}:{port}: the port is in use ({source}); choose a free port")]
    ListenPortInUse {
        host: std::net::IpAddr,
        port: u16,
        source: io::Error,
    },
    #[error("--listen {host}:{port}: the controller cannot listen there ({source}); give an address of this machine")]
    ListenUnusable {
        host: std::net::IpAddr,
        port: u16,
        source: io::Error,
    },
    #[error("--finish-timeout must be a positive number of seconds, got {0}")]
    BadFinishTimeout(f64),
    #[error("--start-timeout must be a positive number of seconds, got {0}")]
    BadStartTimeout(f64),
    #[error("--ray-strategy '{0}' is not a Ray placement strategy; use one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD")]
    BadRayStrategy(String),
    #[error("--ray needs the cluster's address (HOST:PORT of the head node) or 'auto'")]
    EmptyRayAddress,
    #[error("cannot determine the working directory: {0}")]
    NoCwd(io::Error),
    #[error("--control-port {port} on {host} is in use ({source}); choose a free port, or leave --control-port out and meshrun picks one")]
    ControlPortInUse {
        host: std::net::IpAddr,
        port: u16,
        source: io::Error,
    },
    #[error("the controller cannot listen on --control-host {host} ({source}); give an address of this machine, or 0.0.0.0 for all of them")]
    ControlHostUnusable {
        host: std::net::IpAddr,
        source: io::Error,
    },
    #[error(transparent)]
    Resume(#[from] meshrun_ckpt::resume::ResumeError),
}

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

/// "host 2", "hosts 1, 3".
fn hosts_named(hosts: &[u32]) -> String {
    let list: Vec<String> = hosts.iter().map(u32::to_string).collect();
    match hosts.len() {
        1 => format!("host {}", list[0]),
        _ => format!("hosts {}", list.join(", ")),
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
    #[error("{} did not join within {secs} s: start `meshrun join` there (or give it more time with --join-timeout)", hosts_named(missing))]
    AgentTimeout { missing: Vec<u32>, secs: u64 },
    #[error(
        "only {} host(s) came within {secs} s ({}), and the run needs at least {min} of its \
         {max} (--hosts {min}:{max}){rule}: start `meshrun join` on more hosts, or give a lower MIN",
        had.len(),
        if had.is_empty() { "none".to_string() } else { had.join(", ") }
    )]
    TooFewHosts {
        /// Each host there, as `host R (ADDRESS)`.
        had: Vec<String>,
        min: u32,
        max: u32,
        secs: u64,
        /// Why enough hosts were still too few (no count divides MAX).
        rule: String,
    },
    #[error(
        "host {host} ({ip}) cannot see the run's storage '{}': {problem}. Every host must reach \
         the storage at the same path: put it on a shared filesystem mounted on every host \
         (NFS, Lustre, a bind-mounted volume) and pass it with --storage, or use object storage",
        storage.display()
    )]
    StorageNotShared {
        host: u32,
        ip: String,
        storage: PathBuf,
        problem: String,
    },
    #[error("cannot start the agent of host {host} ({program}): {source}")]
    AgentSpawn {
        host: u32,
        program: String,
        source: io::Error,
    },
    #[error(transparent)]
    Token(#[from] meshrun_protocol::token::TokenError),
    #[error("the controller at {controller} did not accept this host's run token ({why}): give the token of that run (MESHRUN_TOKEN, or --token-file with the file it printed)")]
    HandshakeFailed {
        controller: std::net::SocketAddr,
        why: String,
    },
    #[error("the run refused this host: {0}")]
    JoinRefused(String),
    #[error("could not join the run at {controller} within {secs} s (last: {last}); is `meshrun run --listen {controller}` running, and is that address reachable from here?")]
    JoinTimeout {
        controller: std::net::SocketAddr,
        secs: u64,
        last: String,
    },
    #[error(transparent)]
    Checkpoint(#[from] meshrun_ckpt::CkptError),
    #[error("agent of host {host} {what} before the run started")]
    AgentGone { host: u32, what: String },
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
