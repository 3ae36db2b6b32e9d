//! What the report knows of a run, read back from its directory. Every file
//! but `run.json` may be missing, and a line that does not parse (the last
//! one of a file being appended to, typically) is skipped, so a report can
//! be made of any run, finished or not.

use std::io::{self, ErrorKind};
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde_json::Value;

use crate::controller::Cause;
use crate::error::CoreError;

/// One attempt, from `run.json` completed by the times in `events.jsonl`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attempt {
    pub number: u64,
    /// `succeeded`, `failed`, `interrupted`, `preempted` or `running`.
    pub state: String,
    /// Unix seconds.
    pub started: Option<f64>,
    pub ended: Option<f64>,
    pub failure: Option<Failure>,
    /// The checkpoint step this attempt resumed from (`restarting` events).
    pub resumed_from: Option<u64>,
}

/// The first failure of an attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    pub rank: Option<u64>,
    pub host: Option<u64>,
    /// `raised ValueError: boom`, `ended with exit code 3`, ...
    pub headline: String,
    pub traceback: Option<String>,
    /// Unix seconds, when `events.jsonl` has the `worker_failed` event.
    pub time: Option<f64>,
}

/// A committed checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Commit {
    pub time: f64,
    pub attempt: Option<u64>,
    pub step: u64,
}

/// One line of `metrics.jsonl`, reduced to the numeric values the report
/// draws.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub time: f64,
    pub attempt: u64,
    pub step: Option<f64>,
    pub values: Vec<(String, f64)>,
}

impl Record {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }
}

/// `goodput.json`, when there is one.
#[derive(Debug, Clone, PartialEq)]
pub enum Goodput {
    Missing,
    Unreadable(String),
    Data(Value),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub name: String,
    pub run_id: Option<String>,
    pub state: String,
    pub created: Option<String>,
    pub version: Option<String>,
    pub plan: Option<Value>,
    pub attempts: Vec<Attempt>,
    pub commits: Vec<Commit>,
    pub records: Vec<Record>,
    pub goodput: Goodput,
    /// Unix seconds of the run's first and last known moments.
    pub start: Option<f64>,
    pub end: Option<f64>,
    /// Lines of the JSONL files that could not be read.
    pub skipped_lines: usize,
}

/// Whether a metric is one the report draws.
pub fn is_charted(key: &str) -> bool {
    key == "loss" || key == "tokens_per_s" || key.starts_with("val")
}

impl Run {
    pub fn load(dir: &Path) -> Result<Run, CoreError> {
        let record = read_json(&dir.join("run.json"))?.unwrap_or(Value::Null);
        let (events, bad_events) = read_jsonl(&dir.join("events.jsonl"))?;
        let (records, bad_metrics) = read_records(&dir.join("metrics.jsonl"))?;
        let goodput = match read_json(&dir.join("goodput.json")) {
            Ok(Some(v)) => Goodput::Data(v),
            Ok(None) => Goodput::Missing,
            Err(e) => Goodput::Unreadable(e.to_string()),
        };
        let dir_name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut run = Run {
            // The folder is the name every command takes; run.json keeps the
            // one the run was started under, which a copy or rename leaves stale.
            name: if dir_name.is_empty() {
                str_of(&record, "name").unwrap_or_default()
            } else {
                dir_name
            },
            run_id: str_of(&record, "run_id"),
            state: str_of(&record, "state").unwrap_or_else(|| "unknown".to_string()),
            created: str_of(&record, "created"),
            version: record
                .pointer("/versions/meshrun")
                .and_then(Value::as_str)
                .map(str::to_string),
            plan: record.get("plan").filter(|p| p.is_object()).cloned(),
            attempts: record
                .get("attempts")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(attempt).collect())
                .unwrap_or_default(),
            commits: Vec::new(),
            records,
            goodput,
            start: None,
            end: None,
            skipped_lines: bad_events + bad_metrics,
        };
        run.apply_events(&events);
        run.interrupt_if_orphaned(crate::rundir::lock_is_held(dir));
        run.start = first_time(&events, &run.records).or_else(|| {
            run.created
                .as_deref()
                .and_then(parse_time)
                .or_else(|| run.attempts.iter().find_map(|a| a.started))
        });
        run.end = last_time(&events, &run.records, &run.attempts);
        Ok(run)
    }

    /// Completes the attempts with the precise times of the events (run.json
    /// has whole seconds), and collects checkpoint commits.
    fn apply_events(&mut self, events: &[Value]) {
        let mut resumed: Vec<(u64, Option<u64>)> = Vec::new();
        for e in events {
            let Some(time) = e.get("time").and_then(Value::as_f64) else {
                continue;
            };
            let attempt_no = e.get("attempt").and_then(Value::as_u64);
            match e.get("event").and_then(Value::as_str).unwrap_or_default() {
                "attempt_started" => {
                    if let Some(a) = attempt_no.map(|n| self.attempt_mut(n)) {
                        a.started = Some(time);
                    }
                }
                "attempt_ended" => {
                    if let Some(a) = attempt_no.map(|n| self.attempt_mut(n)) {
                        a.ended = Some(time);
                        if let Some(state) = e.get("state").and_then(Value::as_str) {
                            state.clone_into(&mut a.state);
                        }
                    }
                }
                "worker_failed" => {
                    if let Some(a) = attempt_no.map(|n| self.attempt_mut(n)) {
                        match &mut a.failure {
                            Some(f) if f.time.is_none() => f.time = Some(time),
                            Some(_) => {}
                            None => a.failure = Some(failure(e, Some(time))),
                        }
                    }
                }
                "checkpoint_committed" => {
                    if let Some(step) = e.get("step").and_then(Value::as_u64) {
                        self.commits.push(Commit {
                            time,
                            attempt: attempt_no,
                            step,
                        });
                    }
                }
                "restarting" => {
                    if let Some(after) = e.get("after_attempt").and_then(Value::as_u64) {
                        resumed.push((after + 1, e.get("from_step").and_then(Value::as_u64)));
                    }
                }
                _ => {}
            }
        }
        for (n, step) in resumed {
            self.attempt_mut(n).resumed_from = step;
        }
        self.attempts.sort_by_key(|a| a.number);
    }

    /// A run (or attempt) recorded as running whose controller is gone
    /// is interrupted. Only the newest attempt can still be running; an
    /// older one left `running` lost its controller before a later
    /// invocation continued the run.
    fn interrupt_if_orphaned(&mut self, live: bool) {
        use crate::rundir::shown_state;
        self.state = shown_state(&self.state, live).to_string();
        let newest = self.attempts.iter().map(|a| a.number).max();
        for a in &mut self.attempts {
            a.state = shown_state(&a.state, live && Some(a.number) == newest).to_string();
        }
    }

    fn attempt_mut(&mut self, number: u64) -> &mut Attempt {
        if let Some(i) = self.attempts.iter().position(|a| a.number == number) {
            return &mut self.attempts[i];
        }
        self.attempts.push(Attempt {
            number,
            state: "running".to_string(),
            ..Attempt::default()
        });
        self.attempts.last_mut().expect("just pushed")
    }

    /// The step and the value of "loss" of the last records that have them.
    pub fn final_step(&self) -> Option<f64> {
        self.records.iter().rev().find_map(|r| r.step)
    }

    pub fn last_loss(&self) -> Option<f64> {
        self.records.iter().rev().find_map(|r| r.get("loss"))
    }
}

