//! A rank out of memory: killed by the kernel's out-of-memory killer (its
//! agent read its cgroup's count) or failing in XLA with
//! `RESOURCE_EXHAUSTED`. Either is worded with its limit, its peak, and
//! what its state needs per device (as its program described it), so the
//! summary says how far the rank was from fitting and what would fit.

use meshrun_record::failure::OomHow;
use meshrun_record::memory::MemoryEnd;
use meshrun_record::Cause;

use super::Machine;

/// Whether an exception's message is XLA's failed allocation: its status
/// code, as every backend writes it (`RESOURCE_EXHAUSTED: Out of memory
/// while trying to allocate ...`).
pub(crate) fn reads_as_out_of_memory(message: &str) -> bool {
    message.contains("RESOURCE_EXHAUSTED")
}

impl Machine {
    /// The cause of `rank`'s out-of-memory end, from what its agent read.
    pub(super) fn out_of_memory(&mut self, rank: u32, how: OomHow, memory: MemoryEnd) -> Cause {
        Cause::OutOfMemory {
            host: rank / self.plan.procs_per_host,
            how,
            limit: memory.limit.or(self.plan.memory_per_proc.map(|l| l.0)),
            peak: Some(memory.peak).filter(|p| *p > 0),
            need: self.ranks.update(rank, |state| state.need.clone()),
            message: String::new(),
            traceback: String::new(),
        }
    }

    /// The cause of `rank`'s failed allocation; its peak comes with its
    /// exit ([`Machine::memory_at_exit`]).
    pub(super) fn allocation_failed(
        &mut self,
        rank: u32,
        message: String,
        traceback: String,
    ) -> Cause {
        Cause::OutOfMemory {
            host: rank / self.plan.procs_per_host,
            how: OomHow::Allocation,
            limit: self.plan.memory_per_proc.map(|l| l.0),
            peak: None,
            need: self.ranks.update(rank, |state| state.need.clone()),
            message,
            traceback,
        }
    }

    /// `rank` exited: an out-of-memory failure of its own already recorded
    /// gets the peak its agent read.
    pub(super) fn memory_at_exit(&mut self, rank: u32, memory: MemoryEnd) {
        let Some(failure) = self.failure.as_mut().filter(|f| f.rank == rank) else {
            return;
        };
        if let Cause::OutOfMemory { peak, limit, .. } = &mut failure.cause {
            if peak.is_none() && memory.peak > 0 {
                *peak = Some(memory.peak);
            }
            if limit.is_none() {
                *limit = memory.limit;
            }
        }
    }
}
