//! The controller's part of checkpointing: collect every rank's
//! `CheckpointWritten`, and when all have written, commit the step (write
//! the manifest, rename `tmp-<step>` to `step-<step>`). Uncommitted folders
//! left by a crash are removed when a run (re)starts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use meshrun_ckpt::commit::{clean_uncommitted, commit};
use meshrun_ckpt::manifest::{Leaf, Manifest, FORMAT_VERSION};
use meshrun_ckpt::CkptError;

#[derive(Default)]
struct Pending {
    ranks: BTreeSet<u32>,
    leaves: BTreeMap<String, Leaf>,
    extra: Option<serde_json::Value>,
}

pub struct Checkpoints {
    root: PathBuf,
    world: u32,
    pending: BTreeMap<u64, Pending>,
}

impl Checkpoints {
    /// Opens `run_dir/checkpoints`, removing uncommitted folders; returns
    /// them for the record.
    pub fn open(run_dir: &Path, world: u32) -> Result<(Self, Vec<PathBuf>), CkptError> {
        let root = run_dir.join("checkpoints");
        std::fs::create_dir_all(&root).map_err(CkptError::io("cannot create", &root))?;
        let removed = clean_uncommitted(&root)?;
        Ok((
            Self {
                root,
                world,
                pending: BTreeMap::new(),
            },
            removed,
        ))
    }

    /// Records one rank's shards; commits when every rank has written.
    /// Returns the committed folder then.
    pub fn written(
        &mut self,
        rank: u32,
        step: u64,
        leaves: Vec<Leaf>,
        extra: Option<serde_json::Value>,
    ) -> Result<Option<PathBuf>, CkptError> {
        let p = self.pending.entry(step).or_default();
        if !p.ranks.insert(rank) {
            return Ok(None);
        }
        for leaf in leaves {
            match p.leaves.get_mut(&leaf.path) {
                Some(known) => known.shards.extend(leaf.shards),
                None => {
                    p.leaves.insert(leaf.path.clone(), leaf);
                }
            }
        }
        if extra.is_some() {
            p.extra = extra;
        }
        if p.ranks.len() < self.world as usize {
            return Ok(None);
        }
        let p = self.pending.remove(&step).expect("present");
        let manifest = Manifest {
            format: FORMAT_VERSION,
            step,
            leaves: p.leaves.into_values().collect(),
            extra: p.extra.unwrap_or(serde_json::Value::Null),
        };
        commit(&self.root, &manifest).map(Some)
    }
}
