//! Failing and stopping an attempt, and what it ended as.

use std::time::{Duration, Instant};

use meshrun_protocol::{ClientReply, ToAgent, ToWorker, STACK_DUMP_WAIT};
use meshrun_record::goodput::{self, Parts};
use meshrun_record::{Cause, Event, FailureRecord};

#[cfg(any(test, feature = "sim"))]
use super::Action;
use super::{Conn, Machine};
use crate::ends::{EarlyFinish, RankEnd};
use crate::outcome::{OutcomeStatus, STOP_GRACE_MS};

/// After a stop is sent, how long to wait for exits that an agent should
/// report before treating the remaining workers as lost.
pub const STOP_REPORT_SLACK: Duration = Duration::from_secs(5);

/// After SIGTERM, how long workers get to reach a step boundary and commit
/// a checkpoint before they are stopped without one.
pub const PREEMPT_GRACE: Duration = Duration::from_mins(1);

/// SIGTERM to SIGKILL when the attempt failed: none (see `begin_stop`).
const FAILURE_STOP_GRACE_MS: u64 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Failure,
    Signal(i32),
    /// Stopped after the checkpoint asked for on SIGTERM was committed.
    Preempted(u64),
    /// An elastic run stopped to go on with `hosts` hosts, after the
    /// checkpoint asked for was committed (`None`: it never was).
    Resize {
        hosts: u32,
        step: Option<u64>,
    },
    /// `meshrun stop` without a checkpoint to end at: `--now` (`now`), a
    /// program that saves none, or a save asked for that never came.
    Requested {
        now: bool,
    },
}

impl Machine {
    /// Records the first failure of the attempt and stops the group. A later
    /// exception or `sys.exit` report from the same rank adds its traceback
    /// (its exit, which comes over the agent's connection, can overtake it).
    pub(super) fn fail(&mut self, now: Instant, rank: u32, cause: Cause) {
        if let Some(held) = &self.held {
            if held.rank == rank {
                // The held rank ending (its exit after it raised) is a
                // consequence too; its exception says more.
                return;
            }
            // Another rank's failure while one waits: that is the cause.
            self.held = None;
        }
        match &mut self.failure {
            Some(first) => {
                if first.rank == rank
                    && matches!(first.cause, Cause::Exit { .. })
                    && matches!(
                        cause,
                        Cause::Exception { .. }
                            | Cause::SystemExit { .. }
                            | Cause::OutOfMemory { .. }
                    )
                {
                    first.cause = cause;
                }
                return;
            }
            None if self.stop.is_some() => return,
            None => {}
        }
        let record = FailureRecord {
            rank,
            host: rank / self.plan.procs_per_host,
            attempt: self.attempt(),
            cause,
            exit: None,
        };
        self.record(Event::WorkerFailed(record.clone()));
        self.failure = Some(record);
        if self.programs.any() {
            let text = self.programs.dump();
            self.push(super::Action::WriteCalls { text });
        }
        self.begin_stop(now, StopReason::Failure);
    }

    pub(super) fn interrupt(&mut self, now: Instant, signal: i32) {
        self.halt(now, StopReason::Signal(signal));
    }

    /// Stops every worker now, for `reason`; when a stop is under way
    /// already, it keeps its reason and loses its grace.
    fn halt(&mut self, now: Instant, reason: StopReason) {
        if self.stop.is_some() {
            // Asked again while stopping: no more grace.
            for conn in self.agent_conns() {
                self.send(
                    conn,
                    ToAgent::Stop {
                        grace_ms: 0,
                        dump_stacks: false,
                    },
                );
            }
            return;
        }
        self.begin_stop(now, reason);
    }

