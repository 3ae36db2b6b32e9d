//! Naming stragglers, apart from all I/O: the arrival times the agents send
//! (`StepTimes`, on the controller's clock) go in; out come the lines of
//! `lag.jsonl` (see `meshrun_record::lag`) for every step all ranks
//! reported, and the ranks found slower than the median by more than the
//! threshold for the window of steps in a row.

use std::collections::BTreeMap;

use meshrun_record::lag::{median, LagRecord};

/// Steps some rank has not reported yet are kept while they hold at most
/// this many arrivals (16 MiB), and at least 64 steps; older ones are
/// dropped (a rank may report steps the others never do). A second of
/// steps must fit: the hosts' messages about a step come up to a second
/// apart.
const MAX_PENDING_ARRIVALS: usize = 1 << 20;
const MIN_PENDING_STEPS: usize = 64;

/// A rank slower than the threshold for the whole window.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub rank: u32,
    /// Medians over the window: its share of a step behind the median
    /// rank, its lag and the median rank's, in ms.
    pub slower: f64,
    pub lag_ms: f64,
    pub median_lag_ms: f64,
    /// The window's last step and its length.
    pub step: u64,
    pub steps: u32,
}

pub struct Stragglers {
    world: usize,
    threshold: f64,
    window: usize,
    /// step -> each rank's arrival (ns), as they come.
    pending: BTreeMap<u64, Vec<Option<i64>>>,
    max_pending: usize,
    /// The newest step every rank reported, with the arrivals.
    previous: Option<(u64, Vec<i64>)>,
    /// Per rank, the steps in a row it was slow: (slower, lag ms), the
    /// newest `window` of them.
    slow: Vec<Vec<(f64, f64)>>,
    /// Per rank, whether its current slow stretch has been named.
    named: Vec<bool>,
    lines: Vec<LagRecord>,
    found: Vec<Found>,
}

impl Stragglers {
    pub fn new(world: u32, threshold: f64, window: u32) -> Self {
        let world = world as usize;
        Self {
            world,
            threshold,
            window: window.max(1) as usize,
            pending: BTreeMap::new(),
            max_pending: (MAX_PENDING_ARRIVALS / world.max(1)).max(MIN_PENDING_STEPS),
            previous: None,
            slow: vec![Vec::new(); world],
            named: vec![false; world],
            lines: Vec::new(),
            found: Vec::new(),
        }
    }

    /// Rank `rank` reached `step` at `ns`; its first arrival counts.
    pub fn arrived(&mut self, rank: u32, step: u64, ns: i64, attempt: u32, now: f64) {
        let rank = rank as usize;
        if rank >= self.world || self.previous.as_ref().is_some_and(|(s, _)| step <= *s) {
            return;
        }
        let times = self
            .pending
            .entry(step)
            .or_insert_with(|| vec![None; self.world]);
        if times[rank].is_none() {
            times[rank] = Some(ns);
        }
        if times.iter().all(Option::is_some) {
            let times: Vec<i64> = self
                .pending
                .remove(&step)
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .collect();
            // Older steps can no longer complete in order.
            self.pending.retain(|&s, _| s > step);
            self.complete(step, times, attempt, now);
        }
        while self.pending.len() > self.max_pending {
            self.pending.pop_first();
        }
    }

    /// The lines and the stragglers found since the last call.
    pub fn take(&mut self) -> (Vec<LagRecord>, Vec<Found>) {
        (
            std::mem::take(&mut self.lines),
            std::mem::take(&mut self.found),
        )
    }

    fn complete(&mut self, step: u64, times: Vec<i64>, attempt: u32, now: f64) {
        let first = times.iter().copied().min().unwrap_or(0);
        let lag_ms: Vec<f64> = times
            .iter()
            .map(|&t| (t.saturating_sub(first) as f64 / 1e4).round() / 100.0)
            .collect();
        let step_ms = match &self.previous {
            Some((before, then)) => {
                let per_step: Vec<f64> = times
                    .iter()
                    .zip(then)
                    .map(|(&t, &b)| t.saturating_sub(b) as f64 / 1e6 / (step - before) as f64)
                    .collect();
                (median(&per_step) * 100.0).round() / 100.0
            }
            None => 0.0,
        };
        let line = LagRecord {
            time: now,
            attempt,
            step,
            step_ms,
            lag_ms,
        };
        if step_ms > 0.0 {
            self.judge(&line);
        }
        self.lines.push(line);
        self.previous = Some((step, times));
    }

