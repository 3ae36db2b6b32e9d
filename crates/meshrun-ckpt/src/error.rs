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
    #[error("{what} '{url}': {}", storage_reason(source))]
    Storage {
        what: &'static str,
        url: String,
        source: Box<object_store::Error>,
    },
    #[error(
        "'{url}' is not a storage URL meshrun can use: {reason}; accepted: {}",
        crate::store::SCHEMES
    )]
    BadUrl { url: String, reason: String },
    #[error("checkpoint step {step} is already committed at '{url}'; it was not replaced")]
    AlreadyCommitted { step: u64, url: String },
    #[error("shard of leaf '{leaf}' has {got} bytes, expected {expected} for region {region:?}")]
    ShardSize {
        leaf: String,
        got: usize,
        expected: usize,
        region: Vec<(usize, usize)>,
    },
}

/// What went wrong with a storage request, in the user's terms first.
fn storage_reason(e: &object_store::Error) -> String {
    use object_store::Error as E;
    const DENIED: &str =
        "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)";
    const MISSING: &str = "not found (does the bucket exist?)";
    const CODES_DENIED: [&str; 4] = [
        "403 Forbidden",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AccessDenied",
    ];
    // Some requests (a listing) fail with a generic error that holds the
    // store's answer: its code says what happened.
    let text = e.to_string();
    let hint = match e {
        E::NotFound { .. } => MISSING,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => DENIED,
        _ if CODES_DENIED.iter().any(|code| text.contains(code)) => DENIED,
        _ if text.contains("NoSuchBucket") => MISSING,
        _ => {
            "the storage did not answer as expected (is AWS_ENDPOINT_URL right, and the server up?)"
        }
    };
    format!("{hint}; {text}")
}

impl CkptError {
    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| CkptError::Io { what, path, source }
    }
}
