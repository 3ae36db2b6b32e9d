//! The worker's side of the control protocol. It lives inside the user's
//! Python process (through the binding crate) as two plain threads:
//! a writer that sends reports and a heartbeat every second, so that a long
//! XLA compile holding the GIL is never mistaken for a dead worker, and a
//! reader that takes the controller's requests (a checkpoint, when the run
//! is being preempted) and notices when the controller is gone.

use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Condvar;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use meshrun_channel::{auth, BlockingWriter};
use meshrun_protocol::frame::{encode, MAX_FRAME_BYTES};
use meshrun_protocol::token::{Peer, Token};
use meshrun_protocol::{FromWorker, ProtocolError, ToWorker};

use crate::commits::{Commits, NotCommitted};
use crate::error::WorkerError;
use crate::files::{self, FileSendError};

pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Reports queued and not yet written may hold this many bytes; past it a
/// report is dropped and counted (`ReportsShed`), so a controller that
/// falls behind costs records, said, and never the worker's memory.
/// Heartbeats, failures, exits and checkpoint messages are never shed.
pub const UNSENT_REPORT_BYTES: usize = 16 << 20;

enum Outgoing {
    Msg(FromWorker),
    /// A message already encoded (and checked against the frame limit).
    Body(bytes::Bytes),
    /// Acknowledged once everything queued before it has been written.
    Flush(SyncSender<()>),
    /// Sends `Bye`, closes the write side, then acknowledges.
    Close(SyncSender<()>),
    /// Sends every file under `dir` (a profile trace), then `ProfileDone`.
    Profile {
        capture: String,
        dir: PathBuf,
    },
}

/// A connected, authenticated worker.
/// One `meshrun.report`, as the worker sends it.
#[derive(Debug, Default)]
pub struct Report {
    pub step: Option<u64>,
    pub metrics: serde_json::Value,
    /// It came with the state to checkpoint.
    pub checkpoint: bool,
    /// A save of this step began with it.
    pub saving: bool,
    /// The worker's goodput figures, when they go with it.
    pub timing: Option<meshrun_record::Timing>,
    pub total_steps: Option<u64>,
}

/// A profile capture the controller asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileRequest {
    pub capture: String,
    pub steps: u32,
    /// Not before the report of this step.
    pub from_step: Option<u64>,
}

pub struct WorkerClient {
    tx: mpsc::Sender<Outgoing>,
    unsent: Arc<Unsent>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Set once the worker itself closes, so the reader knows the end of
    /// the stream that follows is expected.
    closing: Arc<AtomicBool>,
    /// Set when the controller asks for a checkpoint (`CheckpointNow`).
    checkpoint_requested: Arc<AtomicBool>,
    /// The newest step the controller released with `Resume`.
    resumed: Arc<Resumed>,
    /// What the controller said of each checkpoint step.
    commits: Arc<Commits>,
    /// A profile capture the controller asked for and the worker has not
    /// taken yet: its name and how many steps.
    profile: Arc<Mutex<Option<ProfileRequest>>>,
    /// Where this rank appends when it reached each step (for its host's
    /// agent), opened at the first step; `None` inside: not under an agent.
    steps: std::sync::OnceLock<Option<std::fs::File>>,
    rank: u32,
    attempt: u32,
}

/// Reports queued for the writer: their bytes, and how many were shed
/// since the writer last said so.
#[derive(Default)]
struct Unsent {
    bytes: AtomicUsize,
    shed: AtomicU64,
}

/// A worker started by an agent beats into its file (`names::beat_file`)
/// rather than sending a heartbeat: its agent tells the controller whose
/// moved, once a second for the whole host.
struct Beat(std::fs::File);

impl Beat {
    /// `None` for a worker that no agent started (no scratch folder).
    fn open(rank: u32, attempt: u32) -> Option<Self> {
        let scratch = std::env::var_os(meshrun_record::names::SCRATCH_ENV)?;
        let dir = meshrun_record::names::beats_dir(scratch.as_ref(), attempt);
        std::fs::create_dir_all(&dir).ok()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(meshrun_record::names::beat_file(&dir, rank))
            .ok()?;
        let beat = Self(file);
        beat.now();
        Some(beat)
    }

