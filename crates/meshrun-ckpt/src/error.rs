//! What can go wrong with a checkpoint; every message names the file, the
//! tensor or the path in the tree.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    #[error("{what} '{path}': {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("'{path}' is not a valid safetensors shard file: {message}; the file is damaged, restore another checkpoint (`meshrun ckpt ls` lists them)")]
    Format { path: PathBuf, message: String },
    #[error("dtype '{0}' cannot be checkpointed; supported: {1}")]
    Dtype(String, &'static str),
    #[error(
        "checksum mismatch in '{path}', tensor '{tensor}' (leaf '{leaf}'), bytes {start}..{end}: \
         the file is corrupt; restore another checkpoint (`meshrun ckpt ls` lists them)"
    )]
    Crc {
        path: PathBuf,
        tensor: String,
        leaf: String,
        start: usize,
        end: usize,
    },
    #[error(
        "shard file '{0}' is missing: the manifest lists it, so this checkpoint is incomplete; \
         restore another one (`meshrun ckpt ls` lists them) or copy the file back"
    )]
    MissingShard(PathBuf),
    #[error("'{0}' has no manifest.json: it is not a committed checkpoint; give a folder like runs/NAME/checkpoints/step-N")]
    NotCommitted(PathBuf),
    #[error("manifest '{path}' cannot be read: {message}; the checkpoint is damaged, restore another one (`meshrun ckpt ls` lists them)")]
    Manifest { path: PathBuf, message: String },
    #[error("checkpoint has no leaf '{0}'")]
    NoLeaf(String),
    #[error("leaf '{leaf}': the checkpoint holds {saved}, the target asks for {target}")]
    Mismatch {
        leaf: String,
        saved: String,
        target: String,
    },
    #[error("leaf '{leaf}': the stored shards do not cover region {region:?} of the target")]
    Incomplete {
        leaf: String,
        region: Vec<(usize, usize)>,
    },
    #[error(
        "leaf '{leaf}'{copy}: {how}, so it cannot be restored whole (its bytes are intact: this is how \
         it was committed, not damage)"
    )]
    Uncovered {
        leaf: String,
        /// " (rank N's copy)" for a per-process leaf, else empty.
        copy: String,
        /// What the manifest's shards hold against the leaf's size.
        how: String,
    },
    #[error(
        "leaf '{leaf}' holds one copy per process (saved by ranks {ranks}) and the copies differ, \
         so rank {rank}, which saved none, has no copy of its own to restore; restore onto at least as many \
         processes as saved it, or save the leaf as one global array (a NamedSharding over the mesh) that any \
         number of processes can read"
    )]
    NoCopy {
        leaf: String,
        rank: u32,
        ranks: String,
    },
    #[error(
        "checkpoint step-{step} cannot be resumed from{skipped}: {source}; it is left as it was: resume from an \
         older one with --resume-from STEP (RunConfig.resume_from; `meshrun ckpt ls` lists them), or from the \
         beginning with --resume-from none"
    )]
    CannotResume {
        step: u64,
        /// " (the newer step-N is damaged)", or empty.
        skipped: String,
        source: Box<CkptError>,
    },
    #[error(
        "{which}, so the run does not start over by itself; the newest, step-{newest}: {why}; \
         they are left as they were: copy the damaged files back, or start from the beginning with \
         --resume-from none (RunConfig.resume_from=\"none\"), which sets them aside"
    )]
    NoneVerifies {
        /// "none of the run's 3 committed checkpoints verifies", or of one.
        which: String,
        newest: u64,
        why: String,
    },
    #[error(transparent)]
    Store(meshrun_store::StoreError),
    #[error("checkpoint step {step} is already committed at '{url}'; it was not replaced")]
    AlreadyCommitted { step: u64, url: String },
    #[error("'{0}' is not a folder: Checkpoint.from_directory(...) takes the local folder the checkpoint was written into")]
    NotADirectory(PathBuf),
    #[error("'{0}' is neither a file nor a folder (a socket, a pipe or a device): a checkpoint folder may hold files and folders only")]
    NotAFile(PathBuf),
    #[error(
        "'{0}': a file name that is not UTF-8 cannot be kept in a checkpoint's manifest; rename it"
    )]
    FileName(PathBuf),
    #[error("'{path}' holds '{name}' at its top, a name meshrun keeps beside rank 0's files in a checkpoint (manifest.json, rank-N/ for rank N's files); move it into a subfolder or rename it")]
    ReservedName { path: PathBuf, name: String },
    #[error("'{path}' has {size} bytes or a checksum that differs from what was saved ({expected} bytes): the checkpoint is damaged, restore another one (`meshrun ckpt ls` lists them)")]
    FileChanged {
        path: PathBuf,
        size: u64,
        expected: u64,
    },
    #[error("'{0}' holds a sharded state, not a folder: restore it with meshrun.restore(target, checkpoint)")]
    NotADirectoryCheckpoint(PathBuf),
    #[error("'{0}' holds a folder a rank handed over (Checkpoint.from_directory), not a sharded state: open it with `with checkpoint.as_directory() as path:`")]
    DirectoryCheckpoint(PathBuf),
    #[error("shard of leaf '{leaf}' has {got} bytes, expected {expected} for region {region:?}")]
    ShardSize {
        leaf: String,
        got: usize,
        expected: usize,
        region: Vec<(usize, usize)>,
    },
}

impl From<meshrun_store::StoreError> for CkptError {
    /// A shard the manifest lists but the store does not have is a
    /// missing shard, said as such; the rest are storage errors.
    fn from(e: meshrun_store::StoreError) -> Self {
        match e {
            meshrun_store::StoreError::NotFound { url } => CkptError::MissingShard(url.into()),
            e => CkptError::Store(e),
        }
    }
}

impl CkptError {
    /// Whether this says the checkpoint's bytes are damaged (a checksum,
    /// a file, a manifest or a size that is not what was committed), as
    /// against one that is whole but cannot be read here (a storage
    /// outage, a layout it cannot be restored into).
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            CkptError::Format { .. }
                | CkptError::Crc { .. }
                | CkptError::MissingShard(_)
                | CkptError::Manifest { .. }
                | CkptError::FileChanged { .. }
                | CkptError::ShardSize { .. }
        )
    }

    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| CkptError::Io { what, path, source }
    }
}
