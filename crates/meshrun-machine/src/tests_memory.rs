//! Memory checkpoints on a simulated clock: buddies, the commit once
//! every rank wrote and every host holds its part, and the restore that
//! comes from memory only when every host can make the step whole.

use meshrun_protocol::{FromAgent, FromWorker, ToAgent};
use std::sync::Arc;
use std::time::Duration;

use meshrun_record::manifest::{Leaf, Manifest, ShardRecord};
use meshrun_record::Event;

use super::sim::{plan, Sim};
use super::*;

const H0: Conn = 500;
const H1: Conn = 501;
/// Host 1's connection after it joined again.
const H1_AGAIN: Conn = 502;

/// Two hosts of one worker each.
fn two_hosts() -> RunPlan {
    let mut p = plan(2);
    p.hosts = 2;
    p.procs_per_host = 1;
    p
}

fn setup(resume_step: Option<u64>, memory_step: Option<u64>) -> Setup {
    Setup {
        attempt: 2,
        run_id: "0123456789abcdef".into(),
        token_hex: "00".repeat(32),
        control_addr: "127.0.0.1:4000".into(),
        user_xla_flags: None,
        resume_step,
        join_timeout: Duration::from_mins(5),
        payload: None::<Arc<[u8]>>,
        storage_probe: None,
        first_joined_host: 0,
        memory_step,
        previous_hosts: None,
        expected_hosts: None,
        resize_reason: None,
    }
}

fn join(sim: &mut Sim, conn: Conn, host: u32) {
    sim.input(Input::AgentJoined {
        host: Some(host),
        ip: format!("127.0.0.{}", host + 2),
        pid: 10 + host,
        gpus: vec![],
        free_port: 5000,
        controller: None,
        replica_port: Some(6000 + host as u16),
        conn,
    });
}

fn launch_env(sim: &Sim, conn: Conn) -> Vec<(String, String)> {
    sim.sent_to(conn)
        .into_iter()
        .find_map(|m| match m {
            ToAgent::Launch { workers, .. } => Some(workers[0].env.clone()),
            _ => None,
        })
        .expect("launched")
}

fn var<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn prepared(sim: &mut Sim, conn: Conn, step: u64, source: Option<&str>) {
    sim.input(Input::FromAgent {
        conn,
        msg: FromAgent::MemoryPrepared {
            step,
            source: source.map(str::to_string),
            why: source
                .is_none()
                .then(|| "this host holds no memory checkpoint of step 7".into()),
            bytes: 0,
        },
    });
}

#[test]
fn each_host_is_told_its_buddy_round_the_ring() {
    let mut sim = Sim::with_setup(two_hosts(), setup(None, None));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    assert!(sim.sent_to(H0).contains(&&ToAgent::Buddy {
        host: 1,
        addr: "127.0.0.3:6001".into()
    }));
    assert!(sim.sent_to(H1).contains(&&ToAgent::Buddy {
        host: 0,
        addr: "127.0.0.2:6000".into()
    }));
    assert!(sim.m.launched(), "nothing to prepare: launched at once");
}

#[test]
fn a_newer_memory_step_every_host_can_make_whole_is_restored() {
    let mut sim = Sim::with_setup(two_hosts(), setup(Some(5), Some(7)));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    assert!(!sim.m.launched(), "the hosts prepare first");
    for conn in [H0, H1] {
        assert!(sim.sent_to(conn).contains(&&ToAgent::MemoryPrepare {
            run_id: "0123456789abcdef".into(),
            step: 7
        }));
    }
    prepared(&mut sim, H0, 7, Some("this host's memory"));
    assert!(!sim.m.launched());
    prepared(
        &mut sim,
        H1,
        7,
        Some("the buddy's replica (127.0.0.2:6000)"),
    );
    assert!(sim.m.launched());
    let env = launch_env(&sim, H1);
    assert_eq!(var(&env, "MESHRUN_RESUME_STEP"), Some("7"));
    assert_eq!(var(&env, "MESHRUN_RESUME_FROM"), Some("memory"));
    assert!(sim.events().iter().any(|e| matches!(e, Event::ResumingFromMemory { step: 7, sources, .. } if sources[1].starts_with("the buddy's replica"))));
}

