//! The memory tier's decisions: which host keeps whose replica, whether a
//! restart restores from memory, and when a memory checkpoint is
//! committed.
//!
//! A memory checkpoint of `step` is committed when every rank has written
//! its shards into its host's memory, every host has committed its part
//! (its own manifest, listing its own ranks' shards: each rank writes
//! every region it holds, so a host restores from its own files alone)
//! and, with more than one host, every buddy holds the replica. Before a
//! launch that could restore a newer step from memory than from storage,
//! every host is asked to make it whole (its own copy, else the buddy's
//! replica fetched back); if one cannot, the attempt resumes from storage.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use meshrun_protocol::ToAgent;
use meshrun_record::manifest::{Leaf, Manifest, FORMAT_VERSION};
use meshrun_record::Event;
use serde_json::Value;

use super::Machine;

/// How long the preparation may go without a word from any host before
/// the attempt gives memory up and resumes from storage. A host answers
/// once its copy is whole; fetching a replica back is bounded by the
/// agents' own peer timeout (30 s without a byte), so a host silent
/// longer than two of those has lost its way, and waiting out the join
/// timeout for it would only hide why.
pub const MEMORY_PREPARE_TIMEOUT: Duration = Duration::from_secs(75);

/// Every rank's leaves of one step, and rank 0's extra.
type Gathered = (BTreeMap<u32, Vec<Leaf>>, Option<Value>);

/// What this attempt restores.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Restore {
    #[default]
    Undecided,
    Storage,
    Memory(u64),
}

#[derive(Debug, Default)]
pub(super) struct MemoryTier {
    buddies_sent: bool,
    /// The hosts asked to make the step whole, each session once: a host
    /// whose connection broke before the launch is asked again when it
    /// joins again (its old session's answer is lost with it).
    asked: BTreeSet<u32>,
    /// Host -> where its copy came from, or why it could not be had.
    prepared: BTreeMap<u32, Result<String, String>>,
    /// When a host was last asked or last answered: the preparation's
    /// deadline counts from here.
    heard: Option<Instant>,
    decided: Restore,
    /// Step -> what its ranks wrote so far.
    written: BTreeMap<u64, Gathered>,
    /// Step -> host -> its bytes, as hosts say they hold it.
    held: BTreeMap<u64, BTreeMap<u32, (u64, bool)>>,
    committed: Option<u64>,
}

/// The buddy of `host`: the next host, round the ring.
pub fn buddy_of(host: u32, hosts: u32) -> Option<u32> {
    (hosts > 1).then(|| (host + 1) % hosts)
}

impl Machine {
    /// Whether the launch may go ahead as far as memory is concerned;
    /// first tells each agent its buddy and, when a memory checkpoint may
    /// be restored, asks every host to make it whole.
    pub(super) fn memory_ready(&mut self, now: Instant) -> bool {
        if !self.memory.buddies_sent {
            self.memory.buddies_sent = true;
            let hosts = self.plan.hosts;
            let mut sends = Vec::new();
            for (&host, link) in &self.agents {
                let Some(b) = buddy_of(host, hosts) else {
                    continue;
                };
                let Some(peer) = self.agents.get(&b) else {
                    continue;
                };
                if let Some(port) = peer.replica_port {
                    let addr = std::net::SocketAddr::new(
                        peer.ip.parse().unwrap_or([127, 0, 0, 1].into()),
                        port,
                    );
                    sends.push((
                        link.conn,
                        ToAgent::Buddy {
                            host: b,
                            addr: addr.to_string(),
                        },
                    ));
                }
            }
            for (conn, msg) in sends {
                self.send(conn, msg);
            }
        }
        if self.memory.decided != Restore::Undecided {
            return true;
        }
        let Some(step) = self.setup.memory_step else {
            self.memory.decided = Restore::Storage;
            return true;
        };
        let unasked: Vec<(u32, super::Conn)> = self
            .agents
            .iter()
            .filter(|(h, _)| !self.memory.asked.contains(h))
            .map(|(&h, link)| (h, link.conn))
            .collect();
        for (host, conn) in unasked {
            self.memory.asked.insert(host);
            self.memory.heard = Some(now);
            self.send(
                conn,
                ToAgent::MemoryPrepare {
                    run_id: self.setup.run_id.clone(),
                    step,
                },
            );
        }
        false
    }

