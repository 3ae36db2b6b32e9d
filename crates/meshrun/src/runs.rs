//! `meshrun ls | status | logs | report`: reading runs back from their
//! folders. Rendering is separate from printing so the tables can be
//! snapshot-tested.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use meshrun_core::controller::goodput::PARTS as GOODPUT_ORDER;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error("no run named '{name}' in {}; `meshrun ls --runs-dir {}` lists the runs there", dir.display(), dir.display())]
    NoRun { name: String, dir: PathBuf },
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

impl RunsError {
    pub fn exit_code(&self) -> i32 {
        match self {
            RunsError::NoRun { .. } | RunsError::NoRank { .. } | RunsError::NoAttempt { .. } => {
                crate::exit::USAGE
            }
            _ => crate::exit::FAILURE,
        }
    }
}

/// What `ls` and `status` know of one run.
#[derive(Debug, Default)]
pub struct RunView {
    pub name: String,
    pub dir: PathBuf,
    pub record: Value,
    pub state: String,
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

impl RunView {
    /// Reads a run's folder; `now` ends the duration of a running run.
    pub fn load(dir: &Path, now: SystemTime) -> Option<Self> {
        let record: Value =
            serde_json::from_slice(&std::fs::read(dir.join("run.json")).ok()?).ok()?;
        let attempts = record["attempts"].as_array().map_or(0, Vec::len);
        let started = parse_time(record["created"].as_str());
        let ended = record["attempts"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|a| parse_time(a["ended"].as_str()));
        let state = record["state"].as_str().unwrap_or("unknown").to_string();
        let duration = started.and_then(|s| {
            let end = if state == "running" { Some(now) } else { ended };
            end?.duration_since(s).ok()
        });
        let tail = last_records(&dir.join("metrics.jsonl"));
        let last = tail.first();
        let metrics = last.map(|r| &r["metrics"]);
        let goodput = std::fs::read(dir.join("goodput.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        Some(Self {
            name: record["name"].as_str().map_or_else(
                || {
                    dir.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned()
                },
                str::to_string,
            ),
            dir: dir.to_path_buf(),
            state,
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

fn find(name: &str, runs_dir: &Path) -> Result<RunView, RunsError> {
    let dir = runs_dir.join(name);
    RunView::load(&dir, SystemTime::now()).ok_or_else(|| RunsError::NoRun {
        name: name.to_string(),
        dir: runs_dir.to_path_buf(),
    })
}

fn duration_text(d: Option<Duration>) -> String {
    let Some(d) = d else { return "-".into() };
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn number(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// The `ls` table, newest run first.
pub fn render_ls(runs: &[RunView]) -> String {
    if runs.is_empty() {
        return "no runs\n".into();
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.state.clone(),
                r.attempts.to_string(),
                r.step.map_or_else(|| "-".into(), |s| s.to_string()),
                r.loss.map_or_else(|| "-".into(), number),
                duration_text(r.duration),
            ]
        })
        .collect();
    table(
        &["NAME", "STATE", "ATTEMPTS", "STEP", "LOSS", "DURATION"],
        &rows,
    )
}

pub fn load_all(runs_dir: &Path, now: SystemTime) -> Result<Vec<RunView>, RunsError> {
    let entries = std::fs::read_dir(runs_dir).map_err(|source| RunsError::RunsDir {
        dir: runs_dir.to_path_buf(),
        source,
    })?;
    let mut runs: Vec<RunView> = entries
        .filter_map(Result::ok)
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
                .map(|at| {
                    vec![
                        at["attempt"].to_string(),
                        at["state"].as_str().unwrap_or("-").to_string(),
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
    let committed = meshrun_ckpt::commit::committed(&run.dir.join("checkpoints"));
    let _ = writeln!(
        out,
        "\ncheckpoints  {}",
        match committed.last() {
            Some((step, _)) => format!("{} committed, newest step-{step}", committed.len()),
            None => "none".into(),
        }
    );
    match &run.goodput {
        Some(g) => {
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
        }
        None => {
            let _ = writeln!(
                out,
                "\ngoodput   not recorded yet (written when the run ends)"
            );
        }
    }
    let _ = writeln!(out, "\nfolder    {}", run.dir.display());
    out
}

fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

pub fn ls(runs_dir: &Path) -> Result<(), RunsError> {
    if !runs_dir.exists() {
        out("no runs\n");
        return Ok(());
    }
    out(&render_ls(&load_all(runs_dir, SystemTime::now())?));
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

/// The attempt a log header line opens, if it is one.
fn header_attempt(line: &str) -> Option<u32> {
    line.strip_prefix("===== meshrun attempt ")?
        .split(',')
        .next()?
        .parse()
        .ok()
}

pub fn logs(
    name: &str,
    runs_dir: &Path,
    rank: u32,
    attempt: Option<u32>,
    follow: bool,
) -> Result<(), RunsError> {
    let run = find(name, runs_dir)?;
    let nprocs = run.record["plan"]["nprocs"].as_u64().unwrap_or(1) as u32;
    let path = run.dir.join("logs").join(format!("rank-{rank}.log"));
    if rank >= nprocs || !path.exists() {
        return Err(RunsError::NoRank {
            name: name.into(),
            rank,
            last: nprocs.saturating_sub(1),
            dir: run.dir.join("logs"),
        });
    }
    let read = |p: &Path| {
        File::open(p).map_err(|source| RunsError::Read {
            path: p.into(),
            source,
        })
    };
    let mut reader = BufReader::new(read(&path)?);
    if let Some(k) = attempt {
        let mut text = String::new();
        reader
            .read_to_string(&mut text)
            .map_err(|source| RunsError::Read {
                path: path.clone(),
                source,
            })?;
        let have: Vec<u32> = text.lines().filter_map(header_attempt).collect();
        if !have.contains(&k) {
            // A run still on an earlier attempt may reach K: only --follow waits for it.
            if !follow || run.state != "running" {
                return Err(RunsError::NoAttempt {
                    name: name.into(),
                    rank,
                    attempt: k,
                    have,
                });
            }
        }
        let mut inside = false;
        let mut shown = String::new();
        for line in text.lines() {
            if let Some(a) = header_attempt(line) {
                inside = a == k;
            }
            if inside {
                shown.push_str(line);
                shown.push('\n');
            }
        }
        out(&shown);
        if !follow {
            return Ok(());
        }
        return follow_file(&run.dir, reader, Some((k, inside)));
    }
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|source| RunsError::Read {
            path: path.clone(),
            source,
        })?;
    out(&text);
    if follow {
        return follow_file(&run.dir, reader, None);
    }
    Ok(())
}

/// Prints what is appended to the log until the run is no longer running
/// (and nothing more comes), like `tail -f` that knows when to stop.
fn follow_file(
    dir: &Path,
    mut reader: BufReader<File>,
    attempt: Option<(u32, bool)>,
) -> Result<(), RunsError> {
    let mut inside = attempt.is_none_or(|(_, inside)| inside);
    let mut line = String::new();
    let mut idle_since_end = 0;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap_or(0);
        if n > 0 && line.ends_with('\n') {
            if let (Some((k, _)), Some(a)) = (attempt, header_attempt(&line)) {
                inside = a == k;
            }
            if inside {
                out(&line);
            }
            continue;
        }
        if n > 0 {
            // A partial line: go back and read it whole later.
            let _ = reader.seek_relative(-(n as i64));
        }
        let running = std::fs::read(dir.join("run.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|r| r["state"] == "running");
        if running {
            idle_since_end = 0;
        } else {
            idle_since_end += 1;
            if idle_since_end > 2 {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A finished run that failed once and resumed, and a running one.
    fn runs_dir() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let demo = tmp.path().join("demo");
        std::fs::create_dir_all(demo.join("checkpoints/step-20")).unwrap();
        std::fs::write(demo.join("checkpoints/step-20/manifest.json"), "{}").unwrap();
        let failure = json!({"rank": 1, "host": 0, "attempt": 1, "exit": {"code": 1, "signal": null},
            "cause": {"kind": "exception", "exception": "ValueError", "message": "injected failure at step 12", "traceback": ""}});
        let record = json!({
            "name": "demo", "state": "succeeded", "created": "2026-12-02T10:00:00Z",
            "plan": {"nprocs": 2, "hosts": 1, "platform": "cpu"},
            "attempts": [
                {"attempt": 1, "state": "failed", "started": "2026-12-02T10:00:00Z", "ended": "2026-12-02T10:00:41Z", "failure": failure},
                {"attempt": 2, "state": "succeeded", "started": "2026-12-02T10:00:43Z", "ended": "2026-12-02T10:02:05Z", "failure": null}
            ]
        });
        std::fs::write(demo.join("run.json"), record.to_string()).unwrap();
        let metrics = (1..=30)
            .map(|s| json!({"time": 1.0, "attempt": 2, "step": s, "metrics": {"step": s, "loss": 3.0 - f64::from(s) * 0.05, "tokens_per_s": 2310.5}}).to_string() + "\n")
            .collect::<String>();
        std::fs::write(demo.join("metrics.jsonl"), metrics).unwrap();
        let goodput = json!({"wall_s": 125.0,
            "seconds": {"startup": 5.0, "compile": 20.0, "restore": 1.0, "data": 2.0, "step": 80.0, "checkpoint": 3.0, "lost": 13.0, "other": 1.0},
            "fractions": {"startup": 0.04, "compile": 0.16, "restore": 0.008, "data": 0.016, "step": 0.64, "checkpoint": 0.024, "lost": 0.104, "other": 0.008}});
        std::fs::write(demo.join("goodput.json"), goodput.to_string()).unwrap();

        let live = tmp.path().join("live");
        std::fs::create_dir_all(&live).unwrap();
        let record = json!({"name": "live", "state": "running", "created": "2026-12-02T11:00:00Z",
            "plan": {"nprocs": 4, "hosts": 2, "platform": "cpu", "ray": {"address": "127.0.0.1:6379", "strategy": "PACK"}},
            "attempts": [{"attempt": 1, "state": "running", "started": "2026-12-02T11:00:00Z"}]});
        std::fs::write(live.join("run.json"), record.to_string()).unwrap();
        tmp
    }

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-12-02T11:05:30Z").unwrap()
    }

    #[test]
    fn ls_snapshot() {
        let tmp = runs_dir();
        insta::assert_snapshot!(render_ls(&load_all(tmp.path(), now()).unwrap()));
    }

    #[test]
    fn status_snapshot() {
        let tmp = runs_dir();
        let run = RunView::load(&tmp.path().join("demo"), now()).unwrap();
        let text = render_status(&run).replace(&tmp.path().display().to_string(), "<runs>");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn status_of_a_running_run_snapshot() {
        let tmp = runs_dir();
        let run = RunView::load(&tmp.path().join("live"), now()).unwrap();
        let text = render_status(&run).replace(&tmp.path().display().to_string(), "<runs>");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn a_missing_run_is_a_usage_error_naming_it() {
        let tmp = runs_dir();
        let err = find("nope", tmp.path()).unwrap_err();
        assert_eq!(err.exit_code(), crate::exit::USAGE);
        assert!(
            err.to_string().starts_with("no run named 'nope' in "),
            "{err}"
        );
    }

    #[test]
    fn log_headers_name_their_attempt() {
        assert_eq!(
            header_attempt("===== meshrun attempt 3, rank 1, started x ====="),
            Some(3)
        );
        assert_eq!(header_attempt("step 3"), None);
    }
}
