//! Checkpoint shards for Python: writing one rank's file (GIL released),
//! reading regions of a committed checkpoint into numpy arrays, and which
//! checkpoint a worker resumes from. The folder names (`checkpoints/`,
//! `tmp-<step>`, `step-<step>`) are meshrun-ckpt's alone.

// PyO3 hands arguments over as owned values.
#![allow(clippy::needless_pass_by_value)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use meshrun_ckpt::commit::committed;
use meshrun_ckpt::directory::FileRecord;
use meshrun_ckpt::manifest::Leaf;
use meshrun_ckpt::read::{Reader, Request};
use meshrun_ckpt::resume::{for_attempt, CHECKPOINTS};
use meshrun_ckpt::shard::{write_rank, ShardIn};
use meshrun_ckpt::store::Location;
use numpy::{PyArray1, PyArrayMethods, PyReadwriteArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::convert::to_python;
use crate::errors::ckpt_to_py as to_py;

/// A path (`str` or `os.PathLike`) or an object-store URL, as the engine
/// takes it.
fn location(any: &Bound<'_, PyAny>) -> PyResult<Location> {
    if let Ok(text) = any.extract::<String>() {
        return Location::parse(&text).map_err(|e| to_py(&e.into()));
    }
    Ok(Location::Local(any.extract::<std::path::PathBuf>()?))
}

/// The checkpoints folder (a path or a URL) of the run whose storage
/// folder is `run_dir`.
#[pyfunction]
pub fn checkpoints_dir(run_dir: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(location(run_dir)?.join(CHECKPOINTS).to_string())
}

/// What one rank wrote of a checkpoint, for
/// `WorkerClient.checkpoint_written`: its leaves and their shard records,
/// or the records of the files of the folder it handed over.
#[pyclass(frozen, module = "meshrun._native")]
pub struct WrittenShards {
    pub leaves: Vec<Leaf>,
    pub files: Option<Vec<FileRecord>>,
}

#[pymethods]
impl WrittenShards {
    /// How many leaves (or files) this rank wrote.
    fn __len__(&self) -> usize {
        self.files.as_ref().map_or(self.leaves.len(), Vec::len)
    }
}

/// Copies the local folder `src` as rank `rank`'s part of checkpoint
/// `step` under the checkpoints folder `root` (a path, synced, or a URL:
/// uploaded); returns the records of its files for the controller.
#[pyfunction]
pub fn write_directory(
    py: Python<'_>,
    root: &Bound<'_, PyAny>,
    step: u64,
    rank: u32,
    src: std::path::PathBuf,
) -> PyResult<WrittenShards> {
    let root = location(root)?;
    let files = py
        .detach(|| meshrun_ckpt::directory::write_directory(&root, step, rank, &src))
        .map_err(|e| to_py(&e))?;
    Ok(WrittenShards {
        leaves: Vec::new(),
        files: Some(files),
    })
}

/// The committed checkpoints under the checkpoints folder `root`, oldest
/// first, as (folder, step).
#[pyfunction]
pub fn committed_checkpoints(
    py: Python<'_>,
    root: &Bound<'_, PyAny>,
) -> PyResult<Vec<(String, u64)>> {
    let root = location(root)?;
    let found = py.detach(|| committed(&root)).map_err(|e| to_py(&e))?;
    Ok(found
        .into_iter()
        .map(|(step, dir)| (dir.to_string(), step))
        .collect())
}

/// Copies the files of the directory checkpoint `dir` (a path or a URL)
/// into the local folder `dest`, each checked; returns how many.
#[pyfunction]
pub fn fetch_directory(
    py: Python<'_>,
    dir: &Bound<'_, PyAny>,
    dest: std::path::PathBuf,
) -> PyResult<usize> {
    let dir = location(dir)?;
    py.detach(|| meshrun_ckpt::directory::fetch_directory(&dir, &dest))
        .map_err(|e| to_py(&e))
}

/// One shard from Python: (leaf path, dtype, global shape, region, bytes,
/// whether it is this process's own copy of a per-process leaf).
type PyShard<'py> = (
    String,
    String,
    Vec<usize>,
    Vec<(usize, usize)>,
    Bound<'py, PyArray1<u8>>,
    bool,
);

