//! Elastic runs (`--hosts MIN:MAX`): how many hosts an attempt runs on.
//!
//! The processes per host stay fixed, so the world size moves in steps of
//! a host. By default an attempt runs on the largest count present that
//! divides MAX (4 -> 2 rather than 3): mesh axes and global batches that
//! divide MAX hosts' devices then divide the smaller count's too.

use serde::{Deserialize, Serialize};

use super::RunPlan;
use crate::error::UsageError;

/// How long a restart waits for a lost host to come back before it runs on
/// the hosts present, unless `--rejoin-timeout` says otherwise.
pub const DEFAULT_REJOIN_TIMEOUT_S: f64 = 60.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Elastic {
    /// The fewest hosts an attempt runs on; the plan's `hosts` is the most.
    pub min_hosts: u32,
    /// Seconds a restart waits for every host before it runs on fewer (and
    /// the first attempt, once MIN hosts are there, waits for the rest).
    #[serde(default)]
    pub rejoin_timeout_s: Option<f64>,
    /// Run on any count from MIN to MAX, not only those dividing MAX.
    #[serde(default)]
    pub any_count: bool,
}

impl Elastic {
    pub fn validate(&self, max_hosts: u32) -> Result<(), UsageError> {
        if self.min_hosts == 0 || self.min_hosts > max_hosts {
            return Err(UsageError::BadHostRange {
                min: self.min_hosts,
                max: max_hosts,
            });
        }
        if let Some(t) = self.rejoin_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(UsageError::BadRejoinTimeout(t));
            }
        }
        Ok(())
    }

    pub fn rejoin_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(
            self.rejoin_timeout_s.unwrap_or(DEFAULT_REJOIN_TIMEOUT_S),
        )
    }

    /// The host count an attempt runs on when `present` hosts are there
    /// (of at most `max`), or `None` when that is fewer than MIN allows.
    pub fn size(&self, present: u32, max: u32) -> Option<u32> {
        (self.min_hosts..=present.min(max))
            .rev()
            .find(|&k| self.any_count || max.is_multiple_of(k))
    }
}

impl RunPlan {
    /// This plan for an attempt on `hosts` hosts (an elastic run's
    /// processes per host stay fixed).
    #[must_use]
    pub fn sized(&self, hosts: u32) -> RunPlan {
        RunPlan {
            hosts,
            nprocs: hosts * self.procs_per_host,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elastic(min: u32, any_count: bool) -> Elastic {
        Elastic {
            min_hosts: min,
            rejoin_timeout_s: None,
            any_count,
        }
    }

    #[test]
    fn the_largest_count_that_divides_max_is_chosen() {
        let e = elastic(1, false);
        assert_eq!(e.size(4, 4), Some(4));
        assert_eq!(e.size(3, 4), Some(2));
        assert_eq!(e.size(5, 6), Some(3));
        assert_eq!(e.size(1, 4), Some(1));
        assert_eq!(e.size(0, 4), None);
        // More present than the run takes: MAX.
        assert_eq!(e.size(7, 4), Some(4));
    }

    #[test]
    fn min_bounds_the_choice_and_any_count_takes_what_is_there() {
        assert_eq!(
            elastic(3, false).size(3, 4),
            None,
            "3 does not divide 4, 2 is below MIN"
        );
        assert_eq!(elastic(3, true).size(3, 4), Some(3));
        assert_eq!(elastic(2, false).size(1, 4), None);
        assert_eq!(elastic(2, true).size(5, 8), Some(5));
    }

    #[test]
    fn ranges_and_timeouts_are_checked() {
        assert!(matches!(
            elastic(0, false).validate(4),
            Err(UsageError::BadHostRange { min: 0, max: 4 })
        ));
        assert!(matches!(
            elastic(5, false).validate(4),
            Err(UsageError::BadHostRange { min: 5, max: 4 })
        ));
        let bad = Elastic {
            rejoin_timeout_s: Some(-1.0),
            ..elastic(1, false)
        };
        assert!(matches!(
            bad.validate(4),
            Err(UsageError::BadRejoinTimeout(_))
        ));
        assert!(elastic(2, false).validate(4).is_ok());
    }
}
