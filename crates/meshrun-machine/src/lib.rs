//! One attempt's decisions, apart from all I/O (as `quinn-proto` keeps
//! QUIC's state apart from `quinn`'s sockets): [`Input`]s go in with the
//! time they happened, [`Action`]s come out of [`Machine::poll_action`],
//! and [`Machine::poll_timeout`] names the next moment at which something
//! is decided without an input (a join, stop, preemption, heartbeat, hang
//! or drain deadline), to be passed to [`Machine::handle_timeout`]. The
//! machine never reads the clock, the environment or a file, and owns no
//! connection: it names them by [`Conn`], which the driver maps onto its
//! channels. So every decision is tested with a simulated clock
//! (`tests.rs`), and the driver (meshrun-core's `controller::driver`) only
//! carries out what it is told. Across attempts, [`Run`] decides what
//! each attempt starts with and what follows its end (a restart, a resize,
//! the end of the run).
//!
//! A crate of its own so that the rule is the build's: it depends on no
//! async runtime and on no crate that does I/O (`tests/test_crates.py`
//! reads its dependency tree, and its sources name no `std::fs`,
//! `std::net`, `std::process`, `std::thread` or clock).

mod agents;
pub mod captures;
mod commits;
mod deadlines;
mod elastic;
mod ends;
mod error;
pub mod gather;
mod launching;
mod links;
mod memory;
mod messages;
mod oom;
mod outcome;
pub mod outgoing;
mod peer_loss;
mod programs;
mod rank;
mod ranks;
mod run;
mod setup;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod stop;
pub mod stragglers;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_commits;
#[cfg(test)]
mod tests_elastic;
#[cfg(test)]
mod tests_exits;
#[cfg(test)]
mod tests_hosts;
#[cfg(test)]
mod tests_memory;
#[cfg(test)]
mod tests_oom;
#[cfg(test)]
mod tests_programs;
#[cfg(test)]
mod tests_start;
#[cfg(test)]
mod tests_stop;
#[cfg(test)]
mod tests_timers;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use meshrun_protocol::{FromAgent, FromWorker, ToAgent, ToWorker};
use meshrun_record::{Cause, Event, FailureRecord};
use serde_json::Value;

use gather::Part;
use links::{AgentLink, Agents};
use meshrun_plan::RunPlan;
use ranks::Ranks;

pub use ends::{EarlyFinish, RankEnd};
pub use error::AttemptError;
pub use meshrun_plan::{AGENT_JOIN_TIMEOUT, DEFAULT_JOIN_TIMEOUT};
pub use outcome::{Outcome, OutcomeStatus, EXIT_PREEMPTED, EXIT_STOPPED, STOP_GRACE_MS};
pub use outgoing::Outgoing;
pub use run::{after, After, Ended, Next, Run, Start};
pub use setup::{Setup, StorageProbe};
pub use stop::StopReason;

/// A connection, as the driver numbers them.
pub type Conn = u64;

/// What happened, as the driver saw it.
#[derive(Debug)]
pub enum Input {
    AgentJoined {
        /// `None`: a joining agent without a rank; the machine assigns one.
        host: Option<u32>,
        ip: String,
        pid: u32,
        gpus: Vec<String>,
        free_port: u16,
        /// How this host reaches the controller (given to its workers).
        controller: Option<String>,
        /// Where its agent takes memory checkpoints' replicas.
        replica_port: Option<u16>,
        conn: Conn,
    },
    AgentLost {
        conn: Conn,
        error: String,
    },
    /// A message of the agent on connection `conn` about its workers.
    FromAgent {
        conn: Conn,
        msg: FromAgent,
    },
    WorkerJoined {
        rank: u32,
        attempt: u32,
        pid: u32,
        conn: Conn,
    },
    FromWorker {
        rank: u32,
        msg: FromWorker,
    },
    /// A worker's connection ended; `clean` when it said goodbye first.
    WorkerLost {
        rank: u32,
        clean: bool,
    },
    /// `meshrun stop`; the answer goes to `reply`.
    StopRequested {
        now: bool,
        reply: Conn,
    },
    /// SIGINT, or a stop asked for from another thread.
    Interrupt {
        signal: i32,
    },
    /// SIGTERM: preemption.
    Terminate,
    /// The driver committed checkpoint `step` after [`Action::Commit`].
    Committed {
        step: u64,
        /// The step's folder, or its URL in an object store.
        path: String,
    },
    CommitFailed {
        step: u64,
        error: String,
    },
    /// The ranks' parts of `step` can never make a checkpoint (a sharded
    /// state that rank `rank` passed and others did not): the attempt
    /// fails, naming them.
    CommitRefused {
        step: u64,
        rank: u32,
        error: String,
    },
    /// The cluster holds back resources the run asked for, as the Ray
    /// placement process describes them; `None`: nothing waits now.
    ResourcesWaiting {
        what: Option<String>,
    },
}

