//! Hosts joining, the storage check, the function sent to them, their
//! stacks, and a host cut off: the machine on a simulated clock.

use meshrun_protocol::{FromAgent, FromWorker, ToAgent};
use std::sync::Arc;
use std::time::Duration;

use meshrun_record::{Cause, Event};

use super::deadlines::HEARTBEAT_TIMEOUT;
use super::sim::{plan, Sim};
use super::*;

const H0: Conn = 500;
const H1: Conn = 501;
const H2: Conn = 502;

/// `hosts` hosts of one worker each, hosts 1.. joining by themselves.
fn joined_plan(hosts: u32) -> RunPlan {
    let mut p = plan(hosts);
    p.hosts = hosts;
    p.procs_per_host = 1;
    p.rendezvous = true;
    p
}

fn setup(probe: bool, payload: Option<&[u8]>) -> Setup {
    Setup {
        attempt: 1,
        run_id: "0123456789abcdef".into(),
        token_hex: "00".repeat(32),
        control_addr: "10.0.0.10:4000".into(),
        user_xla_flags: None,
        resume_step: None,
        join_timeout: Duration::from_mins(5),
        payload: payload.map(Arc::from),
        storage_probe: probe.then(|| StorageProbe {
            storage: "/shared".into(),
            path: "/shared/run/.marker".into(),
            expect: "abc".into(),
        }),
        first_joined_host: 1,
        memory_step: None,
        previous_hosts: None,
        expected_hosts: None,
        resize_reason: None,
    }
}

fn storage_ok(sim: &mut Sim, conn: Conn) {
    sim.input(Input::FromAgent {
        conn,
        msg: FromAgent::StorageChecked { problem: None },
    });
}

#[test]
fn hosts_get_ranks_in_the_order_they_join_unless_they_name_one() {
    let mut sim = Sim::with_setup(joined_plan(3), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.12");
    sim.join_host(H2, None, "10.0.0.11");
    assert_eq!(sim.m.host_of(H1), Some(1));
    assert_eq!(sim.m.host_of(H2), Some(2));
    assert!(sim
        .sent_to(H1)
        .iter()
        .any(|m| matches!(m, ToAgent::HostAssigned { host: 1, .. })));
    assert!(sim.m.launched(), "all three joined");

    // A named rank is kept, and the next joiner gets the one left.
    let mut sim = Sim::with_setup(joined_plan(3), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H2, Some(2), "10.0.0.12");
    sim.join_host(H1, None, "10.0.0.11");
    assert_eq!((sim.m.host_of(H2), sim.m.host_of(H1)), (Some(2), Some(1)));
}

#[test]
fn a_rank_taken_out_of_range_or_one_host_too_many_is_refused_with_the_reason() {
    let mut sim = Sim::with_setup(joined_plan(2), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, Some(5), "10.0.0.11");
    let refused = |sim: &Sim, conn| {
        sim.sent_to(conn).iter().find_map(|m| match m {
            ToAgent::Refused { reason } => Some(reason.clone()),
            _ => None,
        })
    };
    let reason = refused(&sim, H1).expect("refused");
    assert!(
        reason.contains("host rank 5 is out of range: the run has 2 host(s)"),
        "{reason}"
    );
    assert!(sim.actions.contains(&Action::Close { conn: H1 }));
    sim.join_host(H2, Some(0), "10.0.0.12");
    assert!(refused(&sim, H2)
        .unwrap()
        .contains("host rank 0 is taken (by 10.0.0.10)"));
    // The run gets its second host and starts; a third is turned away.
    sim.join_host(H1 + 10, None, "10.0.0.11");
    assert!(sim.m.launched());
    sim.join_host(H2 + 10, None, "10.0.0.13");
    assert!(refused(&sim, H2 + 10)
        .unwrap()
        .contains("already started with its 2 host(s)"));
    let refusals = sim
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::AgentRefused { .. }))
        .count();
    assert_eq!(refusals, 3);
}

