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

/// The metric meshrun shows as a run's loss (the report's chart, `ls`,
/// `status`, the progress line): `configured` (`--loss-metric`) when
/// given, else `loss`, else one whose last `/`-separated part is `loss`
/// (`MaxText`'s `learning/loss`, beside its `learning/z_loss`), else the first
/// metric in name order that ends in `loss` and is not a validation or test
/// one (`train_loss`), else the first that ends in `loss`. `names`: the
/// metrics reported.
pub fn loss_key<'a>(
    configured: Option<&str>,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    if let Some(c) = configured {
        return Some(c.to_string());
    }
    let mut losses: Vec<&str> = names.into_iter().filter(|n| n.ends_with("loss")).collect();
    losses.sort_unstable();
    losses.dedup();
    if losses.contains(&"loss") {
        return Some("loss".into());
    }
    let held_out = |n: &&str| ["val", "eval", "test"].iter().any(|p| n.starts_with(p));
    let exactly_loss = |n: &&str| n.rsplit('/').next() == Some("loss");
    losses
        .iter()
        .find(|n| exactly_loss(n) && !held_out(n))
        .or_else(|| losses.iter().find(|n| !held_out(n)))
        .or_else(|| losses.first())
        .map(|n| (*n).to_string())
}

impl MetricsRecord {
    /// The names of its metrics.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.metrics
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.as_str())
    }

    /// A numeric metric, when the program reported one under `key`.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.metrics.get(key)?.as_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::loss_key;

    #[test]
    fn the_loss_is_found_by_name() {
        assert_eq!(
            loss_key(None, ["step", "loss", "train_loss"]).as_deref(),
            Some("loss")
        );
        assert_eq!(
            loss_key(None, ["val_loss", "train_loss", "lr"]).as_deref(),
            Some("train_loss")
        );
        assert_eq!(
            loss_key(None, ["val_loss", "lr"]).as_deref(),
            Some("val_loss")
        );
        assert_eq!(loss_key(None, ["accuracy"]), None);
        // MaxText's: the loss itself, not the first name ending in loss.
        assert_eq!(
            loss_key(
                None,
                [
                    "learning/indexer_loss",
                    "learning/loss",
                    "learning/z_loss",
                    "eval/loss"
                ]
            )
            .as_deref(),
            Some("learning/loss")
        );
        assert_eq!(loss_key(Some("nll"), ["loss"]).as_deref(), Some("nll"));
    }
}
