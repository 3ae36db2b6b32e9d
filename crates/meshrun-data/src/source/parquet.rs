//! Parquet files (one, a list, or a glob), read with the `parquet` crate.
//!
//! The chosen columns are decoded once, at open, into contiguous buffers
//! (files in the order given, row groups in file order); records are then
//! read by index without touching Parquet again. Columns:
//! - a primitive column: one value per record;
//! - a fixed-size list of a primitive: a vector per record;
//! - with `seq_len`: exactly one column, a list of integers (token ids),
//!   packed: the lists of every row are concatenated into one token stream
//!   and cut into windows of `seq_len + 1` tokens starting every `seq_len`
//!   tokens, exactly as a token file is; the tail shorter than a window is
//!   dropped, and row boundaries are not marked (append an end-of-document
//!   token to each row when writing the data if the model needs one).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use super::{check_exists, fingerprint, Dtype, Field, Source};
use crate::error::DataError;

pub struct ParquetSource {
    fields: Vec<Field>,
    columns: Vec<Vec<u8>>,
    records: u64,
    /// With packing: the window length in tokens (`seq_len`).
    window: Option<u64>,
    fingerprint: String,
}

const PRIMITIVE_HINT: &str = "use integer or float columns, fixed-size lists of them, or a list of integers with seq_len to pack tokens";

fn dtype_of(path: &Path, column: &str, dt: &DataType) -> Result<Dtype, DataError> {
    Ok(match dt {
        DataType::UInt8 => Dtype::U8,
        DataType::UInt16 => Dtype::U16,
        DataType::UInt32 => Dtype::U32,
        DataType::UInt64 => Dtype::U64,
        DataType::Int8 => Dtype::I8,
        DataType::Int16 => Dtype::I16,
        DataType::Int32 => Dtype::I32,
        DataType::Int64 => Dtype::I64,
        DataType::Float32 => Dtype::F32,
        DataType::Float64 => Dtype::F64,
        other => {
            return Err(DataError::BadColumnType {
                path: path.to_path_buf(),
                column: column.into(),
                found: other.to_string(),
                hint: PRIMITIVE_HINT,
            })
        }
    })
}

/// Appends the raw little-endian values of a primitive array.
fn append_values(out: &mut Vec<u8>, array: &ArrayRef, dtype: Dtype) {
    macro_rules! bytes {
        ($t:ty) => {{
            let values = array.as_primitive::<$t>().values();
            let raw = values.inner().as_slice();
            out.extend_from_slice(raw);
        }};
    }
    match dtype {
        Dtype::U8 => bytes!(UInt8Type),
        Dtype::U16 => bytes!(UInt16Type),
        Dtype::U32 => bytes!(UInt32Type),
        Dtype::U64 => bytes!(UInt64Type),
        Dtype::I8 => bytes!(Int8Type),
        Dtype::I16 => bytes!(Int16Type),
        Dtype::I32 => bytes!(Int32Type),
        Dtype::I64 => bytes!(Int64Type),
        Dtype::F32 => bytes!(Float32Type),
        Dtype::F64 => bytes!(Float64Type),
        Dtype::Bool => unreachable!("booleans are not read from Parquet"),
    }
}

/// How one chosen column becomes record data.
#[derive(Clone, PartialEq)]
enum Kind {
    Scalar(Dtype),
    Vector(Dtype, usize),
    Tokens(Dtype),
}

fn kind_of(path: &Path, column: &str, dt: &DataType, packing: bool) -> Result<Kind, DataError> {
    let bad = |hint| DataError::BadColumnType {
        path: path.to_path_buf(),
        column: column.into(),
        found: dt.to_string(),
        hint,
    };
    match dt {
        DataType::List(f) | DataType::LargeList(f) if packing => {
            let d = dtype_of(path, column, f.data_type())?;
            if matches!(d, Dtype::F32 | Dtype::F64) {
                return Err(bad("token lists must hold integers"));
            }
            Ok(Kind::Tokens(d))
        }
        _ if packing => Err(bad(
            "with seq_len, the one column must be a list of integer token ids",
        )),
        DataType::FixedSizeList(f, k) => Ok(Kind::Vector(
            dtype_of(path, column, f.data_type())?,
            *k as usize,
        )),
        DataType::List(_) | DataType::LargeList(_) => Err(bad(
            "variable-length lists can only be packed into token windows: pass seq_len",
        )),
        other => Ok(Kind::Scalar(dtype_of(path, column, other)?)),
    }
}

fn parquet_error(path: &Path, e: impl std::fmt::Display) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Expands globs; plain paths must exist.
pub fn expand(patterns: &[String]) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    for p in patterns {
        if p.contains(['*', '?', '[']) {
            let mut matched: Vec<PathBuf> = glob::glob(p)
                .map_err(|e| DataError::NoMatch(format!("{p} ({e})")))?
                .filter_map(Result::ok)
                .collect();
            if matched.is_empty() {
                return Err(DataError::NoMatch(p.clone()));
            }
            matched.sort();
            out.extend(matched);
        } else {
            let path = PathBuf::from(p);
            check_exists(&path)?;
            out.push(path);
        }
    }
    if out.is_empty() {
        return Err(DataError::Empty("no Parquet files given".into()));
    }
    Ok(out)
}

