//! Whether the run's checkpoint saves are failing, for the terminal. With
//! `--on-save-error continue` a storage outage costs checkpoints, not the
//! run: each failed save is a `checkpoint_failed` event and a line in the
//! rank's log, and training goes on. An outage that lasts is hundreds of
//! such saves, so the terminal gets one line when saves start failing
//! (with the first cause) and one when a save is committed again, never a
//! line per save; the status line says meanwhile since when they fail.

/// The saves of one attempt, as the driver sees them fail and commit.
#[derive(Debug, Default)]
pub struct SaveHealth {
    failing: Option<Failing>,
}

#[derive(Debug)]
struct Failing {
    first: u64,
    last: u64,
    /// Saves that failed, each step counted once however many of its
    /// ranks failed.
    steps: u64,
}

impl SaveHealth {
    /// The save of `step` failed (`error` names the rank or the commit):
    /// the warning to show when saves were working until now.
    pub fn failed(&mut self, step: u64, error: &str) -> Option<String> {
        if let Some(f) = &mut self.failing {
            // Ranks save the steps in order: a step past the newest one
            // failed is a new failed save, the others' failures of a step
            // already counted are not.
            if step > f.last {
                f.steps += 1;
                f.last = step;
            }
            return None;
        }
        self.failing = Some(Failing {
            first: step,
            last: step,
            steps: 1,
        });
        Some(format!(
            "meshrun: warning: checkpoint saves are failing: step-{step} was not saved: {error}; \
             training goes on without checkpoints (--on-save-error continue), each save tries again"
        ))
    }

    /// `step` was committed: the line to show when saves had been failing.
    pub fn committed(&mut self, step: u64) -> Option<String> {
        let f = self.failing.take()?;
        let which = if f.first == f.last {
            format!("step-{}", f.first)
        } else {
            format!("step-{} to step-{}", f.first, f.last)
        };
        Some(format!(
            "meshrun: checkpoints are saving again: step-{step} committed after {} failed save(s) ({which})",
            f.steps
        ))
    }

    /// The first step of the failures going on, if saves are failing.
    pub fn failing_since(&self) -> Option<u64> {
        self.failing.as_ref().map(|f| f.first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_one_line_when_it_begins_and_one_when_it_ends() {
        let mut h = SaveHealth::default();
        assert_eq!(h.committed(5), None, "saves that work say nothing");
        let first = h
            .failed(10, "rank 0: cannot write: Not a directory")
            .unwrap();
        assert!(
            first.starts_with("meshrun: warning: checkpoint saves are failing: step-10 was not saved: rank 0: cannot write: Not a directory;"),
            "{first}"
        );
        // The other rank's failure of the same step, and the next steps.
        assert_eq!(h.failed(10, "rank 1: cannot write"), None);
        assert_eq!(h.failed(11, "rank 0: cannot write"), None);
        assert_eq!(h.failed(12, "rank 0: cannot write"), None);
        assert_eq!(h.failing_since(), Some(10));
        assert_eq!(
            h.committed(13).unwrap(),
            "meshrun: checkpoints are saving again: step-13 committed after 3 failed save(s) (step-10 to step-12)"
        );
        assert_eq!(h.failing_since(), None);
        assert_eq!(h.committed(14), None);
        // A second outage is told again.
        assert!(h.failed(20, "commit failed").is_some());
        assert!(h
            .committed(21)
            .unwrap()
            .ends_with("after 1 failed save(s) (step-20)"));
    }
}
