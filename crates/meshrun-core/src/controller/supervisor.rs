//! The supervisor: one attempt of a run, from agents joining to the last
//! worker's exit. It reacts to events in one place, so every decision
//! (launch, fail, stop, finish) is made in order and recorded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::agents::{self, Agents};
use super::checkpoints::Checkpoints;
use super::launch::{host_launches, FUNCTION_FILE};
use super::output::Output;
use super::server::{bind_loopback, spawn_accept_loop, Event};
use super::summary::{render, Cause, FailureRecord, RankEnd};
use super::{ExecOptions, Outcome, OutcomeStatus, StopHandle, STOP_GRACE_MS};
use crate::error::CoreError;
use crate::plan::RunPlan;
use crate::protocol::{ExitInfo, Message, PROTOCOL_VERSION};
use crate::rundir::{unix_time, utc_rfc3339, RunDir};
use crate::token::Token;
use crate::worker_env::AttemptInfo;

/// Every agent must have connected by then.
const AGENT_JOIN_TIMEOUT: Duration = Duration::from_mins(1);

/// After a stop is sent, how long to wait for exits that an agent should
/// report before treating the remaining workers as lost.
const STOP_REPORT_SLACK: Duration = Duration::from_secs(5);

struct AgentLink {
    ip: String,
    gpus: Vec<String>,
    free_port: u16,
    tx: mpsc::UnboundedSender<Message>,
}

#[derive(Default, Clone)]
struct RankState {
    pid: Option<u32>,
    exit: Option<ExitInfo>,
    done: bool,
    stopped_by_meshrun: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Failure,
    Signal(i32),
}

struct Supervisor {
    plan: RunPlan,
    rundir: RunDir,
    token: Token,
    run_id: String,
    attempt: u32,
    control_addr: String,
    agents: BTreeMap<u32, AgentLink>,
    ranks: Vec<RankState>,
    output: Option<Output>,
    failure: Option<FailureRecord>,
    stop: Option<StopReason>,
    stop_deadline: Option<Instant>,
    last_metrics: Option<Value>,
    launched: bool,
    checkpoints: Checkpoints,
}

/// SIGINT and SIGTERM, when this run handles them. Installed before
/// anything is started, so no signal can arrive while nobody listens.
struct Signals {
    sigint: Option<tokio::signal::unix::Signal>,
    sigterm: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install(enabled: bool) -> Self {
        let listen = |kind| if enabled { signal(kind).ok() } else { None };
        Self {
            sigint: listen(SignalKind::interrupt()),
            sigterm: listen(SignalKind::terminate()),
        }
    }
}

