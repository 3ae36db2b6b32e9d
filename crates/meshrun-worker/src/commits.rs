//! What the controller said of each checkpoint step (`StepCommitted`: its
//! path; `StepNotCommitted`: why not), kept by the worker's reader thread
//! for `meshrun.wait_committed` and for a restore of the newest checkpoint,
//! which must see what this attempt has saved.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What became of this many steps (the newest) is kept: a program saving
/// at every step of a long run would otherwise grow the map without end.
pub const KEPT_OUTCOMES: usize = 1024;

/// Why a wait for a step returned without its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotCommitted {
    /// The controller said the step will never be committed, and why.
    Failed(String),
    /// Nothing was said of the step before the timeout.
    TimedOut,
    /// The step is older than every step whose outcome is still kept.
    Forgotten { oldest_kept: u64 },
}

#[derive(Default)]
pub(super) struct Commits {
    outcomes: Mutex<Outcomes>,
    changed: Condvar,
}

#[derive(Default)]
struct Outcomes {
    steps: BTreeMap<u64, Result<String, String>>,
    /// The newest step whose outcome was let go, once one was.
    forgotten: Option<u64>,
}

impl Commits {
    /// Records what became of `step` (`Ok`: its path) and wakes the waiters.
    pub(super) fn settle(&self, step: u64, outcome: Result<String, String>) {
        let mut o = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        o.steps.insert(step, outcome);
        while o.steps.len() > KEPT_OUTCOMES {
            let gone = o.steps.pop_first().map(|(s, _)| s);
            o.forgotten = gone.max(o.forgotten);
        }
        self.changed.notify_all();
    }

    /// Waits until `step` is settled (at once when it already is): its
    /// path, else why not; [`NotCommitted::TimedOut`] after `timeout`
    /// (`None`: no limit).
    pub(super) fn wait(
        &self,
        step: u64,
        timeout: Option<Duration>,
    ) -> Result<String, NotCommitted> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut o = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(outcome) = o.steps.get(&step) {
                return outcome.clone().map_err(NotCommitted::Failed);
            }
            if o.forgotten.is_some_and(|f| step <= f) {
                let oldest_kept = o.steps.keys().next().copied().unwrap_or(step);
                return Err(NotCommitted::Forgotten { oldest_kept });
            }
            o = match deadline {
                None => self.changed.wait(o).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(NotCommitted::TimedOut);
                    }
                    self.changed
                        .wait_timeout(o, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_is_woken_by_its_step_and_not_by_another() {
        let commits = Arc::new(Commits::default());
        let settler = Arc::clone(&commits);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            settler.settle(4, Err("rank 1 could not write its part".into()));
            std::thread::sleep(Duration::from_millis(50));
            settler.settle(5, Ok("ckpt/step-5".into()));
        });
        assert_eq!(
            commits.wait(5, Some(Duration::from_secs(10))),
            Ok("ckpt/step-5".into())
        );
        t.join().unwrap();
        assert_eq!(
            commits.wait(4, Some(Duration::ZERO)),
            Err(NotCommitted::Failed(
                "rank 1 could not write its part".into()
            ))
        );
        assert_eq!(
            commits.wait(6, Some(Duration::from_millis(20))),
            Err(NotCommitted::TimedOut)
        );
    }

    #[test]
    fn only_the_newest_outcomes_are_kept_and_an_older_step_says_so() {
        let commits = Commits::default();
        for step in 0..KEPT_OUTCOMES as u64 + 10 {
            commits.settle(step, Ok(format!("step-{step}")));
        }
        assert_eq!(commits.outcomes.lock().unwrap().steps.len(), KEPT_OUTCOMES);
        assert_eq!(
            commits.wait(3, None),
            Err(NotCommitted::Forgotten { oldest_kept: 10 })
        );
        assert_eq!(commits.wait(10, None), Ok("step-10".into()));
    }
}
