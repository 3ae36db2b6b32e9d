//! When a checkpoint step is complete: the ranks' parts, gathered.
//!
//! A sharded state is saved by every rank together (each writes the shards
//! it owns), so its step is complete when every rank has written. A folder
//! handed over with `Checkpoint.from_directory` (Ray Train's way) may come
//! from one rank or from several; its step is complete when every rank has
//! either written its folder or reported that step without one. So the
//! controller keeps each rank's newest reports, and decides here, without
//! I/O: [`Gather::written`] and [`Gather::reported`] return the steps that
//! became complete, or that can never be (a sharded state that some rank
//! did not pass at all: an error the user must hear about at once, since
//! the step would otherwise sit uncommitted without a word).

use std::collections::{BTreeMap, VecDeque};

use meshrun_record::manifest::FileRecord;
use meshrun_record::manifest::Leaf;

/// Reports remembered per rank: enough for the steps a save can still be
/// in flight for.
const REMEMBERED: usize = 32;

/// What one rank's report of a step said about a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    step: u64,
    /// It came with something to checkpoint.
    passed: bool,
    /// A save of it began (its `CheckpointWritten` follows, or went first).
    saving: bool,
}

/// A rank's part of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Shards(Vec<Leaf>),
    Files(Vec<FileRecord>),
}

#[derive(Debug, Default)]
struct Pending {
    parts: BTreeMap<u32, Part>,
    /// What each rank that has not written did at this step, once known.
    stances: BTreeMap<u32, Stance>,
    /// Rank 0's metrics and info, or the lowest writing rank's.
    extra: Option<(u32, serde_json::Value)>,
    /// Ranks below this had settled (a part, or nothing due) when last
    /// looked at: a step is decided once per arrival without a scan of
    /// every rank each time (at 10,000 ranks arriving in order, that was
    /// 5 x 10^7 lookups per checkpoint).
    settled_below: u32,
}

/// A step decided.
#[derive(Debug, PartialEq)]
pub enum Decided {
    /// Every rank has done its part: commit it.
    Complete {
        step: u64,
        leaves: Vec<Leaf>,
        files: Vec<FileRecord>,
        extra: Option<serde_json::Value>,
    },
    /// It can never be committed, for a reason the user must fix; `rank`
    /// is the first rank that passed a state.
    Refused { step: u64, rank: u32, error: String },
    /// It can never be committed, and that is expected (a preemption
    /// request that reached the ranks at different steps).
    Dropped { step: u64 },
}

pub struct Gather {
    world: u32,
    /// Each rank's newest reports: a rank may report a step before another
    /// rank's save of it is known here (they come on different
    /// connections), and then its report decides the step.
    seen: Vec<VecDeque<Seen>>,
    pending: BTreeMap<u64, Pending>,
}

/// What a rank that has not written a step did at that step.
/// Ordered from the most to the least passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stance {
    /// Its save began: its part is on the way.
    Saving,
    /// It passed a state but did not save it (the step was not due for it).
    NotDue,
    /// It passed nothing for that step (or reported past it without it).
    Nothing,
}

impl Seen {
    fn stance(self) -> Stance {
        match (self.passed, self.saving) {
            (_, true) => Stance::Saving,
            (false, false) => Stance::Nothing,
            (true, false) => Stance::NotDue,
        }
    }
}

impl Gather {
    pub fn new(world: u32) -> Self {
        Self {
            world,
            seen: vec![VecDeque::new(); world as usize],
            pending: BTreeMap::new(),
        }
    }

    /// Rank `rank` reported `step`.
    pub fn reported(&mut self, rank: u32, step: u64, passed: bool, saving: bool) -> Vec<Decided> {
        let Some(seen) = self.seen.get_mut(rank as usize) else {
            return Vec::new();
        };
        if seen.len() == REMEMBERED {
            seen.pop_front();
        }
        let this = Seen {
            step,
            passed,
            saving,
        };
        seen.push_back(this);
        if saving {
            self.open(step);
        }
        let steps: Vec<u64> = self.pending.range(..=step).map(|(s, _)| *s).collect();
        for s in &steps {
            let p = self.pending.get_mut(s).expect("listed");
            if !p.parts.contains_key(&rank) {
                // Past a step without a report of it: nothing from this rank.
                let stance = if *s == step {
                    this.stance()
                } else {
                    Stance::Nothing
                };
                let known = p.stances.entry(rank).or_insert(stance);
                *known = (*known).min(stance);
            }
        }
        steps.into_iter().filter_map(|s| self.decide(s)).collect()
    }

