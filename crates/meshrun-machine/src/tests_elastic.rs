//! Elastic runs on a simulated clock: the attempt's size, host ranks
//! renumbered, hosts that wait, the stop that grows the run, and a run
//! left with fewer hosts than MIN.

use meshrun_protocol::{ToAgent, ToWorker};
use std::time::Duration;

use meshrun_record::Event;

use super::sim::{plan, Sim};
use super::*;
use crate::OutcomeStatus;
use meshrun_plan::Elastic;

/// Connections of hosts 0..3.
const H: [Conn; 4] = [500, 501, 502, 503];
const REJOIN: Duration = Duration::from_secs(10);

/// Up to 4 hosts of one worker each, at least `min`, joining by themselves.
fn elastic_plan(min: u32, any_count: bool) -> RunPlan {
    let mut p = plan(4);
    p.hosts = 4;
    p.procs_per_host = 1;
    p.rendezvous = true;
    p.elastic = Some(Elastic {
        min_hosts: min,
        rejoin_timeout_s: Some(REJOIN.as_secs_f64()),
        any_count,
    });
    p
}

/// Attempt `attempt`; a restart after one that ran on `previous` hosts.
fn setup(attempt: u32, previous: Option<u32>, join_timeout: Duration) -> Setup {
    Setup {
        attempt,
        run_id: "0123456789abcdef".into(),
        token_hex: "00".repeat(32),
        control_addr: "10.0.0.10:4000".into(),
        user_xla_flags: None,
        resume_step: Some(4),
        join_timeout,
        payload: None,
        storage_probe: None,
        first_joined_host: 1,
        memory_step: Some(4),
        previous_hosts: previous,
        expected_hosts: previous,
        resize_reason: None,
    }
}

fn ip(h: usize) -> String {
    format!("10.0.0.{}", 10 + h)
}

fn join(sim: &mut Sim, h: usize, asks: Option<u32>) {
    sim.join_host(H[h], asks, &ip(h));
}

fn launch_env(sim: &Sim, conn: Conn) -> Option<Vec<(String, String)>> {
    sim.sent_to(conn).into_iter().find_map(|m| match m {
        ToAgent::Launch { workers, .. } => Some(workers[0].env.clone()),
        _ => None,
    })
}

fn var<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn resized(sim: &Sim) -> Option<(u32, Option<u32>, String)> {
    sim.events().into_iter().find_map(|e| match e {
        Event::Resized {
            hosts,
            previous_hosts,
            reason,
            ..
        } => Some((*hosts, *previous_hosts, reason.clone())),
        _ => None,
    })
}

#[test]
fn a_first_attempt_waits_for_every_host_then_starts_on_the_largest_count_dividing_max() {
    let mut sim = Sim::with_setup(
        elastic_plan(2, false),
        setup(1, None, Duration::from_mins(5)),
    );
    for h in 0..3 {
        join(&mut sim, h, (h == 0).then_some(0));
    }
    sim.until(9.9);
    assert!(
        !sim.m.launched(),
        "3 of 4: it waits the rejoin timeout for the 4th"
    );
    sim.until(10.1);
    assert!(sim.m.launched());
    assert_eq!(sim.m.hosts_launched(), Some(2));
    assert_eq!(sim.m.world(), 2);
    assert!(sim.actions.contains(&Action::Sized {
        hosts: 2,
        nprocs: 2
    }));
    let (hosts, previous, reason) = resized(&sim).expect("a resize recorded");
    assert_eq!((hosts, previous), (2, None));
    assert!(
        reason.contains("3 of 4 hosts joined")
            && reason.contains("the largest count that divides 4"),
        "{reason}"
    );
    // Hosts 0 and 1 run; host 2 waits, sent nothing to launch.
    let env = launch_env(&sim, H[1]).expect("host 1 launched");
    assert_eq!(var(&env, "MESHRUN_WORLD_SIZE"), Some("2"));
    assert_eq!(var(&env, "MESHRUN_MAX_WORLD_SIZE"), Some("4"));
    assert_eq!(var(&env, "MESHRUN_MIN_WORLD_SIZE"), Some("2"));
    assert!(var(&env, "MESHRUN_RESIZE_REASON").is_some());
    assert!(launch_env(&sim, H[2]).is_none());
    // A run that gets every host starts at once, without a resize.
    let mut sim = Sim::with_setup(
        elastic_plan(2, false),
        setup(1, None, Duration::from_mins(5)),
    );
    for h in 0..4 {
        join(&mut sim, h, None);
    }
    assert_eq!(sim.m.hosts_launched(), Some(4));
    assert!(resized(&sim).is_none());
}

#[test]
fn any_host_count_runs_on_every_host_there() {
    let mut sim = Sim::with_setup(
        elastic_plan(2, true),
        setup(1, None, Duration::from_mins(5)),
    );
    for h in 0..3 {
        join(&mut sim, h, None);
    }
    sim.until(10.1);
    assert_eq!(sim.m.hosts_launched(), Some(3));
}

