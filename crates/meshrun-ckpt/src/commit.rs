//! Commit, listing and clean-up of checkpoint folders.
//!
//! `checkpoints/tmp-<step>/` is where ranks write; the commit writes
//! `manifest.json` (synced), syncs the folder, renames it to `step-<step>`
//! and syncs the parent, so after a crash a folder is either complete and
//! committed or a `tmp-*` without manifest, which is never read and is
//! removed at the next start.
//!
//! In an object store, which has no rename, ranks write into `step-<step>/`
//! and the commit is `manifest.json` put there with a create-only
//! condition; a `step-*` without a manifest is what a crash leaves, and is
//! removed at the next start like a `tmp-*` folder (see [`crate::store`]).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use object_store::path::Path as Key;

use crate::error::CkptError;
use crate::manifest::{Manifest, MANIFEST};
use crate::store::{Location, RemoteDir};

pub fn tmp_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("tmp-{step}"))
}

pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step}"))
}

/// The folder of committed step `step` under `root`.
pub fn step_at(root: &Location, step: u64) -> Location {
    root.join(&format!("step-{step}"))
}

fn sync_dir(dir: &Path) -> Result<(), CkptError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(CkptError::io("cannot sync folder", dir))
}

/// Commits checkpoint `manifest.step` under `root`; returns its folder.
pub fn commit(root: &Location, manifest: &Manifest) -> Result<Location, CkptError> {
    match root {
        Location::Local(root) => commit_local(root, manifest).map(Location::Local),
        Location::Remote(r) => {
            let dir = r.join(&format!("step-{}", manifest.step));
            let text = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
            if r.client.put_new(&dir.object(MANIFEST), Bytes::from(text))? {
                Ok(Location::Remote(dir))
            } else {
                Err(CkptError::AlreadyCommitted {
                    step: manifest.step,
                    url: dir.url(),
                })
            }
        }
    }
}

/// Makes `tmp-<step>` the committed `step-<step>`.
fn commit_local(root: &Path, manifest: &Manifest) -> Result<PathBuf, CkptError> {
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

/// The objects under a remote checkpoints folder, by their first-level
/// folder name (`step-40`): key and size.
pub(crate) fn remote_folders(
    r: &RemoteDir,
) -> Result<BTreeMap<String, Vec<(Key, u64)>>, CkptError> {
    let mut out: BTreeMap<String, Vec<(Key, u64)>> = BTreeMap::new();
    for (key, size) in r.client.list(&r.key)? {
        let Some(mut parts) = key.prefix_match(&r.key) else {
            continue;
        };
        if let Some(first) = parts.next() {
            out.entry(first.as_ref().to_string())
                .or_default()
                .push((key.clone(), size));
        }
    }
    Ok(out)
}

fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// Committed checkpoints under `root`, oldest step first. A local folder
/// that cannot be read has none; a store that cannot be listed is an error
/// (resuming from the beginning instead would be silent data loss).
pub fn committed(root: &Location) -> Result<Vec<(u64, Location)>, CkptError> {
    let mut out: Vec<(u64, Location)> = match root {
        Location::Local(root) => fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let step = step_of(e.file_name().to_str()?)?;
                e.path()
                    .join(MANIFEST)
                    .exists()
                    .then(|| (step, Location::Local(e.path())))
            })
            .collect(),
        Location::Remote(r) => remote_folders(r)?
            .into_iter()
            .filter_map(|(name, objects)| {
                let step = step_of(&name)?;
                let dir = r.join(&name);
                let manifest = dir.object(MANIFEST);
                objects
                    .iter()
                    .any(|(k, _)| *k == manifest)
                    .then(|| (step, Location::Remote(dir)))
            })
            .collect(),
    };
    out.sort_by_key(|(step, _)| *step);
    Ok(out)
}

