//! `.npy` arrays: row i is record i. The file is memory-mapped and viewed
//! in place (ndarray-npy reads the header); each record is one contiguous
//! row, copied straight into the batch.

use std::path::Path;

use memmap2::Mmap;
use ndarray::ArrayViewD;
use ndarray_npy::{ViewNpyError, ViewNpyExt};

use super::{check_exists, fingerprint, Dtype, Field, Source};
use crate::error::DataError;

pub struct NpySource {
    mmap: Mmap,
    offset: usize,
    row_bytes: usize,
    records: u64,
    fields: Vec<Field>,
    fingerprint: String,
}

/// The data's element type, offset in the file and shape, and whether it is
/// stored in C order.
type Layout = (Dtype, usize, Vec<usize>, bool);

fn layout_as<T: ndarray_npy::ViewElement>(
    bytes: &[u8],
    dtype: Dtype,
) -> Result<Layout, ViewNpyError> {
    let view = ArrayViewD::<T>::view_npy(bytes)?;
    let offset = view.as_ptr() as usize - bytes.as_ptr() as usize;
    Ok((
        dtype,
        offset,
        view.shape().to_vec(),
        view.is_standard_layout(),
    ))
}

/// The element types [`layout`] tries, as numpy names them.
const BATCHABLE: &str =
    "uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32, float64, bool";

fn layout(bytes: &[u8]) -> Result<Layout, ViewNpyError> {
    // The header names one element type; every other type's attempt fails
    // with WrongDescriptor before touching the data.
    type Attempt = fn(&[u8]) -> Result<Layout, ViewNpyError>;
    let attempts: [Attempt; 11] = [
        |b| layout_as::<u8>(b, Dtype::U8),
        |b| layout_as::<i8>(b, Dtype::I8),
        |b| layout_as::<u16>(b, Dtype::U16),
        |b| layout_as::<i16>(b, Dtype::I16),
        |b| layout_as::<u32>(b, Dtype::U32),
        |b| layout_as::<i32>(b, Dtype::I32),
        |b| layout_as::<u64>(b, Dtype::U64),
        |b| layout_as::<i64>(b, Dtype::I64),
        |b| layout_as::<f32>(b, Dtype::F32),
        |b| layout_as::<f64>(b, Dtype::F64),
        |b| layout_as::<bool>(b, Dtype::Bool),
    ];
    let mut last = None;
    for attempt in attempts {
        match attempt(bytes) {
            Ok(found) => return Ok(found),
            Err(e @ ViewNpyError::WrongDescriptor(_)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one type was tried"))
}

impl NpySource {
    pub fn open(path: &Path) -> Result<Self, DataError> {
        check_exists(path)?;
        let file = std::fs::File::open(path).map_err(DataError::io("cannot open", path))?;
        // SAFETY: read-only mapping of a file meshrun does not write.
        #[allow(unsafe_code)]
        let mmap = unsafe { Mmap::map(&file) }.map_err(DataError::io("cannot map", path))?;
        let bad = |message: String| DataError::Npy {
            path: path.to_path_buf(),
            message,
        };
        let (dtype, offset, shape, c_order) = layout(&mmap).map_err(|e| match e {
            ViewNpyError::WrongDescriptor(descr) => bad(format!(
                "its dtype {descr} cannot be batched; save it as one of: {BATCHABLE}"
            )),
            other => bad(other.to_string()),
        })?;
        if !c_order {
            return Err(bad(
                "it is stored in Fortran order; save it with np.ascontiguousarray".into(),
            ));
        }
        let Some((&records, row_shape)) = shape.split_first() else {
            return Err(bad(
                "it is a 0-d array; records are rows, so it needs at least one dimension".into(),
            ));
        };
        if records == 0 {
            return Err(DataError::Empty(path.display().to_string()));
        }
        let field = Field {
            name: "x".into(),
            dtype,
            shape: row_shape.to_vec(),
        };
        let description = format!("npy:{}:{shape:?}", dtype.numpy_name());
        Ok(Self {
            fingerprint: fingerprint(&description, &[path])?,
            row_bytes: field.record_bytes(),
            records: records as u64,
            fields: vec![field],
            mmap,
            offset,
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

    fn read(&self, index: u64, out: &mut [&mut [u8]]) {
        let start = self.offset + index as usize * self.row_bytes;
        out[0].copy_from_slice(&self.mmap[start..start + self.row_bytes]);
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}
