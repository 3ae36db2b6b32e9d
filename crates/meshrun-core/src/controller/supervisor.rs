//! The supervisor: one attempt of a run, from agents joining to the last
//! worker's exit. It reacts to events in one place, so every decision
//! (launch, fail, stop, finish) is made in order and recorded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::agents::{self, Agents};
use super::checkpoints::Checkpoints;
use super::goodput::{self, AttemptParts, Ledger, Parts, Timing, GOODPUT_FILE};
use super::launch::{host_launches, FUNCTION_FILE};
use super::output::Output;
use super::progress::Progress;
use super::server::{bind, spawn_accept_loop, Event};
use super::stacks;
use super::summary::{render, render_attempts, Cause, EarlyFinish, FailureRecord, RankEnd};
use super::tensorboard::TensorBoard;
use super::terminal::terminal;
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
    /// How this host reaches the controller (given to its workers).
    controller: Option<String>,
    tx: mpsc::UnboundedSender<Message>,
}

#[derive(Default, Clone)]
struct RankState {
    pid: Option<u32>,
    exit: Option<ExitInfo>,
    done: bool,
    stopped_by_meshrun: bool,
    /// The worker's connection, for requests (a checkpoint on preemption).
    tx: Option<mpsc::UnboundedSender<Message>>,
    /// Its last report (or its start): what hang detection measures.
    progress: Option<Instant>,
    last_step: Option<u64>,
    /// Its last message of any kind; heartbeats come every second.
    heard: Option<Instant>,
    /// When its connection broke without a goodbye.
    connection_lost: Option<Instant>,
    /// Its latest goodput figures, and those sent with each save not yet
    /// superseded by a newer commit.
    timing: Option<Timing>,
    saved_timings: BTreeMap<u64, Timing>,
    /// How many reports it sent (recorded in `run.json`).
    reports: u64,
    /// When its program finished (its goodbye came, or it exited 0), and
    /// its last step then: the others must follow it soon (see
    /// `FailurePolicy::finish_timeout_s`).
    finished: Option<(Instant, Option<u64>)>,
    /// It had finished before the attempt failed: the summary says so.
    finished_before_failure: bool,
}

impl RankState {
    /// Everything the worker sent has been read: its exit (reported by the
    /// agent over another connection) can overtake its last reports, so a
    /// rank only counts as finished once its own connection has ended, or
    /// has been quiet for [`DRAIN_QUIET`] (a process it left behind may
    /// hold the socket open).
    fn drained(&self) -> bool {
        self.tx.is_none() || self.heard.is_none_or(|h| h.elapsed() >= DRAIN_QUIET)
    }

    /// Gives up on a worker that can no longer be stopped or heard from in
    /// order (its agent is gone, or its exit never came). Dropping the
    /// connection's sender closes it, so a worker still alive sees its
    /// controller go and kills itself; and an orphan that keeps sending
    /// heartbeats cannot hold the attempt open.
    fn abandon(&mut self) {
        self.done = true;
        self.tx = None;
    }

    /// Its program finished; `failed` when the attempt had already failed.
    fn finish(&mut self, failed: bool) {
        if self.finished.is_none() {
            self.finished = Some((Instant::now(), self.last_step));
            self.finished_before_failure = !failed;
        }
    }
}

/// See [`RankState::drained`].
const DRAIN_QUIET: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Failure,
    Signal(i32),
    /// Stopped after the checkpoint asked for on SIGTERM was committed.
    Preempted(u64),
}

/// A worker that has sent nothing (heartbeats included) for this long is
/// frozen: heartbeats come from a Rust thread every second, whatever the
/// Python code is doing.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// A broken worker connection whose process has not been reported as
/// exited after this long is a failure of its own.
const CONNECTION_LOSS_GRACE: Duration = Duration::from_secs(2);

/// After SIGTERM, how long workers get to reach a step boundary and commit
/// a checkpoint before they are stopped without one.
const PREEMPT_GRACE: Duration = Duration::from_mins(1);

/// How long a stack dump delays the stop (the agent waits as long).
const STACK_DUMP_WAIT: Duration = Duration::from_millis(100);

/// How long the end of a run waits for the terminal to take what is queued.
const TERMINAL_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// SIGTERM to SIGKILL when the attempt failed: none (see `begin_stop`).
const FAILURE_STOP_GRACE_MS: u64 = 0;

