//! `run(...)`: the engine behind `Trainer.fit()`. The controller runs on its
//! own thread; this thread waits without the GIL and wakes every 100 ms to
//! let Python deliver Ctrl-C, which becomes a clean stop of the whole group.

use std::sync::mpsc;
use std::time::Duration;

use meshrun_core::controller::progress::ProgressMode;
use meshrun_core::{
    execute, Entry, ExecOptions, FailurePolicy, OutcomeStatus, PlatformChoice, RayTarget, RunSpec,
    StopHandle, Tee,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{to_py, ConfigError};

fn platform(name: &str) -> PyResult<PlatformChoice> {
    match name {
        "cpu" => Ok(PlatformChoice::Cpu),
        "cuda" | "gpu" => Ok(PlatformChoice::Cuda),
        "auto" => Ok(PlatformChoice::Auto),
        other => Err(ConfigError::new_err(format!(
            "platform '{other}' is not known; use 'cpu', 'cuda' or 'auto'"
        ))),
    }
}

fn tee(name: &str) -> PyResult<Tee> {
    match name {
        "rank0" => Ok(Tee::Rank0),
        "all" => Ok(Tee::All),
        "none" => Ok(Tee::None),
        other => Err(PyValueError::new_err(format!(
            "tee '{other}' is not known; use 'rank0', 'all' or 'none'"
        ))),
    }
}

#[pyfunction]
#[pyo3(signature = (*, nprocs, hosts, devices_per_proc, gpus_per_proc, platform_name, name, runs_dir, tee_name, python, agent_command, env, payload, retention_json=None, checkpoint_every=None, max_failures=0, hang_timeout_s=None, ray_address=None, ray_strategy="PACK", control_host=None, control_port=None, progress=true, tensorboard=false, resume_from=None))]
#[allow(clippy::too_many_arguments)]
pub fn run<'py>(
    py: Python<'py>,
    nprocs: u32,
    hosts: u32,
    devices_per_proc: Option<u32>,
    gpus_per_proc: Option<u32>,
    platform_name: &str,
    name: Option<String>,
    runs_dir: String,
    tee_name: &str,
    python: String,
    agent_command: Vec<String>,
    env: Vec<(String, String)>,
    payload: Vec<u8>,
    retention_json: Option<&str>,
    checkpoint_every: Option<u64>,
    max_failures: u32,
    hang_timeout_s: Option<f64>,
    ray_address: Option<String>,
    ray_strategy: &str,
    control_host: Option<String>,
    control_port: Option<u16>,
    progress: bool,
    tensorboard: bool,
    resume_from: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let control_host = control_host
        .map(|h| {
            h.parse::<std::net::IpAddr>().map_err(|_| {
                ConfigError::new_err(format!(
                    "ScalingConfig.control_host must be an IP address, got '{h}'"
                ))
            })
        })
        .transpose()?;
    let retention = retention_json
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| ConfigError::new_err(format!("CheckpointConfig is not valid: {e}")))?;
    let spec = RunSpec {
        nprocs,
        hosts,
        devices_per_proc,
        gpus_per_proc,
        platform: platform(platform_name)?,
        name,
        runs_dir: runs_dir.into(),
        tee: tee(tee_name)?,
        entry: Some(Entry::Function),
        python: python.into(),
        agent_command,
        env,
        retention,
        checkpoint_every,
        tensorboard,
        failure: FailurePolicy {
            max_failures,
            hang_timeout_s,
            finish_timeout_s: None,
        },
        ray: ray_address.map(|address| RayTarget {
            address,
            strategy: ray_strategy.to_uppercase(),
        }),
        control_host,
        control_port,
        resume_from,
    };
    let plan = py
        .detach(|| spec.validate())
        .map_err(|e| ConfigError::new_err(e.to_string()))?;
    let stop = StopHandle::new();
    let opts = ExecOptions {
        handle_signals: false,
        payload: Some(payload),
        stop: Some(stop.clone()),
        progress: if progress {
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
            let _ = tx.send(execute(plan, opts));
        })
        .map_err(|e| PyValueError::new_err(format!("cannot start the controller thread: {e}")))?;
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
                return Err(PyValueError::new_err(
                    "the controller thread ended without a result",
                ))
            }
        }
    };
    if let Some(e) = interrupted {
        return Err(e);
    }
    let outcome = outcome.map_err(|e| to_py(&e))?;
    let out = PyDict::new(py);
    out.set_item(
        "status",
        match outcome.status {
            OutcomeStatus::Succeeded => "succeeded",
            OutcomeStatus::Failed => "failed",
            OutcomeStatus::Interrupted { .. } => "interrupted",
            OutcomeStatus::Preempted { .. } => "preempted",
        },
    )?;
    out.set_item("attempts", outcome.attempts)?;
    out.set_item("exit_code", outcome.exit_code())?;
    out.set_item("name", &outcome.name)?;
    out.set_item("run_dir", outcome.run_dir.display().to_string())?;
    out.set_item("summary", outcome.summary.as_deref())?;
    out.set_item(
        "failure",
        outcome
            .failure
            .as_ref()
            .map(|f| serde_json::to_string(f).unwrap_or_default()),
    )?;
    out.set_item(
        "metrics",
        outcome.last_metrics.as_ref().map(ToString::to_string),
    )?;
    Ok(out)
}