/// What the driver is to do, in order.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Send `msg` on connection `to`.
    Send { to: Conn, msg: Outgoing },
    /// Close a connection: a worker given up on sees its controller go.
    Close { conn: Conn },
    /// Append to `events.jsonl`.
    Record(Event),
    /// An elastic attempt runs on `hosts` hosts, `nprocs` processes (its
    /// logs, gathers and summaries are for that many ranks).
    Sized { hosts: u32, nprocs: u32 },
    /// A line of meshrun's own on the terminal: what the run does, said
    /// when it is decided (an elastic attempt on another host count).
    Announce { text: String },
    /// Open the ranks' logs; the launch follows.
    OpenLogs,
    /// Append rank 0's report to `metrics.jsonl`.
    Metrics { step: Option<u64>, metrics: Value },
    /// A line of meshrun's own in a rank's log.
    Note { rank: u32, text: String },
    /// Rank 0 reported (the status line).
    Progress {
        step: Option<u64>,
        metrics: Value,
        total_steps: Option<u64>,
    },
    /// A save began (`Some(step)`) or its commit came (`None`).
    Saving { step: Option<u64> },
    /// What the cluster holds back, for the status line (`None`: nothing).
    Waiting { what: Option<String> },
    /// Rank `rank` wrote its part of checkpoint `step`: commit the step
    /// once it is complete (see `gather`), and answer [`Input::Committed`].
    Commit {
        rank: u32,
        step: u64,
        part: Part,
        extra: Option<Value>,
    },
    /// Rank `rank` reported `step` (`passed`: with something to
    /// checkpoint; `saving`: its save began): a step another rank saved
    /// may be complete now.
    Reported {
        rank: u32,
        step: u64,
        passed: bool,
        saving: bool,
    },
    /// A rank's save of `step` failed: it will never be complete.
    Abandon { step: u64 },
    /// A step was committed: apply the retention policy.
    ApplyRetention,
    /// Rank `rank`'s stacks, as its agent sent them: into the run folder.
    WriteStacks { rank: u32, text: String },
    /// The flight recorder's dump of a failed attempt: into the run folder.
    WriteCalls { text: String },
}

/// The state of one attempt.
pub struct Machine {
    plan: RunPlan,
    setup: Setup,
    started: Instant,
    agents: Agents,
    /// Which host each agent connection is, checked against `agents` at
    /// each use (so never stale): every agent message and output line
    /// asks, and a scan of 1,250 agents each time was the cost.
    conn_hosts: std::cell::RefCell<HashMap<Conn, u32>>,
    ranks: Ranks,
    failure: Option<FailureRecord>,
    /// An exception that reads as a lost peer, waiting for its cause.
    held: Option<peer_loss::Held>,
    stop: Option<StopReason>,
    /// When `meshrun stop` asked for the stop (a save for it may be under
    /// way): the attempt ends as a stop, not as an interruption.
    stop_asked: Option<Instant>,
    stop_deadline: Option<Instant>,
    last_metrics: Option<Value>,
    launched: bool,
    /// Memory checkpoints and their replicas.
    memory: memory::MemoryTier,
    /// Elastic runs: the attempt's size and the hosts that wait.
    elastic: elastic::ElasticState,
    /// When every rank had reported a step: the agents were told to start
    /// their next spares then (not before, so they do not slow the start).
    training: Option<Instant>,
    /// How many ranks have reported a step.
    stepped: usize,
    /// A report of this attempt came with the state to checkpoint, so
    /// SIGTERM can end in a checkpoint.
    checkpointing: bool,
    /// When SIGTERM asked for a checkpoint, the deadline for committing it.
    preempt_deadline: Option<Instant>,
    stacks_dumped: bool,
    /// The ranks' calls of programs across processes, compared.
    programs: programs::Programs,
    /// The newest step committed in this attempt.
    last_committed: Option<u64>,
    /// Since when the cluster has held back resources, and what.
    waiting: Option<(Instant, String)>,
    /// The moment the driver was asked to wake up for, and since when the
    /// controller itself is known to have been running (see
    /// `deadlines.rs`: a stalled controller must not blame its workers).
    wake: Option<Instant>,
    awake_since: Instant,
    actions: VecDeque<Action>,
}

