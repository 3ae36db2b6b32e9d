//! The ranks x steps heatmap of `lag.jsonl`: how far behind the first rank
//! each rank reached each step, darker for later. Steps are binned into at
//! most [`MAX_COLUMNS`] columns (the mean of a bin) and ranks into at most
//! [`MAX_ROWS`] rows (the latest of a bin, so that one straggler among
//! thousands still shows). Each row carries the figures behind it as data
//! attributes, for readers and tests.

use std::fmt::Write as _;

use meshrun_record::lag::LagRecord;

use crate::html::{escape, fmt_num};

pub const MAX_COLUMNS: usize = 120;
pub const MAX_ROWS: usize = 64;

const LEFT: f64 = 92.0;
const TOP: f64 = 8.0;
const WIDTH: f64 = 640.0;
const BOTTOM: f64 = 40.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// Each row: the ranks it stands for, first and last, and its cells.
    pub rows: Vec<Row>,
    /// Each column: its first and last step.
    pub columns: Vec<(u64, u64)>,
    /// The largest cell, in ms: the darkest colour.
    pub max_ms: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub ranks: (u32, u32),
    /// Lag in ms per column; `None` where the rank reported none.
    pub cells: Vec<Option<f64>>,
    /// The mean over its cells.
    pub mean_ms: f64,
}

