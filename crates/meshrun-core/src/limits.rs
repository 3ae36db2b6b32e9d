//! The process limits a controller needs at scale.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises this process's soft limit on open files to its hard limit, and
/// gives the limit it ends with. A controller holds a connection per
/// worker and per host: 10,000 ranks on hosts of 8 are 11,250 descriptors
/// in one attempt, where many systems start processes at 1,024 (the hard
/// limit, often 524,288, is what may be asked for without privileges).
pub fn raise_open_files() -> Option<u64> {
    raise_open_files_to(u64::MAX)
}

/// Raises this process's soft limit on open files to `needed`, or as near
/// as the hard limit allows, and gives the limit it ends with. Only as far
/// as needed: the agents and workers it starts inherit the limit, and a
/// run that fits in the limit it found changes nothing.
pub fn raise_open_files_to(needed: u64) -> Option<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let want = soft_limit_for(soft, hard, needed);
    if want == soft {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, want, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = want, "raised the open-file limit");
            Some(want)
        }
        Err(e) => {
            tracing::debug!("cannot raise the open-file limit from {soft}: {e}");
            Some(soft)
        }
    }
}

/// The soft limit to ask for: the one there is when it is enough, else
/// `needed`, at most the hard limit.
fn soft_limit_for(soft: u64, hard: u64, needed: u64) -> u64 {
    if needed <= soft {
        soft
    } else {
        needed.min(hard).max(soft)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_only_as_far_as_needed() {
        assert_eq!(soft_limit_for(1_024, 524_288, 610), 1_024, "enough already");
        assert_eq!(soft_limit_for(1_024, 524_288, 11_874), 11_874);
        assert_eq!(
            soft_limit_for(1_024, 4_096, 11_874),
            4_096,
            "at most the hard limit"
        );
        assert_eq!(soft_limit_for(1_024, 524_288, u64::MAX), 524_288);
    }

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let raised = raise_open_files().expect("a limit");
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(raised, soft);
        assert_eq!(soft, hard);
    }
}
