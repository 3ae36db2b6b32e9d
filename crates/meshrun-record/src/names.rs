//! The names inside a run directory, spelled once. Python gets them through
//! the binding.

use std::path::{Path, PathBuf};

/// The run and its attempts ([`crate::RunRecord`]), replaced atomically.
pub const RUN_JSON: &str = "run.json";
/// One [`crate::EventLine`] per line, appended.
pub const EVENTS: &str = "events.jsonl";
/// One [`crate::MetricsRecord`] per line: rank 0's reports.
pub const METRICS: &str = "metrics.jsonl";
/// One [`crate::LagRecord`] per line: when each rank reached each step.
pub const LAG: &str = "lag.jsonl";
/// One [`crate::memory::MemoryRecord`] per line: the ranks' memory as
/// their agents (and workers, for their devices) sent it.
pub const MEMORY: &str = "memory.jsonl";
/// Profile captures, `profiles/<time>/rank-R/` (see [`profile_dir`]).
pub const PROFILES: &str = "profiles";
/// [`crate::Goodput`], rewritten after every attempt.
pub const GOODPUT: &str = "goodput.json";
/// The page `meshrun report` writes.
pub const REPORT: &str = "report.html";
/// The run's secret, readable by its owner only.
pub const TOKEN: &str = "token";
/// Held (flock) by the controller while the run is live.
pub const LOCK: &str = ".lock";
/// `Trainer(...).fit()`'s pickled function.
pub const FUNCTION: &str = "function.pkl";
/// One log per rank, `logs/rank-N.log`.
pub const LOGS: &str = "logs";
/// Committed checkpoints, `checkpoints/step-N` (names in `meshrun-ckpt`).
pub const CHECKPOINTS: &str = "checkpoints";
/// Stack dumps of a failed attempt, `stacks/attempt-N/rank-R.txt`.
pub const STACKS: &str = "stacks";
/// The event files of `--tensorboard`.
pub const TENSORBOARD: &str = "tensorboard";

/// The environment variable naming a host's scratch folder: what is
/// host-local and never shared (default: `meshrun-UID` in the system's
/// temporary folder). Inside it, `compile-cache/` (JAX's persistent cache,
/// shared by runs: its keys hash the computation, platform and flags) and
/// one folder per run ([`scratch_run`]) with the function of
/// `Trainer.fit` ([`FUNCTION`]) and the ranks' stacks ([`stacks_dir`]).
/// Workers get their run's folder in the same variable.
pub const SCRATCH_ENV: &str = "MESHRUN_SCRATCH";
/// JAX's compilation cache, in a host's scratch folder.
pub const COMPILE_CACHE: &str = "compile-cache";

/// A run's folder inside a host's scratch folder.
pub fn scratch_run(scratch: &Path, run_id: &str) -> PathBuf {
    scratch.join("runs").join(run_id)
}

/// `logs/rank-N.log` under `root`.
pub fn log_path(root: &Path, rank: u32) -> PathBuf {
    root.join(LOGS).join(format!("rank-{rank}.log"))
}

/// `stacks/attempt-N` under `root`.
pub fn stacks_dir(root: &Path, attempt: u32) -> PathBuf {
    root.join(STACKS).join(format!("attempt-{attempt}"))
}

/// `profiles/<capture>` under `root`: one capture's traces, each rank's
/// in `rank-R/`, and all of them for `TensorBoard` in [`PROFILE_TENSORBOARD`]
/// (`plugins/profile/<capture>/rank-R.xplane.pb` inside).
pub fn profile_dir(root: &Path, capture: &str) -> PathBuf {
    root.join(PROFILES).join(capture)
}

/// In a capture's folder, the `--logdir` of `TensorBoard`'s profile plugin.
pub const PROFILE_TENSORBOARD: &str = "tensorboard";

/// `steps/attempt-N` under a host's run scratch folder: each worker
/// appends there, in `rank-R.bin`, when it reached each step; the host's
/// agent reads them (see `meshrun_record::lag`).
pub fn steps_dir(root: &Path, attempt: u32) -> PathBuf {
    root.join("steps").join(format!("attempt-{attempt}"))
}

/// `beats/attempt-N` under a host's run scratch folder: each worker's
/// writer thread overwrites its `rank-R` there with the Unix time in ns
/// (8 bytes, little-endian) every second it has nothing else to send; the
/// host's agent tells the controller whose moved, in one message.
pub fn beats_dir(root: &Path, attempt: u32) -> PathBuf {
    root.join("beats").join(format!("attempt-{attempt}"))
}

/// Rank `rank`'s heartbeat file in [`beats_dir`].
pub fn beat_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// The file rank `rank` appends its step arrivals to, in [`steps_dir`]:
/// records of [`STEP_RECORD_BYTES`], the step and the Unix time in ns
/// (both little-endian, `u64` and `i64`).
pub fn step_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}.bin"))
}

/// The size of one record of a [`step_file`].
pub const STEP_RECORD_BYTES: usize = 16;

/// The file rank `rank` dumps its stacks into, inside [`stacks_dir`].
pub fn stack_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}.txt"))
}

/// `calls.txt` in an attempt's stacks folder: the flight recorder's dump,
/// each rank's last calls of programs across processes and what those
/// programs are.
pub fn calls_file(dir: &Path) -> PathBuf {
    dir.join("calls.txt")
}
