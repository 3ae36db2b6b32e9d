//! Tests of `runs.rs`: the listing and the status page of runs in every
//! state a folder can be found in.

use super::*;
use meshrun_core::rundir::RunDir;
use serde_json::json;

/// The versions every run.json records.
fn versions() -> Value {
    json!({"meshrun": "0.1.0", "protocol": 1})
}

fn unix(text: &str) -> f64 {
    humantime::parse_rfc3339(text)
        .unwrap()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A finished run that failed once and resumed; a running one (whose
/// controller, this test, holds the lock); one whose controller was
/// killed; a renamed copy; one with a damaged run.json; and a folder and
/// a file that are not runs.
fn runs_dir() -> (tempfile::TempDir, RunDir) {
    let tmp = tempfile::tempdir().unwrap();
    let demo = tmp.path().join("demo");
    std::fs::create_dir_all(demo.join("checkpoints/step-20")).unwrap();
    std::fs::write(demo.join("checkpoints/step-20/manifest.json"), "{}").unwrap();
    let failure = json!({"rank": 1, "host": 0, "attempt": 1, "exit": {"code": 1, "signal": null},
        "cause": {"kind": "exception", "exception": "ValueError", "message": "injected failure at step 12", "traceback": ""}});
    let record = json!({
        "name": "demo", "run_id": "d1", "state": "succeeded", "created": "2026-12-02T10:00:00Z",
        "plan": {"nprocs": 2, "hosts": 1, "platform": "cpu"}, "versions": versions(),
        "attempts": [
            {"attempt": 1, "state": "failed", "hosts": 1, "started": "2026-12-02T10:00:00Z", "ended": "2026-12-02T10:00:41Z", "failure": failure},
            {"attempt": 2, "state": "succeeded", "hosts": 1, "started": "2026-12-02T10:00:43Z", "ended": "2026-12-02T10:02:05Z", "failure": null}
        ]
    });
    std::fs::write(demo.join("run.json"), record.to_string()).unwrap();
    let metrics = (1..=30)
        .map(|s| json!({"time": 1.0, "attempt": 2, "step": s, "metrics": {"step": s, "loss": 3.0 - f64::from(s) * 0.05, "tokens_per_s": 2310.5}}).to_string() + "\n")
        .collect::<String>();
    std::fs::write(demo.join("metrics.jsonl"), metrics).unwrap();
    let parts = |lost: f64, step: f64| {
        json!({"startup": 2.5, "compile": 10.0, "restore": 0.5, "data": 1.0, "step": step,
        "checkpoint": 1.5, "lost": lost, "resize": 0.0, "other": 0.5})
    };
    let attempts = json!([
        {"attempt": 1, "state": "failed", "start": unix("2026-12-02T10:00:00Z"), "end": unix("2026-12-02T10:00:43Z"),
         "wall_s": 43.0, "seconds": parts(13.0, 14.0)},
        {"attempt": 2, "state": "succeeded", "start": unix("2026-12-02T10:00:43Z"), "end": unix("2026-12-02T10:02:05Z"),
         "wall_s": 82.0, "seconds": parts(0.0, 66.0)}]);
    let goodput = json!({"wall_s": 125.0, "measured_s": 125.0, "goodput": 0.64, "attempts": attempts,
        "seconds": {"startup": 5.0, "compile": 20.0, "restore": 1.0, "data": 2.0, "step": 80.0, "checkpoint": 3.0, "lost": 13.0, "other": 1.0},
        "fractions": {"startup": 0.04, "compile": 0.16, "restore": 0.008, "data": 0.016, "step": 0.64, "checkpoint": 0.024, "lost": 0.104, "other": 0.008}});
    std::fs::write(demo.join("goodput.json"), goodput.to_string()).unwrap();

    let live = tmp.path().join("live");
    let controller = RunDir::open(&live, "live").unwrap();
    let record = json!({"name": "live", "run_id": "l1", "state": "running", "created": "2026-12-02T11:00:00Z",
        "plan": {"nprocs": 4, "hosts": 2, "platform": "cpu", "ray": {"address": "127.0.0.1:6379", "strategy": "PACK"}},
        "versions": versions(),
        "attempts": [{"attempt": 1, "state": "running", "started": "2026-12-02T11:00:00Z"}]});
    std::fs::write(live.join("run.json"), record.to_string()).unwrap();

    // As SIGKILL leaves it: run.json says running, the lock file has
    // the dead controller's pid, and nobody holds the lock.
    let gone = tmp.path().join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    std::fs::write(gone.join(".lock"), "4194304").unwrap();
    let record = json!({"name": "gone", "run_id": "g1", "state": "running", "created": "2026-12-02T09:00:00Z",
        "plan": {"nprocs": 2, "hosts": 1, "platform": "cpu"}, "versions": versions(),
        "attempts": [{"attempt": 1, "state": "running", "started": "2026-12-02T09:00:00Z"}]});
    std::fs::write(gone.join("run.json"), record.to_string()).unwrap();
    let events = [
        json!({"event": "attempt_started", "time": unix("2026-12-02T09:00:00Z"), "attempt": 1,
            "nprocs": 2, "hosts": 1, "control_addr": "127.0.0.1:9000"}),
        json!({"event": "worker_started", "time": unix("2026-12-02T09:02:10Z"), "attempt": 1,
            "rank": 0, "host": 0, "pid": 4_194_304}),
    ]
    .iter()
    .map(|e| e.to_string() + "\n")
    .collect::<String>();
    std::fs::write(gone.join("events.jsonl"), events).unwrap();

    let renamed = tmp.path().join("renamed");
    std::fs::create_dir_all(&renamed).unwrap();
    let record = json!({"name": "original", "run_id": "o1", "state": "failed", "created": "2026-12-02T08:00:00Z",
        "plan": {"nprocs": 1, "hosts": 1, "platform": "cpu"}, "versions": versions(),
        "attempts": [{"attempt": 1, "state": "failed", "started": "2026-12-02T08:00:00Z", "ended": "2026-12-02T08:00:07Z"}]});
    std::fs::write(renamed.join("run.json"), record.to_string()).unwrap();

    let broken = tmp.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("run.json"), r#"{"name": "broken", "sta"#).unwrap();
    std::fs::write(broken.join(".lock"), "1").unwrap();

    std::fs::create_dir_all(tmp.path().join("stray")).unwrap();
    std::fs::write(tmp.path().join("notes.txt"), "not a run").unwrap();
    (tmp, controller)
}

fn now() -> SystemTime {
    humantime::parse_rfc3339("2026-12-02T11:05:30Z").unwrap()
}

fn status_of(tmp: &tempfile::TempDir, name: &str) -> String {
    let run = RunView::load(&tmp.path().join(name), now()).unwrap();
    render_status(&run).replace(&tmp.path().display().to_string(), "<runs>")
}

#[test]
fn ls_snapshot() {
    let (tmp, _controller) = runs_dir();
    insta::assert_snapshot!(render_ls(&load_all(tmp.path(), now()).unwrap(), tmp.path()));
}

#[test]
fn status_snapshot() {
    let (tmp, _controller) = runs_dir();
    insta::assert_snapshot!(status_of(&tmp, "demo"));
}

#[test]
fn status_of_a_running_run_snapshot() {
    let (tmp, _controller) = runs_dir();
    insta::assert_snapshot!(status_of(&tmp, "live"));
}

#[test]
fn status_of_a_run_whose_controller_died_snapshot() {
    let (tmp, _controller) = runs_dir();
    insta::assert_snapshot!(status_of(&tmp, "gone"));
}

#[test]
fn status_of_a_damaged_run_snapshot() {
    let (tmp, _controller) = runs_dir();
    insta::assert_snapshot!(status_of(&tmp, "broken"));
}

#[test]
fn a_live_run_waiting_for_the_cluster_says_what_waits_until_it_reports() {
    let (tmp, _controller) = runs_dir();
    let wait = |time: &str, what: Value| {
        json!({"event": "waiting_for_resources", "time": unix(time), "attempt": 1, "what": what})
            .to_string()
            + "\n"
    };
    let events = tmp.path().join("live/events.jsonl");
    let said = "1 Ray task or actor of {'CPU': 1.0} (free: CPU 0 of 4)";
    std::fs::write(&events, wait("2026-12-02T11:01:00Z", json!(said))).unwrap();
    let text = status_of(&tmp, "live");
    assert!(
        text.contains(&format!("step      -\nwaiting   for Ray: {said}\n")),
        "{text}"
    );
    // A report after the wait ends it.
    let report = json!({"time": unix("2026-12-02T11:02:00Z"), "attempt": 1, "step": 1, "metrics": {"step": 1}});
    std::fs::write(
        tmp.path().join("live/metrics.jsonl"),
        report.to_string() + "\n",
    )
    .unwrap();
    assert!(!status_of(&tmp, "live").contains("waiting"));
    // So does a wait that cleared.
    std::fs::remove_file(tmp.path().join("live/metrics.jsonl")).unwrap();
    let cleared =
        wait("2026-12-02T11:01:00Z", json!(said)) + &wait("2026-12-02T11:01:30Z", Value::Null);
    std::fs::write(&events, cleared).unwrap();
    assert!(!status_of(&tmp, "live").contains("waiting"));
}

#[test]
fn a_live_run_says_which_memory_checkpoint_its_hosts_hold() {
    let (tmp, _controller) = runs_dir();
    let held = |step: u64, bytes: [u64; 2]| {
        json!({"event": "memory_checkpoint_committed", "time": unix("2026-12-02T11:01:00Z"), "attempt": 1,
               "step": step, "host_bytes": bytes, "replicated": true})
        .to_string()
            + "\n"
    };
    let events = tmp.path().join("live/events.jsonl");
    std::fs::write(
        &events,
        held(6, [10_884_150, 10_884_150]) + &held(7, [10_884_149, 10_884_149]),
    )
    .unwrap();
    let text = status_of(&tmp, "live");
    assert!(
        text.contains("memory    step 7 held in memory: 10.9 / 10.9 MB per host, and as much again for its buddy's replica\n"),
        "{text}"
    );
    // A run that is over holds nothing.
    assert!(!status_of(&tmp, "demo").contains("memory "));
}

#[test]
fn the_goodput_of_a_live_run_says_it_covers_only_the_attempts_that_ended() {
    let (tmp, _controller) = runs_dir();
    let live = tmp.path().join("live");
    let path = live.join("run.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["attempts"] = json!([
        {"attempt": 1, "state": "failed", "started": "2026-12-02T11:00:00Z", "ended": "2026-12-02T11:00:28Z"},
        {"attempt": 2, "state": "running", "started": "2026-12-02T11:00:29Z"}
    ]);
    std::fs::write(&path, record.to_string()).unwrap();
    let mut goodput: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("demo/goodput.json")).unwrap())
            .unwrap();
    goodput["attempts"] = json!([goodput["attempts"][0].clone()]);
    goodput["attempts"][0]["wall_s"] = json!(28.2);
    goodput["wall_s"] = json!(28.2);
    std::fs::write(live.join("goodput.json"), goodput.to_string()).unwrap();
    let text = status_of(&tmp, "live");
    assert!(text.contains("duration  5m30s\n"), "{text}");
    assert!(
        text.contains("\ngoodput   over attempt 1: 28.2s wall time, of the run's 5m30s so far; attempt 2 is counted when it ends\n"),
        "{text}"
    );
}

