//! Line charts as inline SVG: axes with ticks and numeric labels, axis
//! titles, a legend, one `<path class="series">` per series.

use std::fmt::Write as _;

use crate::html::escape;
use crate::series::Series;

/// Series colours, in order.
pub const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 18.0;
const BOTTOM: f64 = 46.0;
const CHAR_W: f64 = 6.4;

/// A vertical line across the plot at `x`, labelled (restarts, attempts).
pub struct Marker {
    pub x: f64,
    pub label: String,
}

pub struct LineChart<'a> {
    pub id: &'a str,
    pub x_title: &'a str,
    pub y_title: &'a str,
    pub series: &'a [Series],
    pub markers: &'a [Marker],
    pub kind: ChartKind,
}

/// What the x axis is, which decides how both axes are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    /// A metric against the step: whole-number x ticks, a y axis fitted to
    /// the data.
    Steps,
    /// A rate against time since the run started: both axes from zero, and
    /// the y axis cut above the bulk of the data when a few values are far
    /// above it (the first tokens/s of a run, measured over no time).
    Time,
}

/// A linear axis: its domain and where its ticks go.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub step: f64,
    pub ticks: Vec<f64>,
}

impl Scale {
    /// Round ticks (1, 2, 2.5 or 5 times a power of ten), about `target` of
    /// them, with a domain widened to the outer ticks.
    pub fn nice(lo: f64, hi: f64, target: usize, integer: bool) -> Scale {
        let (mut lo, mut hi) = if lo.is_finite() && hi.is_finite() && lo <= hi {
            (lo, hi)
        } else {
            (0.0, 1.0)
        };
        if hi - lo < f64::EPSILON * hi.abs().max(1.0) {
            let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
            lo -= pad;
            hi += pad;
        }
        let raw = (hi - lo) / target.max(1) as f64;
        let mag = 10f64.powf(raw.log10().floor());
        let mut step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .into_iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        if integer {
            step = step.max(1.0).round();
        }
        let first = (lo / step).floor();
        let last = (hi / step).ceil();
        let ticks = (0..=((last - first) as usize))
            .map(|i| (first + i as f64) * step)
            .collect();
        Scale {
            lo: first * step,
            hi: last * step,
            step,
            ticks,
        }
    }

    fn at(&self, v: f64, from: f64, to: f64) -> f64 {
        from + (v - self.lo) / (self.hi - self.lo) * (to - from)
    }
}

/// A tick label: as many decimals as the tick step needs; thousands as k,
/// millions as M.
pub fn tick_label(v: f64, step: f64) -> String {
    let (v, step, suffix) = match v.abs().max(step.abs()) {
        m if m >= 1e9 => (v / 1e9, step / 1e9, "G"),
        m if m >= 1e6 => (v / 1e6, step / 1e6, "M"),
        m if m >= 1e4 => (v / 1e3, step / 1e3, "k"),
        _ => (v, step, ""),
    };
    let decimals = (-step.log10().floor()).clamp(0.0, 8.0) as usize;
    let decimals = if (step * 10f64.powi(decimals as i32)).fract().abs() > 1e-6 {
        decimals + 1
    } else {
        decimals
    };
    let text = format!("{v:.decimals$}");
    if text
        .trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        "0".to_string()
    } else {
        format!("{text}{suffix}")
    }
}

/// The font size of marker labels, the height of a row of them, and how
/// many rows at most (below those, the curves would be hidden).
const MARKER_FONT: f64 = 10.0;
const MARKER_ROW: f64 = 12.0;
const MAX_MARKER_ROWS: usize = 6;

/// The width `text` takes at `font` px, at most: 0.62 em a character is
/// the average of the widest common face (`DejaVu Sans`) over the labels
/// drawn here (lower case, digits and spaces), so that a label laid out by
/// it fits whichever face the browser has.
pub fn text_width(text: &str, font: f64) -> f64 {
    text.chars().count() as f64 * font * 0.62
}

/// Where a marker's label goes: its anchor's x, whether it ends there
/// (drawn left of its line), and its row from the top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabelPlace {
    pub x: f64,
    pub end: bool,
    pub row: usize,
}

