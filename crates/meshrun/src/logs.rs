//! `meshrun logs`: a rank's log, every attempt or one, and `--follow`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::Duration;

use meshrun_record::{names, read, RunState};

use crate::runs::{find, out, RunsError};

/// The attempt a log header line opens, if it is one.
fn header_attempt(line: &str) -> Option<u32> {
    line.strip_prefix("===== meshrun attempt ")?
        .split(',')
        .next()?
        .parse()
        .ok()
}

/// How many `rank-R.log` files a run has, for a run whose `run.json` no
/// longer says how many processes it had.
fn logged_ranks(logs: &Path) -> u32 {
    let mut n = 0;
    while logs.join(format!("rank-{n}.log")).exists() {
        n += 1;
    }
    n
}

pub fn logs(
    name: &str,
    runs_dir: &Path,
    rank: u32,
    attempt: Option<u32>,
    follow: bool,
) -> Result<(), RunsError> {
    let run = find(name, runs_dir)?;
    let logs = run.dir.join(names::LOGS);
    let nprocs = run
        .record
        .as_ref()
        .and_then(|r| r.plan_u64("nprocs"))
        .map_or_else(|| logged_ranks(&logs), |n| n as u32);
    let path = names::log_path(&run.dir, rank);
    // A rank of an earlier attempt (an elastic run that shrank, a rerun on
    // fewer processes) keeps its log: what is on disk counts, not the
    // newest attempt's size.
    if !path.exists() {
        return Err(RunsError::NoRank {
            name: name.into(),
            rank,
            last: nprocs.max(logged_ranks(&logs)).saturating_sub(1),
            dir: logs,
        });
    }
    let read = |p: &Path| {
        File::open(p).map_err(|source| RunsError::Read {
            path: p.into(),
            source,
        })
    };
    let mut reader = BufReader::new(read(&path)?);
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|source| RunsError::Read {
            path: path.clone(),
            source,
        })?;
    let Some(k) = attempt else {
        out(&text);
        if follow {
            return follow_file(&run.dir, reader, None);
        }
        return Ok(());
    };
    let have: Vec<u32> = text.lines().filter_map(header_attempt).collect();
    if !have.contains(&k) {
        // A run still on an earlier attempt may reach K: only --follow waits for it.
        if !follow || run.state != "running" {
            return Err(RunsError::NoAttempt {
                name: name.into(),
                rank,
                attempt: k,
                have,
            });
        }
    }
    let mut inside = false;
    let mut shown = String::new();
    for line in text.lines() {
        if let Some(a) = header_attempt(line) {
            inside = a == k;
        }
        if inside {
            shown.push_str(line);
            shown.push('\n');
        }
    }
    out(&shown);
    if !follow {
        return Ok(());
    }
    follow_file(&run.dir, reader, Some((k, inside)))
}

/// Whether a controller is still running the run: `run.json` says so and
/// the run's lock is held (a killed controller leaves `running` behind).
fn still_running(dir: &Path) -> bool {
    let recorded = read::run_record(dir)
        .ok()
        .flatten()
        .is_some_and(|r| r.state == RunState::Running);
    recorded && read::lock_is_held(dir)
}

/// Prints what is appended to the log until the run is no longer running
/// (and nothing more comes), like `tail -f` that knows when to stop.
fn follow_file(
    dir: &Path,
    mut reader: BufReader<File>,
    attempt: Option<(u32, bool)>,
) -> Result<(), RunsError> {
    let mut inside = attempt.is_none_or(|(_, inside)| inside);
    let mut line = String::new();
    let mut idle_since_end = 0;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap_or(0);
        if n > 0 && line.ends_with('\n') {
            if let (Some((k, _)), Some(a)) = (attempt, header_attempt(&line)) {
                inside = a == k;
            }
            if inside {
                out(&line);
            }
            continue;
        }
        if n > 0 {
            // A partial line: go back and read it whole later.
            let _ = reader.seek_relative(-(n as i64));
        }
        if still_running(dir) {
            idle_since_end = 0;
        } else {
            idle_since_end += 1;
            if idle_since_end > 2 {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_headers_name_their_attempt() {
        assert_eq!(
            header_attempt("===== meshrun attempt 3, rank 1, started x ====="),
            Some(3)
        );
        assert_eq!(header_attempt("step 3"), None);
    }

    #[test]
    fn a_recorded_running_state_without_its_controller_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(names::RUN_JSON),
            r#"{"name": "r", "run_id": "r1", "state": "running", "created": "2026-12-02T10:00:00Z",
                "plan": {"nprocs": 1}, "versions": {"meshrun": "0.1.0", "protocol": 1},
                "attempts": [{"attempt": 1, "state": "running", "started": "2026-12-02T10:00:00Z"}]}"#,
        )
        .unwrap();
        assert!(!still_running(dir.path()));
        let _controller = meshrun_core::rundir::RunDir::open(dir.path(), "r").unwrap();
        assert!(still_running(dir.path()));
    }
}
