//! The driver of one attempt: it carries out what the [`Machine`] decides
//! and feeds it what the connections, signals and clock say. It decides
//! nothing itself beyond plumbing (which channel a connection number is,
//! whose log a line belongs to).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshrun_protocol::{FromAgent, FromWorker};
use meshrun_record::{Event, MetricsRecord, RunRecord};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::agents::Agents;
use super::checkpoints::{Checkpoints, Done, Settled};
use super::committer::{Committer, Job, Outcome};
use super::memory_use::MemoryUse;
use super::output::Output;
use super::profiles::Captures;
use super::progress::Progress;
use super::save_health::SaveHealth;
use super::server::Event as Net;
use super::StopHandle;
use crate::error::CoreError;
use crate::rundir::{unix_time, utc_rfc3339, RunDir};
use meshrun_machine::stragglers::Stragglers;
use meshrun_machine::{Action, Conn, Input, Machine};
use meshrun_plan::RunPlan;

/// SIGINT and SIGTERM, when this run handles them. Installed before
/// anything is started, so no signal can arrive while nobody listens.
pub struct Signals {
    sigint: Option<tokio::signal::unix::Signal>,
    sigterm: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub fn install(enabled: bool) -> Self {
        let listen = |kind| if enabled { signal(kind).ok() } else { None };
        Self {
            sigint: listen(SignalKind::interrupt()),
            sigterm: listen(SignalKind::terminate()),
        }
    }
}

/// How often buffered metrics are written out and the status line redrawn.
const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// How often, before the launch, the agents' processes are checked.
const AGENT_CHECK_EVERY: Duration = Duration::from_millis(200);

pub struct Driver<'a> {
    pub machine: Machine,
    pub rundir: &'a mut RunDir,
    /// `run.json`, rewritten when an elastic attempt learns its size.
    pub record: &'a mut RunRecord,
    pub checkpoints: Checkpoints,
    pub progress: Progress,
    pub output: Option<Output>,
    pub(super) plan: &'a RunPlan,
    /// The attempt's ranks (fewer than the plan's in an elastic run on
    /// fewer hosts).
    world: u32,
    pub(super) attempt: u32,
    pub(super) conns: HashMap<Conn, mpsc::UnboundedSender<Bytes>>,
    pub(super) stragglers: Stragglers,
    /// Profile captures, kept across the run's attempts.
    pub(super) captures: &'a mut Captures,
    /// Whether checkpoint saves are failing (told once on the terminal).
    saves: SaveHealth,
    /// Commits and retention, run off the loop; their outcomes come back
    /// on `outcomes` (taken by [`Driver::run`] while it runs).
    committer: Committer,
    outcomes: Option<mpsc::UnboundedReceiver<Outcome>>,
    /// Each rank's newest memory figures.
    pub memory: MemoryUse,
}

