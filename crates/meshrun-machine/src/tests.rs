//! The machine driven with a simulated clock: no process, socket or file.

use meshrun_protocol::{ClientReply, FromAgent, FromWorker, ToAgent, ToWorker};
use std::time::{Duration, Instant};

use meshrun_record::{Cause, Event};

use super::deadlines::{CONNECTION_LOSS_GRACE, HEARTBEAT_TIMEOUT};
use super::sim::{plan, Sim, AGENT, STOP_CLIENT};
use super::stop::{PREEMPT_GRACE, STOP_REPORT_SLACK};
use super::*;
use crate::OutcomeStatus;
use crate::Outgoing;

const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

#[test]
fn launch_waits_for_every_agent_and_sends_each_its_workers() {
    let mut sim = Sim::new(plan(2));
    assert_eq!(
        sim.m.poll_timeout(),
        Some(sim.t0 + AGENT_JOIN_TIMEOUT),
        "the join deadline"
    );
    sim.join_agent();
    let actions = sim.take();
    let launch = actions.iter().find_map(|a| match a {
        Action::Send {
            to: AGENT,
            msg:
                Outgoing::Agent(ToAgent::Launch {
                    attempt, workers, ..
                }),
        } => Some((*attempt, workers.len())),
        _ => None,
    });
    assert_eq!(launch, Some((1, 2)));
    assert!(actions.contains(&Action::OpenLogs));
    let env = |key: &str| match actions.iter().find_map(|a| match a {
        Action::Send {
            msg: Outgoing::Agent(ToAgent::Launch { workers, .. }),
            ..
        } => Some(workers[1].env.clone()),
        _ => None,
    }) {
        Some(env) => env.into_iter().find(|(k, _)| k == key).map(|(_, v)| v),
        None => None,
    };
    assert_eq!(env("MESHRUN_RANK").as_deref(), Some("1"));
    assert_eq!(
        env("MESHRUN_COORDINATOR").as_deref(),
        Some("127.0.0.1:5000")
    );
}

#[test]
fn agents_that_never_join_are_an_engine_error_naming_the_host() {
    let mut sim = Sim::new(plan(2));
    let wake = sim.m.poll_timeout().unwrap();
    let err = sim.m.handle_timeout(wake).unwrap_err();
    assert!(
        matches!(&err, AttemptError::AgentTimeout { missing, secs: 60 } if missing == &[0]),
        "{err}"
    );
}

#[test]
fn an_exit_arriving_before_the_last_reports_waits_for_them() {
    let mut sim = Sim::running(2);
    sim.report(0, 1, false);
    sim.report(1, 1, false);
    // Both exits come over the agent's connection before rank 0's last
    // report and goodbye, which its own connection still carries.
    sim.exit(0, 0);
    sim.exit(1, 0);
    sim.input(Input::WorkerLost {
        rank: 1,
        clean: true,
    });
    assert!(!sim.finished(), "rank 0's connection is still open");
    sim.report(0, 2, false);
    let metrics: Vec<Option<u64>> = sim
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Metrics { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(metrics, [Some(1), Some(2)], "the late report is recorded");
    sim.input(Input::WorkerLost {
        rank: 0,
        clean: true,
    });
    assert!(sim.finished());
    assert_eq!(sim.m.status(), OutcomeStatus::Succeeded);
    assert!(sim.failed().is_none());
}

#[test]
fn a_connection_that_stays_open_after_the_exit_is_drained_when_quiet() {
    let mut sim = Sim::running(1);
    sim.exit(0, 0);
    assert!(!sim.finished());
    let wake = sim.m.poll_timeout().expect("a drain deadline");
    assert_eq!(wake, sim.now + rank::DRAIN_QUIET);
    sim.until(1.0);
    assert!(!sim.finished());
    sim.until(2.0);
    assert!(sim.finished(), "quiet for 2 s after the exit");
    assert_eq!(sim.m.status(), OutcomeStatus::Succeeded);
}

#[test]
fn the_exception_report_upgrades_an_exit_that_overtook_it() {
    let mut sim = Sim::running(2);
    sim.exit(1, 1);
    let first = sim.failed().unwrap();
    assert_eq!(first.rank, 1);
    assert!(matches!(first.cause, Cause::Exit { .. }));
    sim.worker(
        1,
        FromWorker::Failure {
            kind: "ValueError".into(),
            message: "boom".into(),
            traceback: "Traceback...\nValueError: boom".into(),
        },
    );
    let f = sim.failed().unwrap();
    assert_eq!(f.cause.headline(), "raised ValueError: boom");
    assert_eq!(
        f.exit.unwrap().code,
        Some(1),
        "how its process ended is kept"
    );
    // Another rank's exception later changes nothing.
    sim.worker(
        0,
        FromWorker::Failure {
            kind: "KeyError".into(),
            message: "late".into(),
            traceback: String::new(),
        },
    );
    assert_eq!(sim.failed().unwrap().rank, 1);
    let failed_events = sim
        .events()
        .iter()
        .filter(|e| matches!(e, Event::WorkerFailed(_)))
        .count();
    assert_eq!(failed_events, 1, "one failure is recorded");
    // The failure stops the group at once, asking for stacks.
    assert_eq!(sim.stops_sent(), [(0, true)]);
}

#[test]
fn a_preemption_without_its_checkpoint_stops_at_the_grace_deadline() {
    let mut sim = Sim::running(2);
    sim.report(0, 1, true);
    sim.report(1, 1, true);
    sim.input(Input::Terminate);
    let asked: Vec<Conn> = sim
        .take()
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                to,
                msg: Outgoing::Worker(ToWorker::CheckpointNow),
            } => Some(*to),
            _ => None,
        })
        .collect();
    assert_eq!(asked, [0, 1], "every worker is asked to save");
    // The workers stay alive but never commit.
    let grace = PREEMPT_GRACE.as_secs_f64();
    sim.alive_until(grace - 0.5);
    assert!(sim.stops_sent().is_empty());
    sim.alive_until(grace + 0.5);
    assert!(sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::PreemptTimeout { waited_s: 60, .. })));
    assert_eq!(sim.stops_sent(), [(crate::STOP_GRACE_MS, false)]);
    assert_eq!(
        sim.m.status(),
        OutcomeStatus::Interrupted { signal: SIGTERM }
    );
}