#[test]
fn failed_saves_are_counted_beside_the_commits() {
    let (tmp, _controller) = runs_dir();
    let failed = |time: &str, step: u64, rank: u32| {
        json!({"event": "checkpoint_failed", "time": unix(time), "attempt": 2, "step": step,
               "error": format!("rank {rank}: cannot create 'ckpt/tmp-{step}': Not a directory (os error 20)")})
        .to_string()
            + "\n"
    };
    let committed = |time: &str, step: u64| {
        json!({"event": "checkpoint_committed", "time": unix(time), "attempt": 2, "step": step, "path": "x"})
            .to_string()
            + "\n"
    };
    let events = tmp.path().join("demo/events.jsonl");
    let outage = [
        committed("2026-12-02T10:01:00Z", 20),
        failed("2026-12-02T10:01:10Z", 22, 1),
        failed("2026-12-02T10:01:10Z", 22, 0),
        failed("2026-12-02T10:01:20Z", 24, 0),
        failed("2026-12-02T10:01:20Z", 24, 1),
    ]
    .concat();
    std::fs::write(&events, &outage).unwrap();
    let text = status_of(&tmp, "demo");
    assert!(
        text.contains("\ncheckpoints  1 committed, newest step-20\n             2 saves failed (steps 22 to 24), the newest at step 24: rank 1: cannot create 'ckpt/tmp-24': Not a directory (os error 20); none was committed since\n"),
        "{text}"
    );
    // Once a save commits again, the failures are history.
    std::fs::write(&events, outage + &committed("2026-12-02T10:01:30Z", 26)).unwrap();
    let text = status_of(&tmp, "demo");
    assert!(
        text.contains("2 saves failed (steps 22 to 24), the newest at step 24: rank 1: cannot create 'ckpt/tmp-24': Not a directory (os error 20)\n"),
        "{text}"
    );
}

