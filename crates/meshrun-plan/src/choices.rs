//! The names a user picks a setting by, and the settings' defaults, in one
//! place: the Python API reads them through `_native.DEFAULTS` (its
//! dataclasses' defaults) and parses its strings with these tables, and a
//! worker reads its save-error policy with [`SaveErrorPolicy::from_env`].

use crate::retention::ScoreOrder;
use crate::{FailurePolicy, SaveErrorPolicy, Tee, RAY_STRATEGIES};

/// Where runs are written when no folder is given.
pub const DEFAULT_RUNS_DIR: &str = "runs";

/// The accepted names of each choice, as users spell them.
pub const TEES: [(&str, Tee); 3] = [
    ("rank0", Tee::Rank0),
    ("all", Tee::All),
    ("none", Tee::None),
];
pub const SCORE_ORDERS: [(&str, ScoreOrder); 2] =
    [("max", ScoreOrder::Max), ("min", ScoreOrder::Min)];
pub const SAVE_ERROR_POLICIES: [(&str, SaveErrorPolicy); 2] = [
    ("continue", SaveErrorPolicy::Continue),
    ("fail", SaveErrorPolicy::Fail),
];

/// Which rank's output the terminal shows unless told.
pub const DEFAULT_TEE: Tee = Tee::Rank0;
/// Whether a higher score is the better checkpoint unless told.
pub const DEFAULT_SCORE_ORDER: ScoreOrder = ScoreOrder::Max;

/// The name `value` has in `table`.
pub fn name_of<T: PartialEq + Copy>(table: &[(&'static str, T)], value: T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map(|(name, _)| *name)
        .expect("every value of a choice has a name in its table")
}

/// The value named `name` in `table`.
pub fn by_name<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// A default the Python API gives a setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    Text(&'static str),
    Count(u32),
}

/// Every default the Python API needs, by the name of its setting.
pub fn defaults() -> [(&'static str, Default); 6] {
    [
        ("storage_path", Default::Text(DEFAULT_RUNS_DIR)),
        ("tee", Default::Text(name_of(&TEES, DEFAULT_TEE))),
        (
            "score_order",
            Default::Text(name_of(&SCORE_ORDERS, DEFAULT_SCORE_ORDER)),
        ),
        (
            "on_save_error",
            Default::Text(name_of(&SAVE_ERROR_POLICIES, SaveErrorPolicy::default())),
        ),
        ("ray_strategy", Default::Text(RAY_STRATEGIES[0])),
        (
            "max_failures",
            Default::Count(FailurePolicy::default().max_failures),
        ),
    ]
}

impl SaveErrorPolicy {
    /// As a worker reads it from its environment: what the run was given,
    /// else the default (a worker started outside meshrun has no controller
    /// to tell, and `save` raises: see the Python layer).
    pub fn from_env(value: Option<&str>) -> Self {
        value
            .and_then(|v| by_name(&SAVE_ERROR_POLICIES, v))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_as_its_value_and_the_env_falls_back_to_the_default() {
        for (name, value) in SAVE_ERROR_POLICIES {
            assert_eq!(name_of(&SAVE_ERROR_POLICIES, value), name);
            assert_eq!(SaveErrorPolicy::from_env(Some(name)), value);
            assert_eq!(value.as_str(), name);
        }
        assert_eq!(SaveErrorPolicy::from_env(None), SaveErrorPolicy::Continue);
        assert_eq!(
            SaveErrorPolicy::from_env(Some("FAIL")),
            SaveErrorPolicy::Continue
        );
        assert_eq!(by_name(&TEES, "all"), Some(Tee::All));
        assert_eq!(by_name(&SCORE_ORDERS, "best"), None);
    }

    #[test]
    fn the_defaults_are_the_engines() {
        let d: std::collections::HashMap<_, _> = defaults().into_iter().collect();
        assert_eq!(d["on_save_error"], Default::Text("continue"));
        assert_eq!(d["max_failures"], Default::Count(0));
        assert_eq!(d["storage_path"], Default::Text("runs"));
    }
}
