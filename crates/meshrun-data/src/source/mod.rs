//! Sources: data sets of fixed-size records, read by index.

mod npy;
mod parquet;
mod tokens;

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::blob::Blob;
use crate::error::DataError;

pub use self::npy::NpySource;
pub use self::parquet::{ParquetOptions, ParquetSource, DEFAULT_MAX_MEMORY};
pub use self::tokens::TokenFile;

/// Element types a batch can hold, named as numpy names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F32,
    F64,
    Bool,
}

impl Dtype {
    pub const TOKEN_CHOICES: &'static str = "uint8, uint16, uint32";

    pub fn itemsize(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 | Dtype::Bool => 1,
            Dtype::U16 | Dtype::I16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    pub fn numpy_name(self) -> &'static str {
        match self {
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::Bool => "bool",
        }
    }
}

/// One array of a record: its name, element type and per-record shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl Field {
    pub fn record_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.itemsize()
    }
}

/// A data set of `records()` records, each made of `fields()`.
pub trait Source: Send + Sync {
    fn records(&self) -> u64;
    fn fields(&self) -> &[Field];
    /// Copies record `index` into one buffer per field, each exactly
    /// `field.record_bytes()` long.
    fn read(&self, index: u64, out: &mut [&mut [u8]]) -> Result<(), DataError>;
    /// Gets ready to read `records` soon: fetches what remote files hold
    /// of them, all at once. Local sources have nothing to do.
    fn prefetch(&self, _records: &[u64]) -> Result<(), DataError> {
        Ok(())
    }
    /// Reads the records of one batch: `(row, record)` pairs, into one
    /// buffer per field holding every row. By default: [`Source::prefetch`]
    /// them, then [`Source::read`] each.
    fn read_rows(&self, rows: &[(usize, u64)], out: &mut [Vec<u8>]) -> Result<(), DataError> {
        let records: Vec<u64> = rows.iter().map(|&(_, r)| r).collect();
        self.prefetch(&records)?;
        read_each(self, rows, out)
    }
    /// Identifies the data set's content and layout, for resuming safely.
    fn fingerprint(&self) -> &str;
    /// Bytes fetched from object storage so far (0 for local files).
    fn fetched(&self) -> u64 {
        0
    }
}

/// Reads `rows` one record at a time into their rows of `out`.
pub fn read_each<S: Source + ?Sized>(
    source: &S,
    rows: &[(usize, u64)],
    out: &mut [Vec<u8>],
) -> Result<(), DataError> {
    let sizes: Vec<usize> = source.fields().iter().map(Field::record_bytes).collect();
    for &(row, record) in rows {
        let mut slots: Vec<&mut [u8]> = out
            .iter_mut()
            .zip(&sizes)
            .map(|(buf, &size)| &mut buf[row * size..(row + 1) * size])
            .collect();
        source.read(record, &mut slots)?;
    }
    Ok(())
}

/// Content-based fingerprint: the description, every file's size, and
/// hashes of its first and last MiB (cheap on terabytes, and it changes
/// when a file is replaced, appended to or cut). The same files give the
/// same fingerprint locally and in object storage.
pub(crate) fn fingerprint(description: &str, files: &[&Blob]) -> Result<String, DataError> {
    const EDGE: u64 = 1 << 20;
    let mut h = Sha256::new();
    h.update(description.as_bytes());
    for blob in files {
        let size = blob.len();
        h.update(size.to_le_bytes());
        let head = size.min(EDGE);
        let mut ranges = vec![std::ops::Range {
            start: 0,
            end: head,
        }];
        if size > EDGE {
            ranges.push(size - EDGE..size);
        }
        blob.fetch(&ranges)?;
        for range in ranges {
            let mut buf = vec![0u8; (range.end - range.start) as usize];
            blob.read_at(range.start, &mut buf)?;
            h.update(&buf);
        }
    }
    Ok(hex::encode(&h.finalize()[..8]))
}

pub(crate) fn check_exists(path: &Path) -> Result<(), DataError> {
    if path.exists() {
        Ok(())
    } else {
        Err(DataError::Missing(path.display().to_string()))
    }
}
