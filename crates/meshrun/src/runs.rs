//! `meshrun ls | status | report`: reading runs back from their folders.
//! Rendering is separate from printing so the tables can be
//! snapshot-tested.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use meshrun_core::controller::goodput::PARTS as GOODPUT_ORDER;
use meshrun_core::plan::check_run_name;
use meshrun_core::rundir::{lock_is_held, shown_state};
use serde_json::Value;

use crate::table::{duration_text, number, table};

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error("no run named '{name}' in {}; `meshrun ls --runs-dir {}` lists the runs there", dir.display(), dir.display())]
    NoRun { name: String, dir: PathBuf },
    /// Boxed: `UsageError` is large, and this is the rare path.
    #[error(transparent)]
    BadName(Box<meshrun_core::UsageError>),
    #[error(
        "runs directory '{}' does not exist (looked from {}); give the --runs-dir the runs \
         were started with (`meshrun run` keeps them in ./runs by default)",
        dir.display(), cwd.display()
    )]
    NoRunsDir { dir: PathBuf, cwd: PathBuf },
    #[error("cannot read the runs directory '{}': {source}", dir.display())]
    RunsDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("run '{name}' has no log for rank {rank} (it has ranks 0 to {last}); see {}", dir.display())]
    NoRank {
        name: String,
        rank: u32,
        last: u32,
        dir: PathBuf,
    },
    #[error("rank {rank}'s log of run '{name}' has no attempt {attempt} (attempts: {have:?})")]
    NoAttempt {
        name: String,
        rank: u32,
        attempt: u32,
        have: Vec<u32>,
    },
    #[error("cannot read '{}': {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Core(#[from] meshrun_core::CoreError),
}

impl From<meshrun_core::UsageError> for RunsError {
    fn from(e: meshrun_core::UsageError) -> Self {
        RunsError::BadName(Box::new(e))
    }
}

impl RunsError {
    pub fn exit_code(&self) -> i32 {
        match self {
            RunsError::NoRun { .. }
            | RunsError::BadName(_)
            | RunsError::NoRunsDir { .. }
            | RunsError::NoRank { .. }
            | RunsError::NoAttempt { .. } => crate::exit::USAGE,
            _ => crate::exit::FAILURE,
        }
    }
}

/// What `ls` and `status` know of one run.
#[derive(Debug, Default)]
pub struct RunView {
    /// The folder's name: the one every command takes, whatever name
    /// run.json recorded (a copied or renamed folder keeps the old one).
    pub name: String,
    pub dir: PathBuf,
    pub record: Value,
    /// As recorded, except `interrupted` for a run recorded as running
    /// whose controller is gone, `starting` for a live controller that has
    /// not written run.json yet, and `damaged` when run.json cannot be read.
    pub state: String,
    /// Whether a live controller holds the run's lock.
    pub live: bool,
    /// What is wrong with run.json, for a damaged run.
    pub problem: Option<String>,
    pub attempts: usize,
    pub last: Option<Value>,
    pub step: Option<u64>,
    pub loss: Option<f64>,
    pub duration: Option<Duration>,
    pub goodput: Option<Value>,
}

fn parse_time(text: Option<&str>) -> Option<SystemTime> {
    humantime::parse_rfc3339(text?).ok()
}

/// The complete records among the last 64 KiB of a JSON-lines file,
/// newest first.
fn last_records(path: &Path) -> Vec<Value> {
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut text = String::new();
    if file
        .seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))
        .is_err()
        || file.read_to_string(&mut text).is_err()
    {
        return Vec::new();
    }
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// The time of the newest metrics record or event.
fn last_written(dir: &Path, metrics: &[Value]) -> Option<SystemTime> {
    let events = last_records(&dir.join("events.jsonl"));
    [metrics.first(), events.first()]
        .into_iter()
        .flatten()
        .filter_map(|r| r["time"].as_f64())
        .filter(|t| t.is_finite() && *t >= 0.0)
        .reduce(f64::max)
        .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(t))
}

const NO_RECORD: &str = "run.json is missing";

/// run.json, or what is wrong with it; `None` for a folder that is not a
/// run's (no run.json, no lock file, no events).
fn read_record(dir: &Path) -> Option<Result<Value, String>> {
    let bytes = match std::fs::read(dir.join("run.json")) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let run_folder = dir.join(".lock").exists() || dir.join("events.jsonl").exists();
            return run_folder.then(|| Err(NO_RECORD.to_string()));
        }
        Err(e) => return Some(Err(format!("run.json cannot be read: {e}"))),
    };
    Some(match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("run.json is not a JSON object".to_string()),
        Err(e) => Err(format!("run.json cannot be parsed: {e}")),
    })
}

