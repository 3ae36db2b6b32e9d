//! What follows an attempt that failed: another one while `--max-failures`
//! allows and a restart could end otherwise, else the end of the run; and
//! how each is worded. Pure functions of what the attempts left, so the
//! policy is tested without processes.

use super::summary::render_attempts;
use super::{FailureRecord, OutcomeStatus};

/// What the run does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Another attempt.
    Restart,
    /// The run ends: the attempt did not fail, or the restarts are used up.
    End,
    /// The run ends with `unused` restarts left: the failure is one that a
    /// restart meets again (a folder or program missing on a host), and
    /// each would only cost a start-up and say the same.
    EndNow { unused: u32 },
}

/// The decision after an attempt that ended as `status` with `failure`,
/// when `failed_before` attempts failed before it.
pub(super) fn after(
    status: OutcomeStatus,
    failure: Option<&FailureRecord>,
    failed_before: u32,
    max_failures: u32,
) -> Next {
    // A failed attempt without a failure lost its workers without a word:
    // nothing says what a restart would meet, and none is made.
    let Some(f) = failure.filter(|_| status == OutcomeStatus::Failed) else {
        return Next::End;
    };
    if failed_before >= max_failures {
        return Next::End;
    }
    if f.cause.restart_cannot_change() {
        return Next::EndNow {
            unused: max_failures - failed_before,
        };
    }
    Next::Restart
}

/// The summary of an attempt that is restarted: the attempt failed, not
/// the run (its final summary says `run 'NAME' failed (attempt N)`).
pub(super) fn attempt_summary(summary: &str, name: &str, attempt: u32) -> String {
    summary.replacen(
        &format!("meshrun: run '{name}' failed (attempt {attempt}):"),
        &format!("meshrun: attempt {attempt} of run '{name}' failed:"),
        1,
    )
}

/// The line said before a restart.
pub(super) fn restarting_line(
    f: &FailureRecord,
    newest: Option<u64>,
    memory_step: Option<u64>,
    failures: usize,
    max_failures: u32,
) -> String {
    let mut from = newest.map_or_else(
        // A program may keep checkpoints of its own (MaxText, Orbax): it
        // then resumes from those, whatever meshrun has.
        || "from the start (no checkpoint of meshrun's yet; a program with checkpoints of its own resumes from those)".to_string(),
        |s| format!("from the newest checkpoint that verifies (newest committed: step-{s})"),
    );
    if let Some(m) = memory_step.filter(|m| newest.is_none_or(|d| *m >= d)) {
        from =
            format!("from memory checkpoint step {m} where every host still holds it, else {from}");
    }
    format!(
        "meshrun: attempt {} failed: rank {} {}; restarting {from} (failure {failures} of \
         {max_failures} allowed)",
        f.attempt,
        f.rank,
        f.cause.headline(),
    )
}

