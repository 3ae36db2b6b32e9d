//! `meshrun join ADDR:PORT`: this host joins a run that listens for its
//! hosts (`meshrun run --listen`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

use meshrun_agent::{self as agent, join::join as join_run, AgentConfig, News};
use meshrun_protocol::token::Token;

use crate::cli::JoinArgs;
use crate::commands::error;
use crate::exit;

/// Why the command line cannot be used.
#[derive(Debug, thiserror::Error)]
enum JoinUsage {
    #[error("no run token: set MESHRUN_TOKEN, or give --token-file with the file the run printed (a token is never taken on the command line)")]
    NoToken,
    #[error("cannot read --token-file '{path}': {source}")]
    TokenFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    BadToken {
        what: String,
        source: meshrun_protocol::token::TokenError,
    },
    #[error("SLURM_NODEID must be a host rank (a whole number), got '{0}'")]
    BadSlurmNodeId(String),
    #[error("--join-timeout must be a positive number of seconds, got {0}")]
    BadTimeout(f64),
    #[error("'{0}' is not ADDRESS:PORT (like 10.0.0.1:29400 or head-node:29400)")]
    BadAddress(String),
}

/// `addr` resolved, retried every second for up to `timeout`: a host's
/// name may not resolve yet when it starts (a pod's DNS record).
fn resolve(addr: &str, timeout: Duration) -> Result<SocketAddr, String> {
    let start = Instant::now();
    loop {
        match addr.to_socket_addrs().map(|mut all| all.next()) {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => return Err(format!("'{addr}' resolves to no address")),
            Err(e) if start.elapsed() >= timeout => {
                return Err(format!(
                    "cannot resolve '{addr}' within {} s: {e}",
                    timeout.as_secs()
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

pub fn join(args: &JoinArgs) -> i32 {
    let mut cfg = match config(args) {
        Ok(cfg) => cfg,
        Err(e) => {
            error(e);
            return exit::USAGE;
        }
    };
    let timeout = Duration::from_secs_f64(args.join_timeout);
    cfg.controller = match resolve(&args.controller, timeout) {
        Ok(addr) => addr,
        Err(e) => {
            error(e);
            return exit::FAILURE;
        }
    };
    let runtime = match agent::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            error(e);
            return exit::FAILURE;
        }
    };
    match runtime.block_on(join_run(cfg, timeout)) {
        Ok(state) => exit_status(state.as_deref()),
        Err(e) => {
            error(e);
            exit::FAILURE
        }
    }
}

/// One line on stderr per thing that happened, as `meshrun run` says its
/// own.
fn say(news: &News) {
    eprintln!("meshrun join: {news}");
}

/// The run's outcome, as `meshrun run` exits with it: a scheduler that
/// starts `meshrun join` on every node (Slurm, a Kubernetes indexed Job)
/// judges each node by its exit status, and a failed run must not look
/// successful on every node but the controller's. A preempted run exits
/// 75 (try again later) there too, and one stopped by `meshrun stop --now`
/// 3; a controller that ended without saying how is a failure.
fn exit_status(state: Option<&str>) -> i32 {
    match state {
        Some("succeeded") => exit::SUCCESS,
        Some("preempted") => meshrun_core::controller::EXIT_PREEMPTED,
        Some("stopped") => meshrun_core::controller::EXIT_STOPPED,
        _ => exit::FAILURE,
    }
}

fn config(args: &JoinArgs) -> Result<AgentConfig, JoinUsage> {
    if !(args.join_timeout.is_finite() && args.join_timeout > 0.0) {
        return Err(JoinUsage::BadTimeout(args.join_timeout));
    }
    // The form is checked here; the name is resolved later.
    let Some((host, port)) = args.controller.rsplit_once(':') else {
        return Err(JoinUsage::BadAddress(args.controller.clone()));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(JoinUsage::BadAddress(args.controller.clone()));
    }
    let token = match (&args.token_file, std::env::var("MESHRUN_TOKEN")) {
        (Some(path), _) => read_token(path)?,
        (None, Ok(hex)) => Token::from_hex(hex.trim()).map_err(|source| JoinUsage::BadToken {
            what: "MESHRUN_TOKEN is not a run token".into(),
            source,
        })?,
        (None, Err(_)) => return Err(JoinUsage::NoToken),
    };
    // Under Slurm, each node knows its index: the host rank, unless given.
    let host = match (args.host_rank, std::env::var("SLURM_NODEID")) {
        (Some(r), _) => Some(r),
        (None, Ok(id)) => Some(
            id.trim()
                .parse()
                .map_err(|_| JoinUsage::BadSlurmNodeId(id.clone()))?,
        ),
        (None, Err(_)) => None,
    };
    Ok(AgentConfig {
        // Set once resolved.
        controller: SocketAddr::from(([0, 0, 0, 0], 0)),
        token,
        host,
        host_ip: None,
        scratch: agent::scratch_root(),
        // A host that joins takes part in every attempt: its spares wait
        // between them.
        spares: Some(agent::Spares::new()),
        news: Some(say),
        rejoining: false,
    })
}

fn read_token(path: &Path) -> Result<Token, JoinUsage> {
    let text = std::fs::read_to_string(path).map_err(|source| JoinUsage::TokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    Token::from_hex(text.trim()).map_err(|source| JoinUsage::BadToken {
        what: format!(
            "--token-file '{}' does not hold a run token",
            path.display()
        ),
        source,
    })
}