    /// SIGTERM: preemption. When the program checkpoints through
    /// `meshrun.report`, every worker is asked to save at its next report
    /// and the group stops once that step is committed; otherwise (or on a
    /// second SIGTERM) it stops now.
    pub(super) fn terminate(&mut self, now: Instant) {
        let sigterm = crate::outcome::SIGTERM;
        if self.stop.is_none() && self.elastic.growing.take().is_some() {
            // The save asked for to grow serves the preemption instead.
            return self.record(Event::Preempting {
                attempt: self.attempt(),
                grace_s: PREEMPT_GRACE.as_secs(),
            });
        }
        if self.stop.is_some() || self.preempt_deadline.is_some() || !self.checkpointing {
            return self.interrupt(now, sigterm);
        }
        self.preempt_deadline = Some(now + PREEMPT_GRACE);
        let conns: Vec<Conn> = self.ranks.iter().filter_map(|r| r.conn).collect();
        for conn in conns {
            self.send(conn, ToWorker::CheckpointNow);
        }
        self.record(Event::Preempting {
            attempt: self.attempt(),
            grace_s: PREEMPT_GRACE.as_secs(),
        });
    }

    /// `meshrun stop`: as SIGTERM when a checkpoint can end the run, else
    /// (or with `--now`, or when already stopping) at once.
    pub(super) fn stop_requested(&mut self, now: Instant, at_once: bool, reply: Conn) {
        self.record(Event::StopRequested {
            attempt: self.attempt(),
            now: at_once,
        });
        // A stop asked for ends as one, not as a signal's interruption.
        self.stop_asked.get_or_insert(now);
        let what = if at_once || self.stop.is_some() {
            self.halt(now, StopReason::Requested { now: true });
            "stopping every worker now"
        } else if self.checkpointing
            && (self.preempt_deadline.is_none() || self.elastic.growing.is_some())
        {
            self.terminate(now);
            "every worker saves a checkpoint at its next report; the run stops once it is committed"
        } else {
            self.halt(now, StopReason::Requested { now: false });
            "stopping every worker now (the program has not saved a checkpoint through meshrun.report, so there is none to wait for)"
        };
        self.send(
            reply,
            ClientReply::StopAccepted {
                what: what.to_string(),
            },
        );
    }

    pub(super) fn begin_stop(&mut self, now: Instant, reason: StopReason) {
        self.stop = Some(reason);
        self.ranks.update_all(|_, r| {
            if !r.done {
                r.stopped_by_meshrun = true;
            }
        });
        // Every surviving rank's stacks show where the group was when it
        // failed (the hung frame, or who waited on whom).
        let dump_stacks = reason == StopReason::Failure && self.ranks.iter().any(|r| !r.done);
        // A failed group cannot go on (JAX SPMD does not survive a missing
        // member) and JAX workers ignore SIGTERM, so after the stacks it is
        // killed at once: every second here delays the restart.
        // After a preemption's commit every rank waits in `report` with
        // nothing left to lose: no grace either, so none trains on.
        let grace_ms = match reason {
            StopReason::Failure | StopReason::Preempted(_) | StopReason::Resize { .. } => {
                FAILURE_STOP_GRACE_MS
            }
            StopReason::Signal(_) | StopReason::Requested { .. } => STOP_GRACE_MS,
        };
        for conn in self.agent_conns() {
            self.send(
                conn,
                ToAgent::Stop {
                    grace_ms,
                    dump_stacks,
                },
            );
        }
        let dump_wait = if dump_stacks {
            STACK_DUMP_WAIT
        } else {
            Duration::ZERO
        };
        self.stop_deadline =
            Some(now + dump_wait + Duration::from_millis(grace_ms) + STOP_REPORT_SLACK);
        let attempt = self.attempt();
        if dump_stacks {
            self.stacks_dumped = true;
            self.record(Event::StacksDumped {
                attempt,
                dir: meshrun_record::names::stacks_dir(&self.plan.run_dir, attempt)
                    .display()
                    .to_string(),
            });
        }
        let reason = match reason {
            StopReason::Failure => "failure".to_string(),
            StopReason::Signal(s) => format!("signal {s}"),
            StopReason::Requested { now: true } => "meshrun stop --now".to_string(),
            StopReason::Requested { now: false } => {
                "meshrun stop, without a checkpoint to end at".to_string()
            }
            StopReason::Preempted(step) => format!("preempted after checkpoint step {step}"),
            StopReason::Resize { hosts, step } => match step {
                Some(step) => format!("growing to {hosts} hosts after checkpoint step {step}"),
                None => format!("growing to {hosts} hosts (the checkpoint asked for never came)"),
            },
        };
        self.record(Event::Stopping { attempt, reason });
    }