/// Places the labels of markers at `(x, label width)`, in order: right of
/// the line unless that would cross `x1`, then left of it, or else
/// against the plot's edge, whole in every case; on the first of `rows`
/// rows where it overlaps no label placed before. `None` for a label no
/// row has room for.
pub fn place_labels(
    markers: &[(f64, f64)],
    x0: f64,
    x1: f64,
    rows: usize,
) -> Vec<Option<LabelPlace>> {
    const GAP: f64 = 3.0;
    let mut taken: Vec<Vec<(f64, f64)>> = vec![Vec::new(); rows];
    markers
        .iter()
        .map(|&(x, w)| {
            let (lo, end) = if x + GAP + w <= x1 {
                (x + GAP, false)
            } else if x - GAP - w >= x0 {
                (x - GAP - w, true)
            } else {
                ((x1 - w).max(x0), false)
            };
            let hi = lo + w;
            let row = taken
                .iter()
                .position(|row| row.iter().all(|&(a, b)| hi + GAP < a || b + GAP < lo))?;
            taken[row].push((lo, hi));
            Some(LabelPlace {
                x: if end { hi } else { lo },
                end,
                row,
            })
        })
        .collect()
}

fn legend_rows(series: &[Series], width: f64) -> Vec<Vec<(usize, f64)>> {
    let mut rows: Vec<Vec<(usize, f64)>> = vec![Vec::new()];
    let mut x = LEFT;
    for (i, s) in series.iter().enumerate() {
        let w = 26.0 + s.name.chars().count() as f64 * CHAR_W + 14.0;
        if x + w > width - RIGHT && !rows.last().is_some_and(Vec::is_empty) {
            rows.push(Vec::new());
            x = LEFT;
        }
        rows.last_mut().expect("never empty").push((i, x));
        x += w;
    }
    rows
}

