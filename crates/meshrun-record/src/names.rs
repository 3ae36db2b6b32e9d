//! The names inside a run directory, spelled once. Python gets them through
//! the binding.

use std::path::{Path, PathBuf};

/// The run and its attempts ([`crate::RunRecord`]), replaced atomically.
pub const RUN_JSON: &str = "run.json";
/// One [`crate::EventLine`] per line, appended.
pub const EVENTS: &str = "events.jsonl";
/// One [`crate::MetricsRecord`] per line: rank 0's reports.
pub const METRICS: &str = "metrics.jsonl";
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

/// The file rank `rank` dumps its stacks into, inside [`stacks_dir`].
pub fn stack_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}.txt"))
}
