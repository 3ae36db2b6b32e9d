//! Goodput: where a run's wall time went.
//!
//! Every worker measures, on its own clock and without a barrier, the
//! seconds its main thread spent compiling (JAX's compile spans, merged so
//! nested ones count once), joining `jax.distributed`, waiting for data,
//! blocked in checkpoint saves and in restores, and when its program
//! started. It sends these cumulative figures with checkpointed reports, at
//! most once a second otherwise, and when its program ends.
//!
//! The controller cuts each attempt's wall time, from its start to the exit
//! of its last worker, into parts that cover it exactly:
//! - startup: attempt start to the user's code starting, plus the join;
//! - compile, data, checkpoint, restore: as measured;
//! - step: the rest of the time up to the worker's last figures;
//! - other: after those figures until the attempt ended (exit, teardown);
//! - lost: in a failed attempt, everything after the figures sent with the
//!   newest checkpoint it committed (all of it when it committed none), and
//!   the gap before the next attempt started.
//!
//! The parts of the ranks are averaged. Because each part is measured
//! separately and only `step` is a remainder, a negative remainder (two
//! parts counting the same second) is clamped and shows up as a sum that
//! no longer matches the wall time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The run directory's file of the figures below.
pub const GOODPUT_FILE: &str = "goodput.json";

/// The parts, in the order they are shown.
pub const PARTS: [&str; 8] = [
    "startup",
    "compile",
    "restore",
    "data",
    "step",
    "checkpoint",
    "lost",
    "other",
];

/// A worker's cumulative figures (unix seconds and seconds).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
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
    pub fn parse(value: &Value) -> Option<Self> {
        serde_json::from_value(value.clone()).ok()
    }
}

/// Seconds per part.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parts(pub BTreeMap<&'static str, f64>);

impl Parts {
    fn add(&mut self, part: &'static str, secs: f64) {
        *self.0.entry(part).or_default() += secs.max(0.0);
    }

    pub fn get(&self, part: &str) -> f64 {
        self.0.get(part).copied().unwrap_or(0.0)
    }

    pub fn total(&self) -> f64 {
        self.0.values().sum()
    }

    fn json(&self) -> Value {
        Value::Object(
            PARTS
                .iter()
                .map(|p| ((*p).to_string(), json!(self.get(p))))
                .collect(),
        )
    }

    fn from_json(value: &Value) -> Self {
        let mut parts = Self::default();
        for p in PARTS {
            parts.add(p, value[p].as_f64().unwrap_or(0.0));
        }
        parts
    }
}

/// One rank's parts of an attempt that ran from `start` to `end` (unix
/// seconds). `cut`: the figures up to which its work counts (its last ones,
/// or in a failed attempt those sent with the newest commit).
pub fn rank_parts(start: f64, end: f64, failed: bool, cut: Option<&Timing>) -> Parts {
    let mut parts = Parts::default();
    let wall = (end - start).max(0.0);
    let Some(t) = cut.filter(|t| t.user_start > 0.0 && t.now >= t.user_start) else {
        // Nothing measured (or nothing kept): a failed attempt lost it all;
        // otherwise the worker never got as far as its own code.
        parts.add(if failed { "lost" } else { "startup" }, wall);
        return parts;
    };
    let user_start = t.user_start.clamp(start, end);
    let now = t.now.clamp(user_start, end);
    parts.add("startup", user_start - start + t.init);
    for (part, secs) in [
        ("compile", t.compile),
        ("data", t.data),
        ("checkpoint", t.checkpoint),
        ("restore", t.restore),
    ] {
        parts.add(part, secs);
    }
    let measured = t.init + t.compile + t.data + t.checkpoint + t.restore;
    parts.add("step", now - user_start - measured);
    parts.add(if failed { "lost" } else { "other" }, end - now);
    parts
}

/// The mean over ranks.
pub fn mean(ranks: &[Parts]) -> Parts {
    let mut out = Parts::default();
    if ranks.is_empty() {
        return out;
    }
    for p in PARTS {
        let sum: f64 = ranks.iter().map(|r| r.get(p)).sum();
        out.add(p, sum / ranks.len() as f64);
    }
    out
}

/// One attempt's entry of `goodput.json`.
#[derive(Debug, Clone)]
pub struct AttemptParts {
    pub attempt: u32,
    pub state: String,
    pub start: f64,
    pub end: f64,
    pub parts: Parts,
}

