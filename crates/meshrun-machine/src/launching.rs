//! The launch: once every agent has joined, read back the storage marker
//! and made memory ready, each is sent its workers, with the environment
//! contract of the attempt.

use std::time::Instant;

use meshrun_protocol::{ToAgent, WorkerLaunch};
use meshrun_record::{Cause, Event};

use super::{Action, Conn, Machine};
use meshrun_plan::launch::host_launches;
use meshrun_plan::worker_env::{AttemptInfo, ElasticInfo};

impl Machine {
    /// Sends every agent its workers. Ranks are laid out host by host and
    /// the JAX coordinator lives on host 0, at the port its agent found free.
    pub(super) fn launch(&mut self, now: Instant) {
        if self.stop.is_some() || self.launched || !self.hosts_ready(now) {
            return;
        }
        if self.agents.values().any(|a| !a.storage_ok) {
            return;
        }
        if !self.memory_ready(now) {
            return;
        }
        let (resume_step, resume_memory) = self.restore_choice();
        let host0 = &self.agents[&0];
        let coordinator = format!("{}:{}", host0.ip, host0.free_port);
        let setup = &self.setup;
        let info = AttemptInfo {
            run_id: &setup.run_id,
            attempt: setup.attempt,
            control_addr: &setup.control_addr,
            token_hex: &setup.token_hex,
            coordinator: &coordinator,
            user_xla_flags: setup.user_xla_flags.as_deref(),
            host_ip: "",
            resume_step,
            resume_memory,
            elastic: self.plan.elastic.as_ref().map(|e| ElasticInfo {
                min_world: e.min_hosts * self.plan.procs_per_host,
                max_world: self.elastic.max_hosts * self.plan.procs_per_host,
                previous_world: setup.previous_hosts.map(|h| h * self.plan.procs_per_host),
                reason: setup.resize_reason.as_deref(),
            }),
        };
        let mut plans: Vec<(Conn, Vec<WorkerLaunch>)> = Vec::new();
        let mut failed = None;
        for (&host, link) in &self.agents {
            let info = AttemptInfo {
                control_addr: link.controller.as_deref().unwrap_or(&setup.control_addr),
                host_ip: &link.ip,
                ..info
            };
            match host_launches(&self.plan, &info, host, &link.gpus) {
                Ok(workers) => plans.push((link.conn, workers)),
                Err(e) => {
                    failed = Some((host, e.to_string()));
                    break;
                }
            }
        }
        self.launched = true;
        self.elastic.launched_at = Some(now);
        if let Some((host, error)) = failed {
            self.ranks.update_all(|_, r| r.done = true);
            let rank = host * self.plan.procs_per_host;
            // A GPU inventory is read afresh by every attempt's agents.
            let deterministic = false;
            return self.fail(
                now,
                rank,
                Cause::SpawnFailed {
                    error,
                    deterministic,
                },
            );
        }
        self.push(Action::OpenLogs);
        self.record(Event::Launched {
            attempt: self.attempt(),
            coordinator,
        });
        for (conn, workers) in plans {
            if let Some(payload) = self.setup.payload.clone() {
                self.send_function(conn, &payload);
            }
            self.send(
                conn,
                ToAgent::Launch {
                    attempt: self.setup.attempt,
                    run_id: self.setup.run_id.clone(),
                    workers,
                    spares: self.plan.recovery.spares(&self.plan.failure),
                },
            );
        }
    }
}