pub async fn supervise(plan: RunPlan, opts: ExecOptions) -> Result<Outcome, CoreError> {
    let mut signals = Signals::install(opts.handle_signals);
    let mut rundir = RunDir::open(&plan.run_dir, &plan.name)?;
    let token = Token::generate()?;
    rundir.write_token(&token)?;
    if let Some(payload) = &opts.payload {
        let path = plan.run_dir.join(FUNCTION_FILE);
        std::fs::write(&path, payload).map_err(CoreError::io("cannot write", &path))?;
    }
    let previous = rundir.read_json("run.json");
    let run_id = previous
        .as_ref()
        .and_then(|p| p["run_id"].as_str().map(str::to_string))
        .unwrap_or_else(new_run_id);
    let mut attempts: Vec<Value> = previous
        .as_ref()
        .and_then(|p| p["attempts"].as_array().cloned())
        .unwrap_or_default();
    let attempt = attempts.len() as u32 + 1;
    let created = previous
        .as_ref()
        .and_then(|p| p["created"].as_str().map(str::to_string))
        .unwrap_or_else(|| utc_rfc3339(SystemTime::now()));

    let (listener, addr) = bind_loopback().await.map_err(|source| CoreError::Net {
        what: "cannot bind the control port on 127.0.0.1",
        source,
    })?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    spawn_accept_loop(listener, token.clone(), events_tx);

    let started = utc_rfc3339(SystemTime::now());
    attempts.push(json!({ "attempt": attempt, "started": started, "state": "running" }));
    let run_json = |state: &str, attempts: &[Value]| {
        json!({
            "name": plan.name,
            "run_id": run_id,
            "state": state,
            "created": created,
            "plan": plan,
            "control": { "bind": addr.to_string(), "loopback_only": addr.ip().is_loopback() },
            "versions": { "meshrun": env!("CARGO_PKG_VERSION"), "protocol": PROTOCOL_VERSION },
            "attempts": attempts,
        })
    };
    rundir.write_json("run.json", &run_json("running", &attempts))?;
    rundir.event(
        "attempt_started",
        json!({ "attempt": attempt, "nprocs": plan.nprocs, "hosts": plan.hosts, "control_addr": addr.to_string() }),
    )?;

    let (checkpoints, removed) =
        match Checkpoints::open(&plan.run_dir, plan.nprocs, plan.retention.clone()) {
            Ok(found) => found,
            Err(e) => {
                let e = CoreError::Checkpoint(e);
                return Err(errored(&mut rundir, &run_json, &mut attempts, e));
            }
        };
    for path in removed {
        rundir.event(
            "checkpoint_discarded",
            json!({ "path": path.display().to_string(), "reason": "not committed" }),
        )?;
    }
    let mut agent_procs = match agents::start(&plan, addr, &token) {
        Ok(agents) => agents,
        Err(e) => return Err(errored(&mut rundir, &run_json, &mut attempts, e)),
    };
    let mut sup = Supervisor {
        ranks: vec![RankState::default(); plan.nprocs as usize],
        plan: plan.clone(),
        rundir,
        token,
        run_id: run_id.clone(),
        attempt,
        control_addr: addr.to_string(),
        agents: BTreeMap::new(),
        output: None,
        failure: None,
        stop: None,
        stop_deadline: None,
        last_metrics: None,
        launched: false,
        checkpoints,
    };
    let result = sup
        .run(&mut events, &mut agent_procs, &opts, &mut signals)
        .await;
    for link in sup.agents.values() {
        let _ = link.tx.send(Message::Shutdown);
    }
    agent_procs.finish().await;
    if let Err(e) = result {
        return Err(errored(&mut sup.rundir, &run_json, &mut attempts, e));
    }

    let status = sup.status();
    let state = match status {
        OutcomeStatus::Succeeded => "succeeded",
        OutcomeStatus::Failed => "failed",
        OutcomeStatus::Interrupted { .. } => "interrupted",
    };
    if let Some(f) = &mut sup.failure {
        f.exit = sup.ranks.get(f.rank as usize).and_then(|r| r.exit);
    }
    let summary = sup.summary(status);
    if let Some(last) = attempts.last_mut() {
        *last = json!({
            "attempt": attempt,
            "started": started,
            "ended": utc_rfc3339(SystemTime::now()),
            "state": state,
            "failure": sup.failure,
        });
    }
    sup.rundir
        .write_json("run.json", &run_json(state, &attempts))?;
    sup.rundir
        .event("run_ended", json!({ "attempt": attempt, "state": state }))?;
    sup.rundir.flush()?;
    Ok(Outcome {
        status,
        name: plan.name.clone(),
        run_dir: plan.run_dir.clone(),
        failure: sup.failure.clone(),
        summary,
        last_metrics: sup.last_metrics.take(),
    })
}

/// Records that the attempt ended in an engine error (not a worker's
/// failure), so `run.json` never claims a dead run is running; returns the
/// error for the caller.
fn errored(
    rundir: &mut RunDir,
    run_json: &dyn Fn(&str, &[Value]) -> Value,
    attempts: &mut [Value],
    error: CoreError,
) -> CoreError {
    if let Some(last) = attempts.last_mut() {
        last["state"] = json!("errored");
        last["error"] = json!(error.to_string());
        last["ended"] = json!(utc_rfc3339(SystemTime::now()));
    }
    let _ = rundir.write_json("run.json", &run_json("errored", attempts));
    let _ = rundir.event(
        "run_ended",
        json!({ "state": "errored", "error": error.to_string() }),
    );
    error
}