    /// One write of 8 bytes at the start: the agent reads a whole time.
    fn now(&self) {
        use std::os::unix::fs::FileExt as _;
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let _ = self.0.write_at(&ns.to_le_bytes(), 0);
    }
}

/// `Resume` steps, for a worker waiting after a preemption save.
#[derive(Default)]
struct Resumed {
    step: Mutex<Option<u64>>,
    changed: Condvar,
}

/// What the worker does when the controller's connection ends unasked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnControllerLoss {
    /// Kill the worker's whole process group: a worker must not outlive
    /// its run (workers started by meshrun).
    KillProcessGroup,
    /// Do nothing (clients used in tests or tools).
    Ignore,
}

impl WorkerClient {
    pub fn connect(
        addr: &str,
        token: &Token,
        rank: u32,
        attempt: u32,
        on_loss: OnControllerLoss,
    ) -> Result<Self, WorkerError> {
        let net = |what| move |source| WorkerError::Net { what, source };
        let sockaddr = addr
            .to_socket_addrs()
            .map_err(net("bad controller address"))?
            .next()
            .ok_or_else(|| WorkerError::Net {
                what: "bad controller address",
                source: std::io::Error::other(addr.to_string()),
            })?;
        let mut stream = TcpStream::connect_timeout(&sockaddr, CONNECT_TIMEOUT)
            .map_err(net("cannot reach the controller"))?;
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(auth::HANDSHAKE_TIMEOUT))
            .map_err(net("socket"))?;
        let keys = auth::connect_blocking(&mut stream, token, Peer::Worker { attempt, rank })?;
        stream.set_read_timeout(None).map_err(net("socket"))?;

        let reader = stream.try_clone().map_err(net("socket"))?;
        let (mut reader, mut out) = keys.into_blocking(reader, stream);
        out.send(&FromWorker::WorkerHello {
            rank,
            attempt,
            pid: std::process::id(),
        })?;

        let (tx, rx) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let closing_seen = Arc::clone(&closing);
        let checkpoint_requested = Arc::new(AtomicBool::new(false));
        let requested = Arc::clone(&checkpoint_requested);
        let resumed = Arc::new(Resumed::default());
        let resume_seen = Arc::clone(&resumed);
        let commits = Arc::new(Commits::default());
        let commits_seen = Arc::clone(&commits);
        let profile = Arc::new(Mutex::new(None));
        let profile_asked = Arc::clone(&profile);
        let beat = Beat::open(rank, attempt);
        let unsent = Arc::new(Unsent::default());
        let unsent_writer = Arc::clone(&unsent);
        let writer = std::thread::Builder::new()
            .name("meshrun-writer".into())
            .spawn(move || write_loop(out, &rx, &unsent_writer, beat.as_ref()))
            .map_err(net("cannot start the writer thread"))?;
        std::thread::Builder::new()
            .name("meshrun-reader".into())
            .spawn(move || {
                // Any end of the stream that we did not ask for means the
                // controller is gone.
                while let Ok(msg) = reader.recv::<ToWorker>() {
                    match msg {
                        ToWorker::CheckpointNow => requested.store(true, Ordering::SeqCst),
                        ToWorker::Resume { step } => {
                            let mut newest = resume_seen
                                .step
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            *newest = (*newest).max(Some(step));
                            resume_seen.changed.notify_all();
                        }
                        ToWorker::StepCommitted { step, path } => {
                            commits_seen.settle(step, Ok(path));
                        }
                        ToWorker::StepNotCommitted { step, error } => {
                            commits_seen.settle(step, Err(error));
                        }
                        ToWorker::Profile {
                            capture,
                            steps,
                            from_step,
                        } => {
                            *profile_asked
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Some(ProfileRequest {
                                    capture,
                                    steps,
                                    from_step,
                                });
                        }
                    }
                }
                if on_loss == OnControllerLoss::KillProcessGroup
                    && !closing_seen.load(Ordering::SeqCst)
                {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::getpgrp(),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            })
            .map_err(net("cannot start the reader thread"))?;
        Ok(Self {
            tx,
            unsent,
            writer: Mutex::new(Some(writer)),
            closing,
            checkpoint_requested,
            resumed,
            commits,
            profile,
            steps: std::sync::OnceLock::new(),
            rank,
            attempt,
        })
    }

