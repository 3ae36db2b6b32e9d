//! The engine's usage errors in the words of the Python API.
//!
//! The plan (`meshrun_core::plan`) is the one place where a request's values
//! are checked; its messages name the command line's flags. A `Trainer` user
//! set `ScalingConfig.num_workers`, not `-n`, so every variant that names a
//! flag is reworded here with the Python argument. The match has no catch-all:
//! a new variant has to be placed.

use meshrun_plan::gpu::GpuError;
use meshrun_plan::UsageError;
use meshrun_plan::RAY_STRATEGIES;

/// `err`'s message, naming the Python arguments that set the values.
#[allow(clippy::too_many_lines)] // one arm per variant, nothing else
pub fn python_words(err: &UsageError) -> String {
    match err {
        UsageError::NoProcesses(n) => at_least("ScalingConfig.num_workers", 1, n),
        UsageError::NoHosts(n) => at_least("ScalingConfig.num_hosts", 1, n),
        UsageError::BadStragglerThreshold(t) => format!(
            "RunConfig.straggler_threshold must be a share of a step above 0 (0.2: 20% of a step \
             later than the median rank), got {t}"
        ),
        UsageError::BadStragglerSteps(n) => at_least("RunConfig.straggler_steps", 1, n),
        UsageError::BadProfileSteps(text) => format!(
            "RunConfig.profile_steps must be a pair (A, B) of steps with A below B, got {text}"
        ),
        UsageError::HostsDoNotDivide {
            hosts,
            nprocs,
            divisors,
        } => format!(
            "ScalingConfig.num_hosts {hosts} does not divide ScalingConfig.num_workers {nprocs}: \
             every host runs the same number of workers; use a host count that divides \
             {nprocs} (one of: {divisors})"
        ),
        UsageError::TooManyHosts { hosts, max } => format!(
            "ScalingConfig.num_hosts {hosts} is more than meshrun supports ({max}); the local \
             backend gives each host a loopback address, 127.0.0.2 ... 127.0.0.{}",
            max + 1
        ),
        UsageError::NoDevices(n) => at_least("ScalingConfig.devices_per_worker", 1, n),
        UsageError::NoGpus(n) => at_least("ScalingConfig.gpus_per_worker", 1, n),
        UsageError::DevicesOnCuda(n) => format!(
            "ScalingConfig.devices_per_worker={n} applies to the cpu platform only; with cuda \
             every worker gets ScalingConfig.gpus_per_worker whole GPUs"
        ),
        UsageError::GpusOnCpu(n) => {
            format!("ScalingConfig.gpus_per_worker={n} needs platform 'cuda' or 'auto', not 'cpu'")
        }
        UsageError::Gpu(GpuError::NotEnough {
            host,
            workers,
            per_worker,
            found,
            source_text,
        }) => format!(
            "{workers} workers x ScalingConfig.gpus_per_worker={per_worker} need {needed} GPUs \
             on host {host}, but {found} {are} available ({source_text}); lower num_workers or \
             gpus_per_worker, or use platform='cpu'",
            needed = workers * per_worker,
            are = if *found == 1 { "is" } else { "are" },
        ),
        UsageError::KeepNone => format!(
            "{} (the newest checkpoint is always kept)",
            at_least("CheckpointConfig.num_to_keep", 1, 0)
        ),
        UsageError::KeepEveryZero => at_least("CheckpointConfig.keep_every_n_steps", 1, 0),
        UsageError::CheckpointEveryZero => at_least("CheckpointConfig.every_n_steps", 1, 0),
        UsageError::MemoryEveryZero => at_least("CheckpointConfig.memory_every_n_steps", 1, 0),
        UsageError::BadSpareImport(name) => format!(
            "FailureConfig.spare_imports: {name:?} is not a module name (dotted Python identifiers, e.g. 'jax.numpy')"
        ),
        UsageError::BadHostRange { min, max } => format!(
            "ScalingConfig.num_workers=(MIN, MAX) makes {min} to {max} hosts: MIN must be at \
             least 1 host's workers and at most MAX"
        ),
        UsageError::BadRejoinTimeout(t) => {
            format!("ScalingConfig.rejoin_timeout_s must be a positive number of seconds, got {t}")
        }
        UsageError::ElasticOptionsWithoutRange => "ScalingConfig.rejoin_timeout_s and \
             any_host_count are for elastic runs: give num_workers=(MIN, MAX)"
            .to_string(),
        UsageError::BadHangTimeout(t) => {
            format!("FailureConfig.hang_timeout_s must be a positive number of seconds, got {t}")
        }
        UsageError::BadStartTimeout(t) => {
            format!("FailureConfig.start_timeout_s must be a positive number of seconds, got {t}")
        }
        UsageError::BadRayStrategy(s) => format!(
            "ScalingConfig.ray_strategy '{s}' is not a Ray placement strategy; use one of {}",
            RAY_STRATEGIES.join(", ")
        ),
        UsageError::EmptyRayAddress => no_ray_address(),
        UsageError::ControlPortInUse { host, port, source } => format!(
            "ScalingConfig.control_port {port} on {host} is in use ({source}); choose a free \
             port, or leave control_port None and meshrun picks one"
        ),
        UsageError::ControlHostUnusable { host, source } => format!(
            "the controller cannot listen on ScalingConfig.control_host {host} ({source}); give \
             an address of this machine, or 0.0.0.0 for all of them"
        ),
        UsageError::NameInUse { name, pid, path } => format!(
            "run name '{name}' is in use by a running run (pid {pid}) in '{}'; wait for it, \
             stop it (meshrun stop {name}), or pick another RunConfig.name",
            path.display()
        ),
        UsageError::BadJoinTimeout(t) => {
            format!("ScalingConfig.join_timeout_s must be a positive number of seconds, got {t}")
        }
        UsageError::ListenWithRay(a) => format!(
            "ScalingConfig.listen '{a}' is for hosts that join by themselves; with \
             backend='ray', Ray places the agents: use one or the other"
        ),
        UsageError::ListenOneHost(a) => format!(
            "ScalingConfig.listen '{a}' waits for other hosts to join, but num_hosts is 1; give \
             num_hosts 2 or more"
        ),
        UsageError::ListenWithControl(a) => format!(
            "ScalingConfig.listen '{a}' already says where the controller listens; leave \
             control_host and control_port None"
        ),
        UsageError::ListenUnspecified(a) => format!(
            "ScalingConfig.listen '{a}': the other hosts must reach this address, so give one \
             of this machine's addresses (like '10.0.0.1:29400'), not an unspecified one"
        ),
        UsageError::ListenPortInUse { host, port, source } => format!(
            "ScalingConfig.listen '{host}:{port}': the port is in use ({source}); choose a free port"
        ),
        UsageError::ListenUnusable { host, port, source } => format!(
            "ScalingConfig.listen '{host}:{port}': the controller cannot listen there ({source}); \
             give an address of this machine"
        ),
        // Name no flag, or cannot come from the Python API.
        UsageError::StorageUnusable { .. }
        |
        UsageError::Gpu(GpuError::Duplicate { .. })
        | UsageError::ScriptNotFound { .. }
        | UsageError::ScriptIsDirectory(_)
        | UsageError::ScriptDoesNotCompile { .. }
        | UsageError::ModuleNotFound { .. }
        | UsageError::NoEntry
        | UsageError::BadModule(_)
        | UsageError::BadRunName(_)
        | UsageError::RunsDirUnusable { .. }
        | UsageError::BadFinishTimeout(_)
        | UsageError::NoCwd(_)
        | UsageError::Resume(_) => err.to_string(),
    }
}

/// `ScalingConfig(backend='ray')` without an address, or with an empty one.
pub fn no_ray_address() -> String {
    "ScalingConfig(backend='ray') needs ray_address: 'auto' or the head node's HOST:PORT".into()
}

pub fn at_least(name: &str, min: i64, got: impl std::fmt::Display) -> String {
    format!("{name} must be at least {min}, got {got}")
}
