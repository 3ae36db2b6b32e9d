//! What an attempt ends as when it is stopped: a stop asked for with
//! `meshrun stop` is a stop (its own state and exit status), a signal to
//! meshrun an interruption by that signal, and a failure stays a failure.

use meshrun_record::{Event, RunState};

use super::sim::{Sim, STOP_CLIENT};
use super::Input;
use crate::{Outcome, OutcomeStatus, EXIT_STOPPED, STOP_GRACE_MS};

fn stop(sim: &mut Sim, now: bool) {
    sim.input(Input::StopRequested {
        now,
        reply: STOP_CLIENT,
    });
}

fn exit_code(status: OutcomeStatus) -> i32 {
    Outcome {
        status,
        name: "sim".into(),
        run_dir: "runs/sim".into(),
        failure: None,
        summary: None,
        last_metrics: None,
        attempts: 1,
    }
    .exit_code()
}

#[test]
fn meshrun_stop_now_ends_the_attempt_as_stopped_not_interrupted() {
    let mut sim = Sim::running(2);
    sim.report(0, 1, true);
    sim.report(1, 1, true);
    sim.take();
    stop(&mut sim, true);
    assert_eq!(sim.stops_sent(), [(STOP_GRACE_MS, false)]);
    assert!(sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::Stopping { reason, .. } if reason == "meshrun stop --now")));
    let status = sim.m.status();
    assert_eq!(status, OutcomeStatus::Stopped { now: true });
    assert_eq!(status.state(), RunState::Stopped);
    assert_eq!(exit_code(status), EXIT_STOPPED);
    assert!(sim.failed().is_none());
}

#[test]
fn a_plain_stop_without_a_checkpoint_to_end_at_is_a_stop_too() {
    // The program saves none: it stops at once.
    let mut sim = Sim::running(1);
    stop(&mut sim, false);
    assert_eq!(sim.m.status(), OutcomeStatus::Stopped { now: false });
    // The save it asked for never comes: it stops at the grace deadline.
    let mut sim = Sim::running(1);
    sim.report(0, 1, true);
    stop(&mut sim, false);
    assert!(sim.stops_sent().is_empty(), "it waits for the save");
    sim.alive_until(61.0);
    assert_eq!(sim.stops_sent().len(), 1);
    assert_eq!(sim.m.status(), OutcomeStatus::Stopped { now: false });
}

#[test]
fn a_signal_to_meshrun_is_still_an_interruption_and_a_failure_stays_one() {
    let mut sim = Sim::running(1);
    sim.input(Input::Terminate);
    let status = sim.m.status();
    assert_eq!(status, OutcomeStatus::Interrupted { signal: 15 });
    assert_eq!(
        (status.state(), exit_code(status)),
        (RunState::Interrupted, 143)
    );
    let mut sim = Sim::running(1);
    sim.input(Input::Interrupt { signal: 2 });
    assert_eq!(sim.m.status(), OutcomeStatus::Interrupted { signal: 2 });
    // SIGTERM asked for a save; `stop --now` then ends it as a stop.
    let mut sim = Sim::running(1);
    sim.report(0, 1, true);
    sim.input(Input::Terminate);
    stop(&mut sim, true);
    assert_eq!(sim.m.status(), OutcomeStatus::Stopped { now: true });
    // A stop asked for while a failure stops the group only hurries it.
    let mut sim = Sim::running(2);
    sim.exit(1, 1);
    assert!(sim.failed().is_some());
    sim.take();
    stop(&mut sim, true);
    assert_eq!(sim.stops_sent(), [(0, false)]);
    assert_eq!(sim.m.status(), OutcomeStatus::Failed);
}
