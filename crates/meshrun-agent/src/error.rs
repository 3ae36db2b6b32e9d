//! What ends an agent's session with an error: the controller cannot be
//! reached, refuses the run token or the host, or never answers.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{what}: {source}")]
    Net {
        what: &'static str,
        source: io::Error,
    },
    #[error(transparent)]
    Protocol(#[from] meshrun_protocol::ProtocolError),
    #[error("the controller at {controller} did not accept this host's run token ({why}): give the token of that run (MESHRUN_TOKEN, or --token-file with the file it printed)")]
    HandshakeFailed {
        controller: std::net::SocketAddr,
        why: String,
    },
    #[error("the run refused this host: {0}")]
    JoinRefused(String),
    #[error("could not join the run at {controller} within {secs} s (last: {last}); is `meshrun run --listen {controller}` running, and is that address reachable from here?")]
    JoinTimeout {
        controller: std::net::SocketAddr,
        secs: u64,
        last: String,
    },
}
