//! The two horizontal pictures of the report: the attempts on a time axis
//! (`<svg id="timeline">`) and the goodput bar (`<svg id="goodput">`).

use std::fmt::Write as _;

use meshrun_record::goodput::{Goodput, Part};
use meshrun_record::RunState;

use crate::html::escape;
use crate::model::{Attempt, Run};
use crate::svg::{tick_label, Scale};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 96.0;
const RIGHT: f64 = 24.0;
const LANE: f64 = 54.0;
const CHAR_W: f64 = 6.6;

/// The colour of a run's or an attempt's state (`None`: not recorded).
pub fn state_color(state: Option<RunState>) -> &'static str {
    match state {
        Some(RunState::Succeeded) => "#2e7d32",
        Some(RunState::Failed) => "#c62828",
        Some(RunState::Interrupted) => "#ef6c00",
        Some(RunState::Preempted) => "#6a1b9a",
        Some(RunState::Resized) => "#00838f",
        Some(RunState::Stopped) => "#5d4037",
        Some(RunState::Running) => "#1565c0",
        Some(RunState::Errored) | None => "#757575",
    }
}

fn part_color(part: Part) -> &'static str {
    match part {
        Part::Startup => "#90a4ae",
        Part::Compile => "#ffb300",
        Part::Restore => "#29b6f6",
        Part::Data => "#ab47bc",
        Part::Step => "#43a047",
        Part::Checkpoint => "#1e88e5",
        Part::Lost => "#e53935",
        Part::Resize => "#00838f",
        Part::Other => "#bdbdbd",
    }
}

/// Seconds are shown in seconds, minutes or hours, by the span they cover.
pub fn time_unit(span: f64) -> (f64, &'static str) {
    if span >= 3.0 * 3600.0 {
        (3600.0, "h")
    } else if span >= 600.0 {
        (60.0, "min")
    } else {
        (1.0, "s")
    }
}

/// `attempt 1 failed: rank 1 raised ValueError: boom`.
pub fn failure_text(a: &Attempt) -> Option<String> {
    let f = a.failure.as_ref()?;
    Some(format!(
        "attempt {} {}: rank {} {}",
        a.number, a.state, f.rank, f.headline
    ))
}

fn truncate(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_string();
    }
    let mut t: String = text.chars().take(chars.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// The attempts as bars on a time axis, or None when no time is known.
pub fn timeline(run: &Run) -> Option<String> {
    let start = run.start?;
    let end = run.end.unwrap_or(start).max(start);
    let (unit, unit_name) = time_unit(end - start);
    let scale = Scale::nice(0.0, ((end - start) / unit).max(1.0), 8, false);
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let px = |t: f64| x0 + ((t - start) / unit - scale.lo) / (scale.hi - scale.lo) * (x1 - x0);
    let top = 8.0;
    let axis_y = top + LANE * run.attempts.len() as f64 + 4.0;
    let height = axis_y + 40.0;

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="timeline" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" font-size="11">"#
    );
    let mut prev_end = start;
    for (i, a) in run.attempts.iter().enumerate() {
        let lane = top + LANE * i as f64;
        let bar_y = lane + 14.0;
        let a_start = a.started.unwrap_or(prev_end);
        let a_end = a.ended.unwrap_or(end).max(a_start);
        prev_end = a_end;
        let (bx0, bx1) = (px(a_start), px(a_end).max(px(a_start) + 2.0));
        let color = state_color(Some(a.state));
        let _ = write!(
            s,
            r##"<text class="lane-label" x="{:.1}" y="{:.1}" text-anchor="end" fill="#222">attempt {}</text>"##,
            x0 - 8.0,
            bar_y + 13.0,
            a.number
        );
        let _ = write!(
            s,
            r#"<g class="attempt state-{state}"><rect x="{bx0:.1}" y="{bar_y:.1}" width="{:.1}" height="18" rx="3" fill="{color}"/><title>attempt {} {state}: +{} to +{}</title>"#,
            bx1 - bx0,
            a.number,
            fmt_secs(a_start - start),
            fmt_secs(a_end - start),
            state = a.state
        );
        let label = a.state.as_str();
        if bx1 - bx0 > label.len() as f64 * CHAR_W + 8.0 {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{:.1}" fill="#fff">{label}</text>"##,
                bx0 + 5.0,
                bar_y + 13.0
            );
        }
        s.push_str("</g>");

        let mut last_label = f64::NEG_INFINITY;
        for c in run.commits.iter().filter(|c| c.attempt == a.number) {
            let x = px(c.time);
            let _ = write!(
                s,
                r##"<g class="checkpoint"><path d="M{x:.1},{:.1} l4,5 l-4,5 l-4,-5z" fill="#fff" stroke="#0d47a1" stroke-width="1.5"/><title>checkpoint step {} committed at +{}</title>"##,
                bar_y + 4.0,
                c.step,
                fmt_secs(c.time - start)
            );
            if x - last_label >= 26.0 {
                let _ = write!(
                    s,
                    r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="9" fill="#0d47a1">{}</text>"##,
                    bar_y - 3.0,
                    c.step
                );
                last_label = x;
            }
            s.push_str("</g>");
        }

        if let Some(text) = failure_text(a) {
            let when = a.failure.as_ref().and_then(|f| f.time).unwrap_or(a_end);
            let x = px(when);
            let (room_right, room_left) = (WIDTH - 4.0 - (x + 8.0), x - 8.0 - 4.0);
            let (anchor, tx, room) = if room_right >= room_left {
                ("start", x + 8.0, room_right)
            } else {
                ("end", x - 8.0, room_left)
            };
            let shown = truncate(&text, (room / CHAR_W) as usize);
            let _ = write!(
                s,
                r##"<g class="failure"><path d="M{:.1},{:.1} l8,8 m0,-8 l-8,8" stroke="#b71c1c" stroke-width="2.5"/><line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#b71c1c"/><text x="{tx:.1}" y="{:.1}" text-anchor="{anchor}" fill="#b71c1c">{}</text><title>{}</title></g>"##,
                x - 4.0,
                bar_y + 5.0,
                bar_y + 18.0,
                bar_y + 30.0,
                bar_y + 31.0,
                escape(&shown),
                escape(&text)
            );
        }
    }

    let _ = write!(
        s,
        r##"<g class="axis x" fill="#444"><line x1="{x0:.1}" y1="{axis_y:.1}" x2="{x1:.1}" y2="{axis_y:.1}" stroke="#333" stroke-width="1"/>"##
    );
    for &t in &scale.ticks {
        let x = x0 + (t - scale.lo) / (scale.hi - scale.lo) * (x1 - x0);
        let _ = write!(
            s,
            r##"<line class="tick" x1="{x:.1}" y1="{axis_y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            axis_y + 5.0,
            axis_y + 17.0,
            tick_label(t, scale.step)
        );
    }
    let _ = write!(
        s,
        r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">time since run start ({unit_name})</text></g></svg>"#,
        f64::midpoint(x0, x1),
        axis_y + 34.0
    );
    Some(s)
}

