//! The connections of meshrun's control protocol (`meshrun-protocol`).
//!
//! Every connection opens with the Noise handshake of [`auth`], keyed by
//! the run token; nothing else is read before it succeeds. After it, each
//! frame body (`meshrun_protocol::frame`) is sealed with the connection's
//! keys and authenticated ([`channel`]). Frames over
//! `meshrun_protocol::MAX_FRAME_BYTES` are refused; a frame that does not
//! authenticate closes its connection.
//!
//! Both sides are here: async (tokio) for the controller and the agent,
//! blocking for the worker's thread inside the user's Python process.

pub mod auth;
pub mod channel;

pub use channel::{BlockingReader, BlockingWriter, Connection, FrameSink, FrameStream, Keys};