struct Supervisor<'a> {
    plan: RunPlan,
    rundir: &'a mut RunDir,
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
    /// A report of this attempt came with the state to checkpoint, so
    /// SIGTERM can end in a checkpoint.
    checkpointing: bool,
    /// When SIGTERM asked for a checkpoint, the deadline for committing it.
    preempt_deadline: Option<Instant>,
    stacks_dumped: bool,
    /// The newest step committed in this attempt.
    last_committed: Option<u64>,
    progress: Progress,
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

/// What one attempt left for the run to decide on.
struct AttemptEnd {
    status: OutcomeStatus,
    failure: Option<FailureRecord>,
    summary: Option<String>,
    last_metrics: Option<Value>,
}

/// The run across its attempts: a failed attempt is followed by a new one
/// (fresh control port, agents and workers, restoring the newest committed
/// checkpoint) while `max_failures` allows.
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
    let mut record = RunRecord {
        run_id: previous
            .as_ref()
            .and_then(|p| p["run_id"].as_str().map(str::to_string))
            .unwrap_or_else(new_run_id),
        created: previous
            .as_ref()
            .and_then(|p| p["created"].as_str().map(str::to_string))
            .unwrap_or_else(|| utc_rfc3339(SystemTime::now())),
        attempts: previous
            .as_ref()
            .and_then(|p| p["attempts"].as_array().cloned())
            .unwrap_or_default(),
    };
    let mut ledger = Ledger::load(rundir.read_json(GOODPUT_FILE).as_ref());
    let tensorboard = if plan.tensorboard {
        Some(TensorBoard::start(&plan)?)
    } else {
        None
    };
    let mut failed: Vec<FailureRecord> = Vec::new();
    let mut made = 0;
    loop {
        let end = attempt(
            &plan,
            &opts,
            &mut signals,
            &mut rundir,
            &token,
            &mut record,
            &mut ledger,
            // Restarts resume from the newest checkpoint that verifies.
            plan.resume_from.filter(|_| made == 0),
        )
        .await?;
        made += 1;
        let restart = end.status == OutcomeStatus::Failed
            && end.failure.is_some()
            && (failed.len() as u32) < plan.failure.max_failures;
        if let Some(f) = &end.failure {
            failed.push(f.clone());
        }
        if restart {
            let newest = meshrun_ckpt::commit::committed(&plan.run_dir.join("checkpoints"))
                .last()
                .map(|(step, _)| *step);
            let f = end
                .failure
                .as_ref()
                .expect("a failed attempt has a failure");
            rundir.event(
                "restarting",
                json!({ "after_attempt": f.attempt, "failures": failed.len(), "max_failures": plan.failure.max_failures, "from_step": newest }),
            )?;
            let from = newest.map_or_else(
                || "from the start (no checkpoint yet)".to_string(),
                |s| {
                    format!("from the newest checkpoint that verifies (newest committed: step-{s})")
                },
            );
            if let Some(text) = &end.summary {
                terminal().note(text);
            }
            terminal().note(&format!(
                "meshrun: attempt {} failed: rank {} {}; restarting {from} (failure {} of {} allowed)",
                f.attempt,
                f.rank,
                f.cause.headline(),
                failed.len(),
                plan.failure.max_failures
            ));
            continue;
        }
        if let Some(tb) = tensorboard {
            rundir.flush()?;
            tb.stop().await;
        }
        let state = state_name(end.status);
        rundir.write_json("run.json", &record.json(&plan, state))?;
        rundir.event(
            "run_ended",
            json!({ "attempt": record.attempts.len(), "state": state }),
        )?;
        rundir.flush()?;
        // The page is a view of what is already written: failing to write
        // it must not fail the run.
        if let Err(e) = crate::report::write(&plan.run_dir) {
            tracing::warn!("report.html not written: {e}");
            terminal().note(&format!("meshrun: warning: report.html not written: {e}"));
        }
        let summary = match (&end.summary, failed.len()) {
            (Some(text), n) if n > 1 && end.status == OutcomeStatus::Failed => Some(format!(
                "meshrun: run '{}' failed {n} times, more than --max-failures {} allows:\n{}{text}",
                plan.name,
                plan.failure.max_failures,
                render_attempts(&failed[..n - 1])
            )),
            _ => end.summary,
        };
        // Whatever the workers printed comes before the caller's summary;
        // a terminal paused for good does not hold the run's end.
        terminal().flush(TERMINAL_FLUSH_WAIT);
        return Ok(Outcome {
            status: end.status,
            name: plan.name.clone(),
            run_dir: plan.run_dir.clone(),
            failure: end.failure,
            summary,
            last_metrics: end.last_metrics,
            attempts: made,
        });
    }
}

