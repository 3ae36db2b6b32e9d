//! Sources: data sets of fixed-size records, read by index.

mod npy;
mod parquet;
mod tokens;

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::DataError;

pub use self::npy::NpySource;
pub use self::parquet::ParquetSource;
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
    fn read(&self, index: u64, out: &mut [&mut [u8]]);
    /// Identifies the data set's content and layout, for resuming safely.
    fn fingerprint(&self) -> &str;
}

/// Content-based fingerprint: the description, every file's size, and
/// hashes of its first and last MiB (cheap on terabytes, and it changes
/// when a file is replaced, appended to or cut).
pub(crate) fn fingerprint(description: &str, files: &[&Path]) -> Result<String, DataError> {
    use std::io::{Read, Seek, SeekFrom};
    const EDGE: u64 = 1 << 20;
    let mut h = Sha256::new();
    h.update(description.as_bytes());
    for path in files {
        let mut f = std::fs::File::open(path).map_err(DataError::io("cannot open", *path))?;
        let size = f
            .metadata()
            .map_err(DataError::io("cannot stat", *path))?
            .len();
        h.update(size.to_le_bytes());
        let mut buf = Vec::with_capacity(EDGE as usize);
        f.by_ref()
            .take(EDGE)
            .read_to_end(&mut buf)
            .map_err(DataError::io("cannot read", *path))?;
        if size > EDGE {
            f.seek(SeekFrom::Start(size - EDGE))
                .map_err(DataError::io("cannot read", *path))?;
            f.take(EDGE)
                .read_to_end(&mut buf)
                .map_err(DataError::io("cannot read", *path))?;
        }
        h.update(&buf);
    }
    Ok(hex::encode(&h.finalize()[..8]))
}

pub(crate) fn check_exists(path: &Path) -> Result<(), DataError> {
    if path.exists() {
        Ok(())
    } else {
        Err(DataError::Missing(path.to_path_buf()))
    }
}
