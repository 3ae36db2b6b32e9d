//! Worker output: every line goes to `logs/rank-R.log` (each attempt
//! appended under a header) and, for the ranks being teed, to the terminal.
//! The last lines of each rank are kept for the failure summary.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::path::PathBuf;

use indicatif::ProgressBar;

use crate::error::CoreError;
use crate::plan::Tee;
use crate::protocol::Stream;

const TAIL_KEEP: usize = 40;

pub struct Output {
    tee: Tee,
    /// Lines are printed above the progress bar, which is redrawn under them.
    bar: Option<ProgressBar>,
    files: Vec<LineWriter<File>>,
    tails: Vec<VecDeque<String>>,
}

impl Output {
    /// Opens every rank's log for appending and writes the attempt header.
    pub fn open(
        tee: Tee,
        paths: &[PathBuf],
        attempt: u32,
        started: &str,
    ) -> Result<Self, CoreError> {
        let mut files = Vec::with_capacity(paths.len());
        for (rank, path) in paths.iter().enumerate() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(CoreError::io("cannot open log", path))?;
            let mut file = LineWriter::new(file);
            writeln!(
                file,
                "===== meshrun attempt {attempt}, rank {rank}, started {started} ====="
            )
            .map_err(CoreError::io("cannot write log", path))?;
            files.push(file);
        }
        Ok(Self {
            tee,
            bar: None,
            tails: vec![VecDeque::with_capacity(TAIL_KEEP); paths.len()],
            files,
        })
    }

    pub fn line(&mut self, rank: u32, stream: Stream, line: &str) {
        let r = rank as usize;
        if let Some(file) = self.files.get_mut(r) {
            // A full disk must not stop supervision; the terminal still shows it.
            let _ = writeln!(file, "{line}");
        }
        if let Some(tail) = self.tails.get_mut(r) {
            if tail.len() == TAIL_KEEP {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        }
        let shown = match self.tee {
            Tee::Rank0 => (rank == 0).then(String::new),
            Tee::All => Some(format!("[{rank}] ")),
            Tee::None => None,
        };
        if let Some(prefix) = shown {
            let print = || {
                let _ = match stream {
                    Stream::Stdout => writeln!(std::io::stdout().lock(), "{prefix}{line}"),
                    Stream::Stderr => writeln!(std::io::stderr().lock(), "{prefix}{line}"),
                };
            };
            match &self.bar {
                Some(bar) => bar.suspend(print),
                None => print(),
            }
        }
    }

    pub fn set_bar(&mut self, bar: Option<ProgressBar>) {
        self.bar = bar;
    }

    /// A note from meshrun itself, in the rank's log only.
    pub fn note(&mut self, rank: u32, text: &str) {
        if let Some(file) = self.files.get_mut(rank as usize) {
            let _ = writeln!(file, "===== meshrun: {text} =====");
        }
    }

    pub fn tail(&self, rank: u32) -> Vec<String> {
        self.tails
            .get(rank as usize)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}
