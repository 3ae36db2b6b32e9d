//! Two parts of the `status` page that read more than run.json: the
//! checkpoints (listed from the storage, failed saves counted from the
//! events) and the heading of the goodput table (which attempts its wall
//! time covers, against the run's).

use std::fmt::Write as _;
use std::time::Duration;

use std::collections::BTreeMap;

use meshrun_record::memory::{Bytes, MemoryRecord, RankMemory};
use meshrun_record::{names, read, EventLine, FailedSaves, Goodput};

use crate::runs::RunView;
use crate::table::{duration_text, table};

/// Where the flight recorder's dump of each failed attempt is (each
/// rank's last calls across processes, and the programs).
pub fn calls_lines(run: &RunView, attempts: impl Iterator<Item = u32>, out: &mut String) {
    for attempt in attempts {
        let path = names::calls_file(&names::stacks_dir(&run.dir, attempt));
        if path.is_file() {
            let _ = writeln!(
                out,
                "  calls of attempt {attempt} across processes, per rank: {}",
                path.display()
            );
        }
    }
}

/// The committed checkpoints, and the saves that failed.
pub fn checkpoints_line(run: &RunView, out: &mut String) {
    let storage = run.record.as_ref().map_or_else(
        || run.dir.display().to_string(),
        |r| r.storage_dir(&run.dir),
    );
    let committed = meshrun_ckpt::store::Location::parse(&storage)
        .map_err(meshrun_ckpt::CkptError::from)
        .and_then(|s| meshrun_ckpt::commit::committed(&s.join(names::CHECKPOINTS)));
    let _ = writeln!(
        out,
        "\ncheckpoints  {}",
        match committed.as_deref() {
            Ok([.., (step, _)]) => format!(
                "{} committed, newest step-{step}",
                committed.as_ref().map_or(0, Vec::len)
            ),
            Ok([]) => "none".into(),
            Err(e) => format!("cannot be listed: {e}"),
        }
    );
    // Every event is read: the failures of a long outage are spread over
    // the whole file. A file that cannot be read has no failures to tell.
    let mut saves = FailedSaves::default();
    let _ = read::jsonl_each(&run.dir.join(names::EVENTS), |e: EventLine| {
        saves.push(&e);
    });
    if let (Some(summary), Some((_, step, error))) = (saves.summary(), &saves.last) {
        let still = if saves.failing_now() {
            "; none was committed since"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "             {summary}, the newest at step {step}: {error}{still}"
        );
    }
}

/// "over attempts 1-2: 1m38s wall time, of the run's 1m41s": the goodput
/// file covers the attempts that have ended, each from its start to its
/// last worker's exit, so its wall time is not the run's while an attempt
/// runs (`running`: that attempt's number), nor does it hold the time
/// before the first attempt and after the last.
pub fn goodput_heading(g: &Goodput, running: Option<u32>, run: Option<Duration>) -> String {
    let covered: Vec<u32> = g.attempts.iter().map(|a| a.attempt).collect();
    let which = match covered.as_slice() {
        [] => "the attempts that ended".to_string(),
        [one] => format!("attempt {one}"),
        [first, .., last] if covered.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("attempts {first}-{last}")
        }
        many => {
            let list: Vec<String> = many.iter().map(u32::to_string).collect();
            format!("attempts {}", list.join(", "))
        }
    };
    let wall = duration_text(Duration::try_from_secs_f64(g.wall_s).ok());
    let running = running.filter(|n| !covered.contains(n));
    // run.json has whole seconds: an ended run within a second of its
    // attempts' wall time is all in them.
    let whole = match (run, running) {
        (Some(d), Some(_)) => format!(", of the run's {} so far", duration_text(Some(d))),
        (Some(d), None) if d.as_secs_f64() - g.wall_s >= 1.0 => {
            format!(", of the run's {}", duration_text(Some(d)))
        }
        _ => String::new(),
    };
    let later = running.map_or_else(String::new, |n| {
        format!("; attempt {n} is counted when it ends")
    });
    format!("over {which}: {wall} wall time{whole}{later}")
}

/// How many ranks the memory table shows; a larger run shows those with
/// the highest peaks.
const MEMORY_ROWS: usize = 16;

