//! Warm standby workers: one interpreter per worker slot of the host, with
//! meshrun and the heavy modules (JAX, Flax, optax) already imported,
//! waiting on its standard input for an attempt. A restart hands each
//! rank's attempt to its spare instead of starting a new interpreter; new
//! spares start once every rank has trained a step (the controller says
//! so), when importing no longer competes with the attempt's own start.
//!
//! What JAX fixes when it is imported (the platform, the compilation
//! cache's settings, the visible GPUs) is fixed per host slot and is in
//! the spare's environment from the start; what changes per attempt (the
//! attempt, the control and coordinator addresses, the step to resume
//! from: every `MESHRUN_*` variable, which meshrun reads when it needs
//! it, and JAX's coordinator addresses, read by
//! `jax.distributed.initialize`) is handed over with the attempt. A spare
//! whose fixed environment differs from the new launch's is not used.
//!
//! The pool belongs to whoever outlives the attempts: the controller for
//! host 0's agent, `meshrun join` for a host that joins. A spare whose
//! agent goes away sees its input close and exits.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use meshrun_protocol::WorkerLaunch;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};

/// The module a spare runs, and the one a cold worker runs (its argv).
const SPARE_MODULE: &str = "meshrun._spare";
const BOOTSTRAP_MODULE: &str = "meshrun._bootstrap";

/// The pool of a host's spares, by rank. Cheap to clone.
#[derive(Clone, Default)]
pub struct Spares(Arc<Mutex<Pool>>);

#[derive(Default)]
struct Pool {
    by_rank: HashMap<u32, Spare>,
    /// Spares out of the pool and being handed their attempt: not yet
    /// watched as workers, and still not leftovers.
    handing_over: HashSet<u32>,
    /// The run is over: no spare is started any more.
    closed: bool,
}

struct Spare {
    child: Child,
    stdin: ChildStdin,
    /// The environment it started with that must equal the launch's.
    fixed: Vec<(String, String)>,
    python: String,
}

/// Whether a variable may differ between a spare and the attempt it takes
/// over: read only after the handover.
fn late(key: &str) -> bool {
    key.starts_with("MESHRUN_")
        || key.starts_with("JAX_COORDINATOR_")
        || meshrun_plan::launcher_env::is_contract_var(key)
}

/// The variables of a launch a spare must have started with, sorted.
fn fixed_env(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut fixed: Vec<(String, String)> = env.iter().filter(|(k, _)| !late(k)).cloned().collect();
    fixed.sort();
    fixed.dedup_by(|a, b| a.0 == b.0);
    fixed
}

/// The interpreter of a worker started through the bootstrap; `None` for
/// any other command, which has no spare.
fn bootstrap_python(w: &WorkerLaunch) -> Option<&str> {
    match w.argv.as_slice() {
        [python, dash_m, module, ..] if dash_m == "-m" && module == BOOTSTRAP_MODULE => {
            Some(python)
        }
        _ => None,
    }
}

/// A spare handed its attempt, to be watched as the rank's worker.
pub struct Adopted {
    pub child: Child,
}

impl Spares {
    pub fn new() -> Self {
        Self::default()
    }

    /// The spare for `w`'s rank, handed the attempt (its environment,
    /// folder and command line), when one is there and fits; any spare of
    /// that rank that does not fit is ended.
    pub async fn adopt(&self, w: &WorkerLaunch, extra_env: &[(String, String)]) -> Option<Adopted> {
        let env: Vec<(String, String)> = w.env.iter().chain(extra_env).cloned().collect();
        let mut spare = {
            let mut pool = self.0.lock().expect("spares lock");
            let spare = pool.by_rank.remove(&w.rank)?;
            pool.handing_over.extend(spare.child.id());
            spare
        };
        let pid = spare.child.id();
        let adopted = hand_over(w, &env, &mut spare).await;
        if let Some(pid) = pid {
            self.0
                .lock()
                .expect("spares lock")
                .handing_over
                .remove(&pid);
        }
        if !adopted {
            let _ = spare.child.start_kill();
            let _ = spare.child.wait().await;
            return None;
        }
        // Closed: the worker's standard input reads as empty, as a cold
        // worker's does.
        drop(spare.stdin);
        Some(Adopted { child: spare.child })
    }

    /// Whether `pid` is one of this pool's spares (waiting, or being handed
    /// its attempt). The agent's subreaper must not end them as orphans:
    /// they are the agent's own children, kept across attempts.
    pub fn holds(&self, pid: u32) -> bool {
        let pool = self.0.lock().expect("spares lock");
        pool.handing_over.contains(&pid) || pool.by_rank.values().any(|s| s.child.id() == Some(pid))
    }

