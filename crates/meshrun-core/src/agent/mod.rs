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

pub mod join;
mod scratch;
mod spawn;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::net::TcpSocket;
use tokio::sync::mpsc;

use crate::error::CoreError;
use crate::gpu::Inventory;
use crate::leftovers::{Contained, Containment};
use crate::process::{signal_group, signal_process};
use crate::protocol::{auth, Connection, Message, STACK_DUMP_WAIT};
use crate::token::Token;
use scratch::RunScratch;
pub use scratch::{append_base64 as decode_function_part, scratch_root};

/// Longer lines are forwarded in pieces of this size.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// After a worker exits, how long its output may still take to drain
/// before the exit is reported anyway (a grandchild may hold the pipe).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

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
}

/// How one session with the controller ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The run is over.
    Over,
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

/// Connects to the controller and proves the token; gives the address
/// the connection left from.
async fn connect(cfg: &AgentConfig) -> Result<(Connection, IpAddr), CoreError> {
    let net = |what| move |source| CoreError::Net { what, source };
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
    let conn = auth::connect(stream, &cfg.token)
        .await
        .map_err(|e| CoreError::HandshakeFailed {
            controller: cfg.controller,
            why: e.to_string(),
        })?;
    Ok((conn, local))
}

/// Runs one session: from the hello to the end of the attempt (or of the
/// connection). Returns the host rank it had, when it got one.
pub async fn run(cfg: &AgentConfig) -> Result<(Ended, Option<u32>), CoreError> {
    let (conn, local) = connect(cfg).await?;
    session(cfg, conn, local).await
}

/// `host_ip`: the address this host is known by, the one its connection
/// left from.
async fn session(
    cfg: &AgentConfig,
    mut conn: Connection,
    host_ip: IpAddr,
) -> Result<(Ended, Option<u32>), CoreError> {
    let net = |what| move |source| CoreError::Net { what, source };
    let gpus = Inventory::discover().map(|inv| inv.ids).unwrap_or_default();
    let free_port = std::net::TcpListener::bind(SocketAddr::new(host_ip, 0))
        .and_then(|l| l.local_addr())
        .map_err(net("cannot find a free port"))?
        .port();
    conn.send(&Message::AgentHello {
        host: cfg.host,
        host_ip: host_ip.to_string(),
        pid: std::process::id(),
        gpus,
        free_port,
        controller: Some(cfg.controller.to_string()),
    })
    .await?;

    let (mut sink, mut from_controller) = conn.split();
    let (events_tx, mut events) = mpsc::unbounded_channel::<Message>();
    let containment = Arc::new(Containment::detect(OWN_PROCESS.load(Ordering::Relaxed)));
    // rank -> every worker that has not been reported as exited.
    let mut live: HashMap<u32, Contained> = HashMap::new();
    let mut host = cfg.host;
    // The function as its parts come; a part that does not decode fails
    // the launch with the reason rather than start workers on half a file.
    let mut function: Result<Vec<u8>, String> = Ok(Vec::new());
    let mut run: Option<RunScratch> = None;
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    let ended = loop {
        tokio::select! {
            msg = from_controller.recv() => match msg {
                Ok(Message::HostAssigned { host: given }) => host = Some(given),
                Ok(Message::Refused { reason }) => return Err(CoreError::JoinRefused(reason)),
                Ok(Message::CheckStorage { path, expect }) => {
                    let problem = scratch::check_marker(&path, &expect);
                    let _ = events_tx.send(Message::StorageChecked { problem });
                }
                Ok(Message::FunctionPart { data, last: _ }) => {
                    if let Ok(bytes) = &mut function {
                        if let Err(e) = scratch::append_base64(bytes, &data) {
                            function = Err(format!("the function sent by the controller did not decode: {e}"));
                        }
                    }
                }
                Ok(Message::Launch { run_id, workers, attempt }) => {
                    let scratch = RunScratch::new(&cfg.scratch, &run_id, attempt);
                    let prepared = std::mem::replace(&mut function, Ok(Vec::new()))
                        .and_then(|bytes| scratch.prepare(bytes));
                    for w in workers {
                        let extra = match &prepared {
                            Ok(()) => scratch.worker_env(&w.env),
                            Err(e) => {
                                let _ = events_tx.send(Message::SpawnFailed { rank: w.rank, error: e.clone() });
                                continue;
                            }
                        };
                        if let Some(worker) = spawn::spawn_worker(&w, &extra, &events_tx, &containment) {
                            live.insert(w.rank, worker);
                        }
                    }
                    tracing::debug!(attempt, "launched");
                    run = Some(scratch);
                }
                Ok(Message::Stop { grace_ms, dump_stacks }) => {
                    let pids = live.iter().map(|(&rank, w)| (rank, w.pid)).collect();
                    let stacks = run.as_ref().filter(|_| dump_stacks).map(RunScratch::stacks_reader);
                    stop(pids, Duration::from_millis(grace_ms), stacks, events_tx.clone());
                }
                Ok(Message::Shutdown { again }) => break if again { Ended::Again } else { Ended::Over },
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(?host, "controller connection lost ({e}); stopping workers");
                    break Ended::Lost;
                }
            },
            Some(event) = events.recv() => {
                if let Message::WorkerExited { rank, .. } = &event {
                    live.remove(rank);
                }
                if sink.send(&event).await.is_err() {
                    break Ended::Lost;
                }
            }
            _ = heartbeat.tick() => {
                if sink.send(&Message::Heartbeat).await.is_err() {
                    break Ended::Lost;
                }
            }
        }
    };
    let live: Vec<Contained> = live.into_values().collect();
    containment.end_all(&live).await;
    if ended == Ended::Over {
        if let Some(run) = run {
            run.remove();
        }
    }
    Ok((ended, host))
}

/// SIGTERM to every group, SIGKILL after the grace: JAX workers catch
/// SIGTERM (preemption notifier) and may never act on it. With stacks to
/// collect, SIGUSR1 to each worker process first (not its group: only
/// meshrun's worker code handles it), a moment to write, and what each
/// wrote goes to the controller before any exit is reported.
fn stop(
    pids: Vec<(u32, u32)>,
    grace: Duration,
    stacks: Option<scratch::StacksReader>,
    events: mpsc::UnboundedSender<Message>,
) {
    tokio::spawn(async move {
        if let Some(stacks) = &stacks {
            for &(_, pid) in &pids {
                signal_process(pid, Signal::SIGUSR1);
            }
            tokio::time::sleep(STACK_DUMP_WAIT).await;
            for &(rank, _) in &pids {
                if let Some(text) = stacks.read(rank) {
                    let _ = events.send(Message::Stacks { rank, text });
                }
            }
        }
        for &(_, pid) in &pids {
            signal_group(pid, Signal::SIGTERM);
        }
        tokio::time::sleep(grace).await;
        for (_, pid) in pids {
            signal_group(pid, Signal::SIGKILL);
        }
    });
}
