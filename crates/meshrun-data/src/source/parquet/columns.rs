//! How Parquet columns become record bytes: which Arrow types a column may
//! have, and the raw little-endian values of a decoded array.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

use crate::error::DataError;
use crate::source::Dtype;

const PRIMITIVE_HINT: &str = "use integer or float columns, fixed-size lists of them, or a list of integers with seq_len to pack tokens";

fn dtype_of(path: &str, column: &str, dt: &DataType) -> Result<Dtype, DataError> {
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
                path: path.to_string(),
                column: column.into(),
                found: other.to_string(),
                hint: PRIMITIVE_HINT,
            })
        }
    })
}

/// Appends the raw little-endian values of a primitive array.
pub(super) fn append_values(out: &mut Vec<u8>, array: &ArrayRef, dtype: Dtype) {
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
pub(super) enum Kind {
    Scalar(Dtype),
    Vector(Dtype, usize),
    Tokens(Dtype),
}

pub(super) fn kind_of(
    path: &str,
    column: &str,
    dt: &DataType,
    packing: bool,
) -> Result<Kind, DataError> {
    let bad = |hint| DataError::BadColumnType {
        path: path.to_string(),
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

/// Appends the values of column `array` (of kind `kind`) to `out`: one
/// value per row, a vector per row, or every token of every row's list.
pub(super) fn append_column(out: &mut Vec<u8>, array: &ArrayRef, kind: &Kind) {
    match kind {
        Kind::Scalar(d) => append_values(out, array, *d),
        Kind::Vector(d, _) => {
            let list = array.as_fixed_size_list();
            let values = list.values().slice(
                list.offset() * list.value_length() as usize,
                list.len() * list.value_length() as usize,
            );
            append_values(out, &values, *d);
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
            append_values(out, &values, *d);
        }
    }
}

/// Whether `array` has nulls (which records cannot hold).
pub(super) fn has_nulls(array: &ArrayRef) -> bool {
    array.null_count() > 0
}
