//! `poll_timeout` reads the earliest deadline of each kind from the
//! orders `Ranks` and `Agents` keep: here it is checked against a walk
//! over every rank and agent (the way it was computed before, kept as the
//! reference) on machines driven at random on the simulated clock, and
//! shown to read no rank at all.

use meshrun_protocol::{FromAgent, FromWorker};
use std::time::{Duration, Instant};

use meshrun_record::ExitInfo;
use proptest::prelude::*;

use super::deadlines::{CONNECTION_LOSS_GRACE, HEARTBEAT_TIMEOUT, LATE_WAIT_GRACE};
use super::rank::DRAIN_QUIET;
use super::sim::{plan, Sim};
use super::*;

/// The next deadline by a walk over every rank and agent: what
/// `poll_timeout` computed before it kept orders.
fn scanned_timeout(m: &Machine) -> Option<Instant> {
    let mut next: Option<Instant> = None;
    let mut consider = |t: Option<Instant>| {
        if let Some(t) = t {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
    };
    if !m.launched && m.stop.is_none() {
        if m.plan.elastic.is_none() || m.elastic.sized.is_none() {
            consider(Some(m.started + m.setup.join_timeout));
        }
        consider(m.rejoin_deadline());
        consider(m.memory_deadline());
    }
    consider(m.stop_deadline);
    if m.launched && m.stop.is_none() {
        consider(m.preempt_deadline);
        // An agent excused (its host's ranks all ended, then it fell
        // silent) is watched again once heard of.
        for (&host, a) in &m.agents {
            if m.agents.watched(host) {
                consider(Some(m.since(a.heard) + HEARTBEAT_TIMEOUT));
            }
        }
        let hang = m.plan.failure.hang_timeout_s.map(Duration::from_secs_f64);
        for r in m.ranks.iter().filter(|r| !r.done) {
            match r.connection_lost {
                Some(t) => consider(Some(m.since(t) + CONNECTION_LOSS_GRACE)),
                None => consider(r.heard.map(|h| m.since(h) + HEARTBEAT_TIMEOUT)),
            }
            if let (Some(limit), Some(p)) = (hang, r.progress) {
                consider(Some(m.since(p) + limit));
            }
        }
        // Every running rank's finish deadline, once a live rank finished.
        let first = m
            .ranks
            .iter()
            .filter(|r| !r.done)
            .filter_map(|r| r.finished.map(|(t, _)| t))
            .min();
        if let Some(finished) = first {
            for r in m.ranks.iter().filter(|r| !r.done && r.finished.is_none()) {
                let since = r.progress.map_or(finished, |p| p.max(finished));
                consider(Some(m.since(since) + m.plan.failure.finish_timeout()));
            }
        }
        // The start deadline, while nothing reported and the cluster waits.
        if let Some((since, _)) = &m.waiting {
            if !m.ranks.iter().any(|r| r.reports > 0) {
                let at = m.started + m.plan.failure.start_timeout();
                let since = m.since(*since);
                consider(Some(if since < at {
                    at
                } else {
                    since + LATE_WAIT_GRACE
                }));
            }
        }
    }
    for r in m.ranks.iter() {
        consider(r.drain_deadline());
    }
    next
}

/// Whether every rank is done and all it sent read, by a walk.
fn scanned_finished(m: &Machine, now: Instant) -> bool {
    let drained =
        |r: &rank::RankState| r.conn.is_none() || r.heard.is_none_or(|h| now >= h + DRAIN_QUIET);
    if !m.launched {
        return m.stop.is_some();
    }
    m.ranks.iter().all(|r| r.done && drained(r))
}

/// Host `h`'s agent.
fn agent(h: u32) -> Conn {
    1000 + Conn::from(h)
}

/// Two hosts of `per_host` ranks each, launched, every worker started and
/// connected on conn = its rank.
fn two_hosts(per_host: u32, hang: bool, short: bool) -> Sim {
    let mut p = plan(2 * per_host);
    p.hosts = 2;
    p.procs_per_host = per_host;
    p.failure.hang_timeout_s = hang.then_some(4.0);
    if short {
        p.failure.finish_timeout_s = Some(3.0);
        p.failure.start_timeout_s = Some(5.0);
    }
    let mut sim = Sim::new(p);
    sim.join_host(agent(0), Some(0), "10.0.0.1");
    sim.join_host(agent(1), Some(1), "10.0.0.2");
    assert!(sim.m.launched());
    for rank in 0..2 * per_host {
        sim.start_worker(agent(rank / per_host), rank, Conn::from(rank));
    }
    sim.take();
    sim
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Time passes (ms), the driver waking exactly when asked.
    Wait(u64),
    /// The driver wakes this many ms after the next deadline (a stall
    /// when over a second).
    Late(u64),
    /// The event queue was found full.
    Backlogged,
    Heartbeat(u32),
    /// A host's agent sends its workers' heartbeats (all ranks named: only
    /// its own count).
    Beats(u32),
    AgentHeartbeat(u32),
    Started(u32),
    Report(u32, Option<u64>),
    Exit(u32, bool),
    Lost(u32, bool),
    Rejoin(u32),
    Waiting(bool),
    Terminate,
}

fn op() -> impl Strategy<Value = Op> {
    let rank = 0u32..8;
    prop_oneof![
        6 => (0u64..3000).prop_map(Op::Wait),
        1 => (0u64..4000).prop_map(Op::Late),
        1 => Just(Op::Backlogged),
        6 => rank.clone().prop_map(Op::Heartbeat),
        2 => (0u32..2).prop_map(Op::Beats),
        2 => (0u32..2).prop_map(Op::AgentHeartbeat),
        1 => rank.clone().prop_map(Op::Started),
        4 => (rank.clone(), proptest::option::of(0u64..5)).prop_map(|(r, s)| Op::Report(r, s)),
        2 => (rank.clone(), proptest::bool::weighted(0.8)).prop_map(|(r, ok)| Op::Exit(r, ok)),
        2 => (rank.clone(), any::<bool>()).prop_map(|(r, clean)| Op::Lost(r, clean)),
        1 => rank.prop_map(Op::Rejoin),
        1 => any::<bool>().prop_map(Op::Waiting),
        1 => Just(Op::Terminate),
    ]
}

/// Moves the clock to `target`, waking exactly when the machine asks to
/// (as `Sim::until`), except that a deadline left due after it was handled
/// is stepped over: a host whose ranks all ended and whose agent fell
/// silent stays due, and nothing is decided for it.
fn advance(sim: &mut Sim, target: Instant) {
    while let Some(wake) = sim.m.poll_timeout().filter(|&w| w <= target) {
        sim.now = sim.now.max(wake);
        sim.m.handle_timeout(sim.now).expect("no engine error");
        sim.take();
        if sim.m.poll_timeout() == Some(wake) && wake <= sim.now {
            break;
        }
    }
    sim.now = target;
}

fn apply(sim: &mut Sim, per_host: u32, op: Op) {
    let n = 2 * per_host;
    match op {
        Op::Wait(ms) => advance(sim, sim.now + Duration::from_millis(ms)),
        Op::Late(ms) => {
            if let Some(wake) = sim.m.poll_timeout() {
                sim.now = sim.now.max(wake) + Duration::from_millis(ms);
                sim.m.handle_timeout(sim.now).expect("no engine error");
                sim.take();
            }
        }
        Op::Backlogged => sim.m.backlogged(sim.now),
        Op::Heartbeat(r) => sim.worker(r % n, FromWorker::Heartbeat),
        Op::Beats(h) => sim.input(Input::FromAgent {
            conn: agent(h),
            msg: FromAgent::WorkerBeats {
                ranks: (0..n).collect(),
            },
        }),
        Op::AgentHeartbeat(h) => sim.input(Input::FromAgent {
            conn: agent(h),
            msg: FromAgent::Heartbeat,
        }),
        Op::Started(r) => {
            let rank = r % n;
            sim.input(Input::FromAgent {
                conn: agent(rank / per_host),
                msg: FromAgent::WorkerStarted {
                    rank,
                    pid: 100 + rank,
                    warm: true,
                },
            });
        }
        Op::Report(r, step) => sim.worker(
            r % n,
            FromWorker::Report {
                step,
                metrics: serde_json::json!({}),
                checkpoint: false,
                timing: None,
                saving: false,
                total_steps: None,
            },
        ),
        Op::Exit(r, ok) => {
            let rank = r % n;
            sim.input(Input::FromAgent {
                conn: agent(rank / per_host),
                msg: FromAgent::WorkerExited {
                    rank,
                    exit: ExitInfo {
                        code: Some(i32::from(!ok)),
                        signal: None,
                    },
                    memory: None,
                },
            });
        }
        Op::Lost(r, clean) => sim.input(Input::WorkerLost { rank: r % n, clean }),
        Op::Rejoin(r) => sim.input(Input::WorkerJoined {
            rank: r % n,
            attempt: 1,
            pid: 200 + r,
            conn: 100 + Conn::from(r),
        }),
        Op::Waiting(on) => sim.input(Input::ResourcesWaiting {
            what: on.then(|| "1 GPU".to_string()),
        }),
        Op::Terminate => sim.input(Input::Terminate),
    }
    sim.take();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_kept_orders_give_the_deadline_a_walk_over_every_rank_gives(
        per_host in 1u32..5,
        hang in any::<bool>(),
        short in any::<bool>(),
        metrics_file in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut sim = two_hosts(per_host, hang, short);
        if metrics_file {
            // Rank 0's steps then count as every rank's.
            sim.m.plan.metrics_file = Some("metrics.txt".into());
        }
        for op in ops {
            apply(&mut sim, per_host, op);
            sim.m.ranks.assert_consistent();
            let scanned = scanned_timeout(&sim.m);
            prop_assert_eq!(sim.m.poll_timeout(), scanned, "after {:?}", op);
            for later in [0, 1500, 2500] {
                let at = sim.now + Duration::from_millis(later);
                prop_assert_eq!(sim.m.is_finished(at), scanned_finished(&sim.m, at));
            }
        }
    }
}

#[test]
fn poll_timeout_reads_no_rank_and_no_agent() {
    let mut sim = two_hosts(500, true, true);
    sim.input(Input::ResourcesWaiting {
        what: Some("1 GPU".into()),
    });
    sim.exit(3, 0); // a finish to follow
    sim.input(Input::WorkerLost {
        rank: 7,
        clean: false,
    });
    sim.worker(3, FromWorker::Heartbeat); // a connection to drain
    let reads = (sim.m.ranks.reads(), sim.m.agents.reads());
    let next = sim.m.poll_timeout();
    assert_eq!((sim.m.ranks.reads(), sim.m.agents.reads()), reads);
    assert_eq!(next, scanned_timeout(&sim.m));
    assert_eq!(next, Some(sim.now + CONNECTION_LOSS_GRACE));
}
