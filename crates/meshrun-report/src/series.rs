//! The curves of the report, computed from the metrics records. A curve is
//! cut into one segment per attempt: steps that a restart ran again are
//! drawn as a second stroke over the first, never as a line going back in
//! time.

use crate::model::Record;

/// The most points one series keeps; beyond that every k-th point is kept
/// (plus each segment's last), so a long run still gives a small page.
pub const MAX_POINTS: usize = 2000;

/// One named curve: segments of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub segments: Vec<Vec<(f64, f64)>>,
}

impl Series {
    pub fn len(&self) -> usize {
        self.segments.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn points(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.segments.iter().flatten()
    }
}

/// `key` against step, one segment per attempt (a new one also wherever the
/// step goes back within an attempt).
pub fn by_step(records: &[Record], key: &str) -> Series {
    let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut last: Option<(u32, f64)> = None;
    for r in records {
        let (Some(step), Some(value)) = (r.step, r.get(key)) else {
            continue;
        };
        let continues = matches!(last, Some((a, s)) if a == r.attempt && step >= s);
        if !continues {
            segments.push(Vec::new());
        }
        segments
            .last_mut()
            .expect("pushed above")
            .push((step, value));
        last = Some((r.attempt, step));
    }
    downsample(Series {
        name: key.to_string(),
        segments,
    })
}

/// Every metric whose name starts with "val", in order of first appearance.
pub fn validation_keys(records: &[Record]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for r in records {
        for (k, _) in &r.values {
            if k.starts_with("val") && !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    keys
}

/// Steps per second against seconds since `start`: one point per interval
/// between consecutive records of one attempt. Reports reach the
/// controller in bursts (a slow evaluation step, then the steps queued
/// behind it at once), so a record that follows the previous one by less
/// than a quarter of the median interval is folded into the interval
/// before it, instead of reading as a spike; intervals are also widened to
/// 1/1000 of the run, so that a long run gives a readable curve.
pub fn steps_per_second(records: &[Record], start: f64) -> Series {
    let stepped: Vec<(u32, f64, f64)> = records
        .iter()
        .filter_map(|r| Some((r.attempt, r.time, r.step?)))
        .collect();
    let mut gaps: Vec<f64> = stepped
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| w[1].1 - w[0].1)
        .filter(|d| *d > 0.0)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let burst = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0) * 0.25;
    let span = match (stepped.first(), stepped.last()) {
        (Some(a), Some(b)) => b.1 - a.1,
        _ => 0.0,
    };
    let min_width = span / 1000.0;

    // Intervals (from time, to time, steps), one list per segment.
    let mut segments: Vec<Vec<(f64, f64, f64)>> = Vec::new();
    for w in stepped.windows(2) {
        let ((a_att, a_t, a_s), (b_att, b_t, b_s)) = (w[0], w[1]);
        if a_att != b_att || b_s < a_s || b_t < a_t {
            segments.push(Vec::new());
            continue;
        }
        if segments.is_empty() {
            segments.push(Vec::new());
        }
        let seg = segments.last_mut().expect("pushed above");
        match seg.last_mut() {
            Some(last) if b_t - a_t < burst || last.1 - last.0 < min_width => {
                last.1 = b_t;
                last.2 += b_s - a_s;
            }
            _ => seg.push((a_t, b_t, b_s - a_s)),
        }
    }
    let segments = segments
        .into_iter()
        .map(|seg| {
            seg.into_iter()
                .filter(|&(from, to, steps)| to > from && steps > 0.0)
                .map(|(from, to, steps)| (to - start, steps / (to - from)))
                .collect::<Vec<_>>()
        })
        .filter(|seg| !seg.is_empty())
        .collect();
    downsample(Series {
        name: "steps/s".to_string(),
        segments,
    })
}

/// `key` against seconds since `start`, one segment per attempt.
pub fn by_time(records: &[Record], key: &str, start: f64) -> Series {
    let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut last_attempt = None;
    for r in records {
        let Some(value) = r.get(key) else { continue };
        if last_attempt != Some(r.attempt) {
            segments.push(Vec::new());
            last_attempt = Some(r.attempt);
        }
        segments
            .last_mut()
            .expect("pushed above")
            .push((r.time - start, value));
    }
    downsample(Series {
        name: key.to_string(),
        segments,
    })
}

/// Keeps every k-th point of each segment and its last, so that the series
/// has about `MAX_POINTS` at most.
pub fn downsample(mut series: Series) -> Series {
    let n = series.len();
    if n <= MAX_POINTS {
        return series;
    }
    let k = n.div_ceil(MAX_POINTS);
    for seg in &mut series.segments {
        let last = seg.len().saturating_sub(1);
        let mut i = 0;
        seg.retain(|_| {
            let keep = i % k == 0 || i == last;
            i += 1;
            keep
        });
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(time: f64, attempt: u32, step: u64, loss: f64) -> Record {
        Record {
            time,
            attempt,
            step: Some(step as f64),
            values: vec![("loss".to_string(), loss)],
        }
    }

    #[test]
    fn a_restart_starts_a_new_segment() {
        let records = [
            rec(0.0, 1, 1, 3.0),
            rec(1.0, 1, 2, 2.0),
            rec(2.0, 1, 3, 1.5),
            rec(5.0, 2, 2, 2.0),
            rec(6.0, 2, 3, 1.4),
        ];
        let s = by_step(&records, "loss");
        assert_eq!(s.segments.len(), 2);
        assert_eq!(s.segments[1], vec![(2.0, 2.0), (3.0, 1.4)]);
        let rate = steps_per_second(&records, 0.0);
        assert_eq!(rate.segments.len(), 2);
        assert!(
            rate.points().all(|&(_, r)| (r - 1.0).abs() < 1e-9),
            "{rate:?}"
        );
    }

    #[test]
    fn bursts_do_not_read_as_spikes() {
        // Step 10 evaluates (2 s); step 11 reaches the controller right
        // behind it: together they are 2 steps in 2 s, not 0.5 then 10000.
        let mut records: Vec<Record> = (0..10u32)
            .map(|i| rec(f64::from(i), 1, i.into(), 1.0))
            .collect();
        records.push(rec(11.0, 1, 10, 1.0));
        records.push(rec(11.0001, 1, 11, 1.0));
        records.push(rec(12.0001, 1, 12, 1.0));
        let rate = steps_per_second(&records, 0.0);
        assert!(
            rate.points().all(|&(_, r)| (r - 1.0).abs() < 1e-3),
            "{rate:?}"
        );
    }

    #[test]
    fn long_series_are_thinned_but_keep_their_ends() {
        let records: Vec<Record> = (0..10_001u32)
            .map(|i| rec(f64::from(i), 1, i.into(), 1.0))
            .collect();
        let s = by_step(&records, "loss");
        assert!(s.len() <= MAX_POINTS + 1, "{}", s.len());
        assert_eq!(s.segments[0].last(), Some(&(10_000.0, 1.0)));
        assert_eq!(s.segments[0].first(), Some(&(0.0, 1.0)));
    }
}
