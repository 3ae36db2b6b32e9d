//! The data loader for Python: sources, and a loader whose batches arrive
//! as numpy arrays over the buffers Rust filled (no copy).

// PyO3 hands arguments over as owned values.
#![allow(clippy::needless_pass_by_value)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshrun_data::blob::CacheConfig;
use meshrun_data::source::{NpySource, ParquetOptions, ParquetSource, TokenFile};
use meshrun_data::{Loader, LoaderConfig, Source, Wait};
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::errors::data_to_py;

#[pyclass(frozen, module = "meshrun._native")]
pub struct DataSource(Arc<dyn Source>);

#[pymethods]
impl DataSource {
    /// `path`: a local path or an object URL; `cache_bytes`: the scratch
    /// disk the block cache of remote data may use.
    #[staticmethod]
    #[pyo3(signature = (path, dtype, seq_len, cache_bytes=None))]
    fn tokens(
        py: Python<'_>,
        path: String,
        dtype: &str,
        seq_len: u64,
        cache_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let src = py
            .detach(|| TokenFile::open(&path, dtype, seq_len, CacheConfig::new(cache_bytes)))
            .map_err(|e| data_to_py(&e))?;
        Ok(Self(Arc::new(src)))
    }

    #[staticmethod]
    #[pyo3(signature = (path, cache_bytes=None))]
    fn npy(py: Python<'_>, path: String, cache_bytes: Option<u64>) -> PyResult<Self> {
        let src = py
            .detach(|| NpySource::open(&path, CacheConfig::new(cache_bytes)))
            .map_err(|e| data_to_py(&e))?;
        Ok(Self(Arc::new(src)))
    }

    #[staticmethod]
    #[pyo3(signature = (paths, columns, seq_len=None, max_memory=None, cache_bytes=None))]
    fn parquet(
        py: Python<'_>,
        paths: Vec<String>,
        columns: Vec<String>,
        seq_len: Option<u64>,
        max_memory: Option<u64>,
        cache_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let options = ParquetOptions {
            seq_len,
            max_memory: max_memory.unwrap_or(meshrun_data::source::DEFAULT_MAX_MEMORY),
            cache: CacheConfig::new(cache_bytes),
        };
        let src = py
            .detach(|| ParquetSource::open(&paths, &columns, options))
            .map_err(|e| data_to_py(&e))?;
        Ok(Self(Arc::new(src)))
    }

    /// Bytes fetched from object storage so far (0 for local files).
    #[getter]
    fn fetched_bytes(&self) -> u64 {
        self.0.fetched()
    }

    #[getter]
    fn records(&self) -> u64 {
        self.0.records()
    }

    #[getter]
    fn fingerprint(&self) -> &str {
        self.0.fingerprint()
    }

    /// `[(name, numpy dtype name, per-record shape), ...]`
    #[getter]
    fn fields(&self) -> Vec<(String, &'static str, Vec<usize>)> {
        self.0
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.dtype.numpy_name(), f.shape.clone()))
            .collect()
    }
}

/// One batch as Python gets it: step, epoch, a flat uint8 array per field
/// (viewed as the field's dtype and shape by the Python layer), the mask
/// and the record indices.
type PyBatch<'py> = (
    u64,
    u64,
    Vec<Bound<'py, PyArray1<u8>>>,
    Bound<'py, PyArray1<u8>>,
    Bound<'py, PyArray1<i64>>,
);

/// Hands each buffer to numpy, which takes ownership of the `Vec`.
fn to_python(py: Python<'_>, b: meshrun_data::Batch) -> PyBatch<'_> {
    let fields = b
        .fields
        .into_iter()
        .map(|v| PyArray1::from_vec(py, v))
        .collect();
    (
        b.step,
        b.epoch,
        fields,
        PyArray1::from_vec(py, b.mask),
        PyArray1::from_vec(py, b.indices),
    )
}

#[pyclass(frozen, module = "meshrun._native")]
pub struct DataLoader(Mutex<Loader>);

#[pymethods]
impl DataLoader {
    #[new]
    #[pyo3(signature = (source, *, global_batch, rank, processes, seed, shuffle, drop_last, prefetch, threads, offset, epochs))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        source: &DataSource,
        global_batch: u64,
        rank: u64,
        processes: u64,
        seed: u64,
        shuffle: bool,
        drop_last: bool,
        prefetch: usize,
        threads: usize,
        offset: u64,
        epochs: Option<u64>,
    ) -> PyResult<Self> {
        let cfg = LoaderConfig {
            global_batch,
            rank,
            processes,
            seed,
            shuffle,
            drop_last,
            prefetch,
            threads,
            start_offset: offset,
            epochs,
        };
        crate::signals::with_signals_blocked(|| Loader::start(Arc::clone(&source.0), &cfg))
            .map(|l| Self(Mutex::new(l)))
            .map_err(|e| data_to_py(&e))
    }

    /// The next batch, or None after the last epoch. Waits without the GIL
    /// and checks for Ctrl-C every 100 ms.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<PyBatch<'py>>> {
        // Most of the time the batch is ready: take it without giving up
        // the GIL, which costs more than the take itself.
        let ready = self.0.lock().expect("loader lock").try_next();
        if let Err(Wait::Failed(e)) = ready {
            return Err(data_to_py(&e));
        }
        if let Ok(got) = ready {
            // A Ctrl-C is looked at on every batch, not only while waiting
            // for one: the pending flag is read directly, whether or not
            // the interpreter has noticed it yet.
            py.check_signals()?;
            return Ok(got.map(|b| to_python(py, b)));
        }
        loop {
            let got = py.detach(|| {
                self.0
                    .lock()
                    .expect("loader lock")
                    .next_timeout(Duration::from_millis(100))
            });
            match got {
                Ok(got) => return Ok(got.map(|b| to_python(py, b))),
                Err(Wait::Pending) => py.check_signals()?,
                Err(Wait::Failed(e)) => return Err(data_to_py(&e)),
            }
        }
    }

    /// Global samples consumed so far.
    #[getter]
    fn offset(&self) -> u64 {
        self.0.lock().expect("loader lock").offset()
    }
}
