//! The run across its attempts: a failed attempt is followed by a new one
//! (fresh control port, agents and workers, restoring the newest committed
//! checkpoint) while `max_failures` allows. What each attempt starts with
//! and what follows it are [`Run`]'s decisions, each attempt's own the
//! [`Machine`]'s; the [`Driver`] carries them out; this module sets an
//! attempt up, records how it ended in `run.json` and `goodput.json`, and
//! words the outcome.

use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use meshrun_ckpt::store::Location;
use meshrun_protocol::token::{Token, TokenError};
use meshrun_protocol::PROTOCOL_VERSION;
use meshrun_record::{names, AttemptRecord, Event, Goodput, RunRecord, RunState};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::agents;
use super::checkpoints::Checkpoints;
use super::driver::{Driver, Signals};
use super::joining::join_command;
use super::profiles::Captures;
use super::progress::Progress;
use super::restarts;
use super::server::{bind, spawn_accept_loop};
use super::stacks;
use super::summary::{render, Cause};
use super::terminal::terminal;
use super::{ExecOptions, FailureRecord, Outcome, OutcomeStatus};
use crate::error::CoreError;
use crate::rundir::{unix_time, utc_rfc3339, RunDir};
use meshrun_machine::{After, Ended, Machine, Run, Setup, Start};
use meshrun_plan::RunPlan;

/// How long the end of a run waits for the terminal to take what is queued.
const TERMINAL_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What one attempt left for the run to decide on.
struct AttemptEnd {
    status: OutcomeStatus,
    failure: Option<FailureRecord>,
    summary: Option<String>,
    last_metrics: Option<serde_json::Value>,
    memory_committed: Option<u64>,
    hosts_launched: Option<u32>,
}

pub async fn supervise(plan: RunPlan, opts: ExecOptions) -> Result<Outcome, CoreError> {
    let mut signals = Signals::install(opts.handle_signals);
    let mut rundir = RunDir::open(&plan.run_dir, &plan.name)?;
    // Hosts that join bring the token with them: the one they were given
    // in MESHRUN_TOKEN, when the run was started with it.
    let token = match std::env::var(meshrun_protocol::env::TOKEN) {
        Ok(hex) if plan.rendezvous => Token::from_hex(hex.trim())?,
        _ => Token::generate()?,
    };
    rundir.write_token(&token)?;
    if plan.rendezvous {
        let token_in_env = std::env::var_os(meshrun_protocol::env::TOKEN).is_some();
        terminal().note(&join_command(&plan, token_in_env));
    }
    let mut record = match previous(&plan, meshrun_record::read::run_record(&plan.run_dir)) {
        Some(previous) => RunRecord {
            plan: serde_json::to_value(&plan).expect("plans serialize"),
            ..previous
        },
        None => RunRecord {
            name: plan.name.clone(),
            run_id: new_run_id()?,
            state: RunState::Running,
            created: utc_rfc3339(SystemTime::now()),
            plan: serde_json::to_value(&plan).expect("plans serialize"),
            versions: meshrun_record::run::Versions {
                meshrun: env!("CARGO_PKG_VERSION").to_string(),
                protocol: PROTOCOL_VERSION,
            },
            attempts: Vec::new(),
        },
    };
    let goodput_path = plan.run_dir.join(names::GOODPUT);
    let mut goodput = previous(
        &plan,
        meshrun_record::read::json_file::<Goodput>(&goodput_path),
    )
    .unwrap_or_default();
    let tensorboard = if plan.tensorboard {
        Some(super::tensorboard::TensorBoard::start(&plan)?)
    } else {
        None
    };
    // Host 0's warm spares wait here between attempts.
    let spares = meshrun_agent::Spares::new();
    let mut run = Run::new(&plan);
    // Profile captures: those taken once per run are remembered here.
    let mut captures = Captures::default();
    loop {
        let start = run.start();
        let end = attempt(
            &plan,
            &opts,
            &spares,
            &run,
            &start,
            &mut captures,
            &mut signals,
            &mut rundir,
            &token,
            &mut record,
            &mut goodput,
        )
        .await;
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                spares.close().await;
                return Err(e);
            }
        };
        let after = run.ended(Ended {
            status: end.status,
            failure: end.failure.clone(),
            memory_committed: end.memory_committed,
            hosts_launched: end.hosts_launched,
        });
        let next = match after {
            After::Resize { from, to } => {
                terminal().note(&format!(
                    "meshrun: stopped at a checkpoint to grow from {from} to {to} hosts; \
                     restarting from it"
                ));
                continue;
            }
            After::Restart { failure, failures } => {
                let newest =
                    meshrun_ckpt::commit::committed(&plan.storage_dir().join(names::CHECKPOINTS))
                        .unwrap_or_default()
                        .last()
                        .map(|(step, _)| *step);
                rundir.event(Event::Restarting {
                    after_attempt: failure.attempt,
                    failures,
                    max_failures: run.max_failures(),
                    from_step: newest,
                })?;
                if let Some(text) = &end.summary {
                    terminal().note(&restarts::attempt_summary(
                        text,
                        &plan.name,
                        failure.attempt,
                    ));
                }
                terminal().note(&restarts::restarting_line(
                    &failure,
                    newest,
                    run.memory_step(newest),
                    failures,
                    run.max_failures(),
                ));
                continue;
            }
            After::End { next, .. } => next,
        };
        if let Some(tb) = tensorboard {
            rundir.flush()?;
            tb.stop().await;
        }
        record.state = end.status.state();
        rundir.write_run(&record)?;
        rundir.event(Event::RunEnded {
            attempt: Some(record.attempts.len() as u32),
            state: record.state,
            error: None,
        })?;
        rundir.flush()?;
        // Said in the caller's terms: a Trainer's function came from Python.
        let max_failures = if opts.payload.is_some() {
            format!("FailureConfig(max_failures={})", run.max_failures())
        } else {
            format!("--max-failures {}", run.max_failures())
        };
        let summary =
            restarts::final_summary(&plan.name, next, end.summary, run.failures(), &max_failures);
        // Whatever the workers printed comes before the caller's summary;
        // a terminal paused for good does not hold the run's end.
        terminal().flush(TERMINAL_FLUSH_WAIT);
        spares.close().await;
        return Ok(Outcome {
            status: end.status,
            name: plan.name.clone(),
            run_dir: plan.run_dir.clone(),
            failure: end.failure,
            summary,
            last_metrics: end.last_metrics,
            attempts: run.attempts(),
        });
    }
}

