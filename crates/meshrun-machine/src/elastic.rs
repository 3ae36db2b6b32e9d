//! Elastic runs (`--hosts MIN:MAX`): how many hosts this attempt runs on,
//! the hosts that wait meanwhile to be taken in, and the planned stop that
//! takes them in.
//!
//! The size is chosen once, before the launch: at once when every host
//! expected is there (all MAX on a first attempt, as many as the attempt
//! before on a restart), else when the rejoin timeout has passed since MIN
//! hosts were there: the largest count present that the rule allows
//! ([`meshrun_plan::Elastic::size`]). Host ranks are then renumbered in
//! the order the hosts hold them, so they stay contiguous; the other
//! hosts wait. A host that joins a running attempt waits too, and once the
//! hosts waiting and running make a larger count, every worker saves at
//! its next report (as on SIGTERM) and the attempt stops at that commit,
//! to go on with them.

use std::time::Instant;

use meshrun_protocol::{ToAgent, ToWorker};
use meshrun_record::Event;

use super::stop::{StopReason, PREEMPT_GRACE};
use super::{Action, Conn, Machine};
use crate::error::AttemptError;

/// An elastic attempt's hosts, beyond those the machine runs.
#[derive(Default)]
pub(super) struct ElasticState {
    /// The most hosts (the plan's count before sizing).
    pub max_hosts: u32,
    /// The host count of this attempt, once chosen.
    pub sized: Option<u32>,
    /// When MIN hosts were first there.
    min_reached: Option<Instant>,
    /// Agents that joined and are not running this attempt.
    pub waiting: Vec<Waiting>,
    /// A save was asked for to grow to this many hosts.
    pub growing: Option<u32>,
    /// When the attempt was launched (the wait before it is a resize's
    /// cost when the size changed).
    pub launched_at: Option<Instant>,
    /// The join timeout has passed: run on what is there, if it is enough.
    pub out_of_time: bool,
}

/// A host that waits to be taken in at the next attempt: only its address
/// (for the events) and its connection (to tell it the attempt is over).
pub(super) struct Waiting {
    ip: String,
    conn: Conn,
}

impl ElasticState {
    pub(super) fn new(max_hosts: u32) -> Self {
        Self {
            max_hosts,
            ..Self::default()
        }
    }

    pub(super) fn forget_min_reached(&mut self) {
        self.min_reached = None;
    }
}

impl Machine {
    /// Whether the attempt has its hosts: all of them for a fixed run; for
    /// an elastic one, once its size is chosen (chosen here, once).
    pub(super) fn hosts_ready(&mut self, now: Instant) -> bool {
        let Some(el) = self.plan.elastic.clone() else {
            return self.agents.len() >= self.plan.hosts as usize;
        };
        if self.elastic.sized.is_some() {
            return true;
        }
        let ready: Vec<u32> = self
            .agents
            .iter()
            .filter(|(_, a)| a.storage_ok)
            .map(|(&h, _)| h)
            .collect();
        let n = ready.len() as u32;
        if n >= el.min_hosts && self.elastic.min_reached.is_none() {
            self.elastic.min_reached = Some(now);
        }
        let expected = self.setup.expected_hosts.unwrap_or(self.elastic.max_hosts);
        let due = n >= expected
            || n >= self.elastic.max_hosts
            || self.elastic.out_of_time
            || self.rejoin_deadline().is_some_and(|d| now >= d);
        match el.size(n, self.elastic.max_hosts) {
            Some(k) if due => {
                self.size_to(now, k, &ready);
                true
            }
            _ => false,
        }
    }

    /// When an elastic attempt that has MIN hosts stops waiting for more.
    /// None for a restart to grow: it waits for the hosts it grew to as a
    /// first attempt waits for all of them (up to the join timeout), since
    /// every one was there when the attempt before stopped for them, and
    /// agents started anew (Ray's are, at every attempt) may take longer
    /// than the rejoin timeout to come back on a loaded machine; starting
    /// without them would only stop again to grow.
    pub(super) fn rejoin_deadline(&self) -> Option<Instant> {
        let el = self.plan.elastic.as_ref()?;
        if self.elastic.sized.is_some() {
            return None;
        }
        if let (Some(expected), Some(previous)) =
            (self.setup.expected_hosts, self.setup.previous_hosts)
        {
            if expected > previous {
                return None;
            }
        }
        self.elastic.min_reached.map(|t| t + el.rejoin_timeout())
    }

