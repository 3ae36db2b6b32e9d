//! What the report knows of a run, read back from its directory through
//! the types of `meshrun-record`. Every file may be missing, and a line that
//! does not parse (the last one of a file being appended to, typically) is
//! skipped and counted, so a report can be made of any run, finished or
//! not; only a `run.json` that is there but does not parse is an error.

use std::path::Path;

use meshrun_record::failure::{Cause, FailureRecord};
use meshrun_record::{
    names, parse_time, read, Event, EventLine, FailedSaves, MetricsRecord, RunState,
};
use serde_json::Value;

use crate::error::ReportError;

/// `--straggler-steps` of a run whose record does not say.
const DEFAULT_STRAGGLER_STEPS: usize = 20;

/// One attempt, from `run.json` completed by the times in `events.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub number: u32,
    pub state: RunState,
    /// Unix seconds.
    pub started: Option<f64>,
    pub ended: Option<f64>,
    pub failure: Option<Failure>,
    /// The checkpoint step this attempt resumed from (`restarting` or
    /// `resuming` events).
    pub resumed_from: Option<u64>,
    /// The hosts it ran on, and why that count changed (elastic runs).
    pub hosts: Option<u32>,
    pub resize: Option<String>,
}

impl Attempt {
    /// An attempt known from its events alone: still running until an
    /// `attempt_ended` says otherwise.
    fn new(number: u32) -> Attempt {
        Attempt {
            number,
            state: RunState::Running,
            started: None,
            ended: None,
            failure: None,
            resumed_from: None,
            hosts: None,
            resize: None,
        }
    }
}

/// The first failure of an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub rank: u32,
    pub host: u32,
    /// `raised ValueError: boom`, `ended with exit code 3`, ...
    pub headline: String,
    /// The headline names the host (see `Cause::names_host`).
    pub host_named: bool,
    pub traceback: Option<String>,
    /// Unix seconds, when `events.jsonl` has the `worker_failed` event.
    pub time: Option<f64>,
}

impl Failure {
    fn new(record: &FailureRecord, time: Option<f64>) -> Failure {
        let traceback = match &record.cause {
            Cause::Exception { traceback, .. }
            | Cause::SystemExit { traceback, .. }
            | Cause::OutOfMemory { traceback, .. } => {
                Some(traceback).filter(|t| !t.trim().is_empty()).cloned()
            }
            _ => None,
        };
        Failure {
            rank: record.rank,
            host: record.host,
            headline: record.cause.headline(),
            host_named: record.cause.names_host(),
            traceback,
            time,
        }
    }
}

impl Failure {
    /// Who failed and how, as one phrase: `rank 1 (host 0): raised
    /// ValueError: boom`, or `rank 3 is on host 1 (10.0.0.12), unreachable
    /// for 10 s` when the cause itself names the host.
    pub fn text(&self) -> String {
        if self.host_named {
            format!("rank {} {}", self.rank, self.headline)
        } else {
            format!("rank {} (host {}): {}", self.rank, self.host, self.headline)
        }
    }
}

/// A committed checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Commit {
    pub time: f64,
    pub attempt: u32,
    pub step: u64,
}

/// One line of `metrics.jsonl`, reduced to the numeric values the report
/// draws.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub time: f64,
    pub attempt: u32,
    pub step: Option<f64>,
    pub values: Vec<(String, f64)>,
}

impl Record {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }

    /// The charted numbers of a metrics line; the step is the line's, or
    /// else the one the program put among its metrics.
    fn reduce(m: &MetricsRecord, loss_metric: Option<&str>) -> Record {
        let metrics = m.metrics.as_object();
        let step = m.step.map(|s| s as f64).or_else(|| m.number("step"));
        let values = metrics
            .into_iter()
            .flatten()
            .filter(|(k, _)| is_charted(k) || Some(k.as_str()) == loss_metric)
            .filter_map(|(k, v)| Some((k.clone(), v.as_f64().filter(|x| x.is_finite())?)))
            .collect();
        Record {
            time: m.time,
            attempt: m.attempt,
            step,
            values,
        }
    }
}

