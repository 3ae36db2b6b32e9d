//! Compiled programs that travel between a run's attempts.
//!
//! A process that compiled a jitted function leaves the serialized
//! executable in its host's run folder (`executables/<key>.xla`, in the
//! host's scratch folder, which outlives the worker and goes with the run);
//! a restarted process or a warm spare loads it instead of tracing and
//! compiling. The payload is JAX's (a pickle around XLA's serialized
//! executable), so it is loaded only when whole: the file carries its
//! key, its length and a CRC-32C, and anything that does not match is
//! refused with the reason, never handed to JAX.
//!
//! File: [`MAGIC`], the header's length (u32, little-endian), the header
//! (JSON: [`Header`]), then the payload.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A run's executables, in its folder of a host's scratch folder.
pub const EXECUTABLES: &str = "executables";

pub const MAGIC: &[u8; 8] = b"MRXLA01\n";

/// Headers beyond this are not meshrun's (a key, two numbers, the meta).
const MAX_HEADER: u32 = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
pub struct Header {
    pub key: String,
    pub bytes: u64,
    pub crc32c: u32,
    /// What the caller keeps beside the payload (JSON text).
    pub meta: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutableError {
    #[error("the executable key {key:?} is not a hex digest (16 to 128 hex digits)")]
    BadKey { key: String },
    #[error("the executable '{path}' is damaged: {why}")]
    Damaged { path: PathBuf, why: String },
    #[error("cannot read the executable '{path}': {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the executable '{path}': {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `executables/` in a run's scratch folder.
pub fn dir(run_scratch: &Path) -> PathBuf {
    run_scratch.join(EXECUTABLES)
}

fn path(run_scratch: &Path, key: &str) -> Result<PathBuf, ExecutableError> {
    let ok = (16..=128).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    if !ok {
        return Err(ExecutableError::BadKey { key: key.into() });
    }
    Ok(dir(run_scratch).join(format!("{key}.xla")))
}

/// Writes the executable of `key` (whole or not at all: a temporary file
/// renamed into place); gives the file's bytes.
pub fn write(
    run_scratch: &Path,
    key: &str,
    meta: &str,
    payload: &[u8],
) -> Result<u64, ExecutableError> {
    let path = path(run_scratch, key)?;
    let header = serde_json::to_vec(&Header {
        key: key.into(),
        bytes: payload.len() as u64,
        crc32c: crc32c::crc32c(payload),
        meta: meta.into(),
    })
    .expect("a header serializes");
    let tmp = path.with_extension(format!("xla.tmp-{}", std::process::id()));
    let werr = |source| ExecutableError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir(run_scratch)).map_err(werr)?;
    let written = (|| {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        f.write_all(MAGIC)?;
        f.write_all(&(header.len() as u32).to_le_bytes())?;
        f.write_all(&header)?;
        f.write_all(payload)?;
        f.into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(werr(e));
    }
    Ok((MAGIC.len() + 4 + header.len() + payload.len()) as u64)
}

/// The executable of `key` and its meta, `None` when there is none; an
/// error says why a file that is there cannot be used.
pub fn read(run_scratch: &Path, key: &str) -> Result<Option<(String, Vec<u8>)>, ExecutableError> {
    let path = path(run_scratch, key)?;
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ExecutableError::Read { path, source }),
    };
    let damaged = |why: String| ExecutableError::Damaged {
        path: path.clone(),
        why,
    };
    let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err(damaged(
            "it does not start as meshrun's executables do".into(),
        ));
    };
    if rest.len() < 4 {
        return Err(damaged(format!(
            "{} bytes, cut before its header",
            bytes.len()
        )));
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
    if len > MAX_HEADER || rest.len() - 4 < len as usize {
        return Err(damaged(format!(
            "its header of {len} bytes does not fit in {} bytes",
            bytes.len()
        )));
    }
    let (header, payload) = rest[4..].split_at(len as usize);
    let header: Header = serde_json::from_slice(header)
        .map_err(|e| damaged(format!("its header does not parse: {e}")))?;
    if header.key != key {
        return Err(damaged(format!("it holds key {}", header.key)));
    }
    if payload.len() as u64 != header.bytes {
        return Err(damaged(format!(
            "{} bytes of payload where its header says {}",
            payload.len(),
            header.bytes
        )));
    }
    let crc = crc32c::crc32c(payload);
    if crc != header.crc32c {
        return Err(damaged(format!(
            "CRC-32C {crc:08x} where its header says {:08x}",
            header.crc32c
        )));
    }
    Ok(Some((header.meta, payload.to_vec())))
}

