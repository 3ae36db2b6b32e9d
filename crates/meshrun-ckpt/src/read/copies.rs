//! Which stored shards a reader uses for a leaf. A global array's shards
//! together cover it once, and every process reads from all of them. A
//! per-process leaf (an array on one process's own devices, a numpy array,
//! a number) is stored once per rank that saved it, each copy covering the
//! whole leaf: a rank reads its own copy; a rank with none (more processes
//! than saved the checkpoint) reads rank 0's when every copy holds the
//! same bytes, and is refused when they differ, since no copy is its own.

use std::collections::HashMap;

use crate::boxes::elements;
use crate::error::CkptError;
use crate::manifest::{Leaf, ShardRecord};

use super::Reader;

/// The rank whose copies a reader uses for one leaf: `None` for a global
/// array.
pub(super) type Copy = Option<u32>;

/// One stored shard of a copy as far as comparing copies goes: its region
/// and the checksums of its chunks.
type Stored = (Vec<(usize, usize)>, Vec<u32>);

impl Reader {
    /// Which copy of leaf `path` this reader's rank reads (remembered).
    pub(super) fn copy_for(&mut self, path: &str) -> Result<Copy, CkptError> {
        if let Some(c) = self.copies.get(path) {
            return Ok(*c);
        }
        let leaf = crate::manifest::leaf(&self.manifest, path)?.clone();
        let chosen = if leaf.per_process() {
            let ranks = leaf.copy_ranks();
            if ranks.contains(&self.rank) {
                Some(self.rank)
            } else if self.copies_agree(&leaf, &ranks)? {
                Some(ranks[0])
            } else {
                return Err(CkptError::NoCopy {
                    leaf: leaf.path.clone(),
                    rank: self.rank,
                    ranks: ranks
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        } else {
            None
        };
        self.copies.insert(path.to_string(), chosen);
        Ok(chosen)
    }

    /// Whether the copies of every rank in `ranks` hold the same regions
    /// with the same checksums (so the same bytes).
    fn copies_agree(&mut self, leaf: &Leaf, ranks: &[u32]) -> Result<bool, CkptError> {
        let mut first: Option<Vec<Stored>> = None;
        for &rank in ranks {
            let mut copy = Vec::new();
            for s in shards_of(leaf, Some(rank)) {
                self.open_file(&s.file)?;
                let crcs = self.files[&s.file].crcs.get(&s.tensor).cloned();
                copy.push((s.region.clone(), crcs.unwrap_or_default()));
            }
            copy.sort();
            match &first {
                None => first = Some(copy),
                Some(f) if *f != copy => return Ok(false),
                Some(_) => {}
            }
        }
        Ok(true)
    }
}

/// The shards of `leaf` that copy `copy` reads.
pub(super) fn shards_of(leaf: &Leaf, copy: Copy) -> impl Iterator<Item = &ShardRecord> {
    leaf.shards.iter().filter(move |s| s.rank == copy)
}

/// Whether the shards of a leaf cover it whole: each rank's copy of a
/// per-process leaf, or the shards of a global array together.
pub(super) fn check_covered(leaf: &Leaf) -> Result<(), CkptError> {
    let whole: Vec<(usize, usize)> = leaf.shape.iter().map(|&d| (0, d)).collect();
    let total = elements(&whole);
    let mut covered: HashMap<Copy, usize> = HashMap::new();
    for s in &leaf.shards {
        *covered.entry(s.rank).or_default() += elements(&s.region);
    }
    if leaf.shards.is_empty() {
        covered.insert(None, 0);
    }
    let mut copies: Vec<_> = covered.into_iter().collect();
    copies.sort_unstable();
    for (rank, n) in copies {
        if n != total {
            return Err(CkptError::Uncovered {
                leaf: leaf.path.clone(),
                copy: rank.map_or_else(String::new, |r| format!(" (rank {r}'s copy)")),
                how: if n > total {
                    format!("the manifest's shards overlap (they hold {n} elements of a leaf of {total})")
                } else {
                    format!("the manifest's shards cover only {n} of its {total} elements")
                },
            });
        }
    }
    Ok(())
}