fn state_name(status: OutcomeStatus) -> &'static str {
    match status {
        OutcomeStatus::Succeeded => "succeeded",
        OutcomeStatus::Failed => "failed",
        OutcomeStatus::Interrupted { .. } => "interrupted",
        OutcomeStatus::Preempted { .. } => "preempted",
    }
}

/// What `run.json` holds besides the plan.
struct RunRecord {
    run_id: String,
    created: String,
    attempts: Vec<Value>,
}

impl RunRecord {
    fn json(&self, plan: &RunPlan, state: &str) -> Value {
        json!({
            "name": plan.name,
            "run_id": self.run_id,
            "state": state,
            "created": self.created,
            "plan": plan,
            "versions": { "meshrun": env!("CARGO_PKG_VERSION"), "protocol": PROTOCOL_VERSION },
            "attempts": self.attempts,
        })
    }
}

/// One attempt: its own control port, agents and workers, from launch to
/// the last worker's exit.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    plan: &RunPlan,
    opts: &ExecOptions,
    signals: &mut Signals,
    rundir: &mut RunDir,
    token: &Token,
    record: &mut RunRecord,
    ledger: &mut Ledger,
    resume_from: Option<u64>,
) -> Result<AttemptEnd, CoreError> {
    let attempt = record.attempts.len() as u32 + 1;
    let started_unix = unix_time();
    let (listener, addr) = bind(plan.control_host, plan.control_port)
        .await
        .map_err(|source| CoreError::Net {
            what: "cannot bind the control port",
            source,
        })?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let accept = spawn_accept_loop(listener, token.clone(), events_tx);

    let started = utc_rfc3339(SystemTime::now());
    record.attempts.push(json!({
        "attempt": attempt,
        "started": started,
        "state": "running",
        "control": { "bind": addr.to_string(), "loopback_only": addr.ip().is_loopback() },
    }));
    rundir.write_json("run.json", &record.json(plan, "running"))?;
    rundir.event(
        "attempt_started",
        json!({ "attempt": attempt, "nprocs": plan.nprocs, "hosts": plan.hosts, "control_addr": addr.to_string() }),
    )?;

    let opened = Checkpoints::open(
        &plan.run_dir,
        plan.nprocs,
        plan.retention.clone(),
        attempt,
        resume_from,
    );
    let (checkpoints, removed) = match opened {
        Ok(found) => found,
        Err(e) => {
            accept.abort();
            return Err(errored(rundir, plan, record, CoreError::Checkpoint(e)));
        }
    };
    for path in removed {
        rundir.event(
            "checkpoint_discarded",
            json!({ "path": path.display().to_string(), "reason": "not committed" }),
        )?;
    }
    checkpoints.record(rundir)?;
    let mut agent_procs = match agents::start(plan, addr, token) {
        Ok(agents) => agents,
        Err(e) => {
            accept.abort();
            return Err(errored(rundir, plan, record, e));
        }
    };
    let mut sup = Supervisor::new(
        plan.clone(),
        rundir,
        token.clone(),
        record.run_id.clone(),
        attempt,
        addr.to_string(),
        checkpoints,
        Progress::new(opts.progress, attempt),
    );
    let result = sup.run(&mut events, &mut agent_procs, opts, signals).await;
    sup.progress.finish();
    for link in sup.agents.values() {
        let _ = link.tx.send(Message::Shutdown);
    }
    agent_procs.finish().await;
    accept.abort();
    // Waiting for the abort drops the listener now, so a fixed
    // --control-port is free again for the next attempt.
    let _ = accept.await;
    sup.tidy_stacks();
    if let Err(e) = result {
        return Err(errored(sup.rundir, plan, record, e));
    }
    let status = sup.status();
    if let Some(f) = &mut sup.failure {
        f.exit = sup.ranks.get(f.rank as usize).and_then(|r| r.exit);
    }
    let summary = sup.summary(status);
    if let Some(last) = record.attempts.last_mut() {
        last["ended"] = json!(utc_rfc3339(SystemTime::now()));
        last["state"] = json!(state_name(status));
        last["failure"] = json!(sup.failure);
        last["reports"] = json!(sup.ranks.iter().map(|r| r.reports).collect::<Vec<_>>());
    }
    sup.rundir.event(
        "attempt_ended",
        json!({ "attempt": attempt, "state": state_name(status) }),
    )?;
    ledger.push(sup.goodput(status, started_unix, unix_time()));
    sup.rundir.write_json(GOODPUT_FILE, &ledger.json())?;
    let end = AttemptEnd {
        status,
        failure: sup.failure.take(),
        summary,
        last_metrics: sup.last_metrics.take(),
    };
    Ok(end)
}

