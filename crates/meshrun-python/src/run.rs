//! The engine behind `Trainer.fit()`: `plan(...)` checks a request before
//! anything starts, `run(plan, ...)` runs it. The controller runs on its own
//! thread; this thread waits without the GIL and wakes every 100 ms to let
//! Python deliver Ctrl-C, which becomes a clean stop of the whole group.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use meshrun_core::controller::progress::ProgressMode;
use meshrun_core::{execute, ExecOptions, OutcomeStatus, StopHandle};
use meshrun_plan::RunPlan;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::config::{progress, run_spec, Configs};
use crate::convert::to_python;
use crate::errors::{to_py, usage_to_py};

/// A request that passed every check: ready to run.
#[pyclass(frozen, module = "meshrun._native")]
pub struct Plan {
    plan: RunPlan,
    progress: bool,
}

#[pymethods]
impl Plan {
    /// The run's name (given, or made from the time).
    #[getter]
    fn name(&self) -> &str {
        &self.plan.name
    }

    /// The run's folder.
    #[getter]
    fn run_dir(&self) -> PathBuf {
        self.plan.run_dir.clone()
    }

    /// Where the run's checkpoints are: a path, or a URL.
    #[getter]
    fn checkpoints_dir(&self) -> String {
        self.plan
            .storage_dir()
            .join(meshrun_ckpt::resume::CHECKPOINTS)
            .to_string()
    }
}

/// Checks a `Trainer`'s request: the configuration objects' types here,
/// their values by the engine's plan. Raises `ConfigError` naming the
/// Python attribute that is wrong; touches no file.
#[pyfunction]
#[pyo3(signature = (scaling, run, checkpoint, failure, *, env, python, agent_command))]
// PyO3 hands arguments over as owned values, one per Python argument.
#[allow(clippy::needless_pass_by_value, clippy::too_many_arguments)]
pub fn plan(
    py: Python<'_>,
    scaling: Bound<'_, PyAny>,
    run: Bound<'_, PyAny>,
    checkpoint: Bound<'_, PyAny>,
    failure: Bound<'_, PyAny>,
    env: Vec<(String, String)>,
    python: PathBuf,
    agent_command: Vec<String>,
) -> PyResult<Plan> {
    let progress = progress(&run)?;
    let configs = Configs {
        scaling,
        run,
        checkpoint,
        failure,
    };
    let spec = run_spec(&configs, env, python, agent_command)?;
    let plan = py.detach(|| spec.validate()).map_err(|e| usage_to_py(&e))?;
    Ok(Plan { plan, progress })
}

/// How a run ended.
#[pyclass(frozen, get_all, module = "meshrun._native")]
pub struct Outcome {
    /// `succeeded`, `failed`, `interrupted`, `preempted` or `stopped`
    /// (by `meshrun stop` without a checkpoint to end at).
    status: &'static str,
    succeeded: bool,
    /// It failed (and restarts, if any, did not save it).
    failed: bool,
    /// Attempts made (1 + restarts).
    attempts: u32,
    /// What the `meshrun` command would exit with.
    exit_code: i32,
    name: String,
    run_dir: PathBuf,
    /// The account of the failure the command line prints, if any.
    summary: Option<String>,
    /// The first failure, as recorded in the run's folder.
    failure: Option<Py<PyAny>>,
    /// Rank 0's last reported metrics.
    metrics: Option<Py<PyAny>>,
}

/// Runs `plan` to its end; `payload` is the pickled function and its
/// config, `env` more environment for every worker. Ctrl-C stops every
/// worker, then raises `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (plan, *, payload, env))]
pub fn run(
    py: Python<'_>,
    plan: &Plan,
    payload: &Bound<'_, PyBytes>,
    env: Vec<(String, String)>,
) -> PyResult<Outcome> {
    let mut run_plan = plan.plan.clone();
    run_plan.env.extend(env);
    let stop = StopHandle::new();
    let opts = ExecOptions {
        handle_signals: false,
        payload: Some(std::sync::Arc::from(payload.as_bytes())),
        stop: Some(stop.clone()),
        progress: if plan.progress {
            ProgressMode::Auto
        } else {
            ProgressMode::Off
        },
    };
    let (tx, rx) = mpsc::channel();
    // A Receiver is not Sync; the wait below runs without the GIL.
    let rx = std::sync::Mutex::new(rx);
    std::thread::Builder::new()
        .name("meshrun-controller".into())
        .spawn(move || {
            let result = execute(run_plan, opts);
            // Written here, so a run stopped by Ctrl-C has its page too; a
            // page that cannot be written is a warning, never a failed run.
            if let Ok(outcome) = &result {
                meshrun::runs::report_after_run(&outcome.run_dir);
            }
            let _ = tx.send(result);
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the controller thread: {e}")))?;
    let mut interrupted: Option<PyErr> = None;
    let outcome = loop {
        match py.detach(|| {
            rx.lock()
                .expect("only this thread waits")
                .recv_timeout(Duration::from_millis(100))
        }) {
            Ok(result) => break result,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    // Stop the group and wait for it before raising, so no
                    // worker is left behind.
                    stop.stop();
                    interrupted.get_or_insert(e);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "the controller thread ended without a result",
                ))
            }
        }
    };
    if let Some(e) = interrupted {
        return Err(e);
    }
    let outcome = outcome.map_err(|e| to_py(&e))?;
    Ok(Outcome {
        // The names run.json and `meshrun ls` use.
        status: outcome.status.state().as_str(),
        succeeded: matches!(outcome.status, OutcomeStatus::Succeeded),
        failed: matches!(outcome.status, OutcomeStatus::Failed),
        attempts: outcome.attempts,
        exit_code: outcome.exit_code(),
        failure: outcome
            .failure
            .as_ref()
            .map(|f| to_python(py, f))
            .transpose()?,
        metrics: outcome
            .last_metrics
            .as_ref()
            .map(|m| to_python(py, m))
            .transpose()?,
        name: outcome.name,
        run_dir: outcome.run_dir,
        summary: outcome.summary,
    })
}
