//! What can go wrong while making a report.

use std::path::PathBuf;

use meshrun_record::read::ReadError;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file of the run directory that cannot be read; `run.json` must
    /// also parse (the JSONL files only skip their broken lines).
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
