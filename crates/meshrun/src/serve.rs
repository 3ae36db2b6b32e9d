//! `meshrun serve`: the live page of a runs directory (see `meshrun-serve`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use meshrun_protocol::token::Token;
use meshrun_serve::ServeConfig;
use tokio::signal::unix::{signal, SignalKind};

use crate::commands::error;
use crate::{exit, runs};

pub fn serve(runs_dir: PathBuf, host: IpAddr, port: u16) -> i32 {
    if !runs_dir.is_dir() {
        error(format!(
            "no runs directory at '{}': give --runs-dir DIR, the folder `meshrun run --runs-dir` wrote to",
            runs_dir.display()
        ));
        return exit::USAGE;
    }
    // Anybody who can reach another address sees the runs: they must hold
    // the token printed here.
    let token = if host.is_loopback() {
        None
    } else {
        match Token::generate() {
            Ok(t) => Some(t.to_hex()),
            Err(e) => {
                error(e);
                return exit::FAILURE;
            }
        }
    };
    let cfg = ServeConfig {
        runs_dir: runs_dir.clone(),
        addr: SocketAddr::new(host, port),
        token: token.clone(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error(format!("cannot start the server's runtime: {e}"));
            return exit::FAILURE;
        }
    };
    runtime.block_on(async move {
        // SIGINT's handler is in place before the address is printed: a
        // `ctrl_c()` future registers only when first polled, and a loaded
        // machine served requests (and received the caller's Ctrl-C) before
        // that, which ended the server by the signal itself.
        let mut interrupt = match signal(SignalKind::interrupt()) {
            Ok(interrupt) => interrupt,
            Err(e) => {
                error(format!("cannot handle SIGINT: {e}"));
                return exit::FAILURE;
            }
        };
        let (bound, server) = match meshrun_serve::bind(cfg).await {
            Ok(bound) => bound,
            Err(e) => {
                error(e);
                return exit::USAGE;
            }
        };
        let query = token.map_or_else(String::new, |t| format!("?token={t}"));
        runs::out(&format!(
            "meshrun: serving the runs in {} at http://{bound}/{query} (Ctrl-C to stop)\n",
            runs_dir.display()
        ));
        tokio::select! {
            result = server => match result {
                Ok(()) => exit::SUCCESS,
                Err(e) => {
                    error(e);
                    exit::FAILURE
                }
            },
            _ = interrupt.recv() => exit::SUCCESS,
        }
    })
}
