//! The worker environment contract (architecture note): everything a worker
//! needs to know about its place in the run, set before its Python starts.

use meshrun_protocol::env;
use meshrun_protocol::token::{worker_key, Token};

use crate::launcher_env::contract_env;
use crate::{Platform, RunPlan};

/// One worker's place in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub host: u32,
    pub num_hosts: u32,
}

impl Placement {
    /// Ranks are laid out host by host: host h runs ranks
    /// `h*per_host .. (h+1)*per_host`.
    pub fn of(plan: &RunPlan, rank: u32) -> Self {
        Self {
            rank,
            world_size: plan.nprocs,
            local_rank: rank % plan.procs_per_host,
            local_world_size: plan.procs_per_host,
            host: rank / plan.procs_per_host,
            num_hosts: plan.hosts,
        }
    }
}

/// Where a worker finds its credential: the key of its rank in its
/// attempt, derived from the run token, which no worker holds.
pub const WORKER_KEY_ENV: &str = env::WORKER_KEY;

fn worker_key_hex(token_hex: &str, attempt: u32, rank: u32) -> String {
    let token = Token::from_hex(token_hex).expect("the run token is checked before any launch");
    worker_key(&token, attempt, rank).to_hex()
}

/// What the controller knows about the attempt, shared by every worker.
pub struct AttemptInfo<'a> {
    pub run_id: &'a str,
    pub attempt: u32,
    pub control_addr: &'a str,
    pub token_hex: &'a str,
    pub coordinator: &'a str,
    /// The `XLA_FLAGS` the user had set, to be merged rather than replaced.
    pub user_xla_flags: Option<&'a str>,
    /// The address of the worker's host, as its agent reported it.
    pub host_ip: &'a str,
    /// The checkpoint step this attempt resumes from (`None`: from the
    /// beginning), chosen by the controller before the attempt started.
    pub resume_step: Option<u64>,
    /// `resume_step` is restored from the hosts' memory, not storage.
    pub resume_memory: bool,
    /// An elastic run's sizes, and why this attempt's changed.
    pub elastic: Option<ElasticInfo<'a>>,
}

/// What the program of an elastic run is told about its size.
#[derive(Debug, Clone, Copy)]
pub struct ElasticInfo<'a> {
    pub min_world: u32,
    pub max_world: u32,
    /// The world size of the attempt before (`None`: the first).
    pub previous_world: Option<u32>,
    /// Why the world size is not the previous attempt's (or, the first,
    /// not the most).
    pub reason: Option<&'a str>,
}

const DEVICE_COUNT_FLAG: &str = "--xla_force_host_platform_device_count";

/// The user's `XLA_FLAGS` with the CPU device count set to `devices`; any
/// count the user gave is replaced, since `--devices-per-proc` decides it.
pub fn merge_xla_flags(user: Option<&str>, devices: u32) -> String {
    let mut flags: Vec<String> = user
        .unwrap_or("")
        .split_whitespace()
        .filter(|f| !f.starts_with(DEVICE_COUNT_FLAG))
        .map(str::to_string)
        .collect();
    flags.push(format!("{DEVICE_COUNT_FLAG}={devices}"));
    flags.join(" ")
}

