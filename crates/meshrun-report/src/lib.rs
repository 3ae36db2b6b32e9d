//! The run's report page: one self-contained `report.html` in the run
//! directory, built from `run.json`, `events.jsonl`, `metrics.jsonl`,
//! `lag.jsonl` and `goodput.json` as `meshrun-record` types them. Charts are inline SVG
//! made here; the page has no script and loads nothing.
//!
//! The engine does not draw: the CLI and the Python binding call [`write`]
//! when a run ends, and `meshrun report` at any time.
//!
//! - [`model`] reads the run directory, tolerating missing files and
//!   half-written lines;
//! - [`series`] turns metrics records into curves (one segment per attempt,
//!   thinned past [`series::MAX_POINTS`]);
//! - [`svg`] draws line charts, [`timeline`] the attempts and goodput bar,
//!   [`heatmap`] the ranks x steps lag;
//! - [`html`] assembles the page and escapes every string put into it.

use std::path::{Path, PathBuf};

use meshrun_record::names;

mod error;
pub mod heatmap;
pub mod html;
pub mod memory;
pub mod model;
pub mod series;
pub mod svg;
pub mod timeline;

pub use error::ReportError;

/// Writes `run_dir/report.html` and returns its path. The page replaces the
/// old one atomically, so a browser never sees half a page.
pub fn write(run_dir: &Path) -> Result<PathBuf, ReportError> {
    let run = model::Run::load(run_dir)?;
    let page = html::page(&run);
    let path = run_dir.join(names::REPORT);
    let tmp = run_dir.join(format!(".{}.tmp", names::REPORT));
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Write { path, source }
    };
    if let Err(e) = std::fs::write(&tmp, page) {
        // A full disk leaves the old page as it was, and no half copy.
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(&tmp)(e));
    }
    std::fs::rename(&tmp, &path).map_err(failed(&path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::fs;

    use serde_json::json;

    use super::*;

    const T0: f64 = 1_796_248_566.0;

    /// A run of 2 attempts: the first fails on rank 1 at step 12 after a
    /// checkpoint at step 10, the second resumes from it and finishes 30.
    fn synthetic(dir: &Path, with_goodput: bool) {
        let failure = json!({
            "rank": 1, "host": 0, "attempt": 1,
            "cause": {"kind": "exception", "exception": "ValueError",
                      "message": "injected failure at step 12",
                      "traceback": "Traceback (most recent call last):\n  File \"x.py\", line 3\nValueError: injected failure at step 12\n"},
            "exit": {"code": null, "signal": 9}
        });
        let run = json!({
            "name": "demo", "run_id": "abc123", "state": "succeeded",
            "created": "2026-12-02T21:56:06Z",
            "plan": {"nprocs": 2, "entry": {"kind": "script", "path": "/x/<train>.py"}, "tee": "none"},
            "versions": {"meshrun": "0.1.0", "protocol": 1},
            "attempts": [
                {"attempt": 1, "started": "2026-12-02T21:56:06Z", "ended": "2026-12-02T21:56:08Z", "state": "failed", "failure": failure},
                {"attempt": 2, "started": "2026-12-02T21:56:08Z", "ended": "2026-12-02T21:56:10Z", "state": "succeeded", "failure": null}
            ]
        });
        fs::write(
            dir.join("run.json"),
            serde_json::to_string_pretty(&run).unwrap(),
        )
        .unwrap();
        let events = [
            json!({"event": "attempt_started", "attempt": 1, "nprocs": 2, "hosts": 1, "control_addr": "127.0.0.1:9000", "time": T0}),
            json!({"event": "worker_started", "attempt": 1, "rank": 0, "host": 0, "pid": 10, "time": T0 + 0.01}),
            json!({"event": "checkpoint_committed", "attempt": 1, "step": 10, "path": "/x/step-10", "time": T0 + 1.5}),
            json!({"event": "worker_failed", "attempt": 1, "rank": 1, "host": 0, "cause": failure["cause"], "exit": null, "time": T0 + 1.9}),
            json!({"event": "attempt_ended", "attempt": 1, "state": "failed", "time": T0 + 2.0}),
            json!({"event": "restarting", "after_attempt": 1, "failures": 1, "max_failures": 3, "from_step": 10, "time": T0 + 2.0}),
            json!({"event": "attempt_started", "attempt": 2, "nprocs": 2, "hosts": 1, "control_addr": "127.0.0.1:9000", "time": T0 + 2.0}),
            json!({"event": "checkpoint_committed", "attempt": 2, "step": 20, "path": "/x/step-20", "time": T0 + 3.0}),
            json!({"event": "attempt_ended", "attempt": 2, "state": "succeeded", "time": T0 + 4.5}),
            json!({"event": "run_ended", "attempt": 2, "state": "succeeded", "time": T0 + 4.5}),
        ];
        let mut text = String::new();
        for e in events {
            let _ = writeln!(text, "{e}");
        }
        fs::write(dir.join("events.jsonl"), text).unwrap();

        let mut text = String::new();
        let mut line = |attempt: u64, step: u64, t: f64| {
            let mut m = json!({"step": step, "loss": 30.0 / step as f64, "<b>": 1.0});
            if step.is_multiple_of(5) {
                m["val_loss"] = json!(25.0 / step as f64);
            }
            let _ = writeln!(
                text,
                "{}",
                json!({"time": t, "attempt": attempt, "step": step, "metrics": m})
            );
        };
        for step in 1..=11 {
            line(1, step, T0 + 0.5 + 0.1 * step as f64);
        }
        for step in 11..=30 {
            line(2, step, T0 + 2.5 + 0.1 * (step - 10) as f64);
        }
        // A line cut short by a crash must not stop the rest from being read.
        text.push_str(r#"{"time": 1796248570.9, "attempt": 2, "st"#);
        fs::write(dir.join("metrics.jsonl"), text).unwrap();

        if with_goodput {
            let goodput = json!({
                "wall_s": 4.5,
                "measured_s": 4.5,
                "seconds": {"startup": 0.5, "compile": 0.4, "restore": 0.1, "data": 0.2, "step": 2.5, "checkpoint": 0.2, "lost": 0.5, "other": 0.1},
                "fractions": {"startup": 0.111, "compile": 0.089, "restore": 0.022, "data": 0.044, "step": 0.556, "checkpoint": 0.044, "lost": 0.111, "other": 0.022},
                "goodput": 0.556,
                "attempts": [{"attempt": 1, "state": "failed", "start": T0, "end": T0 + 2.0, "wall_s": 2.0,
                    "seconds": {"startup": 0.2, "compile": 0.2, "restore": 0.0, "data": 0.05, "step": 1.0, "checkpoint": 0.05, "lost": 0.5, "other": 0.0}}]
            });
            fs::write(dir.join("goodput.json"), goodput.to_string()).unwrap();
        }
    }

    /// The element that starts with `open` (e.g. `<svg class="chart" id="chart-loss"`)
    /// up to its end tag.
    fn element<'a>(page: &'a str, open: &str, close: &str) -> &'a str {
        let start = page
            .find(open)
            .unwrap_or_else(|| panic!("no {open} in the page"));
        let end = page[start..].find(close).expect("closed") + start;
        &page[start..end]
    }

    fn assert_chart(page: &str, id: &str) {
        let svg = element(page, &format!(r#"<svg class="chart" id="{id}""#), "</svg>");
        let x = element(svg, r#"<g class="axis x""#, "</g>");
        let y = element(svg, r#"<g class="axis y""#, "</g>");
        for axis in [x, y] {
            assert!(
                axis.contains("<line x1=") && axis.contains("stroke="),
                "{axis}"
            );
            assert!(
                axis.contains(r#"class="tick""#) && axis.contains("</text>"),
                "{axis}"
            );
            assert!(axis.contains(r#"class="axis-title""#), "{axis}");
        }
        let d = element(svg, r#"<path class="series""#, "/>");
        assert!(d.contains(r#" d="M"#), "{d}");
    }

    #[test]
    fn a_failed_and_restarted_run_gets_every_section() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), true);
        let path = write(dir.path()).unwrap();
        assert_eq!(path, dir.path().join(names::REPORT));
        let page = fs::read_to_string(&path).unwrap();

        for id in ["chart-loss", "chart-val", "chart-throughput"] {
            assert_chart(&page, id);
        }
        // The restart draws a second stroke, not a line back in time.
        let loss = element(&page, r#"<path class="series" data-name="loss""#, "/>");
        assert_eq!(loss.matches('M').count(), 2, "{loss}");
        assert!(page.contains("attempt 2 resumes at step 10"));

        let timeline = element(&page, r#"<svg id="timeline""#, "</svg>");
        let failure = element(timeline, r#"<g class="failure">"#, "</g>");
        assert!(
            failure.contains(
                "attempt 1 failed: rank 1 raised ValueError: injected failure at step 12"
            ),
            "{failure}"
        );
        assert!(timeline.contains(r#"class="attempt state-failed""#));
        assert!(timeline.contains(r#"class="attempt state-succeeded""#));
        assert_eq!(timeline.matches(r#"<g class="checkpoint">"#).count(), 2);
        assert!(page.contains("rank 1 (host 0)"));

        let goodput = element(&page, r#"<svg id="goodput""#, "</svg>");
        assert!(goodput.contains(r#"class="seg seg-step""#), "{goodput}");
        assert!(goodput.contains("55.6%"), "{goodput}");
        assert!(page.contains(r#"<table class="goodput-table">"#));

        assert!(page.contains("<b class=\"version\">0.1.0</b>"));
        assert!(page.contains("<td>nprocs</td><td>2</td>"));
        assert!(page.contains("final step</dt><dd>30</dd>"), "header");
        assert!(page.contains("1 unreadable line(s)"));
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(!page.contains("<script"));
    }

    /// Holds the run's lock as its live controller does.
    fn live(dir: &Path) -> nix::fcntl::Flock<fs::File> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(names::LOCK))
            .unwrap();
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap()
    }

    #[test]
    fn a_running_run_is_at_a_step_not_a_final_one() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), false);
        let path = dir.path().join("run.json");
        let mut record: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        record["state"] = json!("running");
        record["attempts"][1]["state"] = json!("running");
        record["attempts"][1]["ended"] = serde_json::Value::Null;
        fs::write(&path, record.to_string()).unwrap();
        let events = fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        // Attempt 2 has not ended.
        let mut running = String::new();
        for line in events.lines() {
            let e: serde_json::Value = serde_json::from_str(line).unwrap();
            if e["attempt"] != 2
                || !["attempt_ended", "run_ended"].contains(&e["event"].as_str().unwrap())
            {
                let _ = writeln!(running, "{line}");
            }
        }
        fs::write(dir.path().join("events.jsonl"), running).unwrap();
        let _controller = live(dir.path());
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        let header = element(&page, "<header>", "</header>");
        assert!(header.contains("badge state-running"), "{header}");
        assert!(
            header.contains(r#"<div class="step"><dt>step</dt><dd>30</dd></div>"#),
            "{header}"
        );
        assert!(!page.contains("final step"), "{header}");
    }

    #[test]
    fn a_failure_that_names_its_host_is_said_once() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), false);
        let path = dir.path().join("run.json");
        let mut record: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        let failure = &mut record["attempts"][0]["failure"];
        failure["rank"] = json!(3);
        failure["host"] = json!(1);
        failure["cause"] =
            json!({"kind": "host_unreachable", "host": 1, "ip": "10.77.0.2", "secs": 10.0});
        fs::write(&path, record.to_string()).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        let table = element(&page, r#"<table class="attempts">"#, "</table>");
        assert!(
            table.contains("rank 3 is on host 1 (10.77.0.2), unreachable for 10 s"),
            "{table}"
        );
        assert_eq!(table.matches("host 1").count(), 1, "{table}");
        // Other causes keep the host beside the rank.
        let other = tempfile::TempDir::new().unwrap();
        synthetic(other.path(), false);
        let page = fs::read_to_string(write(other.path()).unwrap()).unwrap();
        assert!(page.contains("rank 1 (host 0): raised ValueError: injected failure at step 12"));
    }

    #[test]
    fn failed_saves_are_counted_once_per_step_in_the_header_and_the_attempts() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), false);
        let mut events = fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        for (step, rank, t) in [(22, 0, 3.2), (22, 1, 3.21), (24, 1, 3.4), (24, 0, 3.41)] {
            let _ = writeln!(
                events,
                "{}",
                json!({"event": "checkpoint_failed", "attempt": 2, "step": step, "time": T0 + t,
                       "error": format!("rank {rank}: cannot create '/s/<x>/checkpoints/tmp-{step}': Not a directory")})
            );
        }
        fs::write(dir.path().join("events.jsonl"), events).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        let header = element(&page, "<header>", "</header>");
        assert!(
            header.contains(
                r#"<dt>checkpoints</dt><dd>2 · <span class="failed">2 failed</span></dd>"#
            ),
            "{header}"
        );
        let attempts = element(&page, r#"<section id="attempts">"#, "</section>");
        assert!(
            attempts.contains(r#"<p class="save-failures">Checkpoints: 2 saves failed (steps 22 to 24), the newest at step 24: rank 0: cannot create &#39;/s/&lt;x&gt;/checkpoints/tmp-24&#39;: Not a directory; none was committed since.</p>"#),
            "{attempts}"
        );
        // Without failures the header counts the commits alone.
        let fine = tempfile::TempDir::new().unwrap();
        synthetic(fine.path(), false);
        let page = fs::read_to_string(write(fine.path()).unwrap()).unwrap();
        assert!(page.contains("<dt>checkpoints</dt><dd>2</dd>"));
        assert!(!page.contains(r#"class="save-failures""#));
        // The duration `ls` and `status` give (run.json: created to the
        // last attempt's end), not the span of the events (4.5 s).
        assert!(page.contains("<dt>duration</dt><dd>4.0 s</dd>"), "{page}");
    }

    #[test]
    fn the_header_counts_the_checkpoints_still_there() {
        // Step 20 committed, then set aside; step 10 deleted by retention,
        // step 30 committed twice (a restart saved it again): one is left,
        // as `meshrun status` lists them.
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), false);
        let mut events = fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        for e in [
            json!({"event": "checkpoints_deleted", "steps": [10], "reason": "retention", "time": T0 + 4.0}),
            json!({"event": "checkpoint_set_aside", "attempt": 2, "step": 20, "path": "/x/step-20", "moved_to": "/x/superseded-step-20", "reason": "r", "time": T0 + 4.1}),
            json!({"event": "checkpoint_committed", "attempt": 2, "step": 30, "path": "/x/step-30", "time": T0 + 4.2}),
            json!({"event": "checkpoint_committed", "attempt": 2, "step": 30, "path": "/x/step-30", "time": T0 + 4.3}),
        ] {
            let _ = writeln!(events, "{e}");
        }
        fs::write(dir.path().join("events.jsonl"), events).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        assert!(page.contains("<dt>checkpoints</dt><dd>1</dd>"), "{page}");
    }

    #[test]
    fn strings_from_the_run_are_escaped() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), false);
        let metrics = fs::read_to_string(dir.path().join("metrics.jsonl"))
            .unwrap()
            .replace("val_loss", "val_<b>");
        fs::write(dir.path().join("metrics.jsonl"), metrics).unwrap();
        let record = fs::read_to_string(dir.path().join("run.json"))
            .unwrap()
            .replace(
                "injected failure at step 12",
                "<script>alert('x')</script> & more",
            );
        fs::write(dir.path().join("run.json"), record).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        assert!(page.contains("val_&lt;b&gt;"));
        assert!(!page.contains("val_<b>"));
        assert!(page.contains("/x/&lt;train&gt;.py"));
        assert!(!page.contains("<train>"));
        assert!(page.contains("no goodput data"));
        assert!(!page.contains("<script"));
        assert!(page.contains(
            "raised ValueError: &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more"
        ));
    }

    #[test]
    fn a_run_without_metrics_or_events_still_gets_a_page() {
        let dir = tempfile::TempDir::new().unwrap();
        fs::write(
            dir.path().join("run.json"),
            r#"{"name": "bare", "run_id": "b1", "state": "running", "created": "2026-12-02T21:56:06Z",
                "plan": {"nprocs": 1}, "versions": {"meshrun": "0.1.0", "protocol": 1}, "attempts": []}"#,
        )
        .unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        assert!(page.contains("no metrics recorded"));
        assert!(page.contains("no goodput data"));
        assert!(page.contains("no attempts recorded"));
        assert!(!page.contains(r#"class="chart""#));

        let empty = tempfile::TempDir::new().unwrap();
        let page = fs::read_to_string(write(empty.path()).unwrap()).unwrap();
        assert!(page.contains("no plan recorded"));
    }

    #[test]
    fn a_goodput_file_this_version_cannot_read_is_named_on_the_page() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), true);
        let path = dir.path().join(names::GOODPUT);
        let renamed = fs::read_to_string(&path)
            .unwrap()
            .replace("\"lost\"", "\"wasted\"");
        fs::write(&path, renamed).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        let section = element(&page, r#"<section id="goodput-section">"#, "</section>");
        assert!(
            section.contains("no goodput data: cannot parse") && section.contains("goodput.json"),
            "{section}"
        );
        assert!(section.contains("wasted"), "{section}");
        assert!(!section.contains(r#"<svg id="goodput""#), "{section}");
    }

    #[test]
    fn a_broken_run_json_is_an_error_naming_the_file() {
        let dir = tempfile::TempDir::new().unwrap();
        fs::write(dir.path().join("run.json"), "{not json").unwrap();
        let err = write(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("cannot parse") && err.contains("run.json"),
            "{err}"
        );
    }

    #[test]
    fn long_runs_are_thinned() {
        let dir = tempfile::TempDir::new().unwrap();
        let mut text = String::new();
        for step in 0..50_000u32 {
            let _ = writeln!(
                text,
                r#"{{"time": {}, "attempt": 1, "step": {step}, "metrics": {{"loss": {}}}}}"#,
                T0 + f64::from(step) * 0.01,
                1.0 / f64::from(step + 1)
            );
        }
        fs::write(dir.path().join("metrics.jsonl"), text).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        assert!(page.len() < 300_000, "{} bytes", page.len());
        let loss = element(&page, r#"<path class="series" data-name="loss""#, "/>");
        assert!(loss.matches('L').count() <= series::MAX_POINTS, "thinned");
    }

    #[test]
    fn the_loss_chart_finds_the_loss_by_name_or_as_the_run_was_told() {
        let dir = tempfile::TempDir::new().unwrap();
        synthetic(dir.path(), false);
        let mut text = String::new();
        for step in 1..=20u32 {
            let _ = writeln!(
                text,
                r#"{{"time": {}, "attempt": 1, "step": {step}, "metrics": {{"train_loss": {}, "val_loss": 2.0, "nll": 3.0}}}}"#,
                T0 + f64::from(step) * 0.1,
                1.0 / f64::from(step)
            );
        }
        fs::write(dir.path().join("metrics.jsonl"), &text).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        element(
            &page,
            r#"<path class="series" data-name="train_loss""#,
            "/>",
        );
        // Told which (`--loss-metric nll`): that one.
        let record = fs::read_to_string(dir.path().join("run.json"))
            .unwrap()
            .replace(r#""nprocs": 2,"#, r#""nprocs": 2, "loss_metric": "nll","#);
        fs::write(dir.path().join("run.json"), record).unwrap();
        let page = fs::read_to_string(write(dir.path()).unwrap()).unwrap();
        element(&page, r#"<path class="series" data-name="nll""#, "/>");
    }
}
