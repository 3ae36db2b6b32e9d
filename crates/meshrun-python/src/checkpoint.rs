//! Checkpoint shards for Python: writing one rank's file (GIL released),
//! reading regions of a committed checkpoint into numpy arrays, and which
//! checkpoint a worker resumes from. The folder names (`checkpoints/`,
//! `tmp-<step>`, `step-<step>`) are meshrun-ckpt's alone.

// PyO3 hands arguments over as owned values.
#![allow(clippy::needless_pass_by_value)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use meshrun_ckpt::commit::{committed, tmp_dir};
use meshrun_ckpt::manifest::Leaf;
use meshrun_ckpt::read::Reader;
use meshrun_ckpt::resume::{for_attempt, CHECKPOINTS};
use meshrun_ckpt::shard::{write_rank_file, ShardIn};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;

use crate::convert::to_python;
use crate::errors::ckpt_to_py as to_py;

/// The checkpoints folder of the run whose storage folder is `run_dir`.
#[pyfunction]
pub fn checkpoints_dir(run_dir: PathBuf) -> PathBuf {
    run_dir.join(CHECKPOINTS)
}

/// What one rank wrote of a checkpoint: its leaves and their shard
/// records, for `WorkerClient.checkpoint_written`.
#[pyclass(frozen, module = "meshrun._native")]
pub struct WrittenShards(pub Vec<Leaf>);

#[pymethods]
impl WrittenShards {
    /// How many leaves this rank wrote shards of.
    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// One shard from Python: (leaf path, dtype, global shape, region, bytes).
type PyShard<'py> = (
    String,
    String,
    Vec<usize>,
    Vec<(usize, usize)>,
    PyReadonlyArray1<'py, u8>,
);

/// The same, borrowed: (leaf, dtype, global shape, region, bytes).
type ShardView<'a> = (
    &'a str,
    &'a str,
    &'a [usize],
    &'a [(usize, usize)],
    &'a [u8],
);

/// Writes this rank's file of checkpoint `step` into the uncommitted folder
/// of that step under the checkpoints folder `root` (synced) and returns
/// this rank's leaves with their shard records, for the controller.
#[pyfunction]
pub fn write_shards(
    py: Python<'_>,
    root: PathBuf,
    step: u64,
    rank: u32,
    shards: Vec<PyShard<'_>>,
) -> PyResult<WrittenShards> {
    let dir = tmp_dir(&root, step);
    let mut leaves: BTreeMap<String, Leaf> = BTreeMap::new();
    let views: Vec<ShardView<'_>> = shards
        .iter()
        .map(|(leaf, dtype, shape, region, data)| -> PyResult<_> {
            Ok((
                leaf.as_str(),
                dtype.as_str(),
                shape.as_slice(),
                region.as_slice(),
                data.as_slice()?,
            ))
        })
        .collect::<PyResult<_>>()?;
    for (leaf, dtype, shape, _, _) in &views {
        leaves.entry((*leaf).to_string()).or_insert_with(|| Leaf {
            path: (*leaf).to_string(),
            dtype: (*dtype).to_string(),
            shape: shape.to_vec(),
            shards: vec![],
        });
    }
    let records = py
        .detach(|| {
            let inputs: Vec<ShardIn<'_>> = views
                .iter()
                .map(|(leaf, dtype, _, region, data)| ShardIn {
                    leaf: (*leaf).to_string(),
                    dtype: (*dtype).to_string(),
                    region: region.to_vec(),
                    data,
                })
                .collect();
            std::fs::create_dir_all(&dir)
                .map_err(meshrun_ckpt::CkptError::io("cannot create", &dir))?;
            write_rank_file(&dir, rank, &inputs)
        })
        .map_err(|e| to_py(&e))?;
    for (leaf, record) in records {
        if let Some(l) = leaves.get_mut(&leaf) {
            l.shards.push(record);
        }
    }
    Ok(WrittenShards(leaves.into_values().collect()))
}

/// The checkpoint `meshrun.get_checkpoint()` gives, as (path, step), from
/// the checkpoints folder `root`. With `attempt`, the controller's choice
/// for that attempt (`chosen`, `None`: start from the beginning) or a newer
/// one the attempt committed since; without it (no controller chose), the
/// newest committed.
#[pyfunction]
#[pyo3(signature = (root, attempt=None, chosen=None))]
pub fn resume_checkpoint(
    root: PathBuf,
    attempt: Option<u32>,
    chosen: Option<u64>,
) -> Option<(String, u64)> {
    let found = match attempt {
        Some(attempt) => for_attempt(&root, chosen, attempt),
        None => committed(&root).pop(),
    };
    found.map(|(step, path)| (path.display().to_string(), step))
}

#[pyclass(frozen, module = "meshrun._native")]
pub struct CheckpointReader(Mutex<Reader>);

#[pymethods]
impl CheckpointReader {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        py.detach(|| Reader::open(&path))
            .map(|r| Self(Mutex::new(r)))
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

    /// Checks every CRC; returns the number of tensors checked.
    fn verify(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.0.lock().expect("reader lock").verify_all())
            .map_err(|e| to_py(&e))
    }
}
