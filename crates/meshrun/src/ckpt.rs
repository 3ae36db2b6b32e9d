//! `meshrun ckpt ls | inspect | verify | export`.

use std::io::Write;
use std::path::{Path, PathBuf};

use meshrun_ckpt::boxes::elements;
use meshrun_ckpt::commit::committed;
use meshrun_ckpt::read::{itemsize, Reader};
use meshrun_ckpt::shard::dtype;
use meshrun_ckpt::store::{is_url, Location};
use meshrun_ckpt::CkptError;
use safetensors::tensor::TensorView;

use meshrun_plan::check_run_name;

use crate::cli::CkptCommand;
use crate::table::table;

#[derive(Debug, thiserror::Error)]
pub enum CkptCliError {
    #[error(
        "no run '{run}': '{path}' does not exist; give a run name under --runs-dir or a run folder"
    )]
    NoRun { run: String, path: PathBuf },
    /// Boxed: `UsageError` is large, and this is the rare path.
    #[error(transparent)]
    BadName(Box<meshrun_plan::UsageError>),
    #[error(transparent)]
    Ckpt(#[from] CkptError),
    #[error("cannot write '{path}': {message}")]
    Export { path: PathBuf, message: String },
}

impl From<meshrun_ckpt::store::StoreError> for CkptCliError {
    fn from(e: meshrun_ckpt::store::StoreError) -> Self {
        CkptCliError::Ckpt(e.into())
    }
}

impl From<meshrun_plan::UsageError> for CkptCliError {
    fn from(e: meshrun_plan::UsageError) -> Self {
        CkptCliError::BadName(Box::new(e))
    }
}

impl CkptCliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CkptCliError::NoRun { .. }
            | CkptCliError::BadName(_)
            | CkptCliError::Ckpt(CkptError::NotCommitted(_)) => crate::exit::USAGE,
            _ => crate::exit::FAILURE,
        }
    }
}

