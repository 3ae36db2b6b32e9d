//! The driver's part in each rank's memory: what the agents sample (host
//! memory) and the workers send (device memory) goes to `memory.jsonl`,
//! merged per rank; the newest of every rank goes into the attempt's end
//! event.

use std::collections::BTreeMap;

use meshrun_protocol::FromAgent;
use meshrun_record::memory::{MemoryEnd, MemoryRecord, RankMemory};
use meshrun_record::unix_time;

use super::driver::Driver;
use crate::error::CoreError;

/// The newest memory of each rank of the attempt.
#[derive(Debug, Default)]
pub struct MemoryUse {
    ranks: BTreeMap<u32, RankMemory>,
}

impl MemoryUse {
    /// Samples from an agent: their device figures are kept.
    pub fn host(&mut self, samples: Vec<RankMemory>) -> Vec<RankMemory> {
        samples
            .into_iter()
            .map(|m| {
                let entry = self.ranks.entry(m.rank).or_insert(m);
                let device = (entry.device_current, entry.device_peak);
                *entry = RankMemory {
                    device_current: device.0,
                    device_peak: device.1,
                    ..m
                };
                *entry
            })
            .collect()
    }

    /// A worker's device figures.
    pub fn device(&mut self, rank: u32, current: u64, peak: u64) -> RankMemory {
        let entry = self.ranks.entry(rank).or_insert(RankMemory {
            rank,
            ..RankMemory::default()
        });
        entry.device_current = Some(current);
        entry.device_peak = Some(peak);
        *entry
    }

    /// The rank exited: its agent's last reading of its peak is the last
    /// word (a sample may be two seconds old when the kernel ends it).
    pub fn exited(&mut self, rank: u32, end: &MemoryEnd) -> Option<RankMemory> {
        let entry = self.ranks.entry(rank).or_insert(RankMemory {
            rank,
            ..RankMemory::default()
        });
        if end.peak <= entry.peak && end.limit == entry.limit {
            return None;
        }
        entry.peak = entry.peak.max(end.peak);
        entry.limit = end.limit.or(entry.limit);
        Some(*entry)
    }

    /// Every rank's newest figures, in rank order.
    pub fn newest(&self) -> Vec<RankMemory> {
        self.ranks.values().copied().collect()
    }
}

impl Driver<'_> {
    /// `WorkerMemory` from the agent of `host`, about its own ranks only.
    pub(super) fn worker_memory(
        &mut self,
        host: u32,
        ranks: Vec<RankMemory>,
    ) -> Result<(), CoreError> {
        let pph = self.plan.procs_per_host;
        let own = ranks.into_iter().filter(|m| m.rank / pph == host).collect();
        let merged = self.memory.host(own);
        self.memory_line(merged)
    }

    pub(super) fn device_memory(
        &mut self,
        rank: u32,
        current: u64,
        peak: u64,
    ) -> Result<(), CoreError> {
        let merged = self.memory.device(rank, current, peak);
        self.memory_line(vec![merged])
    }

    /// An agent's message on its way to the machine: a worker's exit
    /// carries its peak.
    pub(super) fn memory_news(&mut self, msg: &FromAgent) -> Result<(), CoreError> {
        if let FromAgent::WorkerExited {
            rank,
            memory: Some(end),
            ..
        } = msg
        {
            if let Some(merged) = self.memory.exited(*rank, end) {
                return self.memory_line(vec![merged]);
            }
        }
        Ok(())
    }

    fn memory_line(&mut self, ranks: Vec<RankMemory>) -> Result<(), CoreError> {
        if ranks.is_empty() {
            return Ok(());
        }
        self.rundir.memory(&MemoryRecord {
            time: unix_time(),
            attempt: self.attempt,
            ranks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_device_figures_of_a_rank_are_merged() {
        let mut use_ = MemoryUse::default();
        let host = |current, peak| RankMemory {
            rank: 1,
            current,
            peak,
            limit: Some(1 << 30),
            ..RankMemory::default()
        };
        use_.host(vec![host(10, 20)]);
        let d = use_.device(1, 5, 7);
        assert_eq!(
            (d.current, d.device_current, d.device_peak),
            (10, Some(5), Some(7))
        );
        let h = use_.host(vec![host(12, 25)]);
        assert_eq!((h[0].current, h[0].device_peak), (12, Some(7)));
        let end = MemoryEnd {
            peak: 40,
            limit: Some(1 << 30),
            oom_killed: true,
        };
        assert_eq!(use_.exited(1, &end).map(|m| m.peak), Some(40));
        assert_eq!(use_.exited(1, &end), None, "nothing new the second time");
        assert_eq!(use_.newest().len(), 1);
    }
}