#[test]
fn a_preemption_that_commits_stops_at_its_checkpoint() {
    let mut sim = Sim::running(2);
    sim.report(0, 4, true);
    sim.input(Input::Terminate);
    sim.take();
    sim.worker(
        0,
        FromWorker::CheckpointWritten {
            step: 5,
            leaves: vec![],
            files: None,
            extra: None,
        },
    );
    let commit = sim.take();
    assert!(matches!(
        commit.as_slice(),
        [Action::Commit {
            rank: 0,
            step: 5,
            ..
        }]
    ));
    sim.input(Input::Committed {
        step: 5,
        path: "runs/sim/checkpoints/step-5".into(),
    });
    assert_eq!(sim.stops_sent(), [(0, false)], "no grace after the commit");
    assert!(sim.actions.contains(&Action::ApplyRetention));
    sim.exit(0, 143);
    sim.exit(1, 143);
    for rank in 0..2 {
        sim.input(Input::WorkerLost { rank, clean: false });
    }
    assert!(sim.finished());
    assert!(
        sim.failed().is_none(),
        "ranks stopped by meshrun did not fail"
    );
    assert_eq!(sim.m.status(), OutcomeStatus::Preempted { step: 5 });
}

/// The request reaches rank 0 before its report of step 8 and rank 1
/// after its own: rank 0 saves 8 and waits for the commit, rank 1 goes on
/// to step 9 and would wait for rank 0 in a collective. Rank 1's report of
/// step 8 without a save releases rank 0, whichever of the two messages
/// the controller reads first.
#[test]
fn a_preemption_request_that_splits_the_ranks_releases_the_one_waiting() {
    for rank1_first in [false, true] {
        let mut sim = Sim::running(2);
        sim.report(0, 7, true);
        sim.report(1, 7, true);
        sim.input(Input::Terminate);
        sim.take();
        let preempt = FromWorker::PreemptSave { step: 8 };
        if rank1_first {
            sim.report(1, 8, true);
            sim.take();
            sim.worker(0, preempt);
        } else {
            sim.worker(0, preempt);
            sim.take();
            sim.report(1, 8, true);
        }
        let released: Vec<(Conn, u64)> = sim
            .take()
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    to,
                    msg: Outgoing::Worker(ToWorker::Resume { step }),
                } => Some((*to, *step)),
                _ => None,
            })
            .collect();
        assert!(
            released.contains(&(0, 8)),
            "rank 0 is released from step 8 (rank 1 first: {rank1_first}): {released:?}"
        );
    }
}

#[test]
fn a_second_ctrl_c_takes_the_grace_away() {
    let mut sim = Sim::running(2);
    sim.input(Input::Interrupt { signal: SIGINT });
    assert_eq!(sim.stops_sent(), [(crate::STOP_GRACE_MS, false)]);
    sim.take();
    sim.until(0.3);
    sim.input(Input::Interrupt { signal: SIGINT });
    assert_eq!(
        sim.stops_sent(),
        [(0, false)],
        "the second stop has no grace"
    );
    assert_eq!(
        sim.m.status(),
        OutcomeStatus::Interrupted { signal: SIGINT }
    );
    // Exits that never come: the workers are given up at the stop deadline.
    let deadline = STOP_REPORT_SLACK.as_secs_f64() + 1.0;
    sim.take();
    sim.until(deadline + 0.1);
    let closed = sim
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Close { .. }))
        .count();
    assert_eq!(closed, 2, "both connections are closed");
    assert!(sim.finished());
}