    /// Rank `rank` wrote its part of `step`.
    pub fn written(
        &mut self,
        rank: u32,
        step: u64,
        part: Part,
        extra: Option<serde_json::Value>,
    ) -> Vec<Decided> {
        self.open(step);
        let p = self.pending.get_mut(&step).expect("opened");
        if p.parts.contains_key(&rank) {
            return Vec::new();
        }
        p.parts.insert(rank, part);
        p.stances.remove(&rank);
        if let Some(e) = extra {
            if p.extra.as_ref().is_none_or(|(r, _)| rank < *r) {
                p.extra = Some((rank, e));
            }
        }
        self.decide(step).into_iter().collect()
    }

    /// Forgets `step` (its save failed on some rank: it never commits).
    pub fn abandon(&mut self, step: u64) {
        self.pending.remove(&step);
    }

    /// Starts gathering `step`, with what the ranks' remembered reports
    /// already say of it; from then on their reports say it at once.
    fn open(&mut self, step: u64) {
        if self.pending.contains_key(&step) {
            return;
        }
        let mut p = Pending::default();
        for (rank, seen) in (0u32..).zip(&self.seen) {
            // A step may be reported more than once (train, then eval
            // metrics): the report that passed the most tells.
            let stance = match seen
                .iter()
                .filter(|s| s.step == step)
                .map(|s| s.stance())
                .min()
            {
                Some(s) => Some(s),
                None => seen
                    .back()
                    .filter(|last| last.step > step)
                    .map(|_| Stance::Nothing),
            };
            if let Some(stance) = stance {
                p.stances.insert(rank, stance);
            }
        }
        self.pending.insert(step, p);
    }

    fn decide(&mut self, step: u64) -> Option<Decided> {
        let p = self.pending.get_mut(&step)?;
        if p.parts.is_empty() {
            return None;
        }
        // The cursor only spares work: the pass below still checks every
        // rank, once, when the cursor has reached the end.
        while p.settled_below < self.world {
            let rank = p.settled_below;
            let settled = p.parts.contains_key(&rank)
                || matches!(p.stances.get(&rank), Some(Stance::Nothing | Stance::NotDue));
            if !settled {
                return None;
            }
            p.settled_below += 1;
        }
        let directory = p.parts.values().any(|part| matches!(part, Part::Files(_)));
        let mut without = Vec::new();
        let mut not_due = false;
        for rank in 0..self.world {
            if p.parts.contains_key(&rank) {
                continue;
            }
            match p.stances.get(&rank) {
                None | Some(Stance::Saving) => return None,
                Some(Stance::Nothing) => without.push(rank),
                Some(Stance::NotDue) => not_due = true,
            }
        }
        let p = self.pending.remove(&step).expect("present");
        let first = *p.parts.keys().next().expect("a part");
        let of_kind = |files: bool| -> Vec<u32> {
            p.parts
                .iter()
                .filter(|(_, part)| matches!(part, Part::Files(_)) == files)
                .map(|(r, _)| *r)
                .collect()
        };
        let (dirs, states) = (of_kind(true), of_kind(false));
        if directory && !states.is_empty() {
            return Some(Decided::Refused {
                step,
                rank: first,
                error: format!(
                    "checkpoint step {step}: ranks {} passed a state (a pytree) to report(checkpoint=...) and ranks {} a folder (Checkpoint.from_directory); a step is one or the other",
                    ranks(states),
                    ranks(dirs),
                ),
            });
        }
        if !directory && !without.is_empty() {
            return Some(Decided::Refused {
                step,
                rank: first,
                error: format!(
                    "checkpoint step {step}: ranks {} passed a state (a pytree) to report(checkpoint=...), ranks {} did not; \
                     a sharded state is saved by every rank together (each writes the shards it owns), so pass it on every rank, \
                     or hand over a folder you wrote yourself with meshrun.Checkpoint.from_directory(path), which one rank may do alone",
                    ranks(states),
                    ranks(without),
                ),
            });
        }
        if !directory && not_due {
            return Some(Decided::Dropped { step });
        }
        let (mut leaves, mut files): (BTreeMap<String, Leaf>, Vec<FileRecord>) =
            (BTreeMap::new(), Vec::new());
        for part in p.parts.into_values() {
            match part {
                Part::Files(f) => files.extend(f),
                Part::Shards(ls) => {
                    for leaf in ls {
                        match leaves.get_mut(&leaf.path) {
                            Some(known) => known.shards.extend(leaf.shards),
                            None => {
                                leaves.insert(leaf.path.clone(), leaf);
                            }
                        }
                    }
                }
            }
        }
        Some(Decided::Complete {
            step,
            leaves: leaves.into_values().collect(),
            files,
            extra: p.extra.map(|(_, e)| e),
        })
    }
}

