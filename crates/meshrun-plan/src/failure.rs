//! What happens when an attempt fails, and the timeouts that fail one.

use serde::{Deserialize, Serialize};

/// What happens when an attempt fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FailurePolicy {
    /// Failed attempts that are followed by a restart; the next one ends the run.
    pub max_failures: u32,
    /// An attempt in which some rank has not reported for this long has hung.
    pub hang_timeout_s: Option<f64>,
    /// While a rank that finished its program waits for the others, a rank
    /// with no report for this long has hung (`None`:
    /// [`DEFAULT_FINISH_TIMEOUT_S`]).
    #[serde(default)]
    pub finish_timeout_s: Option<f64>,
    /// How long an attempt may wait for cluster resources (a Ray placement
    /// group, the workers' Ray tasks) before its first step (`None`:
    /// [`DEFAULT_START_TIMEOUT_S`]).
    #[serde(default)]
    pub start_timeout_s: Option<f64>,
}

/// JAX holds a finished rank in its shutdown barrier for 300 s, then
/// aborts it; a rank that has not caught up after a minute is stuck.
pub const DEFAULT_FINISH_TIMEOUT_S: f64 = 60.0;

/// Ten minutes: a cluster that has not found the resources by then is
/// not about to.
pub const DEFAULT_START_TIMEOUT_S: f64 = 600.0;

impl FailurePolicy {
    pub fn finish_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(
            self.finish_timeout_s.unwrap_or(DEFAULT_FINISH_TIMEOUT_S),
        )
    }

    pub fn start_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.start_timeout_s.unwrap_or(DEFAULT_START_TIMEOUT_S))
    }
}
