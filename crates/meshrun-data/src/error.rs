//! Everything that can be wrong with a data set or a loader request. Each
//! message names the file (or value) and what was expected.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{what} '{path}': {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data file '{0}' does not exist")]
    Missing(String),
    #[error("no files match '{0}'")]
    NoMatch(String),
    #[error(
        "token file '{path}' is {size} bytes, not a multiple of {itemsize} (the size of {dtype}); \
         it is truncated or the dtype is wrong"
    )]
    Truncated {
        path: String,
        size: u64,
        itemsize: usize,
        dtype: String,
    },
    #[error("unsupported dtype '{0}'; use one of: {1}")]
    BadDtype(String, &'static str),
    #[error(
        "'{path}' holds {have} tokens, fewer than one window of seq_len + 1 = {need}; \
         lower seq_len or use more data"
    )]
    TooShort { path: String, have: u64, need: u64 },
    #[error("seq_len must be at least 1, got {0}")]
    BadSeqLen(u64),
    #[error(
        "Parquet file '{path}' cannot be read: {message}; it is damaged or not a Parquet file"
    )]
    Parquet { path: String, message: String },
    #[error("Parquet file '{path}' has no column '{column}'; its columns are: {available}")]
    MissingColumn {
        path: String,
        column: String,
        available: String,
    },
    #[error("column '{column}' of '{path}' has type {found}, which meshrun cannot batch; {hint}")]
    BadColumnType {
        path: String,
        column: String,
        found: String,
        hint: &'static str,
    },
    #[error("'{path}' is not a usable .npy array: {message}")]
    Npy { path: String, message: String },
    #[error("the data set is empty ({0})")]
    Empty(String),
    #[error(
        "global batch size {batch} is not divisible by the {processes} processes; \
         use a multiple of {processes}"
    )]
    BatchNotDivisible { batch: u64, processes: u64 },
    #[error("{0} must be at least 1, got {1}")]
    NotPositive(&'static str, u64),
    #[error("rank {rank} is outside 0..{processes}")]
    BadRank { rank: u64, processes: u64 },
    #[error(
        "the saved loader state is for another data set (fingerprint {saved}, this data set is {current}); \
         resume with the same files, seq_len and columns, or start without a state"
    )]
    Fingerprint { saved: String, current: String },
    #[error(
        "global batch size {batch} is larger than the data set ({records} records) with drop_last; \
         lower the batch size or set drop_last=False"
    )]
    BatchLargerThanData { batch: u64, records: u64 },
    #[error(transparent)]
    Store(#[from] meshrun_store::StoreError),
    #[error(
        "a data cache of {capacity} bytes is too small: it must hold at least {need} bytes \
         (8 blocks); give a larger cache_bytes"
    )]
    CacheTooSmall { capacity: u64, need: u64 },
    #[error(
        "'{0}' changed while it was being read (it is shorter than when it was opened); \
         do not replace data files under a running job"
    )]
    Changed(String),
    #[error(
        "Parquet row group {group} of '{path}' holds {bytes} bytes of the chosen columns, \
         more than max_memory={budget}; raise max_memory or write smaller row groups"
    )]
    RowGroupTooLarge {
        path: String,
        group: usize,
        bytes: u64,
        budget: u64,
    },
}

impl DataError {
    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| DataError::Io { what, path, source }
    }
}