#[test]
fn a_restart_renumbers_the_hosts_there_and_the_others_wait() {
    // Host 1 is lost for good; 0, 2 and 3 come back asking for their ranks.
    let mut sim = Sim::with_setup(elastic_plan(2, false), setup(2, Some(4), REJOIN));
    join(&mut sim, 0, Some(0));
    join(&mut sim, 2, Some(2));
    join(&mut sim, 3, Some(3));
    assert!(!sim.m.launched(), "it waits for host 1");
    sim.until(10.1);
    assert_eq!(sim.m.hosts_launched(), Some(2));
    // Host 2 is rank 1 now, and told so before its launch.
    assert_eq!(sim.m.host_of(H[2]), Some(1));
    let to_h2 = sim.sent_to(H[2]);
    let assigned = to_h2
        .iter()
        .position(|m| matches!(m, ToAgent::HostAssigned { host: 1, .. }))
        .expect("renumbered");
    let launched = to_h2
        .iter()
        .position(|m| matches!(m, ToAgent::Launch { .. }))
        .expect("launched");
    assert!(assigned < launched);
    let env = launch_env(&sim, H[2]).unwrap();
    assert_eq!(var(&env, "MESHRUN_RANK"), Some("1"));
    assert_eq!(var(&env, "MESHRUN_PREVIOUS_WORLD_SIZE"), Some("4"));
    // Another layout: the memory checkpoint is not used, storage is.
    assert_eq!(var(&env, "MESHRUN_RESUME_FROM"), None);
    assert_eq!(var(&env, "MESHRUN_RESUME_STEP"), Some("4"));
    assert!(launch_env(&sim, H[3]).is_none(), "host 3 waits");
    let (_, previous, reason) = resized(&sim).unwrap();
    assert_eq!(previous, Some(4));
    assert!(reason.contains("shrinking from 4 to 2"), "{reason}");
    // When the attempt ends, the waiting host is told to join again.
    sim.take();
    sim.m.shutdown(true);
    sim.actions.extend(sim.m.drain_actions());
    assert!(sim.sent_to(H[3]).contains(&&ToAgent::Shutdown {
        again: true,
        state: None
    }));
}

#[test]
fn a_restart_with_fewer_than_min_hosts_ends_naming_those_it_had() {
    let mut sim = Sim::with_setup(elastic_plan(2, false), setup(2, Some(2), REJOIN));
    join(&mut sim, 0, Some(0));
    sim.until(9.9);
    assert!(!sim.m.launched());
    let at = sim.t0 + Duration::from_secs_f64(10.1);
    assert_eq!(sim.m.poll_timeout(), Some(sim.t0 + REJOIN));
    let err = sim.m.handle_timeout(at).expect_err("too few hosts");
    let text = err.to_string();
    assert!(
        matches!(&err, AttemptError::TooFewHosts { had, min: 2, max: 4, secs: 10, .. } if had == &["host 0 (10.0.0.10)".to_string()]),
        "{err:?}"
    );
    assert!(
        text.contains("only 1 host(s) came within 10 s (host 0 (10.0.0.10))"),
        "{text}"
    );
    assert!(
        text.contains("needs at least 2 of its 4 (--hosts 2:4)"),
        "{text}"
    );
}

/// An attempt launched on hosts 0 and 1, its two ranks connected (conn =
/// rank) and checkpointing.
fn running_on_two() -> Sim {
    let mut restart = setup(2, Some(2), REJOIN);
    restart.memory_step = None;
    let mut sim = Sim::with_setup(elastic_plan(2, false), restart);
    join(&mut sim, 0, Some(0));
    join(&mut sim, 1, Some(1));
    assert_eq!(
        sim.m.hosts_launched(),
        Some(2),
        "as many as the attempt before"
    );
    for rank in 0..2 {
        sim.input(Input::WorkerJoined {
            rank,
            attempt: 2,
            pid: 100 + rank,
            conn: Conn::from(rank),
        });
    }
    sim.report(0, 5, true);
    sim.report(1, 5, true);
    sim.take();
    sim
}

#[test]
fn hosts_that_join_a_running_attempt_wait_and_the_run_grows_at_the_checkpoint_they_ask_for() {
    let mut sim = running_on_two();
    // A third host makes 3 of 4: still 2 by the rule, so it only waits.
    join(&mut sim, 2, None);
    assert!(sim.events().iter().any(|e| matches!(
        e,
        Event::HostWaiting {
            running: 2,
            waiting: 1,
            ..
        }
    )));
    assert!(!sim.sent_to(0).contains(&&ToWorker::CheckpointNow));
    assert!(sim
        .sent_to(H[2])
        .iter()
        .all(|m| !matches!(m, ToAgent::Refused { .. } | ToAgent::HostAssigned { .. })));
    // The fourth: every rank saves at its next report.
    join(&mut sim, 3, None);
    for rank in 0..2u32 {
        assert!(sim
            .sent_to(Conn::from(rank))
            .contains(&&ToWorker::CheckpointNow));
    }
    assert!(sim.events().iter().any(|e| matches!(
        e,
        Event::Growing {
            from_hosts: 2,
            to_hosts: 4,
            ..
        }
    )));
    // A fifth is one too many.
    sim.join_host(600, None, "10.0.0.20");
    assert!(sim.sent_to(600).iter().any(|m| matches!(
        m,
        ToAgent::Refused { reason } if reason == "the run has the most hosts it takes (4, running or waiting)"
    )));
    // The save commits: the group is stopped, not failed.
    sim.take();
    sim.input(Input::Committed {
        step: 6,
        path: "ckpt/step-6".into(),
    });
    assert!(sim.events().iter().any(
        |e| matches!(e, Event::Stopping { reason, .. } if reason == "growing to 4 hosts after checkpoint step 6")
    ));
    assert!(sim.m.failure().is_none());
    assert_eq!(sim.m.status(), OutcomeStatus::Resized { hosts: 4 });
}