fn first_time(events: &[Value], records: &[Record]) -> Option<f64> {
    let e = events
        .iter()
        .filter_map(|e| e.get("time").and_then(Value::as_f64));
    let r = records.iter().map(|r| r.time);
    e.chain(r).reduce(f64::min)
}

fn last_time(events: &[Value], records: &[Record], attempts: &[Attempt]) -> Option<f64> {
    let e = events
        .iter()
        .filter_map(|e| e.get("time").and_then(Value::as_f64));
    let r = records.iter().map(|r| r.time);
    let a = attempts.iter().filter_map(|a| a.ended.or(a.started));
    e.chain(r).chain(a).reduce(f64::max)
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// Unix seconds of an RFC 3339 time.
pub fn parse_time(text: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(text).ok()?;
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
}

fn attempt(v: &Value) -> Attempt {
    Attempt {
        number: v.get("attempt").and_then(Value::as_u64).unwrap_or(0),
        state: str_of(v, "state").unwrap_or_else(|| "unknown".to_string()),
        started: v
            .get("started")
            .and_then(Value::as_str)
            .and_then(parse_time),
        ended: v.get("ended").and_then(Value::as_str).and_then(parse_time),
        failure: v
            .get("failure")
            .filter(|f| f.is_object())
            .map(|f| failure(f, None)),
        resumed_from: None,
    }
}

fn failure(v: &Value, time: Option<f64>) -> Failure {
    let cause = v.get("cause").unwrap_or(&Value::Null);
    Failure {
        rank: v.get("rank").and_then(Value::as_u64),
        host: v.get("host").and_then(Value::as_u64),
        headline: headline(cause),
        traceback: cause
            .get("traceback")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .map(str::to_string),
        time,
    }
}

/// The same one-line cause the failure summary prints, read back from its
/// JSON form; a kind this version does not know is shown as it is.
pub fn headline(cause: &Value) -> String {
    match serde_json::from_value::<Cause>(cause.clone()) {
        Ok(c) => c.headline(),
        Err(_) if cause.is_null() => "failed (no cause recorded)".to_string(),
        Err(_) => format!("failed: {cause}"),
    }
}

fn parse_record(v: &Value) -> Option<Record> {
    let time = v.get("time").and_then(Value::as_f64)?;
    let metrics = v.get("metrics").and_then(Value::as_object);
    let step = v
        .get("step")
        .and_then(Value::as_f64)
        .or_else(|| metrics.and_then(|m| m.get("step")).and_then(Value::as_f64));
    let values = metrics
        .into_iter()
        .flatten()
        .filter(|(k, _)| is_charted(k))
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64().filter(|x| x.is_finite())?)))
        .collect();
    Some(Record {
        time,
        attempt: v.get("attempt").and_then(Value::as_u64).unwrap_or(1),
        step,
        values,
    })
}

fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>, CoreError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CoreError::io("cannot read", path)(e)),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, CoreError> {
    let Some(bytes) = read_bytes(path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| CoreError::io("cannot parse", path)(io::Error::new(ErrorKind::InvalidData, e)))
}

/// The objects of a JSONL file, and how many lines were not JSON objects.
/// The records of `metrics.jsonl`, each line parsed and reduced to its
/// charted numbers at once: a long run has millions of lines, and whole
/// JSON values of them all would take about a kilobyte each.
fn read_records(path: &Path) -> Result<(Vec<Record>, usize), CoreError> {
    use std::io::BufRead;

    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(CoreError::io("cannot read", path)(e)),
    };
    let mut records = Vec::new();
    let mut bad = 0;
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line.map_err(CoreError::io("cannot read", path))?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Value>(&line)
            .ok()
            .as_ref()
            .and_then(parse_record)
        {
            Some(r) => records.push(r),
            None => bad += 1,
        }
    }
    Ok((records, bad))
}

fn read_jsonl(path: &Path) -> Result<(Vec<Value>, usize), CoreError> {
    let Some(bytes) = read_bytes(path)? else {
        return Ok((Vec::new(), 0));
    };
    let mut bad = 0;
    let values = bytes
        .split(|&b| b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .filter_map(|line| match serde_json::from_slice::<Value>(line) {
            Ok(v) if v.is_object() => Some(v),
            _ => {
                bad += 1;
                None
            }
        })
        .collect();
    Ok((values, bad))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn causes_read_back_as_the_summary_words_them() {
        let exc = json!({"kind": "exception", "exception": "ValueError", "message": "boom", "traceback": "..."});
        assert_eq!(headline(&exc), "raised ValueError: boom");
        let exit = json!({"kind": "exit", "exit": {"code": 3, "signal": null}});
        assert_eq!(headline(&exit), "ended with exit code 3");
        let hang = json!({"kind": "hang", "secs": 30.0, "last_step": 7});
        assert!(headline(&hang).starts_with("hung: no report for 30 s (after step 7)"));
        let new_kind = json!({"kind": "cosmic_ray"});
        assert_eq!(headline(&new_kind), r#"failed: {"kind":"cosmic_ray"}"#);
        assert_eq!(headline(&Value::Null), "failed (no cause recorded)");
    }

    #[test]
    fn a_running_attempt_comes_from_the_events_alone() {
        let dir = tempfile::TempDir::new().unwrap();
        let _controller = crate::rundir::RunDir::open(dir.path(), "r").unwrap();
        std::fs::write(
            dir.path().join("events.jsonl"),
            "{\"event\":\"attempt_started\",\"attempt\":1,\"time\":100.0}\n{\"event\":\"worker_started\",\"time\":101.5}\n",
        )
        .unwrap();
        let run = Run::load(dir.path()).unwrap();
        assert_eq!(run.attempts.len(), 1);
        assert_eq!(run.attempts[0].state, "running");
        assert_eq!((run.start, run.end), (Some(100.0), Some(101.5)));
    }

    /// run.json as a controller killed with SIGKILL leaves it: the run and
    /// its second attempt still `running`, after a first attempt that was
    /// also cut short before the run was continued.
    fn orphaned(dir: &Path) {
        std::fs::write(
            dir.join("run.json"),
            r#"{"name": "old-name", "state": "running", "attempts": [
                {"attempt": 1, "state": "running", "started": "2026-12-02T10:00:00Z"},
                {"attempt": 2, "state": "running", "started": "2026-12-02T10:05:00Z"}]}"#,
        )
        .unwrap();
    }

    #[test]
    fn a_run_whose_controller_is_gone_is_interrupted() {
        let dir = tempfile::TempDir::new().unwrap();
        orphaned(dir.path());
        std::fs::write(dir.path().join(".lock"), "12345").unwrap();
        let run = Run::load(dir.path()).unwrap();
        assert_eq!(run.state, "interrupted");
        let states: Vec<&str> = run.attempts.iter().map(|a| a.state.as_str()).collect();
        assert_eq!(states, ["interrupted", "interrupted"]);
    }

    #[test]
    fn a_live_run_keeps_only_its_newest_attempt_running() {
        let dir = tempfile::TempDir::new().unwrap();
        let _controller = crate::rundir::RunDir::open(dir.path(), "r").unwrap();
        orphaned(dir.path());
        let run = Run::load(dir.path()).unwrap();
        assert_eq!(run.state, "running");
        let states: Vec<&str> = run.attempts.iter().map(|a| a.state.as_str()).collect();
        assert_eq!(states, ["interrupted", "running"]);
    }

    #[test]
    fn a_run_is_named_by_its_folder() {
        let dir = tempfile::TempDir::new().unwrap();
        let renamed = dir.path().join("new-name");
        std::fs::create_dir(&renamed).unwrap();
        orphaned(&renamed);
        assert_eq!(Run::load(&renamed).unwrap().name, "new-name");
    }
}
