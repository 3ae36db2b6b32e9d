//! The one control protocol between controller, agents and workers, as
//! data: the run token it is keyed by ([`token`]), the messages
//! ([`message`]: one enum per conversation and direction), their frame encoding ([`frame`]: one version byte, then
//! JSON) and the names of the environment every worker is started with
//! ([`mod@env`]).
//!
//! No I/O and no async runtime: the controller's state machine
//! (`meshrun-machine`) builds on these types alone. The connections that
//! carry them (the Noise handshake, the sealed channel, async and
//! blocking) are the crate `meshrun-channel`. The crate depends on
//! `meshrun-record` only for the types its messages carry (exit statuses,
//! goodput timings, checkpoint manifests).

pub mod env;
pub mod frame;
pub mod message;
pub mod token;

pub use frame::Frame;
pub use frame::{ProtocolError, MAX_FRAME_BYTES, PROTOCOL_VERSION};
pub use message::{
    ClientReply, ClientRequest, ExitInfo, FromAgent, FromWorker, ReplicaReply, ReplicaRequest,
    Stream, ToAgent, ToWorker, WorkerLaunch, STACK_DUMP_WAIT,
};
