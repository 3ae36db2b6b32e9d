//! Which checkpoint a worker resumes from: the step the controller chose
//! for its attempt, from storage or from the hosts' memory, or a newer one
//! the attempt committed since. One decision, made here from what the
//! worker's environment says (`meshrun_protocol::env`).

use meshrun_ckpt::commit::committed;
use meshrun_ckpt::resume::for_attempt;
use meshrun_ckpt::store::Location;
use meshrun_ckpt::CkptError;
use meshrun_protocol::env;

/// What the controller chose for this worker's attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub attempt: u32,
    /// `None`: the attempt starts from the beginning.
    pub step: Option<u64>,
    /// The host's memory tier, when the step is to be read from there.
    pub memory: Option<Location>,
}

impl Chosen {
    /// From the worker's environment, read through `var`; `None` when no
    /// controller started this process (it sets the resume step always).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let Some(step) = var(env::RESUME_STEP) else {
            return Ok(None);
        };
        let number = |name: &str, value: &str| {
            value.parse::<u64>().map_err(|_| {
                format!("{name} is '{value}': meshrun sets it to a number; it was changed after the start")
            })
        };
        let step = match step.as_str() {
            "none" => None,
            s => Some(number(env::RESUME_STEP, s)?),
        };
        let attempt = match var(env::ATTEMPT) {
            Some(a) => u32::try_from(number(env::ATTEMPT, &a)?)
                .map_err(|_| format!("{} is '{a}': out of range", env::ATTEMPT))?,
            None => 1,
        };
        let memory = match (var(env::RESUME_FROM).as_deref(), var(env::MEMORY_DIR)) {
            (Some("memory"), Some(dir)) if step.is_some() => Some(Location::Local(dir.into())),
            _ => None,
        };
        Ok(Some(Self {
            attempt,
            step,
            memory,
        }))
    }
}

/// The step to resume from and where it is, or `None`. Without a
/// controller's choice: the newest committed under `root` (the run's
/// checkpoints folder). With one: a step this attempt committed since
/// (newer than the choice) wins; else the chosen step, in memory when the
/// controller said so. Steps newer than the choice that the attempt did not
/// commit are those the controller skipped as damaged: never given out.
pub fn choice(
    root: &Location,
    chosen: Option<&Chosen>,
) -> Result<Option<(u64, Location)>, CkptError> {
    let Some(chosen) = chosen else {
        return Ok(committed(root)?.pop());
    };
    if let (Some(step), Some(memory)) = (chosen.step, &chosen.memory) {
        if let Some((newer, path)) = for_attempt(root, Some(step), chosen.attempt)? {
            if newer > step {
                return Ok(Some((newer, path)));
            }
        }
        return for_attempt(memory, Some(step), chosen.attempt);
    }
    for_attempt(root, chosen.step, chosen.attempt)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn chosen(vars: &[(&str, &str)]) -> Result<Option<Chosen>, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        Chosen::from_vars(|k| vars.get(k).cloned())
    }

    #[test]
    fn the_environment_says_what_the_controller_chose() {
        assert_eq!(chosen(&[]), Ok(None));
        assert_eq!(
            chosen(&[(env::RESUME_STEP, "none"), (env::ATTEMPT, "2")]),
            Ok(Some(Chosen {
                attempt: 2,
                step: None,
                memory: None
            }))
        );
        let from_memory = [
            (env::RESUME_STEP, "7"),
            (env::ATTEMPT, "3"),
            (env::RESUME_FROM, "memory"),
            (env::MEMORY_DIR, "/dev/shm/m"),
        ];
        assert_eq!(
            chosen(&from_memory),
            Ok(Some(Chosen {
                attempt: 3,
                step: Some(7),
                memory: Some(Location::Local("/dev/shm/m".into()))
            }))
        );
        // Memory without a step, or a memory folder without the word, is
        // storage.
        assert_eq!(
            chosen(&[(env::RESUME_STEP, "7"), (env::MEMORY_DIR, "/m")])
                .unwrap()
                .unwrap()
                .memory,
            None
        );
        let bad = chosen(&[(env::RESUME_STEP, "seven")]).unwrap_err();
        assert_eq!(
            bad,
            "MESHRUN_RESUME_STEP is 'seven': meshrun sets it to a number; it was changed after the start"
        );
    }
}
