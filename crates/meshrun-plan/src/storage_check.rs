//! Where a run writes, checked before it starts: the runs directory and a
//! storage folder must be writable directories, and a storage URL must be
//! a store that lets the run write, read and delete.

use std::path::Path;

use meshrun_ckpt::store::Location;

use crate::error::UsageError;

/// An object-store URL must be one meshrun can use, and the store must let
/// it write, read and delete an object under the run's folder: a wrong
/// key, a missing bucket or an endpoint that does not answer is found here,
/// before anything starts, naming the URL.
pub(super) fn check_remote_storage(url: &str, name: &str) -> Result<(), UsageError> {
    let unusable = |reason: String| UsageError::StorageUnusable {
        path: url.into(),
        reason,
    };
    let root = Location::parse(url).map_err(|e| unusable(e.to_string()))?;
    let Location::Remote(dir) = root.join(name) else {
        unreachable!("a URL parses as a remote location")
    };
    meshrun_ckpt::store::remote::probe(&dir).map_err(|e| unusable(e.to_string()))
}

/// The storage root, like the runs directory, must be a writable directory
/// (whether other hosts see it is checked when they join).
pub(super) fn check_storage(path: &Path) -> Result<(), UsageError> {
    check_runs_dir(path).map_err(|e| match e {
        UsageError::RunsDirUnusable { path, reason } => {
            UsageError::StorageUnusable { path, reason }
        }
        other => other,
    })
}

/// The runs directory must be (or become) a writable directory with room
/// for a byte. Probed without leaving anything behind that was not there
/// before.
pub(super) fn check_runs_dir(path: &Path) -> Result<(), UsageError> {
    let unusable = |reason: String| UsageError::RunsDirUnusable {
        path: path.to_path_buf(),
        reason,
    };
    if path.exists() {
        if !path.is_dir() {
            return Err(unusable("it exists and is not a directory".into()));
        }
        let probe = path.join(format!(".meshrun-probe-{}", std::process::id()));
        let written = std::fs::File::create(&probe).and_then(|mut f| {
            // An empty file needs no space: a full file system only shows
            // on the first byte.
            std::io::Write::write_all(&mut f, b"x")
        });
        let _ = std::fs::remove_file(&probe);
        return match written {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => Err(unusable(format!(
                "its file system is full ({e}); free some space or choose another --runs-dir"
            ))),
            Err(e) => Err(unusable(format!("not writable ({e})"))),
        };
    }
    // Find the nearest existing ancestor: it must be a writable directory.
    let mut ancestor = path.parent();
    while let Some(dir) = ancestor {
        if dir.exists() {
            if !dir.is_dir() {
                return Err(unusable(format!("'{}' is not a directory", dir.display())));
            }
            let probe = dir.join(format!(".meshrun-probe-{}", std::process::id()));
            return match std::fs::create_dir(&probe) {
                Ok(()) => {
                    let _ = std::fs::remove_dir(&probe);
                    Ok(())
                }
                Err(e) => Err(unusable(format!(
                    "cannot create it inside '{}' ({e})",
                    dir.display()
                ))),
            };
        }
        ancestor = dir.parent();
    }
    Err(unusable("no existing parent directory".into()))
}
