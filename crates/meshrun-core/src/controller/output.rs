//! Worker output: every line goes to `logs/rank-R.log` (each attempt
//! appended under a header, see [`super::rank_logs`]) and, for the ranks
//! being teed, to the terminal. The last lines of each rank are kept for
//! the failure summary. The terminal is written through
//! [`super::terminal`], which never blocks.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::path::PathBuf;

use indicatif::ProgressBar;
use meshrun_protocol::Stream;

use super::rank_logs::RankLogs;
use super::terminal::{terminal, Target, Terminal};
use crate::error::CoreError;
use meshrun_plan::Tee;

const TAIL_KEEP: usize = 40;

/// A line is kept whole in the log up to this size; a longer one is
/// written as it comes (the log still gets every byte, in order).
const WHOLE_LINE_LIMIT: usize = 16 << 20;

/// How much of a line the terminal shows; the log has all of it.
const TERMINAL_LINE_LIMIT: usize = 16 << 10;

/// How much of a line a failure summary's tail keeps.
const TAIL_LINE_LIMIT: usize = 1 << 10;

pub struct Output {
    tee: Tee,
    /// Lines are printed above the progress bar, which is redrawn under them.
    bar: Option<ProgressBar>,
    logs: RankLogs,
    tails: Vec<VecDeque<String>>,
    /// Each rank's last line on stderr (noise apart): what a process that
    /// aborts says last.
    last_err: Vec<Option<String>>,
    /// Each rank's stdout and stderr line still coming in pieces.
    partial: Vec<[String; 2]>,
    terminal: Terminal,
    /// Show every line (`-v`), noise included.
    verbose: bool,
}

/// Gloo's "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of
/// connected peer ranks is : 1". Its threads print at once, so one such
/// line often comes cut in two, the halves on two lines: both are noise.
fn is_gloo_noise(line: &str) -> bool {
    line.starts_with("[Gloo] ")
        || line.contains("connected peer ranks is : ")
        // JAX's preemption notifier, on the SIGTERM of every stop: meshrun
        // says itself why the ranks are stopped.
        || (line.contains("preemption_notifier.cc") && line.contains("SIGTERM caught"))
}

/// The start of `line` when it is longer than `limit` bytes, saying how
/// much was left out.
fn shorten(line: &str, limit: usize) -> Cow<'_, str> {
    if line.len() <= limit {
        return Cow::Borrowed(line);
    }
    let mut end = limit;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{}... [{} more bytes in the rank log]",
        &line[..end],
        line.len() - end
    ))
}

impl Output {
    /// Opens every rank's log for appending and writes the attempt header.
    pub fn open(
        tee: Tee,
        paths: &[PathBuf],
        attempt: u32,
        started: &str,
    ) -> Result<Self, CoreError> {
        let logs = RankLogs::open(paths, attempt, started)?;
        Ok(Self {
            tee,
            bar: None,
            tails: vec![VecDeque::with_capacity(TAIL_KEEP); paths.len()],
            last_err: vec![None; paths.len()],
            partial: vec![Default::default(); paths.len()],
            logs,
            terminal: terminal(),
            verbose: tracing::enabled!(tracing::Level::INFO),
        })
    }

    /// A piece of a rank's output; `more` when the line goes on in the
    /// next piece (lines longer than a frame come in pieces).
    pub fn line(&mut self, rank: u32, stream: Stream, piece: &str, more: bool) {
        let r = rank as usize;
        let Some(partial) = self.partial.get_mut(r) else {
            return;
        };
        let open = &mut partial[stream as usize];
        if more || !open.is_empty() {
            open.push_str(piece);
            if more {
                if open.len() >= WHOLE_LINE_LIMIT {
                    // Past this a line is passed on as it comes, still
                    // without a newline of meshrun's in the log.
                    let text = std::mem::take(open);
                    self.logs.write(rank, text.as_bytes());
                }
                return;
            }
            let line = std::mem::take(open);
            self.whole_line(rank, stream, &line);
        } else {
            self.whole_line(rank, stream, piece);
        }
    }

    fn whole_line(&mut self, rank: u32, stream: Stream, line: &str) {
        let r = rank as usize;
        self.logs.line(rank, line);
        // Gloo's connection lines say nothing a user acts on: they stay in
        // the logs, out of the terminal and the summaries unless -v.
        if !self.verbose && is_gloo_noise(line) {
            return;
        }
        let shown = shorten(line, TERMINAL_LINE_LIMIT);
        if let Some(tail) = self.tails.get_mut(r) {
            if tail.len() == TAIL_KEEP {
                tail.pop_front();
            }
            tail.push_back(shorten(line, TAIL_LINE_LIMIT).into_owned());
        }
        if let (Stream::Stderr, Some(last)) = (stream, self.last_err.get_mut(r)) {
            *last = Some(shorten(line, TAIL_LINE_LIMIT).into_owned());
        }
        let prefix = match self.tee {
            Tee::Rank0 => (rank == 0).then(String::new),
            Tee::All => Some(format!("[{rank}] ")),
            Tee::None => None,
        };
        if let Some(prefix) = prefix {
            let to = match stream {
                Stream::Stdout => Target::Stdout,
                Stream::Stderr => Target::Stderr,
            };
            let print = || self.terminal.line(to, &format!("{prefix}{shown}"));
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
        self.logs
            .line(rank, &format!("===== meshrun: {text} ====="));
    }

    pub fn last_stderr_line(&self, rank: u32) -> Option<String> {
        self.last_err.get(rank as usize).cloned().flatten()
    }

    pub fn tail(&self, rank: u32) -> Vec<String> {
        self.tails
            .get(rank as usize)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gloo_lines_are_noise_even_when_cut_in_two() {
        let whole = "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1";
        assert!(is_gloo_noise(whole));
        assert!(is_gloo_noise("[Gloo] Rank [Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"));
        assert!(is_gloo_noise(
            "0 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"
        ));
        assert!(!is_gloo_noise("step 10 loss 2.5"));
        assert!(is_gloo_noise(
            "W1207 02:11:09.123456 21518 preemption_notifier.cc:90] SIGTERM caught at 2026-12-07T02:11:09.123456+00:00"
        ));
    }
}
