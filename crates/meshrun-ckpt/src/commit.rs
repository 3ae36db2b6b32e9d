//! Commit, listing and clean-up of checkpoint folders.
//!
//! `checkpoints/tmp-<step>/` is where ranks write; the commit writes
//! `manifest.json` (synced), syncs the folder, renames it to `step-<step>`
//! and syncs the parent, so after a crash a folder is either complete and
//! committed or a `tmp-*` without manifest, which is never read and is
//! removed at the next start.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::CkptError;
use crate::manifest::{Manifest, MANIFEST};

pub fn tmp_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("tmp-{step}"))
}

pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step}"))
}

fn sync_dir(dir: &Path) -> Result<(), CkptError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(CkptError::io("cannot sync folder", dir))
}

/// Makes `tmp-<step>` the committed `step-<step>`.
pub fn commit(root: &Path, manifest: &Manifest) -> Result<PathBuf, CkptError> {
    let tmp = tmp_dir(root, manifest.step);
    let path = tmp.join(MANIFEST);
    let text = serde_json::to_string_pretty(manifest).expect("manifest serializes");
    let mut f = File::create(&path).map_err(CkptError::io("cannot write", &path))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(CkptError::io("cannot write", &path))?;
    sync_dir(&tmp)?;
    let done = step_dir(root, manifest.step);
    if done.exists() {
        // A step saved again (after a restart) replaces the older copy.
        fs::remove_dir_all(&done).map_err(CkptError::io("cannot replace", &done))?;
    }
    fs::rename(&tmp, &done).map_err(CkptError::io("cannot commit", &tmp))?;
    sync_dir(root)?;
    Ok(done)
}

/// Committed checkpoints under `root`, oldest step first.
pub fn committed(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let step = name.to_str()?.strip_prefix("step-")?.parse().ok()?;
            e.path().join(MANIFEST).exists().then(|| (step, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Renames the committed `step-<step>` to `<label>-step-<step>` (with a
/// `.2`, `.3`, ... suffix if that name is taken), out of the run's line of
/// checkpoints but with every file as it was: nothing is read from it, and
/// retention never deletes it. Returns the new path.
pub fn set_aside(root: &Path, step: u64, label: &str) -> Result<PathBuf, CkptError> {
    let from = step_dir(root, step);
    let base = format!("{label}-step-{step}");
    let mut to = root.join(&base);
    let mut n = 1;
    while to.exists() {
        n += 1;
        to = root.join(format!("{base}.{n}"));
    }
    fs::rename(&from, &to).map_err(CkptError::io("cannot set aside", &from))?;
    sync_dir(root)?;
    Ok(to)
}

/// Removes every uncommitted `tmp-*` folder (left by a crash).
pub fn clean_uncommitted(root: &Path) -> Result<Vec<PathBuf>, CkptError> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with("tmp-")) {
            fs::remove_dir_all(entry.path())
                .map_err(CkptError::io("cannot remove", entry.path()))?;
            removed.push(entry.path());
        }
    }
    Ok(removed)
}