impl RunView {
    /// Reads a run's folder; `now` ends the duration of a running run.
    /// `None` when the folder is not a run's.
    pub fn load(dir: &Path, now: SystemTime) -> Option<Self> {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let live = lock_is_held(dir);
        let record = match read_record(dir)? {
            Ok(record) => record,
            // Between taking the lock and its first attempt a controller
            // has not written run.json yet.
            Err(problem) if live && problem == NO_RECORD => {
                return Some(Self {
                    name,
                    dir: dir.to_path_buf(),
                    state: "starting".into(),
                    live,
                    ..Self::default()
                })
            }
            Err(problem) => {
                return Some(Self {
                    name,
                    dir: dir.to_path_buf(),
                    state: "damaged".into(),
                    problem: Some(problem),
                    ..Self::default()
                })
            }
        };
        let attempts = record["attempts"].as_array().map_or(0, Vec::len);
        let started = parse_time(record["created"].as_str());
        let ended = record["attempts"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|a| parse_time(a["ended"].as_str()));
        let recorded = record["state"].as_str().unwrap_or("unknown");
        let state = shown_state(recorded, live).to_string();
        let tail = last_records(&dir.join("metrics.jsonl"));
        let duration = started.and_then(|s| {
            let end = match state.as_str() {
                "running" => Some(now),
                // Its controller died without recording an end: the run
                // lasted at least until the last thing it wrote.
                "interrupted" => last_written(dir, &tail),
                _ => ended,
            };
            end?.duration_since(s).ok()
        });
        let last = tail.first();
        let metrics = last.map(|r| &r["metrics"]);
        let goodput = std::fs::read(dir.join("goodput.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        Some(Self {
            name,
            dir: dir.to_path_buf(),
            state,
            live,
            problem: None,
            attempts,
            step: last.and_then(|r| r["step"].as_u64()),
            loss: tail.iter().find_map(|r| r["metrics"]["loss"].as_f64()),
            last: metrics.cloned(),
            duration,
            goodput,
            record,
        })
    }
}

/// The run named `name` (checked like `meshrun run --name`) in `runs_dir`.
pub(crate) fn find(name: &str, runs_dir: &Path) -> Result<RunView, RunsError> {
    check_run_name(name)?;
    let dir = runs_dir.join(name);
    RunView::load(&dir, SystemTime::now()).ok_or_else(|| RunsError::NoRun {
        name: name.to_string(),
        dir: runs_dir.to_path_buf(),
    })
}

/// The `ls` table, newest run first.
pub fn render_ls(runs: &[RunView], runs_dir: &Path) -> String {
    if runs.is_empty() {
        return format!("no runs in '{}'\n", runs_dir.display());
    }
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let known = r.problem.is_none() && r.state != "starting";
            vec![
                r.name.clone(),
                r.state.clone(),
                if known {
                    r.attempts.to_string()
                } else {
                    dash()
                },
                r.step.map_or_else(dash, |s| s.to_string()),
                r.loss.map_or_else(dash, number),
                duration_text(r.duration),
            ]
        })
        .collect();
    table(
        &["NAME", "STATE", "ATTEMPTS", "STEP", "LOSS", "DURATION"],
        &rows,
    )
}

/// Every run folder under `runs_dir`, damaged ones included.
pub fn load_all(runs_dir: &Path, now: SystemTime) -> Result<Vec<RunView>, RunsError> {
    let entries = std::fs::read_dir(runs_dir).map_err(|source| RunsError::RunsDir {
        dir: runs_dir.to_path_buf(),
        source,
    })?;
    let mut runs: Vec<RunView> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| RunView::load(&e.path(), now))
        .collect();
    runs.sort_by(|a, b| {
        let created = |r: &RunView| r.record["created"].as_str().unwrap_or("").to_string();
        created(b).cmp(&created(a)).then(a.name.cmp(&b.name))
    });
    Ok(runs)
}

fn failure_text(f: &Value) -> String {
    format!(
        "rank {} {}",
        f["rank"],
        meshrun_core::report::model::headline(&f["cause"])
    )
}

