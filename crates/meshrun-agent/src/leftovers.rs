//! Ending what a worker leaves behind. However a worker ends (its program
//! returned, failed, or was stopped), the processes it started must not
//! outlive it. The agent keeps each worker contained in the strongest way
//! the machine allows:
//!
//! 1. a cgroup of its own ([`crate::cgroup`]): every descendant, whatever
//!    its process group or session;
//! 2. otherwise its process group, which it leads; and where the agent is
//!    a process of its own (`meshrun agent`: `--hosts H`, Ray), the agent
//!    is also the subreaper of its descendants, so an orphan that left the
//!    group (`setsid`) is re-parented to the agent, which knows it by the
//!    `MESHRUN_RANK` in its environment (the agent's warm spares are its
//!    children too, and are never taken for orphans). An agent that runs inside the
//!    controller's process (one host, perhaps the user's Python in
//!    `Trainer.fit()`) never becomes a subreaper: it would inherit, and
//!    have to reap, children that are not its own.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cgroup::{Hierarchy, WorkerCgroup};
use crate::process::{self, signal_group, signal_process};
use crate::worker_memory::{MemoryControl, WorkerMemory};
use crate::Spares;

/// How long killed leftovers get to disappear before their cgroup is left
/// for a later run to remove: SIGKILL takes effect at once, unless a
/// process is stuck in the kernel.
const GONE_WITHIN: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(10);

/// How this agent contains its workers, and the workers it has not reaped.
#[derive(Debug)]
pub struct Containment {
    cgroups: Option<Hierarchy>,
    /// How workers' memory is limited and counted.
    memory: MemoryControl,
    subreaper: bool,
    /// pid -> rank of every worker not yet reaped: the agent's own
    /// children, which only their `Child` handle may wait for.
    workers: Mutex<HashMap<u32, u32>>,
    /// The agent's warm spares: its children too, kept across attempts,
    /// never leftovers.
    spares: Option<Spares>,
}

/// What one worker is contained by.
#[derive(Debug, Clone)]
pub struct Contained {
    pub pid: u32,
    pub cgroup: Option<Arc<WorkerCgroup>>,
    pub memory: Option<Arc<WorkerMemory>>,
}

/// Processes a worker left behind, which have been ended.
#[derive(Debug)]
pub struct Ended {
    pub pids: Vec<u32>,
    pub how: &'static str,
}

