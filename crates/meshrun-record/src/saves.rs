//! The checkpoint saves that failed, as `events.jsonl` tells them: one
//! `checkpoint_failed` event per rank that could not write its part (and
//! one per commit that failed), so a save of 8 ranks that the storage
//! refused is 8 events and one failed save. `meshrun status` and the
//! report count them the same way, here.

use std::collections::HashSet;

use crate::event::{Event, EventLine};

/// The failed saves of a run, in the order of its events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailedSaves {
    /// Each failed save once: (attempt, step).
    saves: HashSet<(u32, u64)>,
    /// The lowest and highest step that failed.
    lo: u64,
    hi: u64,
    /// The newest failure: its time (unix seconds), step and error.
    pub last: Option<(f64, u64, String)>,
    /// The time of the newest commit.
    pub last_commit: Option<f64>,
}

impl FailedSaves {
    /// Reads the failures and commits among `events`.
    pub fn of<'a>(events: impl IntoIterator<Item = &'a EventLine>) -> Self {
        let mut out = Self::default();
        for e in events {
            out.push(e);
        }
        out
    }

    /// Takes one event into account (others are passed over).
    pub fn push(&mut self, line: &EventLine) {
        match &line.event {
            Event::CheckpointFailed {
                attempt,
                step,
                error,
            } => {
                if self.saves.is_empty() {
                    (self.lo, self.hi) = (*step, *step);
                }
                self.saves.insert((*attempt, *step));
                self.lo = self.lo.min(*step);
                self.hi = self.hi.max(*step);
                self.last = Some((line.time, *step, error.clone()));
            }
            Event::CheckpointCommitted { .. } => self.last_commit = Some(line.time),
            _ => {}
        }
    }

    /// How many saves failed (a step counted once per attempt, however
    /// many of its ranks failed).
    pub fn count(&self) -> usize {
        self.saves.len()
    }

    /// The lowest and highest step that failed.
    pub fn steps(&self) -> Option<(u64, u64)> {
        (!self.saves.is_empty()).then_some((self.lo, self.hi))
    }

    /// Whether the newest save failed, that is, no commit came after the
    /// newest failure: the storage may still be down.
    pub fn failing_now(&self) -> bool {
        match (&self.last, self.last_commit) {
            (Some((failed, ..)), Some(committed)) => *failed > committed,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// "3 saves failed (steps 855 to 871)", or `None` when none did.
    pub fn summary(&self) -> Option<String> {
        let (lo, hi) = self.steps()?;
        let n = self.count();
        let which = if lo == hi {
            format!("step {lo}")
        } else {
            format!("steps {lo} to {hi}")
        };
        Some(format!(
            "{n} save{} failed ({which})",
            if n == 1 { "" } else { "s" }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(time: f64, attempt: u32, step: u64, rank: u32) -> EventLine {
        EventLine {
            time,
            event: Event::CheckpointFailed {
                attempt,
                step,
                error: format!("rank {rank}: cannot write"),
            },
        }
    }

    fn committed(time: f64, step: u64) -> EventLine {
        EventLine {
            time,
            event: Event::CheckpointCommitted {
                attempt: 1,
                step,
                path: format!("/c/step-{step}"),
            },
        }
    }

    #[test]
    fn a_save_is_counted_once_however_many_ranks_failed_it() {
        let events = [
            committed(1.0, 4),
            failed(2.0, 1, 5, 0),
            failed(2.1, 1, 5, 1),
            failed(3.0, 1, 6, 1),
            failed(3.1, 1, 6, 0),
        ];
        let saves = FailedSaves::of(&events);
        assert_eq!(saves.count(), 2);
        assert_eq!(saves.summary().unwrap(), "2 saves failed (steps 5 to 6)");
        assert!(saves.failing_now());
        assert_eq!(saves.last.as_ref().unwrap().2, "rank 0: cannot write");
        let mut later = saves.clone();
        later.push(&committed(4.0, 7));
        assert!(!later.failing_now());
        // Step 5 of another attempt is another save.
        later.push(&failed(5.0, 2, 5, 0));
        assert_eq!(later.count(), 3);
        assert_eq!(FailedSaves::default().summary(), None);
        assert!(!FailedSaves::default().failing_now());
    }
}
