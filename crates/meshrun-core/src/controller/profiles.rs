//! Profile captures: the traces each rank takes with `jax.profiler` come
//! over its control connection (hosts share nothing) and are written into
//! the run folder, `profiles/<capture>/rank-R/`, as the rank's profiler
//! laid them out; each rank's `XPlane` is also linked as
//! `profiles/<capture>/tensorboard/plugins/profile/<capture>/rank-R.xplane.pb`,
//! the layout in which `TensorBoard`'s profile plugin shows every rank of the
//! capture as one run with a host per rank (its trace viewer takes several
//! hosts on one timeline). That folder holds nothing else, so the plugin
//! lists no other run.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use meshrun_record::names;

use meshrun_machine::captures::{Captures as Book, Ended};
use meshrun_machine::Conn;

/// A file being received from a rank.
struct Incoming {
    file: Option<File>,
    left: u64,
}

/// Ranks whose files of the capture under way could not be written here,
/// and why: their trace is missing, not saved.
type Unwritten = BTreeMap<u32, String>;

/// A capture that ended: what to record and whom to tell.
#[derive(Debug)]
pub struct Saved {
    pub dir: PathBuf,
    pub ranks: Vec<u32>,
    pub missing: Vec<(u32, String)>,
    pub requester: Option<Conn>,
}

/// The run's captures: what is decided (which ranks are owed, what is
/// missing, the once-per-run captures) is the machine's
/// [`meshrun_machine::captures::Captures`]; here, the folder and the files.
#[derive(Default)]
pub struct Captures {
    book: Book,
    /// The folder of the capture under way.
    dir: Option<PathBuf>,
    incoming: BTreeMap<u32, Incoming>,
    unwritten: Unwritten,
}

impl Captures {
    /// The folder of the capture under way (one at a time: every rank
    /// traces the same steps).
    pub fn busy(&self) -> Option<&Path> {
        self.book.busy().and(self.dir.as_deref())
    }

    /// The decisions about captures, read-only.
    pub fn book(&self) -> &Book {
        &self.book
    }

    /// The decisions about captures.
    pub fn book_mut(&mut self) -> &mut Book {
        &mut self.book
    }

    /// Begins a capture named after the time `now` into the run folder
    /// `root`; returns its name and folder. The caller has checked none is
    /// under way.
    pub fn start(
        &mut self,
        root: &Path,
        now: std::time::SystemTime,
        ranks: &[u32],
        requester: Option<Conn>,
    ) -> (String, PathBuf) {
        let stamp = humantime::format_rfc3339_seconds(now)
            .to_string()
            .replace(['-', ':'], "")
            .replace('T', "-")
            .trim_end_matches('Z')
            .to_string();
        let mut name = stamp.clone();
        let mut n = 1;
        while names::profile_dir(root, &name).exists() {
            n += 1;
            name = format!("{stamp}-{n}");
        }
        let dir = names::profile_dir(root, &name);
        self.incoming.clear();
        self.unwritten.clear();
        let started = self.book.start(&name, ranks, requester);
        debug_assert!(started, "one capture at a time");
        self.dir = Some(dir.clone());
        (name, dir)
    }

    /// A `ProfileFile` from `rank`: its bytes follow in raw frames.
    pub fn file(&mut self, rank: u32, capture: &str, name: &str, size: u64) {
        let dir = self.dir.as_ref().filter(|_| self.book.is_active(capture));
        let Some(dir) = dir else {
            // A capture given up on: the bytes that follow are skipped.
            if size > 0 {
                self.incoming.insert(
                    rank,
                    Incoming {
                        file: None,
                        left: size,
                    },
                );
            }
            return;
        };
        let file = match safe_relative(name) {
            None => Err(format!("it named a file '{name}' outside its folder")),
            Some(rel) => {
                let path = dir.join(format!("rank-{rank}")).join(rel);
                path.parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| File::create(&path))
                    .map_err(|e| format!("cannot write '{}': {e}", path.display()))
            }
        };
        let file = match file {
            Ok(f) => Some(f),
            Err(why) => {
                self.unwritten.entry(rank).or_insert(why);
                None
            }
        };
        // An empty file has no bytes to wait for.
        if size > 0 {
            self.incoming.insert(rank, Incoming { file, left: size });
        }
    }

    /// Raw bytes from `rank`, of the file it announced.
    pub fn bytes(&mut self, rank: u32, data: &[u8]) {
        let Some(inc) = self.incoming.get_mut(&rank) else {
            return;
        };
        let take = data
            .len()
            .min(usize::try_from(inc.left).unwrap_or(usize::MAX));
        if let Some(f) = &mut inc.file {
            if let Err(e) = f.write_all(&data[..take]) {
                inc.file = None;
                if self.book.busy().is_some() {
                    self.unwritten
                        .entry(rank)
                        .or_insert_with(|| format!("writing its trace failed: {e}"));
                }
            }
        }
        inc.left -= take as u64;
        if inc.left == 0 {
            self.incoming.remove(&rank);
        }
    }

    /// `rank` sent all it had of `capture` (or failed to take it): whole
    /// unless it said why, a file came short or could not be written.
    pub fn rank_done(&mut self, rank: u32, capture: &str, error: Option<String>) -> Option<Saved> {
        if !self.book.is_active(capture) {
            return None;
        }
        // Taken whatever the error, so no stale entry is left behind.
        let unwritten = self.unwritten.remove(&rank);
        let error = error
            .or_else(|| {
                self.incoming
                    .contains_key(&rank)
                    .then(|| "its trace came incomplete".to_string())
            })
            .or(unwritten);
        let ended = self.book.rank_done(rank, capture, error)?;
        Some(self.saved(ended))
    }

    /// The attempt is ending: ranks that have not sent their trace never
    /// will (`why`).
    pub fn give_up(&mut self, why: &str) -> Option<Saved> {
        let ended = self.book.give_up(why)?;
        Some(self.saved(ended))
    }

    fn saved(&mut self, ended: Ended) -> Saved {
        self.incoming.clear();
        self.unwritten.clear();
        let dir = self.dir.take().unwrap_or_default();
        link_for_tensorboard(&dir, &ended.name, &ended.ranks);
        Saved {
            dir,
            ranks: ended.ranks,
            missing: ended.missing,
            requester: ended.requester,
        }
    }
}

