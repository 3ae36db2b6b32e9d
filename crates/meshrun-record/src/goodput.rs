//! Goodput: where a run's wall time went (`goodput.json`).
//!
//! Every worker measures, on its own clock and without a barrier, the
//! seconds its main thread spent compiling (JAX's compile spans, merged so
//! nested ones count once), joining `jax.distributed`, waiting for data,
//! blocked in checkpoint saves and in restores, and when its program
//! started. It sends these cumulative figures ([`Timing`]) with checkpointed
//! reports, at most once a second otherwise, and when its program ends.
//!
//! The controller cuts each attempt's wall time, from its start to the exit
//! of its last worker, into parts that cover it exactly:
//! - startup: attempt start to the user's code starting, plus the join;
//! - compile, data, checkpoint, restore: as measured;
//! - step: the rest of the time up to the worker's last figures;
//! - other: after those figures until the attempt ended (exit, teardown);
//! - lost: in a failed attempt, everything after the figures sent with the
//!   newest checkpoint it committed (all of it when it committed none), and
//!   the gap before the next attempt started;
//! - resize (elastic runs): in an attempt stopped to grow, everything after
//!   the figures sent with the checkpoint it stopped at, and the gap before
//!   the next attempt; in an attempt on another host count than the one
//!   before, the wait for hosts before its launch.
//!
//! The parts of the ranks are averaged. Because each part is measured
//! separately and only `step` is a remainder, a negative remainder (two
//! parts counting the same second) is clamped and shows up as a sum that
//! no longer matches the wall time.
//!
//! No field here has a serde default: a key renamed on one side is an error
//! that names it, not a part that silently reads as zero.

use serde::{Deserialize, Serialize};

use crate::run::RunState;

/// A worker's cumulative figures (unix seconds and seconds).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    pub proc_start: f64,
    pub user_start: f64,
    pub now: f64,
    pub compile: f64,
    pub init: f64,
    pub data: f64,
    pub checkpoint: f64,
    pub restore: f64,
}

impl Timing {
    /// The field names, as the worker must send them.
    pub const FIELDS: [&'static str; 8] = [
        "proc_start",
        "user_start",
        "now",
        "compile",
        "init",
        "data",
        "checkpoint",
        "restore",
    ];
}

/// One part of the wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    Startup,
    Compile,
    Restore,
    Data,
    Step,
    Checkpoint,
    Lost,
    Resize,
    Other,
}

impl Part {
    /// Every part, in the order they are shown.
    pub const ALL: [Part; 9] = [
        Part::Startup,
        Part::Compile,
        Part::Restore,
        Part::Data,
        Part::Step,
        Part::Checkpoint,
        Part::Lost,
        Part::Resize,
        Part::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Part::Startup => "startup",
            Part::Compile => "compile",
            Part::Restore => "restore",
            Part::Data => "data",
            Part::Step => "step",
            Part::Checkpoint => "checkpoint",
            Part::Lost => "lost",
            Part::Resize => "resize",
            Part::Other => "other",
        }
    }
}

/// A value per part (seconds, or fractions of the wall time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parts {
    pub startup: f64,
    pub compile: f64,
    pub restore: f64,
    pub data: f64,
    pub step: f64,
    pub checkpoint: f64,
    pub lost: f64,
    /// Added after the others: files written before it have none.
    #[serde(default)]
    pub resize: f64,
    pub other: f64,
}

impl Parts {
    pub fn get(&self, part: Part) -> f64 {
        match part {
            Part::Startup => self.startup,
            Part::Compile => self.compile,
            Part::Restore => self.restore,
            Part::Data => self.data,
            Part::Step => self.step,
            Part::Checkpoint => self.checkpoint,
            Part::Lost => self.lost,
            Part::Resize => self.resize,
            Part::Other => self.other,
        }
    }

    fn slot(&mut self, part: Part) -> &mut f64 {
        match part {
            Part::Startup => &mut self.startup,
            Part::Compile => &mut self.compile,
            Part::Restore => &mut self.restore,
            Part::Data => &mut self.data,
            Part::Step => &mut self.step,
            Part::Checkpoint => &mut self.checkpoint,
            Part::Lost => &mut self.lost,
            Part::Resize => &mut self.resize,
            Part::Other => &mut self.other,
        }
    }

    /// Adds `secs` (a negative amount counts as none: see the module).
    pub fn add(&mut self, part: Part, secs: f64) {
        *self.slot(part) += secs.max(0.0);
    }

    /// Moves up to `secs` of `from` into `to`.
    pub fn shift(&mut self, from: Part, to: Part, secs: f64) {
        let moved = secs.clamp(0.0, self.get(from));
        *self.slot(from) -= moved;
        *self.slot(to) += moved;
    }