/// The heatmap of `records` (file order); `None` without any.
pub fn build(records: &[LagRecord]) -> Option<Heatmap> {
    let ranks = records.iter().map(|r| r.lag_ms.len()).max()?;
    if ranks == 0 {
        return None;
    }
    let per_col = records.len().div_ceil(MAX_COLUMNS);
    let per_row = ranks.div_ceil(MAX_ROWS);
    let columns: Vec<(u64, u64)> = records
        .chunks(per_col)
        .map(|c| (c[0].step, c[c.len() - 1].step))
        .collect();
    let mut rows = Vec::new();
    for first in (0..ranks).step_by(per_row) {
        let last = (first + per_row).min(ranks) - 1;
        let cells: Vec<Option<f64>> = records
            .chunks(per_col)
            .map(|chunk| {
                // The latest rank of the bin at each step, averaged over the
                // column's steps.
                let values: Vec<f64> = chunk
                    .iter()
                    .filter_map(|r| {
                        r.lag_ms
                            .get(first..=last.min(r.lag_ms.len().saturating_sub(1)))
                            .and_then(|v| v.iter().copied().reduce(f64::max))
                    })
                    .collect();
                (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
            })
            .collect();
        let known: Vec<f64> = cells.iter().flatten().copied().collect();
        let mean_ms = if known.is_empty() {
            0.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        rows.push(Row {
            ranks: (first as u32, last as u32),
            cells,
            mean_ms,
        });
    }
    let max_ms = rows
        .iter()
        .flat_map(|r| r.cells.iter().flatten())
        .copied()
        .fold(0.0, f64::max);
    Some(Heatmap {
        rows,
        columns,
        max_ms,
    })
}

impl Heatmap {
    /// Inline SVG: a row per rank (or bin of ranks), a column per bin of
    /// steps, the colour's opacity the lag over the largest. Its size is
    /// given as the line charts' is: without one, a browser stretches it to
    /// the width of the page, and its 11 px labels with it.
    pub fn render(&self, id: &str) -> String {
        let row_h = (240.0 / self.rows.len() as f64).clamp(6.0, 22.0);
        let plot_w = WIDTH - LEFT - 12.0;
        let col_w = plot_w / self.columns.len() as f64;
        let height = TOP + row_h * self.rows.len() as f64 + BOTTOM;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg id="{id}" class="heatmap" viewBox="0 0 {WIDTH} {height:.0}" width="{WIDTH}" height="{height:.0}" role="img" aria-label="lag behind the first rank, per rank and step" data-max-ms="{}">"#,
            fmt_num(self.max_ms)
        );
        let label_every = (self.rows.len() / 16).max(1);
        for (i, row) in self.rows.iter().enumerate() {
            let y = TOP + row_h * i as f64;
            let name = if row.ranks.0 == row.ranks.1 {
                format!("rank {}", row.ranks.0)
            } else {
                format!("ranks {}-{}", row.ranks.0, row.ranks.1)
            };
            let _ = write!(
                s,
                r#"<g class="row" data-rank="{}" data-last-rank="{}" data-mean-lag-ms="{}">"#,
                row.ranks.0,
                row.ranks.1,
                fmt_num(row.mean_ms)
            );
            if i % label_every == 0 {
                let _ = write!(
                    s,
                    r##"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end" fill="#444">{}</text>"##,
                    LEFT - 6.0,
                    y + row_h / 2.0 + 4.0,
                    escape(&name)
                );
            }
            for (j, cell) in row.cells.iter().enumerate() {
                let Some(ms) = cell else { continue };
                let shade = if self.max_ms > 0.0 {
                    ms / self.max_ms
                } else {
                    0.0
                };
                let (a, b) = self.columns[j];
                let _ = write!(
                    s,
                    r##"<rect x="{:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="#b71c1c" fill-opacity="{:.3}"><title>{} steps {a}-{b}: {} ms behind the first rank</title></rect>"##,
                    LEFT + col_w * j as f64,
                    col_w + 0.05,
                    row_h - 1.0,
                    0.04 + 0.96 * shade,
                    escape(&name),
                    fmt_num(*ms)
                );
            }
            s.push_str("</g>");
        }
        let axis_y = TOP + row_h * self.rows.len() as f64;
        let first = self.columns.first().map_or(0, |c| c.0);
        let last = self.columns.last().map_or(0, |c| c.1);
        let _ = write!(
            s,
            r##"<text x="{LEFT}" y="{:.1}" font-size="11" fill="#444">step {first}</text><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end" fill="#444">step {last}</text><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="#222">steps (darker: later than the first rank; darkest {} ms)</text></svg>"##,
            axis_y + 16.0,
            WIDTH - 12.0,
            axis_y + 16.0,
            LEFT + plot_w / 2.0,
            axis_y + 34.0,
            fmt_num(self.max_ms)
        );
        s
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // exact figures from exact inputs
mod tests {
    use super::*;

    fn line(step: u64, lag_ms: Vec<f64>) -> LagRecord {
        LagRecord {
            time: 0.0,
            attempt: 1,
            step,
            step_ms: 100.0,
            lag_ms,
        }
    }

    #[test]
    fn a_late_rank_has_the_darker_row() {
        let records: Vec<LagRecord> = (0..10).map(|s| line(s, vec![0.0, 50.0, 2.0])).collect();
        let h = build(&records).unwrap();
        assert_eq!(h.columns.len(), 10);
        assert_eq!(
            h.rows.iter().map(|r| r.mean_ms).collect::<Vec<_>>(),
            vec![0.0, 50.0, 2.0]
        );
        let svg = h.render("lag");
        assert!(
            svg.contains(r#"data-rank="1" data-last-rank="1" data-mean-lag-ms="50""#),
            "{svg}"
        );
        assert!(svg.contains(r#"fill-opacity="1.000""#) && svg.contains(r#"fill-opacity="0.040""#));
    }

    #[test]
    fn the_picture_is_drawn_at_its_own_size_so_its_text_is_the_charts_size() {
        let records: Vec<LagRecord> = (0..10).map(|s| line(s, vec![0.0, 5.0])).collect();
        let svg = build(&records).unwrap().render("lag");
        let tag = &svg[..svg.find('>').unwrap()];
        let attr = |name: &str| -> Option<f64> {
            let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            tag[at..at + tag[at..].find('"')?].parse().ok()
        };
        let view: Vec<f64> = {
            let at = tag.find("viewBox=\"").unwrap() + 9;
            tag[at..at + tag[at..].find('"').unwrap()]
                .split(' ')
                .map(|v| v.parse().unwrap())
                .collect()
        };
        // One unit of the picture is one CSS pixel (the page only ever
        // shrinks it to fit a narrow window).
        assert_eq!(attr("width"), Some(view[2]), "{tag}");
        assert_eq!(attr("height"), Some(view[3]), "{tag}");
        let sizes: Vec<f64> = svg
            .split("font-size=\"")
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
            .collect();
        assert!(
            !sizes.is_empty() && sizes.iter().all(|&px| (10.0..=12.0).contains(&px)),
            "{sizes:?}"
        );
    }

    #[test]
    fn many_steps_and_ranks_are_binned_and_a_straggler_still_shows() {
        let ranks = 1000;
        let records: Vec<LagRecord> = (0..1000)
            .map(|s| {
                let mut lag = vec![1.0; ranks];
                lag[777] = 80.0;
                line(s, lag)
            })
            .collect();
        let h = build(&records).unwrap();
        assert!(h.columns.len() <= MAX_COLUMNS && h.rows.len() <= MAX_ROWS);
        let slow = h
            .rows
            .iter()
            .find(|r| r.ranks.0 <= 777 && 777 <= r.ranks.1)
            .unwrap();
        assert_eq!(slow.mean_ms, 80.0);
        assert_eq!(
            h.rows.iter().filter(|r| r.mean_ms == 1.0).count(),
            h.rows.len() - 1
        );
        assert_eq!(build(&[]), None);
    }
}
