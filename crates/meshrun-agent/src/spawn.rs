//! Starting a worker and forwarding its output, line by line.

use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meshrun_protocol::message::SpawnProblem;
use meshrun_protocol::{FromAgent, Stream, WorkerLaunch};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

use super::{DRAIN_GRACE, MAX_LINE_BYTES};
use crate::cgroup::{self, WorkerCgroup};
use crate::leftovers::{Contained, Containment};
use crate::process::exit_info;
use crate::spares::Spares;
use crate::worker_memory::WorkerMemory;

/// The longest a worker's exit waits for its output to be forwarded while
/// lines still move (the controller far behind): past it the exit goes.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Starts rank `w`'s worker: a warm spare of `pool` when it holds one
/// for the rank (moved into the rank's cgroup), else a new process.
pub(super) async fn start(
    w: &WorkerLaunch,
    extra_env: &[(String, String)],
    pool: Option<&Spares>,
    events: &mpsc::UnboundedSender<FromAgent>,
    lines: &mpsc::Sender<FromAgent>,
    containment: &Arc<Containment>,
) -> Option<Contained> {
    let adopted = match pool {
        Some(pool) => pool.adopt(w, extra_env).await,
        None => None,
    };
    let Some(mut spare) = adopted else {
        return spawn_worker(w, extra_env, events, lines, containment);
    };
    let pid = spare.child.id().unwrap_or_default();
    let cgroup = containment.cgroup_for(w.rank).filter(|cg| {
        cg.adopt(pid)
            .map_err(|e| tracing::warn!(rank = w.rank, "spare not moved into its cgroup: {e}"))
            .is_ok()
    });
    let memory = match containment.memory_for(w.rank, memory_limit(w), cgroup.as_ref()) {
        Ok(memory) => memory,
        Err(error) => {
            // The spare cannot take the rank: it goes (tokio reaps it).
            let _ = spare.child.start_kill();
            no_memory_limit(w.rank, error, cgroup, events);
            return None;
        }
    };
    if let Err(e) = memory.started(pid, true) {
        tracing::warn!(rank = w.rank, "spare not moved into its memory cgroup: {e}");
    }
    Some(watch(
        spare.child,
        w.rank,
        (cgroup, Some(memory)),
        true,
        events,
        lines,
        containment,
    ))
}

/// Starts one worker as the leader of its own process group, in a cgroup
/// of its own where there are cgroups, and returns it; a worker that
/// cannot start is reported, not fatal to the agent.
pub(super) fn spawn_worker(
    w: &WorkerLaunch,
    extra_env: &[(String, String)],
    events: &mpsc::UnboundedSender<FromAgent>,
    lines: &mpsc::Sender<FromAgent>,
    containment: &Arc<Containment>,
) -> Option<Contained> {
    let Some((program, args)) = w.argv.split_first() else {
        let _ = events.send(FromAgent::SpawnFailed {
            rank: w.rank,
            error: "empty command".into(),
            problem: SpawnProblem::Other,
        });
        return None;
    };
    if let Some((error, problem)) = missing_here(w) {
        let _ = events.send(FromAgent::SpawnFailed {
            rank: w.rank,
            error,
            problem,
        });
        return None;
    }
    let command = || {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            // The agent holds the run token; its workers never do (they
            // get their own credential, `MESHRUN_WORKER_KEY`).
            .env_remove(meshrun_protocol::token::TOKEN_ENV)
            .envs(w.env.iter().chain(extra_env).map(|(k, v)| (k, v)))
            .current_dir(&w.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        cmd
    };
    let mut cgroup = containment.cgroup_for(w.rank);
    let limit = memory_limit(w);
    let memory = match containment.memory_for(w.rank, limit, cgroup.as_ref()) {
        Ok(memory) => memory,
        Err(error) => {
            no_memory_limit(w.rank, error, cgroup, events);
            return None;
        }
    };
    let spawned = match spawn_in(command(), cgroup.as_ref(), &memory) {
        Ok(child) => Ok(child),
        // Joining may have failed, or the program may be missing: once
        // more without the cgroup tells which. Not where the limit needs
        // the cgroups: the worker would run unlimited.
        Err(first) if cgroup.is_some() && limit.is_none() => {
            if let Some(cg) = cgroup.take() {
                cg.try_remove();
            }
            command().spawn().inspect(|_| {
                tracing::warn!(rank = w.rank, "worker not put in its cgroup: {first}");
            })
        }
        Err(e) => Err(e),
    };
    if spawned.is_err() {
        memory.remove();
    }
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = events.send(FromAgent::SpawnFailed {
                rank: w.rank,
                error: format!("cannot start '{program}': {e}"),
                problem: super::spawn_problem::spawn_problem(&e),
            });
            return None;
        }
    };
    if let Err(e) = memory.started(child.id().unwrap_or_default(), false) {
        tracing::warn!(rank = w.rank, "worker's memory not counted: {e}");
    }
    Some(watch(
        child,
        w.rank,
        (cgroup, Some(memory)),
        false,
        events,
        lines,
        containment,
    ))
}

