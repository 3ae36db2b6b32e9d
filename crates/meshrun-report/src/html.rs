//! The page: header, charts, goodput, attempts and configuration, with its
//! CSS inline and no scripts, so the one file can be opened, mailed or
//! archived as it is.

use std::fmt::Write as _;

use meshrun_record::memory::Bytes;
use meshrun_record::{Event, RunState};
use serde_json::Value;

use crate::heatmap;
use crate::model::{Goodput, Run};
use crate::series::{self, Series};
use crate::svg::{ChartKind, LineChart, Marker};
use crate::timeline::{self, fmt_secs, state_color, time_unit};

/// Text made safe for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number with about four significant digits ("0.05636", "3.426",
/// "1234", "285436").
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let digits = if v.abs() < f64::MIN_POSITIVE {
        0
    } else {
        v.abs().log10().floor() as i32
    };
    let decimals = (3 - digits).clamp(0, 8) as usize;
    format!("{v:.decimals$}")
}

const STYLE: &str = r"
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; background: #f5f6f8; color: #1d1d1f;
  font: 14px/1.45 -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', Helvetica, Arial, sans-serif; }
main { max-width: 1360px; margin: 0 auto; }
header h1 { margin: 0 0 4px; font-size: 24px; }
header .sub { color: #666; margin-bottom: 14px; }
dl.summary { display: flex; flex-wrap: wrap; gap: 10px; margin: 0; }
dl.summary div { flex: 1 1 0; min-width: max-content; background: #fff; border: 1px solid #e1e3e8; border-radius: 8px; padding: 8px 12px; }
dl.summary dt { color: #666; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
dl.summary dd { margin: 2px 0 0; font-size: 18px; font-weight: 600; white-space: nowrap; }
dl.summary .created dd { font-size: 14px; padding-top: 4px; }
.badge { display: inline-block; padding: 0 10px; border-radius: 10px; color: #fff; font-size: 15px; }
section { background: #fff; border: 1px solid #e1e3e8; border-radius: 10px; padding: 16px 20px; margin-top: 18px; }
section h2 { margin: 0 0 10px; font-size: 17px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
.charts figure { margin: 0; flex: 1 1 560px; min-width: 0; }
.charts figcaption { font-weight: 600; margin-bottom: 4px; }
svg { max-width: 100%; height: auto; display: block; }
.empty { color: #777; font-style: italic; }
table { border-collapse: collapse; margin-top: 12px; font-size: 13px; }
th, td { text-align: left; padding: 4px 12px 4px 0; border-bottom: 1px solid #eee; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.config td:first-child { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; }
table.config td:last-child { font-family: ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }
details pre { background: #fbf3f3; padding: 8px; max-height: 300px; overflow: auto; font-size: 12px; }
.failure-cell { color: #b71c1c; }
dl.summary .failed, p.save-failures { color: #b71c1c; }
footer { color: #888; margin-top: 18px; font-size: 12px; }
";

/// The whole page.
pub fn page(run: &Run) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>meshrun report: {}</title><style>{STYLE}</style></head><body><main>"#,
        escape(&run.name)
    );
    header(&mut s, run);
    step_charts(&mut s, run);
    throughput(&mut s, run);
    ranks(&mut s, run);
    memory(&mut s, run);
    goodput(&mut s, run);
    attempts(&mut s, run);
    config(&mut s, run);
    let _ = write!(
        s,
        "<footer>Made by meshrun {}{}.</footer></main></body></html>",
        escape(run.version.as_deref().unwrap_or("(unknown version)")),
        if run.skipped_lines > 0 {
            format!(
                "; {} unreadable line(s) of events.jsonl/metrics.jsonl were skipped",
                run.skipped_lines
            )
        } else {
            String::new()
        }
    );
    s
}

fn header(s: &mut String, run: &Run) {
    let _ = write!(
        s,
        r#"<header><h1 class="run-name">{}</h1><div class="sub">run id {}</div><dl class="summary">"#,
        escape(&run.name),
        escape(run.run_id.as_deref().unwrap_or("?"))
    );
    let item = |s: &mut String, class: &str, label: &str, value: &str| {
        let _ = write!(
            s,
            r#"<div class="{class}"><dt>{label}</dt><dd>{value}</dd></div>"#
        );
    };
    item(
        s,
        "state",
        "state",
        &format!(
            r#"<span class="badge state-{st}" style="background:{}">{st}</span>"#,
            state_color(run.state),
            st = run.state.map_or("unknown", RunState::as_str)
        ),
    );
    item(s, "attempts", "attempts", &run.attempts.len().to_string());
    let created = run.created.as_deref().unwrap_or("?").replacen('T', " ", 1);
    item(s, "created", "created", &escape(&created));
    let duration = match (run.start, run.end) {
        (Some(a), Some(b)) if run.state == Some(RunState::Running) => {
            format!("{} so far", fmt_secs(b - a))
        }
        _ if run.state != Some(RunState::Interrupted) && run.recorded_duration.is_some() => {
            fmt_secs(run.recorded_duration.unwrap_or_default())
        }
        (Some(a), Some(b)) => fmt_secs(b - a),
        _ => "?".to_string(),
    };
    item(s, "duration", "duration", &duration);
    // Only a run that is over has a final step; a live one is at a step.
    let (class, label) = match run.state {
        Some(st) if st != RunState::Running => ("final-step", "final step"),
        _ => ("step", "step"),
    };
    item(
        s,
        class,
        label,
        &run.final_step().map_or_else(|| "–".to_string(), fmt_num),
    );
    item(
        s,
        "last-loss",
        "last loss",
        &run.last_loss().map_or_else(|| "–".to_string(), fmt_num),
    );
    let failed = run.failed_saves.count();
    // The checkpoints there now, as `meshrun status` counts them; commits
    // since deleted or set aside are in the attempts' timeline.
    let mut saves = if run.commits.is_empty() && failed == 0 {
        "–".to_string()
    } else {
        run.kept.len().to_string()
    };
    if failed > 0 {
        let _ = write!(saves, r#" · <span class="failed">{failed} failed</span>"#);
    }
    item(s, "checkpoints", "checkpoints", &saves);
    s.push_str("</dl></header>");
}

fn figure(s: &mut String, caption: &str, body: &str) {
    let _ = write!(
        s,
        "<figure><figcaption>{}</figcaption>{body}</figure>",
        escape(caption)
    );
}

fn empty(text: &str) -> String {
    format!(r#"<p class="empty">{}</p>"#, escape(text))
}

fn step_charts(s: &mut String, run: &Run) {
    s.push_str(r#"<section id="curves"><h2>Training curves</h2><div class="charts">"#);
    let markers: Vec<Marker> = run
        .attempts
        .iter()
        .filter_map(|a| {
            a.resumed_from.map(|step| Marker {
                x: step as f64,
                label: format!("attempt {} resumes at step {step}", a.number),
            })
        })
        .collect();
    let chart = |id: &str, y_title: &str, series: &[Series]| {
        LineChart {
            id,
            x_title: "step",
            y_title,
            series,
            markers: &markers,
            kind: ChartKind::Steps,
        }
        .render()
    };
    let key = run.loss_key.as_deref().unwrap_or("loss");
    let loss = series::by_step(&run.records, key);
    let body = if run.records.is_empty() {
        empty("no metrics recorded (metrics.jsonl is missing or empty)")
    } else if loss.is_empty() {
        empty("no loss metric with a step was reported (`loss`, a name ending in `loss`, or the run's --loss-metric)")
    } else {
        chart("chart-loss", key, &[loss])
    };
    figure(s, "Loss", &body);
    let val: Vec<Series> = series::validation_keys(&run.records)
        .iter()
        .map(|k| series::by_step(&run.records, k))
        .filter(|s| !s.is_empty())
        .collect();
    let body = if val.is_empty() {
        empty("no validation metrics (names starting with \"val\") with a step were reported")
    } else {
        chart("chart-val", "value", &val)
    };
    figure(s, "Validation", &body);
    s.push_str("</div></section>");
}

fn throughput(s: &mut String, run: &Run) {
    s.push_str(r#"<section id="throughput"><h2>Throughput</h2><div class="charts">"#);
    let start = run.start.unwrap_or(0.0);
    let (unit, unit_name) = time_unit(run.end.unwrap_or(start) - start);
    let scaled = |mut series: Series| {
        for p in series.segments.iter_mut().flatten() {
            p.0 /= unit;
        }
        series
    };
    let x_title = format!("time since run start ({unit_name})");
    let markers: Vec<Marker> = run
        .attempts
        .iter()
        .skip(1)
        .filter_map(|a| {
            a.started.map(|t| Marker {
                x: (t - start) / unit,
                label: format!("attempt {}", a.number),
            })
        })
        .collect();
    let chart = |id: &str, y_title: &str, series: Series| {
        LineChart {
            id,
            x_title: &x_title,
            y_title,
            series: &[series],
            markers: &markers,
            kind: ChartKind::Time,
        }
        .render()
    };
    let rate = scaled(series::steps_per_second(&run.records, start));
    let body = if rate.is_empty() {
        empty("not enough metrics with steps to compute steps/s")
    } else {
        chart("chart-throughput", "steps/s", rate)
    };
    figure(s, "Steps per second", &body);
    let tokens = scaled(series::by_time(&run.records, "tokens_per_s", start));
    if !tokens.is_empty() {
        figure(
            s,
            "Tokens per second",
            &chart("chart-tokens", "tokens/s", tokens),
        );
    }
    s.push_str("</div></section>");
}

/// Each rank's memory over the run against its limit, a chart per rank.
fn memory(s: &mut String, run: &Run) {
    if run.memory.is_empty() {
        return;
    }
    s.push_str(r#"<section id="memory"><h2>Memory per rank</h2><div class="charts">"#);
    let start = run.start.unwrap_or(0.0);
    let (unit, unit_name) = time_unit(run.end.unwrap_or(start) - start);
    let x_title = format!("time since run start ({unit_name})");
    let at = |t: f64| (t - start) / unit;
    for r in &run.memory {
        let mut series: Vec<Series> = [&r.host, &r.device]
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| Series {
                name: s.name.clone(),
                segments: s
                    .segments
                    .iter()
                    .map(|seg| seg.iter().map(|&(t, y)| (at(t), y)).collect())
                    .collect(),
            })
            .collect();
        if let Some(limit) = r.limit {
            let xs: Vec<f64> = series
                .iter()
                .flat_map(|s| s.points().map(|p| p.0))
                .collect();
            let (lo, hi) = xs
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
            #[allow(clippy::cast_precision_loss)]
            let mib = limit as f64 / 1_048_576.0;
            if lo.is_finite() {
                series.push(Series {
                    name: "limit".into(),
                    segments: vec![vec![(lo, mib), (hi, mib)]],
                });
            }
        }
        let id = format!("chart-memory-{}", r.rank);
        let body = LineChart {
            id: &id,
            x_title: &x_title,
            y_title: "MiB",
            series: &series,
            markers: &[],
            kind: ChartKind::Time,
        }
        .render();
        let limit = r
            .limit
            .map_or_else(String::new, |l| format!(" of {}", Bytes(l)));
        figure(
            s,
            &format!("rank {}: peak {}{limit}", r.rank, Bytes(r.peak)),
            &body,
        );
    }
    s.push_str("</div></section>");
}

/// Per-rank lag: the heatmap, the slowest rank now, the stragglers named
/// and the profile captures saved.
fn ranks(s: &mut String, run: &Run) {
    s.push_str(r#"<section id="ranks"><h2>Ranks</h2>"#);
    if let Some(slow) = meshrun_record::lag::slowest(&run.lag_recent, run.straggler_steps) {
        let _ = write!(
            s,
            r#"<p class="slowest" data-rank="{}" data-slower="{}">Slowest over the last {} steps (to step {}): <b>rank {}</b>, {:.0}% of a step later than the median rank ({} ms behind the first rank to reach each step; the median rank {} ms).</p>"#,
            slow.rank,
            fmt_num(slow.slower),
            slow.steps,
            slow.last_step,
            slow.rank,
            slow.slower * 100.0,
            fmt_num(slow.lag_ms),
            fmt_num(slow.median_lag_ms)
        );
    }
    match heatmap::build(&run.lag) {
        Some(h) => figure(
            s,
            "Lag behind the first rank to reach each step",
            &h.render("chart-lag"),
        ),
        None => s.push_str(&empty(
            "no step times yet (they come once every rank has reported a step)",
        )),
    }
    let mut notes = Vec::new();
    for e in &run.stragglers {
        if let Event::Straggler {
            attempt,
            rank,
            host,
            slower,
            lag_ms,
            step,
            steps,
            ..
        } = e
        {
            notes.push(format!(
                r#"<li class="straggler" data-rank="{rank}">attempt {attempt}: rank {rank} (host {host}) named a straggler at step {step}: {:.0}% of a step later than the median rank for {steps} steps ({} ms behind the first)</li>"#,
                slower * 100.0,
                fmt_num(*lag_ms)
            ));
        }
    }
    for e in &run.profiles {
        if let Event::ProfileSaved {
            dir,
            ranks,
            missing,
            ..
        } = e
        {
            let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
            notes.push(format!(
                r#"<li class="profile">profile of ranks {} in <code>{}</code>{}</li>"#,
                list.join(", "),
                escape(dir),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!("; {} rank(s) sent none", missing.len())
                }
            ));
        }
    }
    if !notes.is_empty() {
        let _ = write!(s, "<ul>{}</ul>", notes.concat());
    }
    s.push_str("</section>");
}

fn goodput(s: &mut String, run: &Run) {
    s.push_str(r#"<section id="goodput-section"><h2>Goodput</h2>"#);
    match &run.goodput {
        Goodput::Data(v) => s.push_str(&timeline::goodput(v)),
        Goodput::Missing if run.state == Some(RunState::Running) => s.push_str(&empty(
            "not yet: goodput.json is written when an attempt ends",
        )),
        Goodput::Missing => s.push_str(&empty("no goodput data (goodput.json is missing)")),
        Goodput::Unreadable(e) => {
            s.push_str(&empty(&format!("no goodput data: {e}")));
        }
    }
    s.push_str("</section>");
}

fn attempts(s: &mut String, run: &Run) {
    s.push_str(r#"<section id="attempts"><h2>Attempts</h2>"#);
    match timeline::timeline(run) {
        Some(svg) if !run.attempts.is_empty() => s.push_str(&svg),
        _ => {
            s.push_str(&empty("no attempts recorded"));
            s.push_str("</section>");
            return;
        }
    }
    let start = run.start.unwrap_or(0.0);
    let rel =
        |t: Option<f64>| t.map_or_else(|| "–".to_string(), |t| format!("+{}", fmt_secs(t - start)));
    s.push_str(r#"<table class="attempts"><thead><tr><th>attempt</th><th>state</th><th>start</th><th>end</th><th>duration</th><th>hosts</th><th>resumed from</th><th>failure</th></tr></thead><tbody>"#);
    for a in &run.attempts {
        let duration = match (a.started, a.ended.or(run.end)) {
            (Some(x), Some(y)) => fmt_secs(y - x),
            _ => "–".to_string(),
        };
        let resumed = a
            .resumed_from
            .map_or_else(|| "–".to_string(), |s| format!("step {s}"));
        // An elastic run's resize says why beside the count.
        let hosts = match (a.hosts, &a.resize) {
            (Some(h), Some(why)) => {
                format!(r#"{h}<div class="resize">resized: {}</div>"#, escape(why))
            }
            (Some(h), None) => h.to_string(),
            (None, _) => "–".to_string(),
        };
        let failure = a.failure.as_ref().map_or_else(String::new, |f| {
            let mut cell = escape(&f.text());
            if let Some(tb) = &f.traceback {
                let lines: Vec<&str> = tb.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                let _ = write!(
                    cell,
                    "<details><summary>traceback</summary><pre>{}</pre></details>",
                    escape(&tail)
                );
            }
            cell
        });
        let _ = write!(
            s,
            r#"<tr class="state-{st}"><td>{}</td><td><span class="swatch" style="background:{}"></span>{st}</td><td>{}</td><td>{}</td><td>{duration}</td><td>{hosts}</td><td>{resumed}</td><td class="failure-cell">{failure}</td></tr>"#,
            a.number,
            state_color(Some(a.state)),
            rel(a.started),
            if a.ended.is_none() && a.state == RunState::Running {
                "running".to_string()
            } else {
                rel(a.ended)
            },
            st = a.state
        );
    }
    s.push_str("</tbody></table>");
    if !run.commits.is_empty() {
        let steps: Vec<String> = run.commits.iter().map(|c| c.step.to_string()).collect();
        let _ = write!(
            s,
            r#"<p class="commits">Checkpoints committed at steps {}.</p>"#,
            steps.join(", ")
        );
    }
    if let (Some(summary), Some((_, step, error))) =
        (run.failed_saves.summary(), &run.failed_saves.last)
    {
        let still = if run.failed_saves.failing_now() {
            "; none was committed since"
        } else {
            ""
        };
        let _ = write!(
            s,
            r#"<p class="save-failures">Checkpoints: {summary}, the newest at step {step}: {}{still}.</p>"#,
            escape(error)
        );
    }
    s.push_str("</section>");
}

fn config(s: &mut String, run: &Run) {
    s.push_str(r#"<section id="config"><h2>Configuration</h2>"#);
    let _ = write!(
        s,
        r#"<p>meshrun version <b class="version">{}</b></p>"#,
        escape(run.version.as_deref().unwrap_or("unknown"))
    );
    match run.plan.as_ref().and_then(Value::as_object) {
        Some(plan) => {
            s.push_str(r#"<table class="config"><thead><tr><th>key</th><th>value</th></tr></thead><tbody>"#);
            for (k, v) in plan {
                let text = match v {
                    Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                let _ = write!(
                    s,
                    "<tr><td>{}</td><td>{}</td></tr>",
                    escape(k),
                    escape(&text)
                );
            }
            s.push_str("</tbody></table>");
        }
        None => s.push_str(&empty("no plan recorded (run.json is missing)")),
    }
    s.push_str("</section>");
}
