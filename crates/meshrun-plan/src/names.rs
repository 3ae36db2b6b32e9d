//! What runs and modules may be called: a run's name becomes a folder and a
//! command-line argument; `-m` takes a dotted Python module name.

use crate::error::UsageError;

#[cfg(feature = "validate")]
pub(super) fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && chars.all(|c| c.is_alphanumeric() || c == '_')
        })
}

/// Run names become folder names and command-line arguments: a safe,
/// portable alphabet, no leading '.' (hidden, or `..`), no leading '-' (it
/// would read as an option to `status`, `logs` ...), and no `..` anywhere,
/// so the rule is the one the message states. `run` and every command that
/// takes a run's name check it the same way.
pub fn check_run_name(name: &str) -> Result<(), UsageError> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with(['.', '-'])
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(UsageError::BadRunName(name.to_string()))
    }
}

#[cfg(feature = "validate")]
pub(super) fn default_run_name() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut suffix = [0u8; 2];
    // A clash within one second is possible without the suffix.
    getrandom::fill(&mut suffix).unwrap_or_default();
    format!(
        "run-{}-{}",
        meshrun_record::utc_compact(now.as_secs()),
        hex::encode(suffix)
    )
}
