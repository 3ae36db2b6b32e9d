//! The failure summary: the first thing a user reads when a run fails, so
//! it names the first failing rank, how it failed, and the end of its
//! traceback, then what happened to the others and where the logs are.

use std::fmt::Write as _;
use std::path::Path;

pub use meshrun_record::{Cause, ExitInfo, FailureRecord};

/// What the summary needs to know about every rank.
pub struct RankEnd {
    pub rank: u32,
    pub exit: Option<ExitInfo>,
    pub stopped_by_meshrun: bool,
    /// It had finished its program successfully before the failure.
    pub finished_early: Option<EarlyFinish>,
}

/// A rank that finished its program while the others still ran.
#[derive(Debug, Clone, Copy)]
pub struct EarlyFinish {
    /// Its last reported step then.
    pub last_step: Option<u64>,
}

const TAIL_LINES: usize = 12;

/// One line per earlier failed attempt, for the summary of a run that
/// used up its restarts.
pub fn render_attempts(failures: &[FailureRecord]) -> String {
    let mut s = String::new();
    for f in failures {
        let _ = writeln!(
            s,
            "  attempt {}: rank {} {}",
            f.attempt,
            f.rank,
            f.cause.headline()
        );
    }
    s
}

pub fn render(
    run_name: &str,
    failure: &FailureRecord,
    ranks: &[RankEnd],
    tail: &[String],
    log: &Path,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "meshrun: run '{run_name}' failed (attempt {}): rank {} {}",
        failure.attempt,
        failure.rank,
        failure.cause.headline()
    );
    let lines: Vec<&str> = match &failure.cause {
        Cause::Exception { traceback, .. } if !traceback.trim().is_empty() => {
            traceback.lines().collect()
        }
        _ => tail.iter().map(String::as_str).collect(),
    };
    if !lines.is_empty() {
        let what = if matches!(failure.cause, Cause::Exception { .. }) {
            "traceback"
        } else {
            "output"
        };
        let _ = writeln!(s, "  last lines of rank {}'s {what}:", failure.rank);
        for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
            let _ = writeln!(s, "    | {line}");
        }
    }
    // After the output, which often says why (argparse's usage, the
    // program's own message), the place the program chose to exit.
    if let Cause::SystemExit { traceback, .. } = &failure.cause {
        let lines: Vec<&str> = traceback.lines().collect();
        if !lines.is_empty() {
            let _ = writeln!(s, "  where rank {} called sys.exit:", failure.rank);
            for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                let _ = writeln!(s, "    | {line}");
            }
        }
    }
    let others: Vec<String> = ranks
        .iter()
        .filter(|r| r.rank != failure.rank)
        .map(|r| {
            let how = match r.exit {
                Some(exit) if r.stopped_by_meshrun => format!("stopped by meshrun ({exit})"),
                Some(exit) => format!("{exit}"),
                None => "lost".to_string(),
            };
            format!("rank {} {how}", r.rank)
        })
        .collect();
    if !others.is_empty() {
        let _ = writeln!(s, "  other ranks: {}", others.join("; "));
    }
    for r in ranks.iter().filter(|r| r.rank != failure.rank) {
        if let Some(early) = r.finished_early {
            let when = early.last_step.map_or_else(
                || "before its first report".to_string(),
                |s| format!("after step {s}"),
            );
            let _ = writeln!(
                s,
                "  note: rank {} had already finished its program successfully ({when}) while the \
                 others still ran; a rank that leaves early makes the others wait in their next \
                 collective",
                r.rank
            );
        }
    }
    let _ = write!(s, "  log: {}", log.display());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hang_and_attempt_lines_name_what_happened() {
        let hang = Cause::Hang {
            secs: 31.4,
            last_step: Some(12),
            after_finish_of: None,
        };
        assert_eq!(
            hang.headline(),
            "hung: no report for 31 s (after step 12); see the stacks"
        );
        let first = FailureRecord {
            rank: 1,
            host: 0,
            attempt: 1,
            cause: Cause::Exit {
                exit: ExitInfo {
                    code: None,
                    signal: Some(9),
                },
            },
            exit: None,
        };
        let second = FailureRecord {
            attempt: 2,
            rank: 0,
            cause: Cause::Unresponsive { secs: 10.2 },
            ..first.clone()
        };
        assert_eq!(
            render_attempts(&[first, second]),
            "  attempt 1: rank 1 ended with signal 9 (SIGKILL)\n  attempt 2: rank 0 stopped sending heartbeats for 10 s (frozen or stopped?)\n"
        );
    }

    #[test]
    fn names_rank_exception_and_traceback_tail() {
        let failure = FailureRecord {
            rank: 1,
            host: 0,
            attempt: 1,
            cause: Cause::Exception {
                exception: "ValueError".into(),
                message: "boom".into(),
                traceback:
                    "Traceback (most recent call last):\n  File \"x.py\", line 3\nValueError: boom"
                        .into(),
            },
            exit: None,
        };
        let ranks = [RankEnd {
            rank: 0,
            exit: Some(ExitInfo {
                code: None,
                signal: Some(9),
            }),
            stopped_by_meshrun: true,
            finished_early: None,
        }];
        let text = render(
            "r",
            &failure,
            &ranks,
            &[],
            Path::new("runs/r/logs/rank-1.log"),
        );
        assert!(text.contains("rank 1 raised ValueError: boom"), "{text}");
        assert!(text.contains("    | ValueError: boom"), "{text}");
        assert!(
            text.contains("rank 0 stopped by meshrun (signal 9 (SIGKILL))"),
            "{text}"
        );
    }

    #[test]
    fn failure_summary_snapshot() {
        let failure = FailureRecord {
            rank: 1,
            host: 0,
            attempt: 2,
            cause: Cause::Exception {
                exception: "ValueError".into(),
                message: "injected failure at step 12".into(),
                traceback: "Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n    step(state)\n  File \"train.py\", line 21, in step\n    raise ValueError(\"injected failure at step 12\")\nValueError: injected failure at step 12".into(),
            },
            exit: Some(ExitInfo { code: Some(1), signal: None }),
        };
        let ranks = [
            RankEnd {
                rank: 0,
                exit: Some(ExitInfo {
                    code: None,
                    signal: Some(15),
                }),
                stopped_by_meshrun: true,
                finished_early: None,
            },
            RankEnd {
                rank: 1,
                exit: Some(ExitInfo {
                    code: Some(1),
                    signal: None,
                }),
                stopped_by_meshrun: false,
                finished_early: None,
            },
            RankEnd {
                rank: 2,
                exit: None,
                stopped_by_meshrun: false,
                finished_early: None,
            },
        ];
        insta::assert_snapshot!(render(
            "demo",
            &failure,
            &ranks,
            &[],
            Path::new("runs/demo/logs/rank-1.log")
        ));
    }
}