/// Deletes a committed checkpoint folder. In a store the manifest goes
/// first, so a delete cut short leaves an uncommitted folder, never a
/// committed one with files missing.
pub fn delete(dir: &Location) -> Result<(), CkptError> {
    match dir {
        Location::Local(p) => fs::remove_dir_all(p).map_err(CkptError::io("cannot delete", p)),
        Location::Remote(r) => {
            let manifest = r.object(MANIFEST);
            r.client.delete(vec![manifest.clone()])?;
            let rest: Vec<Key> = r
                .client
                .list(&r.key)?
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| *k != manifest)
                .collect();
            if !rest.is_empty() {
                r.client.delete(rest)?;
            }
            Ok(())
        }
    }
}

/// Renames the committed `step-<step>` to `<label>-step-<step>` (with a
/// `.2`, `.3`, ... suffix if that name is taken), out of the run's line of
/// checkpoints but with every file as it was: nothing is read from it, and
/// retention never deletes it. Returns the new path.
pub fn set_aside(root: &Location, step: u64, label: &str) -> Result<Location, CkptError> {
    match root {
        Location::Local(root) => set_aside_local(root, step, label).map(Location::Local),
        Location::Remote(r) => {
            let folders = remote_folders(r)?;
            let base = format!("{label}-step-{step}");
            let mut name = base.clone();
            let mut n = 1;
            while folders.contains_key(&name) {
                n += 1;
                name = format!("{base}.{n}");
            }
            let from = r.join(&format!("step-{step}"));
            let to = r.join(&name);
            let manifest = from.object(MANIFEST);
            let mut objects: Vec<Key> = folders
                .get(&format!("step-{step}"))
                .map(|o| o.iter().map(|(k, _)| k.clone()).collect())
                .unwrap_or_default();
            // The copy is committed last, the original uncommitted first.
            objects.sort_by_key(|k| *k == manifest);
            for key in &objects {
                let rel: Vec<String> = key
                    .prefix_match(&from.key)
                    .map(|p| p.map(|x| x.as_ref().to_string()).collect())
                    .unwrap_or_default();
                r.client.copy(key, &to.object(&rel.join("/")))?;
            }
            delete(&Location::Remote(from))?;
            Ok(Location::Remote(to))
        }
    }
}

fn set_aside_local(root: &Path, step: u64, label: &str) -> Result<PathBuf, CkptError> {
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

/// Removes what a crash leaves: every uncommitted `tmp-*` folder, and in a
/// store every `step-*` without a manifest. Returns what was removed.
pub fn clean_uncommitted(root: &Location) -> Result<Vec<Location>, CkptError> {
    let mut removed = Vec::new();
    match root {
        Location::Local(root) => {
            for entry in fs::read_dir(root).into_iter().flatten().flatten() {
                let name = entry.file_name();
                if name.to_str().is_some_and(|n| n.starts_with("tmp-")) {
                    fs::remove_dir_all(entry.path())
                        .map_err(CkptError::io("cannot remove", entry.path()))?;
                    removed.push(Location::Local(entry.path()));
                }
            }
        }
        Location::Remote(r) => {
            for (name, objects) in remote_folders(r)? {
                let dir = r.join(&name);
                let manifest = dir.object(MANIFEST);
                if step_of(&name).is_some() && !objects.iter().any(|(k, _)| *k == manifest) {
                    r.client
                        .delete(objects.into_iter().map(|(k, _)| k).collect())?;
                    removed.push(Location::Remote(dir));
                }
            }
            // A rank killed while uploading leaves its parts in the bucket:
            // nobody will finish those uploads, so abort them.
            for key in r.client.abort_uploads(&r.key)? {
                let folder = key
                    .strip_prefix(&format!("{}/", r.key))
                    .and_then(|rest| rest.split('/').next())
                    .unwrap_or_default()
                    .to_string();
                let dir = Location::Remote(r.join(&folder));
                if !removed.contains(&dir) {
                    removed.push(dir);
                }
            }
        }
    }
    Ok(removed)
}
