//! The agent: one per host. It dials the controller, proves the run token,
//! starts the workers it is told to start, forwards their output and exits,
//! and stops them on command. If the controller goes away, the agent kills
//! its workers and exits: a worker never outlives its run, and nothing a
//! worker started outlives the worker (see `leftovers`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::TcpSocket;
use tokio::sync::mpsc;

use crate::cgroup::{self, WorkerCgroup};
use crate::error::CoreError;
use crate::gpu::Inventory;
use crate::leftovers::{Contained, Containment};
use crate::process::{exit_info, signal_group, signal_process};
use crate::protocol::{auth, Message, Stream, WorkerLaunch, STACK_DUMP_WAIT};
use crate::token::Token;

/// Longer lines are forwarded in pieces of this size.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// After a worker exits, how long its output may still take to drain
/// before the exit is reported anyway (a grandchild may hold the pipe).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub controller: SocketAddr,
    pub token: Token,
    pub host: u32,
    /// The address this host is known by; the control connection is made
    /// from it, as from a separate machine.
    pub host_ip: IpAddr,
}

/// Set by [`runtime`]: this process is an agent and nothing else, so it
/// may become the subreaper of its workers' descendants.
static OWN_PROCESS: AtomicBool = AtomicBool::new(false);

/// The runtime an agent process (`meshrun agent`) runs on: one thread is
/// plenty. Only such a process calls it, so it also marks the process as
/// an agent's own (an agent inside the controller's process never is).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    OWN_PROCESS.store(true, Ordering::Relaxed);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Runs an agent until the controller says the run is over or goes away.
pub async fn run(cfg: AgentConfig) -> Result<(), CoreError> {
    let net = |what| move |source| CoreError::Net { what, source };
    let socket = match cfg.host_ip {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(net("cannot open agent socket"))?;
    socket
        .bind(SocketAddr::new(cfg.host_ip, 0))
        .map_err(net("cannot bind the agent to its host address"))?;
    let stream = socket
        .connect(cfg.controller)
        .await
        .map_err(net("cannot reach the controller"))?;
    let mut conn = auth::connect(stream, &cfg.token).await?;
    let gpus = Inventory::discover().map(|inv| inv.ids).unwrap_or_default();
    let free_port = std::net::TcpListener::bind(SocketAddr::new(cfg.host_ip, 0))
        .and_then(|l| l.local_addr())
        .map_err(net("cannot find a free port"))?
        .port();
    conn.send(&Message::AgentHello {
        host: cfg.host,
        host_ip: cfg.host_ip.to_string(),
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
    loop {
        tokio::select! {
            msg = from_controller.recv() => match msg {
                Ok(Message::Launch { workers, .. }) => {
                    for w in workers {
                        if let Some(worker) = spawn_worker(&w, &events_tx, &containment) {
                            live.insert(w.rank, worker);
                        }
                    }
                }
                Ok(Message::Stop { grace_ms, dump_stacks }) => {
                    stop(live.values().map(|w| w.pid).collect(), Duration::from_millis(grace_ms), dump_stacks);
                }
                Ok(Message::Shutdown) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(host = cfg.host, "controller connection lost ({e}); stopping workers");
                    break;
                }
            },
            Some(event) = events.recv() => {
                if let Message::WorkerExited { rank, .. } = &event {
                    live.remove(rank);
                }
                if sink.send(&event).await.is_err() {
                    break;
                }
            }
        }
    }
    let live: Vec<Contained> = live.into_values().collect();
    containment.end_all(&live).await;
    Ok(())
}

/// SIGTERM to every group, SIGKILL after the grace: JAX workers catch
/// SIGTERM (preemption notifier) and may never act on it. With
/// `dump_stacks`, SIGUSR1 to each worker process first (not its group:
/// only meshrun's worker code handles it), and a moment to write.
fn stop(pids: Vec<u32>, grace: Duration, dump_stacks: bool) {
    tokio::spawn(async move {
        if dump_stacks {
            for &pid in &pids {
                signal_process(pid, Signal::SIGUSR1);
            }
            tokio::time::sleep(STACK_DUMP_WAIT).await;
        }
        for &pid in &pids {
            signal_group(pid, Signal::SIGTERM);
        }
        tokio::time::sleep(grace).await;
        for pid in pids {
            signal_group(pid, Signal::SIGKILL);
        }
    });
}

/// Starts one worker as the leader of its own process group, in a cgroup
/// of its own where there are cgroups, and returns it; a worker that
/// cannot start is reported, not fatal to the agent.
fn spawn_worker(
    w: &WorkerLaunch,
    events: &mpsc::UnboundedSender<Message>,
    containment: &Arc<Containment>,
) -> Option<Contained> {
    let Some((program, args)) = w.argv.split_first() else {
        let _ = events.send(Message::SpawnFailed {
            rank: w.rank,
            error: "empty command".into(),
        });
        return None;
    };
    let command = || {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(w.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&w.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        cmd
    };
    let mut cgroup = containment.cgroup_for(w.rank);
    let spawned = match cgroup.as_ref().map(|cg| spawn_in(command(), cg)) {
        None => command().spawn(),
        Some(Ok(child)) => Ok(child),
        // Joining may have failed, or the program may be missing: once
        // more without the cgroup tells which.
        Some(Err(first)) => {
            if let Some(cg) = cgroup.take() {
                cg.try_remove();
            }
            command().spawn().inspect(|_| {
                tracing::warn!(rank = w.rank, "worker not put in its cgroup: {first}");
            })
        }
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = events.send(Message::SpawnFailed {
                rank: w.rank,
                error: format!("cannot start '{program}': {e}"),
            });
            return None;
        }
    };
    let pid = child.id().unwrap_or_default();
    containment.started(pid, w.rank);
    let _ = events.send(Message::WorkerStarted { rank: w.rank, pid });
    let rank = w.rank;
    let worker = Contained {
        pid,
        cgroup: cgroup.map(Arc::new),
    };
    let contained = worker.clone();
    let containment = Arc::clone(containment);
    let events = events.clone();
    let out = child
        .stdout
        .take()
        .map(|s| forward_lines(s, rank, Stream::Stdout, events.clone()));
    let err = child
        .stderr
        .take()
        .map(|s| forward_lines(s, rank, Stream::Stderr, events.clone()));
    tokio::spawn(async move {
        let exit = match child.wait().await {
            Ok(status) => exit_info(status),
            Err(_) => crate::protocol::ExitInfo {
                code: None,
                signal: None,
            },
        };
        containment.reaped(pid);
        // Before draining: a leftover holding the output pipe would
        // otherwise keep it open for the whole grace.
        let ended = containment.end(&contained).await;
        if !ended.pids.is_empty() {
            let _ = events.send(Message::LeftoversEnded {
                rank,
                pids: ended.pids,
                how: ended.how.to_string(),
            });
        }
        for task in [out, err].into_iter().flatten() {
            let _ = tokio::time::timeout(DRAIN_GRACE, task).await;
        }
        let _ = events.send(Message::WorkerExited { rank, exit });
    });
    Some(worker)
}

/// Spawns `cmd` so that the child joins `cgroup` before it execs: nothing
/// the worker forks can start outside it.
fn spawn_in(
    mut cmd: tokio::process::Command,
    cgroup: &WorkerCgroup,
) -> std::io::Result<tokio::process::Child> {
    let procs = cgroup.opener()?;
    let fd = procs.as_raw_fd();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs between fork and exec and only makes one
    // write(2) on `fd`, which stays open until `spawn` has returned.
    unsafe {
        cmd.pre_exec(move || cgroup::join(fd));
    }
    let child = cmd.spawn();
    drop(procs);
    child
}

fn forward_lines(
    reader: impl AsyncRead + Unpin + Send + 'static,
    rank: u32,
    stream: Stream,
    events: mpsc::UnboundedSender<Message>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        // The bytes of a character cut at the end of a piece, for the next.
        let mut carry = Vec::new();
        // A piece with `more` was sent: the line must still be ended.
        let mut open = false;
        loop {
            buf.clear();
            buf.append(&mut carry);
            let n = read_line_capped(&mut reader, &mut buf, MAX_LINE_BYTES)
                .await
                .unwrap_or(0);
            let eof = n == 0;
            if eof && buf.is_empty() && !open {
                break;
            }
            let ended = eof || buf.last() == Some(&b'\n');
            if ended {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
            } else {
                carry = split_cut_char(&mut buf);
            }
            let line = String::from_utf8_lossy(&buf).into_owned();
            let more = !ended;
            if events
                .send(Message::Log {
                    rank,
                    stream,
                    line,
                    more,
                })
                .is_err()
                || eof
            {
                break;
            }
            open = more;
        }
    })
}

