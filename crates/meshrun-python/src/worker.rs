//! The worker's connection to its controller, for meshrun's Python code
//! running inside each worker.

use std::path::PathBuf;
use std::time::Duration;

use meshrun_protocol::token::Token;
use meshrun_protocol::{ProtocolError, MAX_FRAME_BYTES};
use meshrun_record::names;
use meshrun_worker::{
    NotCommitted, OnControllerLoss, Report, WorkerClient as Client, KEPT_OUTCOMES,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Serialize;

use crate::checkpoint::WrittenShards;
use crate::convert::{to_typed, to_value};
use crate::errors::{worker_to_py, CheckpointError, ConfigError};

/// Room left in a frame for the message's own fields.
const FRAME_HEADROOM: usize = 4096;

/// The bytes `value` takes as JSON on the wire, counted without keeping them.
fn json_size<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing into a counter cannot fail, and the engine's values serialize.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[pyclass(frozen, module = "meshrun._native")]
pub struct WorkerClient(Client);

#[pymethods]
impl WorkerClient {
    /// Connects and authenticates. With `exit_on_controller_loss`, the
    /// worker's process group is killed if the controller goes away.
    #[new]
    #[pyo3(signature = (addr, token, rank, attempt, exit_on_controller_loss = true))]
    fn new(
        py: Python<'_>,
        addr: &str,
        token: &str,
        rank: u32,
        attempt: u32,
        exit_on_controller_loss: bool,
    ) -> PyResult<Self> {
        let token = Token::from_hex(token).map_err(|e| ConfigError::new_err(e.to_string()))?;
        let on_loss = if exit_on_controller_loss {
            OnControllerLoss::KillProcessGroup
        } else {
            OnControllerLoss::Ignore
        };
        // Its sender and heartbeat threads must leave SIGTERM (preemption)
        // and SIGINT to Python's main thread (see `signals`).
        py.detach(|| {
            crate::signals::with_signals_blocked(|| {
                Client::connect(addr, &token, rank, attempt, on_loss)
            })
        })
        .map(Self)
        .map_err(|e| worker_to_py(&e))
    }

    /// Queues a metrics record (a dict of plain values); returns at once.
    /// `checkpoint`: the report came with the state to save.
    /// `timing`: where this worker's time went so far (goodput);
    /// `saving`: a save of this step began; `total_steps`: for the ETA.
    #[pyo3(signature = (step, metrics, checkpoint=false, timing=None, saving=false, total_steps=None))]
    fn report(
        &self,
        step: Option<u64>,
        metrics: &Bound<'_, PyDict>,
        checkpoint: bool,
        timing: Option<&Bound<'_, PyDict>>,
        saving: bool,
        total_steps: Option<u64>,
    ) -> PyResult<()> {
        let metrics = to_value("metrics", metrics)?;
        let timing = timing.map(|t| to_typed("timing", t)).transpose()?;
        self.0
            .report(Report {
                step,
                metrics,
                checkpoint,
                saving,
                timing,
                total_steps,
            })
            .map_err(|e| match e {
                ProtocolError::TooLarge(bytes) => PyValueError::new_err(format!(
                    "the report of step {} takes {bytes} bytes, over the {MAX_FRAME_BYTES} bytes                      a report may carry; report fewer or smaller values",
                    step.map_or_else(|| "-".to_string(), |s| s.to_string())
                )),
                other => worker_to_py(&other.into()),
            })
    }

    /// Notes that this rank reached `step` at `unix_ns` (for stragglers):
    /// one small write to a host-local file its agent reads.
    fn step_reached(&self, step: u64, unix_ns: i64) {
        self.0.step_reached(step, unix_ns);
    }

    /// The profile capture the controller asked for, once it may begin at
    /// this report of `step`: (capture, steps to trace), else None.
    fn take_profile_request(&self, step: u64) -> Option<(String, u32)> {
        self.0
            .take_profile_request(step)
            .map(|r| (r.capture, r.steps))
    }

    /// Sends every file under `folder` (a finished trace) to the
    /// controller, from the sender thread; returns at once.
    fn send_profile(&self, capture: String, folder: PathBuf) {
        self.0.send_profile(capture, folder);
    }

    /// Says the trace of `capture` could not be taken.
    fn profile_failed(&self, capture: String, error: String) {
        self.0.profile_failed(capture, error);
    }

    /// Sends where this worker's time went (at the end of its program).
    fn timing(&self, timing: &Bound<'_, PyDict>) -> PyResult<()> {
        self.0.timing(to_typed("timing", timing)?);
        Ok(())
    }

    /// Whether the controller asked for a checkpoint (preemption).
    fn checkpoint_requested(&self) -> bool {
        self.0.checkpoint_requested()
    }

    /// Says, before saving, that this rank saves `step` for a preemption.
    fn preempt_save(&self, step: u64) {
        self.0.preempt_save(step);
    }

    /// After a preemption save: waits (without the GIL) until the controller
    /// releases `step`, true; false after `timeout_s`.
    fn wait_resumed(&self, py: Python<'_>, step: u64, timeout_s: f64) -> bool {
        py.detach(|| {
            self.0
                .wait_resumed(step, Duration::from_secs_f64(timeout_s.max(0.0)))
        })
    }

    /// Waits (without the GIL) until the controller says checkpoint `step`
    /// is committed, and returns its path (a folder, or a URL); raises
    /// `CheckpointError` when it will never be (with `failed_ok`: returns
    /// None), or after `timeout_s` (`None`: no limit), saying which.
    #[pyo3(signature = (step, timeout_s=None, failed_ok=false))]
    fn wait_committed(
        &self,
        py: Python<'_>,
        step: u64,
        timeout_s: Option<f64>,
        failed_ok: bool,
    ) -> PyResult<Option<String>> {
        let timeout = timeout_s
            .filter(|t| t.is_finite())
            .map(|t| Duration::from_secs_f64(t.max(0.0)));
        match py.detach(|| self.0.wait_committed(step, timeout)) {
            Ok(path) => Ok(Some(path)),
            Err(NotCommitted::Failed(_)) if failed_ok => Ok(None),
            Err(e) => Err(CheckpointError::new_err(not_committed(step, timeout_s, &e))),
        }
    }

    /// Tells the controller this rank's shards of `step` are written
    /// (`shards`: what `write_shards` returned); `extra`: what the manifest
    /// keeps with the step (rank 0's tree paths, metrics, user data).
    #[pyo3(signature = (step, shards, extra=None))]
    fn checkpoint_written(
        &self,
        step: u64,
        shards: &WrittenShards,
        extra: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let extra = fits_a_frame(&format!("step {step}"), shards, extra)?;
        self.0
            .checkpoint_written(step, shards.leaves.clone(), shards.files.clone(), extra);
        Ok(())
    }

    /// Tells the controller this rank holds its shards of memory checkpoint
    /// `step` in its host's memory.
    #[pyo3(signature = (step, shards, extra=None))]
    fn memory_written(
        &self,
        step: u64,
        shards: &WrittenShards,
        extra: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let extra = fits_a_frame(&format!("memory checkpoint of step {step}"), shards, extra)?;
        self.0.memory_written(step, shards.leaves.clone(), extra);
        Ok(())
    }

    /// Tells the controller this rank could not write its shards of `step`.
    fn save_failed(&self, step: u64, error: String) {
        self.0.save_failed(step, error);
    }

    /// Says what became of one of this rank's jitted functions:
    /// `outcome` is `loaded`, `compiled` or `stale`.
    /// What the program's state needs per device (from
    /// `sharding.describe`): `per_device` and `total` bytes, `parts` as
    /// `(name, bytes)`, the `mesh` as words, and what would `fits`.
    fn state_need(
        &self,
        per_device: u64,
        total: u64,
        parts: Vec<(String, u64)>,
        mesh: String,
        fits: String,
    ) {
        self.0.state_need(meshrun_record::memory::StateNeed {
            per_device,
            parts,
            total,
            mesh,
            fits,
        });
    }

    /// Bytes in use on the worker's first device, and their peak.
    fn device_memory(&self, current: u64, peak: u64) {
        self.0.device_memory(current, peak);
    }

    #[pyo3(signature = (name, outcome, seconds, reason=None))]
    fn executable(
        &self,
        name: String,
        outcome: &str,
        seconds: f64,
        reason: Option<String>,
    ) -> PyResult<()> {
        let outcome =
            serde_json::from_value(serde_json::Value::String(outcome.into())).map_err(|_| {
                PyValueError::new_err(format!(
                    "outcome {outcome:?} is not one of 'loaded', 'compiled', 'stale'"
                ))
            })?;
        self.0.executable(name, outcome, reason, seconds);
        Ok(())
    }

    /// Describes a program across processes before its first call (see
    /// `meshrun._recorder`).
    #[pyo3(signature = (fingerprint, name, args, size, collectives, site, values=Vec::new()))]
    #[allow(clippy::too_many_arguments, clippy::similar_names)]
    fn program(
        &self,
        fingerprint: String,
        name: String,
        args: String,
        size: u64,
        collectives: Vec<String>,
        site: String,
        values: Vec<String>,
    ) {
        self.0.program(meshrun_record::program::Program {
            fingerprint,
            name,
            args,
            size,
            collectives,
            site,
            values,
        });
    }

    /// This rank's call `n` of programs across processes.
    fn call(&self, n: u64, fingerprint: String, site: String) {
        self.0.call(n, fingerprint, site);
    }

    /// Sends an uncaught exception and waits until it is on the wire.
    fn report_failure(&self, py: Python<'_>, kind: String, message: String, traceback: String) {
        py.detach(|| {
            self.0
                .report_failure(kind, message, traceback, Duration::from_secs(2));
        });
    }

    /// Sends a `sys.exit` with a non-zero code and waits until it is on
    /// the wire. `argument`: what was passed to `sys.exit`, as `repr` writes it.
    fn report_exit(&self, py: Python<'_>, code: i32, argument: String, traceback: String) {
        py.detach(|| {
            self.0
                .report_exit(code, argument, traceback, Duration::from_secs(2));
        });
    }

    /// Waits until everything reported so far has been sent.
    fn flush(&self, py: Python<'_>) {
        py.detach(|| self.0.flush(Duration::from_secs(5)));
    }

    /// Says goodbye to the controller.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.0.close(Duration::from_secs(5)));
    }
}

