//! The one Python exception hierarchy and the one conversion into it: every
//! engine error reaches Python through a function of this file, variant by
//! variant, so a new variant has to be placed here.

use meshrun_ckpt::executable::ExecutableError;
use meshrun_ckpt::CkptError;
use meshrun_core::CoreError;
use meshrun_data::DataError as LoaderError;
use meshrun_machine::AttemptError;
use meshrun_plan::UsageError;
use meshrun_worker::WorkerError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::usage::python_words;

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
    TrainingFailedError,
    RunFailedError,
    "Raised by `Trainer.fit()` when the run failed, as Ray Train's is; its `result` is the run's `Result`."
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
    "The control plane failed: the controller, an agent, a connection or its token."
);
create_exception!(
    meshrun,
    StorageError,
    MeshrunError,
    "A file or folder of the run could not be read or written (permissions, a full disk)."
);

create_exception!(
    meshrun,
    StaleExecutableError,
    MeshrunError,
    "An executable loaded from an earlier attempt (`meshrun.jit`) is not what this attempt's program compiles to; it was removed, and the next attempt compiles."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MeshrunError", py.get_type::<MeshrunError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ControlError", py.get_type::<ControlError>())?;
    m.add("RunFailedError", py.get_type::<RunFailedError>())?;
    m.add("TrainingFailedError", py.get_type::<TrainingFailedError>())?;
    m.add("DataError", py.get_type::<DataError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add(
        "StaleExecutableError",
        py.get_type::<StaleExecutableError>(),
    )?;
    Ok(())
}

/// An engine error. Usage errors are worded with the Python API's names
/// (`ScalingConfig.num_workers`, not `-n/--nprocs`).
pub fn to_py(err: &CoreError) -> PyErr {
    let text = err.to_string();
    match err {
        CoreError::Usage(usage) => usage_to_py(usage),
        CoreError::Io { .. } | CoreError::Attempt(AttemptError::StorageNotShared { .. }) => {
            StorageError::new_err(text)
        }
        CoreError::Checkpoint(e) => ckpt_to_py(e),
        CoreError::Net { .. }
        | CoreError::Protocol(_)
        | CoreError::Token(_)
        | CoreError::Attempt(_)
        | CoreError::AgentSpawn { .. }
        | CoreError::RayPlacement(_)
        | CoreError::NotRunning { .. }
        | CoreError::Declined(_)
        | CoreError::TokenRefused { .. }
        | CoreError::Agent(_) => ControlError::new_err(text),
    }
}

/// A worker's connection to its controller: a `ControlError`, as the
/// engine's own network and protocol errors are.
pub fn worker_to_py(err: &WorkerError) -> PyErr {
    match err {
        WorkerError::Net { .. } | WorkerError::Protocol(_) => {
            ControlError::new_err(err.to_string())
        }
    }
}

pub fn usage_to_py(err: &UsageError) -> PyErr {
    ConfigError::new_err(python_words(err))
}

/// Checkpoint errors: a file or object that cannot be read or written is a
/// `StorageError` (the storage failed, not the checkpoint); anything about
/// the checkpoint itself is a `CheckpointError`.
pub fn ckpt_to_py(err: &CkptError) -> PyErr {
    match err {
        CkptError::Io { .. } | CkptError::Store(_) => StorageError::new_err(err.to_string()),
        // A folder handed to `report` that cannot be a checkpoint as it is.
        CkptError::NotADirectory(_)
        | CkptError::NotAFile(_)
        | CkptError::FileName(_)
        | CkptError::ReservedName { .. } => ConfigError::new_err(err.to_string()),
        _ => CheckpointError::new_err(err.to_string()),
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
        | LoaderError::BatchLargerThanData { .. }
        | LoaderError::CacheTooSmall { .. } => ConfigError::new_err(text),
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
        | LoaderError::Fingerprint { .. }
        | LoaderError::Changed(_)
        | LoaderError::RowGroupTooLarge { .. } => DataError::new_err(text),
        LoaderError::Store(_) => StorageError::new_err(text),
    }
}

/// A travelling executable: a key that is not meshrun's is a programming
/// error (`ValueError`); a file that cannot be read or is damaged is a
/// `StorageError` (the caller compiles instead).
pub fn executable_to_py(err: &ExecutableError) -> PyErr {
    match err {
        ExecutableError::BadKey { .. } => pyo3::exceptions::PyValueError::new_err(err.to_string()),
        ExecutableError::Damaged { .. }
        | ExecutableError::Read { .. }
        | ExecutableError::Write { .. } => StorageError::new_err(err.to_string()),
    }
}
