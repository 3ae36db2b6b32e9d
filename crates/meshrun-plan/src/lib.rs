//! Planning: from a user's request ([`RunSpec`]) to a plan that can run
//! ([`RunPlan`]), and what each worker is started with.
//!
//! Validation happens here, before anything touches the disk, so a bad
//! request exits with a clear message ([`UsageError`]) and leaves no run
//! directory behind. Besides the plan:
//! - [`gpu`]: the GPU inventory and how whole GPUs are handed to workers;
//! - [`worker_env`] and [`launcher_env`]: the environment contract every
//!   worker is started with, and the variables other launchers would set;
//! - [`launch`]: each worker's command line and environment;
//! - [`retention`]: which checkpoints a retention policy keeps.
//!
//! The plan's types and everything computed from them are free of I/O, so
//! the controller's state machine (`meshrun-machine`) builds on this crate
//! without the feature `validate` (on by default): the checks that look at
//! the disk, the network and the object store before a run starts.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

#[cfg(feature = "validate")]
use meshrun_ckpt::store::{is_url, Location};
use serde::{Deserialize, Serialize};

pub mod choices;
pub mod error;
pub mod gpu;
pub mod launch;
pub mod launcher_env;
pub mod memory_limit;
pub mod resume_from;
pub mod retention;
pub mod worker_env;

pub use error::UsageError;
pub use failure::{FailurePolicy, DEFAULT_FINISH_TIMEOUT_S, DEFAULT_START_TIMEOUT_S};
pub use resume_from::ResumeFrom;
pub use retention::{Retention, ScoreOrder};

/// Agents the controller starts itself must have connected by then.
pub const AGENT_JOIN_TIMEOUT: std::time::Duration = std::time::Duration::from_mins(1);

/// Agents that join by themselves (`meshrun join`) may take this long
/// unless `--join-timeout` says otherwise: hosts of a cluster start when
/// their scheduler gets to them.
pub const DEFAULT_JOIN_TIMEOUT: std::time::Duration = std::time::Duration::from_mins(5);

/// The most hosts the local backend simulates: one loopback address each.
pub const MAX_LOCAL_HOSTS: u32 = 250;

/// What each worker runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// `meshrun run train.py ARGS...`
    Script { path: PathBuf, args: Vec<String> },
    /// `meshrun run -m pkg.train ARGS...`
    Module { name: String, args: Vec<String> },
    /// `Trainer(train_fn).fit()`: a cloudpickled function, written into the
    /// run directory by the controller.
    Function,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlatformChoice {
    Cpu,
    Cuda,
    Auto,
}

/// The platform a run actually uses, once `auto` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    Cpu,
    Cuda,
}

impl Platform {
    /// The value of `JAX_PLATFORMS` for this platform.
    pub fn jax_name(self) -> &'static str {
        match self {
            Platform::Cpu => "cpu",
            Platform::Cuda => "cuda",
        }
    }
}

/// Which workers' output is streamed to the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tee {
    /// Rank 0's stdout and stderr, unprefixed.
    Rank0,
    /// Every rank's, each line prefixed `[r]`.
    All,
    /// Nothing: the logs are only in the run directory.
    None,
}

/// A request to run, as the CLI or the Python API received it.
/// What a rank does when its shards of a checkpoint cannot be written (the
/// storage is down, full, or refuses them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveErrorPolicy {
    /// The step is not committed, the controller records why, and
    /// training goes on; the next save tries again.
    #[default]
    Continue,
    /// The rank raises the error from its next `save` (or `wait`), which
    /// fails the attempt like any exception.
    Fail,
}

impl SaveErrorPolicy {
    /// As the worker reads it from its environment.
    pub fn as_str(self) -> &'static str {
        choices::name_of(&choices::SAVE_ERROR_POLICIES, self)
    }
}

