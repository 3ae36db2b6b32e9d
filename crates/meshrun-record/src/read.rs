//! Reading a run directory back, from any process and at any moment: the
//! controller may be appending to a file while it is read, so a JSONL line
//! that does not parse (typically the last, half-written one) is counted
//! and skipped, while a JSON file (replaced atomically) must parse whole.

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::names;
use crate::run::RunRecord;

/// A file of a run directory that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl ReadError {
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Io { path, .. } | ReadError::Parse { path, .. } => path,
        }
    }
}

/// Whether a live process holds the run's lock, that is, whether a
/// controller is still running it. `run.json` alone cannot tell: a
/// controller killed with SIGKILL leaves it saying `running` for ever, and
/// the pid in the lock file may by now be another process's. The kernel
/// drops a flock with the last descriptor of its holder, so a shared,
/// non-blocking lock that is granted proves that no controller is there; it
/// is released at once, and a live run's exclusive lock is never touched. A
/// folder without a lock file has no controller; when the probe itself
/// fails (no permission, a file system without flock), `run.json` is
/// believed.
pub fn lock_is_held(root: &Path) -> bool {
    match File::open(root.join(names::LOCK)) {
        Ok(file) => {
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock).is_err()
        }
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// A JSON file, `None` when it does not exist.
pub fn json_file<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, ReadError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ReadError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| ReadError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

/// `run.json` of the run directory `root`.
pub fn run_record(root: &Path) -> Result<Option<RunRecord>, ReadError> {
    json_file(&root.join(names::RUN_JSON))
}

/// Calls `each` with every line of a JSONL file that parses as `T`, one at
/// a time (a long run's metrics have millions of lines); returns how many
/// non-blank lines did not. A missing file has no lines.
pub fn jsonl_each<T: DeserializeOwned>(
    path: &Path,
    mut each: impl FnMut(T),
) -> Result<usize, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(e)),
    };
    let mut skipped = 0;
    for line in BufReader::new(file).split(b'\n') {
        let line = line.map_err(io)?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<T>(&line) {
            Ok(value) => each(value),
            Err(_) => skipped += 1,
        }
    }
    Ok(skipped)
}

/// What a follower of a JSONL file being appended to has not read yet:
/// the lines from byte `offset` up to the last complete one that parse as
/// `T`, the offset to continue from (a line still being written is left
/// for the next call), and how many complete lines did not parse.
pub fn jsonl_from<T: DeserializeOwned>(
    path: &Path,
    offset: u64,
) -> Result<(Vec<T>, u64, usize), ReadError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok((Vec::new(), offset, 0)),
        Err(e) => return Err(io(e)),
    };
    file.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io)?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let (mut out, mut skipped) = (Vec::new(), 0);
    for line in bytes[..complete].split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<T>(line) {
            Ok(v) => out.push(v),
            Err(_) => skipped += 1,
        }
    }
    Ok((out, offset + complete as u64, skipped))
}

/// Every line of a JSONL file that parses as `T`, and how many did not.
pub fn jsonl<T: DeserializeOwned>(path: &Path) -> Result<(Vec<T>, usize), ReadError> {
    let mut out = Vec::new();
    let skipped = jsonl_each(path, |v| out.push(v))?;
    Ok((out, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventLine};

    #[test]
    fn a_half_written_last_line_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(names::EVENTS);
        std::fs::write(
            &path,
            "{\"time\":1.0,\"event\":\"launched\",\"attempt\":1,\"coordinator\":\"a:1\"}\n\n{\"time\":2.0,\"ev",
        )
        .unwrap();
        let (lines, skipped) = jsonl::<EventLine>(&path).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(lines.len(), 1);
        assert!(matches!(lines[0].event, Event::Launched { attempt: 1, .. }));
        let (none, zero) = jsonl::<EventLine>(&dir.path().join("missing")).unwrap();
        assert!(none.is_empty() && zero == 0);
    }

    #[test]
    fn a_follower_reads_complete_lines_and_comes_back_for_the_rest() {
        use crate::MetricsRecord;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(names::METRICS);
        let one = "{\"time\":1.0,\"attempt\":1,\"step\":1,\"metrics\":{\"loss\":2.0}}\n";
        let half = "{\"time\":2.0,\"attempt\":1,";
        std::fs::write(&path, format!("{one}not json\n{half}")).unwrap();
        let (records, next, skipped) = jsonl_from::<MetricsRecord>(&path, 0).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].number("loss"), Some(2.0));
        assert_eq!(skipped, 1);
        assert_eq!(next as usize, one.len() + "not json\n".len());
        let rest = "\"step\":2,\"metrics\":{}}\n";
        std::fs::write(&path, format!("{one}not json\n{half}{rest}")).unwrap();
        let (records, end, _) = jsonl_from::<MetricsRecord>(&path, next).unwrap();
        assert_eq!(records.len(), 1, "the finished line is read once");
        assert_eq!(records[0].step, Some(2));
        assert_eq!(end, std::fs::metadata(&path).unwrap().len());
    }

    #[test]
    fn a_broken_json_file_is_a_parse_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(run_record(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join(names::RUN_JSON), "{not json").unwrap();
        let err = run_record(dir.path()).unwrap_err();
        assert!(matches!(err, ReadError::Parse { .. }));
        let text = err.to_string();
        assert!(
            text.contains("cannot parse") && text.contains("run.json"),
            "{text}"
        );
    }
}