/// Records that the attempt ended in an engine error (not a worker's
/// failure), so `run.json` never claims a dead run is running; returns the
/// error for the caller.
fn errored(
    rundir: &mut RunDir,
    plan: &RunPlan,
    record: &mut RunRecord,
    error: CoreError,
) -> CoreError {
    if let Some(last) = record.attempts.last_mut() {
        last["state"] = json!("errored");
        last["error"] = json!(error.to_string());
        last["ended"] = json!(utc_rfc3339(SystemTime::now()));
    }
    let _ = rundir.write_json("run.json", &record.json(plan, "errored"));
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

impl<'a> Supervisor<'a> {
    // Each argument is a separate piece of the attempt's set-up.
    #[allow(clippy::too_many_arguments)]
    fn new(
        plan: RunPlan,
        rundir: &'a mut RunDir,
        token: Token,
        run_id: String,
        attempt: u32,
        control_addr: String,
        checkpoints: Checkpoints,
        progress: Progress,
    ) -> Self {
        Self {
            ranks: vec![RankState::default(); plan.nprocs as usize],
            plan,
            rundir,
            token,
            run_id,
            attempt,
            control_addr,
            agents: BTreeMap::new(),
            output: None,
            failure: None,
            stop: None,
            stop_deadline: None,
            last_metrics: None,
            launched: false,
            checkpoints,
            checkpointing: false,
            preempt_deadline: None,
            stacks_dumped: false,
            last_committed: None,
            progress,
        }
    }

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
        let mut watch = tokio::time::interval(Duration::from_millis(250));
        let mut drain = tokio::time::interval(Duration::from_millis(50));
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
                () = next_signal(sigint) => self.interrupt(Signal::SIGINT as i32)?,
                () = next_signal(sigterm) => self.terminate()?,
                () = stop_requested(opts.stop.as_ref()), if !external_stop_seen => {
                    external_stop_seen = true;
                    self.interrupt(Signal::SIGINT as i32)?;
                }
                _ = agent_check.tick(), if !self.launched => {
                    if let Some(why) = agent_procs.ray_error() {
                        return Err(CoreError::RayPlacement(why));
                    }
                    if let Some((host, how)) = agent_procs.exited() {
                        return Err(CoreError::AgentGone { host, what: how });
                    }
                }
                _ = watch.tick(), if self.launched && self.stop.is_none() => self.watch()?,
                // Wakes the loop to see whether the draining is over.
                _ = drain.tick(), if self.draining() => {}
                () = tokio::time::sleep_until(deadline.into()) => {
                    if !self.launched && self.stop.is_none() {
                        let host = (0..self.plan.hosts).find(|h| !self.agents.contains_key(h)).unwrap_or(0);
                        return Err(CoreError::AgentTimeout { host, secs: AGENT_JOIN_TIMEOUT.as_secs() });
                    }
                    // Exits that never came: the workers are treated as lost.
                    for r in &mut self.ranks {
                        r.abandon();
                    }
                }
            }
        }
    }

    /// Every 250 ms: hangs, frozen workers, broken connections, and a
    /// preemption whose checkpoint does not come.
    fn watch(&mut self) -> Result<(), CoreError> {
        // Metrics are buffered between ticks, so readers see them live.
        self.rundir.flush()?;
        self.progress.tick();
        let now = Instant::now();
        if let Some(deadline) = self.preempt_deadline {
            if now >= deadline {
                self.rundir.event(
                    "preempt_timeout",
                    json!({ "attempt": self.attempt, "waited_s": PREEMPT_GRACE.as_secs() }),
                )?;
                return self.begin_stop(StopReason::Signal(Signal::SIGTERM as i32));
            }
        }
        let live = || self.ranks.iter().enumerate().filter(|(_, r)| !r.done);
        let lost = live().find_map(|(rank, r)| {
            r.connection_lost
                .filter(|t| now.duration_since(*t) >= CONNECTION_LOSS_GRACE)
                .map(|_| rank as u32)
        });
        if let Some(rank) = lost {
            return self.fail(rank, Cause::ConnectionLost);
        }
        let frozen = live().find_map(|(rank, r)| {
            let silent = now.duration_since(r.heard?);
            (r.connection_lost.is_none() && silent >= HEARTBEAT_TIMEOUT)
                .then_some((rank as u32, silent.as_secs_f64()))
        });
        if let Some((rank, secs)) = frozen {
            return self.fail(rank, Cause::Unresponsive { secs });
        }
        if let Some((rank, secs, first)) = self.behind_a_finished_rank(now) {
            let last_step = self.ranks[rank as usize].last_step;
            return self.fail(
                rank,
                Cause::Hang {
                    secs,
                    last_step,
                    after_finish_of: Some(first),
                },
            );
        }
        if let Some(limit) = self.plan.failure.hang_timeout_s {
            // The rank that has gone longest without a report is named.
            let stalest = live()
                .filter_map(|(rank, r)| Some((r.progress?, rank as u32, r.last_step)))
                .min();
            if let Some((since, rank, last_step)) = stalest {
                let secs = now.duration_since(since).as_secs_f64();
                if secs >= limit {
                    return self.fail(
                        rank,
                        Cause::Hang {
                            secs,
                            last_step,
                            after_finish_of: None,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// A rank still running with no report for the finish timeout since
    /// another finished its program and waits for it (or since its own last
    /// report, if later): SPMD ranks end together, and JAX holds a finished
    /// rank in its shutdown barrier, then aborts it. A finished rank whose
    /// process is gone waits for nobody (independent programs end when they
    /// will). Gives (rank, seconds, the rank that finished first).
    fn behind_a_finished_rank(&self, now: Instant) -> Option<(u32, f64, u32)> {
        let limit = self.plan.failure.finish_timeout();
        let (first, since) = self
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.done)
            .filter_map(|(rank, r)| Some((r.finished?.0, rank as u32)))
            .min()
            .map(|(t, rank)| (rank, t))?;
        self.ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.done && r.finished.is_none())
            .map(|(rank, r)| (rank as u32, r.progress.map_or(since, |p| p.max(since))))
            .filter(|(_, last)| now.duration_since(*last) >= limit)
            .min_by_key(|(_, last)| *last)
            .map(|(rank, last)| (rank, now.duration_since(last).as_secs_f64(), first))
    }

    fn finished(&self) -> bool {
        if !self.launched {
            return self.stop.is_some();
        }
        self.ranks.iter().all(|r| r.done && r.drained())
    }

    /// Some worker has exited but what it sent is still being read.
    fn draining(&self) -> bool {
        self.ranks.iter().any(|r| r.done && !r.drained())
    }

    fn on_event(&mut self, event: Event) -> Result<(), CoreError> {
        match event {
            Event::AgentJoined {
                host,
                host_ip,
                pid,
                gpus,
                free_port,
                controller,
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
                        controller,
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
                    self.ranks[rank as usize].abandon();
                }
                if let Some(&rank) = lost.first() {
                    self.fail(rank, Cause::AgentLost { host, error })?;
                }
            }
            Event::WorkerJoined {
                rank,
                attempt,
                pid,
                tx,
            } => {
                if attempt == self.attempt && (rank as usize) < self.ranks.len() {
                    tracing::debug!(rank, pid, "worker connected");
                    let state = &mut self.ranks[rank as usize];
                    state.heard = Some(Instant::now());
                    if self.preempt_deadline.is_some() {
                        let _ = tx.send(Message::CheckpointNow);
                    }
                    state.tx = Some(tx);
                }
            }
            Event::FromWorker { rank, msg } => {
                if let Some(state) = self.ranks.get_mut(rank as usize) {
                    state.heard = Some(Instant::now());
                }
                self.on_worker_message(rank, msg)?;
            }
            Event::StopRequested { now, tx } => {
                self.rundir.event(
                    "stop_requested",
                    json!({ "attempt": self.attempt, "now": now }),
                )?;
                let sigterm = Signal::SIGTERM as i32;
                let what = if now || self.stop.is_some() {
                    self.interrupt(sigterm)?;
                    "stopping every worker now"
                } else if self.checkpointing && self.preempt_deadline.is_none() {
                    self.terminate()?;
                    "every worker saves a checkpoint at its next report; the run stops once it is committed"
                } else {
                    self.interrupt(sigterm)?;
                    "stopping every worker now (the program has not saved a checkpoint through meshrun.report, so there is none to wait for)"
                };
                let _ = tx.send(Message::StopAccepted {
                    what: what.to_string(),
                });
            }
            Event::WorkerLost { rank, clean } => {
                tracing::debug!(rank, clean, "worker connection closed");
                let failed = self.failure.is_some();
                if let Some(state) = self.ranks.get_mut(rank as usize) {
                    state.tx = None;
                    state.heard = None;
                    if clean {
                        state.finish(failed);
                    } else {
                        state.connection_lost = Some(Instant::now());
                    }
                }
            }
        }
        Ok(())
    }

    fn on_agent_message(&mut self, host: u32, msg: Message) -> Result<(), CoreError> {
        let pph = self.plan.procs_per_host;
        let owns = |rank: u32| rank / pph == host && (rank as usize) < self.ranks.len();
        match msg {
            Message::Log {
                rank,
                stream,
                line,
                more,
            } if owns(rank) => {
                if let Some(out) = &mut self.output {
                    out.line(rank, stream, &line, more);
                }
            }
            Message::WorkerStarted { rank, pid } if owns(rank) => {
                self.ranks[rank as usize].pid = Some(pid);
                self.ranks[rank as usize].progress = Some(Instant::now());
                self.rundir.event(
                    "worker_started",
                    json!({ "attempt": self.attempt, "rank": rank, "host": host, "pid": pid }),
                )?;
            }
            Message::SpawnFailed { rank, error } if owns(rank) => {
                self.ranks[rank as usize].done = true;
                self.fail(rank, Cause::SpawnFailed { error })?;
            }
            Message::LeftoversEnded { rank, pids, how } if owns(rank) => {
                self.rundir.event(
                    "leftovers_ended",
                    json!({ "attempt": self.attempt, "rank": rank, "host": host, "count": pids.len(), "pids": pids, "how": how }),
                )?;
            }
            Message::WorkerExited { rank, exit } if owns(rank) => {
                let failed = self.failure.is_some();
                let state = &mut self.ranks[rank as usize];
                state.exit = Some(exit);
                state.done = true;
                if exit.success() {
                    state.finish(failed);
                }
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
            Message::Report {
                step,
                metrics,
                checkpoint,
                timing,
                saving,
                total_steps,
            } => {
                let state = &mut self.ranks[rank as usize];
                state.progress = Some(Instant::now());
                state.last_step = step.or(state.last_step);
                state.reports += 1;
                if let Some(t) = timing.as_ref().and_then(Timing::parse) {
                    // A save's figures: where a failure's lost time starts
                    // once that step is committed.
                    if let (true, Some(s)) = (saving, step) {
                        state.saved_timings.insert(s, t.clone());
                    }
                    state.timing = Some(t);
                }
                self.checkpointing |= checkpoint;
                if rank == 0 {
                    self.progress.report(step, &metrics, total_steps);
                    if saving {
                        self.progress.saving(step);
                    }
                    self.rundir.metrics(&json!({
                        "time": unix_time(),
                        "attempt": self.attempt,
                        "step": step,
                        "metrics": metrics,
                    }))?;
                    self.last_metrics = Some(metrics);
                }
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
                    self.last_committed = self.last_committed.max(Some(step));
                    self.progress.saving(None);
                    if let Some(newest) = self.last_committed {
                        for r in &mut self.ranks {
                            // Keep the figures of the newest commit and later.
                            let keep = r
                                .saved_timings
                                .range(..=newest)
                                .next_back()
                                .map(|(s, _)| *s);
                            r.saved_timings.retain(|s, _| Some(*s) >= keep);
                        }
                    }
                    if self.preempt_deadline.is_some() && self.stop.is_none() {
                        self.begin_stop(StopReason::Preempted(step))?;
                    }
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
            Message::Timing { timing } => {
                if let Some(t) = Timing::parse(&timing) {
                    self.ranks[rank as usize].timing = Some(t);
                }
            }
            // A rank saving `step` went past every earlier step without a
            // preemption save of it: ranks waiting on those go on, to meet
            // the others at a later step.
            Message::PreemptSave { step }
                if self.preempt_deadline.is_some() && self.stop.is_none() && step > 0 =>
            {
                for r in &self.ranks {
                    if let Some(tx) = &r.tx {
                        let _ = tx.send(Message::Resume { step: step - 1 });
                    }
                }
            }
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
            Message::ExitRequested {
                code,
                argument,
                traceback,
            } => self.fail(
                rank,
                Cause::SystemExit {
                    code,
                    argument,
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
            host_ip: "",
            resume_step: self.checkpoints.resume_step(),
        };
        let mut plans = Vec::new();
        for (&host, link) in &self.agents {
            let info = AttemptInfo {
                control_addr: link.controller.as_deref().unwrap_or(&self.control_addr),
                host_ip: &link.ip,
                ..info
            };
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
        let mut output = Output::open(
            self.plan.tee,
            &paths,
            self.attempt,
            &utc_rfc3339(SystemTime::now()),
        )?;
        output.set_bar(self.progress.bar());
        self.output = Some(output);
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
    /// exception or `sys.exit` report from the same rank adds its traceback
    /// (its exit, which comes over the agent's connection, can overtake it).
    fn fail(&mut self, rank: u32, cause: Cause) -> Result<(), CoreError> {
        match &mut self.failure {
            Some(first) => {
                if first.rank == rank
                    && matches!(first.cause, Cause::Exit { .. })
                    && matches!(cause, Cause::Exception { .. } | Cause::SystemExit { .. })
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

    fn interrupt(&mut self, signal: i32) -> Result<(), CoreError> {
        if self.stop.is_some() {
            // Asked again while stopping: no more grace.
            for link in self.agents.values() {
                let _ = link.tx.send(Message::Stop {
                    grace_ms: 0,
                    dump_stacks: false,
                });
            }
            return Ok(());
        }
        self.begin_stop(StopReason::Signal(signal))
    }

    /// SIGTERM: preemption. When the program checkpoints through
    /// `meshrun.report`, every worker is asked to save at its next report
    /// and the group stops once that step is committed; otherwise (or on a
    /// second SIGTERM) it stops now.
    fn terminate(&mut self) -> Result<(), CoreError> {
        let sigterm = Signal::SIGTERM as i32;
        if self.stop.is_some() || self.preempt_deadline.is_some() || !self.checkpointing {
            return self.interrupt(sigterm);
        }
        self.preempt_deadline = Some(Instant::now() + PREEMPT_GRACE);
        for r in &self.ranks {
            if let Some(tx) = &r.tx {
                let _ = tx.send(Message::CheckpointNow);
            }
        }
        self.rundir.event(
            "preempting",
            json!({ "attempt": self.attempt, "grace_s": PREEMPT_GRACE.as_secs() }),
        )
    }

    fn begin_stop(&mut self, reason: StopReason) -> Result<(), CoreError> {
        self.stop = Some(reason);
        for r in self.ranks.iter_mut().filter(|r| !r.done) {
            r.stopped_by_meshrun = true;
        }
        // Every surviving rank's stacks show where the group was when it
        // failed (the hung frame, or who waited on whom).
        let dump_stacks = reason == StopReason::Failure && self.ranks.iter().any(|r| !r.done);
        // A failed group cannot go on (JAX SPMD does not survive a missing
        // member) and JAX workers ignore SIGTERM, so after the stacks it is
        // killed at once: every second here delays the restart.
        // After a preemption's commit every rank waits in `report` with
        // nothing left to lose: no grace either, so none trains on.
        let grace_ms = match reason {
            StopReason::Failure | StopReason::Preempted(_) => FAILURE_STOP_GRACE_MS,
            StopReason::Signal(_) => STOP_GRACE_MS,
        };
        for link in self.agents.values() {
            let _ = link.tx.send(Message::Stop {
                grace_ms,
                dump_stacks,
            });
        }
        let dump_wait = if dump_stacks {
            STACK_DUMP_WAIT
        } else {
            Duration::ZERO
        };
        self.stop_deadline =
            Some(Instant::now() + dump_wait + Duration::from_millis(grace_ms) + STOP_REPORT_SLACK);
        if dump_stacks {
            self.stacks_dumped = true;
            self.rundir.event(
                "stacks_dumped",
                json!({ "attempt": self.attempt, "dir": self.stacks_dir().display().to_string() }),
            )?;
        }
        let why = match reason {
            StopReason::Failure => "failure".to_string(),
            StopReason::Signal(s) => format!("signal {s}"),
            StopReason::Preempted(step) => format!("preempted after checkpoint step {step}"),
        };
        self.rundir.event(
            "stopping",
            json!({ "attempt": self.attempt, "reason": why }),
        )
    }

    /// This attempt's goodput parts, averaged over its ranks.
    fn goodput(&self, status: OutcomeStatus, start: f64, end: f64) -> AttemptParts {
        let failed = status == OutcomeStatus::Failed;
        let ranks: Vec<Parts> = self
            .ranks
            .iter()
            .map(|r| {
                let cut = if failed {
                    self.last_committed
                        .and_then(|c| r.saved_timings.range(..=c).next_back().map(|(_, t)| t))
                } else {
                    r.timing.as_ref()
                };
                goodput::rank_parts(start, end, failed, cut)
            })
            .collect();
        AttemptParts {
            attempt: self.attempt,
            state: state_name(status).to_string(),
            start,
            end,
            parts: goodput::mean(&ranks),
        }
    }

    fn stacks_dir(&self) -> std::path::PathBuf {
        self.rundir
            .path()
            .join("stacks")
            .join(format!("attempt-{}", self.attempt))
    }

    /// Workers open their stack files when they start; the empty ones of an
    /// attempt that dumped nothing are removed.
    fn tidy_stacks(&self) {
        let dir = self.stacks_dir();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.metadata().is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let _ = std::fs::remove_dir(&dir);
        let _ = std::fs::remove_dir(self.rundir.path().join("stacks"));
    }

    fn status(&self) -> OutcomeStatus {
        match self.stop {
            Some(StopReason::Signal(signal)) => OutcomeStatus::Interrupted { signal },
            // Steps may still commit while the group stops; the newest counts.
            Some(StopReason::Preempted(step)) => OutcomeStatus::Preempted {
                step: self.last_committed.unwrap_or(step),
            },
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
            OutcomeStatus::Preempted { step } => Some(format!(
                "meshrun: run '{}' preempted: every worker saved checkpoint step-{step} and was \
                 stopped; run it again with --name {} to resume from there",
                self.plan.name, self.plan.name
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
                        finished_early: r
                            .finished
                            .filter(|_| r.finished_before_failure)
                            .map(|(_, last_step)| EarlyFinish { last_step }),
                    })
                    .collect();
                let tail = self
                    .output
                    .as_ref()
                    .map(|o| o.tail(failure.rank))
                    .unwrap_or_default();
                let mut text = render(
                    &self.plan.name,
                    failure,
                    &ranks,
                    &tail,
                    &self.rundir.log_path(failure.rank),
                );
                // Only what was written: a rank that had exited, or a group
                // stopped before the dump, leaves no stacks.
                let dir = self.stacks_dir();
                if self.stacks_dumped && stacks::any_written(&dir) {
                    if matches!(
                        failure.cause,
                        Cause::Hang { .. } | Cause::Unresponsive { .. }
                    ) {
                        let frames = stacks::frames(&dir, self.plan.nprocs);
                        if !frames.is_empty() {
                            let _ = write!(
                                text,
                                "\n  where each rank was (innermost frame of your code):"
                            );
                            for (rank, frame) in frames {
                                let _ = write!(text, "\n    rank {rank}: {frame}");
                            }
                        }
                    }
                    let _ = write!(text, "\n  stacks: {}", dir.display());
                }
                Some(text)
            }
        }
    }
}
