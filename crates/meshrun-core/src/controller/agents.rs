//! Starting the agents. A one-host run keeps its agent inside the
//! controller's process (a task that still speaks TCP to the controller);
//! with `--hosts H`, each agent is its own process bound to its own loopback
//! address, so losing a host can be simulated by killing its agent.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use meshrun_protocol::token::Token;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::error::CoreError;
use meshrun_agent::{self as agent, AgentConfig};
use meshrun_plan::{RayTarget, RunPlan};

/// Agents started for a run; processes are stopped when the run ends.
pub struct Agents {
    pub children: Vec<(u32, tokio::process::Child)>,
    /// Host 0's agent when it is a task of this process: waited for at the
    /// end, so it ends its workers and tidies its scratch folder before
    /// the runtime goes.
    task: Option<tokio::task::JoinHandle<()>>,
    /// With Ray: what the placing process said on stderr, for the error
    /// when it gives up.
    ray_said: Option<Arc<Mutex<Vec<String>>>>,
    /// With Ray: what the cluster holds back, each time that changes.
    ray_waiting: Option<mpsc::UnboundedReceiver<Option<String>>>,
}

/// The placing process's lines that say what the cluster holds back
/// (nothing after the prefix: nothing waits any more).
const WAITING_PREFIX: &str = "meshrun-waiting:";

pub fn start(
    plan: &RunPlan,
    controller: SocketAddr,
    token: &Token,
    spares: &agent::Spares,
) -> Result<Agents, CoreError> {
    if let Some(ray) = &plan.ray {
        return start_on_ray(plan, ray, controller, token);
    }
    // One host, or hosts that join by themselves: host 0's agent is a task
    // of this process.
    if plan.hosts == 1 || plan.rendezvous {
        let cfg = AgentConfig {
            controller: std::net::SocketAddr::new(plan.host_ip(0), controller.port()),
            token: token.clone(),
            host: Some(0),
            host_ip: Some(plan.host_ip(0)),
            scratch: agent::scratch_root(),
            spares: Some(spares.clone()),
            news: None,
            rejoining: false,
        };
        let task = tokio::spawn(async move {
            if let Err(e) = agent::run(&cfg).await {
                tracing::error!("agent of host 0 failed: {e}");
            }
        });
        return Ok(Agents {
            children: vec![],
            task: Some(task),
            ray_said: None,
            ray_waiting: None,
        });
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
            .env(meshrun_protocol::env::TOKEN, token.to_hex())
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
    Ok(Agents {
        children,
        task: None,
        ray_said: None,
        ray_waiting: None,
    })
}

/// The Ray backend: one Python process (`meshrun._ray_agents`) connects to
/// the cluster as a driver, reserves a placement group with one bundle per
/// host, and starts on each bundle's node an actor that runs `meshrun
/// agent` there. It lives as long as the attempt; when it ends, Ray
/// releases the actors and the bundles.
fn start_on_ray(
    plan: &RunPlan,
    ray: &RayTarget,
    controller: SocketAddr,
    token: &Token,
) -> Result<Agents, CoreError> {
    let cpus = f64::from(plan.procs_per_host) * plan.cpus_per_proc.unwrap_or(1.0);
    let gpus = plan.procs_per_host * plan.gpus_per_proc;
    let mut child = tokio::process::Command::new(&plan.python)
        .args(["-m", "meshrun._ray_agents"])
        .args(["--address", &ray.address, "--strategy", &ray.strategy])
        .args(["--hosts", &plan.hosts.to_string()])
        .args(["--cpus", &cpus.to_string(), "--gpus", &gpus.to_string()])
        .args(["--controller", &controller.to_string()])
        .args([
            "--timeout",
            &plan.failure.start_timeout().as_secs_f64().to_string(),
        ])
        .args(
            plan.elastic
                .iter()
                .flat_map(|e| ["--min-hosts".to_string(), e.min_hosts.to_string()]),
        )
        .arg("--run-dir")
        .arg(&plan.run_dir)
        .env(meshrun_protocol::env::TOKEN, token.to_hex())
        .current_dir(&plan.cwd)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CoreError::AgentSpawn {
            host: 0,
            program: format!("{} -m meshrun._ray_agents", plan.python.display()),
            source,
        })?;
    let said = Arc::new(Mutex::new(Vec::new()));
    let (waiting_tx, waiting_rx) = mpsc::unbounded_channel();
    if let Some(stderr) = child.stderr.take() {
        let said = Arc::clone(&said);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(what) = line.strip_prefix(WAITING_PREFIX) {
                    let what = what.trim();
                    let _ = waiting_tx.send((!what.is_empty()).then(|| what.to_string()));
                    continue;
                }
                // Its own messages become the run's error; Ray's pass through.
                match line.strip_prefix("meshrun: ") {
                    Some(message) => said.lock().expect("ray log lock").push(message.to_string()),
                    None => super::terminal::terminal().note(&line),
                }
            }
        });
    }
    Ok(Agents {
        children: vec![(0, child)],
        task: None,
        ray_said: Some(said),
        ray_waiting: Some(waiting_rx),
    })
}

impl Agents {
    /// Waits briefly for agents told to shut down, then kills stragglers.
    pub async fn finish(mut self) {
        if let Some(task) = self.task.take() {
            if tokio::time::timeout(std::time::Duration::from_secs(3), task)
                .await
                .is_err()
            {
                tracing::warn!("host 0's agent did not end in 3 s");
            }
        }
        for (_, child) in &mut self.children {
            if tokio::time::timeout(std::time::Duration::from_secs(3), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }

    /// The next change in what the cluster holds back; never resolves
    /// without Ray.
    pub async fn waiting(&mut self) -> Option<String> {
        if let Some(rx) = &mut self.ray_waiting {
            if let Some(what) = rx.recv().await {
                return what;
            }
            // The placing process is gone: nothing more to hear.
            self.ray_waiting = None;
        }
        std::future::pending().await
    }

    /// An agent process that already exited, for a better error.
    pub fn exited(&mut self) -> Option<(u32, String)> {
        let (host, how) = self.children.iter_mut().find_map(|(host, child)| {
            child
                .try_wait()
                .ok()
                .flatten()
                .map(|status| (*host, meshrun_agent::process::exit_info(status).to_string()))
        })?;
        Some((host, format!("exited ({how})")))
    }

    /// Why the Ray placement gave up, in its own words, once it has exited.
    pub fn ray_error(&mut self) -> Option<String> {
        let said = self.ray_said.clone()?;
        let (_, how) = self.exited()?;
        let said = said.lock().expect("ray log lock");
        Some(
            said.last()
                .cloned()
                .unwrap_or_else(|| format!("the placing process {how}")),
        )
    }
}