/// A record of an earlier invocation of this run, when it reads; one that
/// does not is reported and replaced (the run goes on without its history
/// rather than refusing a folder it owns).
fn previous<T>(
    plan: &RunPlan,
    read: Result<Option<T>, meshrun_record::read::ReadError>,
) -> Option<T> {
    match read {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!("{e}");
            terminal().note(&format!(
                "meshrun: warning: run '{}': {e}; it is written anew",
                plan.name
            ));
            None
        }
    }
}

/// What the connections may have handed the supervisor and it has not
/// read yet: about a megabyte of small messages.
const EVENT_QUEUE: usize = 4096;

/// One attempt: its own control port, agents and workers, from launch to
/// the last worker's exit.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    plan: &RunPlan,
    opts: &ExecOptions,
    spares: &meshrun_agent::Spares,
    run: &Run,
    start: &Start,
    captures: &mut Captures,
    signals: &mut Signals,
    rundir: &mut RunDir,
    token: &Token,
    record: &mut RunRecord,
    goodput: &mut Goodput,
) -> Result<AttemptEnd, CoreError> {
    let attempt = record.attempts.len() as u32 + 1;
    let started_unix = unix_time();
    let (listener, addr) = bind(plan.control_host, plan.control_port)
        .await
        .map_err(|source| CoreError::Net {
            what: "cannot bind the control port",
            source,
        })?;
    // Bounded: when the supervisor falls behind, the connections' tasks
    // wait to hand over what they read, stop reading, and TCP holds the
    // senders back; nothing is dropped and the backlog is not the
    // controller's memory.
    let (events_tx, mut events) = mpsc::channel(EVENT_QUEUE);
    let accept = spawn_accept_loop(listener, token.clone(), events_tx);

    record.attempts.push(AttemptRecord {
        attempt,
        started: utc_rfc3339(SystemTime::now()),
        state: RunState::Running,
        // An elastic attempt's own count comes once it is sized.
        hosts: plan.elastic.is_none().then_some(plan.hosts),
        control: Some(meshrun_record::run::Control {
            bind: addr.to_string(),
            loopback_only: addr.ip().is_loopback(),
        }),
        ended: None,
        failure: None,
        reports: Vec::new(),
        reports_shed: Vec::new(),
        error: None,
    });
    record.state = RunState::Running;
    rundir.write_run(record)?;
    rundir.event(Event::AttemptStarted {
        attempt,
        nprocs: plan.nprocs,
        hosts: plan.hosts,
        control_addr: addr.to_string(),
    })?;

    let opened = Checkpoints::open(
        &plan.storage_dir(),
        plan.nprocs,
        plan.retention.clone(),
        attempt,
        start.resume_from,
    );
    let (checkpoints, removed) = match opened {
        Ok(found) => found,
        Err(e) => {
            accept.abort();
            return Err(errored(rundir, record, CoreError::Checkpoint(e)));
        }
    };
    for path in removed {
        rundir.event(Event::CheckpointDiscarded {
            path: path.to_string(),
            reason: "not committed".into(),
        })?;
    }
    checkpoints.record(rundir)?;
    let mut agent_procs = match agents::start(plan, addr, token, spares) {
        Ok(agents) => agents,
        Err(e) => {
            accept.abort();
            return Err(errored(rundir, record, e));
        }
    };
    let storage_probe = match StorageMarker::write(plan, attempt) {
        Ok(marker) => marker,
        Err(e) => {
            accept.abort();
            return Err(errored(rundir, record, e));
        }
    };
    let setup = Setup {
        attempt,
        run_id: record.run_id.clone(),
        token_hex: token.to_hex(),
        control_addr: addr.to_string(),
        user_xla_flags: std::env::var("XLA_FLAGS").ok(),
        resume_step: checkpoints.resume_step(),
        join_timeout: start.join_timeout,
        payload: opts.payload.clone(),
        storage_probe: storage_probe.as_ref().map(StorageMarker::probe),
        first_joined_host: u32::from(plan.rendezvous),
        memory_step: run.memory_step(checkpoints.resume_step()),
        previous_hosts: start.previous_hosts,
        expected_hosts: start.expected_hosts,
        resize_reason: None,
    };
    let machine = Machine::new(plan.clone(), setup, Instant::now());
    let progress = Progress::new(opts.progress, attempt).with_loss_metric(plan.loss_metric.clone());
    let mut driver = Driver::new(
        machine,
        plan,
        attempt,
        rundir,
        record,
        checkpoints,
        progress,
        captures,
    )?;
    let result = driver
        .run(&mut events, &mut agent_procs, opts.stop.as_ref(), signals)
        .await;
    // Nobody reads the queue any more: connections waiting to put a
    // message in it go back to reading their sockets (an agent held back
    // in its send would not read its Shutdown).
    drop(events);
    // A commit still under way is waited for (and recorded) before the
    // attempt ends; the engine error, if any, comes first.
    let result = match (result, driver.finish_commits().await) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    };
    let result = result.and_then(|()| driver.end_captures());
    driver.progress.finish();
    drop(storage_probe);
    // Joined hosts wait for the next attempt only when there is one.
    let again = run.goes_on(driver.machine.status(), driver.machine.failure().as_ref());
    driver.machine.shutdown(again);
    let shut = driver.perform();
    agent_procs.finish().await;
    accept.abort();
    // Waiting for the abort drops the listener now, so a fixed
    // --control-port is free again for the next attempt.
    let _ = accept.await;
    let stacks_dir = names::stacks_dir(&plan.run_dir, attempt);
    stacks::tidy(&stacks_dir);
    if let Err(e) = result.and(shut) {
        return Err(errored(driver.rundir, driver.record, e));
    }
    let machine = &mut driver.machine;
    let status = machine.status();
    let failure = machine.failure();
    let summary = summary(plan, machine, driver.output.as_ref(), status, &stacks_dir);
    if let Some(last) = driver.record.attempts.last_mut() {
        last.ended = Some(utc_rfc3339(SystemTime::now()));
        last.state = status.state();
        last.failure.clone_from(&failure);
        last.reports = machine.reports();
        last.reports_shed = machine.reports_shed();
    }
    driver.rundir.event(Event::AttemptEnded {
        attempt,
        state: status.state(),
        memory: driver.memory.newest(),
    })?;
    let end_unix = unix_time();
    let parts = machine.goodput(status, started_unix, end_unix);
    // An attempt before this one in this invocation: a restart or resize.
    let follows = run.attempts() > 0;
    goodput.push(
        attempt,
        status.state(),
        (started_unix, end_unix),
        parts,
        follows,
    );
    driver.rundir.write_goodput(goodput)?;
    Ok(AttemptEnd {
        status,
        failure,
        summary,
        last_metrics: machine.take_last_metrics(),
        memory_committed: machine.memory_committed(),
        hosts_launched: machine.hosts_launched(),
    })
}