impl ParquetSource {
    pub fn open(
        patterns: &[String],
        columns: &[String],
        seq_len: Option<u64>,
    ) -> Result<Self, DataError> {
        let files = expand(patterns)?;
        if columns.is_empty() {
            return Err(DataError::Empty("no columns chosen".into()));
        }
        if let Some(0) = seq_len {
            return Err(DataError::BadSeqLen(0));
        }
        let packing = seq_len.is_some();
        if packing && columns.len() != 1 {
            return Err(DataError::BadColumnType {
                path: files[0].clone(),
                column: columns.join(", "),
                found: format!("{} columns", columns.len()),
                hint: "packing with seq_len takes exactly one token-list column",
            });
        }
        let mut kinds: Option<Vec<Kind>> = None;
        let mut buffers: Vec<Vec<u8>> = vec![Vec::new(); columns.len()];
        let mut rows: u64 = 0;
        for path in &files {
            let file = std::fs::File::open(path).map_err(DataError::io("cannot open", path))?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| parquet_error(path, e))?;
            let schema = Arc::clone(builder.schema());
            let mut indices = Vec::new();
            let mut file_kinds = Vec::new();
            for column in columns {
                let Ok(i) = schema.index_of(column) else {
                    let available: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    return Err(DataError::MissingColumn {
                        path: path.clone(),
                        column: column.clone(),
                        available: available.join(", "),
                    });
                };
                indices.push(i);
                file_kinds.push(kind_of(path, column, schema.field(i).data_type(), packing)?);
            }
            match &kinds {
                None => kinds = Some(file_kinds.clone()),
                Some(k) if *k != file_kinds => {
                    return Err(parquet_error(
                        path,
                        "its columns' types differ from the first file's",
                    ))
                }
                Some(_) => {}
            }
            let mask = ProjectionMask::roots(builder.parquet_schema(), indices.iter().copied());
            let reader = builder
                .with_projection(mask)
                .build()
                .map_err(|e| parquet_error(path, e))?;
            for batch in reader {
                let batch = batch.map_err(|e| parquet_error(path, e))?;
                for (c, kind) in file_kinds.iter().enumerate() {
                    let array = batch.column(c);
                    if array.null_count() > 0 {
                        return Err(parquet_error(
                            path,
                            format!("column '{}' has null values", columns[c]),
                        ));
                    }
                    match kind {
                        Kind::Scalar(d) => append_values(&mut buffers[c], array, *d),
                        Kind::Vector(d, _) => {
                            let list = array.as_fixed_size_list();
                            let values = list.values().slice(
                                list.offset() * list.value_length() as usize,
                                list.len() * list.value_length() as usize,
                            );
                            append_values(&mut buffers[c], &values, *d);
                        }
                        Kind::Tokens(d) => {
                            let values = if let DataType::List(_) = array.data_type() {
                                let l = array.as_list::<i32>();
                                let (a, b) = (
                                    l.value_offsets()[0] as usize,
                                    l.value_offsets()[l.len()] as usize,
                                );
                                l.values().slice(a, b - a)
                            } else {
                                let l = array.as_list::<i64>();
                                let (a, b) = (
                                    l.value_offsets()[0] as usize,
                                    l.value_offsets()[l.len()] as usize,
                                );
                                l.values().slice(a, b - a)
                            };
                            append_values(&mut buffers[c], &values, *d);
                        }
                    }
                }
                rows += batch.num_rows() as u64;
            }
        }
        let kinds = kinds.expect("at least one file");
        let description = format!("parquet:{columns:?}:{seq_len:?}");
        let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        let fingerprint = fingerprint(&description, &paths)?;
        let (fields, records, window) =
            if let (Kind::Tokens(d), Some(seq_len)) = (&kinds[0], seq_len) {
                let tokens = (buffers[0].len() / d.itemsize()) as u64;
                if tokens < seq_len + 1 {
                    return Err(DataError::TooShort {
                        path: patterns.join(", "),
                        have: tokens,
                        need: seq_len + 1,
                    });
                }
                let field = Field {
                    name: columns[0].clone(),
                    dtype: *d,
                    shape: vec![seq_len as usize + 1],
                };
                (vec![field], (tokens - 1) / seq_len, Some(seq_len))
            } else {
                let fields = kinds
                    .iter()
                    .zip(columns)
                    .map(|(k, name)| match k {
                        Kind::Scalar(d) => Field {
                            name: name.clone(),
                            dtype: *d,
                            shape: vec![],
                        },
                        Kind::Vector(d, n) => Field {
                            name: name.clone(),
                            dtype: *d,
                            shape: vec![*n],
                        },
                        Kind::Tokens(_) => unreachable!("tokens only with seq_len"),
                    })
                    .collect();
                (fields, rows, None)
            };
        if records == 0 {
            return Err(DataError::Empty(patterns.join(", ")));
        }
        Ok(Self {
            fields,
            columns: buffers,
            records,
            window,
            fingerprint,
        })
    }
}

impl Source for ParquetSource {
    fn records(&self) -> u64 {
        self.records
    }

    fn fields(&self) -> &[Field] {
        &self.fields
    }

    fn read(&self, index: u64, out: &mut [&mut [u8]]) {
        match self.window {
            Some(seq_len) => {
                let size = self.fields[0].dtype.itemsize();
                let start = (index * seq_len) as usize * size;
                let len = (seq_len as usize + 1) * size;
                out[0].copy_from_slice(&self.columns[0][start..start + len]);
            }
            None => {
                for ((field, column), dst) in
                    self.fields.iter().zip(&self.columns).zip(out.iter_mut())
                {
                    let n = field.record_bytes();
                    let start = index as usize * n;
                    dst.copy_from_slice(&column[start..start + n]);
                }
            }
        }
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}
