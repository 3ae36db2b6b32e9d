//! How what follows an attempt is worded: the summary of an attempt that is
//! restarted, the line before a restart, the summary of the run's end.
//! The decision itself is `meshrun_machine::Run`'s.

use meshrun_machine::Next;

use super::summary::render_attempts;
use super::FailureRecord;

/// The summary of an attempt that is restarted: the attempt failed, not
/// the run (its final summary says `run 'NAME' failed (attempt N)`).
pub(super) fn attempt_summary(summary: &str, name: &str, attempt: u32) -> String {
    summary.replacen(
        &format!("meshrun: run '{name}' failed (attempt {attempt}):"),
        &format!("meshrun: attempt {attempt} of run '{name}' failed:"),
        1,
    )
}

/// The line said before a restart: `newest` is the newest committed
/// checkpoint, `memory` the memory checkpoint the restart tries first.
pub(super) fn restarting_line(
    f: &FailureRecord,
    newest: Option<u64>,
    memory: Option<u64>,
    failures: u32,
    max_failures: u32,
) -> String {
    let mut from = newest.map_or_else(
        // A program may keep checkpoints of its own (MaxText, Orbax): it
        // then resumes from those, whatever meshrun has.
        || {
            "from the start (no meshrun checkpoint; the program restores its own, if it keeps any)"
                .to_string()
        },
        |s| format!("from the newest checkpoint that verifies (newest committed: step-{s})"),
    );
    if let Some(m) = memory {
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
/// every failure of the run (the last attempt's last); `max_failures` the
/// setting as the caller wrote it (`--max-failures 2`).
pub(super) fn final_summary(
    name: &str,
    next: Next,
    summary: Option<String>,
    failed: &[FailureRecord],
    max_failures: &str,
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
            "meshrun: run '{name}' failed {n} times, more than {max_failures} allows:\n{earlier}{text}"
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
            "--max-failures 3",
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
            "--max-failures 2",
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