#[test]
fn a_heartbeat_gap_that_is_the_controllers_own_stall_fails_nobody() {
    let mut sim = Sim::running(2);
    sim.alive_until(5.0);
    let wake = sim.m.poll_timeout().unwrap();
    assert_eq!(wake, sim.now + HEARTBEAT_TIMEOUT);
    // The controller is stopped for 30 s; the workers' heartbeats wait in
    // its sockets. It wakes far past the deadline it asked for.
    sim.now = sim.t0 + Duration::from_secs(35);
    sim.m.handle_timeout(sim.now).unwrap();
    assert!(sim.failed().is_none(), "{:?}", sim.failed());
    // The queued heartbeats arrive; the run goes on.
    sim.heartbeats();
    sim.alive_until(60.0);
    assert!(sim.failed().is_none());
}

#[test]
fn a_worker_that_truly_froze_is_still_found_after_a_stall() {
    let mut sim = Sim::running(2);
    sim.alive_until(5.0);
    sim.now = sim.t0 + Duration::from_secs(35);
    sim.m.handle_timeout(sim.now).unwrap();
    // Only rank 0 is heard from again.
    let f = sim.only_rank_0_heard(15).expect("rank 1 is unresponsive");
    assert_eq!(f.rank, 1);
    let Cause::Unresponsive { secs } = f.cause else {
        panic!("{:?}", f.cause)
    };
    assert!(secs >= 40.0, "the whole silence is reported: {secs}");
    assert!(sim.secs() <= 46.0, "found within 10 s of the wake");
}

#[test]
fn a_frozen_worker_fails_the_attempt_after_the_heartbeat_timeout() {
    let mut sim = Sim::running(2);
    let f = sim.only_rank_0_heard(20).expect("rank 1 froze");
    assert_eq!(f.rank, 1);
    assert!(matches!(f.cause, Cause::Unresponsive { secs } if (10.0..11.0).contains(&secs)));
}

#[test]
fn a_lost_connection_without_an_exit_fails_after_its_grace() {
    let mut sim = Sim::running(2);
    sim.input(Input::WorkerLost {
        rank: 1,
        clean: false,
    });
    sim.alive_until(CONNECTION_LOSS_GRACE.as_secs_f64() - 0.5);
    assert!(sim.failed().is_none());
    sim.alive_until(CONNECTION_LOSS_GRACE.as_secs_f64() + 0.5);
    let f = sim.failed().unwrap();
    assert_eq!((f.rank, f.cause), (1, Cause::ConnectionLost));
}

#[test]
fn a_hang_names_the_rank_with_the_oldest_report() {
    let mut p = plan(3);
    p.failure.hang_timeout_s = Some(30.0);
    let mut sim = Sim::running_with(p);
    for step in 0..25u32 {
        sim.alive_until(f64::from(step) + 1.0);
        sim.report(0, u64::from(step), false);
        sim.report(2, u64::from(step), false);
        if step < 5 {
            sim.report(1, u64::from(step), false);
        }
    }
    assert!(sim.failed().is_none());
    sim.alive_until(40.0);
    let f = sim.failed().expect("rank 1 hung");
    assert_eq!(f.rank, 1);
    assert!(matches!(
        f.cause,
        Cause::Hang {
            last_step: Some(4),
            after_finish_of: None,
            ..
        }
    ));
}

#[test]
fn with_a_metrics_file_rank_0s_steps_are_every_ranks_for_hang_detection() {
    let mut p = plan(2);
    p.failure.hang_timeout_s = Some(30.0);
    p.metrics_file = Some("metrics.txt".into());
    let mut sim = Sim::running_with(p);
    for step in 0..50u32 {
        sim.alive_until(f64::from(step) + 1.0);
        sim.report(0, u64::from(step), false);
    }
    assert!(sim.failed().is_none(), "rank 1 reports nothing of its own");
    // Rank 0's file stops growing: the program is hung.
    sim.alive_until(90.0);
    assert!(matches!(
        sim.failed().expect("hung").cause,
        Cause::Hang {
            last_step: Some(49),
            ..
        }
    ));
}

