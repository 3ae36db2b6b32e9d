//! `lag.jsonl`: when each rank reached each step. In synchronous training
//! the time between two reports is the same on every rank (the fast ranks
//! wait for the slow one inside the collective); what differs is when each
//! rank gets to the step. One line per step that every rank reported: each
//! rank's lag behind the first rank to reach it (arrival times are taken on
//! each host and brought onto the controller's clock by the host's agent),
//! and a step's time then.
//!
//! A rank is "slower than the median by X" when it reaches the steps, on
//! the median over a window of steps, X of a step's time after the median
//! rank does: a rank that sleeps 50 ms in each 100 ms step is 50% slower.

use serde::{Deserialize, Serialize};

/// One line of `lag.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LagRecord {
    /// Unix seconds, when the line was written.
    pub time: f64,
    pub attempt: u32,
    pub step: u64,
    /// A step's time around this step, in ms: the median rank's time
    /// since the step recorded before, per step.
    pub step_ms: f64,
    /// Per rank, ms behind the first rank to reach the step.
    pub lag_ms: Vec<f64>,
}

impl LagRecord {
    /// The median of the ranks' lags.
    pub fn median_lag_ms(&self) -> f64 {
        median(&self.lag_ms)
    }

    /// How much later than the median rank `rank` reached the step, as a
    /// fraction of a step's time (0 for the median rank and faster ones).
    pub fn slower(&self, rank: usize) -> f64 {
        self.slower_than(rank, self.median_lag_ms())
    }

    /// [`LagRecord::slower`] with the median lag already known, for a
    /// loop over every rank.
    pub fn slower_than(&self, rank: usize, median_lag_ms: f64) -> f64 {
        let Some(&lag) = self.lag_ms.get(rank) else {
            return 0.0;
        };
        if self.step_ms <= 0.0 {
            return 0.0;
        }
        ((lag - median_lag_ms) / self.step_ms).max(0.0)
    }
}

/// The median of `values` (0 when empty); the lower one of an even count,
/// so that of two ranks the slower is never its own median.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// The slowest rank over the last steps recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Slowest {
    pub rank: u32,
    /// Its median lag over the window, and the median rank's, in ms.
    pub lag_ms: f64,
    pub median_lag_ms: f64,
    /// See [`LagRecord::slower`], its median over the window.
    pub slower: f64,
    /// The window: how many steps, and the last.
    pub steps: usize,
    pub last_step: u64,
}

/// The slowest rank of the newest `window` records of the newest attempt
/// among `records` (in file order); `None` without records.
pub fn slowest(records: &[LagRecord], window: usize) -> Option<Slowest> {
    let attempt = records.last()?.attempt;
    let recent: Vec<&LagRecord> = records
        .iter()
        .rev()
        .take_while(|r| r.attempt == attempt)
        .take(window.max(1))
        .collect();
    let ranks = recent.iter().map(|r| r.lag_ms.len()).max()?;
    let per_rank = |rank: usize, f: &dyn Fn(&LagRecord) -> f64| {
        let v: Vec<f64> = recent
            .iter()
            .filter(|r| rank < r.lag_ms.len())
            .map(|r| f(r))
            .collect();
        median(&v)
    };
    let rank = (0..ranks)
        .max_by(|&a, &b| per_rank(a, &|r| r.lag_ms[a]).total_cmp(&per_rank(b, &|r| r.lag_ms[b])))?;
    let medians: Vec<f64> = recent.iter().map(|r| r.median_lag_ms()).collect();
    Some(Slowest {
        rank: rank as u32,
        lag_ms: per_rank(rank, &|r| r.lag_ms[rank]),
        median_lag_ms: median(&medians),
        slower: per_rank(rank, &|r| r.slower(rank)),
        steps: recent.len(),
        last_step: recent.first()?.step,
    })
}

/// The lines of a `lag.jsonl` of any length, held to a bounded size: lines
/// evenly spaced over the whole run (every 2^k-th, k growing as they fill
/// [`MAX_THINNED_ARRIVALS`]) for a picture of the run, and the newest
/// `recent` lines whole, for the slowest rank now. A run of a million
/// steps at 1,024 ranks has 8 GB of lags; this holds 32 MiB of them.
#[derive(Debug, Default)]
pub struct LagLines {
    thinned: Vec<LagRecord>,
    arrivals: usize,
    stride: u64,
    seen: u64,
    recent: std::collections::VecDeque<LagRecord>,
    keep_recent: usize,
}

