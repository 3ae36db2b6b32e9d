//! What a run directory holds, as types: the controller writes these, and
//! the CLI, the report and the Python package read them back through the
//! same definitions, so a renamed field is a compile error rather than a
//! value that silently reads as missing.
//!
//! This crate sits at the bottom of the stack (it depends on no other
//! meshrun crate); the layout is in the architecture note.
//! - [`names`]: every file and folder name of a run directory;
//! - [`run`]: `run.json`, the run and its attempts, and their states;
//! - [`failure`]: why a rank failed, as recorded and as worded;
//! - [`event`]: the lines of `events.jsonl`;
//! - [`metrics`]: the lines of `metrics.jsonl`;
//! - [`goodput`]: `goodput.json`, where the wall time went;
//! - [`manifest`]: a checkpoint's `manifest.json`;
//! - [`memory`]: a rank's memory, its limit, and what its state needs;
//! - [`lag`]: `lag.jsonl`, when each rank reached each step (stragglers);
//! - [`program`]: the programs a rank runs across every process (its
//!   flight recorder), compared between ranks;
//! - [`saves`]: the checkpoint saves that failed, counted from the events;
//! - [`read`]: tolerant readers for files that may be half-written (the
//!   feature `read`, on by default: the crate is otherwise free of I/O).

pub mod event;
pub mod failure;
pub mod goodput;
pub mod lag;
pub mod manifest;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod program;
#[cfg(feature = "read")]
pub mod read;
pub mod run;
pub mod saves;

pub use event::{Event, EventLine};
pub use failure::{Cause, ExitInfo, FailureRecord};
pub use goodput::{Goodput, Part, Timing};
pub use lag::LagRecord;
pub use metrics::{loss_key, MetricsRecord};
pub use run::{AttemptRecord, RunRecord, RunState};
pub use saves::FailedSaves;

/// Seconds since the Unix epoch, as events and metrics record time.
pub fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// `2026-12-02T13:46:30Z`, seconds precision, as `run.json` records times.
pub fn utc_rfc3339(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Unix seconds of an RFC 3339 time of `run.json`.
pub fn parse_time(text: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(text).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64())
}

/// `20261202-134630`, for default run names.
pub fn utc_compact(unix_secs: u64) -> String {
    let text = utc_rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs));
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    format!("{}-{}", &digits[..8], &digits[8..14])
}