fn new_run_id() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap_or_default();
    hex::encode(bytes)
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

impl Supervisor {
    async fn run(
        &mut self,
        events: &mut mpsc::UnboundedReceiver<Event>,
        agent_procs: &mut Agents,
        opts: &ExecOptions,
        signals: &mut Signals,
    ) -> Result<(), CoreError> {
        let Signals { sigint, sigterm } = signals;
        let mut external_stop_seen = false;
        let join_deadline = Instant::now() + AGENT_JOIN_TIMEOUT;
        let mut agent_check = tokio::time::interval(Duration::from_millis(200));
        loop {
            if self.finished() {
                return Ok(());
            }
            let deadline = self.stop_deadline.unwrap_or(if self.launched {
                Instant::now() + Duration::from_hours(1)
            } else {
                join_deadline
            });
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => self.on_event(event)?,
                    None => return Ok(()),
                },
                () = next_signal(sigint) => self.interrupt(Signal::SIGINT as i32),
                () = next_signal(sigterm) => self.interrupt(Signal::SIGTERM as i32),
                () = stop_requested(opts.stop.as_ref()), if !external_stop_seen => {
                    external_stop_seen = true;
                    self.interrupt(Signal::SIGINT as i32);
                }
                _ = agent_check.tick(), if !self.launched => {
                    if let Some((host, how)) = agent_procs.exited() {
                        return Err(CoreError::AgentGone { host, what: format!("exited ({how})") });
                    }
                }
                () = tokio::time::sleep_until(deadline.into()) => {
                    if !self.launched && self.stop.is_none() {
                        let host = (0..self.plan.hosts).find(|h| !self.agents.contains_key(h)).unwrap_or(0);
                        return Err(CoreError::AgentTimeout { host, secs: AGENT_JOIN_TIMEOUT.as_secs() });
                    }
                    // Exits that never came: the workers are treated as lost.
                    for r in &mut self.ranks {
                        r.done = true;
                    }
                }
            }
        }
    }

    fn finished(&self) -> bool {
        if !self.launched {
            return self.stop.is_some();
        }
        self.ranks.iter().all(|r| r.done)
    }

    fn on_event(&mut self, event: Event) -> Result<(), CoreError> {
        match event {
            Event::AgentJoined {
                host,
                host_ip,
                pid,
                gpus,
                free_port,
                tx,
            } => {
                if host >= self.plan.hosts || self.agents.contains_key(&host) || self.launched {
                    tracing::warn!(host, "unexpected agent ignored");
                    return Ok(());
                }
                self.rundir.event(
                    "agent_joined",
                    json!({ "host": host, "ip": host_ip, "pid": pid, "gpus": gpus }),
                )?;
                self.agents.insert(
                    host,
                    AgentLink {
                        ip: host_ip,
                        gpus,
                        free_port,
                        tx,
                    },
                );
                if self.agents.len() == self.plan.hosts as usize && self.stop.is_none() {
                    self.launch()?;
                }
            }
            Event::FromAgent { host, msg } => self.on_agent_message(host, msg)?,
            Event::AgentLost { host, error } => {
                if !self.launched {
                    if self.stop.is_none() {
                        return Err(CoreError::AgentGone {
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
                    self.ranks[rank as usize].done = true;
                }
                if let Some(&rank) = lost.first() {
                    self.fail(rank, Cause::AgentLost { host, error })?;
                }
            }
            Event::WorkerJoined { rank, attempt, pid } => {
                if attempt == self.attempt {
                    tracing::debug!(rank, pid, "worker connected");
                }
            }
            Event::FromWorker { rank, msg } => self.on_worker_message(rank, msg)?,
            Event::WorkerLost { rank, clean } => {
                tracing::debug!(rank, clean, "worker connection closed");
            }
        }
        Ok(())
    }

    fn on_agent_message(&mut self, host: u32, msg: Message) -> Result<(), CoreError> {
        let pph = self.plan.procs_per_host;
        let owns = |rank: u32| rank / pph == host && (rank as usize) < self.ranks.len();
        match msg {
            Message::Log { rank, stream, line } if owns(rank) => {
                if let Some(out) = &mut self.output {
                    out.line(rank, stream, &line);
                }
            }
            Message::WorkerStarted { rank, pid } if owns(rank) => {
                self.ranks[rank as usize].pid = Some(pid);
                self.rundir.event(
                    "worker_started",
                    json!({ "attempt": self.attempt, "rank": rank, "host": host, "pid": pid }),
                )?;
            }
            Message::SpawnFailed { rank, error } if owns(rank) => {
                self.ranks[rank as usize].done = true;
                self.fail(rank, Cause::SpawnFailed { error })?;
            }
            Message::WorkerExited { rank, exit } if owns(rank) => {
                let state = &mut self.ranks[rank as usize];
                state.exit = Some(exit);
                state.done = true;
                let stopped = state.stopped_by_meshrun;
                if let Some(out) = &mut self.output {
                    out.note(rank, &format!("rank {rank} ended with {exit}"));
                }
                self.rundir.event(
                    "worker_exited",
                    json!({ "attempt": self.attempt, "rank": rank, "exit": exit, "stopped_by_meshrun": stopped }),
                )?;
                if !exit.success() && !stopped {
                    self.fail(rank, Cause::Exit { exit })?;
                }
            }
            other => tracing::debug!(host, "ignored agent message {other:?}"),
        }
        Ok(())
    }

    fn on_worker_message(&mut self, rank: u32, msg: Message) -> Result<(), CoreError> {
        if rank as usize >= self.ranks.len() {
            return Ok(());
        }
        match msg {
            Message::Report { step, metrics } if rank == 0 => {
                self.rundir.metrics(&json!({
                    "time": unix_time(),
                    "attempt": self.attempt,
                    "step": step,
                    "metrics": metrics,
                }))?;
                self.last_metrics = Some(metrics);
            }
            Message::CheckpointWritten {
                step,
                leaves,
                extra,
            } => match self.checkpoints.written(rank, step, leaves, extra) {
                Ok(Some(path)) => {
                    self.rundir.event(
                        "checkpoint_committed",
                        json!({ "attempt": self.attempt, "step": step, "path": path.display().to_string() }),
                    )?;
                    match self.checkpoints.retain() {
                        Ok(deleted) if deleted.is_empty() => {}
                        Ok(deleted) => self.rundir.event(
                            "checkpoints_deleted",
                            json!({ "steps": deleted, "reason": "retention" }),
                        )?,
                        Err(e) => self
                            .rundir
                            .event("retention_failed", json!({ "error": e.to_string() }))?,
                    }
                }
                Ok(None) => {}
                Err(e) => self.rundir.event(
                    "checkpoint_failed",
                    json!({ "attempt": self.attempt, "step": step, "error": e.to_string() }),
                )?,
            },
            Message::Failure {
                kind,
                message,
                traceback,
            } => self.fail(
                rank,
                Cause::Exception {
                    exception: kind,
                    message,
                    traceback,
                },
            )?,
            _ => {}
        }
        Ok(())
    }

    /// Sends every agent its workers. Ranks are laid out host by host and
    /// the JAX coordinator lives on host 0, at the port its agent found free.
    fn launch(&mut self) -> Result<(), CoreError> {
        let host0 = &self.agents[&0];
        let coordinator = format!("{}:{}", host0.ip, host0.free_port);
        let user_xla_flags = std::env::var("XLA_FLAGS").ok();
        let token_hex = self.token.to_hex();
        let info = AttemptInfo {
            run_id: &self.run_id,
            attempt: self.attempt,
            control_addr: &self.control_addr,
            token_hex: &token_hex,
            coordinator: &coordinator,
            user_xla_flags: user_xla_flags.as_deref(),
        };
        let mut plans = Vec::new();
        for (&host, link) in &self.agents {
            match host_launches(&self.plan, &info, host, &link.gpus) {
                Ok(workers) => plans.push((host, workers)),
                Err(e) => {
                    self.launched = true;
                    for r in &mut self.ranks {
                        r.done = true;
                    }
                    return self.fail(
                        host * self.plan.procs_per_host,
                        Cause::SpawnFailed {
                            error: e.to_string(),
                        },
                    );
                }
            }
        }
        let paths: Vec<_> = (0..self.plan.nprocs)
            .map(|r| self.rundir.log_path(r))
            .collect();
        self.output = Some(Output::open(
            self.plan.tee,
            &paths,
            self.attempt,
            &utc_rfc3339(SystemTime::now()),
        )?);
        self.rundir.event(
            "launched",
            json!({ "attempt": self.attempt, "coordinator": coordinator }),
        )?;
        for (host, workers) in plans {
            let _ = self.agents[&host].tx.send(Message::Launch {
                attempt: self.attempt,
                workers,
            });
        }
        self.launched = true;
        Ok(())
    }

    /// Records the first failure of the attempt and stops the group. A later
    /// exception report from the same rank adds its traceback.
    fn fail(&mut self, rank: u32, cause: Cause) -> Result<(), CoreError> {
        match &mut self.failure {
            Some(first) => {
                if first.rank == rank
                    && matches!(first.cause, Cause::Exit { .. })
                    && matches!(cause, Cause::Exception { .. })
                {
                    first.cause = cause;
                }
                return Ok(());
            }
            None if self.stop.is_some() => return Ok(()),
            None => {}
        }
        let record = FailureRecord {
            rank,
            host: rank / self.plan.procs_per_host,
            attempt: self.attempt,
            cause,
            exit: None,
        };
        self.rundir.event("worker_failed", json!(record))?;
        self.failure = Some(record);
        self.begin_stop(StopReason::Failure)
    }

    fn interrupt(&mut self, signal: i32) {
        if self.stop.is_some() {
            // Asked again while stopping: no more grace.
            for link in self.agents.values() {
                let _ = link.tx.send(Message::Stop { grace_ms: 0 });
            }
            return;
        }
        let _ = self.begin_stop(StopReason::Signal(signal));
    }

    fn begin_stop(&mut self, reason: StopReason) -> Result<(), CoreError> {
        self.stop = Some(reason);
        for r in self.ranks.iter_mut().filter(|r| !r.done) {
            r.stopped_by_meshrun = true;
        }
        for link in self.agents.values() {
            let _ = link.tx.send(Message::Stop {
                grace_ms: STOP_GRACE_MS,
            });
        }
        self.stop_deadline =
            Some(Instant::now() + Duration::from_millis(STOP_GRACE_MS) + STOP_REPORT_SLACK);
        let why = match reason {
            StopReason::Failure => "failure".to_string(),
            StopReason::Signal(s) => format!("signal {s}"),
        };
        self.rundir.event(
            "stopping",
            json!({ "attempt": self.attempt, "reason": why }),
        )
    }

    fn status(&self) -> OutcomeStatus {
        match self.stop {
            Some(StopReason::Signal(signal)) => OutcomeStatus::Interrupted { signal },
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

    fn summary(&self, status: OutcomeStatus) -> Option<String> {
        match status {
            OutcomeStatus::Succeeded => None,
            OutcomeStatus::Interrupted { signal } => Some(format!(
                "meshrun: run '{}' interrupted by {}; every worker was stopped. Logs: {}",
                self.plan.name,
                Signal::try_from(signal).map_or("a signal", |s| s.as_str()),
                self.rundir.path().join("logs").display()
            )),
            OutcomeStatus::Failed => {
                let failure = self.failure.as_ref()?;
                let ranks: Vec<RankEnd> = self
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(rank, r)| RankEnd {
                        rank: rank as u32,
                        exit: r.exit,
                        stopped_by_meshrun: r.stopped_by_meshrun,
                    })
                    .collect();
                let tail = self
                    .output
                    .as_ref()
                    .map(|o| o.tail(failure.rank))
                    .unwrap_or_default();
                Some(render(
                    &self.plan.name,
                    failure,
                    &ranks,
                    &tail,
                    &self.rundir.log_path(failure.rank),
                ))
            }
        }
    }
}