    /// A joined host left before the launch: what its session said is
    /// gone with it. Its answer is forgotten and it will be asked again;
    /// every host is told its buddy again, since the host's new session
    /// serves replicas on a new port.
    pub(super) fn memory_host_left(&mut self, host: u32) {
        self.memory.buddies_sent = false;
        if self.memory.decided == Restore::Undecided {
            self.memory.asked.remove(&host);
            self.memory.prepared.remove(&host);
        }
    }

    /// The step this attempt's workers restore, and whether from memory.
    pub(super) fn restore_choice(&self) -> (Option<u64>, bool) {
        match self.memory.decided {
            Restore::Memory(step) => (Some(step), true),
            Restore::Undecided | Restore::Storage => (self.setup.resume_step, false),
        }
    }

    /// A host answered [`ToAgent::MemoryPrepare`].
    pub(super) fn memory_prepared(
        &mut self,
        now: Instant,
        host: u32,
        step: u64,
        source: Option<String>,
        why: Option<String>,
    ) {
        if self.setup.memory_step != Some(step) || self.memory.decided != Restore::Undecided {
            return;
        }
        let answer = source.ok_or_else(|| why.unwrap_or_else(|| "no copy".into()));
        self.memory.prepared.insert(host, answer);
        self.memory.heard = Some(now);
        if self.memory.prepared.len() < self.plan.hosts as usize {
            return;
        }
        let missing: Vec<String> = self
            .memory
            .prepared
            .iter()
            .filter_map(|(h, a)| a.as_ref().err().map(|why| format!("host {h}: {why}")))
            .collect();
        self.memory_decide(now, step, &missing);
    }

    /// When the preparation is given up unless a host answers first:
    /// `None` unless hosts were asked and the attempt is still undecided.
    pub(super) fn memory_deadline(&self) -> Option<Instant> {
        (self.memory.decided == Restore::Undecided)
            .then_some(self.memory.heard?)
            .map(|t| self.since(t) + MEMORY_PREPARE_TIMEOUT)
    }

    /// The preparation is over without every answer (its deadline, or
    /// the join timeout with every host joined): the attempt resumes from
    /// storage and says which hosts never answered. Nothing to do once
    /// decided.
    pub(super) fn memory_give_up(&mut self, now: Instant, waited: Duration) {
        let Some(step) = self.setup.memory_step else {
            return;
        };
        if self.memory.decided != Restore::Undecided {
            return;
        }
        let missing: Vec<String> = (0..self.plan.hosts)
            .filter_map(|h| match self.memory.prepared.get(&h) {
                None => Some(format!(
                    "host {h}: no answer in {} s whether it holds step {step}",
                    waited.as_secs()
                )),
                Some(Err(why)) => Some(format!("host {h}: {why}")),
                Some(Ok(_)) => None,
            })
            .collect();
        self.memory_decide(now, step, &missing);
    }

    /// Records the choice (memory when nothing is missing, storage
    /// otherwise) and launches.
    fn memory_decide(&mut self, now: Instant, step: u64, missing: &[String]) {
        let attempt = self.attempt();
        if missing.is_empty() {
            let sources = self
                .memory
                .prepared
                .values()
                .map(|a| a.clone().unwrap_or_default())
                .collect();
            self.record(Event::ResumingFromMemory {
                attempt,
                step,
                sources,
            });
            self.memory.decided = Restore::Memory(step);
        } else {
            self.record(Event::MemoryUnavailable {
                attempt,
                step,
                why: missing.join("; "),
                resume_step: self.setup.resume_step,
            });
            self.memory.decided = Restore::Storage;
        }
        self.launch(now);
    }