#[test]
fn a_running_run_whose_controller_ends_is_interrupted() {
    let (tmp, controller) = runs_dir();
    assert_eq!(find("live", tmp.path()).unwrap().state, "running");
    drop(controller);
    let run = find("live", tmp.path()).unwrap();
    assert_eq!(run.state, "interrupted");
    assert!(render_status(&run).contains("  1  interrupted  -      2026-12-02T11:00:00Z"));
}

#[test]
fn a_live_run_shows_only_its_newest_attempt_running() {
    let (tmp, _controller) = runs_dir();
    let path = tmp.path().join("live/run.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["attempts"] = json!([
        {"attempt": 1, "state": "running", "started": "2026-12-02T11:00:00Z"},
        {"attempt": 2, "state": "running", "started": "2026-12-02T11:03:00Z"}
    ]);
    std::fs::write(&path, record.to_string()).unwrap();
    let text = status_of(&tmp, "live");
    assert!(
        text.contains("  1  interrupted  -      2026-12-02T11:00:00Z"),
        "{text}"
    );
    assert!(
        text.contains("  2  running      -      2026-12-02T11:03:00Z"),
        "{text}"
    );
}

#[test]
fn a_controller_before_its_first_attempt_is_starting() {
    let tmp = tempfile::tempdir().unwrap();
    let _controller = RunDir::open(&tmp.path().join("new"), "new").unwrap();
    let run = find("new", tmp.path()).unwrap();
    assert_eq!((run.state.as_str(), run.problem), ("starting", None));
}