#[test]
fn a_host_that_cannot_make_it_whole_sends_everyone_to_storage() {
    let mut sim = Sim::with_setup(two_hosts(), setup(Some(5), Some(7)));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    prepared(&mut sim, H1, 7, None);
    prepared(&mut sim, H0, 7, Some("this host's memory"));
    let env = launch_env(&sim, H0);
    assert_eq!(var(&env, "MESHRUN_RESUME_STEP"), Some("5"));
    assert_eq!(var(&env, "MESHRUN_RESUME_FROM"), None);
    let why = sim.events().iter().find_map(|e| match e {
        Event::MemoryUnavailable {
            why, resume_step, ..
        } => Some((why.clone(), *resume_step)),
        _ => None,
    });
    let (why, resume) = why.expect("recorded");
    assert!(
        why.starts_with("host 1: this host holds no memory checkpoint"),
        "{why}"
    );
    assert_eq!(resume, Some(5));
}

fn leaf(rank: u32, region: (usize, usize)) -> Leaf {
    Leaf {
        path: "w".into(),
        dtype: "float32".into(),
        shape: vec![4],
        shards: vec![ShardRecord {
            file: format!("rank-{rank}.safetensors"),
            tensor: "w:0".into(),
            region: vec![region],
            rank: None,
        }],
    }
}

#[test]
fn a_step_commits_once_every_rank_wrote_and_every_host_holds_it() {
    let mut sim = Sim::with_setup(two_hosts(), setup(None, None));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    sim.take();
    let written = |rank, region| FromWorker::MemoryWritten {
        step: 3,
        leaves: vec![leaf(rank, region)],
        extra: (rank == 0).then(|| serde_json::json!({"user": {"loader": 3}})),
    };
    sim.worker(0, written(0, (0, 2)));
    assert!(!sim.take().iter().any(|a| matches!(
        a,
        Action::Send {
            msg: Outgoing::Agent(ToAgent::MemoryCommit { .. }),
            ..
        }
    )));
    sim.worker(1, written(1, (2, 4)));
    // Each host commits a manifest of its own rank's shards, with rank 0's extra.
    let commits: Vec<(Conn, Manifest)> = sim
        .take()
        .into_iter()
        .filter_map(|a| match a {
            Action::Send {
                to,
                msg: Outgoing::Agent(ToAgent::MemoryCommit { manifest, .. }),
            } => Some((to, manifest)),
            _ => None,
        })
        .collect();
    assert_eq!(commits.len(), 2);
    for (conn, m) in &commits {
        let rank = u32::from(*conn != H0);
        assert_eq!(
            m.leaves,
            vec![leaf(rank, if rank == 0 { (0, 2) } else { (2, 4) })]
        );
        assert_eq!(m.extra["user"]["loader"], 3);
    }
    let held = |sim: &mut Sim, conn| {
        sim.input(Input::FromAgent {
            conn,
            msg: FromAgent::MemoryHeld {
                step: 3,
                bytes: 100,
                replicated: true,
                error: None,
            },
        });
    };
    held(&mut sim, H0);
    assert_eq!(sim.m.memory_committed(), None, "host 1 has not said");
    held(&mut sim, H1);
    assert_eq!(sim.m.memory_committed(), Some(3));
    let acts = sim.take();
    for conn in [H0, H1] {
        assert!(acts.contains(&Action::Send {
            to: conn,
            msg: Outgoing::Agent(ToAgent::MemoryRelease { step: 3 })
        }));
    }
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::Record(Event::MemoryCheckpointCommitted {
            step: 3,
            replicated: true,
            ..
        })
    )));
}

#[test]
fn a_host_that_cannot_hold_a_step_leaves_it_uncommitted() {
    let mut sim = Sim::with_setup(two_hosts(), setup(None, None));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    sim.input(Input::FromAgent {
        conn: H1,
        msg: FromAgent::MemoryHeld {
            step: 4,
            bytes: 0,
            replicated: false,
            error: Some("the buddy at 127.0.0.2:6000 refused the replica".into()),
        },
    });
    sim.input(Input::FromAgent {
        conn: H0,
        msg: FromAgent::MemoryHeld {
            step: 4,
            bytes: 100,
            replicated: true,
            error: None,
        },
    });
    assert_eq!(sim.m.memory_committed(), None);
    assert!(sim.events().iter().any(|e| matches!(
        e,
        Event::MemoryCheckpointFailed {
            step: 4,
            host: 1,
            ..
        }
    )));
}

