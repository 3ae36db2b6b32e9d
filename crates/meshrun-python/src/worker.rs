//! The worker's connection to its controller, for meshrun's Python code
//! running inside each worker.

use std::time::Duration;

use meshrun_core::token::Token;
use meshrun_core::worker_client::{OnControllerLoss, Report, WorkerClient as Client};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use meshrun_core::protocol::MAX_FRAME_BYTES;

use crate::errors::{to_py, CheckpointError, ConfigError};

/// Room left in a frame for the message's own fields.
const FRAME_HEADROOM: usize = 4096;

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
        py.detach(|| Client::connect(addr, &token, rank, attempt, on_loss))
            .map(Self)
            .map_err(|e| to_py(&e))
    }

    /// Queues a metrics record (a JSON object as text); returns at once.
    /// `checkpoint`: the report came with the state to save.
    /// `timing_json`: where this worker's time went so far (goodput);
    /// `saving`: a save of this step began; `total_steps`: for the ETA.
    #[pyo3(signature = (step, metrics_json, checkpoint=false, timing_json=None, saving=false, total_steps=None))]
    fn report(
        &self,
        step: Option<u64>,
        metrics_json: &str,
        checkpoint: bool,
        timing_json: Option<&str>,
        saving: bool,
        total_steps: Option<u64>,
    ) -> PyResult<()> {
        let metrics = serde_json::from_str(metrics_json)
            .map_err(|e| PyValueError::new_err(format!("metrics are not JSON: {e}")))?;
        let timing = timing_json
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("timing is not JSON: {e}")))?;
        self.0.report(Report {
            step,
            metrics,
            checkpoint,
            saving,
            timing,
            total_steps,
        });
        Ok(())
    }

    /// Sends where this worker's time went (at the end of its program).
    fn timing(&self, timing_json: &str) -> PyResult<()> {
        let timing = serde_json::from_str(timing_json)
            .map_err(|e| PyValueError::new_err(format!("timing is not JSON: {e}")))?;
        self.0.timing(timing);
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

    /// Tells the controller this rank's shards of `step` are written;
    /// `leaves_json` is what `write_shards` returned.
    #[pyo3(signature = (step, leaves_json, extra_json=None))]
    fn checkpoint_written(
        &self,
        step: u64,
        leaves_json: &str,
        extra_json: Option<&str>,
    ) -> PyResult<()> {
        // The records travel in one control frame; a tree too large for it
        // is refused here, loudly, instead of a frame the connection drops.
        let size = leaves_json.len() + extra_json.map_or(0, str::len);
        if size + FRAME_HEADROOM > MAX_FRAME_BYTES {
            return Err(CheckpointError::new_err(format!(
                "step {step}: this rank's shard list and metadata take {size} bytes, over the \
                 {} bytes a control message carries; save fewer, larger arrays (e.g. stack \
                 per-layer parameters) or put less in extra=",
                MAX_FRAME_BYTES - FRAME_HEADROOM
            )));
        }
        let leaves = serde_json::from_str(leaves_json)
            .map_err(|e| PyValueError::new_err(format!("leaves are not valid: {e}")))?;
        let extra = extra_json
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("extra is not JSON: {e}")))?;
        self.0.checkpoint_written(step, leaves, extra);
        Ok(())
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
