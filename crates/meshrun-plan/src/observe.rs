//! What a run watches for while it trains: stragglers (`--straggler-*`)
//! and profile captures (`--profile-steps`, `--profile-stragglers`).

use serde::{Deserialize, Serialize};

use crate::error::UsageError;

/// `--straggler-threshold`: a rank reaching its steps this share of a step
/// later than the median rank is slow.
pub const DEFAULT_STRAGGLER_THRESHOLD: f64 = 0.2;
/// `--straggler-steps`: for this many steps in a row, it is a straggler.
pub const DEFAULT_STRAGGLER_STEPS: u32 = 20;
/// `meshrun profile --steps`, and `--profile-stragglers`' capture.
pub const DEFAULT_PROFILE_STEPS: u32 = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observe {
    pub straggler_threshold: f64,
    pub straggler_steps: u32,
    /// Take one profile capture when a straggler is first named.
    #[serde(default)]
    pub profile_stragglers: bool,
    /// Trace every rank from the report of step A to that of step B.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_steps: Option<(u64, u64)>,
}

impl Default for Observe {
    fn default() -> Self {
        Self {
            straggler_threshold: DEFAULT_STRAGGLER_THRESHOLD,
            straggler_steps: DEFAULT_STRAGGLER_STEPS,
            profile_stragglers: false,
            profile_steps: None,
        }
    }
}

impl Observe {
    pub fn validate(&self) -> Result<(), UsageError> {
        let t = self.straggler_threshold;
        if !(t.is_finite() && t > 0.0) {
            return Err(UsageError::BadStragglerThreshold(t));
        }
        if self.straggler_steps == 0 {
            return Err(UsageError::BadStragglerSteps(self.straggler_steps));
        }
        if let Some((a, b)) = self.profile_steps {
            if a >= b {
                return Err(UsageError::BadProfileSteps(format!("{a}:{b}")));
            }
        }
        Ok(())
    }
}

/// `A:B` of `--profile-steps`: two steps, the first below the second.
pub fn parse_profile_steps(text: &str) -> Result<(u64, u64), UsageError> {
    let bad = || UsageError::BadProfileSteps(text.to_string());
    let (a, b) = text.split_once(':').ok_or_else(bad)?;
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    if a >= b {
        return Err(bad());
    }
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_steps_are_two_steps_in_order() {
        assert_eq!(parse_profile_steps("5:8").unwrap(), (5, 8));
        for bad in ["8:5", "5:5", "5", "a:b", "5:-1", ""] {
            let e = parse_profile_steps(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn a_threshold_must_be_positive_and_the_window_a_step_at_least() {
        assert!(Observe::default().validate().is_ok());
        let o = |t, s| Observe {
            straggler_threshold: t,
            straggler_steps: s,
            ..Observe::default()
        };
        assert!(o(0.0, 20)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("got 0"));
        assert!(o(f64::NAN, 20).validate().is_err());
        assert!(o(0.2, 0)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--straggler-steps"));
    }
}
