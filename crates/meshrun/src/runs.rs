//! `meshrun ls | status | report`: reading runs back from their folders.
//! Rendering is separate from printing so the tables can be
//! snapshot-tested.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use meshrun_plan::check_run_name;
use meshrun_record::read::{self, lock_is_held, ReadError};
use meshrun_record::{names, Event, EventLine, Goodput, MetricsRecord, Part, RunRecord, RunState};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::status_parts::{checkpoints_line, goodput_heading, memory_table};
use crate::table::{duration_text, number, table};

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error("no run named '{name}' in {}; `meshrun ls --runs-dir {}` lists the runs there", dir.display(), dir.display())]
    NoRun { name: String, dir: PathBuf },
    /// Boxed: `UsageError` is large, and this is the rare path.
    #[error(transparent)]
    BadName(Box<meshrun_plan::UsageError>),
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
    #[error(transparent)]
    Report(#[from] meshrun_report::ReportError),
}

impl From<meshrun_plan::UsageError> for RunsError {
    fn from(e: meshrun_plan::UsageError) -> Self {
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
    /// `None` for a damaged run, or one whose controller has not written it yet.
    pub record: Option<RunRecord>,
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
    pub goodput: Option<Goodput>,
    /// What the cluster holds back from a live run that has reported
    /// nothing since it began waiting.
    pub waiting: Option<String>,
    /// The memory checkpoint a live run holds: its step and each host's
    /// bytes of it.
    pub memory: Option<String>,
    /// The slowest rank lately, and whether it was named a straggler.
    pub slowest: Option<String>,
}

fn parse_time(text: Option<&str>) -> Option<SystemTime> {
    humantime::parse_rfc3339(text?).ok()
}

/// The complete records among the last 64 KiB of a JSON-lines file,
/// newest first.
pub(crate) fn last_records<T: DeserializeOwned>(path: &Path) -> Vec<T> {
    last_records_at_least(path, 0)
}

/// The complete records at the end of a JSON-lines file, newest first: at
/// least `at_least` where the file has them (the window read doubles from
/// 64 KiB until it holds them: one line of `lag.jsonl` at 10,000 ranks is
/// about 60 KB).
pub(crate) fn last_records_at_least<T: DeserializeOwned>(path: &Path, at_least: usize) -> Vec<T> {
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut window: u64 = 64 * 1024;
    loop {
        let mut text = String::new();
        let from = len.saturating_sub(window);
        if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        let records: Vec<T> = text
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<T>(l).ok())
            .collect();
        if records.len() >= at_least || from == 0 {
            return records;
        }
        window = window.saturating_mul(2);
    }
}

/// The newest `waiting_for_resources` event, while it names a wait and no
/// report came after it (the controller records no waits after the first
/// step, so a report is what ends one).
fn waiting_now(dir: &Path, last: Option<&MetricsRecord>) -> Option<String> {
    let events = last_records::<EventLine>(&dir.join(names::EVENTS));
    let newest = events
        .iter()
        .find(|e| matches!(e.event, Event::WaitingForResources { .. }))?;
    if last.is_some_and(|m| m.time >= newest.time) {
        return None;
    }
    match &newest.event {
        Event::WaitingForResources { what, .. } => what.clone(),
        _ => None,
    }
}

/// The newest memory checkpoint committed: what every host holds in memory
/// (its own step; a replica of its buddy's as large, with more than one
/// host).
fn memory_now(dir: &Path) -> Option<String> {
    let events = last_records::<EventLine>(&dir.join(names::EVENTS));
    events.iter().find_map(|e| match &e.event {
        Event::MemoryCheckpointCommitted {
            step,
            host_bytes,
            replicated,
            ..
        } => {
            let mb: Vec<String> = host_bytes
                .iter()
                .map(|b| format!("{:.1}", *b as f64 / 1e6))
                .collect();
            let copies = if *replicated {
                ", and as much again for its buddy's replica"
            } else {
                ""
            };
            Some(format!(
                "step {step} held in memory: {} MB per host{copies}",
                mb.join(" / ")
            ))
        }
        _ => None,
    })
}