    fn judge(&mut self, line: &LagRecord) {
        // Once per step, not once per rank: at 10,000 ranks a sort per rank
        // would be 10^9 operations a step.
        let median_lag = line.median_lag_ms();
        for rank in 0..self.world {
            let slower = line.slower_than(rank, median_lag);
            let run = &mut self.slow[rank];
            if slower <= self.threshold {
                run.clear();
                self.named[rank] = false;
                continue;
            }
            run.push((slower, line.lag_ms[rank]));
            if run.len() > self.window {
                run.remove(0);
            }
            if run.len() == self.window && !self.named[rank] {
                self.named[rank] = true;
                let shares: Vec<f64> = run.iter().map(|r| r.0).collect();
                let lags: Vec<f64> = run.iter().map(|r| r.1).collect();
                self.found.push(Found {
                    rank: rank as u32,
                    slower: median(&shares),
                    lag_ms: median(&lags),
                    median_lag_ms: median_lag,
                    step: line.step,
                    steps: self.window as u32,
                });
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // exact figures from exact inputs
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    /// Four ranks at 100 ms a step; `late` gives a rank's extra ms at step s.
    fn feed(s: &mut Stragglers, steps: std::ops::Range<u64>, late: impl Fn(u32, u64) -> i64) {
        for step in steps {
            for rank in [3, 1, 0, 2] {
                let ns = step as i64 * 100 * MS + late(rank, step) * MS;
                s.arrived(rank, step, ns, 1, 0.0);
            }
        }
    }

    #[test]
    fn a_rank_late_for_the_whole_window_is_named_once() {
        let mut s = Stragglers::new(4, 0.2, 5);
        feed(&mut s, 0..4, |r, _| if r == 1 { 50 } else { 0 });
        let (lines, found) = s.take();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1].lag_ms, vec![0.0, 50.0, 0.0, 0.0]);
        assert_eq!(lines[1].step_ms, 100.0);
        assert!(found.is_empty(), "3 judged steps are not the window of 5");
        feed(&mut s, 4..20, |r, _| if r == 1 { 50 } else { 0 });
        let (_, found) = s.take();
        assert_eq!(found.len(), 1, "{found:?}");
        let f = &found[0];
        assert_eq!((f.rank, f.step, f.steps), (1, 5, 5));
        assert!((f.slower - 0.5).abs() < 1e-9 && f.lag_ms == 50.0 && f.median_lag_ms == 0.0);
    }

    #[test]
    fn a_rank_under_the_threshold_or_not_late_in_a_row_is_not_named() {
        let mut s = Stragglers::new(4, 0.2, 5);
        // 15 ms of a 100 ms step: under 20%.
        feed(&mut s, 0..30, |r, _| if r == 2 { 15 } else { 0 });
        // Late every other step only.
        feed(
            &mut s,
            30..60,
            |r, st| if r == 0 && st % 2 == 0 { 60 } else { 0 },
        );
        assert!(s.take().1.is_empty());
    }

    #[test]
    fn a_straggler_that_recovers_and_slows_again_is_named_again() {
        let mut s = Stragglers::new(2, 0.2, 3);
        feed_two(&mut s, 0..10, 40);
        feed_two(&mut s, 10..20, 0);
        feed_two(&mut s, 20..30, 40);
        let found = s.take().1;
        assert_eq!(
            found.iter().map(|f| (f.rank, f.step)).collect::<Vec<_>>(),
            vec![(1, 3), (1, 22)]
        );
    }

    fn feed_two(s: &mut Stragglers, steps: std::ops::Range<u64>, late: i64) {
        for step in steps {
            s.arrived(0, step, step as i64 * 100 * MS, 1, 0.0);
            s.arrived(1, step, step as i64 * 100 * MS + late * MS, 1, 0.0);
        }
    }

    #[test]
    fn steps_not_every_rank_reports_are_dropped_and_old_ones_ignored() {
        let mut s = Stragglers::new(2, 0.2, 3);
        s.arrived(0, 5, 0, 1, 0.0);
        s.arrived(0, 6, 10 * MS, 1, 0.0);
        s.arrived(1, 6, 12 * MS, 1, 0.0);
        s.arrived(1, 5, 0, 1, 0.0);
        s.arrived(7, 6, 0, 1, 0.0);
        let lines = s.take().0;
        assert_eq!(lines.iter().map(|l| l.step).collect::<Vec<_>>(), vec![6]);
        assert_eq!(lines[0].lag_ms, vec![0.0, 2.0]);
        // Two ranks: a second of steps at any pace is kept.
        for step in 100..1100 {
            s.arrived(0, step, 0, 1, 0.0);
        }
        assert_eq!(s.pending.len(), 1000);
    }

    #[test]
    fn pending_steps_are_bounded_by_their_arrivals() {
        let world = 1 << 15;
        let mut s = Stragglers::new(world, 0.2, 3);
        for step in 0..200 {
            s.arrived(0, step, 0, 1, 0.0);
        }
        assert_eq!(s.pending.len(), MIN_PENDING_STEPS);
        assert_eq!(s.pending.first_key_value().map(|(k, _)| *k), Some(136));
        let mut s = Stragglers::new(1 << 12, 0.2, 3);
        for step in 0..400 {
            s.arrived(0, step, 0, 1, 0.0);
        }
        assert_eq!(s.pending.len(), MAX_PENDING_ARRIVALS >> 12);
    }
}
