//! The scale rig: fake hosts (agents) and their fake workers as async tasks
//! in one process, speaking the real protocol (the Noise handshake, sealed
//! frames, the same messages) to a real controller, so that thousands of
//! ranks fit on a small machine and what is measured is the controller,
//! not the machine's ability to run thousands of interpreters.
//!
//! One scenario per run: every host joins and its workers start; they
//! report once a second, and each host sends its heartbeat and its
//! workers' (`WorkerBeats`) and their step arrivals (`StepTimes`) once a
//! second; one rank fails and
//! every host is told to stop; the run restarts and every host joins again;
//! every rank writes its shard list of one checkpoint, which is committed;
//! the workers end. The rig notes when each thing happened, on the system
//! clock (the controller runs in another process on the same machine).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use meshrun_channel::{auth, Connection};
use meshrun_ckpt::manifest::{Leaf, ShardRecord};
use meshrun_protocol::token::{worker_key, Peer, Token};
use meshrun_protocol::{ExitInfo, FromAgent, FromWorker, ToAgent, WorkerLaunch};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// What the rig is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scenario {
    pub controller: SocketAddr,
    /// Host ranks the rig plays: `first_host..first_host + hosts`.
    pub hosts: u32,
    pub per_host: u32,
    /// The rank that fails, and at which of its reports at the earliest
    /// (attempt 1, once every rank has reported a step).
    pub fail_rank: u32,
    pub fail_at: u64,
    /// Attempt 2: every rank writes its part of this step at this report,
    /// and ends after `end_at` reports.
    pub checkpoint_at: u64,
    pub end_at: u64,
    /// Where the run's checkpoints go (`tmp-<step>` is made there first).
    pub checkpoints: std::path::PathBuf,
}

/// Unix seconds, as the rig saw each thing.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Timings {
    pub started: f64,
    /// Per attempt: the last host to get its `Launch`, and the last to get
    /// `Training` (every rank reported a step).
    pub launched: Vec<f64>,
    pub training: Vec<f64>,
    /// The failure was sent; the last host got its `Stop`.
    pub failed: f64,
    pub stop_first: f64,
    pub stop_last: f64,
    /// The last checkpoint part was sent.
    pub checkpoint_sent: f64,
    pub ended: f64,
    /// Messages the rig's workers and hosts sent.
    pub messages: u64,
    /// Per rank (of the rig's), reports sent in the last attempt.
    pub reports: HashMap<u32, u64>,
    pub errors: Vec<String>,
}

#[derive(Default)]
struct Shared {
    timings: Mutex<Timings>,
    messages: AtomicU64,
}

impl Shared {
    fn note(&self, f: impl FnOnce(&mut Timings)) {
        f(&mut self
            .timings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
    }
}

/// Notes now as attempt `attempt`'s time in `per_attempt`, when later
/// than what another host noted.
fn latest(per_attempt: &mut Vec<f64>, attempt: u32) {
    let i = attempt as usize - 1;
    if per_attempt.len() <= i {
        per_attempt.resize(i + 1, 0.0);
    }
    per_attempt[i] = per_attempt[i].max(unix_now());
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Plays every host of `scenario` until the run ends; returns what it saw.
pub async fn play(scenario: Scenario, token: Token) -> Timings {
    let shared = Arc::new(Shared::default());
    shared.note(|t| t.started = unix_now());
    let scenario = Arc::new(scenario);
    let mut hosts = tokio::task::JoinSet::new();
    for _ in 0..scenario.hosts {
        hosts.spawn(host(
            Arc::clone(&scenario),
            token.clone(),
            Arc::clone(&shared),
        ));
    }
    while let Some(done) = hosts.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("scale-rig: {e}");
                shared.note(|t| t.errors.push(e));
            }
            Err(e) => shared.note(|t| t.errors.push(format!("a host's task: {e}"))),
        }
    }
    let mut timings = shared
        .timings
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    timings.messages = shared.messages.load(Ordering::Relaxed);
    timings.ended = unix_now();
    timings
}

