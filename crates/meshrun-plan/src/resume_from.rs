//! `--resume-from` / `RunConfig.resume_from`: where a run's first attempt
//! starts when the user says, rather than from the newest checkpoint that
//! verifies.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeFrom {
    /// This committed step; the newer ones are set aside.
    Step(u64),
    /// The beginning, whatever was committed: every checkpoint is set aside
    /// (renamed `superseded-step-N`, not deleted).
    Beginning,
}

/// What `--resume-from` accepts, for messages.
pub const ACCEPTED: &str =
    "a committed step (an integer, as `meshrun ckpt ls` lists them) or 'none' to start from the beginning";

impl std::str::FromStr for ResumeFrom {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(ResumeFrom::Beginning);
        }
        s.parse::<u64>()
            .map(ResumeFrom::Step)
            .map_err(|_| format!("--resume-from takes {ACCEPTED}, got '{s}'"))
    }
}

impl ResumeFrom {
    /// The step asked for, if one was.
    pub fn step(self) -> Option<u64> {
        match self {
            ResumeFrom::Step(s) => Some(s),
            ResumeFrom::Beginning => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_or_none_and_nothing_else() {
        assert_eq!("12".parse::<ResumeFrom>(), Ok(ResumeFrom::Step(12)));
        assert_eq!("none".parse::<ResumeFrom>(), Ok(ResumeFrom::Beginning));
        assert_eq!("None".parse::<ResumeFrom>(), Ok(ResumeFrom::Beginning));
        let err = "-1".parse::<ResumeFrom>().unwrap_err();
        assert!(err.contains("got '-1'") && err.contains("'none'"), "{err}");
    }
}