impl LineChart<'_> {
    pub fn render(&self) -> String {
        let rows = legend_rows(self.series, WIDTH);
        let top = 14.0 + 16.0 * rows.len() as f64;
        let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, top);
        let xs = self.series.iter().flat_map(Series::points).map(|p| p.0);
        let ys: Vec<f64> = self
            .series
            .iter()
            .flat_map(Series::points)
            .map(|p| p.1)
            .collect();
        let time = self.kind == ChartKind::Time;
        let (xlo, xhi) = bounds(xs);
        let (ylo, ymax) = bounds(ys.iter().copied());
        let yhi = if time {
            outlier_cut(ys).unwrap_or(ymax)
        } else {
            ymax
        };
        let xlo = if time { xlo.min(0.0) } else { xlo };
        let ylo = if time { ylo.min(0.0) } else { ylo };
        let sx = Scale::nice(xlo, xhi, 8, !time);
        let sy = Scale::nice(ylo, yhi, 5, false);
        let px = |v: f64| sx.at(v, x0, x1);
        let py = |v: f64| sy.at(v.clamp(sy.lo, sy.hi), y0, y1);

        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg class="chart" id="{}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">"#,
            escape(self.id)
        );
        // Grid first, so that everything else is drawn over it.
        s.push_str(r##"<g class="grid" stroke="#e6e6e6" stroke-width="1">"##);
        for &t in &sy.ticks {
            let y = py(t);
            let _ = write!(
                s,
                r#"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}"/>"#
            );
        }
        s.push_str("</g>");

        // x axis
        s.push_str(r##"<g class="axis x" font-size="11" fill="#444">"##);
        let _ = write!(
            s,
            r##"<line x1="{x0:.1}" y1="{y0:.1}" x2="{x1:.1}" y2="{y0:.1}" stroke="#333" stroke-width="1"/>"##
        );
        for &t in &sx.ticks {
            let x = px(t);
            let _ = write!(
                s,
                r##"<line class="tick" x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                y0 + 5.0,
                y0 + 18.0,
                escape(&tick_label(t, sx.step))
            );
        }
        let _ = write!(
            s,
            r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text></g>"#,
            f64::midpoint(x0, x1),
            HEIGHT - 8.0,
            escape(self.x_title)
        );

        // y axis
        s.push_str(r##"<g class="axis y" font-size="11" fill="#444">"##);
        let _ = write!(
            s,
            r##"<line x1="{x0:.1}" y1="{y0:.1}" x2="{x0:.1}" y2="{y1:.1}" stroke="#333" stroke-width="1"/>"##
        );
        for &t in &sy.ticks {
            let y = py(t);
            let _ = write!(
                s,
                r##"<line class="tick" x1="{:.1}" y1="{y:.1}" x2="{x0:.1}" y2="{y:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                x0 - 5.0,
                x0 - 8.0,
                y + 4.0,
                escape(&tick_label(t, sy.step))
            );
        }
        let _ = write!(
            s,
            r#"<text class="axis-title" transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle" font-size="12">{}</text></g>"#,
            f64::midpoint(y0, y1),
            escape(self.y_title)
        );

        if ymax > sy.hi {
            let _ = write!(
                s,
                r##"<text class="note" x="{x1:.1}" y="{:.1}" text-anchor="end" font-size="10" fill="#a00">axis cut at {}; highest value {}</text>"##,
                y1 - 4.0,
                escape(&tick_label(sy.hi, sy.step)),
                escape(&tick_label(ymax, ymax / 10.0))
            );
        }
        let shown: Vec<&Marker> = self
            .markers
            .iter()
            .filter(|m| m.x >= sx.lo && m.x <= sx.hi)
            .collect();
        let spans: Vec<(f64, f64)> = shown
            .iter()
            .map(|m| (px(m.x), text_width(&m.label, MARKER_FONT)))
            .collect();
        let label_rows =
            (((y0 - y1 - MARKER_FONT) / MARKER_ROW).floor() as usize).min(MAX_MARKER_ROWS);
        let places = place_labels(&spans, x0, x1, label_rows);
        // The lines go under the curves; the labels over everything, with
        // a halo, so that no line or curve crosses their text. Past the
        // rows there is room for, a label is only its line's tooltip.
        let mut labels = String::new();
        for (m, place) in shown.iter().zip(places) {
            let x = px(m.x);
            let label = escape(&m.label);
            let _ = write!(
                s,
                r##"<line class="marker-line" x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}" stroke="#888" stroke-dasharray="4 3"><title>{label}</title></line>"##
            );
            if let Some(p) = place {
                let _ = write!(
                    labels,
                    r##"<g class="marker"><text x="{:.1}" y="{:.1}" text-anchor="{}" font-size="{MARKER_FONT}" fill="#666" stroke="#fff" stroke-width="3" paint-order="stroke">{label}</text><title>{label}</title></g>"##,
                    p.x,
                    y1 + MARKER_FONT + MARKER_ROW * p.row as f64,
                    if p.end { "end" } else { "start" },
                );
            }
        }

        for (i, series) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let mut d = String::new();
            for seg in &series.segments {
                for (j, &(x, y)) in seg.iter().enumerate() {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1}",
                        if j == 0 { "M" } else { " L" },
                        px(x),
                        py(y)
                    );
                }
                if seg.len() == 1 {
                    d.push_str(" h0.01");
                }
            }
            let _ = write!(
                s,
                r#"<path class="series" data-name="{}" d="{d}" fill="none" stroke="{color}" stroke-width="1.8" stroke-linejoin="round" stroke-linecap="round"/>"#,
                escape(&series.name)
            );
            if series.len() <= 60 {
                for &(x, y) in series.points() {
                    let _ = write!(
                        s,
                        r#"<circle class="point" cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                        px(x),
                        py(y)
                    );
                }
            }
        }

        s.push_str(&labels);
        s.push_str(r##"<g class="legend" font-size="12" fill="#222">"##);
        for (r, row) in rows.iter().enumerate() {
            let y = 14.0 + 16.0 * r as f64;
            for &(i, x) in row {
                let color = PALETTE[i % PALETTE.len()];
                let _ = write!(
                    s,
                    r#"<line x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{y:.1}">{}</text>"#,
                    y - 4.0,
                    x + 20.0,
                    y - 4.0,
                    x + 26.0,
                    escape(&self.series[i].name)
                );
            }
        }
        s.push_str("</g></svg>");
        s
    }
}

