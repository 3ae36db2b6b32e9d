//! The checks a request gets before a run starts ([`RunSpec::validate`]):
//! every value, then what looks at the disk, the network and the object
//! store (the script, the runs folder, the storage, the control address,
//! the checkpoint to resume from). The feature `validate`.

use std::net::{IpAddr, SocketAddr};

use meshrun_ckpt::store::{is_url, Location};

use crate::gpu::Inventory;
use crate::names::{default_run_name, is_module_name};
use crate::storage_check::{check_remote_storage, check_runs_dir, check_storage};
use crate::{
    check_run_name, Entry, Platform, PlatformChoice, ResumeFrom, RunPlan, RunSpec, UsageError,
    MAX_LOCAL_HOSTS, RAY_STRATEGIES,
};

impl RunSpec {
    /// Checks everything that can be checked without starting the run.
    pub fn validate(self) -> Result<RunPlan, UsageError> {
        self.validate_with(&Inventory::discover)
    }

    /// [`RunSpec::validate`] with the local GPU inventory supplied, for tests.
    pub fn validate_with(
        self,
        inventory: &dyn Fn() -> Result<Inventory, crate::gpu::GpuError>,
    ) -> Result<RunPlan, UsageError> {
        if self.nprocs == 0 {
            return Err(UsageError::NoProcesses(self.nprocs));
        }
        if self.hosts == 0 {
            return Err(UsageError::NoHosts(self.hosts));
        }
        if !self.nprocs.is_multiple_of(self.hosts) {
            let divisors: Vec<String> = (1..=self.nprocs)
                .filter(|d| self.nprocs.is_multiple_of(*d))
                .map(|d| d.to_string())
                .collect();
            return Err(UsageError::HostsDoNotDivide {
                hosts: self.hosts,
                nprocs: self.nprocs,
                divisors: divisors.join(", "),
            });
        }
        // Only the local backend's own agents need a loopback address each;
        // hosts that join (`--listen`) or Ray's bring their own.
        if self.hosts > MAX_LOCAL_HOSTS && self.listen.is_none() && self.ray.is_none() {
            return Err(UsageError::TooManyHosts {
                hosts: self.hosts,
                max: MAX_LOCAL_HOSTS,
            });
        }
        if let Some(0) = self.devices_per_proc {
            return Err(UsageError::NoDevices(0));
        }
        if let Some(0) = self.gpus_per_proc {
            return Err(UsageError::NoGpus(0));
        }
        if let Some(r) = &self.retention {
            if r.num_to_keep == Some(0) {
                return Err(UsageError::KeepNone);
            }
            if r.keep_every_n_steps == Some(0) {
                return Err(UsageError::KeepEveryZero);
            }
        }
        if self.checkpoint_every == Some(0) {
            return Err(UsageError::CheckpointEveryZero);
        }
        self.recovery.validate()?;
        if let Some(t) = self.failure.hang_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(UsageError::BadHangTimeout(t));
            }
        }
        if let Some(t) = self.failure.finish_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(UsageError::BadFinishTimeout(t));
            }
        }
        if let Some(t) = self.failure.start_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(UsageError::BadStartTimeout(t));
            }
        }
        if let Some(t) = self.join_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(UsageError::BadJoinTimeout(t));
            }
        }
        if let Some(listen) = self.listen {
            self.check_listen(listen)?;
        }
        if let Some(e) = &self.elastic {
            e.validate(self.hosts)?;
        }
        self.observe.validate()?;
        if let Some(ray) = &self.ray {
            if !RAY_STRATEGIES.contains(&ray.strategy.as_str()) {
                return Err(UsageError::BadRayStrategy(ray.strategy.clone()));
            }
            if ray.address.trim().is_empty() {
                return Err(UsageError::EmptyRayAddress);
            }
        }
        let procs_per_host = self.nprocs / self.hosts;
        let platform = self.resolve_platform(procs_per_host, inventory)?;
        let cwd = std::env::current_dir().map_err(UsageError::NoCwd)?;
        let entry = match self.entry {
            None => return Err(UsageError::NoEntry),
            Some(Entry::Script { path, args }) => {
                let full = cwd.join(&path);
                if full.is_dir() {
                    return Err(UsageError::ScriptIsDirectory(path));
                }
                if !full.is_file() {
                    return Err(UsageError::ScriptNotFound { path, cwd });
                }
                Entry::Script { path: full, args }
            }
            Some(Entry::Module { name, args }) => {
                if !is_module_name(&name) {
                    return Err(UsageError::BadModule(name));
                }
                Entry::Module { name, args }
            }
            Some(Entry::Function) => Entry::Function,
        };
        // Where the workers run on this machine, their interpreter is this
        // one's to ask; elsewhere (Ray, joining hosts) it may be another.
        if self.ray.is_none() && self.listen.is_none() {
            crate::program_check::check_loadable(&self.python, &entry, &cwd, &self.env)?;
        }
        let name = match self.name {
            Some(name) => {
                check_run_name(&name)?;
                name
            }
            None => default_run_name(),
        };
        let control_host = self.control_host.unwrap_or(if self.ray.is_some() {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        });
        let control_port = self.control_port.unwrap_or(0);
        let (control_host, control_port) = self
            .listen
            .map_or((control_host, control_port), |l| (l.ip(), l.port()));
        check_control_address(control_host, control_port).map_err(|e| match (self.listen, e) {
            (Some(_), UsageError::ControlPortInUse { host, port, source }) => {
                UsageError::ListenPortInUse { host, port, source }
            }
            (Some(_), UsageError::ControlHostUnusable { host, source }) => {
                UsageError::ListenUnusable {
                    host,
                    port: control_port,
                    source,
                }
            }
            (_, e) => e,
        })?;
        let runs_dir = cwd.join(&self.runs_dir);
        check_runs_dir(&runs_dir)?;
        let storage = match self.storage {
            Some(url) if is_url(&url) => {
                check_remote_storage(&url, &name)?;
                Some(url.trim_end_matches('/').to_string())
            }
            Some(root) => {
                let root = cwd.join(root);
                check_storage(&root)?;
                Some(root.display().to_string())
            }
            None => None,
        };
        let storage_dir = match &storage {
            Some(root) => Location::parse(root)
                .map_err(|e| UsageError::StorageUnusable {
                    path: root.into(),
                    reason: e.to_string(),
                })?
                .join(&name),
            None => Location::Local(runs_dir.join(&name)),
        };
        if let Some(step) = self.resume_from.and_then(ResumeFrom::step) {
            meshrun_ckpt::resume::check_requested(&storage_dir, &name, step)?;
        }
        Ok(RunPlan {
            storage_dir_text: storage_dir.to_string(),
            run_dir: runs_dir.join(&name),
            name,
            nprocs: self.nprocs,
            hosts: self.hosts,
            procs_per_host,
            platform,
            devices_per_proc: self.devices_per_proc.unwrap_or(1),
            cpus_per_proc: self.cpus_per_proc,
            memory_per_proc: self.memory_per_proc,
            gpus_per_proc: match platform {
                Platform::Cuda => self.gpus_per_proc.unwrap_or(1),
                Platform::Cpu => 0,
            },
            tee: self.tee,
            entry,
            cwd,
            python: self.python,
            agent_command: self.agent_command,
            env: self.env,
            retention: self.retention,
            checkpoint_every: self.checkpoint_every,
            recovery: self.recovery,
            on_save_error: self.on_save_error,
            tensorboard: self.tensorboard,
            loss_metric: self.loss_metric,
            metrics_file: self.metrics_file,
            failure: self.failure,
            control_host,
            control_port,
            ray: self.ray,
            resume_from: self.resume_from,
            storage,
            rendezvous: self.listen.is_some(),
            join_timeout_s: self.join_timeout_s,
            elastic: self.elastic,
            observe: self.observe,
        })
    }

    /// `--listen ADDR:PORT`: other hosts must be able to reach the address,
    /// so it must name one; the local backend's own agents, Ray's and a
    /// listen address exclude each other.
    fn check_listen(&self, listen: SocketAddr) -> Result<(), UsageError> {
        if self.ray.is_some() {
            return Err(UsageError::ListenWithRay(listen));
        }
        if self.hosts < 2 {
            return Err(UsageError::ListenOneHost(listen));
        }
        if self.control_host.is_some() || self.control_port.is_some() {
            return Err(UsageError::ListenWithControl(listen));
        }
        if listen.ip().is_unspecified() {
            return Err(UsageError::ListenUnspecified(listen));
        }
        Ok(())
    }

    fn resolve_platform(
        &self,
        procs_per_host: u32,
        inventory: &dyn Fn() -> Result<Inventory, crate::gpu::GpuError>,
    ) -> Result<Platform, UsageError> {
        let platform = match self.platform {
            PlatformChoice::Cpu => {
                if let Some(g) = self.gpus_per_proc {
                    return Err(UsageError::GpusOnCpu(g));
                }
                return Ok(Platform::Cpu);
            }
            PlatformChoice::Cuda => Platform::Cuda,
            // With Ray the GPUs are the cluster's, not this machine's.
            PlatformChoice::Auto if self.ray.is_some() => {
                if self.gpus_per_proc.is_some() {
                    Platform::Cuda
                } else {
                    Platform::Cpu
                }
            }
            PlatformChoice::Auto => {
                if self.gpus_per_proc.is_some() || !inventory()?.ids.is_empty() {
                    Platform::Cuda
                } else {
                    Platform::Cpu
                }
            }
        };
        if platform == Platform::Cuda {
            if let Some(k) = self.devices_per_proc {
                return Err(UsageError::DevicesOnCuda(k));
            }
            if self.ray.is_some() {
                // Ray's placement group checks the cluster's GPUs.
                return Ok(platform);
            }
            // The local backend's hosts share this machine's GPUs, so the
            // whole machine must have enough for every worker.
            let per = self.gpus_per_proc.unwrap_or(1);
            inventory()?.assign(0, procs_per_host * self.hosts, per)?;
        }
        Ok(platform)
    }
}

/// The controller must be able to listen where it was told to. Checked by
/// binding once before anything is written (the attempt binds again, so a
/// port taken in between still fails, later, as a run failure naming it).
fn check_control_address(host: IpAddr, port: u16) -> Result<(), UsageError> {
    match std::net::TcpListener::bind((host, port)) {
        Ok(_) => Ok(()),
        Err(source) if port != 0 && source.kind() == std::io::ErrorKind::AddrInUse => {
            Err(UsageError::ControlPortInUse { host, port, source })
        }
        Err(source) => Err(UsageError::ControlHostUnusable { host, source }),
    }
}
