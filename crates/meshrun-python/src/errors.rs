//! The one Python exception hierarchy and the one conversion into it.

use meshrun_core::CoreError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    meshrun,
    MeshrunError,
    PyException,
    "Base class of every error meshrun raises."
);
create_exception!(
    meshrun,
    ConfigError,
    MeshrunError,
    "A run was asked for that cannot run as given (the CLI's exit status 2)."
);
create_exception!(
    meshrun,
    RunFailedError,
    MeshrunError,
    "A run ended in failure: a worker raised, exited non-zero or was lost."
);
create_exception!(
    meshrun,
    ControlError,
    MeshrunError,
    "The control plane failed: the controller, an agent or a connection."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MeshrunError", py.get_type::<MeshrunError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ControlError", py.get_type::<ControlError>())?;
    m.add("RunFailedError", py.get_type::<RunFailedError>())?;
    Ok(())
}

/// Variant by variant, so a new engine error has to be placed here.
pub fn to_py(err: &CoreError) -> PyErr {
    let text = err.to_string();
    match err {
        CoreError::Usage(_) => ConfigError::new_err(text),
        CoreError::Io { .. } | CoreError::Token(_) => MeshrunError::new_err(text),
        CoreError::Net { .. }
        | CoreError::Protocol(_)
        | CoreError::AgentTimeout { .. }
        | CoreError::AgentSpawn { .. }
        | CoreError::AgentGone { .. } => ControlError::new_err(text),
    }
}