/// Why checkpoint `step` is not committed, as the user is told.
fn not_committed(step: u64, timeout_s: Option<f64>, why: &NotCommitted) -> String {
    match why {
        NotCommitted::Failed(error) => {
            format!("checkpoint step {step} was not committed: {error}")
        }
        NotCommitted::TimedOut => format!(
            "checkpoint step {step} was not committed within {} s: a step is committed once \
             every rank has written its part, so every rank must save it; if they all do, give \
             a longer timeout",
            timeout_s.unwrap_or_default()
        ),
        NotCommitted::Forgotten { oldest_kept } => format!(
            "what became of checkpoint step {step} is no longer known: a worker keeps it for the \
             newest {KEPT_OUTCOMES} steps saved, the oldest of them now {oldest_kept}"
        ),
    }
}

/// Where rank `rank` of attempt `attempt` writes its Python stacks when the
/// controller asks (SIGUSR1), under the run's scratch folder on its host
/// (`MESHRUN_SCRATCH`): the place its agent reads them from.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)] // PyO3 hands arguments over as owned values
pub fn stacks_file(scratch: PathBuf, attempt: u32, rank: u32) -> PathBuf {
    names::stack_file(&names::stacks_dir(&scratch, attempt), rank)
}

/// Where rank `rank` writes its trace of profile capture `capture` before
/// sending it, under the run's scratch folder on its host.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)] // PyO3 hands arguments over as owned values
pub fn profile_folder(scratch: PathBuf, capture: &str, rank: u32) -> PathBuf {
    names::profile_dir(&scratch, capture).join(format!("rank-{rank}"))
}