#[derive(Debug, Clone)]
pub struct RunSpec {
    pub nprocs: u32,
    pub hosts: u32,
    pub devices_per_proc: Option<u32>,
    pub gpus_per_proc: Option<u32>,
    /// CPUs each worker asks Ray for (Ray's `resources_per_worker`;
    /// default 1). A positive number, checked by the Python layer.
    pub cpus_per_proc: Option<f64>,
    /// The memory each worker may use (`--memory-per-proc`; see
    /// [`memory_limit`]).
    pub memory_per_proc: Option<memory_limit::MemoryLimit>,
    pub platform: PlatformChoice,
    pub name: Option<String>,
    pub runs_dir: PathBuf,
    pub tee: Tee,
    pub entry: Option<Entry>,
    /// The Python interpreter workers are started with.
    pub python: PathBuf,
    /// How to start `meshrun agent` as a separate process (`--hosts` > 1).
    pub agent_command: Vec<String>,
    /// Extra environment for every worker (the Python API's `env=`).
    pub env: Vec<(String, String)>,
    /// Which committed checkpoints to keep.
    pub retention: Option<Retention>,
    /// Save a checkpoint passed to `report` only every N steps.
    pub checkpoint_every: Option<u64>,
    /// What a rank does when its shards of a checkpoint cannot be written.
    pub on_save_error: SaveErrorPolicy,
    /// Checkpoints in host memory and warm spares.
    pub recovery: Recovery,
    /// Write rank 0's metrics as `TensorBoard` event files under the run.
    pub tensorboard: bool,
    /// The metric shown as the run's loss (see `meshrun_record::loss_key`).
    pub loss_metric: Option<String>,
    /// A JSON-lines file the program writes its metrics to, followed by
    /// rank 0 and reported as its steps (for programs that never call
    /// `meshrun.report`).
    pub metrics_file: Option<String>,
    /// Restarts and hang detection.
    pub failure: FailurePolicy,
    /// Place the agents on this Ray cluster instead of this machine.
    pub ray: Option<RayTarget>,
    /// The address the controller listens on (default: 127.0.0.1; with
    /// Ray, every interface, since the agents may live on other machines).
    pub control_host: Option<IpAddr>,
    /// The port it listens on (default: any free port).
    pub control_port: Option<u16>,
    /// Resume from this committed checkpoint step (checked here: it must
    /// exist and verify), or from the beginning, instead of the newest that
    /// verifies.
    pub resume_from: Option<ResumeFrom>,
    /// Where checkpoints go (`STORAGE/NAME/checkpoints`): the one folder
    /// every host must reach, or an object-store URL (`s3://bucket/prefix`).
    /// Default: the runs directory.
    pub storage: Option<String>,
    /// Hosts 1.. join by themselves (`meshrun join ADDR`): the controller
    /// listens here and runs host 0's agent in its own process.
    pub listen: Option<SocketAddr>,
    /// How long hosts may take to join (default: 60 s for agents meshrun
    /// starts, 5 minutes for hosts that join).
    pub join_timeout_s: Option<f64>,
    /// `--hosts MIN:MAX`: `hosts` (and `nprocs`) are the most; attempts
    /// run on as many hosts as are there, down to MIN.
    pub elastic: Option<Elastic>,
    /// Stragglers and profile captures.
    pub observe: Observe,
}

/// The Ray backend: where the cluster is and how to spread the agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RayTarget {
    /// `auto`, or a head node's `HOST:PORT`.
    pub address: String,
    /// Ray's placement-group strategy for the agents' bundles.
    pub strategy: String,
}

pub const RAY_STRATEGIES: [&str; 4] = ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"];