#[test]
fn nothing_launches_before_every_host_has_read_the_storage_marker() {
    let mut sim = Sim::with_setup(joined_plan(2), setup(true, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.11");
    assert!(sim.sent_to(H1).contains(&&ToAgent::CheckStorage {
        path: "/shared/run/.marker".into(),
        expect: "abc".into()
    }));
    storage_ok(&mut sim, H0);
    assert!(!sim.m.launched(), "host 1 has not answered");
    storage_ok(&mut sim, H1);
    assert!(sim.m.launched());
}

#[test]
fn a_host_that_cannot_see_the_storage_stops_the_run_naming_it_and_the_path() {
    let mut sim = Sim::with_setup(joined_plan(2), setup(true, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.11");
    storage_ok(&mut sim, H0);
    let err = sim
        .m
        .handle(
            sim.now,
            Input::FromAgent {
                conn: H1,
                msg: FromAgent::StorageChecked {
                    problem: Some("the marker file is not there".into()),
                },
            },
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("host 1 (10.0.0.11) cannot see the run's storage '/shared'"),
        "{text}"
    );
    assert!(!sim.m.launched());
}

#[test]
fn hosts_that_never_join_are_named_when_the_join_timeout_passes() {
    let mut sim = Sim::with_setup(joined_plan(3), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    let wake = sim.m.poll_timeout().unwrap();
    assert_eq!(wake, sim.t0 + Duration::from_mins(5));
    let err = sim.m.handle_timeout(wake).unwrap_err().to_string();
    assert!(
        err.starts_with("hosts 1, 2 did not join within 300 s"),
        "{err}"
    );
}

#[test]
fn the_function_goes_to_every_host_in_parts_before_its_launch() {
    let payload: Vec<u8> = (0..1_200_000u32).map(|i| (i % 251) as u8).collect();
    let mut sim = Sim::with_setup(joined_plan(2), setup(false, Some(&payload)));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.11");
    for conn in [H0, H1] {
        let msgs = sim.sent_to(conn);
        let parts: Vec<(&String, bool)> = msgs
            .iter()
            .filter_map(|m| match m {
                ToAgent::FunctionPart { data, last } => Some((data, *last)),
                _ => None,
            })
            .collect();
        assert_eq!(parts.len(), 3, "1.2 MB in parts of 512 KiB");
        assert_eq!(parts.iter().filter(|(_, last)| *last).count(), 1);
        assert!(parts[2].1);
        let mut back = Vec::new();
        for (data, _) in &parts {
            base64::Engine::decode_vec(&base64::engine::general_purpose::STANDARD, data, &mut back)
                .unwrap();
        }
        assert_eq!(back, payload);
        let launch = msgs
            .iter()
            .position(|m| matches!(m, ToAgent::Launch { .. }));
        let last_part = msgs
            .iter()
            .rposition(|m| matches!(m, ToAgent::FunctionPart { .. }));
        assert!(last_part < launch, "the function comes first");
    }
}

#[test]
fn stacks_an_agent_sends_are_written_for_its_own_ranks_only() {
    let mut sim = Sim::with_setup(joined_plan(2), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.11");
    sim.take();
    for rank in [0, 1] {
        sim.input(Input::FromAgent {
            conn: H1,
            msg: FromAgent::Stacks {
                rank,
                text: format!("stacks of {rank}"),
            },
        });
    }
    assert_eq!(
        sim.take(),
        vec![Action::WriteStacks {
            rank: 1,
            text: "stacks of 1".into()
        }]
    );
}

/// Both hosts launched and their workers connected.
fn running_on_two_hosts() -> Sim {
    let mut sim = Sim::with_setup(joined_plan(2), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.11");
    for (rank, conn) in [(0, H0), (1, H1)] {
        sim.start_worker(conn, rank, 10 + Conn::from(rank));
    }
    sim.take();
    sim
}

#[test]
fn a_host_cut_off_fails_the_attempt_naming_the_host_and_its_address() {
    let mut sim = running_on_two_hosts();
    sim.alive_until(5.0);
    // Host 1 falls silent: its agent and its worker alike.
    for _ in 0..20 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        sim.worker(0, FromWorker::Heartbeat);
        sim.input(Input::FromAgent {
            conn: H0,
            msg: FromAgent::Heartbeat,
        });
        if sim.failed().is_some() {
            break;
        }
    }
    let f = sim.failed().expect("host 1 is cut off");
    assert_eq!(f.rank, 1);
    let Cause::HostUnreachable { host, ip, secs } = &f.cause else {
        panic!("{:?}", f.cause)
    };
    assert_eq!((*host, ip.as_str()), (1, "10.0.0.11"));
    assert!(
        *secs >= HEARTBEAT_TIMEOUT.as_secs_f64() && *secs < 11.5,
        "{secs}"
    );
    assert_eq!(
        f.cause.headline(),
        format!("is on host 1 (10.0.0.11), unreachable for {secs:.0} s")
    );
}

#[test]
fn a_frozen_worker_on_a_host_still_heard_from_is_unresponsive_not_cut_off() {
    let mut sim = running_on_two_hosts();
    for _ in 0..20 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        sim.worker(0, FromWorker::Heartbeat);
        for conn in [H0, H1] {
            sim.input(Input::FromAgent {
                conn,
                msg: FromAgent::Heartbeat,
            });
        }
        if sim.failed().is_some() {
            break;
        }
    }
    let f = sim.failed().expect("rank 1 froze");
    assert!(
        matches!(f.cause, Cause::Unresponsive { .. }),
        "{:?}",
        f.cause
    );
}

#[test]
fn a_joined_host_that_leaves_before_the_launch_may_join_again() {
    let mut sim = Sim::with_setup(joined_plan(3), setup(false, None));
    sim.join_host(H0, Some(0), "10.0.0.10");
    sim.join_host(H1, None, "10.0.0.11");
    sim.input(Input::AgentLost {
        conn: H1,
        error: "connection reset".into(),
    });
    assert_eq!(sim.m.host_of(H1), None, "its rank is free again");
    assert!(sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::AgentLeft { host: 1, .. })));
    sim.join_host(H1 + 10, None, "10.0.0.11");
    sim.join_host(H2, None, "10.0.0.12");
    assert_eq!(sim.m.host_of(H1 + 10), Some(1));
    assert!(sim.m.launched());
}

#[test]
fn a_worker_beating_through_its_agent_lives_and_its_agent_speaks_only_for_its_own() {
    let mut sim = running_on_two_hosts();
    // Neither worker sends a heartbeat of its own. Host 1's agent names
    // rank 1 every second; host 0's names rank 0 and, wrongly, rank 1.
    for _ in 0..20 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        for (conn, ranks) in [(H0, vec![0, 1]), (H1, vec![1])] {
            sim.input(Input::FromAgent {
                conn,
                msg: FromAgent::WorkerBeats { ranks },
            });
        }
        assert!(
            sim.failed().is_none(),
            "failed at {} s: {:?}",
            sim.secs(),
            sim.failed()
        );
    }
    // Host 1's agent stops naming rank 1: host 0's word for it is not
    // taken, and rank 1 is found frozen.
    for _ in 0..20 {
        let next = sim.secs() + 1.0;
        sim.until(next);
        for (conn, ranks) in [(H0, vec![0, 1]), (H1, vec![])] {
            sim.input(Input::FromAgent {
                conn,
                msg: FromAgent::WorkerBeats { ranks },
            });
        }
        if sim.failed().is_some() {
            break;
        }
    }
    let f = sim.failed().expect("rank 1 froze");
    assert_eq!(f.rank, 1);
    assert!(
        matches!(f.cause, Cause::Unresponsive { .. }),
        "{:?}",
        f.cause
    );
}

#[test]
fn a_silent_host_whose_ranks_all_ended_is_no_deadline_in_the_past() {
    // Host 1's rank finished; then its agent fell silent while rank 0
    // trains on. Its silence fails nobody, and the machine's next deadline
    // must not stay in the past (the driver would wake on it without end).
    let mut sim = running_on_two_hosts();
    sim.alive_until(2.0);
    sim.worker(1, FromWorker::Bye);
    sim.input(Input::FromAgent {
        conn: H1,
        msg: FromAgent::WorkerExited {
            rank: 1,
            exit: meshrun_record::ExitInfo {
                code: Some(0),
                signal: None,
            },
            memory: None,
        },
    });
    for _ in 0..30 {
        // The clock moved by hand, one wake a second: `Sim::until` would
        // loop without end on a deadline that stays in the past.
        sim.now += std::time::Duration::from_secs(1);
        if sim.m.poll_timeout().is_some_and(|wake| wake <= sim.now) {
            sim.m.handle_timeout(sim.now).expect("no engine error");
        }
        sim.worker(0, FromWorker::Heartbeat);
        sim.input(Input::FromAgent {
            conn: H0,
            msg: FromAgent::Heartbeat,
        });
        let now = sim.now;
        if let Some(wake) = sim.m.poll_timeout() {
            assert!(wake > now, "a deadline in the past at {:.1} s", sim.secs());
        }
    }
    assert!(sim.failed().is_none(), "{:?}", sim.failed());
}