/// "12.3 s", "4 min 05 s", "2 h 03 min".
pub fn fmt_secs(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        let whole = secs.round() as u64;
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        let whole = (secs / 60.0).round() as u64;
        format!("{} h {:02} min", whole / 60, whole % 60)
    }
}

/// The goodput bar and its tables, from `goodput.json`.
pub fn goodput(g: &Goodput) -> String {
    let parts: Vec<(Part, f64, f64)> = Part::ALL
        .iter()
        .map(|&p| (p, g.seconds.get(p).max(0.0), g.fractions.get(p).max(0.0)))
        .collect();
    let frac_sum: f64 = parts.iter().map(|p| p.2).sum();

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<p class="goodput-headline">Goodput <b>{:.1}%</b>: the share of wall-clock time spent in training steps.</p>"#,
        g.goodput * 100.0
    );
    let (x0, x1, height) = (8.0, WIDTH - 8.0, 66.0);
    let _ = write!(
        s,
        r#"<svg id="goodput" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" font-size="11">"#
    );
    let _ = write!(
        s,
        r##"<rect class="bar-frame" x="{x0}" y="6" width="{:.1}" height="30" fill="#f2f2f2" stroke="#999"/>"##,
        x1 - x0
    );
    let mut x = x0;
    for &(part, secs, frac) in &parts {
        if frac <= 0.0 || frac_sum <= 0.0 {
            continue;
        }
        let w = frac / frac_sum * (x1 - x0);
        let pct = frac * 100.0;
        let name = part.as_str();
        let _ = write!(
            s,
            r#"<g class="seg seg-{name}"><rect x="{x:.1}" y="6" width="{w:.1}" height="30" fill="{}"/><title>{name}: {secs:.2} s ({pct:.1}%)</title>"#,
            part_color(part),
        );
        let label = if w >= (name.len() + 7) as f64 * CHAR_W {
            format!("{name} {pct:.1}%")
        } else if w >= 34.0 {
            format!("{pct:.0}%")
        } else {
            String::new()
        };
        if !label.is_empty() {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="25" text-anchor="middle" fill="#111">{label}</text>"##,
                x + w / 2.0
            );
        }
        s.push_str("</g>");
        x += w;
    }
    s.push_str(r##"<g class="legend" fill="#222">"##);
    let mut lx = x0;
    for &(part, _, frac) in &parts {
        let text = format!("{} {:.1}%", part.as_str(), frac * 100.0);
        let _ = write!(
            s,
            r#"<rect x="{lx:.1}" y="47" width="10" height="10" fill="{}"/><text x="{:.1}" y="56">{text}</text>"#,
            part_color(part),
            lx + 14.0,
        );
        lx += 14.0 + text.chars().count() as f64 * CHAR_W + 16.0;
    }
    s.push_str("</g></svg>");

    s.push_str(r#"<table class="goodput-table"><thead><tr><th>category</th><th>seconds</th><th>percent</th></tr></thead><tbody>"#);
    for &(part, secs, frac) in &parts {
        let _ = write!(
            s,
            r#"<tr><td><span class="swatch" style="background:{}"></span>{}</td><td class="num">{secs:.2}</td><td class="num">{:.1}%</td></tr>"#,
            part_color(part),
            part.as_str(),
            frac * 100.0
        );
    }
    let _ = write!(
        s,
        r#"</tbody><tfoot><tr><th>wall clock</th><td class="num">{:.2}</td><td class="num">{:.1}%</td></tr></tfoot></table>"#,
        g.wall_s,
        frac_sum * 100.0
    );

    if !g.attempts.is_empty() {
        s.push_str(r#"<table class="goodput-attempts"><thead><tr><th>attempt</th><th>state</th><th>wall s</th>"#);
        for part in Part::ALL {
            let _ = write!(s, "<th>{}</th>", part.as_str());
        }
        s.push_str("</tr></thead><tbody>");
        for a in &g.attempts {
            let _ = write!(
                s,
                r#"<tr><td>{}</td><td>{}</td><td class="num">{:.2}</td>"#,
                a.attempt, a.state, a.wall_s
            );
            for part in Part::ALL {
                let _ = write!(s, r#"<td class="num">{:.2}</td>"#, a.seconds.get(part));
            }
            s.push_str("</tr>");
        }
        s.push_str("</tbody></table>");
    }
    s
}