    pub fn total(&self) -> f64 {
        Part::ALL.iter().map(|p| self.get(*p)).sum()
    }
}

/// How an attempt's time after its workers' last counted figures is booked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// Teardown of an attempt that ended: `other`.
    Ended,
    /// Work a failed attempt did not keep: `lost`.
    Failed,
    /// Work and teardown of an attempt stopped to grow: `resize`.
    Resized,
}

/// One rank's parts of an attempt that ran from `start` to `end` (unix
/// seconds). `cut`: the figures up to which its work counts (its last ones,
/// or in a failed or resized attempt those sent with the newest commit).
pub fn rank_parts(start: f64, end: f64, tail: Tail, cut: Option<&Timing>) -> Parts {
    let failed = tail == Tail::Failed;
    let mut parts = Parts::default();
    let wall = (end - start).max(0.0);
    let Some(t) = cut.filter(|t| t.user_start > 0.0 && t.now >= t.user_start) else {
        // Nothing measured (or nothing kept): a failed attempt lost it all;
        // otherwise the worker never got as far as its own code.
        parts.add(if failed { Part::Lost } else { Part::Startup }, wall);
        return parts;
    };
    let user_start = t.user_start.clamp(start, end);
    let now = t.now.clamp(user_start, end);
    parts.add(Part::Startup, user_start - start + t.init);
    parts.add(Part::Compile, t.compile);
    parts.add(Part::Data, t.data);
    parts.add(Part::Checkpoint, t.checkpoint);
    parts.add(Part::Restore, t.restore);
    let measured = t.init + t.compile + t.data + t.checkpoint + t.restore;
    parts.add(Part::Step, now - user_start - measured);
    let after = match tail {
        Tail::Ended => Part::Other,
        Tail::Failed => Part::Lost,
        Tail::Resized => Part::Resize,
    };
    parts.add(after, end - now);
    parts
}

/// The mean over ranks.
pub fn mean(ranks: &[Parts]) -> Parts {
    let mut out = Parts::default();
    if ranks.is_empty() {
        return out;
    }
    for p in Part::ALL {
        let sum: f64 = ranks.iter().map(|r| r.get(p)).sum();
        out.add(p, sum / ranks.len() as f64);
    }
    out
}

/// One attempt's entry of `goodput.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoodputAttempt {
    pub attempt: u32,
    pub state: RunState,
    /// Unix seconds.
    pub start: f64,
    pub end: f64,
    pub wall_s: f64,
    pub seconds: Parts,
}

/// `goodput.json`: every attempt of the run (earlier invocations'
/// included) and their sums.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub wall_s: f64,
    pub measured_s: f64,
    pub seconds: Parts,
    pub fractions: Parts,
    /// The share of the wall time spent in steps.
    pub goodput: f64,
    pub attempts: Vec<GoodputAttempt>,
}

impl Goodput {
    /// Adds an attempt that ran from `start` to `end` with `parts`; when it
    /// `follows` the previous one in the same invocation (a restart), the
    /// time since that one ended in failure (controller restart work) is
    /// lost to that failure. The time between two invocations of a run is
    /// the user's, and counts nowhere. The sums are updated.
    pub fn push(
        &mut self,
        attempt: u32,
        state: RunState,
        (start, end): (f64, f64),
        parts: Parts,
        follows: bool,
    ) {
        let (mut start, mut parts) = (start, parts);
        if let Some(prev) = self.attempts.last().filter(|_| follows) {
            let gap = match prev.state {
                RunState::Failed => Some(Part::Lost),
                RunState::Resized => Some(Part::Resize),
                _ => None,
            };
            if let Some(part) = gap.filter(|_| start > prev.end) {
                parts.add(part, start - prev.end);
                start = prev.end;
            }
        }
        self.attempts.push(GoodputAttempt {
            attempt,
            state,
            start,
            end,
            wall_s: (end - start).max(0.0),
            seconds: parts,
        });
        self.sum();
    }