#[test]
fn damage_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let problem = |name: &str, text: Option<&str>| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("events.jsonl"), "").unwrap();
        if let Some(text) = text {
            std::fs::write(dir.join("run.json"), text).unwrap();
        }
        let run = find(name, tmp.path()).unwrap();
        assert_eq!(run.state, "damaged");
        run.problem.unwrap()
    };
    assert_eq!(problem("missing", None), "run.json is missing");
    assert_eq!(
        problem("list", Some("[1]")),
        "run.json is not a JSON object"
    );
    assert_eq!(
        problem("empty", Some("")),
        "run.json cannot be parsed: EOF while parsing a value at line 1 column 0"
    );
    let old = problem("old", Some(r#"{"name": "old", "state": "paused"}"#));
    assert!(
        old.starts_with("run.json is not a run record this meshrun (")
            && old.contains("unknown variant `paused`"),
        "{old}"
    );
}

#[test]
fn a_report_is_written_after_a_run_and_a_damaged_one_is_only_a_warning() {
    let (tmp, _controller) = runs_dir();
    let demo = tmp.path().join("demo");
    let mut warnings = Vec::new();
    warn_unless_reported(&demo, &mut warnings);
    assert!(
        warnings.is_empty(),
        "{}",
        String::from_utf8_lossy(&warnings)
    );
    let page = std::fs::read_to_string(demo.join(names::REPORT)).unwrap();
    assert!(
        page.contains("injected failure at step 12"),
        "the run's failure is on the page"
    );
    let broken = tmp.path().join("broken");
    warn_unless_reported(&broken, &mut warnings);
    let warning = String::from_utf8(warnings).unwrap();
    assert!(
        warning.starts_with("meshrun: warning: report.html not written: cannot parse ")
            && warning.contains("run.json"),
        "{warning}"
    );
    assert!(!broken.join(names::REPORT).exists());
    let err = report("broken", tmp.path()).unwrap_err();
    assert_eq!(err.exit_code(), crate::exit::FAILURE);
    assert!(err.to_string().starts_with("cannot parse "), "{err}");
}

#[test]
fn a_missing_run_is_a_usage_error_naming_it() {
    let (tmp, _controller) = runs_dir();
    let err = find("nope", tmp.path()).unwrap_err();
    assert_eq!(err.exit_code(), crate::exit::USAGE);
    assert!(
        err.to_string().starts_with("no run named 'nope' in "),
        "{err}"
    );
    let stray = find("stray", tmp.path()).unwrap_err();
    assert!(matches!(stray, RunsError::NoRun { .. }), "{stray}");
}

#[test]
fn names_are_checked_as_run_checks_them() {
    let (tmp, _controller) = runs_dir();
    for bad in ["-x", "x..", "../demo", "demo/"] {
        let err = find(bad, tmp.path()).unwrap_err();
        assert_eq!(err.exit_code(), crate::exit::USAGE);
        assert!(
            err.to_string()
                .starts_with(&format!("run name '{bad}' is not accepted: use 1 to 100 ")),
            "{err}"
        );
    }
}

#[test]
fn a_missing_runs_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nothere");
    let err = ls(&dir).unwrap_err();
    assert_eq!(err.exit_code(), crate::exit::USAGE);
    assert!(
        err.to_string().starts_with(&format!(
            "runs directory '{}' does not exist",
            dir.display()
        )),
        "{err}"
    );
    assert_eq!(
        render_ls(&[], &dir),
        format!("no runs in '{}'\n", dir.display())
    );
}

#[test]
fn the_attempts_table_shows_the_hosts_each_attempt_ran_on() {
    let (tmp, _controller) = runs_dir();
    let path = tmp.path().join("demo/run.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["plan"]["hosts"] = json!(4);
    record["attempts"][0]["hosts"] = json!(4);
    record["attempts"][1]["hosts"] = json!(2);
    std::fs::write(&path, record.to_string()).unwrap();
    let text = status_of(&tmp, "demo");
    assert!(text.contains("  #  STATE      HOSTS  STARTED"), "{text}");
    assert!(
        text.contains("  1  failed     4      2026-12-02T10:00:00Z"),
        "{text}"
    );
    assert!(
        text.contains("  2  succeeded  2      2026-12-02T10:00:43Z"),
        "{text}"
    );
}
