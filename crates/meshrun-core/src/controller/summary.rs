//! The failure summary: the first thing a user reads when a run fails, so
//! it names the first failing rank, how it failed, and the end of its
//! traceback, then what happened to the others and where the logs are.

use std::fmt::Write as _;
use std::path::Path;

pub use meshrun_record::{Cause, ExitInfo, FailureRecord};

pub use meshrun_machine::RankEnd;

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

/// How a rank other than the failing one ended. "Stopped by meshrun" is
/// said only of what meshrun did; a rank that died of a signal of its own
/// (an abort, a crash) is named as such, with its last line.
fn how_it_ended(r: &RankEnd) -> String {
    match r.exit {
        Some(exit) if r.stopped_by_meshrun => format!("stopped by meshrun ({exit})"),
        Some(ExitInfo {
            code: None,
            signal: None,
        }) => "ended with an exit status meshrun could not read".to_string(),
        Some(exit) if exit.signal.is_some() => match r.last_line.as_deref() {
            Some(line) if !line.trim().is_empty() => {
                format!(
                    "ended by itself with {exit}, its last line: {}",
                    line.trim()
                )
            }
            _ => format!("ended by itself with {exit}"),
        },
        Some(exit) => format!("{exit}"),
        None => "lost".to_string(),
    }
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
    let traceback = match &failure.cause {
        Cause::Exception { traceback, .. } | Cause::OutOfMemory { traceback, .. } => {
            Some(traceback).filter(|t| !t.trim().is_empty())
        }
        _ => None,
    };
    let lines: Vec<&str> = match traceback {
        Some(traceback) => traceback.lines().collect(),
        None => tail.iter().map(String::as_str).collect(),
    };
    if !lines.is_empty() {
        let what = if traceback.is_some() {
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
    let others = grouped(
        ranks
            .iter()
            .filter(|r| r.rank != failure.rank)
            .map(|r| (r.rank, how_it_ended(r))),
    );
    if !others.is_empty() {
        let _ = writeln!(s, "  other ranks: {}", others.join("; "));
    }
    let early: Vec<(u32, String)> = ranks
        .iter()
        .filter(|r| r.rank != failure.rank)
        .filter_map(|r| {
            let when = r.finished_early?.last_step.map_or_else(
                || "before its first report".to_string(),
                |s| format!("after step {s}"),
            );
            Some((r.rank, when))
        })
        .collect();
    for (ranks, when) in groups(early) {
        let (who, their) = if ranks.len() == 1 {
            (format!("rank {}", ranges(&ranks)), "its")
        } else {
            (format!("ranks {}", ranges(&ranks)), "their")
        };
        let _ = writeln!(
            s,
            "  note: {who} had already finished {their} program successfully ({when}) while the \
             others still ran; a rank that leaves early makes the others wait in their next \
             collective"
        );
    }
    let _ = write!(s, "  log: {}", log.display());
    s
}

/// `(rank, what)` pairs as one entry per `what`, in the order first seen,
/// each naming its ranks as ranges: "rank 4 lost", "ranks 1-3, 5-1023
/// stopped by meshrun (...)". A thousand ranks stopped alike are one short
/// entry, not a thousand.
pub fn grouped(pairs: impl IntoIterator<Item = (u32, String)>) -> Vec<String> {
    groups(pairs)
        .into_iter()
        .map(|(ranks, what)| {
            let word = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{word} {} {what}", ranges(&ranks))
        })
        .collect()
}

/// The ranks of each `what`, sorted, in the order first seen.
fn groups(pairs: impl IntoIterator<Item = (u32, String)>) -> Vec<(Vec<u32>, String)> {
    let mut groups: Vec<(Vec<u32>, String)> = Vec::new();
    for (rank, what) in pairs {
        match groups.iter_mut().find(|(_, w)| *w == what) {
            Some((ranks, _)) => ranks.push(rank),
            None => groups.push((vec![rank], what)),
        }
    }
    for (ranks, _) in &mut groups {
        ranks.sort_unstable();
        ranks.dedup();
    }
    groups
}

/// Sorted ranks as "1-3, 5, 7-9".
fn ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_that_ended_alike_are_one_entry_with_ranges() {
        let mut pairs: Vec<(u32, String)> = (1..1024).map(|r| (r, "lost".to_string())).collect();
        pairs[3].1 = "stopped by meshrun (signal 15 (SIGTERM))".into();
        pairs.push((2000, "lost".into()));
        assert_eq!(
            grouped(pairs),
            vec![
                "ranks 1-3, 5-1023, 2000 lost".to_string(),
                "rank 4 stopped by meshrun (signal 15 (SIGTERM))".to_string()
            ]
        );
        assert!(grouped(Vec::new()).is_empty());
    }

    #[test]
    fn hang_and_attempt_lines_name_what_happened() {
        let hang = Cause::Hang {
            secs: 31.4,
            last_step: Some(12),
            after_finish_of: None,
            wavefront: String::new(),
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
            last_line: None,
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
    fn a_rank_that_ended_by_itself_is_not_said_to_be_stopped_by_meshrun() {
        let failure = FailureRecord {
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
        let end = |rank, signal, stopped_by_meshrun, last: Option<&str>| RankEnd {
            rank,
            exit: Some(ExitInfo { code: None, signal }),
            stopped_by_meshrun,
            finished_early: None,
            last_line: last.map(String::from),
        };
        let ranks = [
            end(
                0,
                Some(6),
                false,
                Some("terminate called after throwing an instance of 'gloo::EnforceNotMet'"),
            ),
            end(2, None, false, None),
            end(3, Some(9), true, Some("step 5")),
        ];
        let text = render(
            "r",
            &failure,
            &ranks,
            &[],
            Path::new("runs/r/logs/rank-1.log"),
        );
        assert!(
            text.contains(
                "rank 0 ended by itself with signal 6 (SIGABRT), its last line: terminate called \
                 after throwing an instance of 'gloo::EnforceNotMet'"
            ),
            "{text}"
        );
        assert!(
            text.contains("rank 2 ended with an exit status meshrun could not read"),
            "{text}"
        );
        assert!(
            text.contains("rank 3 stopped by meshrun (signal 9 (SIGKILL))"),
            "{text}"
        );
        assert_eq!(text.matches("stopped by meshrun").count(), 1, "{text}");
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
                last_line: None,
            },
            RankEnd {
                rank: 1,
                exit: Some(ExitInfo {
                    code: Some(1),
                    signal: None,
                }),
                stopped_by_meshrun: false,
                finished_early: None,
                last_line: None,
            },
            RankEnd {
                rank: 2,
                exit: None,
                stopped_by_meshrun: false,
                finished_early: None,
                last_line: None,
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
