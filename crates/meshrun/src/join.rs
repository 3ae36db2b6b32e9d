//! `meshrun join ADDR:PORT`: this host joins a run that listens for its
//! hosts (`meshrun run --listen`).

use std::path::Path;
use std::time::Duration;

use meshrun_core::agent::{self, join::join as join_run, AgentConfig};
use meshrun_core::token::Token;

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
        source: meshrun_core::token::TokenError,
    },
    #[error("SLURM_NODEID must be a host rank (a whole number), got '{0}'")]
    BadSlurmNodeId(String),
    #[error("--join-timeout must be a positive number of seconds, got {0}")]
    BadTimeout(f64),
}

pub fn join(args: &JoinArgs) -> i32 {
    let cfg = match config(args) {
        Ok(cfg) => cfg,
        Err(e) => {
            error(e);
            return exit::USAGE;
        }
    };
    let runtime = match agent::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            error(e);
            return exit::FAILURE;
        }
    };
    let timeout = Duration::from_secs_f64(args.join_timeout);
    match runtime.block_on(join_run(cfg, timeout)) {
        Ok(()) => exit::SUCCESS,
        Err(e) => {
            error(e);
            exit::FAILURE
        }
    }
}

fn config(args: &JoinArgs) -> Result<AgentConfig, JoinUsage> {
    if !(args.join_timeout.is_finite() && args.join_timeout > 0.0) {
        return Err(JoinUsage::BadTimeout(args.join_timeout));
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
        controller: args.controller,
        token,
        host,
        host_ip: None,
        scratch: agent::scratch_root(),
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
