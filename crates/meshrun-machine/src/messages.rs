//! What the agents and workers say, as the machine takes it.

use std::time::Instant;

use meshrun_protocol::{FromAgent, FromWorker, ToAgent, ToWorker};
use meshrun_record::failure::OomHow;
use meshrun_record::{Cause, Event, ExitInfo};

use super::{Action, Conn, Machine};
use crate::gather::Part;

impl Machine {
    pub(super) fn on_agent_message(&mut self, now: Instant, host: u32, msg: FromAgent) {
        let pph = self.plan.procs_per_host;
        let owns = |rank: u32| rank / pph == host && (rank as usize) < self.ranks.len();
        let attempt = self.attempt();
        match msg {
            FromAgent::WorkerStarted { rank, pid, warm } if owns(rank) => {
                self.ranks.update(rank, |state| {
                    state.pid = Some(pid);
                    state.progress = Some(now);
                });
                self.record(Event::WorkerStarted {
                    attempt,
                    rank,
                    host,
                    pid,
                    warm,
                });
            }
            FromAgent::SpawnFailed {
                rank,
                error,
                problem,
            } if owns(rank) => {
                self.ranks.update(rank, |state| state.done = true);
                let deterministic = problem.lasting();
                self.fail(
                    now,
                    rank,
                    Cause::SpawnFailed {
                        error,
                        deterministic,
                    },
                );
            }
            FromAgent::LeftoversEnded { rank, pids, how } if owns(rank) => {
                self.record(Event::LeftoversEnded {
                    attempt,
                    rank,
                    host,
                    count: pids.len(),
                    pids,
                    how,
                });
            }
            FromAgent::WorkerExited { rank, exit, memory } if owns(rank) => {
                let failed = self.failure.is_some();
                let (stopped, by_meshrun) = self.ranks.update(rank, |state| {
                    state.exit = Some(exit);
                    state.done = true;
                    if exit.success() {
                        state.finish(now, failed);
                    }
                    let stopped = state.stopped_by_meshrun;
                    // Said of what meshrun did only: it ends a worker with
                    // SIGTERM (which a program may turn into an exit code)
                    // and SIGKILL. A rank that aborted or crashed by itself
                    // in the meantime (gloo aborts once a peer is gone), or
                    // whose exit was not seen, ended on its own.
                    let by_meshrun = stopped && ended_as_meshrun_stops(exit);
                    state.stopped_by_meshrun = by_meshrun;
                    (stopped, by_meshrun)
                });
                // The log says which rank failed and why, as the summary
                // does, not only how each process ended.
                let text = match &self.failure {
                    Some(f) if f.rank == rank => format!(
                        "rank {rank} ended with {exit}, after it {}",
                        f.cause.headline()
                    ),
                    Some(f) if by_meshrun => format!(
                        "rank {rank} ended with {exit}: meshrun stopped it after rank {} failed",
                        f.rank
                    ),
                    _ => format!("rank {rank} ended with {exit}"),
                };
                self.push(Action::Note { rank, text });
                self.record(Event::WorkerExited {
                    attempt,
                    rank,
                    exit,
                    stopped_by_meshrun: by_meshrun,
                });
                if let Some(memory) = memory {
                    self.memory_at_exit(rank, memory);
                }
                if !exit.success() && !stopped {
                    let cause = match memory {
                        Some(m) if m.oom_killed => self.out_of_memory(rank, OomHow::Killed, m),
                        _ => Cause::Exit { exit },
                    };
                    self.fail(now, rank, cause);
                }
            }
            // About a rank that is not this host's (or not in the attempt).
            FromAgent::WorkerStarted { rank, .. }
            | FromAgent::SpawnFailed { rank, .. }
            | FromAgent::LeftoversEnded { rank, .. }
            | FromAgent::WorkerExited { rank, .. } => {
                tracing::debug!(host, rank, "ignored a message about another host's rank");
            }
            // The agent's own news (`on_agent_news`), and what the server
            // and the driver take before the machine (the hello, clock
            // probes, output lines, step times).
            FromAgent::Heartbeat
            | FromAgent::WorkerBeats { .. }
            | FromAgent::WorkerMemory { .. }
            | FromAgent::StorageChecked { .. }
            | FromAgent::MemoryHeld { .. }
            | FromAgent::MemoryPrepared { .. }
            | FromAgent::Stacks { .. }
            | FromAgent::AgentHello { .. }
            | FromAgent::ClockProbe { .. }
            | FromAgent::Log { .. }
            | FromAgent::StepTimes { .. } => {}
        }
    }