/// Every attempt of the run (earlier invocations' included), and the
/// `goodput.json` made of them.
#[derive(Debug, Default)]
pub struct Ledger {
    attempts: Vec<AttemptParts>,
}

impl Ledger {
    /// Picks up the attempts of an earlier `goodput.json` of this run.
    pub fn load(previous: Option<&Value>) -> Self {
        let attempts = previous
            .and_then(|v| v["attempts"].as_array())
            .map(|list| {
                list.iter()
                    .map(|a| AttemptParts {
                        attempt: a["attempt"].as_u64().unwrap_or(0) as u32,
                        state: a["state"].as_str().unwrap_or("").to_string(),
                        start: a["start"].as_f64().unwrap_or(0.0),
                        end: a["end"].as_f64().unwrap_or(0.0),
                        parts: Parts::from_json(&a["seconds"]),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self { attempts }
    }

    /// Adds an attempt; the time since the previous one ended in failure
    /// (controller restart work) is lost to that failure.
    pub fn push(&mut self, mut attempt: AttemptParts) {
        if let Some(prev) = self.attempts.last() {
            if prev.state == "failed" && attempt.start > prev.end {
                attempt.parts.add("lost", attempt.start - prev.end);
                attempt.start = prev.end;
            }
        }
        self.attempts.push(attempt);
    }

    pub fn json(&self) -> Value {
        let wall: f64 = self
            .attempts
            .iter()
            .map(|a| (a.end - a.start).max(0.0))
            .sum();
        let mut total = Parts::default();
        for a in &self.attempts {
            for p in PARTS {
                total.add(p, a.parts.get(p));
            }
        }
        let fractions: serde_json::Map<String, Value> = PARTS
            .iter()
            .map(|p| {
                let f = if wall > 0.0 { total.get(p) / wall } else { 0.0 };
                ((*p).to_string(), json!(f))
            })
            .collect();
        json!({
            "wall_s": wall,
            "measured_s": total.total(),
            "seconds": total.json(),
            "fractions": fractions,
            "goodput": if wall > 0.0 { total.get("step") / wall } else { 0.0 },
            "attempts": self.attempts.iter().map(|a| json!({
                "attempt": a.attempt,
                "state": a.state,
                "start": a.start,
                "end": a.end,
                "wall_s": (a.end - a.start).max(0.0),
                "seconds": a.parts.json(),
            })).collect::<Vec<_>>(),
        })
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
        let parts = rank_parts(100.0, 120.0, false, Some(&timing(101.0, 119.0)));
        assert!((parts.get("startup") - 1.5).abs() < 1e-9);
        assert!((parts.get("step") - (18.0 - 4.25)).abs() < 1e-9);
        assert!((parts.get("other") - 1.0).abs() < 1e-9);
        assert!((parts.total() - 20.0).abs() < 1e-9);
        assert!(parts.get("lost").abs() < f64::EPSILON);
    }

    #[test]
    fn a_failed_attempt_loses_what_came_after_its_newest_commit() {
        let parts = rank_parts(100.0, 130.0, true, Some(&timing(101.0, 119.0)));
        assert!((parts.get("lost") - 11.0).abs() < 1e-9);
        assert!((parts.total() - 30.0).abs() < 1e-9);
        let none = rank_parts(100.0, 130.0, true, None);
        assert!((none.get("lost") - 30.0).abs() < 1e-9);
    }

    #[test]
    fn the_gap_before_a_restart_is_lost_and_fractions_sum_to_one() {
        let mut ledger = Ledger::default();
        ledger.push(AttemptParts {
            attempt: 1,
            state: "failed".into(),
            start: 100.0,
            end: 130.0,
            parts: rank_parts(100.0, 130.0, true, Some(&timing(101.0, 119.0))),
        });
        ledger.push(AttemptParts {
            attempt: 2,
            state: "succeeded".into(),
            start: 131.0,
            end: 150.0,
            parts: rank_parts(131.0, 150.0, false, Some(&timing(132.0, 149.5))),
        });
        let out = ledger.json();
        assert!((out["wall_s"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        let sum: f64 = PARTS
            .iter()
            .map(|p| out["fractions"][p].as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-9);
        assert!((out["seconds"]["lost"].as_f64().unwrap() - 12.0).abs() < 1e-9);
        let again = Ledger::load(Some(&out)).json();
        assert_eq!(again["wall_s"], out["wall_s"]);
    }
}