    /// Rank `rank` wrote its shards of memory checkpoint `step`; once
    /// every rank has, each host is sent its manifest to commit.
    pub(super) fn memory_written(
        &mut self,
        rank: u32,
        step: u64,
        leaves: Vec<Leaf>,
        extra: Option<Value>,
    ) {
        if self.memory.committed.is_some_and(|c| c >= step) {
            return;
        }
        let entry = self.memory.written.entry(step).or_default();
        entry.0.insert(rank, leaves);
        if rank == 0 {
            entry.1 = extra;
        }
        if entry.0.len() < self.ranks.len() {
            return;
        }
        let (by_rank, extra) = self.memory.written.remove(&step).expect("just filled");
        // Older steps still gathering will never be wanted.
        self.memory.written.retain(|s, _| *s > step);
        let pph = self.plan.procs_per_host;
        let mut sends = Vec::new();
        for (&host, link) in &self.agents {
            let mut leaves: BTreeMap<String, Leaf> = BTreeMap::new();
            for (_, ls) in by_rank.range(host * pph..(host + 1) * pph) {
                for l in ls {
                    let have = leaves.entry(l.path.clone()).or_insert_with(|| Leaf {
                        shards: Vec::new(),
                        ..l.clone()
                    });
                    // A region two ranks of the host hold (a replicated
                    // array) is read from the first: the reader wants
                    // each region stored once. Each rank's own copy of a
                    // per-process leaf is its own.
                    for s in &l.shards {
                        if !have
                            .shards
                            .iter()
                            .any(|h| h.region == s.region && h.rank == s.rank)
                        {
                            have.shards.push(s.clone());
                        }
                    }
                }
            }
            let manifest = Manifest {
                format: FORMAT_VERSION,
                step,
                leaves: leaves.into_values().collect(),
                files: vec![],
                extra: extra.clone().unwrap_or(Value::Null),
                attempt: Some(self.setup.attempt),
            };
            sends.push((link.conn, ToAgent::MemoryCommit { step, manifest }));
        }
        for (conn, msg) in sends {
            self.send(conn, msg);
        }
    }

    /// A host holds its part of memory checkpoint `step` (or could not).
    pub(super) fn memory_held(
        &mut self,
        host: u32,
        step: u64,
        bytes: u64,
        replicated: bool,
        error: Option<String>,
    ) {
        let attempt = self.attempt();
        if let Some(error) = error {
            self.memory.held.remove(&step);
            self.record(Event::MemoryCheckpointFailed {
                attempt,
                step,
                host,
                error,
            });
            return;
        }
        if self.memory.committed.is_some_and(|c| c >= step) {
            return;
        }
        let held = self.memory.held.entry(step).or_default();
        held.insert(host, (bytes, replicated));
        if held.len() < self.plan.hosts as usize {
            return;
        }
        let held = self.memory.held.remove(&step).expect("just filled");
        self.memory.held.retain(|s, _| *s > step);
        self.memory.committed = Some(step);
        self.record(Event::MemoryCheckpointCommitted {
            attempt,
            step,
            host_bytes: held.values().map(|(b, _)| *b).collect(),
            replicated: held.values().all(|(_, r)| *r),
        });
        for conn in self.agent_conns() {
            self.send(conn, ToAgent::MemoryRelease { step });
        }
    }

    /// The newest memory checkpoint this attempt committed.
    pub fn memory_committed(&self) -> Option<u64> {
        self.memory.committed
    }
}

#[cfg(test)]
mod tests {
    use super::buddy_of;

    #[test]
    fn buddies_form_a_ring() {
        assert_eq!(buddy_of(0, 1), None);
        assert_eq!(buddy_of(0, 2), Some(1));
        assert_eq!(buddy_of(1, 2), Some(0));
        assert_eq!(buddy_of(2, 3), Some(0));
    }
}
