//! `metrics.jsonl`: one line per report of rank 0.

use serde::{Deserialize, Serialize};

/// One report: its time, attempt, step and the metrics as the program gave
/// them (any JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// Unix seconds.
    pub time: f64,
    pub attempt: u32,
    pub step: Option<u64>,
    pub metrics: serde_json::Value,
}

impl MetricsRecord {
    /// A numeric metric, when the program reported one under `key`.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.metrics.get(key)?.as_f64()
    }
}
