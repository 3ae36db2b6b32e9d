//! `manifest.json`: the commit record of a checkpoint. Its types are
//! meshrun-record's (the control protocol carries them); reading one from
//! a folder, local or in an object store, is here.

pub use meshrun_record::manifest::{
    FileRecord, Leaf, Manifest, ShardRecord, FORMAT_VERSION, MANIFEST,
};

use crate::error::CkptError;
use crate::store::Location;

/// The manifest committed in `dir`; [`CkptError::NotCommitted`] when the
/// folder holds none.
pub fn read(dir: &Location) -> Result<Manifest, CkptError> {
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

/// The leaf saved under `path`, or [`CkptError::NoLeaf`].
pub fn leaf<'m>(manifest: &'m Manifest, path: &str) -> Result<&'m Leaf, CkptError> {
    manifest
        .leaf(path)
        .ok_or_else(|| CkptError::NoLeaf(path.to_string()))
}
