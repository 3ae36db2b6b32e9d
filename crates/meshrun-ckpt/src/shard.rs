//! Writing one rank's shards as a safetensors file, with CRCs.
//!
//! Tensors are named `<leaf>:<n>`; the file's metadata carries, for every
//! tensor, the CRC-32C of each 1 MiB chunk of its bytes (`crc:<name>`, hex,
//! comma-separated), so a reader can check exactly the chunks it reads.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::error::CkptError;
use crate::manifest::ShardRecord;

/// Bytes covered by one CRC.
pub const CHUNK: usize = 1 << 20;

pub const DTYPES: &str = "bool, uint8, int8, uint16, int16, float16, bfloat16, uint32, int32, float32, uint64, int64, float64";

pub fn dtype(numpy_name: &str) -> Result<Dtype, CkptError> {
    Ok(match numpy_name {
        "bool" => Dtype::BOOL,
        "uint8" => Dtype::U8,
        "int8" => Dtype::I8,
        "uint16" => Dtype::U16,
        "int16" => Dtype::I16,
        "float16" => Dtype::F16,
        "bfloat16" => Dtype::BF16,
        "uint32" => Dtype::U32,
        "int32" => Dtype::I32,
        "float32" => Dtype::F32,
        "uint64" => Dtype::U64,
        "int64" => Dtype::I64,
        "float64" => Dtype::F64,
        other => return Err(CkptError::Dtype(other.to_string(), DTYPES)),
    })
}

/// One shard handed over by the Python layer: its bytes stay owned there.
pub struct ShardIn<'a> {
    pub leaf: String,
    pub dtype: String,
    pub region: Vec<(usize, usize)>,
    pub data: &'a [u8],
}

pub fn chunk_crcs(data: &[u8]) -> Vec<u32> {
    if data.is_empty() {
        return vec![crc32c::crc32c(data)];
    }
    data.chunks(CHUNK).map(crc32c::crc32c).collect()
}

/// Writes `rank-<rank>.safetensors` into `dir`, syncs it to disk, and
/// returns the manifest records of its shards (leaf path first).
/// A rank that owns no shard (all it holds are replicas) writes no file.
pub fn write_rank_file(
    dir: &Path,
    rank: u32,
    shards: &[ShardIn<'_>],
) -> Result<Vec<(String, ShardRecord)>, CkptError> {
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    let file_name = format!("rank-{rank}.safetensors");
    let path = dir.join(&file_name);
    let mut views = Vec::with_capacity(shards.len());
    let mut metadata = HashMap::new();
    let mut records = Vec::with_capacity(shards.len());
    let mut count: HashMap<&str, usize> = HashMap::new();
    for s in shards {
        let n = count.entry(s.leaf.as_str()).or_default();
        let name = format!("{}:{n}", s.leaf);
        *n += 1;
        let shape: Vec<usize> = s.region.iter().map(|(a, b)| b - a).collect();
        let view =
            TensorView::new(dtype(&s.dtype)?, shape, s.data).map_err(|e| CkptError::Format {
                path: path.clone(),
                message: format!("leaf '{}': {e}", s.leaf),
            })?;
        let crcs: Vec<String> = chunk_crcs(s.data)
            .iter()
            .map(|c| format!("{c:08x}"))
            .collect();
        metadata.insert(format!("crc:{name}"), crcs.join(","));
        records.push((
            s.leaf.clone(),
            ShardRecord {
                file: file_name.clone(),
                tensor: name.clone(),
                region: s.region.clone(),
            },
        ));
        views.push((name, view));
    }
    safetensors::serialize_to_file(views, Some(metadata), &path).map_err(|e| {
        CkptError::Format {
            path: path.clone(),
            message: e.to_string(),
        }
    })?;
    File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(CkptError::io("cannot sync", &path))?;
    Ok(records)
}
