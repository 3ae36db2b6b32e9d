//! Profile captures, as decisions apart from I/O: whether one may start
//! (one at a time, since every rank traces the same steps; a straggler's
//! and `--profile-steps`' once per run), which ranks a straggler's takes,
//! which ranks are still owed their traces, and what a capture that ends
//! saved and missed. The driver names the capture's folder, writes the
//! files that arrive and tells whoever asked.

use std::collections::{BTreeMap, BTreeSet};

use crate::Conn;

/// A straggler's automatic capture takes every rank up to this many, else
/// the straggler's host and one rank of another for comparison.
pub const CAPTURE_ALL_UP_TO: u32 = 8;

/// The ranks a capture for straggler `rank` traces, in a world of `world`
/// ranks, `per_host` on each host.
pub fn straggler_ranks(rank: u32, world: u32, per_host: u32) -> Vec<u32> {
    if world <= CAPTURE_ALL_UP_TO {
        return (0..world).collect();
    }
    let pph = per_host.max(1);
    let host = rank / pph;
    let mut ranks: Vec<u32> = (host * pph..((host + 1) * pph).min(world)).collect();
    // And one rank of another host to compare with, where there is one.
    let other = if host == 0 { pph } else { 0 };
    if other < world {
        ranks.push(other);
    }
    ranks
}

/// What `meshrun profile` asked for, checked: the ranks to trace, in
/// order, or why not. `under_way` is the folder of a capture under way;
/// `connected` says whether a rank's worker is connected.
pub fn check_request(
    launched: bool,
    under_way: Option<String>,
    steps: u32,
    ranks: Option<Vec<u32>>,
    world: u32,
    connected: impl Fn(u32) -> bool,
) -> Result<Vec<u32>, String> {
    if !launched {
        return Err(
            "the run has not started its workers yet; try again once it trains".to_string(),
        );
    }
    if let Some(dir) = under_way {
        return Err(format!(
            "a capture is under way into {dir}; try again when it is saved"
        ));
    }
    if steps == 0 {
        return Err("--steps must be at least 1, got 0".to_string());
    }
    if ranks.as_ref().is_some_and(Vec::is_empty) {
        return Err(
            "--ranks names no rank; give ranks such as 0,3, or leave it out for every rank"
                .to_string(),
        );
    }
    if let Some(r) = ranks.iter().flatten().find(|&&r| r >= world) {
        return Err(format!(
            "--ranks names rank {r}, but this attempt has ranks 0 to {}",
            world - 1
        ));
    }
    let mut ranks = ranks.unwrap_or_else(|| (0..world).collect());
    ranks.sort_unstable();
    ranks.dedup();
    if !ranks.iter().any(|&r| connected(r)) {
        return Err("none of the chosen ranks' workers is connected (they connect as they start, and leave as they end); try again once the run trains".to_string());
    }
    Ok(ranks)
}

/// One capture under way.
#[derive(Debug)]
struct Active {
    name: String,
    ranks: BTreeSet<u32>,
    /// rank -> `None` when its trace came whole, else why not.
    done: BTreeMap<u32, Option<String>>,
    /// Who asked (`meshrun profile`), to be told when it is saved.
    requester: Option<Conn>,
}

/// A capture that ended: the ranks whose traces came whole, those missing
/// and why, and whom to tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub name: String,
    pub ranks: Vec<u32>,
    pub missing: Vec<(u32, String)>,
    pub requester: Option<Conn>,
}

/// The captures of a run.
#[derive(Debug, Default)]
pub struct Captures {
    active: Option<Active>,
    /// `--profile-stragglers` takes one capture per run.
    straggler_taken: bool,
    /// `--profile-steps`: the capture of this attempt, and whether one
    /// was saved (it is taken once per run).
    launch: Option<String>,
    launch_taken: bool,
}

impl Captures {
    /// The capture under way, by name.
    pub fn busy(&self) -> Option<&str> {
        self.active.as_ref().map(|c| c.name.as_str())
    }

    /// Whether `name` is the capture under way.
    pub fn is_active(&self, name: &str) -> bool {
        self.busy() == Some(name)
    }

    /// Begins capture `name` of `ranks`; false when one is under way.
    pub fn start(&mut self, name: &str, ranks: &[u32], requester: Option<Conn>) -> bool {
        if self.active.is_some() {
            return false;
        }
        self.active = Some(Active {
            name: name.to_string(),
            ranks: ranks.iter().copied().collect(),
            done: BTreeMap::new(),
            requester,
        });
        true
    }

    /// Whether a straggler's capture is to be taken now (`enabled`:
    /// `--profile-stragglers`); taking it spends the run's one.
    pub fn take_straggler(&mut self, enabled: bool) -> bool {
        if !enabled || self.straggler_taken || self.active.is_some() {
            return false;
        }
        self.straggler_taken = true;
        true
    }

    /// `--profile-steps`: whether this run still owes its capture (none
    /// was saved in an earlier attempt).
    pub fn launch_owed(&self) -> bool {
        !self.launch_taken
    }

    /// The `--profile-steps` capture of this attempt is `name`.
    pub fn launched(&mut self, name: &str) {
        self.launch = Some(name.to_string());
    }

    /// The `--profile-steps` capture this attempt started, if any.
    pub fn launch(&self) -> Option<&str> {
        self.launch.as_deref()
    }

    /// `rank` sent all it had of capture `name`, whole or not (`error`);
    /// the capture ends with the last of its ranks.
    pub fn rank_done(&mut self, rank: u32, name: &str, error: Option<String>) -> Option<Ended> {
        let c = self.active.as_mut().filter(|c| c.name == name)?;
        if !c.ranks.contains(&rank) {
            return None;
        }
        c.done.insert(rank, error);
        if c.done.len() < c.ranks.len() {
            return None;
        }
        self.finish(None)
    }

