//! What the machine decides when time passes: joins that do not come,
//! stops that do not end, preemptions without a checkpoint, frozen, lost
//! and hung workers, and drains that are over.
//!
//! Every silence is measured from the later of the worker's last message
//! and the moment the controller itself is known to have been running
//! (`awake_since`): when the driver wakes much later than it asked to (the
//! controller was stopped, swapped out, or busy), the messages that
//! workers sent meanwhile may still sit in socket buffers, and a gap that
//! is the controller's own must not fail the attempt.

use std::time::{Duration, Instant};

use meshrun_record::{Cause, Event};

use super::stop::{StopReason, PREEMPT_GRACE};
use super::Machine;
use crate::error::AttemptError;

/// A worker that has sent nothing (heartbeats included) for this long is
/// frozen: heartbeats come from a Rust thread every second, whatever the
/// Python code is doing.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// A broken worker connection whose process has not been reported as
/// exited after this long is a failure of its own.
pub const CONNECTION_LOSS_GRACE: Duration = Duration::from_secs(2);

/// A frozen worker whose agent has been silent this long too is on a host
/// cut off, not frozen itself (both send a heartbeat every second; which
/// silence is noticed first is chance).
const HOST_SILENCE: Duration = Duration::from_secs(8);

/// A wait for cluster resources that begins after the start timeout is
/// over gets this long to clear: a scheduler places work it can place in
/// moments, so only a wait that lasts is the cluster holding back.
pub(super) const LATE_WAIT_GRACE: Duration = Duration::from_secs(30);

/// Waking this much later than asked means the controller was not running.
pub const STALL_SLACK: Duration = Duration::from_secs(1);