/// A contiguous numpy byte array, kept alive (and so its buffer) while the
/// engine holds its bytes: the upload reads the host copy `save` made
/// without copying it again.
struct Held {
    _array: Py<PyArray1<u8>>,
    ptr: usize,
    len: usize,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `_array` owns the buffer and keeps it alive; it is a
        // contiguous uint8 array (checked in `held`) that nothing writes
        // while a checkpoint is saved (it is the host copy `save` made).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr as *const u8, self.len)
        }
    }
}

fn held(array: &Bound<'_, PyArray1<u8>>) -> PyResult<Bytes> {
    if !array.is_c_contiguous() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a checkpoint shard must be a contiguous uint8 array",
        ));
    }
    let len = array.len();
    let ptr = if len == 0 { 0 } else { array.data() as usize };
    if len == 0 {
        return Ok(Bytes::new());
    }
    Ok(meshrun_ckpt::store::remote_bytes(Arc::new(Held {
        _array: array.clone().unbind(),
        ptr,
        len,
    })))
}

/// Writes this rank's file of checkpoint `step` under the checkpoints
/// folder `root` (a path, synced to disk, or a URL: uploaded) and returns
/// this rank's leaves with their shard records, for the controller.
#[pyfunction]
pub fn write_shards(
    py: Python<'_>,
    root: &Bound<'_, PyAny>,
    step: u64,
    rank: u32,
    shards: Vec<PyShard<'_>>,
) -> PyResult<WrittenShards> {
    let root = location(root)?;
    let mut leaves: BTreeMap<String, Leaf> = BTreeMap::new();
    let mut inputs = Vec::with_capacity(shards.len());
    for (leaf, dtype, shape, region, data, per_process) in &shards {
        leaves.entry(leaf.clone()).or_insert_with(|| Leaf {
            path: leaf.clone(),
            dtype: dtype.clone(),
            shape: shape.clone(),
            shards: vec![],
        });
        inputs.push(ShardIn {
            leaf: leaf.clone(),
            dtype: dtype.clone(),
            region: region.clone(),
            data: held(data)?,
            per_process: *per_process,
        });
    }
    let records = py
        .detach(|| write_rank(&root, step, rank, &inputs))
        .map_err(|e| to_py(&e))?;
    for (leaf, record) in records {
        if let Some(l) = leaves.get_mut(&leaf) {
            l.shards.push(record);
        }
    }
    Ok(WrittenShards {
        leaves: leaves.into_values().collect(),
        files: None,
    })
}

/// The checkpoint `meshrun.get_checkpoint()` gives, as (path, step), from
/// the checkpoints folder `root`. With `attempt`, the controller's choice
/// for that attempt (`chosen`, `None`: start from the beginning) or a newer
/// one the attempt committed since; without it (no controller chose), the
/// newest committed.
#[pyfunction]
#[pyo3(signature = (root, attempt=None, chosen=None))]
pub fn resume_checkpoint(
    py: Python<'_>,
    root: &Bound<'_, PyAny>,
    attempt: Option<u32>,
    chosen: Option<u64>,
) -> PyResult<Option<(String, u64)>> {
    let root = location(root)?;
    let found = py
        .detach(|| match attempt {
            Some(attempt) => for_attempt(&root, chosen, attempt),
            None => committed(&root).map(|mut all| all.pop()),
        })
        .map_err(|e| to_py(&e))?;
    Ok(found.map(|(step, path)| (path.to_string(), step)))
}

/// The checkpoint this worker resumes from (path, step), or `None`: the
/// one the controller chose for the attempt (from storage or the hosts'
/// memory, as the worker's environment says) or a newer one the attempt
/// committed since; without a controller, the newest committed under
/// `root`. The decision is `meshrun_worker::resume`'s.
#[pyfunction]
pub fn resume_choice(py: Python<'_>, root: &Bound<'_, PyAny>) -> PyResult<Option<(String, u64)>> {
    let root = location(root)?;
    let chosen = meshrun_worker::resume::Chosen::from_vars(|k| std::env::var(k).ok())
        .map_err(pyo3::exceptions::PyValueError::new_err)?;
    let found = py
        .detach(|| meshrun_worker::resume::choice(&root, chosen.as_ref()))
        .map_err(|e| to_py(&e))?;
    Ok(found.map(|(step, path)| (path.to_string(), step)))
}

