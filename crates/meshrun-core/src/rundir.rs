//! The run directory: the one place a run's plan, events, metrics and logs
//! live (layout in the architecture note). Everything here is append-only or
//! replaced atomically, so a crash never leaves a half-written file.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use meshrun_record::read::lock_is_held;
pub use meshrun_record::{unix_time, utc_rfc3339};

use meshrun_protocol::token::Token;
use meshrun_record::memory::MemoryRecord;
use meshrun_record::{names, EventLine, Goodput, MetricsRecord, RunRecord};
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use crate::error::CoreError;
use meshrun_plan::UsageError;
pub use meshrun_record::utc_compact;

/// Takes the run's lock. A probe of [`lock_is_held`] holds a shared lock
/// for an instant: a few tries apart tell it from a live controller.
fn lock_exclusive(mut file: File) -> Result<Flock<File>, File> {
    for _ in 0..5 {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((back, _)) => file = back,
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(file)
}

/// An open run directory, locked for the lifetime of this value so that no
/// second run can use the same name at once.
pub struct RunDir {
    root: PathBuf,
    _lock: Flock<File>,
    events: File,
    metrics: BufWriter<File>,
    /// `lag.jsonl`, opened at its first line.
    lag: Option<BufWriter<File>>,
    /// `memory.jsonl`, opened at its first line.
    memory: Option<BufWriter<File>>,
}

impl RunDir {
    /// Creates (or reopens, for a run started again under the same name)
    /// the directory and takes its lock. A name held by a live run is a
    /// usage error, and in that case nothing is created or changed.
    pub fn open(root: &Path, name: &str) -> Result<Self, CoreError> {
        let fresh = !root.exists();
        fs::create_dir_all(root).map_err(CoreError::io("cannot create run directory", root))?;
        let lock_path = root.join(names::LOCK);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(CoreError::io("cannot open lock file", &lock_path))?;
        let mut lock = match lock_exclusive(lock_file) {
            Ok(lock) => lock,
            Err(file) => {
                drop(file);
                let pid = fs::read_to_string(&lock_path).unwrap_or_default();
                return Err(UsageError::NameInUse {
                    name: name.to_string(),
                    pid: pid.trim().to_string(),
                    path: root.to_path_buf(),
                }
                .into());
            }
        };
        let mut setup = || -> Result<(File, BufWriter<File>), CoreError> {
            lock.set_len(0)
                .map_err(CoreError::io("cannot write lock file", &lock_path))?;
            write!(&mut *lock, "{}", std::process::id())
                .map_err(CoreError::io("cannot write lock file", &lock_path))?;
            let logs = root.join(names::LOGS);
            fs::create_dir_all(&logs).map_err(CoreError::io("cannot create", &logs))?;
            let events = append(&root.join(names::EVENTS))?;
            let metrics = BufWriter::new(append(&root.join(names::METRICS))?);
            Ok((events, metrics))
        };
        match setup() {
            Ok((events, metrics)) => Ok(Self {
                root: root.to_path_buf(),
                _lock: lock,
                events,
                metrics,
                lag: None,
                memory: None,
            }),
            Err(e) => {
                if fresh {
                    let _ = fs::remove_dir_all(root);
                }
                Err(e)
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn log_path(&self, rank: u32) -> PathBuf {
        names::log_path(&self.root, rank)
    }

    /// Writes the token where only the run's owner can read it.
    pub fn write_token(&self, token: &Token) -> Result<(), CoreError> {
        let path = self.root.join(names::TOKEN);
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(CoreError::io("cannot write token file", &path))?;
        f.write_all(token.to_hex().as_bytes())
            .map_err(CoreError::io("cannot write token file", &path))
    }

    /// Replaces `run.json`.
    pub fn write_run(&self, record: &RunRecord) -> Result<(), CoreError> {
        self.replace(names::RUN_JSON, record)
    }

    /// Replaces `goodput.json`.
    pub fn write_goodput(&self, goodput: &Goodput) -> Result<(), CoreError> {
        self.replace(names::GOODPUT, goodput)
    }

    /// Replaces `name` atomically (write a temporary file, then rename).
    fn replace<T: Serialize>(&self, name: &str, value: &T) -> Result<(), CoreError> {
        let path = self.root.join(name);
        let tmp = self.root.join(format!(".{name}.tmp"));
        let text = serde_json::to_string_pretty(value).expect("run records serialize");
        if let Err(e) = fs::write(&tmp, text + "\n") {
            // A full disk leaves the old file as it was, and no half copy.
            let _ = fs::remove_file(&tmp);
            return Err(CoreError::io("cannot write", &tmp)(e));
        }
        fs::rename(&tmp, &path).map_err(CoreError::io("cannot replace", &path))
    }

    /// Appends one event to `events.jsonl`, with the time now.
    pub fn event(&mut self, event: meshrun_record::Event) -> Result<(), CoreError> {
        let line = EventLine {
            time: unix_time(),
            event,
        };
        let text = serde_json::to_string(&line).expect("events serialize");
        writeln!(self.events, "{text}").map_err(CoreError::io(
            "cannot append to",
            self.root.join(names::EVENTS),
        ))
    }

    /// Appends one metrics record; buffered, flushed by [`RunDir::flush`]
    /// (the driver does every 250 ms).
    pub fn metrics(&mut self, record: &MetricsRecord) -> Result<(), CoreError> {
        let text = serde_json::to_string(record).expect("metrics serialize");
        writeln!(self.metrics, "{text}").map_err(CoreError::io(
            "cannot append to",
            self.root.join(names::METRICS),
        ))
    }

    /// Appends one line to `lag.jsonl`; buffered like metrics.
    pub fn lag(&mut self, record: &meshrun_record::LagRecord) -> Result<(), CoreError> {
        append_line(&mut self.lag, &self.root.join(names::LAG), record)
    }

    /// Appends one line to `memory.jsonl`; buffered like metrics.
    pub fn memory(&mut self, record: &MemoryRecord) -> Result<(), CoreError> {
        append_line(&mut self.memory, &self.root.join(names::MEMORY), record)
    }

    pub fn flush(&mut self) -> Result<(), CoreError> {
        if let Some(memory) = &mut self.memory {
            memory
                .flush()
                .map_err(CoreError::io("cannot flush", self.root.join(names::MEMORY)))?;
        }
        if let Some(lag) = &mut self.lag {
            lag.flush()
                .map_err(CoreError::io("cannot flush", self.root.join(names::LAG)))?;
        }
        self.metrics.flush().map_err(CoreError::io(
            "cannot flush",
            self.root.join(names::METRICS),
        ))
    }
}

/// Appends `record` as a JSON line to the file at `path`, opened (into
/// `out`) at its first line.
fn append_line<T: Serialize>(
    out: &mut Option<BufWriter<File>>,
    path: &Path,
    record: &T,
) -> Result<(), CoreError> {
    let out = match out {
        Some(out) => out,
        None => out.insert(BufWriter::new(append(path)?)),
    };
    let text = serde_json::to_string(record).expect("run records serialize");
    writeln!(out, "{text}").map_err(CoreError::io("cannot append to", path))
}

fn append(path: &Path) -> Result<File, CoreError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(CoreError::io("cannot open for appending", path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn second_open_of_a_live_run_is_name_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        let first = RunDir::open(&root, "r").unwrap();
        let err = RunDir::open(&root, "r").err().unwrap();
        let text = err.to_string();
        assert!(text.contains("in use by a running run"), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        drop(first);
        RunDir::open(&root, "r").unwrap();
    }

    #[test]
    fn the_lock_probe_sees_a_live_run_without_disturbing_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        assert!(!lock_is_held(&root), "no folder, no controller");
        let first = RunDir::open(&root, "r").unwrap();
        assert!(lock_is_held(&root));
        assert!(lock_is_held(&root), "probing twice changes nothing");
        assert!(
            RunDir::open(&root, "r").is_err(),
            "the probe left the lock held"
        );
        drop(first);
        assert!(!lock_is_held(&root), "a lock nobody holds");
        let again = RunDir::open(&root, "r").unwrap();
        assert!(lock_is_held(&root), "the probe left no lock behind");
        drop(again);
    }

    #[test]
    fn token_file_is_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let rd = RunDir::open(&dir.path().join("r"), "r").unwrap();
        rd.write_token(&Token::generate().unwrap()).unwrap();
        let mode = fs::metadata(rd.path().join("token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn events_are_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut rd = RunDir::open(&dir.path().join("r"), "r").unwrap();
        rd.event(meshrun_record::Event::RetentionFailed {
            error: "disk".into(),
        })
        .unwrap();
        let text = fs::read_to_string(rd.path().join("events.jsonl")).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["event"], "retention_failed");
        assert_eq!(v["error"], "disk");
        assert!(v["time"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn compact_time() {
        assert_eq!(utc_compact(0), "19700101-000000");
    }
}
