//! The start: an attempt that reports no step while the cluster holds
//! back resources fails, naming what waits, and a slow start with nothing
//! waiting never does; a worker that cannot start for a reason a restart
//! meets again (a folder or program missing on its host) is a failure of
//! that kind.

use meshrun_protocol::message::SpawnProblem;
use meshrun_protocol::FromAgent;
use meshrun_record::{Cause, Event};

use super::sim::{plan, Sim};
use super::Input;
use crate::Action;

const WAIT: &str = "1 task needs {'CPU': 1.0}; free: CPU 0 of 4";

fn waiting(sim: &mut Sim, what: Option<&str>) {
    sim.input(Input::ResourcesWaiting {
        what: what.map(str::to_string),
    });
}

fn with_start_timeout(secs: f64) -> Sim {
    let mut p = plan(2);
    p.failure.start_timeout_s = Some(secs);
    Sim::running_with(p)
}

#[test]
fn a_wait_that_outlasts_the_start_timeout_fails_the_attempt_naming_it() {
    let mut sim = with_start_timeout(60.0);
    sim.alive_until(5.0);
    waiting(&mut sim, Some(WAIT));
    assert!(sim.take().contains(&Action::Waiting {
        what: Some(WAIT.into())
    }));
    sim.alive_until(59.5);
    assert!(sim.failed().is_none());
    sim.alive_until(61.0);
    let f = sim.failed().expect("the start timeout is over");
    let Cause::StartTimeout { secs, waiting } = f.cause else {
        panic!("{:?}", f.cause)
    };
    assert_eq!(f.rank, 0);
    assert!((60.0..61.0).contains(&secs), "{secs}");
    assert_eq!(waiting, WAIT);
}

#[test]
fn a_slow_start_with_nothing_waiting_is_never_failed() {
    let mut sim = with_start_timeout(60.0);
    // The wait was seen, and cleared: a long compilation follows.
    waiting(&mut sim, Some(WAIT));
    sim.alive_until(20.0);
    waiting(&mut sim, None);
    sim.alive_until(600.0);
    assert!(sim.failed().is_none());
    let events = sim.events();
    let waits: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::WaitingForResources { what, .. } => Some(what.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(waits, vec![Some(WAIT.to_string()), None]);
}

#[test]
fn a_step_before_the_timeout_ends_the_watch() {
    let mut sim = with_start_timeout(60.0);
    waiting(&mut sim, Some(WAIT));
    sim.alive_until(30.0);
    sim.report(0, 0, false);
    // Data that waits after the first step is the hang timeout's business,
    // and is neither recorded nor shown: streaming queues work all the time.
    sim.take();
    waiting(&mut sim, Some("3 Ray tasks or actors of {'CPU': 1.0}"));
    let after = sim.take();
    assert_eq!(after, vec![Action::Waiting { what: None }]);
    waiting(&mut sim, None);
    waiting(&mut sim, Some(WAIT));
    assert!(sim.take().is_empty());
    sim.alive_until(300.0);
    assert!(sim.failed().is_none());
}

#[test]
fn a_wait_that_begins_after_the_timeout_gets_a_grace_to_clear() {
    let mut sim = with_start_timeout(60.0);
    sim.alive_until(100.0);
    waiting(&mut sim, Some(WAIT));
    // A new description of the same wait does not restart its clock.
    sim.alive_until(110.0);
    waiting(
        &mut sim,
        Some("2 tasks need {'CPU': 1.0}; free: CPU 0 of 4"),
    );
    sim.alive_until(129.0);
    assert!(sim.failed().is_none());
    sim.alive_until(131.0);
    let f = sim.failed().expect("the late wait lasted its grace");
    assert!(matches!(f.cause, Cause::StartTimeout { secs, .. } if (130.0..131.0).contains(&secs)));
}

#[test]
fn a_late_wait_that_clears_in_time_fails_nothing() {
    let mut sim = with_start_timeout(60.0);
    sim.alive_until(100.0);
    waiting(&mut sim, Some(WAIT));
    sim.alive_until(110.0);
    waiting(&mut sim, None);
    sim.alive_until(200.0);
    assert!(sim.failed().is_none());
}

#[test]
fn a_start_that_failed_for_a_missing_folder_or_program_is_one_no_restart_can_change() {
    let cases = [
        (SpawnProblem::NoWorkingFolder, true),
        (SpawnProblem::NoProgram, true),
        (SpawnProblem::NotExecutable, true),
        (SpawnProblem::Other, false),
    ];
    for (problem, lasting) in cases {
        let mut sim = Sim::new(plan(2));
        sim.join_agent();
        sim.agent(FromAgent::WorkerStarted {
            rank: 0,
            pid: 100,
            warm: false,
        });
        sim.agent(FromAgent::SpawnFailed {
            rank: 1,
            error: "the run's working folder '/w' is not on this host".into(),
            problem,
        });
        let f = sim.failed().expect("the start failed");
        assert_eq!(f.rank, 1);
        assert!(
            matches!(&f.cause, Cause::SpawnFailed { error, deterministic }
                if error.contains("'/w'") && *deterministic == lasting),
            "{problem:?}: {:?}",
            f.cause
        );
        assert_eq!(f.cause.restart_cannot_change(), lasting, "{problem:?}");
    }
}

#[test]
fn rank_0s_first_step_is_recorded_once_with_the_figures_it_came_with() {
    let mut sim = Sim::running(2);
    let timing = meshrun_record::Timing {
        proc_start: 100.0,
        user_start: 100.5,
        now: 103.0,
        compile: 1.2,
        init: 0.1,
        restore: 0.3,
        ..Default::default()
    };
    sim.report(1, 6, false);
    let first = |step| meshrun_protocol::FromWorker::Report {
        step: Some(step),
        metrics: serde_json::json!({"loss": 1.0}),
        checkpoint: false,
        timing: Some(timing.clone()),
        saving: true,
        total_steps: None,
    };
    sim.worker(0, first(6));
    sim.worker(0, first(7));
    let firsts: Vec<_> = sim
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::FirstStep { .. }))
        .cloned()
        .collect();
    assert_eq!(
        firsts,
        vec![Event::FirstStep {
            attempt: 1,
            step: 6,
            timing: Some(timing.clone()),
        }],
        "rank 1's report is not rank 0's, and step 7 is not the first"
    );
}