/// Every executable of the run on this host, as (key, meta), from the
/// headers alone (a restarted process loads its own ahead of its first
/// call). A file that is not whole is left out: reading it by its key
/// says why.
pub fn list(run_scratch: &Path) -> Result<Vec<(String, String)>, ExecutableError> {
    let dir = dir(run_scratch);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(source) => return Err(ExecutableError::Read { path: dir, source }),
    };
    let mut found = vec![];
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "xla") {
            if let Some(header) = read_header(&path) {
                found.push((header.key, header.meta));
            }
        }
    }
    found.sort();
    Ok(found)
}

fn read_header(path: &Path) -> Option<Header> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path).ok()?;
    let mut start = [0u8; 12];
    f.read_exact(&mut start).ok()?;
    if &start[..8] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(start[8..].try_into().expect("4 bytes"));
    if len > MAX_HEADER {
        return None;
    }
    let mut header = vec![0; len as usize];
    f.read_exact(&mut header).ok()?;
    serde_json::from_slice(&header).ok()
}

/// Removes the executable of `key`, if there is one (it was found stale).
pub fn remove(run_scratch: &Path, key: &str) -> Result<(), ExecutableError> {
    let path = path(run_scratch, key)?;
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(ExecutableError::Write { path, source: e })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    fn file(dir: &Path) -> PathBuf {
        path(dir, KEY).unwrap()
    }

    #[test]
    fn an_executable_reads_back_with_its_meta() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(read(tmp.path(), KEY).unwrap().is_none());
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let n = write(tmp.path(), KEY, r#"{"f":"x"}"#, &payload).unwrap();
        assert_eq!(n, std::fs::metadata(file(tmp.path())).unwrap().len());
        let (meta, back) = read(tmp.path(), KEY).unwrap().unwrap();
        assert_eq!((meta.as_str(), back), (r#"{"f":"x"}"#, payload));
        let other = "fedcba9876543210fedcba9876543210";
        write(tmp.path(), other, "{}", b"y").unwrap();
        std::fs::write(dir(tmp.path()).join("cut.xla"), &MAGIC[..5]).unwrap();
        let listed = list(tmp.path()).unwrap();
        assert_eq!(
            listed,
            [
                (KEY.into(), r#"{"f":"x"}"#.into()),
                (other.into(), "{}".into())
            ]
        );
        remove(tmp.path(), KEY).unwrap();
        assert!(read(tmp.path(), KEY).unwrap().is_none());
        remove(tmp.path(), KEY).unwrap();
    }

    #[test]
    fn a_truncated_flipped_or_renamed_executable_is_refused_with_the_reason() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), KEY, "{}", &[7u8; 4096]).unwrap();
        let whole = std::fs::read(file(tmp.path())).unwrap();
        let cases: [(&str, Vec<u8>); 4] = [
            ("payload", whole[..whole.len() - 1].to_vec()),
            ("header", whole[..10].to_vec()),
            ("CRC-32C", {
                let mut b = whole.clone();
                let last = b.len() - 1;
                b[last] ^= 1;
                b
            }),
            ("start", b"\x80\x04pickle".to_vec()),
        ];
        for (said, bytes) in cases {
            std::fs::write(file(tmp.path()), &bytes).unwrap();
            let err = read(tmp.path(), KEY).unwrap_err().to_string();
            assert!(
                err.contains("is damaged") && err.contains(said),
                "{said}: {err}"
            );
        }
        // Another key's file under this key's name.
        let other = "fedcba9876543210fedcba9876543210";
        write(tmp.path(), other, "{}", b"x").unwrap();
        std::fs::rename(path(tmp.path(), other).unwrap(), file(tmp.path())).unwrap();
        let err = read(tmp.path(), KEY).unwrap_err().to_string();
        assert!(err.contains(&format!("holds key {other}")), "{err}");
    }

    #[test]
    fn a_key_that_is_not_a_digest_names_no_file() {
        let tmp = tempfile::tempdir().unwrap();
        for key in ["../../etc/passwd", "ABCDEF0123456789", "short", ""] {
            let err = write(tmp.path(), key, "{}", b"x").unwrap_err();
            assert!(matches!(err, ExecutableError::BadKey { .. }), "{key}");
        }
    }
}