/// The time of the newest metrics record or event.
fn last_written(dir: &Path, metrics: &[MetricsRecord]) -> Option<SystemTime> {
    let events = last_records::<EventLine>(&dir.join(names::EVENTS));
    [
        metrics.first().map(|m| m.time),
        events.first().map(|e| e.time),
    ]
    .into_iter()
    .flatten()
    .filter(|t| t.is_finite() && *t >= 0.0)
    .reduce(f64::max)
    .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(t))
}

const NO_RECORD: &str = "run.json is missing";

/// run.json, or what is wrong with it; `None` for a folder that is not a
/// run's (no run.json, no lock file, no events).
fn read_record(dir: &Path) -> Option<Result<RunRecord, String>> {
    let problem = match read::run_record(dir) {
        Ok(Some(record)) => return Some(Ok(record)),
        Ok(None) => {
            let run_folder = dir.join(names::LOCK).exists() || dir.join(names::EVENTS).exists();
            return run_folder.then(|| Err(NO_RECORD.to_string()));
        }
        Err(ReadError::Io { source, .. }) => format!("run.json cannot be read: {source}"),
        Err(ReadError::Parse { source, .. }) if source.is_data() => mismatch(dir, &source),
        Err(ReadError::Parse { source, .. }) => format!("run.json cannot be parsed: {source}"),
    };
    Some(Err(problem))
}

/// What is wrong with a run.json that is JSON but not a run record: not
/// an object at all, or a field missing or of another kind (written by
/// another version of meshrun, or edited by hand).
fn mismatch(dir: &Path, error: &serde_json::Error) -> String {
    let is_object = std::fs::read(dir.join(names::RUN_JSON))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .is_some_and(|v| v.is_object());
    if is_object {
        format!(
            "run.json is not a run record this meshrun ({}) reads: {error}",
            env!("CARGO_PKG_VERSION")
        )
    } else {
        "run.json is not a JSON object".to_string()
    }
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
        let started = parse_time(Some(&record.created));
        let ended = record
            .attempts
            .last()
            .and_then(|a| parse_time(a.ended.as_deref()));
        let state = record.state.shown(live);
        let tail: Vec<MetricsRecord> = last_records(&dir.join(names::METRICS));
        let duration = started.and_then(|s| {
            let end = match state {
                RunState::Running => Some(now),
                // Its controller died without recording an end: the run
                // lasted at least until the last thing it wrote.
                RunState::Interrupted => last_written(dir, &tail),
                _ => ended,
            };
            end?.duration_since(s).ok()
        });
        let last = tail.first();
        // A goodput.json this version cannot read shows as not recorded.
        let goodput = read::json_file(&dir.join(names::GOODPUT)).ok().flatten();
        Some(Self {
            name,
            dir: dir.to_path_buf(),
            state: state.to_string(),
            live,
            problem: None,
            attempts: record.attempts.len(),
            step: last.and_then(|r| r.step),
            loss: meshrun_record::loss_key(
                record.plan["loss_metric"].as_str(),
                tail.iter().flat_map(MetricsRecord::names),
            )
            .and_then(|key| tail.iter().find_map(|r| r.number(&key))),
            last: last.map(|r| r.metrics.clone()),
            duration,
            goodput,
            waiting: live.then(|| waiting_now(dir, last)).flatten(),
            memory: live.then(|| memory_now(dir)).flatten(),
            slowest: crate::lag::slowest_now(dir, &record.plan),
            record: Some(record),
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
        let created = |r: &RunView| {
            r.record
                .as_ref()
                .map_or("", |r| r.created.as_str())
                .to_string()
        };
        created(b).cmp(&created(a)).then(a.name.cmp(&b.name))
    });
    Ok(runs)
}