async fn connect(addr: SocketAddr, key: &Token, claim: Peer) -> Result<Connection, String> {
    // Thousands connect at once: a refused or reset connect is tried again.
    let mut last = String::new();
    for _ in 0..50 {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                match auth::connect_as(stream, key, claim).await {
                    Ok(conn) => return Ok(conn),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("cannot connect to {addr}: {last}"))
}

/// One fake agent, for every attempt of the run.
async fn host(scenario: Arc<Scenario>, token: Token, shared: Arc<Shared>) -> Result<(), String> {
    let mut rank: Option<u32> = None;
    let mut cut_short = 0;
    loop {
        let conn = connect(scenario.controller, &token, Peer::Run).await?;
        let mut launched = false;
        match attempt(&scenario, &token, &shared, conn, &mut rank, &mut launched).await {
            Ok(true) => cut_short = 0,
            Ok(false) => return Ok(()),
            // Between attempts the old listener may take a connection and
            // drop it: joining again is what `meshrun join` does too.
            Err(_) if !launched && cut_short < 20 => {
                cut_short += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One attempt of a fake agent; `Ok(true)` when another follows.
async fn attempt(
    scenario: &Arc<Scenario>,
    token: &Token,
    shared: &Arc<Shared>,
    mut conn: Connection,
    host: &mut Option<u32>,
    launched: &mut bool,
) -> Result<bool, String> {
    let err = |e: meshrun_protocol::ProtocolError| e.to_string();
    conn.send(&FromAgent::AgentHello {
        host: *host,
        host_ip: "127.0.0.1".into(),
        pid: std::process::id(),
        gpus: vec![],
        free_port: 1,
        controller: Some(scenario.controller.to_string()),
        replica_port: None,
    })
    .await
    .map_err(err)?;
    let (mut sink, mut stream) = conn.split();
    // What the workers send on the agent's connection (their exits).
    let (to_agent, mut from_workers) = mpsc::unbounded_channel::<FromAgent>();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut live: HashMap<u32, tokio::task::JoinHandle<()>> = HashMap::new();
    // When each worker reported each step, sent once a second (`StepTimes`)
    // as an agent reads them from its workers' step files.
    let arrivals: Arrivals = Arc::default();
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    let mut attempt_no = 0;
    let ended = loop {
        tokio::select! {
            msg = stream.recv::<ToAgent>() => match msg.map_err(err)? {
                ToAgent::HostAssigned { host: h, .. } => *host = Some(h),
                ToAgent::Refused { reason } => return Err(format!("refused: {reason}")),
                ToAgent::CheckStorage { .. } => {
                    sink.send(&FromAgent::StorageChecked { problem: None }).await.map_err(err)?;
                }
                ToAgent::Launch { attempt, workers, .. } => {
                    attempt_no = attempt;
                    *launched = true;
                    shared.note(|t| latest(&mut t.launched, attempt));
                    for w in workers {
                        let rank = w.rank;
                        sink.send(&FromAgent::WorkerStarted { rank, pid: 1, warm: false }).await.map_err(err)?;
                        let host = ToHost {
                            agent: to_agent.clone(),
                            stopped: stop_rx.clone(),
                            arrivals: Arc::clone(&arrivals),
                        };
                        let task = tokio::spawn(worker(
                            Arc::clone(scenario), token.clone(), Arc::clone(shared), w, attempt, host,
                        ));
                        live.insert(rank, task);
                    }
                }
                ToAgent::Training => {
                    shared.note(|t| latest(&mut t.training, attempt_no));
                }
                ToAgent::Stop { .. } => {
                    let now = unix_now();
                    shared.note(|t| {
                        if t.stop_first == 0.0 || now < t.stop_first {
                            t.stop_first = now;
                        }
                        t.stop_last = t.stop_last.max(now);
                    });
                    let _ = stop_tx.send(true);
                    for (rank, task) in live.drain() {
                        task.abort();
                        let exit = ExitInfo { code: None, signal: Some(15) };
                        sink.send(&FromAgent::WorkerExited { rank, exit, memory: None }).await.map_err(err)?;
                    }
                }
                ToAgent::Shutdown { again, .. } => return Ok(again),
                _ => {}
            },
            Some(msg) = from_workers.recv() => {
                if let FromAgent::WorkerExited { rank, .. } = &msg {
                    live.remove(rank);
                }
                shared.messages.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = sink.send(&msg).await {
                    break e;
                }
            }
            // The host's heartbeat and its workers', in one message, as
            // an agent sends them.
            _ = beat.tick() => {
                let mut ranks: Vec<u32> = live.keys().copied().collect();
                ranks.sort_unstable();
                let msg = if ranks.is_empty() { FromAgent::Heartbeat } else { FromAgent::WorkerBeats { ranks } };
                shared.messages.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = sink.send(&msg).await {
                    break e;
                }
                let times = std::mem::take(&mut *arrivals.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
                if !times.is_empty() {
                    shared.messages.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = sink.send(&FromAgent::StepTimes { times }).await {
                        break e;
                    }
                }
            }
        }
    };
    // The controller closed its side after its last word: a shutdown that
    // was on its way when this side wrote.
    loop {
        match stream.recv().await {
            Ok(ToAgent::Shutdown { again, .. }) => return Ok(again),
            Ok(_) => {}
            Err(_) => return Err(err(ended)),
        }
    }
}

/// A host's workers' (rank, step, Unix ns) since its last `StepTimes`.
type Arrivals = Arc<std::sync::Mutex<Vec<(u32, u64, i64)>>>;

/// What ties a fake worker to its host: the agent's connection (its
/// exit), the host's stop, and its step arrivals.
struct ToHost {
    agent: mpsc::UnboundedSender<FromAgent>,
    stopped: watch::Receiver<bool>,
    arrivals: Arrivals,
}

/// One fake worker: a report a second (its heartbeat goes through its
/// host); fails, saves its
/// part of a checkpoint or ends as the scenario says.
async fn worker(
    scenario: Arc<Scenario>,
    token: Token,
    shared: Arc<Shared>,
    launch: WorkerLaunch,
    attempt: u32,
    host: ToHost,
) {
    let ToHost {
        agent,
        mut stopped,
        arrivals,
    } = host;
    let rank = launch.rank;
    // As a real worker: with the credential of its rank, not the token.
    let claim = Peer::Worker { attempt, rank };
    let key = worker_key(&token, attempt, rank);
    let Ok(mut conn) = connect(scenario.controller, &key, claim).await else {
        shared.note(|t| t.errors.push(format!("rank {rank} could not connect")));
        return;
    };
    let count = |shared: &Shared| shared.messages.fetch_add(1, Ordering::Relaxed);
    if conn
        .send(&FromWorker::WorkerHello {
            rank,
            attempt,
            pid: 1,
        })
        .await
        .is_err()
    {
        return;
    }
    count(&shared);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut step = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return,
        }
        // The failure comes once every rank has trained a step (some host
        // got `Training`), so that the start is measured whole.
        let trained = || {
            shared
                .timings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .training
                .first()
                .is_some_and(|t| *t > 0.0)
        };
        if attempt == 1 && rank == scenario.fail_rank && step >= scenario.fail_at && trained() {
            let _ = conn
                .send(&FromWorker::Failure {
                    kind: "RuntimeError".into(),
                    message: "injected by the scale rig".into(),
                    traceback: "Traceback (most recent call last):\nRuntimeError: injected by the scale rig".into(),
                })
                .await;
            let now = unix_now();
            shared.note(|t| t.failed = now);
            drop(conn);
            let exit = ExitInfo {
                code: Some(1),
                signal: None,
            };
            let _ = agent.send(FromAgent::WorkerExited {
                rank,
                exit,
                memory: None,
            });
            return;
        }
        if attempt > 1 && step == scenario.checkpoint_at {
            let leaf = Leaf {
                path: "params/w".into(),
                dtype: "float32".into(),
                shape: vec![(scenario.hosts + 1) as usize * scenario.per_host as usize],
                shards: vec![ShardRecord {
                    file: format!("rank-{rank}.safetensors"),
                    tensor: "w:0".into(),
                    region: vec![(rank as usize, rank as usize + 1)],
                    rank: None,
                }],
            };
            let _ = std::fs::create_dir_all(scenario.checkpoints.join(format!("tmp-{step}")));
            let msg = FromWorker::CheckpointWritten {
                step,
                leaves: vec![leaf],
                files: None,
                extra: None,
            };
            if conn.send(&msg).await.is_err() {
                return;
            }
            count(&shared);
            let now = unix_now();
            shared.note(|t| t.checkpoint_sent = t.checkpoint_sent.max(now));
        }
        let report = FromWorker::Report {
            step: Some(step),
            metrics: serde_json::json!({"step": step, "loss": 1.0 / (step + 1) as f64}),
            checkpoint: false,
            timing: None,
            saving: false,
            total_steps: None,
        };
        // Its heartbeat goes through its host (`WorkerBeats`), and so does
        // when it reported (`StepTimes`).
        let ns = (unix_now() * 1e9) as i64;
        if conn.send(&report).await.is_err() {
            return;
        }
        arrivals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((rank, step, ns));
        count(&shared);
        shared
            .note(|t| *t.reports.entry(rank).or_insert(0) = if attempt > 1 { step + 1 } else { 0 });
        step += 1;
        if attempt > 1 && step >= scenario.end_at {
            let _ = conn.send(&FromWorker::Bye).await;
            drop(conn);
            let exit = ExitInfo {
                code: Some(0),
                signal: None,
            };
            let _ = agent.send(FromAgent::WorkerExited {
                rank,
                exit,
                memory: None,
            });
            return;
        }
    }
}
