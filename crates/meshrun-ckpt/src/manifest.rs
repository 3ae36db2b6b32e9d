//! `manifest.json`: the commit record of a checkpoint. It lists every leaf
//! of the saved tree with its global shape and dtype, and every stored shard
//! with the file, tensor and region it holds.

use serde::{Deserialize, Serialize};

use crate::error::CkptError;
use crate::store::Location;

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT_VERSION: u32 = 1;

/// One stored shard: where it is and which region of its leaf it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub file: String,
    pub tensor: String,
    pub region: Vec<(usize, usize)>,
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
    /// A directory checkpoint's files (see [`crate::directory`]); then
    /// `leaves` is empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<crate::directory::FileRecord>,
    /// Everything else the run saves with the step (tree structure,
    /// metrics, loader state, RNG), as the Python layer gives it.
    pub extra: serde_json::Value,
    /// The attempt whose workers saved it: a worker tells the checkpoints
    /// its own attempt committed from older ones that the controller
    /// skipped (see [`crate::resume`]). Absent in manifests written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl Manifest {
    pub fn read(dir: &Location) -> Result<Self, CkptError> {
        let text = match dir {
            Location::Local(dir) => {
                let path = dir.join(MANIFEST);
                if !path.exists() {
                    return Err(CkptError::NotCommitted(dir.clone()));
                }
                std::fs::read(&path).map_err(CkptError::io("cannot read", &path))?
            }
            Location::Remote(r) => match r.client.get(&r.object(MANIFEST))? {
                Some(bytes) => bytes.to_vec(),
                None => return Err(CkptError::NotCommitted(dir.as_path())),
            },
        };
        serde_json::from_slice(&text).map_err(|e| CkptError::Manifest {
            path: dir.join(MANIFEST).as_path(),
            message: e.to_string(),
        })
    }

    /// Whether it records folders the ranks handed over, not shards.
    pub fn is_directory(&self) -> bool {
        !self.files.is_empty()
    }

    pub fn leaf(&self, path: &str) -> Result<&Leaf, CkptError> {
        self.leaves
            .iter()
            .find(|l| l.path == path)
            .ok_or_else(|| CkptError::NoLeaf(path.to_string()))
    }
}
