//! The run's report page: one self-contained `report.html` in the run
//! directory, built from `run.json`, `events.jsonl`, `metrics.jsonl` and
//! `goodput.json`.

use std::path::{Path, PathBuf};

use crate::error::CoreError;

/// The file name of the report in a run directory.
pub const REPORT_FILE: &str = "report.html";

/// Writes `run_dir/report.html` and returns its path.
pub fn write(run_dir: &Path) -> Result<PathBuf, CoreError> {
    let path = run_dir.join(REPORT_FILE);
    std::fs::write(&path, "<!doctype html><title>meshrun report</title>")
        .map_err(CoreError::io("cannot write", &path))?;
    Ok(path)
}
