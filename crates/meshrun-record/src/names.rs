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