/// Records that the attempt ended in an engine error (not a worker's
/// failure), so `run.json` never claims a dead run is running; returns the
/// error for the caller.
fn errored(rundir: &mut RunDir, record: &mut RunRecord, error: CoreError) -> CoreError {
    if let Some(last) = record.attempts.last_mut() {
        last.state = RunState::Errored;
        last.error = Some(error.to_string());
        last.ended = Some(utc_rfc3339(SystemTime::now()));
    }
    record.state = RunState::Errored;
    let _ = rundir.write_run(record);
    let _ = rundir.event(Event::RunEnded {
        attempt: None,
        state: RunState::Errored,
        error: Some(error.to_string()),
    });
    error
}

/// The file every host must read back from the run's storage before
/// anything starts (only with several hosts); removed when dropped.
struct StorageMarker {
    storage: std::path::PathBuf,
    path: std::path::PathBuf,
    expect: String,
}

impl StorageMarker {
    fn write(plan: &RunPlan, attempt: u32) -> Result<Option<Self>, CoreError> {
        // An object store is reached by URL from every host; the plan
        // checked this one answers.
        if plan.hosts < 2 || plan.remote_storage() {
            return Ok(None);
        }
        let Location::Local(dir) = plan.storage_dir() else {
            return Ok(None);
        };
        std::fs::create_dir_all(&dir).map_err(CoreError::io("cannot create", &dir))?;
        let expect = new_run_id()?;
        let path = dir.join(format!(".meshrun-storage-check-{attempt}"));
        std::fs::write(&path, &expect).map_err(CoreError::io("cannot write", &path))?;
        Ok(Some(Self {
            storage: plan.storage.clone().map_or_else(
                || {
                    plan.run_dir
                        .parent()
                        .map_or_else(|| plan.run_dir.clone(), std::path::Path::to_path_buf)
                },
                PathBuf::from,
            ),
            path,
            expect,
        }))
    }

