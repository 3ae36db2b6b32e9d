//! The ranks' log files, `logs/rank-R.log`, with at most [`OPEN_LOGS`] of
//! them open at once. A controller of 10,000 ranks that kept every log
//! open held 10,000 descriptors beside its 11,250 connections, past many
//! systems' limit; a rank's log is opened again (appending) when it writes
//! after being closed for others.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::path::PathBuf;

use crate::error::CoreError;

/// Logs kept open: every log of a run up to this size, so that a small
/// run never reopens one.
pub const OPEN_LOGS: usize = 512;

pub struct RankLogs {
    paths: Vec<PathBuf>,
    /// Open logs, each with when it was last written (in writes).
    open: HashMap<u32, (LineWriter<File>, u64)>,
    writes: u64,
    limit: usize,
}

fn append(path: &PathBuf) -> std::io::Result<LineWriter<File>> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(LineWriter::new)
}

impl RankLogs {
    /// Creates (or appends to) every rank's log and writes the attempt's
    /// header in each, so a rank that never prints still has its log and
    /// a log that cannot be written is known before anything runs.
    pub fn open(paths: &[PathBuf], attempt: u32, started: &str) -> Result<Self, CoreError> {
        Self::with_limit(paths, attempt, started, OPEN_LOGS)
    }

    fn with_limit(
        paths: &[PathBuf],
        attempt: u32,
        started: &str,
        limit: usize,
    ) -> Result<Self, CoreError> {
        let mut logs = Self {
            paths: paths.to_vec(),
            open: HashMap::with_capacity(paths.len().min(limit)),
            writes: 0,
            limit: limit.max(1),
        };
        for (rank, path) in paths.iter().enumerate() {
            let mut file = append(path).map_err(CoreError::io("cannot open log", path))?;
            writeln!(
                file,
                "===== meshrun attempt {attempt}, rank {rank}, started {started} ====="
            )
            .map_err(CoreError::io("cannot write log", path))?;
            if logs.open.len() < logs.limit {
                logs.open.insert(rank as u32, (file, 0));
            } else {
                file.flush()
                    .map_err(CoreError::io("cannot write log", path))?;
            }
        }
        Ok(logs)
    }

    /// Appends `bytes` to rank's log. A full disk or a log gone must not
    /// stop supervision: errors are dropped (the terminal still shows it).
    pub fn write(&mut self, rank: u32, bytes: &[u8]) {
        if let Some(file) = self.file(rank) {
            let _ = file.write_all(bytes);
        }
    }

    /// Appends `line` and a newline to rank's log.
    pub fn line(&mut self, rank: u32, line: &str) {
        if let Some(file) = self.file(rank) {
            let _ = file
                .write_all(line.as_bytes())
                .and_then(|()| file.write_all(b"\n"));
        }
    }

    fn file(&mut self, rank: u32) -> Option<&mut LineWriter<File>> {
        let path = self.paths.get(rank as usize)?;
        self.writes += 1;
        if !self.open.contains_key(&rank) {
            // Close first, open after: short of descriptors, the one
            // closed is the one this open needs.
            if self.open.len() >= self.limit {
                // The least recently written goes (a scan of the open
                // ones, only when a closed log is written).
                if let Some(&oldest) = self
                    .open
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(r, _)| r)
                {
                    self.open.remove(&oldest);
                }
            }
            let file = append(path).ok()?;
            self.open.insert(rank, (file, 0));
        }
        let (file, at) = self.open.get_mut(&rank)?;
        *at = self.writes;
        Some(file)
    }

    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_limit_logs_are_reopened_and_keep_every_line_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let paths: Vec<_> = (0..10)
            .map(|r| tmp.path().join(format!("rank-{r}.log")))
            .collect();
        let mut logs = RankLogs::with_limit(&paths, 1, "t", 3).unwrap();
        assert_eq!(logs.open_count(), 3);
        for round in 0..3 {
            for rank in 0..10 {
                logs.write(rank, format!("line {round} of {rank}\n").as_bytes());
                assert!(logs.open_count() <= 3);
            }
        }
        drop(logs);
        let mut again = RankLogs::with_limit(&paths, 2, "u", 3).unwrap();
        again.write(7, b"late\n");
        drop(again);
        for (rank, path) in paths.iter().enumerate() {
            let text = std::fs::read_to_string(path).unwrap();
            let mut want = vec![format!(
                "===== meshrun attempt 1, rank {rank}, started t ====="
            )];
            want.extend((0..3).map(|round| format!("line {round} of {rank}")));
            want.push(format!(
                "===== meshrun attempt 2, rank {rank}, started u ====="
            ));
            if rank == 7 {
                want.push("late".into());
            }
            assert_eq!(text, want.join("\n") + "\n", "rank {rank}");
        }
    }

    #[test]
    fn a_log_that_cannot_be_created_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("missing").join("rank-0.log");
        let err = RankLogs::open(std::slice::from_ref(&path), 1, "t")
            .err()
            .expect("an error");
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
