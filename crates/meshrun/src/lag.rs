//! The slowest rank of a run, for `meshrun status`: from the newest lines
//! of `lag.jsonl`, and whether it was named a straggler (`straggler`
//! events of the newest attempt).

use std::fmt::Write as _;
use std::path::Path;

use meshrun_record::{lag, names, Event, EventLine, LagRecord};

use crate::runs::last_records;

/// "rank 1 (host 0): 48% of a step later than the median rank ..."
pub fn slowest_now(dir: &Path, plan: &serde_json::Value) -> Option<String> {
    let mut lines: Vec<LagRecord> = last_records(&dir.join(names::LAG));
    lines.reverse();
    let window = plan["observe"]["straggler_steps"].as_u64().unwrap_or(20) as usize;
    let slow = lag::slowest(&lines, window)?;
    let attempt = lines.last()?.attempt;
    let pph = plan["procs_per_host"].as_u64().unwrap_or(1).max(1);
    let host = u64::from(slow.rank) / pph;
    let events: Vec<EventLine> = last_records(&dir.join(names::EVENTS));
    let named = events.iter().find_map(|e| match &e.event {
        Event::Straggler {
            attempt: a,
            rank,
            step,
            ..
        } if *a == attempt && *rank == slow.rank => Some(*step),
        _ => None,
    });
    let mut text = format!(
        "rank {} (host {host}): {:.0}% of a step later than the median rank over the last {} steps to step {} ({:.1} ms behind the first rank; the median rank {:.1} ms)",
        slow.rank,
        slow.slower * 100.0,
        slow.steps,
        slow.last_step,
        slow.lag_ms,
        slow.median_lag_ms
    );
    if let Some(step) = named {
        let _ = write!(text, "; named a straggler at step {step}");
    }
    Some(text)
}
