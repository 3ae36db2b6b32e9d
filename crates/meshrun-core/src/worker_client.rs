//! The worker's side of the control protocol. It lives inside the user's
//! Python process (through the binding crate) as two plain threads:
//! a writer that sends reports and a heartbeat every second, so that a long
//! XLA compile holding the GIL is never mistaken for a dead worker, and a
//! reader that takes the controller's requests (a checkpoint, when the run
//! is being preempted) and notices when the controller is gone.

use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Condvar;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::CoreError;
use crate::protocol::frame::{encode, MAX_FRAME_BYTES};
use crate::protocol::{auth, BlockingWriter, Message, ProtocolError};
use crate::token::Token;

pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

enum Outgoing {
    Msg(Message),
    /// A message already encoded (and checked against the frame limit).
    Body(bytes::Bytes),
    /// Acknowledged once everything queued before it has been written.
    Flush(SyncSender<()>),
    /// Sends `Bye`, closes the write side, then acknowledges.
    Close(SyncSender<()>),
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

pub struct WorkerClient {
    tx: mpsc::Sender<Outgoing>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Set once the worker itself closes, so the reader knows the end of
    /// the stream that follows is expected.
    closing: Arc<AtomicBool>,
    /// Set when the controller asks for a checkpoint (`CheckpointNow`).
    checkpoint_requested: Arc<AtomicBool>,
    /// The newest step the controller released with `Resume`.
    resumed: Arc<Resumed>,
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
    ) -> Result<Self, CoreError> {
        let net = |what| move |source| CoreError::Net { what, source };
        let sockaddr = addr
            .to_socket_addrs()
            .map_err(net("bad controller address"))?
            .next()
            .ok_or_else(|| CoreError::Net {
                what: "bad controller address",
                source: std::io::Error::other(addr.to_string()),
            })?;
        let mut stream = TcpStream::connect_timeout(&sockaddr, CONNECT_TIMEOUT)
            .map_err(net("cannot reach the controller"))?;
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(auth::HANDSHAKE_TIMEOUT))
            .map_err(net("socket"))?;
        let keys = auth::connect_blocking(&mut stream, token)?;
        stream.set_read_timeout(None).map_err(net("socket"))?;

        let reader = stream.try_clone().map_err(net("socket"))?;
        let (mut reader, mut out) = keys.into_blocking(reader, stream);
        out.send(&Message::WorkerHello {
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
        let writer = std::thread::Builder::new()
            .name("meshrun-writer".into())
            .spawn(move || write_loop(out, &rx))
            .map_err(net("cannot start the writer thread"))?;
        std::thread::Builder::new()
            .name("meshrun-reader".into())
            .spawn(move || {
                // Any end of the stream that we did not ask for means the
                // controller is gone.
                while let Ok(msg) = reader.recv() {
                    match msg {
                        Message::CheckpointNow => requested.store(true, Ordering::SeqCst),
                        Message::Resume { step } => {
                            let mut newest = resume_seen
                                .step
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            *newest = (*newest).max(Some(step));
                            resume_seen.changed.notify_all();
                        }
                        _ => {}
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
            writer: Mutex::new(Some(writer)),
            closing,
            checkpoint_requested,
            resumed,
        })
    }

    /// Says, before saving, that this rank saves `step` for a preemption.
    pub fn preempt_save(&self, step: u64) {
        let _ = self.tx.send(Outgoing::Msg(Message::PreemptSave { step }));
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

    /// Whether the controller has asked for a checkpoint (the run is being
    /// preempted). It stays set: every later report saves until the run stops.
    pub fn checkpoint_requested(&self) -> bool {
        self.checkpoint_requested.load(Ordering::SeqCst)
    }

    /// Queues a metrics record; never blocks on the network. A record
    /// over the frame limit is refused here, so the caller can say so
    /// ([`ProtocolError::TooLarge`] with its size) and nothing is sent.
    pub fn report(&self, report: Report) -> Result<(), ProtocolError> {
        let body = encode(&Message::Report {
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
        let _ = self.tx.send(Outgoing::Body(body));
        Ok(())
    }

    /// Where this worker's time went, at the end of its program.
    pub fn timing(&self, timing: meshrun_record::Timing) {
        let _ = self.tx.send(Outgoing::Msg(Message::Timing { timing }));
    }

    /// Tells the controller this rank's shards of checkpoint `step` are on
    /// disk (`leaves`), or its copy of the folder it handed over (`files`).
    pub fn checkpoint_written(
        &self,
        step: u64,
        leaves: Vec<meshrun_ckpt::manifest::Leaf>,
        files: Option<Vec<meshrun_ckpt::directory::FileRecord>>,
        extra: Option<serde_json::Value>,
    ) {
        let _ = self.tx.send(Outgoing::Msg(Message::CheckpointWritten {
            step,
            leaves,
            files,
            extra,
        }));
    }

    /// Says this rank wrote its shards of memory checkpoint `step` into its
    /// host's memory.
    pub fn memory_written(
        &self,
        step: u64,
        leaves: Vec<meshrun_ckpt::manifest::Leaf>,
        extra: Option<serde_json::Value>,
    ) {
        let _ = self.tx.send(Outgoing::Msg(Message::MemoryWritten {
            step,
            leaves,
            extra,
        }));
    }

    /// Says this rank could not write its shards of checkpoint `step`.
    pub fn save_failed(&self, step: u64, error: String) {
        let _ = self
            .tx
            .send(Outgoing::Msg(Message::SaveFailed { step, error }));
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
        let _ = self.tx.send(Outgoing::Msg(Message::Failure {
            kind,
            message,
            traceback,
        }));
        self.flush(timeout);
    }

    /// Sends the user's `sys.exit` with a non-zero code and waits (up to
    /// `timeout`) until it has been written: the process exits (or is held
    /// in JAX's shutdown barrier) right after.
    pub fn report_exit(&self, code: i32, argument: String, traceback: String, timeout: Duration) {
        let _ = self.tx.send(Outgoing::Msg(Message::ExitRequested {
            code,
            argument,
            traceback,
        }));
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

fn write_loop(mut out: BlockingWriter<TcpStream>, rx: &mpsc::Receiver<Outgoing>) {
    loop {
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
                    Err(RecvTimeoutError::Timeout) => Outgoing::Msg(Message::Heartbeat),
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
                if out.put_body(&body).is_err() {
                    return;
                }
            }
            Outgoing::Flush(ack) => {
                let _ = out.flush();
                let _ = ack.send(());
            }
            Outgoing::Close(ack) => {
                let _ = out.put(&Message::Bye);
                let _ = out.flush();
                let _ = out.get_ref().shutdown(Shutdown::Write);
                let _ = ack.send(());
                return;
            }
        }
    }
}
