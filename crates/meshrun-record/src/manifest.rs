//! `manifest.json`: the commit record of a checkpoint. It lists every leaf
//! of the saved tree with its global shape and dtype, and every stored shard
//! with the file, tensor and region it holds.
//!
//! The types only: the messages of the control protocol carry them, so
//! they sit here, below every crate that does I/O; reading and writing a
//! manifest is meshrun-ckpt's.

use serde::{Deserialize, Serialize};

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT_VERSION: u32 = 1;

/// One stored shard: where it is and which region of its leaf it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub file: String,
    pub tensor: String,
    pub region: Vec<(usize, usize)>,
    /// Set on a copy of a per-process leaf (an array each process holds on
    /// its own devices, a numpy array, a number): the rank that saved it,
    /// and so the rank that gets it back. Each rank's copies cover the
    /// whole leaf; a global array's shards have none and together cover it
    /// once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// One leaf of the saved tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaf {
    pub path: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub shards: Vec<ShardRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub step: u64,
    pub leaves: Vec<Leaf>,
    /// A directory checkpoint's files (meshrun-ckpt's `directory` module); then
    /// `leaves` is empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileRecord>,
    /// Everything else the run saves with the step (tree structure,
    /// metrics, loader state, RNG), as the Python layer gives it.
    pub extra: serde_json::Value,
    /// The attempt whose workers saved it: a worker tells the checkpoints
    /// its own attempt committed from older ones that the controller
    /// skipped (meshrun-ckpt's `resume` module). Absent in manifests written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// One file of a directory checkpoint: its path inside the step's folder
/// (`rank-1/...` for rank 1's), size and checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub path: String,
    pub size: u64,
    pub crc32c: u32,
}

impl Leaf {
    /// Whether each process saved a copy of its own.
    pub fn per_process(&self) -> bool {
        self.shards.iter().any(|s| s.rank.is_some())
    }

    /// The ranks that saved a copy of a per-process leaf, in order.
    pub fn copy_ranks(&self) -> Vec<u32> {
        let mut ranks: Vec<u32> = self.shards.iter().filter_map(|s| s.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }
}

impl Manifest {
    /// Whether it records folders the ranks handed over, not shards.
    pub fn is_directory(&self) -> bool {
        !self.files.is_empty()
    }

    /// The leaf saved under `path`, if there is one.
    pub fn leaf(&self, path: &str) -> Option<&Leaf> {
        self.leaves.iter().find(|l| l.path == path)
    }
}