    /// Notes that this rank reached `step` at `unix_ns` (its host's
    /// clock), for its host's agent to read: one small write, no message.
    /// Does nothing for a worker that no agent started.
    pub fn step_reached(&self, step: u64, unix_ns: i64) {
        use std::io::Write as _;
        let file = self.steps.get_or_init(|| {
            let scratch = std::env::var_os(meshrun_record::names::SCRATCH_ENV)?;
            let dir = meshrun_record::names::steps_dir(scratch.as_ref(), self.attempt);
            std::fs::create_dir_all(&dir).ok()?;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(meshrun_record::names::step_file(&dir, self.rank))
                .ok()
        });
        if let Some(f) = file {
            let mut record = [0u8; meshrun_record::names::STEP_RECORD_BYTES];
            record[..8].copy_from_slice(&step.to_le_bytes());
            record[8..].copy_from_slice(&unix_ns.to_le_bytes());
            // One write of 16 bytes to an append-only file: the agent
            // never sees half a record unless the disk is full.
            let _ = (&*f).write_all(&record);
        }
    }

    /// The profile capture the controller asked for, once it may begin at
    /// a report of `step`: taken then, and `None` until.
    pub fn take_profile_request(&self, step: u64) -> Option<ProfileRequest> {
        let mut asked = self
            .profile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if asked.as_ref()?.from_step.is_some_and(|from| step < from) {
            return None;
        }
        asked.take()
    }

    /// Sends every file under `dir` (the trace of `capture`) from the
    /// writer thread, then says it is done; never blocks.
    pub fn send_profile(&self, capture: String, dir: PathBuf) {
        let _ = self.tx.send(Outgoing::Profile { capture, dir });
    }

    /// Says the trace of `capture` could not be taken.
    pub fn profile_failed(&self, capture: String, error: String) {
        self.tell(FromWorker::ProfileDone {
            capture,
            error: Some(error),
        });
    }

    /// Says, before saving, that this rank saves `step` for a preemption.
    pub fn preempt_save(&self, step: u64) {
        self.tell(FromWorker::PreemptSave { step });
    }

