//! Fast recovery: checkpoints kept in host memory (and on a buddy host),
//! and warm standby interpreters that take over a restarted attempt.

use serde::{Deserialize, Serialize};

use super::FailurePolicy;
use crate::error::UsageError;

/// What a spare imports when the run names nothing: the modules nearly
/// every JAX training program loads first, skipped where not installed.
pub const DEFAULT_SPARE_IMPORTS: [&str; 4] = ["jax", "jax.numpy", "flax", "optax"];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// Keep a checkpoint passed to `report` in host memory every N steps
    /// (and a replica on the buddy host).
    #[serde(default)]
    pub memory_every: Option<u64>,
    /// Keep a warm interpreter per worker slot; `None`: when restarts are
    /// allowed.
    #[serde(default)]
    pub warm_spares: Option<bool>,
    /// What each spare imports before it waits; `None`: the defaults.
    #[serde(default)]
    pub spare_imports: Option<Vec<String>>,
}

impl Recovery {
    pub fn validate(&self) -> Result<(), UsageError> {
        if self.memory_every == Some(0) {
            return Err(UsageError::MemoryEveryZero);
        }
        for name in self.spare_imports.iter().flatten() {
            let ok = !name.is_empty()
                && name.split('.').all(|part| {
                    part.chars()
                        .next()
                        .is_some_and(|c| c.is_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_alphanumeric() || c == '_')
                });
            if !ok {
                return Err(UsageError::BadSpareImport(name.clone()));
            }
        }
        Ok(())
    }

    /// The modules each spare imports, or `None` when the run keeps no
    /// spares: a run that cannot restart has no use for them.
    pub fn spares(&self, failure: &FailurePolicy) -> Option<Vec<String>> {
        if !self.warm_spares.unwrap_or(failure.max_failures > 0) {
            return None;
        }
        Some(self.spare_imports.clone().unwrap_or_else(|| {
            DEFAULT_SPARE_IMPORTS
                .iter()
                .map(ToString::to_string)
                .collect()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spares_follow_restarts_unless_told() {
        let none = FailurePolicy::default();
        let some = FailurePolicy {
            max_failures: 2,
            ..Default::default()
        };
        assert_eq!(Recovery::default().spares(&none), None);
        assert_eq!(Recovery::default().spares(&some).unwrap().len(), 4);
        let off = Recovery {
            warm_spares: Some(false),
            ..Default::default()
        };
        assert_eq!(off.spares(&some), None);
        let named = Recovery {
            spare_imports: Some(vec!["torch".into()]),
            ..Default::default()
        };
        assert_eq!(named.spares(&some), Some(vec!["torch".into()]));
    }

    #[test]
    fn bad_settings_are_refused() {
        let zero = Recovery {
            memory_every: Some(0),
            ..Default::default()
        };
        assert!(matches!(zero.validate(), Err(UsageError::MemoryEveryZero)));
        for bad in ["", "jax numpy", "1jax", "jax..numpy", "jax-numpy"] {
            let r = Recovery {
                spare_imports: Some(vec![bad.into()]),
                ..Default::default()
            };
            assert!(
                matches!(r.validate(), Err(UsageError::BadSpareImport(_))),
                "{bad}"
            );
        }
        let good = Recovery {
            spare_imports: Some(vec!["jax.numpy".into(), "_x1".into()]),
            ..Default::default()
        };
        assert!(good.validate().is_ok());
    }
}
