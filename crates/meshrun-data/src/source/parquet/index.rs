//! The token counts of a packed Parquet data set, per row group: where each
//! row group's tokens start in the stream. Counting means decoding every
//! row group once; a data set that fits in `max_memory` keeps what was
//! decoded, a larger one keeps only the counts, cached on the scratch disk
//! under the data set's fingerprint so that the next open (every process,
//! every restart) does not decode it all again.

use serde::{Deserialize, Serialize};

use super::columns::Kind;
use super::File;
use crate::blob::cache::scratch_dir;
use crate::error::DataError;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupCount {
    pub file: usize,
    pub group: usize,
    pub tokens: u64,
}

pub enum Counted {
    /// Every token, decoded (it fits in `max_memory`).
    Held(Vec<u8>),
    /// Counts only.
    Groups(Vec<GroupCount>),
}

fn cache_path(fingerprint: &str) -> std::path::PathBuf {
    scratch_dir()
        .join(format!("meshrun-data-{}", nix::unistd::getuid()))
        .join(format!("parquet-index-{fingerprint}.json"))
}

/// The counts (and, when they fit in `max_memory`, the tokens themselves)
/// of every row group of `files`, in order.
pub fn tokens(
    files: &[File],
    kinds: &[Kind],
    columns: &[String],
    fingerprint: &str,
    max_memory: u64,
) -> Result<(Counted, u64), DataError> {
    let Kind::Tokens(dtype) = kinds[0] else {
        unreachable!("packing takes token lists")
    };
    let itemsize = dtype.itemsize() as u64;
    let path = cache_path(fingerprint);
    let expected: usize = files.iter().map(File::groups).sum();
    if let Some(groups) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<GroupCount>>(&b).ok())
        .filter(|g| g.len() == expected)
    {
        let total: u64 = groups.iter().map(|c| c.tokens).sum();
        if total * itemsize > max_memory {
            return Ok((Counted::Groups(groups), total));
        }
    }
    // Known from the metadata to be larger than the budget: count only,
    // without holding tokens that would be dropped.
    let at_least: u64 = files
        .iter()
        .map(|f| (0..f.groups()).map(|g| f.min_values(g)).sum::<u64>())
        .sum();
    let mut held = (at_least * itemsize <= max_memory).then(Vec::new);
    let mut groups = Vec::with_capacity(expected);
    let mut total = 0;
    for (f, file) in files.iter().enumerate() {
        file.prefetch_all()?;
        for g in 0..file.groups() {
            let mut out = vec![Vec::new()];
            file.decode_group(g, kinds, columns, &mut out)?;
            let tokens = out[0].len() as u64 / itemsize;
            total += tokens;
            groups.push(GroupCount {
                file: f,
                group: g,
                tokens,
            });
            if let Some(h) = held.as_mut() {
                h.extend_from_slice(&out[0]);
                if h.len() as u64 > max_memory {
                    held = None;
                }
            }
        }
    }
    if let Some(h) = held {
        return Ok((Counted::Held(h), total));
    }
    // A cache that cannot be written only costs the next open a pass.
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    if std::fs::write(&tmp, serde_json::to_vec(&groups).expect("counts serialize")).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
    Ok((Counted::Groups(groups), total))
}
