//! `meshrun ckpt ls | inspect | verify | export`.

use std::io::Write;
use std::path::{Path, PathBuf};

use meshrun_ckpt::boxes::elements;
use meshrun_ckpt::commit::committed;
use meshrun_ckpt::read::{itemsize, Reader};
use meshrun_ckpt::shard::dtype;
use meshrun_ckpt::CkptError;
use safetensors::tensor::TensorView;

use crate::cli::CkptCommand;

#[derive(Debug, thiserror::Error)]
pub enum CkptCliError {
    #[error(
        "no run '{run}': '{path}' does not exist; give a run name under --runs-dir or a run folder"
    )]
    NoRun { run: String, path: PathBuf },
    #[error(transparent)]
    Ckpt(#[from] CkptError),
    #[error("cannot write '{path}': {message}")]
    Export { path: PathBuf, message: String },
}

impl CkptCliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CkptCliError::NoRun { .. } | CkptCliError::Ckpt(CkptError::NotCommitted(_)) => {
                crate::exit::USAGE
            }
            _ => crate::exit::FAILURE,
        }
    }
}

fn out(text: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

pub fn run(cmd: CkptCommand) -> Result<(), CkptCliError> {
    match cmd {
        CkptCommand::Ls { run, runs_dir } => ls(&run, &runs_dir),
        CkptCommand::Inspect { path } => inspect(&path),
        CkptCommand::Verify { path } => {
            let n = Reader::open(&path)?.verify_all()?;
            out(&format!(
                "ok: {n} shards, every CRC matches ({})",
                path.display()
            ));
            Ok(())
        }
        CkptCommand::Export { path, out: target } => export(&path, &target),
    }
}

fn ls(run: &str, runs_dir: &Path) -> Result<(), CkptCliError> {
    let dir = if Path::new(run).is_dir() {
        PathBuf::from(run)
    } else {
        runs_dir.join(run)
    };
    if !dir.is_dir() {
        return Err(CkptCliError::NoRun {
            run: run.to_string(),
            path: dir,
        });
    }
    out("step\tleaves\tbytes\tpath");
    for (step, path) in committed(&dir.join("checkpoints")) {
        let reader = Reader::open(&path)?;
        let m = reader.manifest();
        let bytes: usize = m
            .leaves
            .iter()
            .map(|l| l.shape.iter().product::<usize>() * itemsize(&l.dtype).unwrap_or(0))
            .sum();
        out(&format!(
            "{step}\t{}\t{bytes}\t{}",
            m.leaves.len(),
            path.display()
        ));
    }
    Ok(())
}

fn inspect(path: &Path) -> Result<(), CkptCliError> {
    let reader = Reader::open(path)?;
    let m = reader.manifest();
    out(&format!("checkpoint {} (step {})", path.display(), m.step));
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
fn export(path: &Path, target: &Path) -> Result<(), CkptCliError> {
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
                    path: path.to_path_buf(),
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