impl Containment {
    /// Decides once per agent. `own_process`: the agent is a process of its
    /// own and may become a subreaper.
    pub fn detect(own_process: bool, spares: Option<Spares>) -> Self {
        let cgroups = match Hierarchy::detect() {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::debug!(
                    "workers are not put in cgroups ({e}); their process groups are ended instead"
                );
                None
            }
        };
        let memory = MemoryControl::detect(cgroups.as_ref().map(Hierarchy::base));
        tracing::debug!("workers' memory: {memory:?}");
        let subreaper = cgroups.is_none()
            && own_process
            && process::become_subreaper()
                .map_err(|e| tracing::debug!("cannot become a subreaper: {e}"))
                .is_ok();
        Containment {
            cgroups,
            memory,
            subreaper,
            workers: Mutex::new(HashMap::new()),
            spares,
        }
    }

    /// A cgroup for the next worker, when cgroups are in use.
    pub fn cgroup_for(&self, rank: u32) -> Option<WorkerCgroup> {
        let cgroups = self.cgroups.as_ref()?;
        cgroups
            .create(rank)
            .map_err(|e| tracing::warn!(rank, "worker not put in a cgroup: {e}"))
            .ok()
    }

    /// The memory of the next worker (in `cgroup`, its cgroup v2 if any),
    /// limited to `limit` bytes when given; why the limit cannot be set.
    pub fn memory_for(
        &self,
        rank: u32,
        limit: Option<u64>,
        cgroup: Option<&WorkerCgroup>,
    ) -> Result<WorkerMemory, String> {
        self.memory.for_worker(rank, limit, cgroup)
    }

    /// A worker was spawned: its pid is the agent's child until reaped.
    pub fn started(&self, pid: u32, rank: u32) {
        self.workers.lock().expect("workers lock").insert(pid, rank);
    }

    /// The worker's exit was collected: its pid may now be reused.
    pub fn reaped(&self, pid: u32) {
        self.workers.lock().expect("workers lock").remove(&pid);
    }

    /// Ends what `worker`, which has exited and been reaped, left running.
    pub async fn end(&self, worker: &Contained) -> Ended {
        if let Some(cgroup) = &worker.cgroup {
            let pids = cgroup.kill();
            remove_when_empty(cgroup).await;
            return Ended {
                pids,
                how: "cgroup",
            };
        }
        let mut ended: BTreeSet<u32> = process::group_members(worker.pid).into_iter().collect();
        signal_group(worker.pid, Signal::SIGKILL);
        if !self.subreaper {
            return Ended {
                pids: ended.into_iter().collect(),
                how: "process group",
            };
        }
        ended.extend(self.end_orphans(false).await);
        Ended {
            pids: ended.into_iter().collect(),
            how: "process group and subreaper",
        }
    }

    /// Waits until every worker spawned so far has been reaped, for at most
    /// `within`: a session's workers are gone before the next one starts.
    pub async fn reaped_all(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while !self.workers.lock().expect("workers lock").is_empty() {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    "workers still not reaped {} s after SIGKILL",
                    within.as_secs()
                );
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The agent is leaving: every worker and everything they started
    /// goes now, whether or not its exit was seen.
    pub async fn end_all(&self, live: &[Contained]) {
        for w in live {
            signal_group(w.pid, Signal::SIGKILL);
            if let Some(cgroup) = &w.cgroup {
                cgroup.kill();
            }
        }
        for w in live {
            if let Some(cgroup) = &w.cgroup {
                remove_when_empty(cgroup).await;
            }
            if let Some(memory) = &w.memory {
                memory_removed(memory).await;
            }
        }
        if self.subreaper {
            self.end_orphans(true).await;
        }
    }

    /// Kills the orphans re-parented to this agent that belong to no live
    /// worker (all of them with `all`), then their orphans in turn, and
    /// reaps every one. An orphan whose rank cannot be read is ended once
    /// no worker is live.
    async fn end_orphans(&self, all: bool) -> Vec<u32> {
        let me = std::process::id();
        let mut ended = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + GONE_WITHIN;
        loop {
            let workers = self.workers.lock().expect("workers lock").clone();
            let live_ranks: BTreeSet<u32> = workers.values().copied().collect();
            let mut waiting = false;
            for child in process::processes() {
                if child.ppid != me
                    || workers.contains_key(&child.pid)
                    || self.spares.as_ref().is_some_and(|s| s.holds(child.pid))
                {
                    continue;
                }
                if child.zombie || ended.contains(&child.pid) {
                    waiting |= !process::reap(child.pid);
                    continue;
                }
                let rank = process::start_env(child.pid, meshrun_protocol::env::RANK)
                    .and_then(|r| r.parse().ok());
                let orphaned =
                    all || rank.map_or(live_ranks.is_empty(), |r| !live_ranks.contains(&r));
                if orphaned {
                    signal_process(child.pid, Signal::SIGKILL);
                    ended.insert(child.pid);
                    waiting = true;
                }
            }
            if !waiting || tokio::time::Instant::now() >= deadline {
                return ended.into_iter().collect();
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

async fn remove_when_empty(cgroup: &WorkerCgroup) {
    let deadline = tokio::time::Instant::now() + GONE_WITHIN;
    while !cgroup.try_remove() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                cgroup = %cgroup.path().display(),
                "processes still in the cgroup after SIGKILL; it is left for a later run to remove"
            );
            return;
        }
        cgroup.kill();
        tokio::time::sleep(POLL).await;
    }
}

/// Removes a worker's v1 memory cgroup once its processes are gone (they
/// were killed with the worker's containment).
pub(crate) async fn memory_removed(memory: &WorkerMemory) {
    let deadline = tokio::time::Instant::now() + GONE_WITHIN;
    while !memory.remove() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("a worker's memory cgroup still holds processes; it is left for a later run to remove");
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}