impl<'a> Driver<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        machine: Machine,
        plan: &'a RunPlan,
        attempt: u32,
        rundir: &'a mut RunDir,
        record: &'a mut RunRecord,
        checkpoints: Checkpoints,
        progress: Progress,
        captures: &'a mut Captures,
    ) -> Result<Self, CoreError> {
        let o = &plan.observe;
        let (committer, outcomes) = Committer::start().map_err(CoreError::io(
            "cannot start the checkpoint committer's thread for",
            &plan.run_dir,
        ))?;
        Ok(Self {
            machine,
            rundir,
            record,
            checkpoints,
            progress,
            output: None,
            world: plan.nprocs,
            plan,
            attempt,
            conns: HashMap::new(),
            stragglers: Stragglers::new(plan.nprocs, o.straggler_threshold, o.straggler_steps),
            captures,
            saves: SaveHealth::default(),
            committer,
            outcomes: Some(outcomes),
            memory: MemoryUse::default(),
        })
    }

    /// Runs the attempt until every worker has ended and every commit
    /// asked for has been answered (or an engine error).
    pub async fn run(
        &mut self,
        events: &mut mpsc::Receiver<Net>,
        agent_procs: &mut Agents,
        stop: Option<&StopHandle>,
        signals: &mut Signals,
    ) -> Result<(), CoreError> {
        let mut outcomes = self.outcomes.take().expect("run once");
        let result = self
            .run_loop(events, &mut outcomes, agent_procs, stop, signals)
            .await;
        self.outcomes = Some(outcomes);
        result
    }

    /// Waits for the commits still under way (after [`Driver::run`], also
    /// when it ended in an error) and tells the machine what became of
    /// them; then stops the committer's thread, so nothing of this attempt
    /// writes into the checkpoints folder once the next attempt opens it.
    pub async fn finish_commits(&mut self) -> Result<(), CoreError> {
        let mut result = Ok(());
        if let Some(mut outcomes) = self.outcomes.take() {
            while !self.committer.idle() {
                let Some(outcome) = outcomes.recv().await else {
                    break;
                };
                self.committer.answered();
                // An error here (the runs folder failing) is said once the
                // rest have been waited for.
                let told = self.outcome(outcome).and_then(|()| self.perform());
                result = result.and(told);
            }
        }
        self.committer.close();
        result
    }

    async fn run_loop(
        &mut self,
        events: &mut mpsc::Receiver<Net>,
        outcomes: &mut mpsc::UnboundedReceiver<Outcome>,
        agent_procs: &mut Agents,
        stop: Option<&StopHandle>,
        signals: &mut Signals,
    ) -> Result<(), CoreError> {
        let Signals { sigint, sigterm } = signals;
        let mut external_stop_seen = false;
        let mut agent_check = tokio::time::interval(AGENT_CHECK_EVERY);
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        loop {
            self.perform()?;
            if self.machine.is_finished(Instant::now()) && self.committer.idle() {
                return Ok(());
            }
            let wake = self.machine.poll_timeout();
            // Far enough to never fire, near enough for any timer.
            let wake = wake.unwrap_or_else(|| Instant::now() + Duration::from_hours(1));
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => {
                        self.feed(event)?;
                        self.feed_queued(events)?;
                    }
                    None => return Ok(()),
                },
                outcome = outcomes.recv(), if !self.committer.idle() => match outcome {
                    Some(outcome) => {
                        self.committer.answered();
                        self.outcome(outcome)?;
                    }
                    // Its thread is gone with commits unanswered (it
                    // panicked): waiting on would never end.
                    None => {
                        return Err(CoreError::io("the checkpoint committer's thread ended with commits unanswered in", &self.plan.run_dir)(
                            std::io::Error::other("the thread panicked"),
                        ))
                    }
                },
                what = agent_procs.waiting() => self.input(Input::ResourcesWaiting { what })?,
                () = next_signal(sigint) => self.input(Input::Interrupt { signal: Signal::SIGINT as i32 })?,
                () = next_signal(sigterm) => self.input(Input::Terminate)?,
                () = stop_requested(stop), if !external_stop_seen => {
                    external_stop_seen = true;
                    self.input(Input::Interrupt { signal: Signal::SIGINT as i32 })?;
                }
                _ = agent_check.tick(), if !self.machine.launched() => {
                    if let Some(why) = agent_procs.ray_error() {
                        return Err(CoreError::RayPlacement(why));
                    }
                    if let Some((host, how)) = agent_procs.exited() {
                        return Err(meshrun_machine::AttemptError::AgentGone { host, what: how }.into());
                    }
                }
                _ = flush.tick() => {
                    // Metrics are buffered between ticks, so readers see them live.
                    if self.machine.launched() {
                        self.rundir.flush()?;
                    }
                    self.progress.tick();
                }
                () = tokio::time::sleep_until(wake.into()) => {
                    // What has arrived is read before any deadline is
                    // judged: a heartbeat in the queue is not missing.
                    self.feed_queued(events)?;
                    self.perform()?;
                    self.machine.handle_timeout(Instant::now())?;
                }
            }
        }
    }

    fn input(&mut self, input: Input) -> Result<(), CoreError> {
        Ok(self.machine.handle(Instant::now(), input)?)
    }

    /// What is already queued, without waiting: at most a queue's worth,
    /// so that connections refilling it as fast as it drains cannot hold
    /// off the deadlines and the actions.
    fn feed_queued(&mut self, events: &mut mpsc::Receiver<Net>) -> Result<(), CoreError> {
        if events.capacity() == 0 {
            // Full: connections wait to put their messages in, heartbeats
            // among them, in socket buffers. A silence is not judged while
            // the controller itself is what is behind.
            self.machine.backlogged(Instant::now());
        }
        for _ in 0..events.max_capacity() {
            let Ok(event) = events.try_recv() else {
                break;
            };
            self.feed(event)?;
        }
        Ok(())
    }

    fn register(&mut self, conn: Conn, tx: mpsc::UnboundedSender<Bytes>) -> Conn {
        self.conns.insert(conn, tx);
        conn
    }

    fn feed(&mut self, event: Net) -> Result<(), CoreError> {
        let input = match event {
            Net::AgentJoined {
                conn,
                host,
                host_ip,
                pid,
                gpus,
                free_port,
                controller,
                replica_port,
                tx,
            } => Input::AgentJoined {
                host,
                ip: host_ip,
                pid,
                gpus,
                free_port,
                controller,
                replica_port,
                conn: self.register(conn, tx),
            },
            Net::FromAgent {
                conn,
                msg:
                    FromAgent::Log {
                        rank,
                        stream,
                        line,
                        more,
                    },
            } => {
                // An agent writes only its own ranks' logs. A line is a
                // sign of life like its heartbeat, which may be queued
                // behind its lines.
                let pph = self.plan.procs_per_host;
                let host = self.machine.agent_heard(conn, Instant::now());
                if host == Some(rank / pph) && rank < self.world {
                    if let Some(out) = &mut self.output {
                        out.line(rank, stream, &line, more);
                    }
                    self.progress.output_line();
                }
                return Ok(());
            }
            Net::FromAgent {
                conn,
                msg: FromAgent::StepTimes { times },
            } => {
                // An agent speaks for its own ranks only.
                let pph = self.plan.procs_per_host;
                let Some(host) = self.machine.agent_heard(conn, Instant::now()) else {
                    return Ok(());
                };
                let own = times.into_iter().filter(|t| t.0 / pph == host).collect();
                return self.step_times(own);
            }
            Net::FromAgent {
                conn,
                msg: FromAgent::WorkerMemory { ranks },
            } => {
                let Some(host) = self.machine.agent_heard(conn, Instant::now()) else {
                    return Ok(());
                };
                return self.worker_memory(host, ranks);
            }
            Net::FromAgent { conn, msg } => {
                self.memory_news(&msg)?;
                Input::FromAgent { conn, msg }
            }
            Net::AgentLost { conn, error } => Input::AgentLost { conn, error },
            Net::WorkerJoined {
                conn,
                rank,
                attempt,
                pid,
                tx,
            } => {
                let conn = self.register(conn, tx);
                self.input(Input::WorkerJoined {
                    rank,
                    attempt,
                    pid,
                    conn,
                })?;
                if self.machine.worker_conn(rank) == Some(conn) {
                    self.worker_joined(conn)?;
                }
                return Ok(());
            }
            Net::FromWorker {
                rank,
                msg: FromWorker::DeviceMemory { current, peak },
            } => {
                self.device_memory(rank, current, peak)?;
                // A sign of life too.
                Input::FromWorker {
                    rank,
                    msg: FromWorker::Heartbeat,
                }
            }
            Net::FromWorker { rank, msg } => {
                if let FromWorker::SaveFailed { step, error } = &msg {
                    self.save_failed(*step, &format!("rank {rank}: {error}"));
                }
                if self.profile_message(rank, &msg)? {
                    // Its trace is a sign of life too.
                    Input::FromWorker {
                        rank,
                        msg: FromWorker::Heartbeat,
                    }
                } else {
                    Input::FromWorker { rank, msg }
                }
            }
            Net::WorkerLost { rank, clean } => Input::WorkerLost { rank, clean },
            Net::StopRequested { conn, now, tx } => Input::StopRequested {
                now,
                reply: self.register(conn, tx),
            },
            Net::ProfileRequested {
                conn,
                ranks,
                steps,
                tx,
            } => return self.profile_requested(conn, ranks, steps, tx),
            // Recorded as it is: the connection is already closed, and what
            // that means for a worker or an agent comes as its loss next.
            Net::FrameRejected { peer, reason } => {
                tracing::warn!(%peer, "rejected a control frame: {reason}");
                return self.rundir.event(Event::FrameRejected {
                    attempt: self.attempt,
                    peer: peer.to_string(),
                    reason,
                });
            }
        };
        self.input(input)
    }

    /// Carries out every action the machine has queued, in order.
    pub fn perform(&mut self) -> Result<(), CoreError> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Send { to, msg } => {
                    if let Some(tx) = self.conns.get(&to) {
                        let _ = tx.send(msg.encode());
                    }
                }
                Action::Close { conn } => {
                    self.conns.remove(&conn);
                }
                Action::Record(event) => self.rundir.event(event)?,
                Action::Sized { hosts, nprocs } => {
                    // `meshrun status` shows the count while the attempt runs.
                    if let Some(last) = self.record.attempts.last_mut() {
                        last.hosts = Some(hosts);
                    }
                    self.rundir.write_run(self.record)?;
                    self.world = nprocs;
                    let o = &self.plan.observe;
                    self.stragglers =
                        Stragglers::new(nprocs, o.straggler_threshold, o.straggler_steps);
                    self.checkpoints.set_world(nprocs);
                }
                Action::Announce { text } => super::terminal::terminal().note(&text),
                Action::OpenLogs => self.open_logs()?,
                Action::Metrics { step, metrics } => self.rundir.metrics(&MetricsRecord {
                    time: unix_time(),
                    attempt: self.attempt,
                    step,
                    metrics,
                })?,
                Action::Note { rank, text } => {
                    if let Some(out) = &mut self.output {
                        out.note(rank, &text);
                    }
                }
                Action::Progress {
                    step,
                    metrics,
                    total_steps,
                } => self.progress.report(step, &metrics, total_steps),
                Action::Saving { step } => self.progress.saving(step),
                Action::Waiting { what } => self.progress.waiting(what),
                Action::Commit {
                    rank,
                    step,
                    part,
                    extra,
                } => {
                    let settled = self.checkpoints.written(rank, step, part, extra);
                    self.settle(settled)?;
                }
                Action::Reported {
                    rank,
                    step,
                    passed,
                    saving,
                } => {
                    let settled = self.checkpoints.reported(rank, step, passed, saving);
                    self.settle(settled)?;
                }
                Action::Abandon { step } => self.checkpoints.abandon(step),
                Action::WriteStacks { rank, text } => {
                    let dir = meshrun_record::names::stacks_dir(&self.plan.run_dir, self.attempt);
                    let path = meshrun_record::names::stack_file(&dir, rank);
                    std::fs::create_dir_all(&dir)
                        .and_then(|()| std::fs::write(&path, text))
                        .map_err(CoreError::io("cannot write", &path))?;
                }
                Action::WriteCalls { text } => {
                    let dir = meshrun_record::names::stacks_dir(&self.plan.run_dir, self.attempt);
                    let path = meshrun_record::names::calls_file(&dir);
                    std::fs::create_dir_all(&dir)
                        .and_then(|()| std::fs::write(&path, text))
                        .map_err(CoreError::io("cannot write", &path))?;
                }
                Action::ApplyRetention => {
                    if let Some(job) = self.checkpoints.retain_job() {
                        self.committer.submit(Job::Retain(job));
                    }
                }
            }
        }
        Ok(())
    }

    /// Hands the steps a part or report completed to the committer; tells
    /// the machine at once of those refused.
    fn settle(&mut self, settled: Vec<Settled>) -> Result<(), CoreError> {
        for s in settled {
            match s {
                Settled::Commit(job) => self.committer.submit(Job::Commit(job)),
                Settled::Refused { step, rank, error } => {
                    self.input(Input::CommitRefused { step, rank, error })?;
                }
            }
        }
        Ok(())
    }

    /// What the committer's thread did.
    fn outcome(&mut self, outcome: Outcome) -> Result<(), CoreError> {
        match outcome {
            Outcome::Commit(done) => self.settled(done),
            Outcome::Retained(Ok(steps)) if steps.is_empty() => Ok(()),
            Outcome::Retained(Ok(steps)) => self.rundir.event(Event::CheckpointsDeleted {
                steps,
                reason: "retention".into(),
            }),
            Outcome::Retained(Err(e)) => self.rundir.event(Event::RetentionFailed {
                error: e.to_string(),
            }),
        }
    }

    /// Tells the machine what became of a step the committer committed.
    fn settled(&mut self, done: Done) -> Result<(), CoreError> {
        let input = match done {
            Done::Committed { step, path } => {
                if let Some(line) = self.saves.committed(step) {
                    self.progress.note(&line);
                }
                self.progress.saves_work();
                Input::Committed {
                    step,
                    path: path.to_string(),
                }
            }
            Done::Failed { step, error } => {
                let error = error.to_string();
                self.save_failed(step, &error);
                Input::CommitFailed { step, error }
            }
        };
        self.input(input)
    }

    /// A save that failed without failing the attempt (a rank's, under
    /// `--on-save-error continue`, or the commit's): the first of an
    /// outage is told on the terminal, the rest only in the events.
    fn save_failed(&mut self, step: u64, error: &str) {
        if let Some(line) = self.saves.failed(step, error) {
            self.progress.note(&line);
        }
        if let Some(since) = self.saves.failing_since() {
            self.progress.save_failed(step, since);
        }
    }

    fn open_logs(&mut self) -> Result<(), CoreError> {
        let paths: Vec<_> = (0..self.world).map(|r| self.rundir.log_path(r)).collect();
        let mut output = Output::open(
            self.plan.tee,
            &paths,
            self.attempt,
            &utc_rfc3339(std::time::SystemTime::now()),
        )?;
        output.set_bar(self.progress.bar());
        self.output = Some(output);
        Ok(())
    }
}

/// Resolves on the next delivery of `kind`, or never when not handling signals.
async fn next_signal(sig: &mut Option<tokio::signal::unix::Signal>) {
    match sig {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

async fn stop_requested(handle: Option<&StopHandle>) {
    match handle {
        Some(h) => h.wait().await,
        None => std::future::pending().await,
    }
}
