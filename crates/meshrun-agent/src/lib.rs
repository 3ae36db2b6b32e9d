//! The agent: one per host. It dials the controller, proves the run token,
//! starts the workers it is told to start, forwards their output and exits,
//! and stops them on command. If the controller goes away, the agent kills
//! its workers: a worker never outlives its attempt, and nothing a worker
//! started outlives the worker (see `leftovers`).
//!
//! Hosts need not share anything but the network and the run's storage:
//! what the controller sends (the function of `Trainer.fit`) is written to
//! the host's own scratch folder, and what the workers leave there (their
//! stacks) travels back over the connection. An agent that joined by
//! itself (`meshrun join`, see `join`) takes part in every attempt.

mod beats;
pub mod cgroup;
mod coordinator_port;
mod error;
mod executables;
pub mod join;
mod last_words;
pub mod leftovers;
mod memory;
mod memory_tasks;
mod news;
pub mod process;
mod scratch;
mod session;
mod spares;
mod spawn;
mod spawn_problem;
mod steps;
mod stopping;
mod transfer;
mod worker_memory;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use meshrun_channel::{auth, Connection};
use meshrun_protocol::token::Token;
use meshrun_protocol::{FromAgent, ToAgent};
use tokio::net::TcpSocket;
use tokio::sync::mpsc;

use crate::leftovers::{Contained, Containment};
pub use error::AgentError;
pub use memory::{memory_root, MEMORY_ENV};
use meshrun_plan::gpu::Inventory;
pub use news::News;
use scratch::RunScratch;
pub use scratch::{append_base64 as decode_function_part, scratch_root};
use session::{Action, Input, Session};
pub use spares::Spares;
pub use steps::unix_ns;

/// Longer lines are forwarded in pieces of this size.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Output lines queued for the controller (at most 64 MiB of them).
const OUTPUT_QUEUE: usize = 1024;

/// After a worker exits, how long its output may still take to drain
/// before the exit is reported anyway (a grandchild may hold the pipe).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// How long a session's end waits for its killed workers to be reaped
/// (SIGKILL takes effect at once unless a process is stuck in the kernel).
const REAPED_WITHIN: Duration = Duration::from_secs(5);

/// How often the agent tells the controller it is there: a host whose
/// agent and workers all fall silent is cut off.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub controller: SocketAddr,
    pub token: Token,
    /// This host's rank; `None`: the controller assigns one.
    pub host: Option<u32>,
    /// The address the control connection is made from (a separate
    /// machine's, in the local backend); `None`: whichever the route gives.
    pub host_ip: Option<IpAddr>,
    /// The host's scratch folder ([`scratch_root`]).
    pub scratch: PathBuf,
    /// Warm spares, kept by whoever outlives the attempts; `None`: this
    /// agent lives for one attempt, and its spares would die with it.
    pub spares: Option<Spares>,
    /// Told what happens, for a person watching (`meshrun join`); `None`:
    /// the controller says it all (an agent it started).
    pub news: Option<fn(&News)>,
    /// This host has taken part in an attempt of the run already.
    pub rejoining: bool,
}

/// How one session with the controller ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The run is over, in this state (a `RunState` name) when the
    /// controller said.
    Over(Option<String>),
    /// The attempt is over and another follows.
    Again,
    /// The connection broke: the controller or the network went away.
    Lost,
}

/// Set by [`runtime`]: this process is an agent and nothing else, so it
/// may become the subreaper of its workers' descendants.
static OWN_PROCESS: AtomicBool = AtomicBool::new(false);

/// The runtime an agent process (`meshrun agent`, `meshrun join`) runs on:
/// one thread is plenty. Only such a process calls it, so it also marks
/// the process as an agent's own (an agent inside the controller's process
/// never is).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    OWN_PROCESS.store(true, Ordering::Relaxed);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The containment of an agent process's workers: one for the process, so
/// that every session of a host that joins attempt after attempt shares
/// it. Per session, the end of one attempt's worker (its leftovers ended
/// after the next attempt had started) took the next attempt's workers,
/// which that containment did not know, for orphans and killed them. An
/// agent inside the controller's process lives for one attempt and is no
/// subreaper: it gets its own.
fn containment(spares: Option<Spares>) -> Arc<Containment> {
    static SHARED: OnceLock<Arc<Containment>> = OnceLock::new();
    if OWN_PROCESS.load(Ordering::Relaxed) {
        Arc::clone(SHARED.get_or_init(|| Arc::new(Containment::detect(true, spares))))
    } else {
        Arc::new(Containment::detect(false, spares))
    }
}

