//! Who ended a rank: "stopped by meshrun" is said only of what meshrun's
//! stop does (SIGTERM, SIGKILL, an exit code a program chose on SIGTERM);
//! a rank that aborted or crashed by itself while the group was being
//! stopped, or whose exit could not be read, ended on its own.

use meshrun_protocol::{FromAgent, FromWorker};
use meshrun_record::{Event, ExitInfo};

use super::sim::Sim;

fn ended(sim: &mut Sim, rank: u32, code: Option<i32>, signal: Option<i32>) {
    sim.agent(FromAgent::WorkerExited {
        rank,
        exit: ExitInfo { code, signal },
        memory: None,
    });
}

fn said_stopped_by_meshrun(sim: &Sim) -> Vec<(u32, bool)> {
    sim.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::WorkerExited {
                rank,
                stopped_by_meshrun,
                ..
            } => Some((*rank, *stopped_by_meshrun)),
            _ => None,
        })
        .collect()
}

#[test]
fn only_what_meshrun_sends_is_said_to_be_meshruns() {
    let mut sim = Sim::running(5);
    // Rank 4 fails: meshrun stops the others.
    sim.exit(4, 1);
    assert_eq!(sim.failed().unwrap().rank, 4);
    ended(&mut sim, 0, None, Some(9)); // SIGKILL: meshrun's
    ended(&mut sim, 1, Some(143), None); // its SIGTERM handler's exit
    ended(&mut sim, 2, None, Some(6)); // SIGABRT: gloo's own abort
    ended(&mut sim, 3, None, None); // an exit nobody could read
    assert_eq!(
        said_stopped_by_meshrun(&sim),
        [(4, false), (0, true), (1, true), (2, false), (3, false)]
    );
    let ends = sim.m.rank_ends();
    let stopped: Vec<bool> = ends.iter().map(|e| e.stopped_by_meshrun).collect();
    assert_eq!(stopped, [true, true, false, false, false]);
    // The first failure stays the one reported: the others' ends, whoever
    // made them, are part of the group's stop.
    assert_eq!(sim.failed().unwrap().rank, 4);
}

#[test]
fn a_rank_that_aborts_before_any_stop_is_the_failure() {
    let mut sim = Sim::running(2);
    ended(&mut sim, 1, None, Some(6));
    let f = sim.failed().unwrap();
    assert_eq!(f.rank, 1);
    assert_eq!(said_stopped_by_meshrun(&sim), [(1, false)]);
}

fn raised(sim: &mut Sim, rank: u32, message: &str) {
    sim.worker(
        rank,
        FromWorker::Failure {
            kind: "JaxRuntimeError".into(),
            message: message.into(),
            traceback: String::new(),
        },
    );
}

const RESET: &str = "UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:1177: Connection reset by peer";

fn failures_recorded(sim: &Sim) -> Vec<u32> {
    sim.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::WorkerFailed(f) => Some(f.rank),
            _ => None,
        })
        .collect()
}

#[test]
fn a_killed_rank_is_the_cause_though_its_peers_collective_error_came_first() {
    // Rank 1 is SIGKILLed: rank 0's all-reduce fails at once, and its
    // report arrives before rank 1's agent reports the exit.
    let mut sim = Sim::running(2);
    raised(&mut sim, 0, RESET);
    assert!(sim.failed().is_none(), "held while its cause may come");
    assert!(sim.stops_sent().is_empty() && !sim.finished());
    sim.until(sim.secs() + 0.05);
    ended(&mut sim, 1, None, Some(9));
    let f = sim.failed().unwrap();
    assert_eq!(f.rank, 1);
    assert!(matches!(f.cause, meshrun_record::Cause::Exit { exit } if exit.signal == Some(9)));
    assert_eq!(said_stopped_by_meshrun(&sim), [(1, false)]);
    assert_eq!(failures_recorded(&sim), [1], "one failure, the cause's");
    assert!(
        !sim.stops_sent().is_empty(),
        "stopped as soon as the cause came"
    );
}

#[test]
fn a_peer_loss_with_no_cause_in_sight_fails_the_attempt_at_the_graces_end() {
    let mut sim = Sim::running(2);
    let t = sim.secs();
    raised(&mut sim, 0, RESET);
    // Its own exit (it raised, so it ends) is no cause either.
    ended(&mut sim, 0, Some(1), None);
    let grace = super::peer_loss::PEER_LOSS_GRACE.as_secs_f64();
    sim.until(t + grace - 0.01);
    assert!(sim.failed().is_none());
    sim.until(t + grace + 0.01);
    let f = sim.failed().unwrap();
    assert_eq!(f.rank, 0);
    assert!(
        matches!(&f.cause, meshrun_record::Cause::Exception { message, .. } if message == RESET)
    );
    assert_eq!(failures_recorded(&sim), [0]);
}

#[test]
fn an_exception_that_is_not_a_lost_peer_fails_the_attempt_at_once() {
    let mut sim = Sim::running(2);
    raised(&mut sim, 1, "ValueError: the loss is nan");
    assert_eq!(sim.failed().unwrap().rank, 1);
}

#[test]
fn each_ranks_log_says_which_rank_failed_and_why() {
    // Rank 1 raises, then meshrun stops both: the two logs end apart.
    let mut sim = Sim::running(2);
    sim.take();
    sim.worker(
        1,
        FromWorker::Failure {
            kind: "ValueError".into(),
            message: "boom".into(),
            traceback: String::new(),
        },
    );
    ended(&mut sim, 1, None, Some(9));
    ended(&mut sim, 0, None, Some(9));
    let notes: Vec<(u32, String)> = sim
        .take()
        .into_iter()
        .filter_map(|a| match a {
            crate::Action::Note { rank, text } => Some((rank, text)),
            _ => None,
        })
        .collect();
    assert_eq!(
        notes,
        [
            (
                1,
                "rank 1 ended with signal 9 (SIGKILL), after it raised ValueError: boom"
                    .to_string()
            ),
            (
                0,
                "rank 0 ended with signal 9 (SIGKILL): meshrun stopped it after rank 1 failed"
                    .to_string()
            ),
        ]
    );
}