impl Machine {
    /// The earliest moment at which [`Machine::handle_timeout`] has
    /// something to decide; `None` while only an input can change anything.
    ///
    /// Asked after every message, so it visits no rank and no agent: each
    /// kind of deadline is the earliest of its instants, read from the
    /// orders that `Ranks` and `Agents` keep. As a silence counts from
    /// `since(t)`, the later of `t` and `awake_since` (the same for every
    /// rank), the earliest deadline is that of the earliest `t`.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if !self.launched && self.stop.is_none() {
            // A sized elastic attempt waits only for its memory checkpoint's
            // preparation, which every host answers.
            if self.plan.elastic.is_none() || self.elastic.sized.is_none() {
                consider(Some(self.started + self.setup.join_timeout));
            }
            consider(self.rejoin_deadline());
            consider(self.memory_deadline());
        }
        consider(self.stop_deadline);
        if self.launched && self.stop.is_none() {
            consider(self.preempt_deadline);
            let silence = |t: Option<Instant>, limit| t.map(|t| self.since(t) + limit);
            consider(silence(self.agents.earliest_heard(), HEARTBEAT_TIMEOUT));
            consider(silence(self.ranks.earliest_heard(), HEARTBEAT_TIMEOUT));
            consider(silence(self.ranks.earliest_lost(), CONNECTION_LOSS_GRACE));
            if let Some(limit) = self.hang_timeout() {
                consider(silence(self.ranks.earliest_progress(), limit));
            }
            consider(self.finish_deadline());
            consider(self.start_deadline());
        }
        consider(self.held_deadline());
        consider(self.ranks.drain_deadline());
        self.wake = next;
        next
    }

    /// Decides what is due at `now`. The driver reads every queued input
    /// first: a heartbeat that has arrived is never judged missing.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), AttemptError> {
        if let Some(wake) = self.wake.take() {
            if now > wake + STALL_SLACK {
                tracing::warn!(
                    late_s = (now - wake).as_secs_f64(),
                    "the controller woke late; silences count from now"
                );
                self.awake_since = now;
            }
        }
        if !self.launched && self.stop.is_none() {
            if self.memory_deadline().is_some_and(|d| now >= d) {
                self.memory_give_up(now, super::memory::MEMORY_PREPARE_TIMEOUT);
                if self.launched || self.stop.is_some() {
                    return Ok(());
                }
            }
            if self.plan.elastic.is_some() {
                if self.elastic.sized.is_some() {
                    return Ok(());
                }
                let out_of_time = now >= self.started + self.setup.join_timeout;
                if out_of_time || self.rejoin_deadline().is_some_and(|d| now >= d) {
                    self.elastic.out_of_time = out_of_time;
                    self.launch(now);
                    if self.elastic.sized.is_some() || self.stop.is_some() {
                        return Ok(());
                    }
                    if out_of_time {
                        return Err(self.too_few_hosts());
                    }
                    // MIN hosts, but no count the rule allows: wait for
                    // another (its join starts the wait again).
                    self.elastic.forget_min_reached();
                }
                return Ok(());
            }
            if now >= self.started + self.setup.join_timeout {
                let missing: Vec<u32> = (0..self.plan.hosts)
                    .filter(|h| !self.agents.contains_key(h))
                    .collect();
                if missing.is_empty() && self.agents.values().all(|a| a.storage_ok) {
                    // Every host joined and shares the storage: what is
                    // left is the memory step's preparation, which is given
                    // up for storage rather than failing the attempt.
                    self.memory_give_up(now, now - self.started);
                    if self.launched || self.stop.is_some() {
                        return Ok(());
                    }
                }
                if missing.is_empty() {
                    // Every host joined; some never read the storage marker back.
                    let host = (0..self.plan.hosts)
                        .find(|h| self.agents.get(h).is_some_and(|a| !a.storage_ok))
                        .unwrap_or(0);
                    let probe = self.setup.storage_probe.as_ref();
                    return Err(AttemptError::StorageNotShared {
                        host,
                        ip: self.host_ip(host),
                        storage: probe.map(|p| p.storage.clone()).unwrap_or_default(),
                        problem: "its agent never answered the check".into(),
                    });
                }
                return Err(AttemptError::AgentTimeout {
                    missing,
                    secs: self.setup.join_timeout.as_secs(),
                });
            }
            return Ok(());
        }
        // An exited worker's connection that has been quiet long enough is
        // drained: closed, and no longer waited for.
        let drained: Vec<u32> = (0..self.plan.nprocs)
            .filter(|&r| {
                self.ranks[r as usize]
                    .drain_deadline()
                    .is_some_and(|d| now >= d)
            })
            .collect();
        for rank in drained {
            if let Some(conn) = self.ranks.update(rank, |r| r.conn.take()) {
                self.push(super::Action::Close { conn });
            }
        }
        if self.stop_deadline.is_some_and(|d| now >= d) {
            // Exits that never came: the workers are treated as lost.
            self.stop_deadline = None;
            for rank in 0..self.plan.nprocs {
                self.abandon(rank);
            }
        }
        self.release_held(now);
        if self.launched && self.stop.is_none() {
            self.excuse_idle_silent_hosts(now);
            self.watch(now);
        }
        Ok(())
    }

    /// The driver handled a message of agent `conn` itself (an output
    /// line, step times): its host is alive. Returns the host.
    pub fn agent_heard(&mut self, conn: super::Conn, now: Instant) -> Option<u32> {
        let host = self.host_of(conn)?;
        self.agents.heard(host, now);
        Some(host)
    }

    /// The queue from the connections was found full at `now`: what they
    /// sent since may still wait in socket buffers, so silences count from
    /// now, as after a stall.
    pub fn backlogged(&mut self, now: Instant) {
        if now > self.awake_since {
            tracing::debug!("the event queue is full; silences count from now");
            self.awake_since = now;
        }
    }

    /// `t`, or when the controller was last known to wake, if later.
    pub(super) fn since(&self, t: Instant) -> Instant {
        t.max(self.awake_since)
    }

    fn hang_timeout(&self) -> Option<Duration> {
        self.plan
            .failure
            .hang_timeout_s
            .map(Duration::from_secs_f64)
    }

    fn watch(&mut self, now: Instant) {
        if self.preempt_deadline.is_some_and(|d| now >= d) {
            self.record(Event::PreemptTimeout {
                attempt: self.attempt(),
                waited_s: PREEMPT_GRACE.as_secs(),
            });
            let reason = match self.elastic.growing {
                // The next attempt grows all the same, from the newest
                // checkpoint there is.
                Some(hosts) => StopReason::Resize { hosts, step: None },
                // `meshrun stop` asked for the save that never came.
                None if self.stop_asked.is_some() => StopReason::Requested { now: false },
                None => StopReason::Signal(crate::outcome::SIGTERM),
            };
            return self.begin_stop(now, reason);
        }
        let live = || self.ranks.iter().enumerate().filter(|(_, r)| !r.done);
        let lost = live().find_map(|(rank, r)| {
            r.connection_lost
                .filter(|t| now >= self.since(*t) + CONNECTION_LOSS_GRACE)
                .map(|_| rank as u32)
        });
        if let Some(rank) = lost {
            return self.fail(now, rank, Cause::ConnectionLost);
        }
        let pph = self.plan.procs_per_host;
        let first_live_of =
            |host: u32| (host * pph..(host + 1) * pph).find(|&r| !self.ranks[r as usize].done);
        let cut_off = self
            .silent_host(now, HEARTBEAT_TIMEOUT)
            .and_then(|(host, secs)| Some((first_live_of(host)?, host, secs)));
        if let Some((rank, host, secs)) = cut_off {
            let ip = self.host_ip(host);
            return self.fail(now, rank, Cause::HostUnreachable { host, ip, secs });
        }
        let frozen = live().find_map(|(rank, r)| {
            let heard = r.heard?;
            (r.connection_lost.is_none() && now >= self.since(heard) + HEARTBEAT_TIMEOUT)
                .then(|| (rank as u32, (now - heard).as_secs_f64()))
        });
        if let Some((rank, secs)) = frozen {
            let host = rank / pph;
            let cause = match self.silent_host(now, HOST_SILENCE) {
                Some((silent, _)) if silent == host => Cause::HostUnreachable {
                    host,
                    ip: self.host_ip(host),
                    secs,
                },
                _ => Cause::Unresponsive { secs },
            };
            return self.fail(now, rank, cause);
        }
        if self.start_deadline().is_some_and(|at| now >= at) {
            let waiting = self.waiting.as_ref().map(|(_, w)| w.clone());
            let rank = live().map(|(rank, _)| rank as u32).next().unwrap_or(0);
            let secs = (now - self.started).as_secs_f64();
            let cause = Cause::StartTimeout {
                secs,
                waiting: waiting.unwrap_or_default(),
            };
            return self.fail(now, rank, cause);
        }
        let behind = self
            .finish_deadlines()
            .filter(|d| now >= d.at)
            .min_by_key(|d| d.at);
        if let Some(d) = behind {
            let last_step = self.ranks[d.rank as usize].last_step;
            let cause = Cause::Hang {
                secs: (now - d.since).as_secs_f64(),
                last_step,
                after_finish_of: Some(d.first),
                wavefront: self.programs.wavefront(),
            };
            return self.fail(now, d.rank, cause);
        }
        if let Some(limit) = self.hang_timeout() {
            // The rank that has gone longest without a report is named.
            let stalest = live()
                .filter_map(|(rank, r)| Some((r.progress?, rank as u32, r.last_step)))
                .min();
            if let Some((since, rank, last_step)) = stalest {
                if now >= self.since(since) + limit {
                    let cause = Cause::Hang {
                        secs: (now - since).as_secs_f64(),
                        last_step,
                        after_finish_of: None,
                        wavefront: self.programs.wavefront(),
                    };
                    self.fail(now, rank, cause);
                }
            }
        }
    }

    /// While no rank has reported a step and the cluster holds back
    /// resources: the attempt fails at the start timeout, or, for a wait
    /// that began later (after a long compilation, say), once it has
    /// lasted [`LATE_WAIT_GRACE`]. A slow start with nothing waiting is
    /// never failed here (the hang timeout is for that).
    fn start_deadline(&self) -> Option<Instant> {
        let (since, _) = self.waiting.as_ref()?;
        if self.ranks.any_reported() {
            return None;
        }
        let at = self.started + self.plan.failure.start_timeout();
        let since = self.since(*since);
        Some(if since < at {
            at
        } else {
            since + LATE_WAIT_GRACE
        })
    }

    /// While a rank that finished its program is still alive (JAX holds it
    /// in its shutdown barrier, waiting for the others), every rank still
    /// running must report within the finish timeout of that finish (or of
    /// its own last report, if later): SPMD ranks end together. A finished
    /// rank whose process is gone waits for nobody (independent programs end
    /// when they will). Gives the deadline of every rank still running
    /// (for [`Machine::handle_timeout`], which names the rank).
    fn finish_deadlines(&self) -> impl Iterator<Item = FinishDeadline> + '_ {
        let limit = self.plan.failure.finish_timeout();
        let first = self
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.done)
            .filter_map(|(rank, r)| Some((r.finished?.0, rank as u32)))
            .min();
        self.ranks
            .iter()
            .enumerate()
            .filter(move |(_, r)| first.is_some() && !r.done && r.finished.is_none())
            .map(move |(rank, r)| {
                let (finished, first) = first.expect("filtered on");
                let since = r.progress.map_or(finished, |p| p.max(finished));
                FinishDeadline {
                    rank: rank as u32,
                    since,
                    at: self.since(since) + limit,
                    first,
                }
            })
    }

    /// The earliest of [`Machine::finish_deadlines`], without visiting the
    /// ranks.
    fn finish_deadline(&self) -> Option<Instant> {
        let since = self.ranks.finish_since()?;
        Some(self.since(since) + self.plan.failure.finish_timeout())
    }
}

/// A rank that must report by `at`: `first` finished its program, and
/// this rank has not reported since `since`.
struct FinishDeadline {
    rank: u32,
    since: Instant,
    at: Instant,
    first: u32,
}
