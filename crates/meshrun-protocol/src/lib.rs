//! The one control protocol between controller, agents and workers, and
//! the run token it is keyed by.
//!
//! Every connection opens with the Noise handshake of [`auth`], keyed by
//! the run token ([`token`]); nothing else is read before it succeeds.
//! After it, each frame (one version byte, then a JSON-encoded [`Message`]:
//! [`frame`]) is sealed with the connection's keys and authenticated
//! ([`channel`]). Frames over [`frame::MAX_FRAME_BYTES`] are refused; a
//! frame that does not authenticate closes its connection.
//!
//! A crate of its own so that the worker's side (`meshrun-worker`, inside
//! every training process) speaks it without the controller and the agent.
//! It depends on `meshrun-record` and `meshrun-ckpt` only for the types its
//! messages carry (exit statuses, goodput timings, checkpoint manifests).

pub mod auth;
pub mod channel;
pub mod env;
pub mod frame;
pub mod message;
pub mod token;

pub use channel::{BlockingReader, BlockingWriter, Connection, FrameSink, FrameStream, Keys};
pub use frame::{ProtocolError, MAX_FRAME_BYTES, PROTOCOL_VERSION};
pub use message::{ExitInfo, Message, Stream, WorkerLaunch, STACK_DUMP_WAIT};
