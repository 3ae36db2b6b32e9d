//! The process limits a controller needs at scale.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises this process's soft limit on open files to its hard limit, and
/// gives the limit it ends with. A controller holds a connection per
/// worker and per host: 10,000 ranks on hosts of 8 are 11,250 descriptors
/// in one attempt, where many systems start processes at 1,024 (the hard
/// limit, often 524,288, is what may be asked for without privileges).
pub fn raise_open_files() -> Option<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = hard, "raised the open-file limit");
            Some(hard)
        }
        Err(e) => {
            tracing::debug!("cannot raise the open-file limit from {soft}: {e}");
            Some(soft)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let raised = raise_open_files().expect("a limit");
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(raised, soft);
        assert_eq!(soft, hard);
    }
}
