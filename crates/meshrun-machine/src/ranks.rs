//! Every rank's state, and the ranks ordered by each deadline that counts
//! from one of their instants, so that [`super::Machine::poll_timeout`]
//! (asked on every turn of the driver's loop, after every message) reads
//! the earliest of each kind without visiting every rank: at 10,000 ranks
//! a walk over all of them took about 120 µs, where the machine handles a
//! heartbeat in well under one.
//! The orders are kept as `quinn-proto` keeps its timers, but per rank:
//! an ordered set of (instant, rank) per kind.
//!
//! The states are read as a slice; every change goes through
//! [`Ranks::update`], which moves the rank between the orders its change
//! affects, so the orders cannot drift from the states.

use std::collections::BTreeSet;
use std::ops::Deref;
use std::time::Instant;

use super::rank::{RankState, DRAIN_QUIET};

pub(super) struct Ranks {
    all: Vec<RankState>,
    /// Live ranks (not done) with their connection whole: when each was
    /// last heard of (the heartbeat deadline).
    heard: BTreeSet<(Instant, u32)>,
    /// Live ranks whose connection broke: when (the connection loss grace).
    lost: BTreeSet<(Instant, u32)>,
    /// Live ranks: their last report (the hang deadline).
    progress: BTreeSet<(Instant, u32)>,
    /// Live ranks whose program has not finished: their last report, `None`
    /// (first) for one that never reported (the finish deadline).
    running: BTreeSet<(Option<Instant>, u32)>,
    /// Live ranks whose program finished: when (the finish deadline
    /// counts from the first).
    finished: BTreeSet<(Instant, u32)>,
    /// Done ranks whose connection is still open: when each was last heard
    /// of (the drain deadline).
    draining: BTreeSet<(Instant, u32)>,
    /// Ranks not done.
    live: usize,
    /// Ranks that sent a report.
    reported: usize,
    /// How often the states were read (see `tests_timers.rs`).
    #[cfg(test)]
    reads: std::cell::Cell<u64>,
}

/// Where one rank stands in each order; `None`: not in it.
#[derive(Clone, Copy, PartialEq)]
struct Keys {
    heard: Option<Instant>,
    lost: Option<Instant>,
    progress: Option<Instant>,
    /// Live and its program not finished (ordered by `progress`).
    running: bool,
    finished: Option<Instant>,
    draining: Option<Instant>,
    live: bool,
    reported: bool,
}

impl Keys {
    fn of(r: &RankState) -> Self {
        let live = !r.done;
        Self {
            heard: r.heard.filter(|_| live && r.connection_lost.is_none()),
            lost: r.connection_lost.filter(|_| live),
            progress: r.progress.filter(|_| live),
            running: live && r.finished.is_none(),
            finished: r.finished.map(|(t, _)| t).filter(|_| live),
            draining: r.heard.filter(|_| r.done && r.conn.is_some()),
            live,
            reported: r.reports > 0,
        }
    }
}

/// Moves `rank` in `set` from `old` to `new`.
fn reorder<K: Ord + Copy>(set: &mut BTreeSet<(K, u32)>, rank: u32, old: Option<K>, new: Option<K>) {
    if old == new {
        return;
    }
    if let Some(k) = old {
        set.remove(&(k, rank));
    }
    if let Some(k) = new {
        set.insert((k, rank));
    }
}

impl Ranks {
    pub fn new(n: u32) -> Self {
        let mut ranks = Self {
            all: vec![RankState::default(); n as usize],
            heard: BTreeSet::new(),
            lost: BTreeSet::new(),
            progress: BTreeSet::new(),
            running: BTreeSet::new(),
            finished: BTreeSet::new(),
            draining: BTreeSet::new(),
            live: 0,
            reported: 0,
            #[cfg(test)]
            reads: std::cell::Cell::new(0),
        };
        ranks.rebuild();
        ranks
    }

    /// Changes rank `rank`'s state (which must exist) with `f`, and its
    /// place in the orders with it.
    pub fn update<T>(&mut self, rank: u32, f: impl FnOnce(&mut RankState) -> T) -> T {
        let state = &mut self.all[rank as usize];
        let old = Keys::of(state);
        let out = f(state);
        let new = Keys::of(state);
        if old != new {
            reorder(&mut self.heard, rank, old.heard, new.heard);
            reorder(&mut self.lost, rank, old.lost, new.lost);
            reorder(&mut self.progress, rank, old.progress, new.progress);
            let running = |k: Keys| k.running.then_some(k.progress);
            reorder(&mut self.running, rank, running(old), running(new));
            reorder(&mut self.finished, rank, old.finished, new.finished);
            reorder(&mut self.draining, rank, old.draining, new.draining);
            self.live = self.live + usize::from(new.live) - usize::from(old.live);
            self.reported = self.reported + usize::from(new.reported) - usize::from(old.reported);
        }
        out
    }