/// A validated run: every field is known to be usable.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunPlan {
    pub name: String,
    pub run_dir: PathBuf,
    pub nprocs: u32,
    pub hosts: u32,
    pub procs_per_host: u32,
    pub platform: Platform,
    /// CPU devices per worker (cpu platform).
    pub devices_per_proc: u32,
    /// GPUs per worker (cuda platform).
    pub gpus_per_proc: u32,
    /// CPUs per worker in a Ray bundle (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_proc: Option<f64>,
    /// The memory each worker may use (see [`memory_limit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_per_proc: Option<memory_limit::MemoryLimit>,
    pub tee: Tee,
    pub entry: Entry,
    pub cwd: PathBuf,
    pub python: PathBuf,
    pub agent_command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub retention: Option<Retention>,
    pub checkpoint_every: Option<u64>,
    #[serde(default)]
    pub recovery: Recovery,
    #[serde(default)]
    pub on_save_error: SaveErrorPolicy,
    #[serde(default)]
    pub tensorboard: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_file: Option<String>,
    pub failure: FailurePolicy,
    pub ray: Option<RayTarget>,
    pub control_host: IpAddr,
    /// 0: any free port.
    #[serde(default)]
    pub control_port: u16,
    /// Where the first attempt resumes from (see `RunSpec`).
    #[serde(default)]
    pub resume_from: Option<ResumeFrom>,
    /// The storage root, when it is not the runs directory: an absolute
    /// path or an object-store URL.
    #[serde(default)]
    pub storage: Option<String>,
    /// This run's folder in the storage as text, a path or a URL: what
    /// workers are told (`storage_dir` is the same as a location).
    #[serde(default)]
    pub storage_dir_text: String,
    /// Hosts 1.. join by themselves at the control address.
    #[serde(default)]
    pub rendezvous: bool,
    #[serde(default)]
    pub join_timeout_s: Option<f64>,
    /// An elastic run: `hosts` and `nprocs` are its most (see
    /// [`RunPlan::sized`] for an attempt's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<Elastic>,
    #[serde(default)]
    pub observe: Observe,
}

impl RunPlan {
    /// The address that stands for host `h` in the local backend: 127.0.0.1
    /// for a one-host run, else 127.0.0.2, 127.0.0.3, ...; with hosts that
    /// join, host 0 is the controller's machine, at the address it listens on.
    pub fn host_ip(&self, host: u32) -> IpAddr {
        if self.rendezvous {
            self.control_host
        } else if self.hosts == 1 {
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, (host + 2) as u8))
        }
    }

    /// This run's folder in the storage: its `checkpoints/` are there.
    /// (The URL was checked when the plan was made.)
    #[cfg(feature = "validate")]
    pub fn storage_dir(&self) -> Location {
        match &self.storage {
            Some(root) => Location::parse(root)
                .expect("the storage was checked when the plan was made")
                .join(&self.name),
            None => Location::Local(self.run_dir.clone()),
        }
    }

    /// Whether checkpoints go to an object store.
    #[cfg(feature = "validate")]
    pub fn remote_storage(&self) -> bool {
        self.storage.as_deref().is_some_and(is_url)
    }

    /// How long the hosts' agents may take to join.
    pub fn join_timeout(&self) -> std::time::Duration {
        match self.join_timeout_s {
            Some(s) => std::time::Duration::from_secs_f64(s),
            None if self.rendezvous => DEFAULT_JOIN_TIMEOUT,
            // The placing process waits up to the start timeout for its
            // placement group, then gives up in its own words: the agents
            // are given that long and a minute more.
            None if self.ray.is_some() => self.failure.start_timeout() + AGENT_JOIN_TIMEOUT,
            None => AGENT_JOIN_TIMEOUT,
        }
    }
}

mod elastic;
mod failure;
mod names;
mod observe;
mod recovery;
pub use elastic::{Elastic, DEFAULT_REJOIN_TIMEOUT_S};
pub use names::check_run_name;
pub use observe::{parse_profile_steps, Observe, DEFAULT_PROFILE_STEPS};
pub use recovery::{Recovery, DEFAULT_SPARE_IMPORTS};
#[cfg(feature = "validate")]
mod program_check;
#[cfg(feature = "validate")]
mod storage_check;
#[cfg(feature = "validate")]
mod validate;

#[cfg(all(test, feature = "validate"))]
mod tests;
