//! Agents joining the attempt: which host rank each gets, the storage
//! check that comes before any launch, the function they are sent, and
//! what an agent says besides its workers' news.

use std::time::Instant;

use base64::Engine as _;
use meshrun_protocol::{FromAgent, ToAgent};
use meshrun_record::Event;

use super::{Action, AgentLink, Conn, Machine};
use crate::error::AttemptError;

/// Raw bytes of the pickled function per frame: base64 makes 4 of every
/// 3, and a frame carries at most 1 MiB.
const FUNCTION_PART_BYTES: usize = 512 * 1024;

impl Machine {
    /// An agent said hello: it gets a host rank (its own, if it named one
    /// that is free) or is refused with the reason.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn agent_joined(
        &mut self,
        now: Instant,
        host: Option<u32>,
        ip: String,
        pid: u32,
        gpus: Vec<String>,
        (free_port, replica_port): (u16, Option<u16>),
        controller: Option<String>,
        conn: Conn,
    ) {
        let hosts = self.plan.hosts;
        let elastic = self.plan.elastic.is_some();
        // An elastic run's host ranks are renumbered for each attempt: the
        // one a host asks for is a preference.
        let host = host.filter(|&h| !elastic || (h < hosts && !self.agents.contains_key(&h)));
        if self.stop.is_none() && self.host_waits(now, ip.clone(), conn) {
            return;
        }
        let refusal = if elastic && self.elastic.sized.is_some() && self.stop.is_none() {
            Some(format!(
                "the run has the most hosts it takes ({}, running or waiting)",
                self.elastic.max_hosts
            ))
        } else if self.launched || self.stop.is_some() || self.elastic.sized.is_some() {
            Some(format!(
                "the attempt has already started with its {hosts} host(s)"
            ))
        } else {
            match host {
                Some(h) if h >= hosts => Some(format!(
                    "host rank {h} is out of range: the run has {hosts} host(s), ranks 0 to {}",
                    hosts - 1
                )),
                Some(h) if self.agents.contains_key(&h) => Some(format!(
                    "host rank {h} is taken (by {})",
                    self.agents[&h].ip
                )),
                None if self.free_host().is_none() => {
                    Some(format!("the run has all its {hosts} hosts"))
                }
                Some(_) | None => None,
            }
        };
        if let Some(reason) = refusal {
            tracing::warn!(%ip, "agent refused: {reason}");
            self.record(Event::AgentRefused {
                ip,
                reason: reason.clone(),
            });
            self.send(conn, ToAgent::Refused { reason });
            self.push(Action::Close { conn });
            return;
        }
        let host = host.or_else(|| self.free_host()).expect("checked above");
        self.record(Event::AgentJoined {
            host,
            ip: ip.clone(),
            pid,
            gpus: gpus.clone(),
        });
        self.send(
            conn,
            ToAgent::HostAssigned {
                host,
                run: self.plan.name.clone(),
            },
        );
        let storage_ok = match &self.setup.storage_probe {
            Some(probe) => {
                self.send(
                    conn,
                    ToAgent::CheckStorage {
                        path: probe.path.display().to_string(),
                        expect: probe.expect.clone(),
                    },
                );
                false
            }
            None => true,
        };
        self.agents.insert(
            host,
            AgentLink {
                ip,
                gpus,
                free_port,
                replica_port,
                controller,
                conn,
                storage_ok,
                heard: now,
            },
        );
        self.launch(now);
    }

    /// The lowest host rank nobody holds, from the first one joiners get.
    fn free_host(&self) -> Option<u32> {
        (self.setup.first_joined_host..self.plan.hosts)
            .chain(0..self.setup.first_joined_host)
            .find(|h| !self.agents.contains_key(h))
    }

    /// What an agent says: about storage and stacks here, about its
    /// workers in `messages`.
    pub(super) fn on_agent_news(
        &mut self,
        now: Instant,
        host: u32,
        msg: FromAgent,
    ) -> Result<(), AttemptError> {
        match msg {
            FromAgent::Heartbeat => {}
            // Its workers' heartbeats, for the whole host: only its own
            // ranks, and only those still connected (a lost connection
            // stays lost).
            FromAgent::WorkerBeats { ranks } => {
                let pph = self.plan.procs_per_host;
                for rank in ranks {
                    if rank / pph != host {
                        continue;
                    }
                    if self
                        .ranks
                        .get(rank as usize)
                        .is_some_and(|s| s.conn.is_some())
                    {
                        self.ranks.update(rank, |state| state.heard = Some(now));
                    }
                }
            }
            FromAgent::StorageChecked { problem: None } => {
                self.agents.storage_checked(host);
                self.launch(now);
            }
            FromAgent::StorageChecked {
                problem: Some(problem),
            } => {
                let probe = self.setup.storage_probe.as_ref();
                return Err(AttemptError::StorageNotShared {
                    host,
                    ip: self
                        .agents
                        .get(&host)
                        .map(|a| a.ip.clone())
                        .unwrap_or_default(),
                    storage: probe.map(|p| p.storage.clone()).unwrap_or_default(),
                    problem,
                });
            }
            FromAgent::MemoryHeld {
                step,
                bytes,
                replicated,
                error,
            } => self.memory_held(host, step, bytes, replicated, error),
            FromAgent::MemoryPrepared {
                step,
                source,
                why,
                bytes: _,
            } => self.memory_prepared(now, host, step, source, why),
            FromAgent::Stacks { rank, text } => {
                if rank / self.plan.procs_per_host == host && rank < self.plan.nprocs {
                    self.push(Action::WriteStacks { rank, text });
                }
            }
            other => self.on_agent_message(now, host, other),
        }
        Ok(())
    }

    /// The pickled function, in pieces a frame can carry.
    pub(super) fn send_function(&mut self, conn: Conn, payload: &[u8]) {
        let engine = base64::engine::general_purpose::STANDARD;
        let mut parts = payload.chunks(FUNCTION_PART_BYTES).peekable();
        if parts.peek().is_none() {
            return self.send(
                conn,
                ToAgent::FunctionPart {
                    data: String::new(),
                    last: true,
                },
            );
        }
        while let Some(part) = parts.next() {
            let last = parts.peek().is_none();
            self.send(
                conn,
                ToAgent::FunctionPart {
                    data: engine.encode(part),
                    last,
                },
            );
        }
    }

    /// The host whose agent has been silent since `limit` ago: a host cut
    /// off from the controller (its link down, its machine gone).
    pub(super) fn silent_host(
        &self,
        now: Instant,
        limit: std::time::Duration,
    ) -> Option<(u32, f64)> {
        self.agents.iter().find_map(|(&host, a)| {
            (self.host_has_live_rank(host) && now >= self.since(a.heard) + limit)
                .then(|| (host, (now - a.heard).as_secs_f64()))
        })
    }

    /// Whether a rank of host `host` has not ended.
    pub(super) fn host_has_live_rank(&self, host: u32) -> bool {
        let pph = self.plan.procs_per_host;
        (host * pph..(host + 1) * pph).any(|r| self.ranks.get(r as usize).is_some_and(|s| !s.done))
    }

    /// Hosts silent past the heartbeat timeout whose ranks have all ended
    /// fail nobody: their agents stop being watched until heard again, so
    /// that the machine's next deadline is not one in the past (on which
    /// the driver would wake without end).
    pub(super) fn excuse_idle_silent_hosts(&mut self, now: Instant) {
        let idle: Vec<u32> = self
            .agents
            .iter()
            .filter(|(&h, a)| {
                now >= self.since(a.heard) + super::deadlines::HEARTBEAT_TIMEOUT
                    && !self.host_has_live_rank(h)
            })
            .map(|(&h, _)| h)
            .collect();
        for host in idle {
            self.agents.excuse(host);
        }
    }

    pub(super) fn host_ip(&self, host: u32) -> String {
        self.agents
            .get(&host)
            .map(|a| a.ip.clone())
            .unwrap_or_default()
    }
}