#[test]
fn a_waiting_host_that_leaves_is_forgotten_and_sigterm_turns_a_grow_into_a_preemption() {
    let mut sim = running_on_two();
    join(&mut sim, 2, None);
    sim.input(Input::AgentLost {
        conn: H[2],
        error: "reset".into(),
    });
    assert!(sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::HostWaitingLeft { ip, .. } if ip == "10.0.0.12")));
    assert!(
        sim.m.failure().is_none(),
        "a waiting host is not the attempt's"
    );
    join(&mut sim, 2, None);
    join(&mut sim, 3, None);
    assert!(sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::Growing { .. })));
    sim.input(Input::Terminate);
    sim.input(Input::Committed {
        step: 6,
        path: "ckpt/step-6".into(),
    });
    assert_eq!(sim.m.status(), OutcomeStatus::Preempted { step: 6 });
}

fn announced(sim: &Sim) -> Vec<&str> {
    sim.actions
        .iter()
        .filter_map(|a| match a {
            Action::Announce { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_attempt_on_another_host_count_says_so_with_the_count() {
    // A first attempt that starts on fewer than MAX.
    let mut sim = Sim::with_setup(
        elastic_plan(1, false),
        setup(1, None, Duration::from_mins(5)),
    );
    join(&mut sim, 0, Some(0));
    sim.until(10.1);
    assert_eq!(sim.m.hosts_launched(), Some(1));
    assert_eq!(
        announced(&sim),
        ["meshrun: attempt 1 starts on 1 of 4 hosts: 1 joined within 10 s"]
    );
    // A restart that shrinks, by the rule.
    let mut sim = Sim::with_setup(elastic_plan(2, false), setup(2, Some(4), REJOIN));
    for h in [0, 2, 3] {
        join(&mut sim, h, Some(h as u32));
    }
    sim.until(10.1);
    assert_eq!(
        announced(&sim),
        [
            "meshrun: attempt 2 shrinks from 4 to 2 hosts: 3 of 4 came back within 10 s \
             (the largest count that divides 4)"
        ]
    );
    // A restart that grows (after the stop that asked for it).
    let mut grow = setup(3, Some(2), REJOIN);
    grow.expected_hosts = Some(4);
    let mut sim = Sim::with_setup(elastic_plan(2, false), grow);
    for h in 0..4 {
        join(&mut sim, h, None);
    }
    assert_eq!(
        announced(&sim),
        ["meshrun: attempt 3 grows from 2 to 4 hosts: 4 of 4 are there"]
    );
    // The same count as before, or all MAX at first: nothing to say.
    let mut sim = Sim::with_setup(
        elastic_plan(2, false),
        setup(1, None, Duration::from_mins(5)),
    );
    for h in 0..4 {
        join(&mut sim, h, None);
    }
    assert!(sim.m.launched() && announced(&sim).is_empty());
    let mut same = setup(2, Some(2), REJOIN);
    same.memory_step = None;
    let mut sim = Sim::with_setup(elastic_plan(2, false), same);
    join(&mut sim, 0, Some(0));
    join(&mut sim, 1, Some(1));
    assert_eq!(sim.m.hosts_launched(), Some(2));
    assert!(announced(&sim).is_empty());
}

#[test]
fn a_restart_to_grow_waits_for_the_hosts_it_grew_to_past_the_rejoin_timeout() {
    // Attempt 1 ran on 2 hosts and stopped because 4 were there. Host 3's
    // new agent is slow to start: the restart waits for it rather than
    // running on 3 and stopping again to grow.
    let mut grow = setup(2, Some(2), Duration::from_mins(1));
    grow.expected_hosts = Some(4);
    let mut sim = Sim::with_setup(elastic_plan(2, true), grow);
    for h in 0..3 {
        join(&mut sim, h, None);
    }
    sim.until(REJOIN.as_secs_f64() * 2.0);
    assert!(
        !sim.m.launched(),
        "it waits for the fourth host past the rejoin timeout"
    );
    join(&mut sim, 3, None);
    assert_eq!(sim.m.hosts_launched(), Some(4));
    // One that never comes: the join timeout ends the wait, on those there.
    let mut grow = setup(2, Some(2), Duration::from_mins(1));
    grow.expected_hosts = Some(4);
    let mut sim = Sim::with_setup(elastic_plan(2, true), grow);
    for h in 0..3 {
        join(&mut sim, h, None);
    }
    sim.until(60.5);
    assert_eq!(sim.m.hosts_launched(), Some(3));
}