/// Splits off a UTF-8 character that a piece's end cut in two, so each
/// piece decodes whole.
fn split_cut_char(buf: &mut Vec<u8>) -> Vec<u8> {
    match std::str::from_utf8(buf) {
        Err(e) if e.error_len().is_none() => buf.split_off(e.valid_up_to()),
        _ => Vec::new(),
    }
}

/// Reads up to and including a newline, or `cap` bytes, whichever is first,
/// so a program that prints without newlines cannot exhaust memory.
async fn read_line_capped<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(total);
        }
        let room = cap - buf.len();
        let (take, done) = if let Some(i) = available.iter().take(room).position(|b| *b == b'\n') {
            (i + 1, true)
        } else {
            let n = available.len().min(room);
            (n, buf.len() + n >= cap)
        };
        buf.extend_from_slice(&available[..take]);
        reader.consume(take);
        total += take;
        if done {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_cut() {
        let data = [b'x'; 10];
        let mut reader = BufReader::new(&data[..]);
        let mut buf = Vec::new();
        assert_eq!(read_line_capped(&mut reader, &mut buf, 4).await.unwrap(), 4);
        buf.clear();
        assert_eq!(read_line_capped(&mut reader, &mut buf, 4).await.unwrap(), 4);
        buf.clear();
        assert_eq!(read_line_capped(&mut reader, &mut buf, 4).await.unwrap(), 2);
    }

    #[test]
    fn a_character_cut_by_a_piece_goes_to_the_next() {
        let mut buf = "ab\u{e9}".as_bytes().to_vec();
        buf.pop();
        assert_eq!(split_cut_char(&mut buf), vec![0xc3]);
        assert_eq!(buf, b"ab");
        let mut whole = b"abc".to_vec();
        assert!(split_cut_char(&mut whole).is_empty());
    }

    #[tokio::test]
    async fn lines_end_at_newline() {
        let data = b"ab\ncd\n".to_vec();
        let mut reader = BufReader::new(&data[..]);
        let mut buf = Vec::new();
        read_line_capped(&mut reader, &mut buf, 100).await.unwrap();
        assert_eq!(buf, b"ab\n");
    }
}
