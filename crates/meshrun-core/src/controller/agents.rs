//! Starting the agents. A one-host run keeps its agent inside the
//! controller's process (a task that still speaks TCP to the controller);
//! with `--hosts H`, each agent is its own process bound to its own loopback
//! address, so losing a host can be simulated by killing its agent.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;

use crate::agent::{self, AgentConfig};
use crate::error::CoreError;
use crate::plan::RunPlan;
use crate::token::Token;

/// Agents started for a run; processes are stopped when the run ends.
pub struct Agents {
    pub children: Vec<(u32, tokio::process::Child)>,
}

pub fn start(plan: &RunPlan, controller: SocketAddr, token: &Token) -> Result<Agents, CoreError> {
    if plan.hosts == 1 {
        let cfg = AgentConfig {
            controller,
            token: token.clone(),
            host: 0,
            host_ip: IpAddr::V4(plan.host_ip(0)),
        };
        tokio::spawn(async move {
            if let Err(e) = agent::run(cfg).await {
                tracing::error!("agent of host 0 failed: {e}");
            }
        });
        return Ok(Agents { children: vec![] });
    }
    let (program, prefix) = match plan.agent_command.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (
            std::env::current_exe()
                .map_err(|source| CoreError::AgentSpawn {
                    host: 0,
                    program: "meshrun".into(),
                    source,
                })?
                .display()
                .to_string(),
            vec![],
        ),
    };
    let mut children = Vec::new();
    for host in 0..plan.hosts {
        let child = tokio::process::Command::new(&program)
            .args(&prefix)
            .args([
                "agent",
                "--controller",
                &controller.to_string(),
                "--host",
                &host.to_string(),
                "--host-ip",
                &plan.host_ip(host).to_string(),
            ])
            // The token travels in the environment, never on a command
            // line that any user of the machine can read.
            .env("MESHRUN_TOKEN", token.to_hex())
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| CoreError::AgentSpawn {
                host,
                program: program.clone(),
                source,
            })?;
        children.push((host, child));
    }
    Ok(Agents { children })
}

impl Agents {
    /// Waits briefly for agents told to shut down, then kills stragglers.
    pub async fn finish(mut self) {
        for (_, child) in &mut self.children {
            if tokio::time::timeout(std::time::Duration::from_secs(3), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }

    /// An agent process that already exited, for a better error.
    pub fn exited(&mut self) -> Option<(u32, String)> {
        self.children.iter_mut().find_map(|(host, child)| {
            child
                .try_wait()
                .ok()
                .flatten()
                .map(|status| (*host, crate::process::exit_info(status).to_string()))
        })
    }
}