/// `goodput.json`, when there is one.
#[derive(Debug, Clone, PartialEq)]
pub enum Goodput {
    Missing,
    /// What is wrong with it.
    Unreadable(String),
    Data(meshrun_record::Goodput),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub name: String,
    pub run_id: Option<String>,
    /// `None` without a `run.json`.
    pub state: Option<RunState>,
    pub created: Option<String>,
    pub version: Option<String>,
    pub plan: Option<Value>,
    pub attempts: Vec<Attempt>,
    pub commits: Vec<Commit>,
    /// The committed steps still there: the commits less those retention
    /// deleted and those set aside (what `meshrun status` lists).
    pub kept: std::collections::BTreeSet<u64>,
    /// The checkpoint saves that failed (`--on-save-error continue`).
    pub failed_saves: FailedSaves,
    pub records: Vec<Record>,
    /// The metric shown as the loss, if the run reported one.
    pub loss_key: Option<String>,
    pub goodput: Goodput,
    /// Unix seconds of the run's first and last known moments.
    pub start: Option<f64>,
    pub end: Option<f64>,
    /// A run that is over: from its creation to its last attempt's end, as
    /// `run.json` says them and so as `meshrun ls` and `status` show it.
    pub recorded_duration: Option<f64>,
    /// Lines of the JSONL files that could not be read.
    pub skipped_lines: usize,
    /// `lag.jsonl`: when each rank reached each step, lines evenly spaced
    /// over the run (all of them unless the file is large, see
    /// `meshrun_record::lag::LagLines`), and the newest
    /// `straggler_steps` lines.
    pub lag: Vec<meshrun_record::LagRecord>,
    pub lag_recent: Vec<meshrun_record::LagRecord>,
    /// The window a straggler is judged over (`--straggler-steps`).
    pub straggler_steps: usize,
    /// The stragglers named (`straggler` events) and the profile captures
    /// saved (`profile_saved`), as written.
    pub stragglers: Vec<Event>,
    pub profiles: Vec<Event>,
    /// `memory.jsonl`: each rank's memory over the run (the highest peaks
    /// of a large run).
    pub memory: Vec<crate::memory::RankMemorySeries>,
}

/// Whether a metric is one the report draws (the loss is found among
/// those whose names end in `loss`, see `meshrun_record::loss_key`).
pub fn is_charted(key: &str) -> bool {
    key.ends_with("loss") || key == "tokens_per_s" || key.starts_with("val")
}

