//! The names of the environment a worker runs in: the contract between
//! the agent that starts it and meshrun's code inside it. Spelled here
//! once; Python reads them as `meshrun._native.ENV[key]`, by the keys of
//! [`ALL`].

pub use crate::token::TOKEN_ENV as TOKEN;

/// The worker's own credential (derived from the run token, never the
/// token itself).
pub const WORKER_KEY: &str = "MESHRUN_WORKER_KEY";

pub const RUN_DIR: &str = "MESHRUN_RUN_DIR";
pub const STORAGE_DIR: &str = "MESHRUN_STORAGE_DIR";
pub const RUN_ID: &str = "MESHRUN_RUN_ID";
pub const ATTEMPT: &str = "MESHRUN_ATTEMPT";
pub const CONTROL_ADDR: &str = "MESHRUN_CONTROL_ADDR";
pub const RANK: &str = "MESHRUN_RANK";
pub const WORLD_SIZE: &str = "MESHRUN_WORLD_SIZE";
pub const LOCAL_RANK: &str = "MESHRUN_LOCAL_RANK";
pub const LOCAL_WORLD_SIZE: &str = "MESHRUN_LOCAL_WORLD_SIZE";
pub const HOST_RANK: &str = "MESHRUN_HOST_RANK";
pub const NUM_HOSTS: &str = "MESHRUN_NUM_HOSTS";
pub const HOST_IP: &str = "MESHRUN_HOST_IP";
/// The JAX coordinator as `host:port`: the one address meshrun reads (the
/// launchers' variables beside it may be rewritten by a program).
pub const COORDINATOR: &str = "MESHRUN_COORDINATOR";
/// The step to resume from, or `none`.
pub const RESUME_STEP: &str = "MESHRUN_RESUME_STEP";
/// `memory` when the hosts' memory copy of the step is to be read.
pub const RESUME_FROM: &str = "MESHRUN_RESUME_FROM";
pub const MIN_WORLD_SIZE: &str = "MESHRUN_MIN_WORLD_SIZE";
pub const MAX_WORLD_SIZE: &str = "MESHRUN_MAX_WORLD_SIZE";
pub const PREVIOUS_WORLD_SIZE: &str = "MESHRUN_PREVIOUS_WORLD_SIZE";
pub const RESIZE_REASON: &str = "MESHRUN_RESIZE_REASON";
pub const MEMORY_EVERY: &str = "MESHRUN_MEMORY_EVERY";
/// The host's memory tier (its shared-memory folder).
pub const MEMORY_DIR: &str = "MESHRUN_MEMORY_DIR";
pub const ON_SAVE_ERROR: &str = "MESHRUN_ON_SAVE_ERROR";
pub const METRICS_FILE: &str = "MESHRUN_METRICS_FILE";
pub const CHECKPOINT_EVERY: &str = "MESHRUN_CHECKPOINT_EVERY";
/// The memory the worker may use, in bytes (`--memory-per-proc`): its
/// cgroup's limit on CPU, its share of its GPU on CUDA.
pub const MEMORY_PER_PROC: &str = "MESHRUN_MEMORY_PER_PROC";
/// The physical GPU ids the worker was given.
pub const GPUS: &str = "MESHRUN_GPUS";
/// The host's scratch folder (its compilation cache, the runs' host-local
/// files).
pub const SCRATCH: &str = meshrun_record::names::SCRATCH_ENV;
/// What a warm spare imports while it waits.
pub const SPARE_IMPORTS: &str = "MESHRUN_SPARE_IMPORTS";
/// `1`: the ranks run independent programs (no `jax.distributed`), on
/// purpose.
pub const INDEPENDENT: &str = "MESHRUN_INDEPENDENT";
/// `0`: the flight recorder is off (set by the user: see
/// docs/debugging.md).
pub const RECORDER: &str = "MESHRUN_RECORDER";
/// Where a run's workers reach the Ray Data actor that feeds them.
pub const RAY_DATA_ADDRESS: &str = "MESHRUN_RAY_DATA_ADDRESS";
pub const RAY_DATA_ACTOR: &str = "MESHRUN_RAY_DATA_ACTOR";

/// Every name, by the key Python reads it under.
pub const ALL: &[(&str, &str)] = &[
    ("token", TOKEN),
    ("worker_key", WORKER_KEY),
    ("run_dir", RUN_DIR),
    ("storage_dir", STORAGE_DIR),
    ("run_id", RUN_ID),
    ("attempt", ATTEMPT),
    ("control_addr", CONTROL_ADDR),
    ("rank", RANK),
    ("world_size", WORLD_SIZE),
    ("local_rank", LOCAL_RANK),
    ("local_world_size", LOCAL_WORLD_SIZE),
    ("host_rank", HOST_RANK),
    ("num_hosts", NUM_HOSTS),
    ("host_ip", HOST_IP),
    ("coordinator", COORDINATOR),
    ("resume_step", RESUME_STEP),
    ("resume_from", RESUME_FROM),
    ("min_world_size", MIN_WORLD_SIZE),
    ("max_world_size", MAX_WORLD_SIZE),
    ("previous_world_size", PREVIOUS_WORLD_SIZE),
    ("resize_reason", RESIZE_REASON),
    ("memory_every", MEMORY_EVERY),
    ("memory_dir", MEMORY_DIR),
    ("on_save_error", ON_SAVE_ERROR),
    ("memory_per_proc", MEMORY_PER_PROC),
    ("metrics_file", METRICS_FILE),
    ("checkpoint_every", CHECKPOINT_EVERY),
    ("gpus", GPUS),
    ("scratch", SCRATCH),
    ("spare_imports", SPARE_IMPORTS),
    ("independent", INDEPENDENT),
    ("recorder", RECORDER),
    ("ray_data_address", RAY_DATA_ADDRESS),
    ("ray_data_actor", RAY_DATA_ACTOR),
];

#[cfg(test)]
mod tests {
    use super::ALL;

    #[test]
    fn every_name_is_meshruns_and_listed_once() {
        let mut keys: Vec<&str> = ALL.iter().map(|(k, _)| *k).collect();
        let mut names: Vec<&str> = ALL.iter().map(|(_, n)| *n).collect();
        for (key, name) in ALL {
            assert_eq!(format!("MESHRUN_{}", key.to_uppercase()), *name);
        }
        keys.sort_unstable();
        names.sort_unstable();
        keys.dedup();
        names.dedup();
        assert_eq!((keys.len(), names.len()), (ALL.len(), ALL.len()));
    }
}
