//! Checkpoint commits and retention, off the driver's loop.
//!
//! Committing writes a manifest and renames a folder, and on object storage
//! goes over the network with retries of up to 15 s; retention lists and
//! deletes. Run inside the driver's `select!` loop, either would hold back
//! every heartbeat, log line and report meanwhile. So the driver hands the
//! jobs to a thread of their own, which runs them one after another in the
//! order given (a step is committed before a newer one, retention after
//! the commit that asked for it), and what became of each comes back to
//! the loop as an [`Outcome`], an input like any other.

use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use meshrun_ckpt::commit::{commit, set_aside};
use meshrun_ckpt::manifest::Manifest;
use meshrun_ckpt::resume::DAMAGED;
use meshrun_ckpt::store::Location;
use meshrun_ckpt::CkptError;
use tokio::sync::mpsc;

use super::checkpoints::{retain, Done, RetainJob};
use super::terminal::terminal;

/// A step every rank has written and reported, to commit.
#[derive(Debug)]
pub struct CommitJob {
    pub root: Location,
    pub manifest: Manifest,
    /// A damaged copy of the step is in the way: it is set aside first,
    /// for the user, rather than replaced.
    pub set_aside_damaged: bool,
}

impl CommitJob {
    pub(super) fn run(self) -> Done {
        let step = self.manifest.step;
        let committed = (|| {
            if self.set_aside_damaged {
                let to = set_aside(&self.root, step, DAMAGED)?;
                terminal().note(&format!(
                    "meshrun: damaged checkpoint step-{step} set aside as '{to}', so that step {step} saved again does not replace it"
                ));
            }
            commit(&self.root, &self.manifest)
        })();
        match committed {
            Ok(path) => Done::Committed { step, path },
            Err(error) => Done::Failed { step, error },
        }
    }
}

#[derive(Debug)]
pub enum Job {
    Commit(CommitJob),
    Retain(RetainJob),
}

/// What became of a [`Job`].
#[derive(Debug)]
pub enum Outcome {
    Commit(Done),
    Retained(Result<Vec<u64>, CkptError>),
}

/// The thread that runs the jobs, and the count of those not yet answered.
pub struct Committer {
    jobs: Option<std_mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    pending: usize,
}

impl Committer {
    /// Starts the thread; its outcomes arrive on the returned receiver.
    pub fn start() -> std::io::Result<(Self, mpsc::UnboundedReceiver<Outcome>)> {
        let (jobs, queue) = std_mpsc::channel::<Job>();
        let (outcomes, received) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("meshrun-commits".into())
            .spawn(move || {
                // Ends when the driver drops its sender, once every job
                // given before has run.
                for job in queue {
                    let outcome = match job {
                        Job::Commit(c) => Outcome::Commit(c.run()),
                        Job::Retain(r) => Outcome::Retained(retain(&r)),
                    };
                    if outcomes.send(outcome).is_err() {
                        break;
                    }
                }
            })?;
        let me = Self {
            jobs: Some(jobs),
            thread: Some(thread),
            pending: 0,
        };
        Ok((me, received))
    }

    pub fn submit(&mut self, job: Job) {
        if let Some(jobs) = &self.jobs {
            if jobs.send(job).is_ok() {
                self.pending += 1;
            }
        }
    }

    /// An outcome was taken from the receiver.
    pub fn answered(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }

    /// Every job given has been answered.
    pub fn idle(&self) -> bool {
        self.pending == 0
    }

    /// Lets the thread finish the jobs it has and waits for it: nothing of
    /// this attempt may still write into the checkpoints folder when the
    /// next attempt opens it (and removes what is uncommitted there).
    pub fn close(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.close();
    }
}