    fn sum(&mut self) {
        self.wall_s = self.attempts.iter().map(|a| a.wall_s).sum();
        let mut total = Parts::default();
        for a in &self.attempts {
            for p in Part::ALL {
                total.add(p, a.seconds.get(p));
            }
        }
        let mut fractions = Parts::default();
        if self.wall_s > 0.0 {
            for p in Part::ALL {
                fractions.add(p, total.get(p) / self.wall_s);
            }
        }
        self.measured_s = total.total();
        self.goodput = fractions.step;
        self.seconds = total;
        self.fractions = fractions;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(user_start: f64, now: f64) -> Timing {
        Timing {
            proc_start: 100.2,
            user_start,
            now,
            compile: 2.0,
            init: 0.5,
            data: 1.0,
            checkpoint: 0.5,
            restore: 0.25,
        }
    }

    #[test]
    fn a_finished_attempt_is_cut_into_parts_that_cover_it() {
        let parts = rank_parts(100.0, 120.0, Tail::Ended, Some(&timing(101.0, 119.0)));
        assert!((parts.startup - 1.5).abs() < 1e-9);
        assert!((parts.step - (18.0 - 4.25)).abs() < 1e-9);
        assert!((parts.other - 1.0).abs() < 1e-9);
        assert!((parts.total() - 20.0).abs() < 1e-9);
        assert!(parts.lost.abs() < f64::EPSILON);
    }

    #[test]
    fn a_failed_attempt_loses_what_came_after_its_newest_commit() {
        let parts = rank_parts(100.0, 130.0, Tail::Failed, Some(&timing(101.0, 119.0)));
        assert!((parts.lost - 11.0).abs() < 1e-9);
        assert!((parts.total() - 30.0).abs() < 1e-9);
        let none = rank_parts(100.0, 130.0, Tail::Failed, None);
        assert!((none.lost - 30.0).abs() < 1e-9);
    }

    #[test]
    fn the_gap_before_a_restart_is_lost_and_fractions_sum_to_one() {
        let mut g = Goodput::default();
        let first = rank_parts(100.0, 130.0, Tail::Failed, Some(&timing(101.0, 119.0)));
        g.push(1, RunState::Failed, (100.0, 130.0), first, false);
        let second = rank_parts(131.0, 150.0, Tail::Ended, Some(&timing(132.0, 149.5)));
        g.push(2, RunState::Succeeded, (131.0, 150.0), second, true);
        assert!((g.wall_s - 50.0).abs() < 1e-9);
        let sum: f64 = Part::ALL.iter().map(|p| g.fractions.get(*p)).sum();
        assert!((sum - 1.0).abs() < 1e-9);
        assert!((g.seconds.lost - 12.0).abs() < 1e-9);
        let text = serde_json::to_string(&g).unwrap();
        let again: Goodput = serde_json::from_str(&text).unwrap();
        assert_eq!(again, g);
    }

    #[test]
    fn the_time_between_two_invocations_is_not_lost() {
        // The run failed; the user ran it again 8.5 s later.
        let mut g = Goodput::default();
        let first = rank_parts(100.0, 130.0, Tail::Failed, Some(&timing(101.0, 119.0)));
        g.push(1, RunState::Failed, (100.0, 130.0), first, false);
        let second = rank_parts(138.5, 150.0, Tail::Ended, Some(&timing(139.0, 149.5)));
        g.push(2, RunState::Succeeded, (138.5, 150.0), second, false);
        assert!((g.seconds.lost - 11.0).abs() < 1e-9, "{:?}", g.seconds);
        assert!((g.wall_s - 41.5).abs() < 1e-9);
        let sum: f64 = Part::ALL.iter().map(|p| g.fractions.get(*p)).sum();
        assert!((sum - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_resize_books_its_tail_and_gap_apart_from_lost_work() {
        let mut g = Goodput::default();
        let first = rank_parts(100.0, 130.0, Tail::Resized, Some(&timing(101.0, 119.0)));
        assert!((first.resize - 11.0).abs() < 1e-9 && first.lost.abs() < f64::EPSILON);
        g.push(1, RunState::Resized, (100.0, 130.0), first, false);
        let mut second = rank_parts(132.0, 150.0, Tail::Ended, Some(&timing(136.0, 149.5)));
        second.shift(Part::Startup, Part::Resize, 3.0);
        g.push(2, RunState::Succeeded, (132.0, 150.0), second, true);
        assert!((g.seconds.resize - 16.0).abs() < 1e-9, "{:?}", g.seconds);
        assert!(g.seconds.lost.abs() < f64::EPSILON);
        assert!((g.measured_s - g.wall_s).abs() < 1e-9);
    }

    #[test]
    fn a_renamed_part_is_an_error_not_a_zero() {
        let mut v = serde_json::to_value(Parts::default()).unwrap();
        let obj = v.as_object_mut().unwrap();
        let step = obj.remove("step").unwrap();
        obj.insert("steps".into(), step);
        let err = serde_json::from_value::<Parts>(v).unwrap_err().to_string();
        assert!(err.contains("steps") || err.contains("step"), "{err}");
        let mut names: Vec<&str> = Part::ALL.iter().map(|p| p.as_str()).collect();
        names.sort_unstable();
        let fields = serde_json::to_value(Parts::default()).unwrap();
        let keys: Vec<&str> = fields
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys, names,
            "every part is a field, spelled as Part spells it"
        );
        let t = serde_json::to_value(Timing::default()).unwrap();
        let keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
        let mut fields = Timing::FIELDS.to_vec();
        fields.sort_unstable();
        assert_eq!(keys, fields);
    }
}
