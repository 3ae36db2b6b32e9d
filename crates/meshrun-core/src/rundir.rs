//! The run directory: the one place a run's plan, events, metrics and logs
//! live (layout in the architecture note). Everything here is append-only or
//! replaced atomically, so a crash never leaves a half-written file.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use serde_json::{json, Value};

use crate::error::{CoreError, UsageError};
use crate::token::Token;

/// `2026-12-02T13:46:30Z`, seconds precision.
pub fn utc_rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `20261202-134630`, for default run names.
pub fn utc_compact(unix_secs: u64) -> String {
    let text = utc_rfc3339(UNIX_EPOCH + Duration::from_secs(unix_secs));
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    format!("{}-{}", &digits[..8], &digits[8..14])
}

/// Seconds since the Unix epoch, as events and metrics record time.
pub fn unix_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
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
    match File::open(root.join(".lock")) {
        Ok(file) => Flock::lock(file, FlockArg::LockSharedNonblock).is_err(),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

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

/// The state to show for a run or an attempt that `run.json` records as
/// `recorded`: `running` without a live controller (see [`lock_is_held`])
/// was cut short, and is `interrupted`.
pub fn shown_state(recorded: &str, live: bool) -> &str {
    if recorded == "running" && !live {
        "interrupted"
    } else {
        recorded
    }
}

/// An open run directory, locked for the lifetime of this value so that no
/// second run can use the same name at once.
pub struct RunDir {
    root: PathBuf,
    _lock: Flock<File>,
    events: File,
    metrics: BufWriter<File>,
}

impl RunDir {
    /// Creates (or reopens, for a run started again under the same name)
    /// the directory and takes its lock. A name held by a live run is a
    /// usage error, and in that case nothing is created or changed.
    pub fn open(root: &Path, name: &str) -> Result<Self, CoreError> {
        let fresh = !root.exists();
        fs::create_dir_all(root).map_err(CoreError::io("cannot create run directory", root))?;
        let lock_path = root.join(".lock");
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
            {
                let sub = "logs";
                let dir = root.join(sub);
                fs::create_dir_all(&dir).map_err(CoreError::io("cannot create", &dir))?;
            }
            let events = append(&root.join("events.jsonl"))?;
            let metrics = BufWriter::new(append(&root.join("metrics.jsonl"))?);
            Ok((events, metrics))
        };
        match setup() {
            Ok((events, metrics)) => Ok(Self {
                root: root.to_path_buf(),
                _lock: lock,
                events,
                metrics,
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
        self.root.join("logs").join(format!("rank-{rank}.log"))
    }

    /// Writes the token where only the run's owner can read it.
    pub fn write_token(&self, token: &Token) -> Result<(), CoreError> {
        let path = self.root.join("token");
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

    /// Replaces `name` atomically (write a temporary file, then rename).
    pub fn write_json(&self, name: &str, value: &Value) -> Result<(), CoreError> {
        let path = self.root.join(name);
        let tmp = self.root.join(format!(".{name}.tmp"));
        let text = serde_json::to_string_pretty(value).expect("json value serializes");
        if let Err(e) = fs::write(&tmp, text + "\n") {
            // A full disk leaves the old file as it was, and no half copy.
            let _ = fs::remove_file(&tmp);
            return Err(CoreError::io("cannot write", &tmp)(e));
        }
        fs::rename(&tmp, &path).map_err(CoreError::io("cannot replace", &path))
    }

    pub fn read_json(&self, name: &str) -> Option<Value> {
        let text = fs::read_to_string(self.root.join(name)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Appends one event to `events.jsonl`, with its time.
    pub fn event(&mut self, event: &str, fields: Value) -> Result<(), CoreError> {
        let mut line = json!({ "time": unix_time(), "event": event });
        if let (Some(obj), Value::Object(extra)) = (line.as_object_mut(), fields) {
            obj.extend(extra);
        }
        writeln!(self.events, "{line}").map_err(CoreError::io(
            "cannot append to",
            self.root.join("events.jsonl"),
        ))
    }

    /// Appends one metrics record; buffered, flushed by [`RunDir::flush`]
    /// (the supervisor does every 250 ms).
    pub fn metrics(&mut self, record: &Value) -> Result<(), CoreError> {
        writeln!(self.metrics, "{record}").map_err(CoreError::io(
            "cannot append to",
            self.root.join("metrics.jsonl"),
        ))
    }

    pub fn flush(&mut self) -> Result<(), CoreError> {
        self.metrics.flush().map_err(CoreError::io(
            "cannot flush",
            self.root.join("metrics.jsonl"),
        ))
    }
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
        assert_eq!(shown_state("running", false), "interrupted");
        assert_eq!(shown_state("running", true), "running");
        assert_eq!(shown_state("failed", false), "failed");
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
        rd.event("started", json!({"attempt": 1})).unwrap();
        let text = fs::read_to_string(rd.path().join("events.jsonl")).unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["event"], "started");
        assert_eq!(v["attempt"], 1);
    }

    #[test]
    fn compact_time() {
        assert_eq!(utc_compact(0), "19700101-000000");
    }
}