    /// The attempt is ending: ranks that have not sent their trace never
    /// will (`why`).
    pub fn give_up(&mut self, why: &str) -> Option<Ended> {
        self.active.as_ref()?;
        self.finish(Some(why))
    }

    fn finish(&mut self, why_missing: Option<&str>) -> Option<Ended> {
        let c = self.active.take()?;
        let mut ranks = Vec::new();
        let mut missing = Vec::new();
        for &rank in &c.ranks {
            match c.done.get(&rank) {
                Some(None) => ranks.push(rank),
                Some(Some(e)) => missing.push((rank, e.clone())),
                None => missing.push((rank, why_missing.unwrap_or("it sent no trace").to_string())),
            }
        }
        // A `--profile-steps` capture is taken once per run: once saved
        // with a trace, later attempts take none.
        if self.launch.as_deref() == Some(c.name.as_str()) {
            self.launch = None;
            self.launch_taken |= !ranks.is_empty();
        }
        Some(Ended {
            name: c.name,
            ranks,
            missing,
            requester: c.requester,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_ends_with_its_last_rank_and_names_the_missing_with_why() {
        let mut c = Captures::default();
        assert!(c.start("c1", &[0, 1, 2], Some(7)));
        assert!(!c.start("c2", &[0], None), "one at a time");
        assert_eq!(c.rank_done(0, "c1", None), None);
        assert_eq!(c.rank_done(5, "c1", None), None, "not one of its ranks");
        assert_eq!(c.rank_done(1, "old", None), None, "another capture's");
        assert_eq!(c.rank_done(1, "c1", Some("it failed".into())), None);
        assert_eq!(
            c.rank_done(2, "c1", None),
            Some(Ended {
                name: "c1".into(),
                ranks: vec![0, 2],
                missing: vec![(1, "it failed".into())],
                requester: Some(7),
            })
        );
        assert_eq!(c.busy(), None);
    }

    #[test]
    fn an_attempt_that_ends_gives_up_on_the_ranks_still_owed() {
        let mut c = Captures::default();
        assert_eq!(c.give_up("the attempt ended"), None, "none under way");
        c.start("c1", &[0, 1], None);
        assert_eq!(c.rank_done(1, "c1", None), None);
        let ended = c.give_up("the attempt ended").unwrap();
        assert_eq!(ended.ranks, vec![1]);
        assert_eq!(ended.missing, vec![(0, "the attempt ended".into())]);
    }

    #[test]
    fn a_straggler_takes_one_capture_per_run_and_never_over_another() {
        let mut c = Captures::default();
        assert!(!c.take_straggler(false), "not asked for");
        c.start("asked", &[0], None);
        assert!(!c.take_straggler(true), "one under way");
        c.rank_done(0, "asked", None);
        assert!(c.take_straggler(true));
        assert!(!c.take_straggler(true), "once per run");
    }

    #[test]
    fn the_profile_steps_capture_is_owed_until_one_saves_a_trace() {
        let mut c = Captures::default();
        assert!(c.launch_owed());
        c.start("p1", &[0], None);
        c.launched("p1");
        assert_eq!(c.launch(), Some("p1"));
        let ended = c.give_up("the attempt ended").unwrap();
        assert!(ended.ranks.is_empty());
        assert!(
            c.launch_owed(),
            "nothing was saved: the next attempt takes it"
        );
        c.start("p2", &[0], None);
        c.launched("p2");
        c.rank_done(0, "p2", None);
        assert!(!c.launch_owed());
        assert_eq!(c.launch(), None);
    }

    #[test]
    fn a_request_is_checked_in_order_and_its_ranks_sorted_once() {
        let all = |_: u32| true;
        let check = |launched, busy: Option<&str>, steps, ranks: Option<Vec<u32>>| {
            check_request(launched, busy.map(str::to_string), steps, ranks, 4, all)
        };
        assert!(check(false, None, 3, None)
            .unwrap_err()
            .contains("not started"));
        assert!(check(true, Some("runs/r/profiles/x"), 3, None)
            .unwrap_err()
            .contains("under way into runs/r/profiles/x"));
        assert_eq!(
            check(true, None, 0, None).unwrap_err(),
            "--steps must be at least 1, got 0"
        );
        assert!(check(true, None, 3, Some(vec![]))
            .unwrap_err()
            .contains("names no rank"));
        assert_eq!(
            check(true, None, 3, Some(vec![1, 4])).unwrap_err(),
            "--ranks names rank 4, but this attempt has ranks 0 to 3"
        );
        assert_eq!(check(true, None, 3, Some(vec![3, 1, 3])), Ok(vec![1, 3]));
        assert_eq!(check(true, None, 3, None), Ok(vec![0, 1, 2, 3]));
        let none = check_request(true, None, 3, Some(vec![2]), 4, |r| r != 2);
        assert!(none.unwrap_err().contains("none of the chosen ranks"));
    }

    #[test]
    fn a_stragglers_capture_takes_every_rank_of_a_small_run_else_its_host_and_one_more() {
        assert_eq!(straggler_ranks(3, 4, 2), vec![0, 1, 2, 3]);
        assert_eq!(straggler_ranks(5, 16, 4), vec![4, 5, 6, 7, 0]);
        assert_eq!(straggler_ranks(1, 16, 4), vec![0, 1, 2, 3, 4]);
        // One host only: nothing else to compare with.
        assert_eq!(straggler_ranks(2, 12, 12), (0..12).collect::<Vec<_>>());
    }
}
