//! The joined agents, by host, and their hosts ordered by when each was
//! last heard of: [`super::Machine::poll_timeout`], asked after every
//! message, reads the earliest without visiting every host (1,250 of
//! them at 10,000 ranks). As with the ranks (see `ranks.rs`), the links are
//! read as a map and changed only through methods that keep the order.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::time::Instant;

use super::Conn;

pub(super) struct AgentLink {
    pub ip: String,
    pub gpus: Vec<String>,
    pub free_port: u16,
    pub replica_port: Option<u16>,
    pub controller: Option<String>,
    pub conn: Conn,
    /// It read back the storage marker (or there was none to read).
    pub storage_ok: bool,
    /// Its last message: agents send a heartbeat every second, so a
    /// silent agent means a host cut off.
    pub heard: Instant,
}

#[derive(Default)]
pub(super) struct Agents {
    links: BTreeMap<u32, AgentLink>,
    /// (heard, host) of every link.
    heard: BTreeSet<(Instant, u32)>,
    /// How often the links were read (see `tests_timers.rs`).
    #[cfg(test)]
    reads: std::cell::Cell<u64>,
}

impl Agents {
    /// Host `host`'s agent is `link` (replacing any before it).
    pub fn insert(&mut self, host: u32, link: AgentLink) {
        self.remove(host);
        self.heard.insert((link.heard, host));
        self.links.insert(host, link);
    }

    pub fn remove(&mut self, host: u32) -> Option<AgentLink> {
        let link = self.links.remove(&host)?;
        self.heard.remove(&(link.heard, host));
        Some(link)
    }

    /// Host `host`'s agent (if it has joined) was heard of at `now`.
    pub fn heard(&mut self, host: u32, now: Instant) {
        if let Some(link) = self.links.get_mut(&host) {
            self.heard.remove(&(link.heard, host));
            link.heard = now;
            self.heard.insert((now, host));
        }
    }

    /// Host `host`'s agent is no longer watched for silence, until it is
    /// heard of again: its ranks have all ended, so its silence fails
    /// nobody, and a deadline kept for it would stay in the past.
    pub fn excuse(&mut self, host: u32) {
        if let Some(link) = self.links.get(&host) {
            self.heard.remove(&(link.heard, host));
        }
    }

    /// Whether host `host`'s agent is watched for silence.
    #[cfg(test)]
    pub fn watched(&self, host: u32) -> bool {
        self.links
            .get(&host)
            .is_some_and(|l| self.heard.contains(&(l.heard, host)))
    }

    /// Host `host`'s agent read back the storage marker.
    pub fn storage_checked(&mut self, host: u32) {
        if let Some(link) = self.links.get_mut(&host) {
            link.storage_ok = true;
        }
    }

    /// When the agent heard of least recently was last heard of.
    pub fn earliest_heard(&self) -> Option<Instant> {
        self.heard.first().map(|&(t, _)| t)
    }

    pub fn into_links(self) -> BTreeMap<u32, AgentLink> {
        self.links
    }

    #[cfg(test)]
    pub fn reads(&self) -> u64 {
        self.reads.get()
    }
}

/// Read access, as to the map alone: a change goes through the methods
/// above.
impl Deref for Agents {
    type Target = BTreeMap<u32, AgentLink>;

    fn deref(&self) -> &BTreeMap<u32, AgentLink> {
        #[cfg(test)]
        self.reads.set(self.reads.get() + 1);
        &self.links
    }
}

impl<'a> IntoIterator for &'a Agents {
    type Item = (&'a u32, &'a AgentLink);
    type IntoIter = std::collections::btree_map::Iter<'a, u32, AgentLink>;

    fn into_iter(self) -> Self::IntoIter {
        #[cfg(test)]
        self.reads.set(self.reads.get() + 1);
        self.links.iter()
    }
}