#[pyclass(frozen, module = "meshrun._native")]
pub struct CheckpointReader(Mutex<Reader>);

#[pymethods]
impl CheckpointReader {
    /// Opens the committed checkpoint at `path`; `rank` is whose copy of
    /// a per-process leaf it reads.
    #[new]
    #[pyo3(signature = (path, rank=0))]
    fn new(py: Python<'_>, path: &Bound<'_, PyAny>, rank: u32) -> PyResult<Self> {
        let path = location(path)?;
        py.detach(|| Reader::open(&path))
            .map(|r| Self(Mutex::new(r.as_rank(rank))))
            .map_err(|e| to_py(&e))
    }

    /// The manifest: `{"format", "step", "leaves": [{"path", "dtype",
    /// "shape", "shards"}], "extra", "attempt"}`.
    fn manifest(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, self.0.lock().expect("reader lock").manifest())
    }

    /// Reads `region` of leaf `path` (row-major) into `out`, a writable
    /// contiguous uint8 array of exactly that many bytes. The caller
    /// allocates it so it can choose the alignment: on CPU, JAX adopts a
    /// 64-byte-aligned host buffer without copying it.
    fn read_into(
        &self,
        py: Python<'_>,
        path: &str,
        region: Vec<(usize, usize)>,
        mut out: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        let out = out.as_slice_mut()?;
        py.detach(|| {
            self.0
                .lock()
                .expect("reader lock")
                .read_region(path, &region, out)
        })
        .map_err(|e| to_py(&e))
    }

    /// Reads many regions at once, `[(path, region, out), ...]` as for
    /// `read_into`: what they need is fetched together (in an object store,
    /// many ranges in flight).
    fn read_many(&self, py: Python<'_>, requests: Vec<RegionRequest<'_>>) -> PyResult<()> {
        let mut requests = requests;
        let mut batch: Vec<Request<'_>> = Vec::with_capacity(requests.len());
        for (path, region, out) in &mut requests {
            batch.push(Request {
                leaf: path.as_str(),
                region: region.as_slice(),
                out: out.as_slice_mut()?,
            });
        }
        py.detach(|| self.0.lock().expect("reader lock").read_regions(&mut batch))
            .map_err(|e| to_py(&e))
    }

    /// Checks every CRC, then that every leaf can be restored whole;
    /// returns the number of tensors checked.
    fn verify(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| {
            let mut reader = self.0.lock().expect("reader lock");
            let n = reader.verify_all()?;
            reader.check_whole().map(|()| n)
        })
        .map_err(|e| to_py(&e))
    }
}

/// One region to read: the leaf's path, its `(start, stop)` per
/// dimension, and the buffer it goes into.
type RegionRequest<'py> = (String, Vec<(usize, usize)>, PyReadwriteArray1<'py, u8>);

/// Seconds to upload `size` bytes as one object under the storage folder
/// `url` and to download it again, with the client stack and concurrency
/// of checkpoints: the storage's raw bandwidth, for benchmarks.
#[pyfunction]
pub fn storage_roundtrip(py: Python<'_>, url: &str, size: usize) -> PyResult<(f64, f64)> {
    let Location::Remote(dir) = Location::parse(url).map_err(|e| to_py(&e.into()))? else {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "'{url}' is not an object-storage URL"
        )));
    };
    let step = meshrun_ckpt::shard::CHUNK * meshrun_ckpt::read::CHUNKS_PER_REQUEST;
    py.detach(|| meshrun_ckpt::store::roundtrip(&dir, size, step))
        .map_err(|e| to_py(&e.into()))
}

/// Whether a rank that cannot write its shards trains on (the run's
/// `on_save_error`, from the worker's environment; the default when unset).
#[pyfunction]
pub fn save_errors_continue() -> bool {
    let value = std::env::var(meshrun_protocol::env::ON_SAVE_ERROR).ok();
    meshrun_plan::SaveErrorPolicy::from_env(value.as_deref())
        == meshrun_plan::SaveErrorPolicy::Continue
}