    pub(super) fn on_worker_message(&mut self, now: Instant, rank: u32, msg: FromWorker) {
        if rank as usize >= self.ranks.len() {
            return;
        }
        match msg {
            FromWorker::Report {
                step,
                metrics,
                checkpoint,
                timing,
                saving,
                total_steps,
            } => {
                let unsaved = step.filter(|_| !saving);
                if let (0, Some(s), None) = (rank, step, self.ranks[0].last_step) {
                    self.record(Event::FirstStep {
                        attempt: self.attempt(),
                        step: s,
                        timing: timing.clone(),
                    });
                }
                self.ranks.update(rank, |state| {
                    state.progress = Some(now);
                    if state.last_step.is_none() && step.is_some() {
                        self.stepped += 1;
                    }
                    state.last_step = step.or(state.last_step);
                    if unsaved.is_some() {
                        state.unsaved_step = state.unsaved_step.max(unsaved);
                    }
                    state.reports += 1;
                    if let Some(t) = timing {
                        // A save's figures: where a failure's lost time
                        // starts once that step is committed.
                        if let (true, Some(s)) = (saving, step) {
                            state.saved_timings.insert(s, t.clone());
                        }
                        state.timing = Some(t);
                    }
                });
                if rank == 0 && step.is_some() && self.plan.metrics_file.is_some() {
                    // Only rank 0 follows the program's metrics file: its
                    // steps are every rank's (the ranks of one SPMD program
                    // step together), for hang detection and for when
                    // training began.
                    self.ranks.update_all(|other, r| {
                        if other == 0 {
                            return;
                        }
                        r.progress = Some(now);
                        if r.last_step.is_none() {
                            self.stepped += 1;
                        }
                        r.last_step = step.or(r.last_step);
                    });
                }
                let first_checkpointing = checkpoint && !self.checkpointing;
                self.checkpointing |= checkpoint;
                if first_checkpointing {
                    self.maybe_grow(now);
                }
                // A count, not a scan of every rank at every report: at
                // 10,000 ranks the scan alone outran the controller.
                if self.training.is_none() && self.stepped == self.ranks.len() {
                    self.training = Some(now);
                    for conn in self.agent_conns() {
                        self.send(conn, ToAgent::Training);
                    }
                }
                if let Some(s) = step {
                    self.push(Action::Reported {
                        rank,
                        step: s,
                        passed: checkpoint,
                        saving,
                    });
                }
                // A rank that saved this step for the preemption waits for
                // its commit, which cannot come now: let it go on (it may
                // hold the others in a collective).
                if let Some(s) = unsaved {
                    if self.preempt_deadline.is_some() && self.stop.is_none() {
                        self.release_preempt_waiters(s);
                    }
                }
                if rank == 0 {
                    self.push(Action::Progress {
                        step,
                        metrics: metrics.clone(),
                        total_steps,
                    });
                    if saving {
                        self.push(Action::Saving { step });
                    }
                    self.push(Action::Metrics {
                        step,
                        metrics: metrics.clone(),
                    });
                    self.last_metrics = Some(metrics);
                }
            }
            FromWorker::MemoryWritten {
                step,
                leaves,
                extra,
            } => self.memory_written(rank, step, leaves, extra),
            FromWorker::CheckpointWritten {
                step,
                leaves,
                files,
                extra,
            } => self.push(Action::Commit {
                rank,
                step,
                part: files.map_or(Part::Shards(leaves), Part::Files),
                extra,
            }),
            FromWorker::Executable {
                name,
                outcome,
                reason,
                seconds,
            } => self.record(Event::Executable {
                attempt: self.attempt(),
                rank,
                name,
                outcome,
                reason,
                seconds,
            }),
            FromWorker::Program { program } => {
                // A check of replicated values (a line per leaf, at every
                // checkpoint) is compared, not kept.
                if !program.is_values() && (rank == 0 || !self.programs.knows(&program.fingerprint))
                {
                    self.record(Event::Program {
                        attempt: self.attempt(),
                        rank,
                        program: program.clone(),
                    });
                }
                if let Some(parted) = self.programs.program(rank, program) {
                    self.parted(now, parted);
                }
            }
            FromWorker::Call {
                n,
                fingerprint,
                site,
            } => {
                let call = crate::programs::Call {
                    n,
                    fingerprint,
                    site,
                };
                if let Some(parted) = self.programs.call(rank, call) {
                    self.parted(now, parted);
                }
            }
            FromWorker::SaveFailed { step, error } => {
                self.push(Action::Abandon { step });
                self.record(Event::CheckpointFailed {
                    attempt: self.attempt(),
                    step,
                    error: format!("rank {rank}: {error}"),
                });
                self.push(Action::Note {
                    rank,
                    text: format!(
                        "checkpoint step-{step} was not saved, training goes on: {error}"
                    ),
                });
                self.push(Action::Saving { step: None });
                self.not_committed(
                    step,
                    format!("rank {rank} could not write its part: {error}"),
                );
            }
            FromWorker::Timing { timing } => {
                self.ranks.update(rank, |state| state.timing = Some(timing));
            }
            FromWorker::ReportsShed { count } => {
                let total = self.ranks.update(rank, |state| {
                    state.shed = state.shed.saturating_add(count);
                    state.shed
                });
                self.push(Action::Note {
                    rank,
                    text: format!("{count} reports dropped before they were sent ({total} in this attempt): the controller was behind"),
                });
            }
            // A rank saving `step` went past every earlier step without a
            // preemption save of it: ranks waiting on those go on, to meet
            // the others at a later step.
            FromWorker::PreemptSave { step }
                if self.preempt_deadline.is_some() && self.stop.is_none() && step > 0 =>
            {
                // And a rank that went past this step without saving it
                // (the request reached it a step later) keeps it from
                // committing: this rank need not wait for it either.
                let unsaved = self.ranks.iter().filter_map(|r| r.unsaved_step).max();
                self.release_preempt_waiters((step - 1).max(unsaved.unwrap_or(0)));
            }
            FromWorker::Failure {
                message, traceback, ..
            } if crate::oom::reads_as_out_of_memory(&message) => {
                let cause = self.allocation_failed(rank, message, traceback);
                self.exception(now, rank, cause);
            }
            FromWorker::Failure {
                kind,
                message,
                traceback,
            } => self.exception(
                now,
                rank,
                Cause::Exception {
                    exception: kind,
                    message,
                    traceback,
                },
            ),
            FromWorker::StateNeed { need } => {
                self.ranks.update(rank, |state| state.need = Some(need));
            }
            FromWorker::ExitRequested {
                code,
                argument,
                traceback,
            } => self.fail(
                now,
                rank,
                Cause::SystemExit {
                    code,
                    argument,
                    traceback,
                },
            ),
            // A sign of life only, counted for every message; profile
            // traces, which the driver writes; the hello and the goodbye,
            // which open and end the connection; a preemption save outside
            // a preemption, which there is nothing to wait for.
            FromWorker::Heartbeat
            | FromWorker::ProfileFile { .. }
            | FromWorker::ProfileDone { .. }
            | FromWorker::Raw(_)
            | FromWorker::WorkerHello { .. }
            | FromWorker::Bye
            | FromWorker::DeviceMemory { .. }
            | FromWorker::PreemptSave { .. } => {}
        }
    }

    /// Two ranks' programs parted: the attempt fails, naming both.
    pub(super) fn parted(&mut self, now: Instant, parted: crate::programs::Parted) {
        let cause = Cause::ProgramsParted {
            call: parted.call,
            other: parted.other,
            detail: parted.detail,
        };
        self.fail(now, parted.rank, cause);
    }

    /// Tells every worker that preemption saves of steps up to `step` will
    /// not commit: one waiting on such a step goes on to save a later one.
    fn release_preempt_waiters(&mut self, step: u64) {
        let conns: Vec<Conn> = self.ranks.iter().filter_map(|r| r.conn).collect();
        for conn in conns {
            self.send(conn, ToWorker::Resume { step });
        }
    }
}

/// Whether `exit` is one meshrun's stop makes: SIGTERM, SIGKILL, or an exit
/// code (a program that handles SIGTERM exits by itself).
fn ended_as_meshrun_stops(exit: ExitInfo) -> bool {
    const TERM: i32 = crate::outcome::SIGTERM;
    const KILL: i32 = crate::outcome::SIGKILL;
    match (exit.code, exit.signal) {
        (Some(_), _) => true,
        (None, Some(sig)) => sig == TERM || sig == KILL,
        (None, None) => false,
    }
}