impl Machine {
    pub fn new(plan: RunPlan, setup: Setup, now: Instant) -> Self {
        Self {
            ranks: Ranks::new(plan.nprocs),
            programs: programs::Programs::new(plan.nprocs as usize),
            elastic: elastic::ElasticState::new(plan.hosts),
            plan,
            setup,
            started: now,
            agents: Agents::default(),
            conn_hosts: std::cell::RefCell::default(),
            failure: None,
            held: None,
            stop: None,
            stop_asked: None,
            stop_deadline: None,
            last_metrics: None,
            launched: false,
            training: None,
            stepped: 0,
            memory: memory::MemoryTier::default(),
            checkpointing: false,
            preempt_deadline: None,
            stacks_dumped: false,
            last_committed: None,
            waiting: None,
            wake: None,
            awake_since: now,
            actions: VecDeque::new(),
        }
    }

    /// The next thing to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn push(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    fn record(&mut self, event: Event) {
        self.push(Action::Record(event));
    }

    fn send(&mut self, to: Conn, msg: impl Into<Outgoing>) {
        self.push(Action::Send {
            to,
            msg: msg.into(),
        });
    }

    fn attempt(&self) -> u32 {
        self.setup.attempt
    }

    pub fn launched(&self) -> bool {
        self.launched
    }

    /// Every worker has ended and all it sent has been read (or the attempt
    /// ended before launching).
    pub fn is_finished(&self, now: Instant) -> bool {
        if !self.launched {
            return self.stop.is_some();
        }
        // A held exception is decided (at its grace's end) before the end.
        self.held.is_none() && self.ranks.all_ended(now)
    }

    /// Tells every agent the attempt is over (after
    /// [`Machine::is_finished`]); `again` when another follows.
    pub fn shutdown(&mut self, again: bool) {
        let mut conns: Vec<Conn> = self.agents.values().map(|a| a.conn).collect();
        conns.extend(self.waiting_conns());
        let state = (!again).then(|| self.status().state().as_str().to_string());
        for conn in conns {
            self.send(
                conn,
                ToAgent::Shutdown {
                    again,
                    state: state.clone(),
                },
            );
        }
    }

    /// The host of the agent on `conn`, once it has one.
    /// The connection of rank `rank`'s worker, while it is connected and
    /// has not ended (for requests beside the machine's own: profiles).
    pub fn worker_conn(&self, rank: u32) -> Option<Conn> {
        let r = self.ranks.get(rank as usize)?;
        r.conn.filter(|_| !r.done && self.stop.is_none())
    }

    pub fn host_of(&self, conn: Conn) -> Option<u32> {
        let cached = self.conn_hosts.borrow().get(&conn).copied();
        if let Some(host) = cached.filter(|h| self.agents.get(h).is_some_and(|a| a.conn == conn)) {
            return Some(host);
        }
        let found = self
            .agents
            .iter()
            .find_map(|(&host, a)| (a.conn == conn).then_some(host));
        let mut cache = self.conn_hosts.borrow_mut();
        match found {
            Some(host) => cache.insert(conn, host),
            None => cache.remove(&conn),
        };
        found
    }

    pub fn handle(&mut self, now: Instant, input: Input) -> Result<(), AttemptError> {
        match input {
            Input::AgentJoined {
                host,
                ip,
                pid,
                gpus,
                free_port,
                controller,
                replica_port,
                conn,
            } => self.agent_joined(
                now,
                host,
                ip,
                pid,
                gpus,
                (free_port, replica_port),
                controller,
                conn,
            ),
            Input::AgentLost { conn, error } => {
                if self.waiting_host_lost(conn, error.clone()) {
                    return Ok(());
                }
                let Some(host) = self.host_of(conn) else {
                    return Ok(());
                };
                if !self.launched && self.plan.rendezvous && host != 0 {
                    // A host that joined by itself may join again (its
                    // network blinked, its `meshrun join` was restarted):
                    // its rank is free until then.
                    tracing::warn!(host, "a joined host left before the launch ({error})");
                    self.agents.remove(host);
                    self.memory_host_left(host);
                    self.record(Event::AgentLeft { host, error });
                    return Ok(());
                }
                if !self.launched {
                    if self.stop.is_none() {
                        return Err(AttemptError::AgentGone {
                            host,
                            what: format!("disconnected ({error})"),
                        });
                    }
                    return Ok(());
                }
                let pph = self.plan.procs_per_host;
                let lost: Vec<u32> = (host * pph..(host + 1) * pph)
                    .filter(|&r| !self.ranks[r as usize].done)
                    .collect();
                for &rank in &lost {
                    self.abandon(rank);
                }
                if let Some(&rank) = lost.first() {
                    self.fail(now, rank, Cause::AgentLost { host, error });
                }
            }
            Input::FromAgent { conn, msg } => {
                let Some(host) = self.host_of(conn) else {
                    return Ok(());
                };
                self.agents.heard(host, now);
                self.on_agent_news(now, host, msg)?;
            }
            Input::WorkerJoined {
                rank,
                attempt,
                pid,
                conn,
            } => {
                if attempt != self.attempt() || rank as usize >= self.ranks.len() {
                    tracing::debug!(rank, attempt, "worker of another attempt ignored");
                    self.push(Action::Close { conn });
                    return Ok(());
                }
                tracing::debug!(rank, pid, "worker connected");
                if self.preempt_deadline.is_some() {
                    self.send(conn, ToWorker::CheckpointNow);
                }
                self.ranks.update(rank, |state| {
                    state.heard = Some(now);
                    state.conn = Some(conn);
                });
            }
            Input::FromWorker { rank, msg } => {
                if (rank as usize) < self.ranks.len() {
                    self.ranks.update(rank, |state| state.heard = Some(now));
                }
                self.on_worker_message(now, rank, msg);
            }
            Input::WorkerLost { rank, clean } => {
                tracing::debug!(rank, clean, "worker connection closed");
                let failed = self.failure.is_some();
                if (rank as usize) < self.ranks.len() {
                    let conn = self.ranks.update(rank, |state| {
                        state.heard = None;
                        if clean {
                            state.finish(now, failed);
                        } else {
                            state.connection_lost = Some(now);
                        }
                        state.conn.take()
                    });
                    if let Some(conn) = conn {
                        self.push(Action::Close { conn });
                    }
                    if clean {
                        if let Some(parted) = self.programs.finished(rank) {
                            self.parted(now, parted);
                        }
                    }
                }
            }
            Input::StopRequested {
                now: at_once,
                reply,
            } => {
                self.stop_requested(now, at_once, reply);
            }
            Input::Interrupt { signal } => self.interrupt(now, signal),
            Input::Terminate => self.terminate(now),
            Input::Committed { step, path } => self.committed(now, step, &path),
            Input::CommitFailed { step, error } => {
                self.record(Event::CheckpointFailed {
                    attempt: self.attempt(),
                    step,
                    error: error.clone(),
                });
                self.not_committed(step, format!("its commit failed: {error}"));
            }
            Input::ResourcesWaiting { what } => self.resources_waiting(now, what),
            Input::CommitRefused { step, rank, error } => {
                self.record(Event::CheckpointFailed {
                    attempt: self.attempt(),
                    step,
                    error: error.clone(),
                });
                self.not_committed(step, error.clone());
                self.fail(
                    now,
                    rank,
                    Cause::Exception {
                        exception: "meshrun.CheckpointError".into(),
                        message: error,
                        traceback: String::new(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Remembers since when something waits (a changed description of
    /// the wait is the same wait), and records each change. Only before
    /// the first step: Ray Data's streaming queues tasks all the time.
    fn resources_waiting(&mut self, now: Instant, what: Option<String>) {
        if self.ranks.any_reported() {
            if self.waiting.take().is_some() {
                self.push(Action::Waiting { what: None });
            }
            return;
        }
        let same = match (&self.waiting, &what) {
            (Some((_, old)), Some(new)) => old == new,
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        self.waiting = match what.clone() {
            Some(text) => Some((self.waiting.as_ref().map_or(now, |(t, _)| *t), text)),
            None => None,
        };
        self.record(Event::WaitingForResources {
            attempt: self.attempt(),
            what: what.clone(),
        });
        self.push(Action::Waiting { what });
    }

    /// Gives up on a worker that can no longer be stopped or heard from in
    /// order (its agent is gone, or its exit never came). Closing its
    /// connection means a worker still alive sees its controller go and
    /// kills itself; and an orphan that keeps sending heartbeats cannot
    /// hold the attempt open.
    fn abandon(&mut self, rank: u32) {
        let conn = self.ranks.update(rank, |state| {
            state.done = true;
            state.conn.take()
        });
        if let Some(conn) = conn {
            self.push(Action::Close { conn });
        }
    }
}