/// Rank 0's metrics records in `run_dir`'s `metrics.jsonl` from byte
/// `offset` on, as dicts, and the offset to read on from: the follower of a
/// live run (`--tensorboard`) reads the file through the run folder's types.
/// A line still being written is left for the next call.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)] // PyO3 hands arguments over as owned values
pub fn read_metrics(py: Python<'_>, run_dir: PathBuf, offset: u64) -> PyResult<(Py<PyAny>, u64)> {
    let path = run_dir.join(names::METRICS);
    let (records, next, _skipped) = py
        .detach(|| meshrun_record::read::jsonl_from::<meshrun_record::MetricsRecord>(&path, offset))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
    Ok((crate::convert::to_python(py, &records)?, next))
}

/// `extra` as JSON, once the shard records and it are known to fit in one
/// control frame: a tree too large for it is refused here, loudly, instead
/// of a frame the connection drops. `what` names the step in the error.
fn fits_a_frame(
    what: &str,
    shards: &WrittenShards,
    extra: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<serde_json::Value>> {
    let extra = extra.map(|e| to_value("extra", e)).transpose()?;
    let size =
        json_size(&shards.leaves) + json_size(&shards.files) + extra.as_ref().map_or(0, json_size);
    if size + FRAME_HEADROOM > MAX_FRAME_BYTES {
        return Err(CheckpointError::new_err(format!(
            "{what}: this rank's shard list and metadata take {size} bytes, over the {} bytes a \
             control message carries; save fewer, larger arrays (e.g. stack per-layer \
             parameters) or put less in extra=",
            MAX_FRAME_BYTES - FRAME_HEADROOM
        )));
    }
    Ok(extra)
}
