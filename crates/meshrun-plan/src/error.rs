//! [`UsageError`]: everything a user can get wrong before a run starts
//! (exit status 2). What can go wrong while running one is the
//! controller's `CoreError` (exit status 1).

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
    #[error("script '{path}' cannot be compiled: {why}; nothing was started (a restart could not change it)")]
    ScriptDoesNotCompile { path: PathBuf, why: String },
    #[error(
        "module '{name}' cannot be run: {why} for {python} (from {cwd}, with the run's environment); \
         give a module it can import, or the path of a script"
    )]
    ModuleNotFound {
        name: String,
        why: String,
        python: PathBuf,
        cwd: PathBuf,
    },
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
    #[cfg(feature = "validate")]
    #[error(transparent)]
    Resume(#[from] meshrun_ckpt::resume::ResumeError),
}