    /// After a preemption save of `step`: waits until the controller
    /// releases it (`Resume`, when that step cannot commit) and returns true,
    /// or returns false after `timeout`. Usually the controller commits the
    /// step and stops the worker while it waits here.
    pub fn wait_resumed(&self, step: u64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut newest = self
            .resumed
            .step
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while newest.is_none_or(|s| s < step) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            newest = self
                .resumed
                .changed
                .wait_timeout(newest, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Waits until the controller says what became of checkpoint `step`:
    /// its path once committed, else why not, or [`NotCommitted::TimedOut`]
    /// after `timeout` (`None`: no limit). A step settled before the call
    /// answers at once.
    pub fn wait_committed(
        &self,
        step: u64,
        timeout: Option<Duration>,
    ) -> Result<String, NotCommitted> {
        self.commits.wait(step, timeout)
    }

    /// Whether the controller has asked for a checkpoint (the run is being
    /// preempted). It stays set: every later report saves until the run stops.
    pub fn checkpoint_requested(&self) -> bool {
        self.checkpoint_requested.load(Ordering::SeqCst)
    }

    /// Queues a metrics record; never blocks on the network. A record
    /// over the frame limit is refused here, so the caller can say so
    /// ([`ProtocolError::TooLarge`] with its size) and nothing is sent.
    pub fn report(&self, report: Report) -> Result<(), ProtocolError> {
        let body = encode(&FromWorker::Report {
            step: report.step,
            metrics: report.metrics,
            checkpoint: report.checkpoint,
            timing: report.timing,
            saving: report.saving,
            total_steps: report.total_steps,
        });
        if body.len() > MAX_FRAME_BYTES {
            return Err(ProtocolError::TooLarge(body.len()));
        }
        let queued = self.unsent.bytes.fetch_add(body.len(), Ordering::SeqCst);
        if queued + body.len() > UNSENT_REPORT_BYTES {
            self.unsent.bytes.fetch_sub(body.len(), Ordering::SeqCst);
            self.unsent.shed.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        let _ = self.tx.send(Outgoing::Body(body));
        Ok(())
    }

    /// Sends the user's exception and waits (up to `timeout`) until it has
    /// been written, since the process may be killed right after.
    pub fn report_failure(
        &self,
        kind: String,
        message: String,
        traceback: String,
        timeout: Duration,
    ) {
        self.tell(FromWorker::Failure {
            kind,
            message,
            traceback,
        });
        self.flush(timeout);
    }

    /// Sends the user's `sys.exit` with a non-zero code and waits (up to
    /// `timeout`) until it has been written: the process exits (or is held
    /// in JAX's shutdown barrier) right after.
    pub fn report_exit(&self, code: i32, argument: String, traceback: String, timeout: Duration) {
        self.tell(FromWorker::ExitRequested {
            code,
            argument,
            traceback,
        });
        self.flush(timeout);
    }

    /// Waits until everything queued so far has been written.
    pub fn flush(&self, timeout: Duration) {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if self.tx.send(Outgoing::Flush(ack_tx)).is_ok() {
            let _ = ack_rx.recv_timeout(timeout);
        }
    }

    /// Says goodbye and closes the connection, after everything queued.
    pub fn close(&self, timeout: Duration) {
        self.closing.store(true, Ordering::SeqCst);
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if self.tx.send(Outgoing::Close(ack_tx)).is_ok() {
            let _ = ack_rx.recv_timeout(timeout);
        }
        if let Some(handle) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            if handle.is_finished() {
                let _ = handle.join();
            }
        }
    }
}

fn write_loop(
    mut out: BlockingWriter<TcpStream>,
    rx: &mpsc::Receiver<Outgoing>,
    unsent: &Unsent,
    beat: Option<&Beat>,
) {
    loop {
        // Shed reports are said before whatever comes next.
        let shed = unsent.shed.swap(0, Ordering::SeqCst);
        if shed > 0 && out.put(&FromWorker::ReportsShed { count: shed }).is_err() {
            return;
        }
        // Drain what is queued without flushing, then flush once and wait.
        let next = match rx.try_recv() {
            Ok(item) => item,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                if out.flush().is_err() {
                    return;
                }
                match rx.recv_timeout(HEARTBEAT_INTERVAL) {
                    Ok(item) => item,
                    Err(RecvTimeoutError::Timeout) => match beat {
                        Some(beat) => {
                            beat.now();
                            continue;
                        }
                        None => Outgoing::Msg(FromWorker::Heartbeat),
                    },
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        };
        match next {
            Outgoing::Msg(msg) => match out.put(&msg) {
                // Only reports can grow large, and they are checked when
                // queued; any other oversized message is a bug, not a
                // reason to drop the connection.
                Ok(()) | Err(ProtocolError::TooLarge(_)) => {}
                Err(_) => return,
            },
            Outgoing::Body(body) => {
                let written = out.put_body(&body);
                unsent.bytes.fetch_sub(body.len(), Ordering::SeqCst);
                if written.is_err() {
                    return;
                }
            }
            Outgoing::Profile { capture, dir } => {
                let error = match files::send_files(&mut out, &capture, &dir) {
                    Ok(()) => None,
                    Err(FileSendError::Net) => return,
                    Err(FileSendError::Read(e)) => Some(e),
                };
                if out
                    .put(&FromWorker::ProfileDone { capture, error })
                    .is_err()
                {
                    return;
                }
            }
            Outgoing::Flush(ack) => {
                let _ = out.flush();
                let _ = ack.send(());
            }
            Outgoing::Close(ack) => {
                let _ = out.put(&FromWorker::Bye);
                let _ = out.flush();
                let _ = out.get_ref().shutdown(Shutdown::Write);
                let _ = ack.send(());
                return;
            }
        }
    }
}

#[path = "client_tells.rs"]
mod tells;

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
