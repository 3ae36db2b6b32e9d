//! Where checkpoints and data live: a local folder, or a prefix in object
//! storage (`s3://bucket/prefix`, `gs://...`, `az://...`).
//!
//! A [`Location`] is what the engine passes around instead of a path. Local folders keep the engine's file semantics (write into
//! `tmp-<step>/`, sync, rename to `step-<step>/`). Object stores have no
//! rename, so there ranks write straight into `step-<step>/` and the
//! commit is the manifest, put with a create-only condition: a step folder
//! without `manifest.json` is not committed, is never read, and is removed
//! (with the multipart uploads left under it) when the next attempt opens.

mod credentials;
mod error;
pub mod remote;
mod upload;
mod uploads;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::StoreError;
pub use object_store::path::Path as Key;
pub use remote::{probe, Client};
pub use upload::{roundtrip, shared as remote_bytes, upload_file};

/// The schemes an object-store location may have.
pub const SCHEMES: &str = "s3://, gs://, az:// (or a local folder)";

/// A folder: local, or a prefix in an object store.
#[derive(Clone)]
pub enum Location {
    Local(PathBuf),
    Remote(RemoteDir),
}

/// A prefix in an object store, with the client that reaches it.
#[derive(Clone)]
pub struct RemoteDir {
    pub client: Arc<Client>,
    /// The prefix inside the bucket, without a trailing '/'.
    pub key: Key,
}

impl RemoteDir {
    pub fn url(&self) -> String {
        if self.key.as_ref().is_empty() {
            self.client.bucket_url().to_string()
        } else {
            format!("{}/{}", self.client.bucket_url(), self.key)
        }
    }

    #[must_use]
    pub fn join(&self, name: &str) -> Self {
        Self {
            client: Arc::clone(&self.client),
            key: name
                .split('/')
                .filter(|p| !p.is_empty())
                .fold(self.key.clone(), |k, p| k.clone().join(p)),
        }
    }

    /// The key of object `name` in this folder.
    pub fn object(&self, name: &str) -> Key {
        self.join(name).key
    }
}

/// Whether `text` names an object-store location (has a scheme) rather
/// than a local path.
pub fn is_url(text: &str) -> bool {
    text.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

impl Location {
    /// A local path, or an object-store URL (`s3://bucket/prefix`);
    /// `file:///path` is a local path. The client of a URL is made from the
    /// environment (see [`Client::for_url`]) and shared by every location
    /// in the same bucket.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        if let Some(path) = text.strip_prefix("file://") {
            return Ok(Self::Local(PathBuf::from(path)));
        }
        if !is_url(text) {
            return Ok(Self::Local(PathBuf::from(text)));
        }
        let (client, key) = Client::for_url(text)?;
        Ok(Self::Remote(RemoteDir { client, key }))
    }

    #[must_use]
    pub fn join(&self, name: &str) -> Self {
        match self {
            Self::Local(p) => Self::Local(p.join(name)),
            Self::Remote(r) => Self::Remote(r.join(name)),
        }
    }

    pub fn local(&self) -> Option<&Path> {
        match self {
            Self::Local(p) => Some(p),
            Self::Remote(_) => None,
        }
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, Self::Remote(_))
    }

    /// The last part of the path or key (`step-40`).
    pub fn name(&self) -> String {
        match self {
            Self::Local(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Self::Remote(r) => r.key.filename().unwrap_or_default().to_string(),
        }
    }

    /// For error messages, which name paths: the path, or the URL as one.
    pub fn as_path(&self) -> PathBuf {
        match self {
            Self::Local(p) => p.clone(),
            Self::Remote(r) => PathBuf::from(r.url()),
        }
    }
}

impl From<PathBuf> for Location {
    fn from(p: PathBuf) -> Self {
        Self::Local(p)
    }
}

impl From<&Path> for Location {
    fn from(p: &Path) -> Self {
        Self::Local(p.to_path_buf())
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(p) => write!(f, "{}", p.display()),
            Self::Remote(r) => write!(f, "{}", r.url()),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({self})")
    }
}

impl PartialEq for Location {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Local(a), Self::Local(b)) => a == b,
            (Self::Remote(a), Self::Remote(b)) => a.url() == b.url(),
            _ => false,
        }
    }
}