/// "0, 2-5, 7": ranks as a user reads them, however many.
pub fn ranks(ranks: impl IntoIterator<Item = u32>) -> String {
    let mut all: Vec<u32> = ranks.into_iter().collect();
    all.sort_unstable();
    all.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < all.len() {
        let start = all[i];
        while i + 1 < all.len() && all[i + 1] == all[i] + 1 {
            i += 1;
        }
        out.push(if all[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", all[i])
        });
        i += 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(name: &str) -> Part {
        Part::Files(vec![FileRecord {
            path: name.into(),
            size: 1,
            crc32c: 0,
        }])
    }

    fn shards() -> Part {
        Part::Shards(Vec::new())
    }

    fn complete(d: &[Decided]) -> Vec<u64> {
        d.iter()
            .filter_map(|d| match d {
                Decided::Complete { step, .. } => Some(*step),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn twenty_thousand_parts_in_rank_order_commit_once_without_a_scan_per_part() {
        const WORLD: u32 = 20_000;
        let mut g = Gather::new(WORLD);
        let started = std::time::Instant::now();
        for rank in 0..WORLD - 1 {
            assert!(g.written(rank, 3, shards(), None).is_empty(), "rank {rank}");
        }
        assert_eq!(complete(&g.written(WORLD - 1, 3, shards(), None)), vec![3]);
        // A scan of the ranks before each (2 x 10^8 lookups) took seconds.
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(1), "{took:?}");
    }

    #[test]
    fn a_folder_from_rank_0_alone_commits_once_the_others_report_the_step_in_either_order() {
        // The other rank's report first, then rank 0's folder.
        let mut g = Gather::new(2);
        assert!(g.reported(1, 5, false, false).is_empty());
        let d = g.written(0, 5, files("a"), Some(serde_json::json!({"m": 1})));
        assert_eq!(complete(&d), vec![5]);
        // Rank 0's folder first: waits for rank 1's report of the step.
        let mut g = Gather::new(2);
        assert!(g.reported(0, 6, true, true).is_empty());
        assert!(g.written(0, 6, files("a"), None).is_empty());
        assert_eq!(complete(&g.reported(1, 6, false, false)), vec![6]);
        // A rank that reported a later step (and never this one) has
        // nothing for it either.
        let mut g = Gather::new(2);
        assert!(g.written(0, 7, files("a"), None).is_empty());
        assert_eq!(complete(&g.reported(1, 8, false, false)), vec![7]);
    }

    #[test]
    fn folders_from_several_ranks_are_one_step_and_rank_0s_info_wins() {
        let mut g = Gather::new(3);
        g.reported(1, 2, true, true);
        assert!(g
            .written(1, 2, files("rank-1/x"), Some(serde_json::json!(1)))
            .is_empty());
        assert!(g
            .written(0, 2, files("x"), Some(serde_json::json!(0)))
            .is_empty());
        let d = g.reported(2, 2, false, false);
        let Decided::Complete { files, extra, .. } = &d[0] else {
            panic!("{d:?}")
        };
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["x", "rank-1/x"]);
        assert_eq!(extra, &Some(serde_json::json!(0)));
    }

    #[test]
    fn a_sharded_state_needs_every_rank_and_one_passed_by_rank_0_alone_is_refused_naming_the_ranks()
    {
        let mut g = Gather::new(2);
        g.reported(0, 3, true, true);
        assert!(g.written(0, 3, shards(), None).is_empty());
        assert_eq!(complete(&g.written(1, 3, shards(), None)), vec![3]);

        let mut g = Gather::new(4);
        for r in 1..4 {
            g.reported(r, 3, false, false);
        }
        let d = g.written(0, 3, shards(), None);
        let Decided::Refused { step, rank, error } = &d[0] else {
            panic!("{d:?}")
        };
        assert_eq!((*step, *rank), (3, 0));
        assert!(
            error.contains("ranks 0 passed") && error.contains("ranks 1-3 did not"),
            "{error}"
        );
    }

    #[test]
    fn a_state_passed_but_not_due_on_some_rank_is_dropped_quietly() {
        // A preemption request that reached rank 1 a step later.
        let mut g = Gather::new(2);
        g.reported(1, 4, true, false);
        assert_eq!(
            g.written(0, 4, shards(), None),
            vec![Decided::Dropped { step: 4 }]
        );
    }

    #[test]
    fn a_save_slower_than_many_steps_still_commits() {
        let mut g = Gather::new(2);
        g.reported(0, 3, true, true);
        g.reported(1, 3, true, true);
        for step in 4..100 {
            g.reported(0, step, true, false);
            g.reported(1, step, true, false);
        }
        assert!(g.written(1, 3, shards(), None).is_empty());
        assert_eq!(complete(&g.written(0, 3, shards(), None)), vec![3]);
    }

    #[test]
    fn ranks_are_grouped() {
        assert_eq!(ranks([0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(ranks([4]), "4");
    }
}