    fn probe(&self) -> meshrun_machine::StorageProbe {
        meshrun_machine::StorageProbe {
            storage: self.storage.clone(),
            path: self.path.clone(),
            expect: self.expect.clone(),
        }
    }
}

impl Drop for StorageMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn new_run_id() -> Result<String, CoreError> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(TokenError::Random)?;
    Ok(hex::encode(bytes))
}

/// The account of an attempt that did not succeed, as the CLI prints it.
fn summary(
    plan: &RunPlan,
    machine: &Machine,
    output: Option<&super::output::Output>,
    status: OutcomeStatus,
    stacks_dir: &std::path::Path,
) -> Option<String> {
    use std::fmt::Write as _;
    match status {
        OutcomeStatus::Succeeded | OutcomeStatus::Resized { .. } => None,
        OutcomeStatus::Interrupted { signal } => Some(format!(
            "meshrun: run '{}' interrupted by {}; every worker was stopped. Logs: {}",
            plan.name,
            Signal::try_from(signal).map_or("a signal", |s| s.as_str()),
            plan.run_dir.join(names::LOGS).display()
        )),
        // A stop asked for reads as one, not as a signal's interruption.
        OutcomeStatus::Stopped { now } => Some(format!(
            "meshrun: run '{}' stopped by {}; every worker was stopped. Logs: {}",
            plan.name,
            if now {
                "`meshrun stop --now`"
            } else {
                "`meshrun stop`, with no checkpoint to end at"
            },
            plan.run_dir.join(names::LOGS).display()
        )),
        OutcomeStatus::Preempted { step } => Some(format!(
            "meshrun: run '{}' preempted: every worker saved checkpoint step-{step} and was \
             stopped; run it again with --name {} to resume from there",
            plan.name, plan.name
        )),
        OutcomeStatus::Failed => {
            let failure = machine.failure()?;
            let tail = output.map(|o| o.tail(failure.rank)).unwrap_or_default();
            let log = names::log_path(&plan.run_dir, failure.rank);
            let mut ends = machine.rank_ends();
            for end in &mut ends {
                end.last_line = output.and_then(|o| o.last_stderr_line(end.rank));
            }
            let mut text = render(&plan.name, &failure, &ends, &tail, &log);
            // Only what was written: a rank that had exited, or a group
            // stopped before the dump, leaves no stacks.
            if machine.stacks_dumped() && stacks::any_written(stacks_dir) {
                if matches!(
                    failure.cause,
                    Cause::Hang { .. } | Cause::Unresponsive { .. }
                ) {
                    let frames = stacks::frames(stacks_dir, machine.world());
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
                let _ = write!(text, "\n  stacks: {}", stacks_dir.display());
            }
            Some(text)
        }
    }
}
