//! What can go wrong when a worker connects to its controller. The
//! messages are those the engine gives for the same failures.

use std::io;

use meshrun_protocol::ProtocolError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The controller could not be reached, or a socket or thread of the
    /// connection could not be set up.
    #[error("{what}: {source}")]
    Net {
        what: &'static str,
        source: io::Error,
    },
    /// The handshake or the first message failed.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}
