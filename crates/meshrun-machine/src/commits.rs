//! Checkpoint steps committed or given up: what is recorded, and what
//! every connected worker is told of each.

use std::time::Instant;

use meshrun_protocol::ToWorker;
use meshrun_record::Event;

use super::{Action, Conn, Machine};

impl Machine {
    pub(super) fn committed(&mut self, now: Instant, step: u64, path: &str) {
        self.record(Event::CheckpointCommitted {
            attempt: self.attempt(),
            step,
            path: path.to_string(),
        });
        let newest = self.last_committed.max(Some(step)).unwrap_or(step);
        self.last_committed = Some(newest);
        self.push(Action::Saving { step: None });
        self.tell_workers(&ToWorker::StepCommitted {
            step,
            path: path.to_string(),
        });
        self.ranks
            .update_all(|_, r| r.forget_timings_before(newest));
        if self.preempt_deadline.is_some() && self.stop.is_none() {
            let reason = self.saved_for_stop(step);
            self.begin_stop(now, reason);
        }
        self.push(Action::ApplyRetention);
    }

    /// Tells every connected worker that checkpoint `step` will never be
    /// committed, and why: a rank waiting for it (`meshrun.wait_committed`)
    /// raises that rather than waiting out its timeout.
    pub(super) fn not_committed(&mut self, step: u64, error: String) {
        self.tell_workers(&ToWorker::StepNotCommitted { step, error });
    }

    /// Sends `msg` to every connected worker.
    fn tell_workers(&mut self, msg: &ToWorker) {
        let conns: Vec<Conn> = self.ranks.iter().filter_map(|r| r.conn).collect();
        for conn in conns {
            self.send(conn, msg.clone());
        }
    }
}