    pub(super) fn agent_conns(&self) -> Vec<Conn> {
        self.agents.values().map(|a| a.conn).collect()
    }

    /// How the attempt ended (once [`Machine::is_finished`]).
    pub fn status(&self) -> OutcomeStatus {
        match self.stop {
            Some(StopReason::Signal(signal)) => OutcomeStatus::Interrupted { signal },
            // Steps may still commit while the group stops; the newest counts.
            Some(StopReason::Preempted(step)) => OutcomeStatus::Preempted {
                step: self.last_committed.unwrap_or(step),
            },
            Some(StopReason::Resize { hosts, .. }) => OutcomeStatus::Resized { hosts },
            Some(StopReason::Requested { now }) => OutcomeStatus::Stopped { now },
            None if self
                .ranks
                .iter()
                .all(|r| r.exit.is_some_and(|e| e.success())) =>
            {
                OutcomeStatus::Succeeded
            }
            // A failure, or workers lost without a reported exit.
            Some(StopReason::Failure) | None => OutcomeStatus::Failed,
        }
    }

    /// The attempt's first failure, with how its rank finally ended.
    pub fn failure(&self) -> Option<FailureRecord> {
        let mut f = self.failure.clone()?;
        f.exit = self.ranks.get(f.rank as usize).and_then(|r| r.exit);
        Some(f)
    }

    /// What the failure summary says of every rank.
    pub fn rank_ends(&self) -> Vec<RankEnd> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(rank, r)| RankEnd {
                rank: rank as u32,
                exit: r.exit,
                stopped_by_meshrun: r.stopped_by_meshrun,
                finished_early: r
                    .finished
                    .filter(|_| r.finished_before_failure)
                    .map(|(_, last_step)| EarlyFinish { last_step }),
                // The driver's output has it.
                last_line: None,
            })
            .collect()
    }

    /// Whether the surviving ranks were asked for their stacks.
    pub fn stacks_dumped(&self) -> bool {
        self.stacks_dumped
    }

    /// Reports sent per rank.
    pub fn reports(&self) -> Vec<u64> {
        self.ranks.iter().map(|r| r.reports).collect()
    }

    /// Reports each rank dropped unsent; empty when none did.
    pub fn reports_shed(&self) -> Vec<u64> {
        if self.ranks.iter().all(|r| r.shed == 0) {
            return Vec::new();
        }
        self.ranks.iter().map(|r| r.shed).collect()
    }

    /// Rank 0's most recent metrics.
    pub fn take_last_metrics(&mut self) -> Option<serde_json::Value> {
        self.last_metrics.take()
    }

    /// This attempt's goodput parts, averaged over its ranks, for an
    /// attempt from `start` to `end` (unix seconds).
    pub fn goodput(&self, status: OutcomeStatus, start: f64, end: f64) -> Parts {
        let tail = match status {
            OutcomeStatus::Failed => goodput::Tail::Failed,
            OutcomeStatus::Resized { .. } => goodput::Tail::Resized,
            _ => goodput::Tail::Ended,
        };
        let ranks: Vec<Parts> = self
            .ranks
            .iter()
            .map(|r| {
                let cut = if tail == goodput::Tail::Ended {
                    r.timing.as_ref()
                } else {
                    self.last_committed
                        .and_then(|c| r.saved_timings.range(..=c).next_back().map(|(_, t)| t))
                };
                goodput::rank_parts(start, end, tail, cut)
            })
            .collect();
        let mut parts = goodput::mean(&ranks);
        // An attempt on another host count than the one before: its wait
        // for hosts was the resize's.
        if let (Some(_), Some(at)) = (self.setup.resize_reason.as_ref(), self.elastic.launched_at) {
            let waited = at.saturating_duration_since(self.started).as_secs_f64();
            parts.shift(goodput::Part::Startup, goodput::Part::Resize, waited);
        }
        parts
    }

    #[cfg(any(test, feature = "sim"))]
    pub(super) fn drain_actions(&mut self) -> Vec<Action> {
        self.actions.drain(..).collect()
    }
}
