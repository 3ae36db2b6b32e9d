//! The controller's part of checkpointing: collect every rank's
//! `CheckpointWritten`, and when all have written, commit the step (write
//! the manifest, rename `tmp-<step>` to `step-<step>`). Uncommitted folders
//! left by a crash are removed when a run (re)starts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use meshrun_ckpt::commit::{clean_uncommitted, commit, committed};
use meshrun_ckpt::manifest::{Leaf, Manifest, FORMAT_VERSION};
use meshrun_ckpt::retention::{to_delete, Candidate, Retention};
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
    retention: Option<Retention>,
    pending: BTreeMap<u64, Pending>,
}

impl Checkpoints {
    /// Opens `run_dir/checkpoints`, removing uncommitted folders; returns
    /// them for the record.
    pub fn open(
        run_dir: &Path,
        world: u32,
        retention: Option<Retention>,
    ) -> Result<(Self, Vec<PathBuf>), CkptError> {
        let root = run_dir.join("checkpoints");
        std::fs::create_dir_all(&root).map_err(CkptError::io("cannot create", &root))?;
        let removed = clean_uncommitted(&root)?;
        Ok((
            Self {
                root,
                world,
                retention,
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

impl Checkpoints {
    /// Applies the retention rules to the committed checkpoints; returns the
    /// steps deleted.
    pub fn retain(&self) -> Result<Vec<u64>, CkptError> {
        let Some(policy) = &self.retention else {
            return Ok(Vec::new());
        };
        let all = committed(&self.root);
        let candidates: Vec<Candidate> = all
            .iter()
            .map(|(step, path)| Candidate {
                step: *step,
                score: policy.score_attribute.as_ref().and_then(|attr| {
                    Manifest::read(path)
                        .ok()?
                        .extra
                        .get("metrics")?
                        .get(attr)?
                        .as_f64()
                }),
            })
            .collect();
        let doomed = to_delete(policy, &candidates);
        for (step, path) in &all {
            if doomed.contains(step) {
                std::fs::remove_dir_all(path).map_err(CkptError::io("cannot delete", path))?;
            }
        }
        Ok(doomed)
    }
}
