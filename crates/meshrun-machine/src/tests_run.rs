//! The run across attempts: restarts, resizes, the end, and what each
//! attempt starts with, without processes.

use std::time::Duration;

use meshrun_plan::Elastic;
use meshrun_record::{Cause, ExitInfo, FailureRecord};

use super::*;
use crate::sim::plan;

fn failure(attempt: u32, cause: Cause) -> FailureRecord {
    FailureRecord {
        rank: 1,
        host: 1,
        attempt,
        cause,
        exit: None,
    }
}

fn exit(attempt: u32) -> FailureRecord {
    failure(
        attempt,
        Cause::Exit {
            exit: ExitInfo {
                code: Some(1),
                signal: None,
            },
        },
    )
}

fn spawn_failed(deterministic: bool) -> Cause {
    Cause::SpawnFailed {
        error: "the run's working folder '/tmp/work' is not on this host".into(),
        deterministic,
    }
}

fn failed(attempt: u32) -> Ended {
    Ended {
        status: OutcomeStatus::Failed,
        failure: Some(exit(attempt)),
        memory_committed: None,
        hosts_launched: None,
    }
}

fn with_max_failures(n: u32) -> Run {
    let mut p = plan(2);
    p.failure.max_failures = n;
    Run::new(&p)
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
    assert_eq!(after(failed, Some(&exit(1)), 2, 3), Next::Restart);
    assert_eq!(after(failed, None, 0, 3), Next::End);
    assert_eq!(after(OutcomeStatus::Succeeded, None, 0, 3), Next::End);
}

#[test]
fn failures_are_restarted_until_max_failures_and_the_next_ends_the_run() {
    let mut run = with_max_failures(2);
    for attempt in 1..=2 {
        assert_eq!(run.start().failed_before, attempt - 1);
        assert!(run.goes_on(OutcomeStatus::Failed, Some(&exit(attempt))));
        assert_eq!(
            run.ended(failed(attempt)),
            After::Restart {
                failure: exit(attempt),
                failures: attempt
            }
        );
    }
    assert!(!run.goes_on(OutcomeStatus::Failed, Some(&exit(3))));
    assert_eq!(
        run.ended(failed(3)),
        After::End {
            status: OutcomeStatus::Failed,
            next: Next::End
        }
    );
    assert_eq!(run.failures().len(), 3);
    assert_eq!(run.attempts(), 3);
}

#[test]
fn a_success_a_stop_or_a_preemption_ends_the_run_without_a_restart() {
    for status in [
        OutcomeStatus::Succeeded,
        OutcomeStatus::Preempted { step: 4 },
        OutcomeStatus::Interrupted { signal: 2 },
        OutcomeStatus::Stopped { now: true },
    ] {
        let mut run = with_max_failures(5);
        assert!(!run.goes_on(status, None));
        let end = Ended {
            status,
            failure: None,
            memory_committed: None,
            hosts_launched: Some(1),
        };
        assert_eq!(
            run.ended(end),
            After::End {
                status,
                next: Next::End
            }
        );
    }
}

#[test]
fn a_failure_a_restart_meets_again_ends_now_and_joined_hosts_are_let_go() {
    let mut run = with_max_failures(3);
    let missing = failure(1, spawn_failed(true));
    assert!(!run.goes_on(OutcomeStatus::Failed, Some(&missing)));
    let end = Ended {
        status: OutcomeStatus::Failed,
        failure: Some(missing),
        memory_committed: None,
        hosts_launched: None,
    };
    assert_eq!(
        run.ended(end),
        After::End {
            status: OutcomeStatus::Failed,
            next: Next::EndNow { unused: 3 }
        }
    );
}

#[test]
fn only_the_first_attempt_resumes_from_the_step_the_user_asked_for() {
    let mut p = plan(2);
    p.resume_from = Some(meshrun_plan::ResumeFrom::Step(30));
    p.failure.max_failures = 1;
    let mut run = Run::new(&p);
    assert_eq!(
        run.start().resume_from,
        Some(meshrun_plan::ResumeFrom::Step(30))
    );
    let _ = run.ended(failed(1));
    assert_eq!(run.start().resume_from, None);
}