/// Where to cut the y axis: a little above the 98th percentile, when the
/// highest values are more than twice that; None when nothing stands out.
fn outlier_cut(mut ys: Vec<f64>) -> Option<f64> {
    if ys.len() < 20 {
        return None;
    }
    ys.sort_by(f64::total_cmp);
    let p98 = ys[ys.len() * 98 / 100];
    let max = ys[ys.len() - 1];
    (p98 > 0.0 && max > 2.0 * p98).then_some(p98 * 1.25)
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_data() {
        let s = Scale::nice(0.37, 9.2, 5, false);
        assert!((s.step - 2.0).abs() < 1e-12, "{s:?}");
        assert!(s.lo <= 0.37 && s.hi >= 9.2);
        assert_eq!(s.ticks, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let s = Scale::nice(1.0, 3.0, 8, true);
        assert!(s.ticks.iter().all(|t| t.fract() == 0.0), "{s:?}");
        let flat = Scale::nice(2.0, 2.0, 5, false);
        assert!(flat.lo < 2.0 && flat.hi > 2.0);
    }

    #[test]
    fn marker_labels_neither_overlap_nor_leave_the_plot() {
        // Attempts 2 and 3 began moments apart, 4 near the right edge; one
        // label is wider than either side of its line.
        let spans = [
            (300.0, 60.0),
            (310.0, 60.0),
            (312.0, 60.0),
            (600.0, 170.0),
            (330.0, 400.0),
        ];
        let places = place_labels(&spans, 64.0, 622.0, 4);
        let boxes: Vec<(f64, f64, usize)> = places
            .iter()
            .zip(&spans)
            .map(|(p, &(_, w))| {
                let p = p.expect("room for each");
                let lo = if p.end { p.x - w } else { p.x };
                (lo, lo + w, p.row)
            })
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            assert!(
                a.0 >= 64.0 && a.1 <= 622.0,
                "label {i} leaves the plot: {a:?}"
            );
            for b in &boxes[i + 1..] {
                assert!(a.2 != b.2 || a.1 < b.0 || b.1 < a.0, "{a:?} overlaps {b:?}");
            }
        }
        assert!(
            places[3].unwrap().end,
            "drawn left of a line near the right edge"
        );
        // No row left: the label is only a tooltip.
        assert_eq!(
            place_labels(&[(100.0, 50.0), (101.0, 50.0)], 0.0, 600.0, 1)[1],
            None
        );
    }

    /// The marker labels of a rendered chart: (x, y, anchor, text).
    fn marker_texts(svg: &str) -> Vec<(f64, f64, String, String)> {
        let attr = |tag: &str, name: &str| -> Option<String> {
            let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            Some(tag[at..at + tag[at..].find('"')?].to_string())
        };
        svg.split(r#"<g class="marker">"#)
            .skip(1)
            .filter_map(|g| {
                let start = g.find("<text ")?;
                let tag = &g[start..start + g[start..].find('>')?];
                let text = &g[start + tag.len() + 1..start + g[start..].find("</text>")?];
                Some((
                    attr(tag, "x")?.parse().ok()?,
                    attr(tag, "y")?.parse().ok()?,
                    attr(tag, "text-anchor").unwrap_or_else(|| "start".into()),
                    text.to_string(),
                ))
            })
            .collect()
    }

    #[test]
    fn a_chart_draws_every_marker_label_whole_apart_and_inside() {
        let series = [Series {
            name: "steps/s".into(),
            segments: vec![(0..=100).map(|i| (f64::from(i), 2.0)).collect()],
        }];
        let markers = [
            Marker {
                x: 40.0,
                label: "attempt 2".into(),
            },
            Marker {
                x: 41.0,
                label: "attempt 3".into(),
            },
            Marker {
                x: 99.0,
                label: "attempt 4 resumes at step 990".into(),
            },
        ];
        let svg = LineChart {
            id: "c",
            x_title: "t",
            y_title: "y",
            series: &series,
            markers: &markers,
            kind: ChartKind::Time,
        }
        .render();
        let texts = marker_texts(&svg);
        assert_eq!(
            texts.iter().map(|t| t.3.as_str()).collect::<Vec<_>>(),
            ["attempt 2", "attempt 3", "attempt 4 resumes at step 990"],
            "every label, whole"
        );
        let boxes: Vec<(f64, f64, f64)> = texts
            .iter()
            .map(|(x, y, anchor, text)| {
                let w = text_width(text, MARKER_FONT);
                let lo = if anchor == "end" { x - w } else { *x };
                (lo, lo + w, *y)
            })
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            assert!(
                a.0 >= 0.0 && a.1 <= WIDTH,
                "{:?} leaves the chart",
                texts[i]
            );
            for b in &boxes[i + 1..] {
                assert!(
                    (a.2 - b.2).abs() >= MARKER_FONT || a.1 < b.0 || b.1 < a.0,
                    "{a:?} overlaps {b:?}"
                );
            }
        }
    }

    #[test]
    fn labels_have_the_decimals_the_step_needs() {
        assert_eq!(tick_label(0.5, 0.5), "0.5");
        assert_eq!(tick_label(10.0, 2.0), "10");
        assert_eq!(tick_label(0.25, 0.25), "0.25");
        assert_eq!(tick_label(250_000.0, 50_000.0), "250k");
        assert_eq!(tick_label(1_500_000.0, 500_000.0), "1.5M");
        assert_eq!(tick_label(0.0, 50_000.0), "0");
        assert_eq!(tick_label(-0.0, 0.1), "0");
    }
}