/// A path a worker named, if it stays inside the folder it is joined to.
fn safe_relative(name: &str) -> Option<PathBuf> {
    let path = Path::new(name);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && !name.is_empty()).then(|| path.to_path_buf())
}

/// `tensorboard/plugins/profile/<capture>/rank-R.xplane.pb`, hard links
/// (or copies) of each rank's `XPlane`: `TensorBoard`'s profile plugin names a
/// run's hosts after these files.
fn link_for_tensorboard(dir: &Path, capture: &str, ranks: &[u32]) {
    let tb = dir
        .join(names::PROFILE_TENSORBOARD)
        .join("plugins")
        .join("profile")
        .join(capture);
    for &rank in ranks {
        let Some(xplane) = find_file(&dir.join(format!("rank-{rank}")), ".xplane.pb") else {
            continue;
        };
        if std::fs::create_dir_all(&tb).is_err() {
            return;
        }
        let link = tb.join(format!("rank-{rank}.xplane.pb"));
        if std::fs::hard_link(&xplane, &link).is_err() {
            let _ = std::fs::copy(&xplane, &link);
        }
    }
}

/// The first file under `dir` whose name ends in `suffix`.
pub fn find_file(dir: &Path, suffix: &str) -> Option<PathBuf> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&d)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                pending.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                return Some(path);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_from_each_rank_land_in_its_folder_and_link_for_tensorboard() {
        let root = tempfile::tempdir().unwrap();
        let mut c = Captures::default();
        let (name, dir) = c.start(
            root.path(),
            std::time::SystemTime::UNIX_EPOCH,
            &[0, 1],
            Some(9),
        );
        assert_eq!(name, "19700101-000000");
        assert!(c.busy().is_some());
        for rank in [0, 1] {
            c.file(rank, &name, "plugins/profile/x/h.xplane.pb", 6);
            c.bytes(rank, b"abc");
            c.bytes(rank, b"def");
        }
        assert!(c.rank_done(0, &name, None).is_none());
        let saved = c.rank_done(1, &name, None).unwrap();
        assert_eq!((saved.ranks, saved.requester), (vec![0, 1], Some(9)));
        let tb = dir.join("tensorboard/plugins/profile").join(&name);
        assert_eq!(
            std::fs::read(tb.join("rank-1.xplane.pb")).unwrap(),
            b"abcdef"
        );
        assert!(c.busy().is_none());
        let (again, _) = c.start(root.path(), std::time::SystemTime::UNIX_EPOCH, &[0], None);
        assert_eq!(again, "19700101-000000-2");
    }

    #[test]
    fn ranks_that_send_nothing_are_missing_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let mut c = Captures::default();
        let (name, _) = c.start(
            root.path(),
            std::time::SystemTime::UNIX_EPOCH,
            &[0, 1, 2],
            None,
        );
        c.rank_done(0, &name, None);
        c.file(1, &name, "t.json.gz", 10);
        c.bytes(1, b"abc");
        assert!(c.rank_done(1, &name, None).is_none());
        let saved = c.give_up("the attempt ended").unwrap();
        assert_eq!(saved.ranks, vec![0]);
        assert_eq!(
            saved.missing,
            vec![
                (1, "its trace came incomplete".into()),
                (2, "the attempt ended".into())
            ]
        );
    }

    #[test]
    fn a_file_not_written_makes_its_rank_missing_and_an_empty_file_is_whole() {
        let root = tempfile::tempdir().unwrap();
        let mut c = Captures::default();
        let (name, dir) = c.start(
            root.path(),
            std::time::SystemTime::UNIX_EPOCH,
            &[0, 1, 2],
            None,
        );
        // Rank 0's last file is empty: nothing follows it, and it is whole.
        c.file(0, &name, "h.xplane.pb", 3);
        c.bytes(0, b"abc");
        c.file(0, &name, "empty.json", 0);
        assert!(c.rank_done(0, &name, None).is_none());
        // Rank 1 names a path outside its folder.
        c.file(1, &name, "../../escape", 3);
        c.bytes(1, b"xyz");
        assert!(c.rank_done(1, &name, None).is_none());
        // Rank 2's folder cannot be made: a file stands in its place.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rank-2"), b"").unwrap();
        c.file(2, &name, "t.json.gz", 2);
        c.bytes(2, b"ab");
        let saved = c.rank_done(2, &name, None).unwrap();
        assert_eq!(saved.ranks, vec![0]);
        assert_eq!(saved.missing.len(), 2, "{:?}", saved.missing);
        assert_eq!(
            saved.missing[0],
            (
                1,
                "it named a file '../../escape' outside its folder".into()
            )
        );
        assert!(
            saved.missing[1].0 == 2 && saved.missing[1].1.starts_with("cannot write '"),
            "{:?}",
            saved.missing
        );
        assert!(dir.join("rank-0/empty.json").exists());
        assert!(
            !root.path().join("escape").exists() && !dir.join("escape").exists(),
            "names stay inside the capture"
        );
    }
}
