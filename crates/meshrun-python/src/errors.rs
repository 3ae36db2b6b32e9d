//! The one Python exception hierarchy and the one conversion into it.

use meshrun_core::CoreError;
use meshrun_data::DataError as LoaderError;
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
    DataError,
    MeshrunError,
    "A data file is missing, truncated, corrupt or does not match the request."
);
create_exception!(
    meshrun,
    CheckpointError,
    MeshrunError,
    "A checkpoint is missing, corrupt, or does not match the target tree."
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
    m.add("DataError", py.get_type::<DataError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}

/// Variant by variant, so a new engine error has to be placed here.
pub fn to_py(err: &CoreError) -> PyErr {
    let text = err.to_string();
    match err {
        CoreError::Usage(_) => ConfigError::new_err(text),
        CoreError::Io { .. } | CoreError::Token(_) | CoreError::Checkpoint(_) => {
            MeshrunError::new_err(text)
        }
        CoreError::Net { .. }
        | CoreError::Protocol(_)
        | CoreError::AgentTimeout { .. }
        | CoreError::AgentSpawn { .. }
        | CoreError::AgentGone { .. }
        | CoreError::RayPlacement(_)
        | CoreError::NotRunning { .. }
        | CoreError::TokenRefused { .. } => ControlError::new_err(text),
    }
}

/// Data errors: a request that cannot work is a `ConfigError`, a file that
/// is missing or wrong is a `DataError`.
pub fn data_to_py(err: &LoaderError) -> PyErr {
    let text = err.to_string();
    match err {
        LoaderError::BatchNotDivisible { .. }
        | LoaderError::NotPositive(..)
        | LoaderError::BadRank { .. }
        | LoaderError::BadDtype(..)
        | LoaderError::BadSeqLen(_)
        | LoaderError::BatchLargerThanData { .. } => ConfigError::new_err(text),
        LoaderError::Io { .. }
        | LoaderError::Missing(_)
        | LoaderError::NoMatch(_)
        | LoaderError::Truncated { .. }
        | LoaderError::TooShort { .. }
        | LoaderError::Parquet { .. }
        | LoaderError::MissingColumn { .. }
        | LoaderError::BadColumnType { .. }
        | LoaderError::Npy { .. }
        | LoaderError::Empty(_)
        | LoaderError::Fingerprint { .. } => DataError::new_err(text),
    }
}