    /// Changes every rank with `f` (given the rank and its state), and
    /// builds the orders afresh: when every rank moves (rank 0's steps
    /// taken as every rank's, with a metrics file), sorting them all at
    /// once costs far less than moving each rank in turn.
    pub fn update_all(&mut self, mut f: impl FnMut(u32, &mut RankState)) {
        for (rank, state) in (0..).zip(&mut self.all) {
            f(rank, state);
        }
        self.rebuild();
    }

    /// The orders and counts, from the states alone.
    fn rebuild(&mut self) {
        fn order<K: Ord>(keys: &[Keys], key: fn(&Keys) -> Option<K>) -> BTreeSet<(K, u32)> {
            (0..)
                .zip(keys)
                .filter_map(|(rank, k)| Some((key(k)?, rank)))
                .collect()
        }
        let keys: Vec<Keys> = self.all.iter().map(Keys::of).collect();
        self.heard = order(&keys, |k| k.heard);
        self.lost = order(&keys, |k| k.lost);
        self.progress = order(&keys, |k| k.progress);
        self.running = order(&keys, |k| k.running.then_some(k.progress));
        self.finished = order(&keys, |k| k.finished);
        self.draining = order(&keys, |k| k.draining);
        self.live = keys.iter().filter(|k| k.live).count();
        self.reported = keys.iter().filter(|k| k.reported).count();
    }

    /// The earliest last message of a live rank whose connection is whole.
    pub fn earliest_heard(&self) -> Option<Instant> {
        self.heard.first().map(|&(t, _)| t)
    }

    /// The earliest connection loss of a live rank.
    pub fn earliest_lost(&self) -> Option<Instant> {
        self.lost.first().map(|&(t, _)| t)
    }

    /// The earliest last report of a live rank.
    pub fn earliest_progress(&self) -> Option<Instant> {
        self.progress.first().map(|&(t, _)| t)
    }

    /// While a live rank has finished its program, when the earliest
    /// finish deadline of the ranks still running counts from: each counts
    /// from the later of the first finish and its own last report (none:
    /// the first finish), so the one that reported least recently decides.
    pub fn finish_since(&self) -> Option<Instant> {
        let &(first, _) = self.finished.first()?;
        let &(stalest, _) = self.running.first()?;
        Some(stalest.map_or(first, |p| p.max(first)))
    }

    /// When the first done rank whose connection is still open turns
    /// drained by its quiet alone.
    pub fn drain_deadline(&self) -> Option<Instant> {
        self.draining.first().map(|&(t, _)| t + DRAIN_QUIET)
    }

    /// Every rank is done and everything it sent has been read (see
    /// [`RankState::drain_deadline`]: of the done ranks whose connection is
    /// still open, the one heard of last decides).
    pub fn all_ended(&self, now: Instant) -> bool {
        self.live == 0
            && self
                .draining
                .last()
                .is_none_or(|&(h, _)| now >= h + DRAIN_QUIET)
    }

    /// Whether any rank has sent a report.
    pub fn any_reported(&self) -> bool {
        self.reported > 0
    }

    #[cfg(test)]
    pub fn reads(&self) -> u64 {
        self.reads.get()
    }

    /// The orders, built afresh from the states, equal those kept.
    #[cfg(test)]
    pub fn assert_consistent(&self) {
        let mut fresh = Self::new(0);
        fresh.all = self.all.clone();
        fresh.rebuild();
        assert_eq!(fresh.heard, self.heard, "heard");
        assert_eq!(fresh.lost, self.lost, "lost");
        assert_eq!(fresh.progress, self.progress, "progress");
        assert_eq!(fresh.running, self.running, "running");
        assert_eq!(fresh.finished, self.finished, "finished");
        assert_eq!(fresh.draining, self.draining, "draining");
        assert_eq!((fresh.live, fresh.reported), (self.live, self.reported));
    }
}

/// Read access, as to the states alone: a change must go through
/// [`Ranks::update`].
impl Deref for Ranks {
    type Target = [RankState];

    fn deref(&self) -> &[RankState] {
        #[cfg(test)]
        self.reads.set(self.reads.get() + 1);
        &self.all
    }
}
