//! `.npy` arrays, local or in object storage: row i is record i. The
//! header is parsed by ndarray-npy; each record is one contiguous row of
//! the data after it, copied straight into the batch.

use std::sync::Arc;

use ndarray_npy::npy::header::Header;

use super::{fingerprint, Dtype, Field, Source};
use crate::blob::{Blob, CacheConfig, Cursor};
use crate::error::DataError;

pub struct NpySource {
    blob: Arc<Blob>,
    offset: u64,
    row_bytes: u64,
    records: u64,
    fields: Vec<Field>,
    fingerprint: String,
    /// Kept for the cache's report.
    cache: CacheConfig,
}

/// The element types a batch can hold, as numpy names them.
const BATCHABLE: &str =
    "uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32, float64, bool";

/// The element type a header's descriptor names (little-endian, or
/// single-byte), as the Python literal it is written as.
fn dtype_of(descriptor: &str) -> Option<Dtype> {
    Some(match descriptor {
        "'|u1'" | "'<u1'" => Dtype::U8,
        "'|i1'" | "'<i1'" => Dtype::I8,
        "'<u2'" => Dtype::U16,
        "'<i2'" => Dtype::I16,
        "'<u4'" => Dtype::U32,
        "'<i4'" => Dtype::I32,
        "'<u8'" => Dtype::U64,
        "'<i8'" => Dtype::I64,
        "'<f4'" => Dtype::F32,
        "'<f8'" => Dtype::F64,
        "'|b1'" => Dtype::Bool,
        _ => return None,
    })
}

impl NpySource {
    /// `path`: a local path or an object URL (`s3://bucket/x.npy`).
    pub fn open(path: &str, cache: CacheConfig) -> Result<Self, DataError> {
        let blob = Arc::new(Blob::open(path, &cache, 0)?);
        let bad = |message: String| DataError::Npy {
            path: path.to_string(),
            message,
        };
        let mut cursor = Cursor::new(Arc::clone(&blob), 0);
        let header = Header::from_reader(&mut cursor).map_err(|e| bad(e.to_string()))?;
        let offset = cursor.position();
        let descriptor = header.type_descriptor.to_string();
        let dtype = dtype_of(&descriptor).ok_or_else(|| {
            bad(format!(
                "its dtype {descriptor} cannot be batched; save it as one of: {BATCHABLE} (little-endian)"
            ))
        })?;
        if header.layout.is_fortran() {
            return Err(bad(
                "it is stored in Fortran order; save it with np.ascontiguousarray".into(),
            ));
        }
        let shape = header.shape;
        let Some((&records, row_shape)) = shape.split_first() else {
            return Err(bad(
                "it is a 0-d array; records are rows, so it needs at least one dimension".into(),
            ));
        };
        if records == 0 {
            return Err(DataError::Empty(path.to_string()));
        }
        let field = Field {
            name: "x".into(),
            dtype,
            shape: row_shape.to_vec(),
        };
        let row_bytes = field.record_bytes() as u64;
        let want = offset + records as u64 * row_bytes;
        if blob.len() != want {
            return Err(bad(format!(
                "its header says {want} bytes in all, the file has {}; it is truncated or damaged",
                blob.len()
            )));
        }
        let description = format!("npy:{}:{shape:?}", dtype.numpy_name());
        Ok(Self {
            fingerprint: fingerprint(&description, &[&blob])?,
            row_bytes,
            records: records as u64,
            fields: vec![field],
            blob,
            offset,
            cache,
        })
    }
}

impl Source for NpySource {
    fn records(&self) -> u64 {
        self.records
    }

    fn fields(&self) -> &[Field] {
        &self.fields
    }

    fn read(&self, index: u64, out: &mut [&mut [u8]]) -> Result<(), DataError> {
        self.blob
            .read_at(self.offset + index * self.row_bytes, out[0])
    }

    fn prefetch(&self, records: &[u64]) -> Result<(), DataError> {
        let ranges: Vec<_> = records
            .iter()
            .map(|&r| {
                let start = self.offset + r * self.row_bytes;
                start..start + self.row_bytes
            })
            .collect();
        self.blob.prefetch(&ranges)
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn fetched(&self) -> u64 {
        self.cache.fetched()
    }
}
