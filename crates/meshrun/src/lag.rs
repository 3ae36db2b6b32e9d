//! The slowest rank of a run, for `meshrun status`: from the newest lines
//! of `lag.jsonl`, and whether it was named a straggler (`straggler`
//! events of the newest attempt).

use std::fmt::Write as _;
use std::path::Path;

use meshrun_record::{lag, names, Event, EventLine, LagRecord};

use crate::runs::{last_records, last_records_at_least};

/// "rank 1 (host 0): 48% of a step later than the median rank ..."
pub fn slowest_now(dir: &Path, plan: &serde_json::Value) -> Option<String> {
    let window = plan["observe"]["straggler_steps"].as_u64().unwrap_or(20) as usize;
    let mut lines: Vec<LagRecord> = last_records_at_least(&dir.join(names::LAG), window);
    lines.reverse();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_of_20000_ranks_is_found_though_a_line_is_over_64_kib() {
        let dir = tempfile::tempdir().unwrap();
        let ranks = 20_000;
        let mut text = String::new();
        for step in 1..=25u64 {
            let mut lag_ms = vec![0.0; ranks];
            lag_ms[12_345] = 40.0;
            let line = LagRecord {
                time: 0.0,
                attempt: 1,
                step,
                step_ms: 100.0,
                lag_ms,
            };
            text.push_str(&serde_json::to_string(&line).unwrap());
            text.push('\n');
        }
        assert!(text.len() / 25 > 64 * 1024, "a line is over 64 KiB");
        std::fs::write(dir.path().join(names::LAG), text).unwrap();
        let plan = serde_json::json!({"observe": {"straggler_steps": 20}, "procs_per_host": 8});
        let said = slowest_now(dir.path(), &plan).expect("a slowest rank");
        assert!(
            said.starts_with("rank 12345 (host 1543): 40% of a step later than the median rank over the last 20 steps to step 25"),
            "{said}"
        );
    }
}
