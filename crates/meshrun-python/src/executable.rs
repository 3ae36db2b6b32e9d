//! Executables that travel between attempts (`meshrun.jit`): bytes in and
//! out of the run's host folder; the engine checks them, the GIL is free
//! while it reads and writes.

use std::path::PathBuf;

use meshrun_ckpt::executable;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::executable_to_py;

/// Writes the executable of `key` into the run's folder `run_scratch`
/// (the worker's `MESHRUN_SCRATCH`); gives the file's bytes.
#[pyfunction]
pub fn store_executable(
    py: Python<'_>,
    run_scratch: PathBuf,
    key: &str,
    meta: &str,
    payload: &[u8],
) -> PyResult<u64> {
    py.detach(move || executable::write(&run_scratch, key, meta, payload))
        .map_err(|e| executable_to_py(&e))
}

/// The executable of `key` and its meta, `None` when there is none;
/// raises `StorageError` saying why one that is there cannot be used.
#[pyfunction]
pub fn load_executable(
    py: Python<'_>,
    run_scratch: PathBuf,
    key: &str,
) -> PyResult<Option<(String, Py<PyBytes>)>> {
    let found = py
        .detach(move || executable::read(&run_scratch, key))
        .map_err(|e| executable_to_py(&e))?;
    Ok(found.map(|(meta, payload)| (meta, PyBytes::new(py, &payload).unbind())))
}

/// Removes the executable of `key` (found stale), if it is there.
#[pyfunction]
pub fn remove_executable(py: Python<'_>, run_scratch: PathBuf, key: &str) -> PyResult<()> {
    py.detach(move || executable::remove(&run_scratch, key))
        .map_err(|e| executable_to_py(&e))
}

/// Every executable of the run on this host, as (key, meta), from their
/// headers.
#[pyfunction]
pub fn list_executables(py: Python<'_>, run_scratch: PathBuf) -> PyResult<Vec<(String, String)>> {
    py.detach(move || executable::list(&run_scratch))
        .map_err(|e| executable_to_py(&e))
}
