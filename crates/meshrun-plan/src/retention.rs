//! Which committed checkpoints to delete after a commit.
//!
//! `num_to_keep` keeps that many: the most recent, or the best by
//! `score_attribute` (a metric saved with the step; a step without it
//! ranks last). `keep_every_n_steps` also keeps every step divisible by it.
//! The newest checkpoint is never deleted, whatever the rules say, since a
//! restart resumes from it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreOrder {
    Max,
    Min,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retention {
    pub num_to_keep: Option<usize>,
    pub keep_every_n_steps: Option<u64>,
    pub score_attribute: Option<String>,
    pub score_order: ScoreOrder,
}

/// One committed checkpoint as retention sees it.
pub struct Candidate {
    pub step: u64,
    pub score: Option<f64>,
}

/// The steps to delete, given every committed checkpoint.
pub fn to_delete(policy: &Retention, candidates: &[Candidate]) -> Vec<u64> {
    let Some(keep) = policy.num_to_keep else {
        return Vec::new();
    };
    let newest = candidates.iter().map(|c| c.step).max();
    let mut ranked: Vec<&Candidate> = candidates.iter().collect();
    if policy.score_attribute.is_some() {
        let sign = match policy.score_order {
            ScoreOrder::Max => -1.0,
            ScoreOrder::Min => 1.0,
        };
        // Best first; unscored last; ties: newer first.
        ranked.sort_by(|a, b| {
            let key = |c: &Candidate| c.score.map_or(f64::INFINITY, |s| sign * s);
            key(a).total_cmp(&key(b)).then(b.step.cmp(&a.step))
        });
    } else {
        ranked.sort_by_key(|c| std::cmp::Reverse(c.step));
    }
    let mut out: Vec<u64> = ranked
        .iter()
        .skip(keep)
        .map(|c| c.step)
        .filter(|&s| Some(s) != newest)
        .filter(|&s| {
            !policy
                .keep_every_n_steps
                .is_some_and(|k| k > 0 && s % k == 0)
        })
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(keep: usize, every: Option<u64>, score: bool, order: ScoreOrder) -> Retention {
        Retention {
            num_to_keep: Some(keep),
            keep_every_n_steps: every,
            score_attribute: score.then(|| "loss".to_string()),
            score_order: order,
        }
    }

    fn cands(list: &[(u64, Option<f64>)]) -> Vec<Candidate> {
        list.iter()
            .map(|&(step, score)| Candidate { step, score })
            .collect()
    }

    #[test]
    fn keeps_the_most_recent() {
        let c = cands(&[(10, None), (20, None), (30, None), (40, None)]);
        assert_eq!(
            to_delete(&policy(2, None, false, ScoreOrder::Min), &c),
            vec![10, 20]
        );
    }

    #[test]
    fn keep_every_n_steps_is_permanent() {
        let c = cands(&[(10, None), (20, None), (30, None), (40, None)]);
        assert_eq!(
            to_delete(&policy(1, Some(20), false, ScoreOrder::Min), &c),
            vec![10, 30]
        );
    }

    #[test]
    fn best_by_score_but_never_the_newest() {
        let c = cands(&[
            (10, Some(0.5)),
            (20, Some(0.2)),
            (30, Some(0.9)),
            (40, Some(0.8)),
        ]);
        assert_eq!(
            to_delete(&policy(1, None, true, ScoreOrder::Min), &c),
            vec![10, 30]
        );
        assert_eq!(
            to_delete(&policy(1, None, true, ScoreOrder::Max), &c),
            vec![10, 20]
        );
        let c = cands(&[(10, Some(0.1)), (20, None)]);
        assert_eq!(
            to_delete(&policy(1, None, true, ScoreOrder::Min), &c),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn no_limit_deletes_nothing() {
        let p = Retention {
            num_to_keep: None,
            keep_every_n_steps: None,
            score_attribute: None,
            score_order: ScoreOrder::Max,
        };
        assert!(to_delete(&p, &cands(&[(1, None), (2, None)])).is_empty());
    }
}
