//! The one control protocol between controller, agents and workers.
//!
//! Every connection opens with the Noise handshake of [`auth`], keyed by
//! the run token; nothing else is read before it succeeds. After it, each
//! frame (one version byte, then a JSON-encoded [`Message`]: [`frame`]) is
//! sealed with the connection's keys and authenticated ([`channel`]).
//! Frames over [`frame::MAX_FRAME_BYTES`] are refused; a frame that does
//! not authenticate closes its connection.

pub mod auth;
pub mod channel;
pub mod frame;
pub mod message;

pub use channel::{BlockingReader, BlockingWriter, Connection, FrameSink, FrameStream, Keys};
pub use frame::{ProtocolError, MAX_FRAME_BYTES, PROTOCOL_VERSION};
pub use message::{ExitInfo, Message, Stream, WorkerLaunch, STACK_DUMP_WAIT};