    /// Starts a spare for every launch whose rank has none.
    pub fn refill(&self, launches: &[(WorkerLaunch, Vec<(String, String)>)], imports: &[String]) {
        let mut pool = self.0.lock().expect("spares lock");
        if pool.closed {
            return;
        }
        for (w, extra) in launches {
            if pool.by_rank.contains_key(&w.rank) {
                continue;
            }
            let Some(python) = bootstrap_python(w) else {
                continue;
            };
            let env: Vec<(String, String)> = w.env.iter().chain(extra).cloned().collect();
            let fixed = fixed_env(&env);
            let spawned = Command::new(python)
                .args(["-m", SPARE_MODULE])
                .env_remove(meshrun_protocol::token::TOKEN_ENV)
                .envs(fixed.iter().map(|(k, v)| (k, v)))
                .env(meshrun_protocol::env::SPARE_IMPORTS, imports.join(","))
                .current_dir(&w.cwd)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true)
                .spawn();
            match spawned {
                Ok(mut child) => {
                    let stdin = child.stdin.take().expect("piped stdin");
                    tracing::debug!(rank = w.rank, pid = child.id(), "spare started");
                    pool.by_rank.insert(
                        w.rank,
                        Spare {
                            child,
                            stdin,
                            fixed,
                            python: python.to_string(),
                        },
                    );
                }
                Err(e) => tracing::warn!(rank = w.rank, "cannot start a spare: {e}"),
            }
        }
    }

    /// The run is over: every spare ends, and none starts again.
    pub async fn close(&self) {
        let spares: Vec<Spare> = {
            let mut pool = self.0.lock().expect("spares lock");
            pool.closed = true;
            pool.by_rank.drain().map(|(_, s)| s).collect()
        };
        for mut s in spares {
            let _ = s.child.start_kill();
            let _ = s.child.wait().await;
        }
    }

    /// How many spares are waiting (for tests and `status`).
    pub fn count(&self) -> usize {
        self.0.lock().expect("spares lock").by_rank.len()
    }
}

/// Hands `w`'s attempt to `spare` when it fits and is alive; false when
/// it is not to be used.
async fn hand_over(w: &WorkerLaunch, env: &[(String, String)], spare: &mut Spare) -> bool {
    let fits = bootstrap_python(w) == Some(spare.python.as_str()) && spare.fixed == fixed_env(env);
    let alive = matches!(spare.child.try_wait(), Ok(None));
    if !fits || !alive {
        tracing::debug!(rank = w.rank, fits, alive, "spare not used");
        return false;
    }
    let job = serde_json::json!({
        "env": env.iter().cloned().collect::<HashMap<_, _>>(),
        "argv": w.argv[3..].to_vec(),
        "cwd": w.cwd,
    });
    let mut line = job.to_string();
    line.push('\n');
    if let Err(e) = spare.stdin.write_all(line.as_bytes()).await {
        tracing::debug!(rank = w.rank, "spare did not take its attempt: {e}");
        return false;
    }
    true
}

impl std::fmt::Debug for Spares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spares({} waiting)", self.count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(env: &[(&str, &str)]) -> WorkerLaunch {
        WorkerLaunch {
            rank: 0,
            argv: ["python", "-m", BOOTSTRAP_MODULE, "script", "x.py"]
                .map(String::from)
                .to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: "/".into(),
        }
    }

    #[test]
    fn what_changes_per_attempt_is_not_fixed() {
        let a = launch(&[
            ("MESHRUN_ATTEMPT", "1"),
            ("JAX_COORDINATOR_ADDRESS", "a"),
            ("MASTER_PORT", "1"),
            ("JAX_PLATFORMS", "cpu"),
        ]);
        let b = launch(&[
            ("MESHRUN_ATTEMPT", "2"),
            ("JAX_COORDINATOR_ADDRESS", "b"),
            ("MASTER_PORT", "2"),
            ("JAX_PLATFORMS", "cpu"),
        ]);
        assert_eq!(fixed_env(&a.env), fixed_env(&b.env));
        let c = launch(&[("JAX_PLATFORMS", "cuda")]);
        assert_ne!(fixed_env(&a.env), fixed_env(&c.env));
    }

    #[test]
    fn only_bootstrapped_workers_have_spares() {
        let mut w = launch(&[]);
        assert_eq!(bootstrap_python(&w), Some("python"));
        w.argv = vec!["sh".into(), "-c".into(), "true".into()];
        assert_eq!(bootstrap_python(&w), None);
    }
}