#[test]
fn a_rank_left_behind_by_a_finished_one_hangs_after_the_finish_timeout() {
    let mut p = plan(2);
    p.failure.finish_timeout_s = Some(20.0);
    let mut sim = Sim::running_with(p);
    sim.report(0, 9, false);
    sim.report(1, 3, false);
    // Rank 0 says goodbye and waits in JAX's shutdown barrier.
    sim.worker(0, FromWorker::Bye);
    sim.input(Input::WorkerLost {
        rank: 0,
        clean: true,
    });
    for _ in 0..25 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        sim.worker(1, FromWorker::Heartbeat);
        sim.agent(FromAgent::Heartbeat);
    }
    let f = sim.failed().expect("rank 1 is behind");
    assert_eq!(f.rank, 1);
    assert!(matches!(
        f.cause,
        Cause::Hang {
            last_step: Some(3),
            after_finish_of: Some(0),
            ..
        }
    ));
}

#[test]
fn meshrun_stop_waits_for_a_checkpoint_only_when_one_can_come() {
    let mut sim = Sim::running(1);
    sim.input(Input::StopRequested {
        now: false,
        reply: STOP_CLIENT,
    });
    let reply = sim.actions.iter().find_map(|a| match a {
        Action::Send {
            to: STOP_CLIENT,
            msg: Outgoing::Client(ClientReply::StopAccepted { what }),
        } => Some(what.clone()),
        _ => None,
    });
    assert!(reply.unwrap().contains("has not saved a checkpoint"));

    let mut sim = Sim::running(1);
    sim.report(0, 1, true);
    sim.input(Input::StopRequested {
        now: false,
        reply: STOP_CLIENT,
    });
    assert!(sim.stops_sent().is_empty(), "it waits for the checkpoint");
    assert!(sim.actions.iter().any(|a| matches!(
        a,
        Action::Send {
            to: 0,
            msg: Outgoing::Worker(ToWorker::CheckpointNow)
        }
    )));
}

#[test]
fn a_worker_of_another_attempt_is_turned_away() {
    let mut sim = Sim::running(1);
    sim.input(Input::WorkerJoined {
        rank: 0,
        attempt: 7,
        pid: 1,
        conn: 77,
    });
    assert_eq!(sim.take(), [Action::Close { conn: 77 }]);
    assert_eq!(
        sim.m.ranks[0].conn,
        Some(0),
        "the rank keeps its connection"
    );
}

#[test]
fn decisions_need_no_wall_clock() {
    // The whole suite above runs in simulated time: a run of 60 s takes
    // no real time at all.
    let started = Instant::now();
    let mut sim = Sim::running(4);
    sim.alive_until(600.0);
    assert!(sim.failed().is_none());
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn reports_a_worker_shed_are_counted_per_rank_and_noted_in_its_log() {
    let mut sim = Sim::running(2);
    assert!(
        sim.m.reports_shed().is_empty(),
        "nothing shed, nothing recorded"
    );
    sim.take();
    sim.worker(1, FromWorker::ReportsShed { count: 5 });
    sim.worker(1, FromWorker::ReportsShed { count: 2 });
    assert_eq!(sim.m.reports_shed(), vec![0, 7]);
    let notes: Vec<String> = sim
        .take()
        .into_iter()
        .filter_map(|a| match a {
            Action::Note { rank: 1, text } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(notes.len(), 2);
    assert!(
        notes[1].starts_with("2 reports dropped") && notes[1].contains("7 in this attempt"),
        "{notes:?}"
    );
}

#[test]
fn no_silence_is_judged_while_the_event_queue_is_backlogged() {
    // The driver finds the queue full each second for 30 s: the workers'
    // heartbeats may be waiting behind it in socket buffers.
    let mut sim = Sim::running(2);
    for _ in 0..30 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        sim.m.backlogged(sim.now);
        assert!(
            sim.failed().is_none(),
            "judged at {} s while backlogged",
            sim.secs()
        );
    }
    // The backlog is gone and rank 1 is silent: it is frozen 10 s later.
    let f = sim
        .only_rank_0_heard(12)
        .expect("rank 1 froze once the backlog cleared");
    assert_eq!(f.rank, 1);
    // The whole silence is reported.
    assert!(
        matches!(f.cause, Cause::Unresponsive { secs } if secs >= 40.0),
        "{:?}",
        f.cause
    );
    assert!(
        sim.secs() <= 41.0,
        "found within 11 s of the backlog's end: {}",
        sim.secs()
    );
}

#[test]
fn an_agents_output_lines_keep_its_host_alive() {
    // The agent's heartbeats are queued behind its lines, which the driver
    // handles itself: each line counts as word from the host.
    let mut sim = Sim::running(2);
    for _ in 0..30 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        sim.worker(0, FromWorker::Heartbeat);
        sim.worker(1, FromWorker::Heartbeat);
        assert_eq!(sim.m.agent_heard(AGENT, sim.now), Some(0));
    }
    assert!(sim.failed().is_none(), "{:?}", sim.failed());
    assert_eq!(
        sim.m.agent_heard(Conn::from(77u32), sim.now),
        None,
        "not an agent"
    );
}