/// Connects to the controller and proves the token; gives the address
/// the connection left from.
async fn connect(cfg: &AgentConfig) -> Result<(Connection, IpAddr), AgentError> {
    let net = |what| move |source| AgentError::Net { what, source };
    let socket = match cfg.controller.ip() {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(net("cannot open agent socket"))?;
    if let Some(ip) = cfg.host_ip {
        socket
            .bind(SocketAddr::new(ip, 0))
            .map_err(net("cannot bind the agent to its host address"))?;
    }
    let stream = socket
        .connect(cfg.controller)
        .await
        .map_err(net("cannot reach the controller"))?;
    let local = stream
        .local_addr()
        .map_err(net("cannot read the agent's address"))?
        .ip();
    let conn =
        auth::connect(stream, &cfg.token)
            .await
            .map_err(|e| AgentError::HandshakeFailed {
                controller: cfg.controller,
                why: e.to_string(),
            })?;
    Ok((conn, local))
}

/// Runs one session: from the hello to the end of the attempt (or of the
/// connection). Returns the host rank it had, when it got one.
pub async fn run(cfg: &AgentConfig) -> Result<(Ended, Option<u32>), AgentError> {
    let (conn, local) = connect(cfg).await?;
    session(cfg, conn, local).await
}

/// `host_ip`: the address this host is known by, the one its connection
/// left from.
async fn session(
    cfg: &AgentConfig,
    mut conn: Connection,
    host_ip: IpAddr,
) -> Result<(Ended, Option<u32>), AgentError> {
    let net = |what| move |source| AgentError::Net { what, source };
    let gpus = Inventory::discover().map(|inv| inv.ids).unwrap_or_default();
    // Held until the session ends: see `coordinator_port`.
    let coordinator_port =
        coordinator_port::reserve(host_ip).map_err(net("cannot find a free port"))?;
    let free_port = coordinator_port.port;
    // Other hosts' agents bring their memory checkpoints' replicas here.
    let memory_root = memory::memory_root(&cfg.scratch);
    let replicas = tokio::net::TcpListener::bind(SocketAddr::new(host_ip, 0))
        .await
        .map_err(net("cannot open the replica port"))?;
    let replica_port = replicas
        .local_addr()
        .map_err(net("cannot read the replica port"))?
        .port();
    let serving = tokio::spawn(memory::serve(
        replicas,
        cfg.token.clone(),
        memory_root.clone(),
        cfg.scratch.clone(),
    ));
    let _serving = AbortOnDrop(serving);
    conn.send(&FromAgent::AgentHello {
        host: cfg.host,
        host_ip: host_ip.to_string(),
        pid: std::process::id(),
        gpus,
        free_port,
        controller: Some(cfg.controller.to_string()),
        replica_port: Some(replica_port),
    })
    .await?;

    let (mut sink, mut from_controller) = conn.split();
    let (events_tx, mut events) = mpsc::unbounded_channel::<FromAgent>();
    // The workers' output has its own queue, bounded (see
    // `spawn::forward_lines`); what else goes to the controller is rare.
    let (lines_tx, mut lines) = mpsc::channel::<FromAgent>(OUTPUT_QUEUE);
    let containment = containment(cfg.spares.clone());
    // What is decided; below, only what it says is done.
    let mut s = Session::new(cfg.controller, cfg.host, cfg.rejoining);
    // rank -> every worker that has not been reported as exited.
    let mut live: HashMap<u32, Contained> = HashMap::new();
    let mut run: Option<RunScratch> = None;
    // The spares to start once the attempt trains.
    let mut refill = None;
    // The launched attempt's memory tier on this host.
    let mut mem: Option<memory::HostMemory> = None;
    let offered = Arc::new(executables::Offered::default());
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    let mut step_times: Option<steps::StepReader> = None;
    let mut worker_beats: Option<beats::BeatReader> = None;
    let mut memory_sampler = worker_memory::Sampler::default();
    let tell = |news: News| {
        if let Some(say) = cfg.news {
            say(&news);
        }
    };
    // A send failed: what the controller said before the break may still
    // be readable (`last_words`).
    let mut send_failed = false;
    // Stops under way end with the session: what they would still signal
    // by pid is ended below, and a pid outliving its session may be reused.
    let mut stopping: Vec<AbortOnDrop> = Vec::new();
    let ended = 'session: loop {
        while let Some(action) = s.poll_action() {
            match action {
                Action::End(ended) => break 'session ended,
                Action::Refused(reason) => return Err(AgentError::JoinRefused(reason)),
                Action::Tell(news) => tell(news),
                Action::Send(msg) => {
                    if sink.send(&msg).await.is_err() {
                        send_failed = true;
                        s.handle(Input::SendFailed);
                    }
                }
                Action::SendStepTimes { offset_ns } => {
                    if let Some(reader) = &mut step_times {
                        let times = reader.read_new(offset_ns);
                        if !times.is_empty()
                            && sink.send(&FromAgent::StepTimes { times }).await.is_err()
                        {
                            send_failed = true;
                            s.handle(Input::SendFailed);
                        }
                    }
                }
                Action::CheckStorage { path, expect } => {
                    let problem = scratch::check_marker(&path, &expect);
                    let _ = events_tx.send(FromAgent::StorageChecked { problem });
                }
                Action::Launch {
                    attempt,
                    run_id,
                    workers,
                    spares: imports,
                    function,
                } => {
                    let scratch = RunScratch::new(&cfg.scratch, &run_id, attempt);
                    let m = memory::HostMemory::new(&memory_root, &run_id, s.host().unwrap_or(0));
                    let memory_env = (
                        memory::MEMORY_ENV.to_string(),
                        m.own().display().to_string(),
                    );
                    mem = Some(m);
                    let prepared = function.and_then(|bytes| scratch.prepare(bytes));
                    let pool = cfg.spares.as_ref().filter(|_| imports.is_some());
                    let mut launched = Vec::new();
                    for w in workers {
                        let extra = match &prepared {
                            Ok(()) => {
                                let mut extra = scratch.worker_env(&w.env);
                                extra.push(memory_env.clone());
                                extra
                            }
                            Err(e) => {
                                let _ = events_tx.send(session::not_started(w.rank, e.clone()));
                                continue;
                            }
                        };
                        let worker =
                            spawn::start(&w, &extra, pool, &events_tx, &lines_tx, &containment)
                                .await;
                        if let Some(worker) = worker {
                            live.insert(w.rank, worker);
                        }
                        launched.push((w, extra));
                    }
                    if let (Some(pool), Some(imports)) = (pool.cloned(), imports) {
                        refill = Some((pool, launched, imports));
                    }
                    tracing::debug!(attempt, "launched");
                    tell(News::Attempt {
                        attempt,
                        ranks: live.keys().copied().collect(),
                    });
                    memory_sampler = worker_memory::Sampler::default();
                    step_times = Some(steps::StepReader::new(scratch.steps_dir()));
                    worker_beats = Some(beats::BeatReader::new(scratch.beats_dir()));
                    run = Some(scratch);
                }
                Action::PrepareMemory {
                    run_id,
                    step,
                    buddy,
                } => {
                    let m = memory::HostMemory::new(&memory_root, &run_id, s.host().unwrap_or(0));
                    let places = memory_tasks::ExecutablePlaces::of(&cfg.scratch, &run_id);
                    tokio::spawn(memory_tasks::prepare(
                        m,
                        step,
                        buddy,
                        cfg.token.clone(),
                        run_id,
                        places,
                        events_tx.clone(),
                    ));
                }
                Action::CommitMemory {
                    run_id,
                    manifest,
                    buddy,
                } => {
                    if let Some(m) = mem.clone() {
                        let executables = (
                            memory_tasks::run_executables(&cfg.scratch, &run_id),
                            offered.clone(),
                        );
                        tokio::spawn(memory_tasks::commit(
                            m,
                            manifest,
                            buddy,
                            cfg.token.clone(),
                            run_id,
                            executables,
                            events_tx.clone(),
                        ));
                    }
                }
                Action::ReleaseMemory { step } => {
                    if let Some(m) = mem.clone() {
                        tokio::task::spawn_blocking(move || m.release(step));
                    }
                }
                Action::RefillSpares => {
                    if let Some((pool, launched, imports)) = refill.take() {
                        pool.refill(&launched, &imports);
                    }
                }
                Action::StopWorkers {
                    grace_ms,
                    dump_stacks,
                } => {
                    let pids = live.iter().map(|(&rank, w)| (rank, w.pid)).collect();
                    let stacks = run
                        .as_ref()
                        .filter(|_| dump_stacks)
                        .map(RunScratch::stacks_reader);
                    stopping.push(AbortOnDrop(stopping::stop(
                        pids,
                        Duration::from_millis(grace_ms),
                        stacks,
                        events_tx.clone(),
                    )));
                }
            }
        }
        tokio::select! {
            msg = from_controller.recv::<ToAgent>() => match msg {
                Ok(msg) => s.handle(Input::Controller { msg, now_ns: steps::unix_ns() }),
                Err(e) => {
                    tracing::debug!("controller connection lost ({e})");
                    s.handle(Input::ReadFailed(e.to_string()));
                }
            },
            Some(event) = events.recv() => {
                if let FromAgent::WorkerExited { rank, .. } = &event {
                    live.remove(rank);
                    // Its output was all queued before its exit was: it
                    // goes first, so the exit never overtakes its last lines.
                    // Only what is queued now: other ranks' forwarders refill
                    // the queue as it drains, and this must end.
                    for _ in 0..lines.len() {
                        let Ok(output) = lines.try_recv() else {
                            break;
                        };
                        if sink.send(&output).await.is_err() {
                            send_failed = true;
                            s.handle(Input::SendFailed);
                            break;
                        }
                    }
                    // Its last steps go before its exit, not after the
                    // controller has stopped listening for them.
                    if let Some(reader) = step_times.as_mut().filter(|_| !send_failed) {
                        let times = reader.read_new(s.clock_offset_ns());
                        if !times.is_empty() && sink.send(&FromAgent::StepTimes { times }).await.is_err() {
                            send_failed = true;
                            s.handle(Input::SendFailed);
                        }
                    }
                }
                if !send_failed && sink.send(&event).await.is_err() {
                    send_failed = true;
                    s.handle(Input::SendFailed);
                }
            }
            Some(output) = lines.recv() => {
                if sink.send(&output).await.is_err() {
                    send_failed = true;
                    s.handle(Input::SendFailed);
                }
            }
            _ = heartbeat.tick() => {
                // Its workers' heartbeats are the host's too.
                let beats = worker_beats.as_mut().map(beats::BeatReader::moved);
                s.handle(Input::Tick { beats, now_ns: steps::unix_ns() });
                if let Some(msg) = memory_sampler.on_tick(&live).filter(|_| !send_failed) {
                    if sink.send(&msg).await.is_err() {
                        send_failed = true;
                        s.handle(Input::SendFailed);
                    }
                }
            }
        }
    };
    let ended = if ended == Ended::Lost && send_failed {
        let words = last_words::shutdown_before_break(&mut from_controller).await;
        s.last_words(words, "it broke while this host was sending")
    } else {
        ended
    };
    while let Some(action) = s.poll_action() {
        if let Action::Tell(news) = action {
            tell(news);
        }
    }
    drop(stopping);
    let live: Vec<Contained> = live.into_values().collect();
    containment.end_all(&live).await;
    // This attempt's workers are gone before the next one's start.
    containment.reaped_all(REAPED_WITHIN).await;
    if let Ended::Over(_) = &ended {
        s.finish();
        while let Some(Action::Tell(news)) = s.poll_action() {
            tell(news);
        }
        if let Some(spares) = &cfg.spares {
            spares.close().await;
        }
        if let Some(run) = run {
            run.remove();
        }
        if let Some(m) = mem {
            m.remove_run();
        }
    }
    Ok((ended, s.host()))
}

/// Aborts a task when dropped: the replica server ends with the session.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