#[test]
fn a_resize_counts_against_nothing_and_the_next_attempt_expects_the_new_count() {
    let mut p = plan(4);
    p.hosts = 4;
    p.procs_per_host = 1;
    p.failure.max_failures = 0;
    p.elastic = Some(Elastic {
        min_hosts: 2,
        rejoin_timeout_s: Some(7.0),
        any_count: false,
    });
    let mut run = Run::new(&p);
    let first = run.start();
    assert_eq!((first.previous_hosts, first.expected_hosts), (None, None));
    let resized = Ended {
        status: OutcomeStatus::Resized { hosts: 4 },
        failure: None,
        memory_committed: None,
        hosts_launched: Some(2),
    };
    assert!(run.goes_on(resized.status, None));
    assert_eq!(run.ended(resized), After::Resize { from: 2, to: 4 });
    let second = run.start();
    assert_eq!(second.failed_before, 0, "a resize is no failure");
    assert_eq!(second.previous_hosts, Some(2));
    assert_eq!(second.expected_hosts, Some(4));
    // After an attempt that ends otherwise, the next expects what it had.
    let _ = run.ended(Ended {
        status: OutcomeStatus::Succeeded,
        failure: None,
        memory_committed: None,
        hosts_launched: Some(4),
    });
    assert_eq!(run.start().expected_hosts, Some(4));
}

#[test]
fn a_restart_of_an_elastic_run_of_joined_hosts_waits_the_rejoin_timeout() {
    let elastic = |rendezvous: bool| {
        let mut p = plan(4);
        p.hosts = 4;
        p.procs_per_host = 1;
        p.rendezvous = rendezvous;
        p.join_timeout_s = Some(300.0);
        p.failure.max_failures = 1;
        p.elastic = Some(Elastic {
            min_hosts: 2,
            rejoin_timeout_s: Some(7.0),
            any_count: false,
        });
        Run::new(&p)
    };
    let mut run = elastic(true);
    assert_eq!(run.start().join_timeout, Duration::from_mins(5));
    let mut end = failed(1);
    end.hosts_launched = Some(4);
    let _ = run.ended(end.clone());
    assert_eq!(run.start().join_timeout, Duration::from_secs(7));
    // Hosts meshrun starts itself take the usual time.
    let mut run = elastic(false);
    let _ = run.ended(end.clone());
    assert_eq!(run.start().join_timeout, Duration::from_mins(5));
    // An attempt that never launched leaves the first wait as it was.
    let mut run = elastic(true);
    end.hosts_launched = None;
    let _ = run.ended(end);
    assert_eq!(run.start().join_timeout, Duration::from_mins(5));
}

#[test]
fn memory_wins_a_tie_with_the_durable_checkpoint_and_an_older_one_is_not_taken() {
    let mut run = with_max_failures(3);
    assert_eq!(run.memory_step(None), None);
    let mut end = failed(1);
    end.memory_committed = Some(7);
    let _ = run.ended(end);
    assert_eq!(run.memory_step(None), Some(7));
    assert_eq!(run.memory_step(Some(7)), Some(7));
    assert_eq!(run.memory_step(Some(5)), Some(7));
    assert_eq!(run.memory_step(Some(8)), None);
    // An attempt that committed nothing in memory keeps the older step.
    let _ = run.ended(failed(2));
    assert_eq!(run.memory_step(None), Some(7));
}

#[test]
fn an_attempt_that_ran_a_stale_executable_restarts_from_storage_not_memory() {
    let mut run = with_max_failures(3);
    let mut end = failed(1);
    end.memory_committed = Some(7);
    let _ = run.ended(end);
    let stale = |attempt, exception: &str| Ended {
        status: OutcomeStatus::Failed,
        failure: Some(failure(
            attempt,
            Cause::Exception {
                exception: exception.into(),
                message: "train_step was loaded from an earlier attempt of this run, but ..."
                    .into(),
                traceback: String::new(),
            },
        )),
        memory_committed: Some(9),
        hosts_launched: None,
    };
    // Another exception keeps the memory step it committed.
    let _ = run.ended(stale(2, "ValueError"));
    assert_eq!(run.memory_step(Some(5)), Some(9));
    // Steps 8 and 9 may be what the stale executable computed.
    let after = run.ended(stale(3, "StaleExecutableError"));
    assert!(matches!(after, After::Restart { .. }), "{after:?}");
    assert_eq!(run.memory_step(Some(5)), None);
    assert_eq!(run.memory_step(None), None);
}
