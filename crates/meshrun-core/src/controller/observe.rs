//! The driver's part in seeing inside a run: arrival times from the agents
//! go to [`Stragglers`] and what it finds is recorded; profile captures are
//! started (by `meshrun profile`, `--profile-steps` or a straggler) and
//! their files received (see `profiles`).

use std::time::SystemTime;

use bytes::Bytes;
use meshrun_protocol::{ClientReply, FromWorker, ToWorker};
use meshrun_record::{unix_time, Event};
use tokio::sync::mpsc;

use super::driver::Driver;
use super::profiles::Saved;
use crate::error::CoreError;
use meshrun_machine::captures::{check_request, straggler_ranks};
use meshrun_machine::stragglers::Found;
use meshrun_machine::Conn;
use meshrun_machine::Outgoing;
use meshrun_plan::DEFAULT_PROFILE_STEPS;

impl Driver<'_> {
    /// `StepTimes` from an agent.
    pub(super) fn step_times(&mut self, mut times: Vec<(u32, u64, i64)>) -> Result<(), CoreError> {
        let now = unix_time();
        // An agent sends its ranks one after another; in step order, a
        // step completes before the pending ones crowd it out.
        times.sort_unstable_by_key(|&(rank, step, _)| (step, rank));
        for (rank, step, ns) in times {
            self.stragglers.arrived(rank, step, ns, self.attempt, now);
        }
        let (lines, found) = self.stragglers.take();
        for line in &lines {
            self.rundir.lag(line)?;
        }
        for f in found {
            self.straggler(&f)?;
        }
        Ok(())
    }

    fn straggler(&mut self, f: &Found) -> Result<(), CoreError> {
        let host = f.rank / self.plan.procs_per_host.max(1);
        tracing::warn!(
            rank = f.rank,
            "rank {} (host {host}) reaches its steps {:.0}% of a step later than the median rank ({:.1} ms behind the first, over {} steps)",
            f.rank,
            f.slower * 100.0,
            f.lag_ms,
            f.steps
        );
        self.rundir.event(Event::Straggler {
            attempt: self.attempt,
            rank: f.rank,
            host,
            slower: (f.slower * 1000.0).round() / 1000.0,
            lag_ms: f.lag_ms,
            median_lag_ms: f.median_lag_ms,
            step: f.step,
            steps: f.steps,
        })?;
        if self
            .captures
            .book_mut()
            .take_straggler(self.plan.observe.profile_stragglers)
        {
            let ranks = straggler_ranks(f.rank, self.machine.world(), self.plan.procs_per_host);
            let reason = format!("straggler rank {}", f.rank);
            self.start_capture(&ranks, DEFAULT_PROFILE_STEPS, None, &reason, None)?;
        }
        Ok(())
    }

    /// `meshrun profile`: starts a capture or says why not.
    pub(super) fn profile_requested(
        &mut self,
        conn: Conn,
        ranks: Option<Vec<u32>>,
        steps: u32,
        tx: mpsc::UnboundedSender<Bytes>,
    ) -> Result<(), CoreError> {
        self.conns.insert(conn, tx);
        let checked = check_request(
            self.machine.launched(),
            self.captures.busy().map(|d| d.display().to_string()),
            steps,
            ranks,
            self.machine.world(),
            |r| self.machine.worker_conn(r).is_some(),
        );
        let ranks = match checked {
            Ok(ranks) => ranks,
            Err(reason) => {
                self.send_to(conn, ClientReply::Declined { reason });
                return Ok(());
            }
        };
        self.start_capture(&ranks, steps, None, "asked", Some(conn))
            .map(drop)
    }

    /// `--profile-steps A:B`: the capture begins with the attempt's first
    /// worker and every worker is told as it connects.
    pub(super) fn worker_joined(&mut self, conn: Conn) -> Result<(), CoreError> {
        let Some((a, b)) = self.plan.observe.profile_steps else {
            return Ok(());
        };
        if !self.captures.book().launch_owed() {
            return Ok(());
        }
        if self.captures.book().launch().is_none() && self.captures.busy().is_none() {
            let ranks: Vec<u32> = (0..self.machine.world()).collect();
            let reason = format!("--profile-steps {a}:{b}");
            let name = self.start_capture(&ranks, 0, None, &reason, None)?;
            self.captures.book_mut().launched(&name);
        }
        if let Some(capture) = self.captures.book().launch().map(str::to_string) {
            self.send_to(
                conn,
                ToWorker::Profile {
                    capture,
                    steps: u32::try_from(b - a).unwrap_or(u32::MAX),
                    from_step: Some(a),
                },
            );
        }
        Ok(())
    }

    /// Starts a capture of `ranks` and tells them (`steps` 0: the caller
    /// tells them itself); returns its name.
    fn start_capture(
        &mut self,
        ranks: &[u32],
        steps: u32,
        from_step: Option<u64>,
        reason: &str,
        requester: Option<Conn>,
    ) -> Result<String, CoreError> {
        let (capture, dir) =
            self.captures
                .start(self.rundir.path(), SystemTime::now(), ranks, requester);
        let shown = dir.display().to_string();
        if let Some(conn) = requester {
            self.send_to(
                conn,
                ClientReply::ProfileAccepted {
                    dir: shown.clone(),
                    ranks: ranks.to_vec(),
                },
            );
        }
        self.rundir.event(Event::ProfileStarted {
            attempt: self.attempt,
            dir: shown,
            ranks: ranks.to_vec(),
            steps,
            reason: reason.to_string(),
        })?;
        if steps > 0 {
            for &rank in ranks {
                if let Some(conn) = self.machine.worker_conn(rank) {
                    let msg = ToWorker::Profile {
                        capture: capture.clone(),
                        steps,
                        from_step,
                    };
                    self.send_to(conn, msg);
                } else {
                    // Not connected (still starting, or already ended): it
                    // will not hear of the capture, so it is missing now
                    // rather than holding the capture open until the
                    // attempt ends.
                    let why = Some("it was not connected when the capture began".to_string());
                    if let Some(saved) = self.captures.rank_done(rank, &capture, why) {
                        self.saved(saved)?;
                    }
                }
            }
        }
        Ok(capture)
    }

    /// A worker's message about a capture; `false` when it is none.
    pub(super) fn profile_message(
        &mut self,
        rank: u32,
        msg: &FromWorker,
    ) -> Result<bool, CoreError> {
        match msg {
            FromWorker::ProfileFile {
                capture,
                name,
                size,
            } => self.captures.file(rank, capture, name, *size),
            FromWorker::Raw(data) => self.captures.bytes(rank, data),
            FromWorker::ProfileDone { capture, error } => {
                if let Some(saved) = self.captures.rank_done(rank, capture, error.clone()) {
                    self.saved(saved)?;
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The attempt is over: a capture still waiting for traces ends here.
    pub fn end_captures(&mut self) -> Result<(), CoreError> {
        if let Some(saved) = self
            .captures
            .give_up("the attempt ended before this rank sent its trace")
        {
            self.saved(saved)?;
        }
        Ok(())
    }

    fn saved(&mut self, saved: Saved) -> Result<(), CoreError> {
        let dir = saved.dir.display().to_string();
        self.rundir.event(Event::ProfileSaved {
            attempt: self.attempt,
            dir: dir.clone(),
            ranks: saved.ranks.clone(),
            missing: saved.missing.clone(),
        })?;
        if let Some(conn) = saved.requester {
            self.send_to(
                conn,
                ClientReply::ProfileSaved {
                    dir,
                    ranks: saved.ranks,
                    missing: saved.missing,
                },
            );
        }
        Ok(())
    }

    fn send_to(&self, conn: Conn, msg: impl Into<Outgoing>) {
        if let Some(tx) = self.conns.get(&conn) {
            let _ = tx.send(msg.into().encode());
        }
    }
}