#[test]
fn a_host_that_rejoins_before_the_launch_is_asked_again_and_the_run_decides() {
    // The joined host answered, then its connection broke and it joined
    // again: its old session's answer and replica port are gone with it.
    let mut p = two_hosts();
    p.rendezvous = true;
    let mut sim = Sim::with_setup(p, setup(Some(5), Some(7)));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    prepared(&mut sim, H1, 7, Some("this host's memory"));
    sim.input(Input::AgentLost {
        conn: H1,
        error: "Connection reset by peer".into(),
    });
    sim.input(Input::AgentJoined {
        host: Some(1),
        ip: "127.0.0.3".into(),
        pid: 11,
        gpus: vec![],
        free_port: 5000,
        controller: None,
        replica_port: Some(6101),
        conn: H1_AGAIN,
    });
    assert!(
        sim.sent_to(H1_AGAIN).contains(&&ToAgent::MemoryPrepare {
            run_id: "0123456789abcdef".into(),
            step: 7
        }),
        "the new session is asked"
    );
    // Host 0 learns where its buddy now serves replicas.
    assert!(sim.sent_to(H0).contains(&&ToAgent::Buddy {
        host: 1,
        addr: "127.0.0.3:6101".into()
    }));
    prepared(&mut sim, H0, 7, Some("this host's memory"));
    assert!(!sim.m.launched(), "the old session's answer does not count");
    prepared(&mut sim, H1_AGAIN, 7, Some("this host's memory"));
    assert!(sim.m.launched());
    assert!(sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::ResumingFromMemory { step: 7, .. })));
}

/// The `MemoryUnavailable` the attempt recorded: why, and where it resumes.
fn unavailable(sim: &Sim) -> (String, Option<u64>) {
    sim.events()
        .iter()
        .find_map(|e| match e {
            Event::MemoryUnavailable {
                why, resume_step, ..
            } => Some((why.clone(), *resume_step)),
            _ => None,
        })
        .expect("memory_unavailable recorded")
}

#[test]
fn a_host_that_never_answers_sends_the_attempt_to_storage_at_the_deadline() {
    let mut sim = Sim::with_setup(two_hosts(), setup(Some(5), Some(7)));
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    let limit = memory::MEMORY_PREPARE_TIMEOUT.as_secs_f64();
    // The deadline counts from the last word of any host.
    sim.until(10.0);
    prepared(&mut sim, H0, 7, Some("this host's memory"));
    sim.until(10.0 + limit - 1.0);
    assert!(!sim.m.launched(), "host 0's answer gave host 1 more time");
    sim.until(10.0 + limit + 1.0);
    assert!(
        sim.m.launched(),
        "given up for storage, not the join timeout"
    );
    let (why, resume) = unavailable(&sim);
    assert_eq!(
        why,
        format!("host 1: no answer in {limit} s whether it holds step 7")
    );
    assert_eq!(resume, Some(5));
    let env = launch_env(&sim, H1);
    assert_eq!(var(&env, "MESHRUN_RESUME_STEP"), Some("5"));
    assert_eq!(var(&env, "MESHRUN_RESUME_FROM"), None);
    // An answer that comes after the choice changes nothing.
    prepared(&mut sim, H1, 7, Some("this host's memory"));
    assert!(!sim
        .events()
        .iter()
        .any(|e| matches!(e, Event::ResumingFromMemory { .. })));
}

#[test]
fn a_join_timeout_before_the_deadline_gives_memory_up_instead_of_blaming_storage() {
    // Every host joined and read the storage marker back: what the join
    // timeout finds unfinished is the memory step's preparation.
    let mut s = setup(None, Some(7));
    s.join_timeout = Duration::from_secs(30);
    let mut sim = Sim::with_setup(two_hosts(), s);
    join(&mut sim, H0, 0);
    join(&mut sim, H1, 1);
    prepared(&mut sim, H1, 7, Some("this host's memory"));
    sim.until(31.0);
    assert!(sim.m.launched());
    let (why, resume) = unavailable(&sim);
    assert!(why.starts_with("host 0: no answer in 30 s"), "{why}");
    assert_eq!(resume, None);
}
