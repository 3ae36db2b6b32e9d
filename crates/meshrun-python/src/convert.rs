//! Python values to the engine's serde types and back, with no JSON text
//! in between: dicts, lists, strings, numbers, booleans and `None`.

use pyo3::prelude::*;
use serde::Serialize;
use serde_json::Value;

/// A Python value as a JSON-shaped value. Floats that JSON cannot hold
/// (NaN, infinities) become null; anything that is not a dict with string
/// keys, a list, a tuple, a string, a number, a bool or `None` raises
/// `TypeError` naming `what`.
pub fn to_value(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    pythonize::depythonize(obj).map_err(|e| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{what} must hold only dicts with string keys, lists, strings, numbers, booleans \
             and None: {e}"
        ))
    })
}

/// A Python dict as one of the engine's typed records: a missing, unknown
/// or mistyped field raises `ValueError` naming `what` and the field.
pub fn to_typed<T: serde::de::DeserializeOwned>(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<T> {
    pythonize::depythonize(obj)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{what}: {e}")))
}

/// An engine value as plain Python objects (dicts, lists, numbers).
pub fn to_python<T: Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    Ok(pythonize::pythonize(py, value)?.unbind())
}
