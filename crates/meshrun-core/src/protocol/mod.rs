//! The one control protocol between controller, agents and workers.
//!
//! A frame is a 4-byte big-endian length, then one version byte, then a
//! JSON-encoded [`Message`]. Frames over [`frame::MAX_FRAME_BYTES`] are
//! refused before they are read. Every connection starts with the HMAC
//! challenge/response of [`auth`]; nothing else is accepted before it.

pub mod auth;
pub mod frame;
pub mod message;

pub use frame::{Connection, ProtocolError, MAX_FRAME_BYTES, PROTOCOL_VERSION};
pub use message::{ExitInfo, Message, Stream, WorkerLaunch, STACK_DUMP_WAIT};
