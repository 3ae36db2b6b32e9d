//! What the machine knows of one rank.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use meshrun_record::memory::StateNeed;
use meshrun_record::{ExitInfo, Timing};

use super::Conn;

/// See [`RankState::drain_deadline`].
pub(super) const DRAIN_QUIET: Duration = Duration::from_secs(2);

#[derive(Default, Clone)]
pub(super) struct RankState {
    pub pid: Option<u32>,
    pub exit: Option<ExitInfo>,
    pub done: bool,
    pub stopped_by_meshrun: bool,
    /// The worker's connection, for requests (a checkpoint on preemption).
    pub conn: Option<Conn>,
    /// Its last report (or its start): what hang detection measures.
    pub progress: Option<Instant>,
    pub last_step: Option<u64>,
    /// The newest step it reported without saving it: a checkpoint of that
    /// step (or an earlier one) can no longer commit.
    pub unsaved_step: Option<u64>,
    /// Its last message of any kind; heartbeats come every second.
    pub heard: Option<Instant>,
    /// When its connection broke without a goodbye.
    pub connection_lost: Option<Instant>,
    /// Its latest goodput figures, and those sent with each save not yet
    /// superseded by a newer commit.
    pub timing: Option<Timing>,
    pub saved_timings: BTreeMap<u64, Timing>,
    /// How many reports it sent (recorded in `run.json`).
    pub reports: u64,
    /// How many of its reports it dropped unsent (`ReportsShed`).
    pub shed: u64,
    /// When its program finished (its goodbye came, or it exited 0), and
    /// its last step then: the others must follow it soon (see
    /// `FailurePolicy::finish_timeout_s`).
    pub finished: Option<(Instant, Option<u64>)>,
    /// It had finished before the attempt failed: the summary says so.
    pub finished_before_failure: bool,
    /// What its program's state needs per device, as it described it.
    pub need: Option<StateNeed>,
}

impl RankState {
    /// When everything the worker sent counts as read, for a done rank
    /// whose connection is still open: its exit (reported by the agent
    /// over another connection) can overtake its last reports, so a rank
    /// only counts as finished once its own connection has ended, or has
    /// been quiet for [`DRAIN_QUIET`] (a process it left behind may hold
    /// the socket open). A done rank without a connection, or never heard
    /// of, is drained already.
    pub fn drain_deadline(&self) -> Option<Instant> {
        if self.done && self.conn.is_some() {
            self.heard.map(|h| h + DRAIN_QUIET)
        } else {
            None
        }
    }

    /// Its program finished at `now`; `failed` when the attempt had
    /// already failed.
    pub fn finish(&mut self, now: Instant, failed: bool) {
        if self.finished.is_none() {
            self.finished = Some((now, self.last_step));
            self.finished_before_failure = !failed;
        }
    }

    /// Keeps the figures of the newest commit and later.
    pub fn forget_timings_before(&mut self, newest: u64) {
        let keep = self
            .saved_timings
            .range(..=newest)
            .next_back()
            .map(|(s, _)| *s);
        self.saved_timings.retain(|s, _| Some(*s) >= keep);
    }
}