/// The `status` page of one run.
pub fn render_status(run: &RunView) -> String {
    let mut out = String::new();
    let r = &run.record;
    let _ = writeln!(out, "run       {}", run.name);
    let _ = writeln!(out, "state     {}", run.state);
    if run.problem.is_some() || run.state == "starting" {
        return render_unrecorded(run, out);
    }
    let _ = writeln!(out, "created   {}", r["created"].as_str().unwrap_or("-"));
    let _ = writeln!(out, "duration  {}", duration_text(run.duration));
    let plan = &r["plan"];
    let _ = writeln!(
        out,
        "layout    {} process(es) on {} host(s), {}{}",
        plan["nprocs"],
        plan["hosts"],
        plan["platform"].as_str().unwrap_or("?"),
        plan["ray"]["address"]
            .as_str()
            .map_or_else(String::new, |a| format!(", on Ray at {a}"))
    );
    let step = run.step.map_or_else(|| "-".into(), |s| s.to_string());
    let _ = writeln!(out, "step      {step}");
    if let Some(Value::Object(m)) = &run.last {
        let shown: Vec<String> = m
            .iter()
            .filter(|(k, _)| k.as_str() != "step")
            .map(|(k, v)| match v.as_f64() {
                Some(x) => format!("{k}={}", number(x)),
                None => format!("{k}={v}"),
            })
            .collect();
        let _ = writeln!(out, "metrics   {}", shown.join("  "));
    }
    let _ = writeln!(out, "\nattempts");
    let rows: Vec<Vec<String>> = r["attempts"]
        .as_array()
        .map(|a| {
            a.iter()
                .enumerate()
                .map(|(i, at)| {
                    // Only the newest attempt of a live run can be running;
                    // an older one still recorded so lost its controller.
                    let live = run.live && i + 1 == a.len();
                    vec![
                        at["attempt"].to_string(),
                        shown_state(at["state"].as_str().unwrap_or("-"), live).to_string(),
                        at["started"].as_str().unwrap_or("-").to_string(),
                        at["ended"].as_str().unwrap_or("-").to_string(),
                        if at["failure"].is_object() {
                            failure_text(&at["failure"])
                        } else {
                            String::new()
                        },
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    for line in table(&["#", "STATE", "STARTED", "ENDED", "FAILURE"], &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
    checkpoints_line(run, &mut out);
    if let Some(g) = &run.goodput {
        let _ = writeln!(
            out,
            "\ngoodput of {} wall",
            duration_text(g["wall_s"].as_f64().map(Duration::from_secs_f64))
        );
        let mut rows = Vec::new();
        for key in GOODPUT_ORDER {
            let secs = g["seconds"][key].as_f64().unwrap_or(0.0);
            let frac = g["fractions"][key].as_f64().unwrap_or(0.0);
            rows.push(vec![
                key.to_string(),
                format!("{:.1}%", frac * 100.0),
                format!("{secs:.2}s"),
            ]);
        }
        for line in table(&["PART", "SHARE", "TIME"], &rows).lines() {
            let _ = writeln!(out, "  {line}");
        }
    } else {
        let why = if run.state == "interrupted" {
            "not recorded (its controller was killed before the run ended)"
        } else {
            "not recorded yet (written when the run ends)"
        };
        let _ = writeln!(out, "\ngoodput   {why}");
    }
    let _ = writeln!(out, "\nfolder    {}", run.dir.display());
    out
}

fn checkpoints_line(run: &RunView, out: &mut String) {
    let committed = meshrun_ckpt::commit::committed(&run.dir.join("checkpoints"));
    let _ = writeln!(
        out,
        "\ncheckpoints  {}",
        match committed.last() {
            Some((step, _)) => format!("{} committed, newest step-{step}", committed.len()),
            None => "none".into(),
        }
    );
}

/// The rest of the page of a run without a readable run.json: what is
/// wrong, and what is still there to read.
fn render_unrecorded(run: &RunView, mut out: String) -> String {
    match &run.problem {
        Some(problem) => {
            let _ = writeln!(out, "problem   {problem}");
            let _ = writeln!(
                out,
                "          (its logs and checkpoints are read without it: `meshrun logs {0}`, \
                 `meshrun ckpt ls {0}`)",
                run.name
            );
        }
        None => {
            let _ = writeln!(
                out,
                "          (a controller holds the run and has not started its first attempt yet)"
            );
        }
    }
    checkpoints_line(run, &mut out);
    let _ = writeln!(out, "\nfolder    {}", run.dir.display());
    out
}

pub(crate) fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

pub fn ls(runs_dir: &Path) -> Result<(), RunsError> {
    if !runs_dir.exists() {
        return Err(RunsError::NoRunsDir {
            dir: runs_dir.to_path_buf(),
            cwd: std::env::current_dir().unwrap_or_default(),
        });
    }
    out(&render_ls(
        &load_all(runs_dir, SystemTime::now())?,
        runs_dir,
    ));
    Ok(())
}

pub fn status(name: &str, runs_dir: &Path) -> Result<(), RunsError> {
    out(&render_status(&find(name, runs_dir)?));
    Ok(())
}

pub fn report(name: &str, runs_dir: &Path) -> Result<(), RunsError> {
    let run = find(name, runs_dir)?;
    let path = meshrun_core::report::write(&run.dir)?;
    out(&format!("{}\n", path.display()));
    Ok(())
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
