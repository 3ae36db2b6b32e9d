//! Writing one rank's shards as a safetensors file, with CRCs.
//!
//! Tensors are named `<leaf>:<n>`; the file's metadata carries, for every
//! tensor, the CRC-32C of each 1 MiB chunk of its bytes (`crc:<name>`, hex,
//! comma-separated), so a reader can check exactly the chunks it reads.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use bytes::Bytes;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;

use crate::commit::tmp_dir;
use crate::error::CkptError;
use crate::manifest::ShardRecord;
use crate::store::{upload_file, Location};

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

/// One shard handed over by the Python layer: its bytes stay owned there
/// (`Bytes` keeps the buffer alive without copying it).
pub struct ShardIn {
    pub leaf: String,
    pub dtype: String,
    pub region: Vec<(usize, usize)>,
    pub data: Bytes,
    /// This process's own copy of a per-process leaf (see
    /// [`ShardRecord::rank`]), not a shard of a global array.
    pub per_process: bool,
}

pub fn chunk_crcs(data: &[u8]) -> Vec<u32> {
    if data.is_empty() {
        return vec![crc32c::crc32c(data)];
    }
    data.chunks(CHUNK).map(crc32c::crc32c).collect()
}

/// The file name of rank `rank`'s shards in a checkpoint folder.
pub fn rank_file(rank: u32) -> String {
    format!("rank-{rank}.safetensors")
}

/// A rank's file laid out: the safetensors header (with its length in
/// front) made by the safetensors crate's own types, then each shard's
/// bytes in the order given, and the manifest records of the shards.
struct Layout {
    header: Vec<u8>,
    records: Vec<(String, ShardRecord)>,
}

fn layout(file_name: &str, rank: u32, shards: &[ShardIn]) -> Result<Layout, CkptError> {
    let bad = |message: String| CkptError::Format {
        path: file_name.into(),
        message,
    };
    let mut infos = Vec::with_capacity(shards.len());
    let mut metadata = HashMap::new();
    let mut records = Vec::with_capacity(shards.len());
    let mut count: HashMap<&str, usize> = HashMap::new();
    let mut offset = 0;
    for s in shards {
        let n = count.entry(s.leaf.as_str()).or_default();
        let name = format!("{}:{n}", s.leaf);
        *n += 1;
        let shape: Vec<usize> = s.region.iter().map(|(a, b)| b - a).collect();
        let crcs: Vec<String> = chunk_crcs(&s.data)
            .iter()
            .map(|c| format!("{c:08x}"))
            .collect();
        metadata.insert(format!("crc:{name}"), crcs.join(","));
        infos.push((
            name.clone(),
            TensorInfo {
                dtype: dtype(&s.dtype)?,
                shape,
                data_offsets: (offset, offset + s.data.len()),
            },
        ));
        offset += s.data.len();
        records.push((
            s.leaf.clone(),
            ShardRecord {
                file: file_name.to_string(),
                tensor: name,
                region: s.region.clone(),
                rank: s.per_process.then_some(rank),
            },
        ));
    }
    // Validates every shape against its byte count.
    let meta = Metadata::new(Some(metadata), infos).map_err(|e| bad(e.to_string()))?;
    let mut json = serde_json::to_vec(&meta).map_err(|e| bad(e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut header = (json.len() as u64).to_le_bytes().to_vec();
    header.extend_from_slice(&json);
    Ok(Layout { header, records })
}

/// Writes `rank-<rank>.safetensors` of checkpoint `step` under the
/// checkpoints folder `root` and returns the manifest records of its shards
/// (leaf path first). Locally into `tmp-<step>/`, synced to disk; in an
/// object store into `step-<step>/` (see [`crate::store`]). A rank that
/// owns no shard (all it holds are replicas) writes no file.
pub fn write_rank(
    root: &Location,
    step: u64,
    rank: u32,
    shards: &[ShardIn],
) -> Result<Vec<(String, ShardRecord)>, CkptError> {
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    match root {
        Location::Local(root) => {
            let dir = tmp_dir(root, step);
            std::fs::create_dir_all(&dir).map_err(CkptError::io("cannot create", &dir))?;
            write_rank_file(&dir, rank, shards)
        }
        Location::Remote(r) => {
            let name = rank_file(rank);
            let Layout { header, records } = layout(&name, rank, shards)?;
            let mut pieces = Vec::with_capacity(shards.len() + 1);
            pieces.push(Bytes::from(header));
            pieces.extend(shards.iter().map(|s| s.data.clone()));
            let key = r.object(&format!("step-{step}/{name}"));
            upload_file(&r.client, &key, &pieces)?;
            Ok(records)
        }
    }
}

/// Writes `rank-<rank>.safetensors` into the local folder `dir`, syncs it
/// to disk, and returns the manifest records of its shards.
pub fn write_rank_file(
    dir: &Path,
    rank: u32,
    shards: &[ShardIn],
) -> Result<Vec<(String, ShardRecord)>, CkptError> {
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    let name = rank_file(rank);
    let path = dir.join(&name);
    let Layout { header, records } = layout(&name, rank, shards)?;
    let write = || -> std::io::Result<()> {
        let file = File::create(&path)?;
        let mut w = BufWriter::with_capacity(1 << 20, &file);
        w.write_all(&header)?;
        for s in shards {
            w.write_all(&s.data)?;
        }
        w.flush()?;
        drop(w);
        file.sync_all()
    };
    write().map_err(CkptError::io("cannot write", &path))?;
    Ok(records)
}