/// The summary of the run's end. `summary` is the last attempt's, `failed`
/// every failure of the run (the last attempt's last).
pub(super) fn final_summary(
    name: &str,
    next: Next,
    summary: Option<String>,
    failed: &[FailureRecord],
    max_failures: u32,
) -> Option<String> {
    let text = summary?;
    let n = failed.len();
    let earlier = render_attempts(&failed[..n.saturating_sub(1)]);
    Some(match next {
        Next::EndNow { unused } => {
            // Said on the failure's own line: it is why the run ends.
            let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
            let plural = if unused == 1 { "" } else { "s" };
            let text = format!(
                "{first}; a restart cannot change this, so the run ends now ({unused} \
                 restart{plural} left unused)\n{rest}"
            );
            if n > 1 {
                format!("meshrun: run '{name}' failed {n} times:\n{earlier}{text}")
            } else {
                text
            }
        }
        Next::End if n > 1 => format!(
            "meshrun: run '{name}' failed {n} times, more than --max-failures {max_failures} \
             allows:\n{earlier}{text}"
        ),
        Next::End | Next::Restart => text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Cause;

    fn failure(attempt: u32, cause: Cause) -> FailureRecord {
        FailureRecord {
            rank: 1,
            host: 1,
            attempt,
            cause,
            exit: None,
        }
    }

    fn spawn_failed(deterministic: bool) -> Cause {
        Cause::SpawnFailed {
            error: "the run's working folder '/tmp/work' is not on this host".into(),
            deterministic,
        }
    }

    #[test]
    fn a_failure_a_restart_cannot_change_ends_the_run_at_once_with_its_restarts_unused() {
        let failed = OutcomeStatus::Failed;
        let missing = failure(1, spawn_failed(true));
        assert_eq!(
            after(failed, Some(&missing), 0, 3),
            Next::EndNow { unused: 3 }
        );
        assert_eq!(
            after(failed, Some(&missing), 2, 3),
            Next::EndNow { unused: 1 }
        );
        // With none left, it is the usual end.
        assert_eq!(after(failed, Some(&missing), 3, 3), Next::End);
        assert_eq!(after(failed, Some(&missing), 0, 0), Next::End);
        // A start that failed for a reason that may pass is retried.
        let passing = failure(1, spawn_failed(false));
        assert_eq!(after(failed, Some(&passing), 0, 3), Next::Restart);
        let exit = failure(
            1,
            Cause::Exit {
                exit: meshrun_record::ExitInfo {
                    code: Some(1),
                    signal: None,
                },
            },
        );
        assert_eq!(after(failed, Some(&exit), 2, 3), Next::Restart);
        assert_eq!(after(failed, None, 0, 3), Next::End);
        assert_eq!(after(OutcomeStatus::Succeeded, None, 0, 3), Next::End);
    }

    #[test]
    fn a_restarted_attempts_summary_says_the_attempt_failed_not_the_run() {
        let summary =
            "meshrun: run 'w' failed (attempt 2): rank 1 ended with signal 9 (SIGKILL)\n  log: x\n";
        assert_eq!(
            attempt_summary(summary, "w", 2),
            "meshrun: attempt 2 of run 'w' failed: rank 1 ended with signal 9 (SIGKILL)\n  log: x\n"
        );
    }

    #[test]
    fn the_run_that_ends_now_says_why_on_the_failures_own_line() {
        let missing = failure(1, spawn_failed(true));
        let summary = "meshrun: run 'w' failed (attempt 1): rank 1 could not start: the run's \
                       working folder '/tmp/work' is not on this host\n  log: runs/w/logs/rank-1.log\n";
        let text = final_summary(
            "w",
            Next::EndNow { unused: 3 },
            Some(summary.into()),
            std::slice::from_ref(&missing),
            3,
        )
        .unwrap();
        assert_eq!(
            text,
            "meshrun: run 'w' failed (attempt 1): rank 1 could not start: the run's working \
             folder '/tmp/work' is not on this host; a restart cannot change this, so the run \
             ends now (3 restarts left unused)\n  log: runs/w/logs/rank-1.log\n"
        );
        // After a failure that was retried, the earlier attempts are listed,
        // without claiming the restarts were used up.
        let exit = failure(
            1,
            Cause::Exit {
                exit: meshrun_record::ExitInfo {
                    code: Some(3),
                    signal: None,
                },
            },
        );
        let text = final_summary(
            "w",
            Next::EndNow { unused: 1 },
            Some(summary.replace("attempt 1", "attempt 2")),
            &[exit, failure(2, spawn_failed(true))],
            2,
        )
        .unwrap();
        assert!(
            text.starts_with(
                "meshrun: run 'w' failed 2 times:\n  attempt 1: rank 1 ended with exit code 3\n\
                 meshrun: run 'w' failed (attempt 2)"
            ),
            "{text}"
        );
        assert!(text.contains("(1 restart left unused)"), "{text}");
    }
}