/// Each rank's memory in the newest attempt that sent any: now, at most,
/// and against its limit (host memory; device memory where the backend
/// counts it).
pub fn memory_table(run: &RunView, procs_per_host: u64, out: &mut String) {
    let mut newest: BTreeMap<u32, RankMemory> = BTreeMap::new();
    let mut attempt = 0;
    let _ = read::jsonl_each(&run.dir.join(names::MEMORY), |r: MemoryRecord| {
        if r.attempt > attempt {
            attempt = r.attempt;
            newest.clear();
        }
        if r.attempt == attempt {
            for m in r.ranks {
                newest.insert(m.rank, m);
            }
        }
    });
    if newest.is_empty() {
        return;
    }
    let mut ranks: Vec<RankMemory> = newest.into_values().collect();
    let limit = ranks.iter().find_map(|m| m.limit);
    let _ = writeln!(
        out,
        "\nranks' memory  attempt {attempt}, host memory{}",
        limit.map_or_else(
            || " (no limit set)".to_string(),
            |l| format!(", limit {} per worker", Bytes(l))
        )
    );
    let shown_all = ranks.len() <= MEMORY_ROWS;
    if !shown_all {
        ranks.sort_by_key(|m| std::cmp::Reverse(m.peak));
        ranks.truncate(MEMORY_ROWS / 2);
    }
    let device = ranks.iter().any(|m| m.device_peak.is_some());
    let bytes = |b: Option<u64>| b.map_or_else(|| "-".to_string(), |b| Bytes(b).to_string());
    let rows: Vec<Vec<String>> = ranks
        .iter()
        .map(|m| {
            let mut row = vec![
                m.rank.to_string(),
                (u64::from(m.rank) / procs_per_host.max(1)).to_string(),
                Bytes(m.current).to_string(),
                Bytes(m.peak).to_string(),
                #[allow(clippy::cast_precision_loss)]
                m.limit.map_or_else(
                    || "-".to_string(),
                    |l| format!("{:.0}%", 100.0 * m.peak as f64 / l.max(1) as f64),
                ),
            ];
            if device {
                row.push(bytes(m.device_current));
                row.push(bytes(m.device_peak));
            }
            row
        })
        .collect();
    // An ended run's figures are its last samples.
    let mut header = vec![
        "RANK",
        "HOST",
        if run.live { "NOW" } else { "LAST" },
        "PEAK",
        "OF LIMIT",
    ];
    if device {
        header.extend(["DEVICE NOW", "DEVICE PEAK"]);
    }
    for line in table(&header, &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
    if !shown_all {
        let _ = writeln!(out, "  (the {} ranks with the highest peaks)", ranks.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshrun_record::goodput::{GoodputAttempt, Parts};
    use meshrun_record::RunState;

    fn goodput(attempts: &[(u32, f64)]) -> Goodput {
        let mut g = Goodput::default();
        let mut t = 1000.0;
        for &(n, wall) in attempts {
            g.attempts.push(GoodputAttempt {
                attempt: n,
                state: RunState::Failed,
                start: t,
                end: t + wall,
                wall_s: wall,
                seconds: Parts::default(),
            });
            t += wall;
            g.wall_s += wall;
        }
        g
    }

    #[test]
    fn the_wall_time_says_whose_it_is() {
        // A run 1m41s in, its first attempt (28.2 s) over, its second running.
        let run = Some(Duration::from_secs(101));
        assert_eq!(
            goodput_heading(&goodput(&[(1, 28.2)]), Some(2), run),
            "over attempt 1: 28.2s wall time, of the run's 1m41s so far; attempt 2 is counted when it ends"
        );
        assert_eq!(
            goodput_heading(&goodput(&[(1, 28.2), (2, 70.0)]), None, run),
            "over attempts 1-2: 1m38s wall time, of the run's 1m41s"
        );
        assert_eq!(
            goodput_heading(&goodput(&[(1, 5.0), (3, 5.0)]), None, None),
            "over attempts 1, 3: 10.0s wall time"
        );
        // run.json's whole seconds make a run of 4.5 s one of 4 s.
        assert_eq!(
            goodput_heading(&goodput(&[(1, 4.5)]), None, Some(Duration::from_secs(4))),
            "over attempt 1: 4.5s wall time"
        );
    }
}
