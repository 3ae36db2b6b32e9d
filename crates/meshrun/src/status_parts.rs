//! Two parts of the `status` page that read more than run.json: the
//! checkpoints (listed from the storage, failed saves counted from the
//! events) and the heading of the goodput table (which attempts its wall
//! time covers, against the run's).

use std::fmt::Write as _;
use std::time::Duration;

use meshrun_record::{names, read, EventLine, FailedSaves, Goodput};

use crate::runs::RunView;
use crate::table::duration_text;

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