fn out(text: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

pub fn run(cmd: CkptCommand) -> Result<(), CkptCliError> {
    match cmd {
        CkptCommand::Ls {
            run,
            runs_dir,
            storage,
        } => ls(&run, &runs_dir, storage.as_deref()),
        CkptCommand::Inspect { path } => inspect(&Location::parse(&path)?),
        CkptCommand::Verify { path } => {
            // Two verdicts: whether the bytes are what was committed, then
            // whether every leaf can be restored whole from them.
            let path = Location::parse(&path)?;
            let mut reader = Reader::open(&path)?;
            let n = reader.verify_all()?;
            if let Err(e) = reader.check_whole() {
                out(&format!(
                    "bytes intact: {n} shards, every CRC matches ({path})"
                ));
                return Err(e.into());
            }
            out(&format!("ok: {n} shards, every CRC matches ({path})"));
            Ok(())
        }
        CkptCommand::Export { path, out: target } => export(&Location::parse(&path)?, &target),
    }
}

/// The folder `run` names: a folder given as a path (it exists, or has a
/// '/'), else a run name under `runs_dir`, checked like `meshrun run --name`.
fn run_folder(run: &str, runs_dir: &Path) -> Result<PathBuf, CkptCliError> {
    let dir = if Path::new(run).is_dir() || run.contains('/') {
        PathBuf::from(run)
    } else {
        check_run_name(run)?;
        runs_dir.join(run)
    };
    if !dir.is_dir() {
        return Err(CkptCliError::NoRun {
            run: run.to_string(),
            path: dir,
        });
    }
    Ok(dir)
}

/// The storage folder of `run`: a URL of one as given; a run name under
/// `storage`; else the run's folder, or where its run.json says its
/// storage is (a run given --storage keeps its checkpoints there).
fn storage_folder(
    run: &str,
    runs_dir: &Path,
    storage: Option<&str>,
) -> Result<Location, CkptCliError> {
    if is_url(run) {
        return Ok(Location::parse(run)?);
    }
    if let Some(root) = storage {
        check_run_name(run)?;
        return Ok(Location::parse(root)?.join(run));
    }
    let dir = run_folder(run, runs_dir)?;
    Ok(match meshrun_record::read::run_record(&dir) {
        Ok(Some(record)) => Location::parse(&record.storage_dir(&dir))?,
        _ => Location::Local(dir),
    })
}

fn ls(run: &str, runs_dir: &Path, storage: Option<&str>) -> Result<(), CkptCliError> {
    let checkpoints =
        storage_folder(run, runs_dir, storage)?.join(meshrun_record::names::CHECKPOINTS);
    let mut rows = Vec::new();
    for (step, path) in committed(&checkpoints)? {
        let reader = Reader::open(&path)?;
        let m = reader.manifest();
        let bytes: usize = m
            .leaves
            .iter()
            .map(|l| l.shape.iter().product::<usize>() * itemsize(&l.dtype).unwrap_or(0))
            .sum();
        rows.push(vec![
            step.to_string(),
            m.leaves.len().to_string(),
            bytes.to_string(),
            path.to_string(),
        ]);
    }
    if rows.is_empty() {
        out(&format!("no committed checkpoints in '{checkpoints}'"));
    } else {
        let text = table(&["STEP", "LEAVES", "BYTES", "PATH"], &rows);
        out(text.trim_end());
    }
    Ok(())
}

fn inspect(path: &Location) -> Result<(), CkptCliError> {
    let reader = Reader::open(path)?;
    let m = reader.manifest();
    out(&format!("checkpoint {path} (step {})", m.step));
    if let Some(metrics) = m.extra.get("metrics") {
        out(&format!("metrics: {metrics}"));
    }
    out("leaf\tdtype\tshape\tbytes\tshards");
    let mut total = 0;
    for l in &m.leaves {
        let bytes = l.shape.iter().product::<usize>() * itemsize(&l.dtype)?;
        total += bytes;
        out(&format!(
            "{}\t{}\t{:?}\t{bytes}\t{}",
            l.path,
            l.dtype,
            l.shape,
            l.shards.len()
        ));
    }
    out(&format!("total: {} leaves, {total} bytes", m.leaves.len()));
    Ok(())
}

/// Assembles every leaf whole and writes them to one safetensors file,
/// named by their paths, for inference tools.
fn export(path: &Location, target: &Path) -> Result<(), CkptCliError> {
    let mut reader = Reader::open(path)?;
    let leaves = reader.manifest().leaves.clone();
    let mut data = Vec::with_capacity(leaves.len());
    for l in &leaves {
        let region: Vec<(usize, usize)> = l.shape.iter().map(|&d| (0, d)).collect();
        let mut buf = vec![0u8; elements(&region) * itemsize(&l.dtype)?];
        reader.read_region(&l.path, &region, &mut buf)?;
        data.push(buf);
    }
    let bad = |message: String| CkptCliError::Export {
        path: target.to_path_buf(),
        message,
    };
    let views = leaves
        .iter()
        .zip(&data)
        .map(|(l, buf)| {
            TensorView::new(dtype(&l.dtype)?, l.shape.clone(), buf)
                .map(|v| (l.path.clone(), v))
                .map_err(|e| CkptError::Format {
                    path: path.as_path(),
                    message: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>, CkptError>>()?;
    safetensors::serialize_to_file(views, None, target).map_err(|e| bad(e.to_string()))?;
    out(&format!(
        "wrote {} ({} tensors)",
        target.display(),
        leaves.len()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_given_by_name_or_folder() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("a")).unwrap();
        assert_eq!(run_folder("a", tmp.path()).unwrap(), tmp.path().join("a"));
        let folder = tmp.path().join("a").display().to_string();
        assert_eq!(
            run_folder(&folder, Path::new("elsewhere")).unwrap(),
            tmp.path().join("a")
        );
        let bad = run_folder("-a", tmp.path()).unwrap_err();
        assert_eq!(bad.exit_code(), crate::exit::USAGE);
        assert!(
            bad.to_string().starts_with("run name '-a' is not accepted"),
            "{bad}"
        );
        let missing = run_folder("b", tmp.path()).unwrap_err();
        assert!(missing.to_string().starts_with("no run 'b': "), "{missing}");
    }
}