/// The `status` page of one run.
pub fn render_status(run: &RunView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "run       {}", run.name);
    let _ = writeln!(out, "state     {}", run.state);
    let Some(r) = &run.record else {
        return render_unrecorded(run, out);
    };
    let _ = writeln!(out, "created   {}", r.created);
    let _ = writeln!(out, "duration  {}", duration_text(run.duration));
    let count = |key: &str| {
        r.plan_u64(key)
            .map_or_else(|| "?".to_string(), |n| n.to_string())
    };
    let _ = writeln!(
        out,
        "layout    {} process(es) on {} host(s), {}{}",
        count("nprocs"),
        count("hosts"),
        r.plan_str("platform").unwrap_or("?"),
        r.plan_str("/ray/address")
            .map_or_else(String::new, |a| format!(", on Ray at {a}"))
    );
    let step = run.step.map_or_else(|| "-".into(), |s| s.to_string());
    let _ = writeln!(out, "step      {step}");
    if let Some(w) = &run.waiting {
        let _ = writeln!(out, "waiting   for Ray: {w}");
    }
    if let Some(m) = &run.memory {
        let _ = writeln!(out, "memory    {m}");
    }
    if let Some(s) = &run.slowest {
        let _ = writeln!(out, "slowest   {s}");
    }
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
    let rows: Vec<Vec<String>> = r
        .attempts
        .iter()
        .enumerate()
        .map(|(i, at)| {
            // Only the newest attempt of a live run can be running; an
            // older one still recorded so lost its controller.
            let live = run.live && i + 1 == r.attempts.len();
            vec![
                at.attempt.to_string(),
                at.state.shown(live).to_string(),
                // An elastic attempt's own count: it may run on fewer.
                at.hosts.map_or_else(|| "-".to_string(), |h| h.to_string()),
                at.started.clone(),
                at.ended.clone().unwrap_or_else(|| "-".to_string()),
                at.failure.as_ref().map_or_else(String::new, |f| {
                    format!("rank {} {}", f.rank, f.cause.headline())
                }),
            ]
        })
        .collect();
    for line in table(
        &["#", "STATE", "HOSTS", "STARTED", "ENDED", "FAILURE"],
        &rows,
    )
    .lines()
    {
        let _ = writeln!(out, "  {line}");
    }
    crate::status_parts::calls_lines(run, r.attempts.iter().map(|a| a.attempt), &mut out);
    checkpoints_line(run, &mut out);
    memory_table(run, r.plan_u64("procs_per_host").unwrap_or(1), &mut out);
    if let Some(g) = &run.goodput {
        // The newest attempt of a live run has not been counted yet.
        let running = r.attempts.last().filter(|_| run.live).map(|a| a.attempt);
        let _ = writeln!(
            out,
            "\ngoodput   {}",
            goodput_heading(g, running, run.duration)
        );
        // Only elastic runs resize: the part is shown once it has time.
        let rows: Vec<Vec<String>> = Part::ALL
            .iter()
            .filter(|&&part| part != Part::Resize || g.seconds.get(part) > 0.0)
            .map(|&part| {
                vec![
                    part.as_str().to_string(),
                    format!("{:.1}%", g.fractions.get(part) * 100.0),
                    format!("{:.2}s", g.seconds.get(part)),
                ]
            })
            .collect();
        for line in table(&["PART", "SHARE", "TIME"], &rows).lines() {
            let _ = writeln!(out, "  {line}");
        }
    } else {
        let why = if run.state == "interrupted" {
            "not recorded (its controller was killed before the run ended)"
        } else {
            "not recorded yet (written when an attempt ends)"
        };
        let _ = writeln!(out, "\ngoodput   {why}");
    }
    let _ = writeln!(out, "\nfolder    {}", run.dir.display());
    out
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
    let path = meshrun_report::write(&run.dir)?;
    out(&format!("{}\n", path.display()));
    Ok(())
}

/// Writes the run's `report.html` once the run has ended, as `meshrun run`
/// and the Python API do. The page is a view of what the run directory
/// already holds: failing to write it is a warning on stderr, never a
/// failed run.
pub fn report_after_run(run_dir: &Path) {
    warn_unless_reported(run_dir, &mut std::io::stderr().lock());
}

fn warn_unless_reported(run_dir: &Path, warnings: &mut impl Write) {
    if let Err(e) = meshrun_report::write(run_dir) {
        let _ = writeln!(warnings, "meshrun: warning: report.html not written: {e}");
    }
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
