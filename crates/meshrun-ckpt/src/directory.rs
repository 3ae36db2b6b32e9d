//! Directory checkpoints, Ray Train's way: a rank hands over a folder it
//! wrote itself (with Orbax, say), and meshrun keeps a copy of it under the
//! step, beside what other ranks handed over. Rank 0's files sit at the top
//! of the step's folder, rank R's under `rank-R/`, as Ray lays them out;
//! every file is recorded in the manifest with its size and CRC-32C, so a
//! copy that was changed or cut short is caught before it is used.
//!
//! Locally the files are copied into `tmp-<step>/` and synced (the commit
//! renames the folder, as for shards); in an object store each file is
//! uploaded into `step-<step>/` (the commit is the manifest put there).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::commit::tmp_dir;
use crate::error::CkptError;
pub use crate::manifest::FileRecord;
use crate::manifest::{Manifest, MANIFEST};
use crate::store::Location;
use meshrun_store::{remote_bytes, upload_file};

/// Where rank `rank`'s files go inside the step's folder.
pub fn rank_prefix(rank: u32) -> String {
    if rank == 0 {
        String::new()
    } else {
        format!("rank-{rank}/")
    }
}

/// Whether `name`, at the top of rank 0's folder, would collide with what
/// meshrun keeps beside it: the manifest, and the other ranks' folders.
fn reserved(name: &str) -> bool {
    name == MANIFEST
        || name
            .strip_prefix("rank-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Every regular file under `src`, as (path relative to `src` with `/`
/// separators, full path), sorted.
fn files_under(src: &Path) -> Result<Vec<(String, PathBuf)>, CkptError> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = src.join(&rel);
        let entries = std::fs::read_dir(&dir).map_err(CkptError::io("cannot list", &dir))?;
        for entry in entries {
            let entry = entry.map_err(CkptError::io("cannot list", &dir))?;
            let path = entry.path();
            // Followed, as a copy of the folder would: a link to a file is
            // that file's bytes.
            let meta = std::fs::metadata(&path).map_err(CkptError::io("cannot read", &path))?;
            let name = rel.join(entry.file_name());
            if meta.is_dir() {
                todo.push(name);
            } else if meta.is_file() {
                let text = name
                    .to_str()
                    .ok_or_else(|| CkptError::FileName(path.clone()))?;
                out.push((text.replace(std::path::MAIN_SEPARATOR, "/"), path));
            } else {
                return Err(CkptError::NotAFile(path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The file's bytes, mapped rather than read: an upload sends slices of
/// the mapping (a checkpoint's files may be larger than the memory free).
fn mapped(path: &Path) -> Result<Bytes, CkptError> {
    let file = File::open(path).map_err(CkptError::io("cannot open", path))?;
    let len = file
        .metadata()
        .map_err(CkptError::io("cannot read", path))?
        .len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the folder was handed over for this checkpoint and is not
    // written while `report` copies it; a file changed anyway shows as a
    // checksum mismatch when the checkpoint is verified or fetched.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(CkptError::io("cannot map", path))?;
    Ok(remote_bytes(std::sync::Arc::new(map)))
}

/// Copies the folder `src` as rank `rank`'s part of checkpoint `step` under
/// the checkpoints folder `root`; returns the records of its files.
pub fn write_directory(
    root: &Location,
    step: u64,
    rank: u32,
    src: &Path,
) -> Result<Vec<FileRecord>, CkptError> {
    if !src.is_dir() {
        return Err(CkptError::NotADirectory(src.to_path_buf()));
    }
    let files = files_under(src)?;
    if rank == 0 {
        if let Some((name, _)) = files
            .iter()
            .find(|(name, _)| reserved(name.split('/').next().unwrap_or_default()))
        {
            return Err(CkptError::ReservedName {
                path: src.to_path_buf(),
                name: name.split('/').next().unwrap_or_default().to_string(),
            });
        }
    }
    let prefix = rank_prefix(rank);
    let mut records = Vec::with_capacity(files.len());
    match root {
        Location::Local(root) => {
            let dir = tmp_dir(root, step);
            for (name, from) in &files {
                let to = dir.join(format!("{prefix}{name}"));
                let parent = to.parent().expect("a file in a folder");
                std::fs::create_dir_all(parent).map_err(CkptError::io("cannot create", parent))?;
                let (size, crc32c) = copy_synced(from, &to)?;
                records.push(FileRecord {
                    path: format!("{prefix}{name}"),
                    size,
                    crc32c,
                });
            }
        }
        Location::Remote(r) => {
            for (name, from) in &files {
                let data = mapped(from)?;
                let (size, crc32c) = (data.len() as u64, crc32c::crc32c(&data));
                let key = r.object(&format!("step-{step}/{prefix}{name}"));
                upload_file(&r.client, &key, &[data])?;
                records.push(FileRecord {
                    path: format!("{prefix}{name}"),
                    size,
                    crc32c,
                });
            }
        }
    }
    Ok(records)
}

/// Copies `from` to `to` and syncs it; returns its size and CRC-32C.
fn copy_synced(from: &Path, to: &Path) -> Result<(u64, u32), CkptError> {
    let mut src = File::open(from).map_err(CkptError::io("cannot open", from))?;
    let file = File::create(to).map_err(CkptError::io("cannot write", to))?;
    let mut out = BufWriter::with_capacity(1 << 20, &file);
    let (mut size, mut crc) = (0u64, 0u32);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src
            .read(&mut buf)
            .map_err(CkptError::io("cannot read", from))?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        size += n as u64;
        out.write_all(&buf[..n])
            .map_err(CkptError::io("cannot write", to))?;
    }
    out.flush().map_err(CkptError::io("cannot write", to))?;
    drop(out);
    file.sync_all().map_err(CkptError::io("cannot write", to))?;
    Ok((size, crc))
}

/// The bytes of one file of the checkpoint in `dir`, checked against its
/// record.
fn read_checked(dir: &Location, record: &FileRecord) -> Result<Bytes, CkptError> {
    let (data, name) = match dir {
        Location::Local(d) => {
            let path = d.join(&record.path);
            if !path.exists() {
                return Err(CkptError::MissingShard(path));
            }
            let data = std::fs::read(&path).map_err(CkptError::io("cannot read", &path))?;
            (Bytes::from(data), path)
        }
        Location::Remote(r) => {
            let key = r.object(&record.path);
            let name = PathBuf::from(r.client.url(&key));
            match r.client.get(&key)? {
                Some(data) => (data, name),
                None => return Err(CkptError::MissingShard(name)),
            }
        }
    };
    let crc = crc32c::crc32c(&data);
    if data.len() as u64 != record.size || crc != record.crc32c {
        return Err(CkptError::FileChanged {
            path: name,
            size: data.len() as u64,
            expected: record.size,
        });
    }
    Ok(data)
}

/// Reads every file of the directory checkpoint in `dir` and checks it;
/// returns how many files.
pub fn verify_files(dir: &Location, manifest: &Manifest) -> Result<usize, CkptError> {
    for record in &manifest.files {
        read_checked(dir, record)?;
    }
    Ok(manifest.files.len())
}

/// Copies the files of the directory checkpoint in `dir` into the local
/// folder `dest` (made if missing), each checked on the way; returns how
/// many files.
pub fn fetch_directory(dir: &Location, dest: &Path) -> Result<usize, CkptError> {
    let manifest = crate::manifest::read(dir)?;
    if manifest.files.is_empty() {
        return Err(CkptError::NotADirectoryCheckpoint(dir.as_path()));
    }
    for record in &manifest.files {
        let data = read_checked(dir, record)?;
        let to = dest.join(&record.path);
        let parent = to.parent().expect("a file in a folder");
        std::fs::create_dir_all(parent).map_err(CkptError::io("cannot create", parent))?;
        std::fs::write(&to, &data).map_err(CkptError::io("cannot write", &to))?;
    }
    Ok(manifest.files.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::{commit, step_at};
    use crate::manifest::FORMAT_VERSION;

    fn manifest(step: u64, files: Vec<FileRecord>) -> Manifest {
        Manifest {
            format: FORMAT_VERSION,
            step,
            leaves: vec![],
            files,
            extra: serde_json::Value::Null,
            attempt: None,
        }
    }

    #[test]
    fn ranks_folders_are_copied_committed_checked_and_fetched() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Location::from(tmp.path().join("checkpoints").as_path());
        let src0 = tmp.path().join("orbax0");
        std::fs::create_dir_all(src0.join("d")).unwrap();
        std::fs::write(src0.join("_METADATA"), b"meta").unwrap();
        std::fs::write(src0.join("d/shard"), vec![7u8; 3 << 20]).unwrap();
        let src1 = tmp.path().join("mine1");
        std::fs::create_dir_all(&src1).unwrap();
        std::fs::write(src1.join("manifest.json"), b"rank 1 may use any name").unwrap();

        let mut files = write_directory(&root, 5, 0, &src0).unwrap();
        files.extend(write_directory(&root, 5, 1, &src1).unwrap());
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["_METADATA", "d/shard", "rank-1/manifest.json"]);
        let dir = commit(&root, &manifest(5, files)).unwrap();
        assert_eq!(dir, step_at(&root, 5));
        let m = crate::manifest::read(&dir).unwrap();
        assert_eq!(verify_files(&dir, &m).unwrap(), 3);

        let out = tmp.path().join("out");
        assert_eq!(fetch_directory(&dir, &out).unwrap(), 3);
        assert_eq!(
            std::fs::read(out.join("d/shard")).unwrap(),
            vec![7u8; 3 << 20]
        );
        assert_eq!(std::fs::read(out.join("_METADATA")).unwrap(), b"meta");

        // One byte changed: caught, naming the file.
        let shard = dir.local().unwrap().join("d/shard");
        let mut raw = std::fs::read(&shard).unwrap();
        raw[12345] ^= 1;
        std::fs::write(&shard, raw).unwrap();
        let err = verify_files(&dir, &m).unwrap_err().to_string();
        assert!(err.contains("d/shard"), "{err}");
    }

    #[test]
    fn rank_0_may_not_use_the_names_meshrun_keeps_beside_its_files() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Location::from(tmp.path().join("checkpoints").as_path());
        for name in ["manifest.json", "rank-3"] {
            let src = tmp.path().join(format!("src-{name}"));
            std::fs::create_dir_all(&src).unwrap();
            std::fs::write(src.join(name), b"x").unwrap();
            let err = write_directory(&root, 1, 0, &src).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
        let missing = tmp.path().join("nope");
        let err = write_directory(&root, 1, 0, &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope"), "{err}");
    }
}
