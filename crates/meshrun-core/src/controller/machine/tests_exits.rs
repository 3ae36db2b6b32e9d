//! Who ended a rank: "stopped by meshrun" is said only of what meshrun's
//! stop does (SIGTERM, SIGKILL, an exit code a program chose on SIGTERM);
//! a rank that aborted or crashed by itself while the group was being
//! stopped, or whose exit could not be read, ended on its own.

use meshrun_protocol::Message;
use meshrun_record::{Event, ExitInfo};

use super::sim::Sim;

fn ended(sim: &mut Sim, rank: u32, code: Option<i32>, signal: Option<i32>) {
    sim.agent(Message::WorkerExited {
        rank,
        exit: ExitInfo { code, signal },
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