impl Run {
    pub fn load(dir: &Path) -> Result<Run, ReportError> {
        let record = read::run_record(dir)?;
        let configured = record
            .as_ref()
            .and_then(|r| r.plan["loss_metric"].as_str().map(str::to_string));
        let (events, bad_events) = read::jsonl::<EventLine>(&dir.join(names::EVENTS))?;
        // Reduced line by line: a long run has millions of lines, and whole
        // JSON values of them all would take about a kilobyte each.
        let mut records = Vec::new();
        let bad_metrics = read::jsonl_each(&dir.join(names::METRICS), |m: MetricsRecord| {
            records.push(Record::reduce(&m, configured.as_deref()));
        })?;
        let window = record
            .as_ref()
            .and_then(|r| r.plan["observe"]["straggler_steps"].as_u64())
            .map_or(DEFAULT_STRAGGLER_STEPS, |w| {
                usize::try_from(w).unwrap_or(usize::MAX)
            });
        let mut lag = meshrun_record::lag::LagLines::new(window);
        let bad_lag = read::jsonl_each(&dir.join(names::LAG), |l| lag.push(l))?;
        let (lag, lag_recent) = lag.into_parts();
        let (memory, bad_memory) = crate::memory::load(dir);
        let goodput = match read::json_file(&dir.join(names::GOODPUT)) {
            Ok(Some(g)) => Goodput::Data(g),
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
                record.as_ref().map(|r| r.name.clone()).unwrap_or_default()
            } else {
                dir_name
            },
            run_id: record.as_ref().map(|r| r.run_id.clone()),
            state: record.as_ref().map(|r| r.state),
            created: record.as_ref().map(|r| r.created.clone()),
            version: record.as_ref().map(|r| r.versions.meshrun.clone()),
            plan: record
                .as_ref()
                .map(|r| &r.plan)
                .filter(|p| p.is_object())
                .cloned(),
            attempts: record
                .iter()
                .flat_map(|r| &r.attempts)
                .map(|a| Attempt {
                    number: a.attempt,
                    state: a.state,
                    started: parse_time(&a.started),
                    ended: a.ended.as_deref().and_then(parse_time),
                    failure: a.failure.as_ref().map(|f| Failure::new(f, None)),
                    resumed_from: None,
                    hosts: None,
                    resize: None,
                })
                .collect(),
            commits: Vec::new(),
            kept: std::collections::BTreeSet::new(),
            failed_saves: FailedSaves::of(&events),
            loss_key: meshrun_record::loss_key(
                configured.as_deref(),
                records
                    .iter()
                    .flat_map(|r| r.values.iter().map(|(k, _)| k.as_str())),
            ),
            records,
            goodput,
            start: None,
            end: None,
            recorded_duration: record.as_ref().and_then(|r| {
                let created = parse_time(&r.created)?;
                let ended = parse_time(r.attempts.last()?.ended.as_deref()?)?;
                Some(ended - created)
            }),
            skipped_lines: bad_events + bad_metrics + bad_lag + bad_memory,
            lag,
            lag_recent,
            straggler_steps: window,
            stragglers: Vec::new(),
            profiles: Vec::new(),
            memory,
        };
        run.apply_events(&events);
        run.interrupt_if_orphaned(read::lock_is_held(dir));
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
    fn apply_events(&mut self, events: &[EventLine]) {
        let mut resumed: Vec<(u32, Option<u64>)> = Vec::new();
        for EventLine { time, event } in events {
            let time = *time;
            match event {
                Event::AttemptStarted { attempt, hosts, .. } => {
                    let a = self.attempt_mut(*attempt);
                    a.started = Some(time);
                    a.hosts = Some(*hosts);
                }
                Event::Resized {
                    attempt,
                    hosts,
                    reason,
                    ..
                } => {
                    let a = self.attempt_mut(*attempt);
                    a.hosts = Some(*hosts);
                    a.resize = Some(reason.clone());
                }
                Event::Resuming { attempt, step, .. } => {
                    resumed.push((*attempt, Some(*step)));
                }
                Event::AttemptEnded { attempt, state, .. } => {
                    let a = self.attempt_mut(*attempt);
                    a.ended = Some(time);
                    a.state = *state;
                }
                Event::WorkerFailed(record) => {
                    let a = self.attempt_mut(record.attempt);
                    match &mut a.failure {
                        Some(f) if f.time.is_none() => f.time = Some(time),
                        Some(_) => {}
                        None => a.failure = Some(Failure::new(record, Some(time))),
                    }
                }
                Event::CheckpointCommitted { attempt, step, .. } => {
                    self.kept.insert(*step);
                    self.commits.push(Commit {
                        time,
                        attempt: *attempt,
                        step: *step,
                    });
                }
                Event::CheckpointsDeleted { steps, .. } => {
                    for s in steps {
                        self.kept.remove(s);
                    }
                }
                Event::CheckpointSetAside { step, .. } => {
                    self.kept.remove(step);
                }
                Event::Restarting {
                    after_attempt,
                    from_step,
                    ..
                } => resumed.push((after_attempt + 1, *from_step)),
                Event::Straggler { .. } => self.stragglers.push(event.clone()),
                Event::ProfileSaved { .. } => self.profiles.push(event.clone()),
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
        self.state = self.state.map(|s| s.shown(live));
        let newest = self.attempts.iter().map(|a| a.number).max();
        for a in &mut self.attempts {
            a.state = a.state.shown(live && Some(a.number) == newest);
        }
    }

    fn attempt_mut(&mut self, number: u32) -> &mut Attempt {
        if let Some(i) = self.attempts.iter().position(|a| a.number == number) {
            return &mut self.attempts[i];
        }
        self.attempts.push(Attempt::new(number));
        self.attempts.last_mut().expect("just pushed")
    }

    /// The step and the value of "loss" of the last records that have them.
    pub fn final_step(&self) -> Option<f64> {
        self.records.iter().rev().find_map(|r| r.step)
    }

    pub fn last_loss(&self) -> Option<f64> {
        let key = self.loss_key.as_deref()?;
        self.records.iter().rev().find_map(|r| r.get(key))
    }
}

fn first_time(events: &[EventLine], records: &[Record]) -> Option<f64> {
    let e = events.iter().map(|e| e.time);
    let r = records.iter().map(|r| r.time);
    e.chain(r).reduce(f64::min)
}

fn last_time(events: &[EventLine], records: &[Record], attempts: &[Attempt]) -> Option<f64> {
    let e = events.iter().map(|e| e.time);
    let r = records.iter().map(|r| r.time);
    let a = attempts.iter().filter_map(|a| a.ended.or(a.started));
    e.chain(r).chain(a).reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};

    use nix::fcntl::{Flock, FlockArg};

    use super::*;

    /// Holds the run's lock as a live controller does (the kernel sees a
    /// second open file of this process as another holder).
    fn controller(dir: &Path) -> Flock<File> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(names::LOCK))
            .unwrap();
        Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap()
    }

    #[test]
    fn a_running_attempt_comes_from_the_events_alone() {
        let dir = tempfile::TempDir::new().unwrap();
        let _controller = controller(dir.path());
        std::fs::write(
            dir.path().join(names::EVENTS),
            concat!(
                r#"{"event":"attempt_started","attempt":1,"nprocs":1,"hosts":1,"control_addr":"127.0.0.1:1","time":100.0}"#,
                "\n",
                r#"{"event":"worker_started","attempt":1,"rank":0,"host":0,"pid":10,"time":101.5}"#,
                "\n"
            ),
        )
        .unwrap();
        let run = Run::load(dir.path()).unwrap();
        assert_eq!(run.attempts.len(), 1);
        assert_eq!(run.attempts[0].state, RunState::Running);
        assert_eq!((run.start, run.end), (Some(100.0), Some(101.5)));
        assert_eq!((run.state, run.skipped_lines), (None, 0));
    }

    #[test]
    fn each_resize_of_an_elastic_run_is_on_its_attempt_and_the_page() {
        let dir = tempfile::TempDir::new().unwrap();
        std::fs::write(
            dir.path().join(names::EVENTS),
            concat!(
                r#"{"event":"attempt_started","attempt":1,"nprocs":4,"hosts":4,"control_addr":"10.0.0.1:1","time":100.0}"#,
                "\n",
                r#"{"event":"attempt_ended","attempt":1,"state":"failed","time":110.0}"#,
                "\n",
                r#"{"event":"attempt_started","attempt":2,"nprocs":4,"hosts":4,"control_addr":"10.0.0.1:1","time":111.0}"#,
                "\n",
                r#"{"event":"resized","attempt":2,"hosts":2,"nprocs":2,"previous_hosts":4,"max_hosts":4,"reason":"3 of 4 hosts came back within 8 s: shrinking from 4 to 2","time":119.0}"#,
                "\n",
                r#"{"event":"resuming","attempt":2,"step":4,"requested":false,"time":119.5}"#,
                "\n",
                r#"{"event":"attempt_ended","attempt":2,"state":"resized","time":130.0}"#,
                "\n"
            ),
        )
        .unwrap();
        let run = Run::load(dir.path()).unwrap();
        let a = &run.attempts[1];
        assert_eq!(
            (a.hosts, a.resumed_from, a.state),
            (Some(2), Some(4), RunState::Resized)
        );
        assert_eq!(run.attempts[0].hosts, Some(4));
        let page = crate::html::page(&run);
        assert!(page.contains("resized: 3 of 4 hosts came back within 8 s: shrinking from 4 to 2"));
    }

    /// run.json as a controller killed with SIGKILL leaves it: the run and
    /// its second attempt still `running`, after a first attempt that was
    /// also cut short before the run was continued.
    fn orphaned(dir: &Path) {
        std::fs::write(
            dir.join(names::RUN_JSON),
            r#"{"name": "old-name", "run_id": "r1", "state": "running",
                "created": "2026-12-02T10:00:00Z", "plan": {"nprocs": 1},
                "versions": {"meshrun": "0.1.0", "protocol": 1}, "attempts": [
                {"attempt": 1, "state": "running", "started": "2026-12-02T10:00:00Z"},
                {"attempt": 2, "state": "running", "started": "2026-12-02T10:05:00Z"}]}"#,
        )
        .unwrap();
    }

    fn states(run: &Run) -> Vec<RunState> {
        run.attempts.iter().map(|a| a.state).collect()
    }

    #[test]
    fn a_run_whose_controller_is_gone_is_interrupted() {
        let dir = tempfile::TempDir::new().unwrap();
        orphaned(dir.path());
        std::fs::write(dir.path().join(names::LOCK), "12345").unwrap();
        let run = Run::load(dir.path()).unwrap();
        assert_eq!(run.state, Some(RunState::Interrupted));
        assert_eq!(states(&run), [RunState::Interrupted, RunState::Interrupted]);
    }

    #[test]
    fn a_live_run_keeps_only_its_newest_attempt_running() {
        let dir = tempfile::TempDir::new().unwrap();
        let _controller = controller(dir.path());
        orphaned(dir.path());
        let run = Run::load(dir.path()).unwrap();
        assert_eq!(run.state, Some(RunState::Running));
        assert_eq!(states(&run), [RunState::Interrupted, RunState::Running]);
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
