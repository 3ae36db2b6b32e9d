//! The run across its attempts, apart from I/O (the attempt's own
//! decisions are the [`crate::Machine`]'s): what each attempt starts with,
//! and what follows its end: another attempt while `--max-failures` allows
//! and a restart could end otherwise, a resize of an elastic run, or the
//! end of the run. The controller's supervisor only does what it is told
//! and words it.

use std::time::Duration;

use meshrun_plan::{ResumeFrom, RunPlan};
use meshrun_record::{Cause, FailureRecord};

use crate::OutcomeStatus;

/// What the run does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Another attempt.
    Restart,
    /// The run ends: the attempt did not fail, or the restarts are used up.
    End,
    /// The run ends with `unused` restarts left: the failure is one that a
    /// restart meets again (a folder or program missing on a host), and
    /// each would only cost a start-up and say the same.
    EndNow { unused: u32 },
}

/// The decision after an attempt that ended as `status` with `failure`,
/// when `failed_before` attempts failed before it.
pub fn after(
    status: OutcomeStatus,
    failure: Option<&FailureRecord>,
    failed_before: u32,
    max_failures: u32,
) -> Next {
    // A failed attempt without a failure lost its workers without a word:
    // nothing says what a restart would meet, and none is made.
    let Some(f) = failure.filter(|_| status == OutcomeStatus::Failed) else {
        return Next::End;
    };
    if failed_before >= max_failures {
        return Next::End;
    }
    if f.cause.restart_cannot_change() {
        return Next::EndNow {
            unused: max_failures - failed_before,
        };
    }
    Next::Restart
}

/// What the next attempt starts with, besides the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// Where the user asked to resume from: the first attempt only;
    /// restarts resume from the newest checkpoint that verifies.
    pub resume_from: Option<ResumeFrom>,
    /// How long the hosts may take to join.
    pub join_timeout: Duration,
    /// Elastic runs: the host count of the last attempt that launched.
    pub previous_hosts: Option<u32>,
    /// Elastic runs: the count to start with without waiting for more.
    pub expected_hosts: Option<u32>,
    /// Attempts of this invocation that failed before this one.
    pub failed_before: u32,
}

/// How an attempt ended, as the run needs it.
#[derive(Debug, Clone)]
pub struct Ended {
    pub status: OutcomeStatus,
    pub failure: Option<FailureRecord>,
    /// The newest memory checkpoint every host held at its end.
    pub memory_committed: Option<u64>,
    /// The host count it launched with, if it launched.
    pub hosts_launched: Option<u32>,
}

/// What follows an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum After {
    /// An elastic run stopped at a checkpoint to go on with `to` hosts: a
    /// planned stop that counts against nothing.
    Resize { from: u32, to: u32 },
    /// Another attempt after `failure`, the `failures`-th of the run.
    Restart {
        failure: FailureRecord,
        failures: u32,
    },
    /// The run ends as the attempt did.
    End { status: OutcomeStatus, next: Next },
}

/// The run's state across attempts.
#[derive(Debug)]
pub struct Run {
    max_failures: u32,
    hosts: u32,
    resume_from: Option<ResumeFrom>,
    join_timeout: Duration,
    /// An elastic run whose hosts join by themselves waits this long for
    /// them at a restart, then runs on those there (or ends, with fewer
    /// than MIN). Agents meshrun or Ray starts take the usual time.
    rejoin_timeout: Option<Duration>,
    made: u32,
    failed: Vec<FailureRecord>,
    memory_step: Option<u64>,
    previous_hosts: Option<u32>,
    expected_hosts: Option<u32>,
}

impl Run {
    pub fn new(plan: &RunPlan) -> Self {
        Self {
            max_failures: plan.failure.max_failures,
            hosts: plan.hosts,
            resume_from: plan.resume_from,
            join_timeout: plan.join_timeout(),
            rejoin_timeout: plan
                .elastic
                .as_ref()
                .filter(|_| plan.rendezvous)
                .map(meshrun_plan::Elastic::rejoin_timeout),
            made: 0,
            failed: Vec::new(),
            memory_step: None,
            previous_hosts: None,
            expected_hosts: None,
        }
    }

    /// What the next attempt starts with.
    pub fn start(&self) -> Start {
        Start {
            resume_from: self.resume_from.filter(|_| self.made == 0),
            join_timeout: match self.rejoin_timeout {
                Some(rejoin) if self.previous_hosts.is_some() => rejoin,
                _ => self.join_timeout,
            },
            previous_hosts: self.previous_hosts,
            expected_hosts: self.expected_hosts,
            failed_before: self.failed.len() as u32,
        }
    }

    /// The memory checkpoint to resume from when the newest durable one is
    /// `durable`: memory wins a tie, it is the faster read; an older one
    /// is not taken.
    pub fn memory_step(&self, durable: Option<u64>) -> Option<u64> {
        self.memory_step.filter(|m| durable.is_none_or(|d| *m >= d))
    }

    /// Whether another attempt follows one that ended so: joined hosts
    /// wait for it only then.
    pub fn goes_on(&self, status: OutcomeStatus, failure: Option<&FailureRecord>) -> bool {
        matches!(status, OutcomeStatus::Resized { .. })
            || after(status, failure, self.failed.len() as u32, self.max_failures) == Next::Restart
    }

    /// Takes an attempt's end and says what follows.
    pub fn ended(&mut self, end: Ended) -> After {
        self.made += 1;
        if let Some(m) = end.memory_committed {
            self.memory_step = Some(m);
        }
        if end.failure.as_ref().is_some_and(ran_a_stale_executable) {
            // Memory checkpoints are kept while a loaded executable is
            // still being checked; this attempt's may hold what a stale
            // one computed (and the older ones are released). Durable
            // saves wait for the check: the restart reads storage.
            self.memory_step = None;
        }
        if let Some(h) = end.hosts_launched {
            self.previous_hosts = Some(h);
        }
        if let OutcomeStatus::Resized { hosts } = end.status {
            self.expected_hosts = Some(hosts);
            return After::Resize {
                from: self.previous_hosts.unwrap_or(self.hosts),
                to: hosts,
            };
        }
        self.expected_hosts = self.previous_hosts;
        let next = after(
            end.status,
            end.failure.as_ref(),
            self.failed.len() as u32,
            self.max_failures,
        );
        if let Some(f) = &end.failure {
            self.failed.push(f.clone());
        }
        match (next, end.failure) {
            (Next::Restart, Some(failure)) => After::Restart {
                failure,
                failures: self.failed.len() as u32,
            },
            _ => After::End {
                status: end.status,
                next,
            },
        }
    }

    /// Every failure of the run so far, the last attempt's last.
    pub fn failures(&self) -> &[FailureRecord] {
        &self.failed
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.made
    }

    pub fn max_failures(&self) -> u32 {
        self.max_failures
    }
}

/// The attempt failed because an executable it loaded (`meshrun.jit`)
/// turned out not to be its program's: Python's
/// `meshrun.StaleExecutableError`, named in the binding's `errors.rs`.
fn ran_a_stale_executable(failure: &FailureRecord) -> bool {
    matches!(&failure.cause, Cause::Exception { exception, .. } if exception == "StaleExecutableError")
}

#[cfg(test)]
#[path = "tests_run.rs"]
mod tests;