    /// Runs this attempt on the first `k` of the `ready` hosts, renumbered
    /// from 0; every other agent waits.
    fn size_to(&mut self, now: Instant, k: u32, ready: &[u32]) {
        let max = self.elastic.max_hosts;
        let mut agents = std::mem::take(&mut self.agents);
        for (new, old) in ready.iter().take(k as usize).enumerate() {
            let new = new as u32;
            let link = agents.remove(*old).expect("a ready host has an agent");
            if new != *old {
                self.send(
                    link.conn,
                    ToAgent::HostAssigned {
                        host: new,
                        run: self.plan.name.clone(),
                    },
                );
            }
            self.agents.insert(new, link);
        }
        self.elastic
            .waiting
            .extend(agents.into_links().into_values().map(|a| Waiting {
                ip: a.ip,
                conn: a.conn,
            }));
        self.plan = self.plan.sized(k);
        self.ranks = super::Ranks::new(self.plan.nprocs);
        self.stepped = 0;
        self.elastic.sized = Some(k);
        self.push(Action::Sized {
            hosts: k,
            nprocs: self.plan.nprocs,
        });
        let previous = self.setup.previous_hosts;
        if previous != Some(k) {
            // Memory checkpoints restore onto the layout that saved them.
            self.setup.memory_step = None;
        }
        if previous.is_some_and(|p| p != k) || (previous.is_none() && k < max) {
            let n = ready.len() as u32;
            let waited = now.saturating_duration_since(self.started).as_secs();
            let rule = if k < n {
                format!(" (the largest count that divides {max})")
            } else {
                String::new()
            };
            let attempt = self.attempt();
            let (reason, line) = match previous {
                Some(p) if k > p => (
                    format!("{n} of {max} hosts are there: growing from {p} to {k}"),
                    format!("attempt {attempt} grows from {p} to {k} hosts: {n} of {max} are there"),
                ),
                Some(p) => (
                    format!(
                        "{n} of {max} hosts came back within {waited} s: shrinking from {p} to {k}{rule}"
                    ),
                    format!(
                        "attempt {attempt} shrinks from {p} to {k} hosts: {n} of {max} came back \
                         within {waited} s{rule}"
                    ),
                ),
                None => (
                    format!("{n} of {max} hosts joined within {waited} s: starting on {k}{rule}"),
                    format!(
                        "attempt {attempt} starts on {k} of {max} hosts: {n} joined within {waited} s{rule}"
                    ),
                ),
            };
            // Said on the terminal too: a run on fewer hosts than asked for
            // must not look like one on all of them.
            self.push(Action::Announce {
                text: format!("meshrun: {line}"),
            });
            self.record(Event::Resized {
                attempt: self.attempt(),
                hosts: k,
                nprocs: self.plan.nprocs,
                previous_hosts: previous,
                max_hosts: max,
                reason: reason.clone(),
            });
            self.setup.resize_reason = Some(reason);
        }
    }

    /// The error of an elastic attempt that never had enough hosts.
    pub(super) fn too_few_hosts(&self) -> AttemptError {
        let el = self.plan.elastic.as_ref().expect("an elastic plan");
        let had: Vec<String> = self
            .agents
            .iter()
            .map(|(h, a)| format!("host {h} ({})", a.ip))
            .collect();
        let rule = if had.len() as u32 >= el.min_hosts {
            format!(
                " and no count from {} to {} divides {} (--any-host-count allows any)",
                el.min_hosts,
                had.len(),
                self.elastic.max_hosts
            )
        } else {
            String::new()
        };
        AttemptError::TooFewHosts {
            had,
            min: el.min_hosts,
            max: self.elastic.max_hosts,
            secs: self.setup.join_timeout.as_secs(),
            rule,
        }
    }

    /// An agent that joined a sized elastic attempt: it waits (unless the
    /// run has all its hosts), and may make the run grow.
    pub(super) fn host_waits(&mut self, now: Instant, ip: String, conn: Conn) -> bool {
        let Some(k) = self.elastic.sized else {
            return false;
        };
        if k + self.elastic.waiting.len() as u32 >= self.elastic.max_hosts {
            return false;
        }
        self.elastic.waiting.push(Waiting {
            ip: ip.clone(),
            conn,
        });
        self.record(Event::HostWaiting {
            attempt: self.attempt(),
            ip,
            running: k,
            waiting: self.elastic.waiting.len() as u32,
        });
        self.maybe_grow(now);
        true
    }

    /// A waiting host's connection ended; `false` when `conn` is not one.
    pub(super) fn waiting_host_lost(&mut self, conn: Conn, error: String) -> bool {
        let Some(i) = self.elastic.waiting.iter().position(|a| a.conn == conn) else {
            return false;
        };
        let link = self.elastic.waiting.remove(i);
        self.record(Event::HostWaitingLeft {
            attempt: self.attempt(),
            ip: link.ip,
            error,
        });
        true
    }

    /// Grows when the hosts waiting and running make a larger count than
    /// the attempt's: every worker saves at its next report, and the
    /// attempt stops once that step is committed (see `committed`).
    pub(super) fn maybe_grow(&mut self, now: Instant) {
        let (Some(el), Some(k)) = (self.plan.elastic.as_ref(), self.elastic.sized) else {
            return;
        };
        if !self.launched
            || self.stop.is_some()
            || self.preempt_deadline.is_some()
            || !self.checkpointing
        {
            return;
        }
        let present = k + self.elastic.waiting.len() as u32;
        let Some(to) = el
            .size(present, self.elastic.max_hosts)
            .filter(|&to| to > k)
        else {
            return;
        };
        self.elastic.growing = Some(to);
        self.preempt_deadline = Some(now + PREEMPT_GRACE);
        let conns: Vec<Conn> = self.ranks.iter().filter_map(|r| r.conn).collect();
        for conn in conns {
            self.send(conn, ToWorker::CheckpointNow);
        }
        self.record(Event::Growing {
            attempt: self.attempt(),
            from_hosts: k,
            to_hosts: to,
        });
    }

    /// How a save asked for on SIGTERM or to grow ends once committed.
    pub(super) fn saved_for_stop(&self, step: u64) -> StopReason {
        match self.elastic.growing {
            Some(hosts) => StopReason::Resize {
                hosts,
                step: Some(step),
            },
            None => StopReason::Preempted(step),
        }
    }

    /// The connections of the hosts waiting.
    pub(super) fn waiting_conns(&self) -> Vec<Conn> {
        self.elastic.waiting.iter().map(|a| a.conn).collect()
    }

    /// The host count this attempt was launched on (an elastic run's own;
    /// the plan's otherwise).
    pub fn hosts_launched(&self) -> Option<u32> {
        self.launched.then_some(self.plan.hosts)
    }

    /// The attempt's ranks (an elastic run's own count once sized).
    pub fn world(&self) -> u32 {
        self.plan.nprocs
    }

    /// Why this attempt runs on another host count than the one before.
    pub fn resize_reason(&self) -> Option<&str> {
        self.setup.resize_reason.as_deref()
    }
}