/// Lags the thinned lines hold at most (8 bytes each).
pub const MAX_THINNED_ARRIVALS: usize = 1 << 22;

impl LagLines {
    /// Keeping the newest `recent` lines whole.
    pub fn new(recent: usize) -> Self {
        Self {
            stride: 1,
            keep_recent: recent,
            ..Self::default()
        }
    }

    pub fn push(&mut self, line: LagRecord) {
        if self.seen.is_multiple_of(self.stride) {
            self.arrivals += line.lag_ms.len();
            self.thinned.push(line.clone());
            // Full: every other one goes, and from now one in twice as many
            // is kept. At least two stay, however wide the lines.
            while self.arrivals > MAX_THINNED_ARRIVALS && self.thinned.len() > 2 {
                let mut i = 0;
                self.thinned.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                self.arrivals = self.thinned.iter().map(|l| l.lag_ms.len()).sum();
                self.stride *= 2;
            }
        }
        self.seen += 1;
        if self.keep_recent > 0 {
            if self.recent.len() == self.keep_recent {
                self.recent.pop_front();
            }
            self.recent.push_back(line);
        }
    }

    /// (the lines evenly spaced over the run, the newest lines), each in
    /// file order.
    pub fn into_parts(self) -> (Vec<LagRecord>, Vec<LagRecord>) {
        (self.thinned, self.recent.into())
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
    fn the_median_of_two_is_the_faster_so_a_slow_one_stands_out() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[50.0, 0.0]), 0.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
    }

    #[test]
    fn slower_is_the_lag_beyond_the_median_rank_as_a_share_of_a_step() {
        let l = line(7, vec![0.0, 50.0, 2.0, 1.0]);
        assert_eq!(l.median_lag_ms(), 1.0);
        assert!((l.slower(1) - 0.49).abs() < 1e-9);
        assert_eq!(l.slower(0), 0.0, "faster than the median is not negative");
        assert_eq!(l.slower(9), 0.0);
    }

    #[test]
    fn the_slowest_rank_is_named_over_the_newest_window_of_the_newest_attempt() {
        let mut records: Vec<LagRecord> = (0..10).map(|s| line(s, vec![0.0, 1.0, 40.0])).collect();
        records.extend((10..20).map(|s| line(s, vec![0.0, 60.0, 1.0])));
        let s = slowest(&records, 5).unwrap();
        assert_eq!((s.rank, s.steps, s.last_step), (1, 5, 19));
        assert_eq!((s.lag_ms, s.median_lag_ms), (60.0, 1.0));
        assert!((s.slower - 0.59).abs() < 1e-9);
        let mut older = records.clone();
        for r in &mut older[..10] {
            r.attempt = 0;
        }
        assert_eq!(
            slowest(&older, 50).unwrap().steps,
            10,
            "only the newest attempt"
        );
        assert_eq!(slowest(&[], 5), None);
    }

    #[test]
    fn a_long_file_is_thinned_evenly_and_its_newest_lines_kept_whole() {
        let ranks = 1 << 12;
        let mut lines = LagLines::new(20);
        let n = 10_000u64;
        for step in 0..n {
            lines.push(line(step, vec![0.0; ranks]));
        }
        let (thinned, recent) = lines.into_parts();
        assert!(
            thinned.len() * ranks <= MAX_THINNED_ARRIVALS,
            "{}",
            thinned.len()
        );
        assert!(
            thinned.len() * ranks * 2 > MAX_THINNED_ARRIVALS,
            "no more thinned than needed: {}",
            thinned.len()
        );
        let stride = thinned[1].step - thinned[0].step;
        assert!(stride.is_power_of_two() && stride > 1);
        assert!(
            thinned.windows(2).all(|w| w[1].step - w[0].step == stride),
            "evenly spaced"
        );
        assert_eq!(thinned[0].step, 0);
        assert!(
            n - thinned.last().unwrap().step <= stride,
            "it reaches the end"
        );
        assert_eq!(
            recent.iter().map(|l| l.step).collect::<Vec<_>>(),
            (n - 20..n).collect::<Vec<_>>()
        );
    }
}