/// The environment of one worker, on top of what its agent inherited.
pub fn worker_env(
    plan: &RunPlan,
    info: &AttemptInfo<'_>,
    at: Placement,
    gpus: &[String],
) -> Vec<(String, String)> {
    let run_dir = plan.run_dir.display().to_string();
    let mut env: Vec<(String, String)> = vec![
        // The run folder lives on the controller's machine only: workers
        // are told where it is, never write there. Checkpoints go to the
        // storage, the one folder every host reaches.
        (env::RUN_DIR.into(), run_dir),
        (env::STORAGE_DIR.into(), plan.storage_dir_text.clone()),
        (env::RUN_ID.into(), info.run_id.into()),
        (env::ATTEMPT.into(), info.attempt.to_string()),
        (env::CONTROL_ADDR.into(), info.control_addr.into()),
        // The worker's own credential, never the run token (see
        // `token::worker_key`).
        (
            WORKER_KEY_ENV.into(),
            worker_key_hex(info.token_hex, info.attempt, at.rank),
        ),
        (env::RANK.into(), at.rank.to_string()),
        (env::WORLD_SIZE.into(), at.world_size.to_string()),
        (env::LOCAL_RANK.into(), at.local_rank.to_string()),
        (
            env::LOCAL_WORLD_SIZE.into(),
            at.local_world_size.to_string(),
        ),
        (env::HOST_RANK.into(), at.host.to_string()),
        (env::NUM_HOSTS.into(), at.num_hosts.to_string()),
        (env::HOST_IP.into(), info.host_ip.into()),
        // The JAX coordinator (`host:port`), where meshrun reads it: the
        // launchers' variables below may be changed by a program.
        (env::COORDINATOR.into(), info.coordinator.into()),
        // JAX's coordinator binds every interface unless told otherwise;
        // it should listen where the run said it would, and nowhere else.
        (
            "JAX_COORDINATOR_BIND_ADDRESS".into(),
            info.coordinator.into(),
        ),
        ("JAX_PLATFORMS".into(), plan.platform.jax_name().into()),
        // The cache itself is host-local (the agent names it, in its
        // scratch folder). Cache every compilation, however quick: a restart then compiles
        // nothing (JAX's default skips those under a second).
        (
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS".into(),
            "0".into(),
        ),
        // Workers write to pipes; without this Python would hold output
        // back in a block buffer and logs would arrive late or be lost.
        ("PYTHONUNBUFFERED".into(), "1".into()),
    ];
    env.extend(contract_env(at, info.coordinator, info.attempt));
    // Always set, so that `meshrun.get_checkpoint()` gives out the step the
    // controller verified and never a newer one it skipped as damaged.
    let resume = info.resume_step.map_or("none".into(), |s| s.to_string());
    env.push((env::RESUME_STEP.into(), resume));
    if info.resume_memory {
        env.push((env::RESUME_FROM.into(), "memory".into()));
    }
    if let Some(e) = info.elastic {
        env.push((env::MIN_WORLD_SIZE.into(), e.min_world.to_string()));
        env.push((env::MAX_WORLD_SIZE.into(), e.max_world.to_string()));
        if let Some(p) = e.previous_world {
            env.push((env::PREVIOUS_WORLD_SIZE.into(), p.to_string()));
        }
        if let Some(reason) = e.reason {
            env.push((env::RESIZE_REASON.into(), reason.into()));
        }
    }
    if let Some(n) = plan.recovery.memory_every {
        env.push((env::MEMORY_EVERY.into(), n.to_string()));
    }
    env.push((
        env::ON_SAVE_ERROR.into(),
        plan.on_save_error.as_str().into(),
    ));
    if let Some(path) = &plan.metrics_file {
        env.push((env::METRICS_FILE.into(), path.clone()));
    }
    if let Some(n) = plan.checkpoint_every {
        env.push((env::CHECKPOINT_EVERY.into(), n.to_string()));
    }
    if let Some(limit) = plan.memory_per_proc {
        env.push((env::MEMORY_PER_PROC.into(), limit.0.to_string()));
    }
    match plan.platform {
        Platform::Cpu => env.push((
            "XLA_FLAGS".into(),
            merge_xla_flags(info.user_xla_flags, plan.devices_per_proc),
        )),
        Platform::Cuda => {
            let ids = gpus.join(",");
            env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
            env.push(("CUDA_VISIBLE_DEVICES".into(), ids.clone()));
            // Within the worker CUDA renumbers the visible GPUs from 0;
            // the physical ids stay on record here.
            env.push((env::GPUS.into(), ids));
        }
    }
    env.extend(plan.env.iter().cloned());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_count_is_merged_into_user_flags() {
        assert_eq!(
            merge_xla_flags(
                Some("--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8"),
                2
            ),
            "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"
        );
        assert_eq!(
            merge_xla_flags(None, 4),
            "--xla_force_host_platform_device_count=4"
        );
    }
}