/// The memory limit the worker was launched with: on CPU its cgroup's
/// (on CUDA the limit is its GPU's, which its bootstrap sets in XLA).
fn memory_limit(w: &WorkerLaunch) -> Option<u64> {
    let var = |name: &str| {
        w.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if var("JAX_PLATFORMS") == Some("cuda") {
        return None;
    }
    var(meshrun_protocol::env::MEMORY_PER_PROC).and_then(|v| v.parse().ok())
}

/// A limit was asked for that this host cannot set: the worker is not
/// started, and why is said (the same on every attempt).
fn no_memory_limit(
    rank: u32,
    error: String,
    cgroup: Option<WorkerCgroup>,
    events: &mpsc::UnboundedSender<FromAgent>,
) {
    if let Some(cg) = cgroup {
        cg.try_remove();
    }
    let _ = events.send(FromAgent::SpawnFailed {
        rank,
        error,
        problem: SpawnProblem::NoMemoryLimit,
    });
}

/// What this host lacks to start `w`. Hosts share no filesystem unless
/// someone set it up: name what is missing here, rather than the program,
/// which the OS (or Python, for the script) blames.
fn missing_here(w: &WorkerLaunch) -> Option<(String, SpawnProblem)> {
    let cwd = std::path::Path::new(&w.cwd);
    if !cwd.is_dir() {
        let error = format!(
            "the run's working folder '{}' is not on this host: every host needs the \
             program and its folder at the same path as the controller's machine",
            w.cwd
        );
        return Some((error, SpawnProblem::NoWorkingFolder));
    }
    let script = w.script()?;
    if cwd.join(script).exists() {
        return None;
    }
    let error = format!(
        "the program '{script}' is not on this host (looked in '{}'): every host needs the \
         program and its folder at the same path as the controller's machine",
        w.cwd
    );
    Some((error, SpawnProblem::NoProgram))
}

/// Takes over a started worker (spawned here, or a warm spare that has
/// just been handed its attempt): reports it, forwards its output as the
/// rank's and reports its exit once the output is drained.
pub(super) fn watch(
    mut child: tokio::process::Child,
    rank: u32,
    (cgroup, memory): (Option<WorkerCgroup>, Option<WorkerMemory>),
    warm: bool,
    events: &mpsc::UnboundedSender<FromAgent>,
    lines: &mpsc::Sender<FromAgent>,
    containment: &Arc<Containment>,
) -> Contained {
    let pid = child.id().unwrap_or_default();
    containment.started(pid, rank);
    let _ = events.send(FromAgent::WorkerStarted { rank, pid, warm });
    let worker = Contained {
        pid,
        cgroup: cgroup.map(Arc::new),
        memory: memory.map(Arc::new),
    };
    let contained = worker.clone();
    let containment = Arc::clone(containment);
    let events = events.clone();
    let moved = Arc::new(AtomicU64::new(0));
    let out = child
        .stdout
        .take()
        .map(|s| forward_lines(s, rank, Stream::Stdout, lines.clone(), Arc::clone(&moved)));
    let err = child
        .stderr
        .take()
        .map(|s| forward_lines(s, rank, Stream::Stderr, lines.clone(), Arc::clone(&moved)));
    tokio::spawn(async move {
        let exit = match child.wait().await {
            Ok(status) => exit_info(status),
            Err(_) => meshrun_protocol::ExitInfo {
                code: None,
                signal: None,
            },
        };
        containment.reaped(pid);
        // Before its cgroup goes with what it left.
        let memory = contained.memory.as_ref().map(|m| m.end());
        // Before draining: a leftover holding the output pipe would
        // otherwise keep it open for the whole grace.
        let ended = containment.end(&contained).await;
        if let Some(m) = &contained.memory {
            crate::leftovers::memory_removed(m).await;
        }
        if !ended.pids.is_empty() {
            let _ = events.send(FromAgent::LeftoversEnded {
                rank,
                pids: ended.pids,
                how: ended.how.to_string(),
            });
        }
        let limit = tokio::time::Instant::now() + DRAIN_LIMIT;
        for task in [out, err].into_iter().flatten() {
            drain(task, &moved, limit).await;
        }
        let _ = events.send(FromAgent::WorkerExited { rank, exit, memory });
    });
    worker
}

/// Waits for a forwarding task to reach the end of its pipe. The grace
/// counts while no line moves (a grandchild holding the pipe, quiet);
/// while lines move, the queue to the controller is what is slow, and
/// the exit waits for them (up to `limit`) so it never overtakes them.
async fn drain(
    mut task: tokio::task::JoinHandle<()>,
    moved: &AtomicU64,
    limit: tokio::time::Instant,
) {
    loop {
        let before = moved.load(Ordering::Relaxed);
        let until = (tokio::time::Instant::now() + DRAIN_GRACE).min(limit);
        if tokio::time::timeout_at(until, &mut task).await.is_ok()
            || moved.load(Ordering::Relaxed) == before
            || tokio::time::Instant::now() >= limit
        {
            return;
        }
    }
}

/// Spawns `cmd` so that the child joins its cgroups (v2, and v1 memory)
/// before it execs: nothing the worker forks can start outside them.
fn spawn_in(
    mut cmd: tokio::process::Command,
    cgroup: Option<&WorkerCgroup>,
    memory: &WorkerMemory,
) -> std::io::Result<tokio::process::Child> {
    let procs = cgroup.map(WorkerCgroup::opener).transpose()?;
    let memory_procs = memory.opener()?;
    let fds: Vec<i32> = procs
        .iter()
        .chain(memory_procs.iter())
        .map(AsRawFd::as_raw_fd)
        .collect();
    if !fds.is_empty() {
        #[allow(unsafe_code)]
        // SAFETY: the closure runs between fork and exec and only makes one
        // write(2) on each fd, which stay open until `spawn` has returned;
        // iterating a Vec allocated before the fork allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                for fd in &fds {
                    cgroup::join(*fd)?;
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn();
    drop(procs);
    drop(memory_procs);
    child
}

/// Sends the worker's output, line by line, into `lines`, a bounded queue:
/// when the controller falls behind, this stops reading, the pipe fills and
/// the worker waits in its `print`; no line is lost and the backlog is not
/// the agent's memory.
fn forward_lines(
    reader: impl AsyncRead + Unpin + Send + 'static,
    rank: u32,
    stream: Stream,
    lines: mpsc::Sender<FromAgent>,
    moved: Arc<AtomicU64>,
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
            if lines
                .send(FromAgent::Log {
                    rank,
                    stream,
                    line,
                    more,
                })
                .await
                .is_err()
                || eof
            {
                break;
            }
            moved.fetch_add(1, Ordering::Relaxed);
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

    #[test]
    fn a_folder_or_script_missing_here_is_named_as_lasting() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.py"), "").unwrap();
        let launch = |cwd: &std::path::Path, script: &str| WorkerLaunch {
            rank: 1,
            argv: ["python3", "-m", "meshrun._bootstrap", "script", script]
                .map(String::from)
                .to_vec(),
            env: Vec::new(),
            cwd: cwd.display().to_string(),
        };
        assert_eq!(missing_here(&launch(dir.path(), "train.py")), None);
        let (error, problem) = missing_here(&launch(&dir.path().join("gone"), "train.py")).unwrap();
        assert_eq!(problem, SpawnProblem::NoWorkingFolder);
        assert!(error.starts_with("the run's working folder '"), "{error}");
        let (error, problem) = missing_here(&launch(dir.path(), "tain.py")).unwrap();
        assert_eq!(problem, SpawnProblem::NoProgram);
        assert!(
            error.starts_with("the program 'tain.py' is not on this host (looked in '"),
            "{error}"
        );
        assert!(problem.lasting());
    }

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
    async fn a_full_queue_holds_the_worker_back_and_loses_no_line() {
        use tokio::io::AsyncWriteExt as _;
        const LINES: usize = 10_000;
        let (mut worker, pipe) = tokio::io::duplex(4096);
        let (tx, mut rx) = mpsc::channel(8);
        let forwarding = forward_lines(pipe, 3, Stream::Stdout, tx, Arc::default());
        let printing = tokio::spawn(async move {
            for i in 0..LINES {
                worker
                    .write_all(format!("line {i}\n").as_bytes())
                    .await
                    .unwrap();
            }
        });
        // Nothing takes from the queue: it fills, the pipe fills, and the
        // worker waits in its write.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!printing.is_finished(), "the worker was not held back");
        assert_eq!(rx.len(), 8, "the queue grew past its bound");
        for i in 0..LINES {
            match rx.recv().await {
                Some(FromAgent::Log {
                    rank: 3,
                    line,
                    more: false,
                    ..
                }) => assert_eq!(line, format!("line {i}")),
                other => panic!("line {i}: {other:?}"),
            }
        }
        printing.await.unwrap();
        forwarding.await.unwrap();
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn lines_end_at_newline() {
        let data = b"ab\ncd\n".to_vec();
        let mut reader = BufReader::new(&data[..]);
        let mut buf = Vec::new();
        read_line_capped(&mut reader, &mut buf, 100).await.unwrap();
        assert_eq!(buf, b"ab\n");
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_waits_for_lines_that_still_move_and_not_for_a_quiet_pipe() {
        use tokio::io::AsyncWriteExt as _;
        use tokio::time::Instant;
        // The controller takes a line every 100 ms: 40 lines take 4 s, past
        // the grace, and the drain waits for all of them.
        let (mut worker, pipe) = tokio::io::duplex(64);
        let (tx, mut rx) = mpsc::channel(2);
        let moved = Arc::new(AtomicU64::new(0));
        let forwarding = forward_lines(pipe, 0, Stream::Stdout, tx, Arc::clone(&moved));
        tokio::spawn(async move {
            for i in 0..40 {
                worker
                    .write_all(format!("line {i}\n").as_bytes())
                    .await
                    .unwrap();
            }
        });
        let taking = tokio::spawn(async move {
            let mut n = 0;
            while rx.recv().await.is_some() {
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            n
        });
        let t0 = Instant::now();
        drain(forwarding, &moved, t0 + DRAIN_LIMIT).await;
        assert!(t0.elapsed() > DRAIN_GRACE * 3, "{:?}", t0.elapsed());
        assert_eq!(taking.await.unwrap(), 40, "every line went before the exit");

        // A pipe that stays open with nothing in it (a grandchild holds it)
        // is waited for one grace only.
        let (_held, quiet) = tokio::io::duplex(64);
        let (tx, _rx) = mpsc::channel(2);
        let moved = Arc::new(AtomicU64::new(0));
        let forwarding = forward_lines(quiet, 0, Stream::Stdout, tx, Arc::clone(&moved));
        let t0 = Instant::now();
        drain(forwarding, &moved, t0 + DRAIN_LIMIT).await;
        assert_eq!(t0.elapsed().as_millis(), DRAIN_GRACE.as_millis());
    }
}
