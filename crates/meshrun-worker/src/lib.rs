//! The worker's side of the control protocol: what runs inside every
//! training process (through the binding crate), as plain threads over
//! blocking sockets.
//!
//! - [`WorkerClient`] connects to the controller with the worker's own
//!   credential, sends reports, heartbeats, failures and checkpoint news,
//!   and takes the controller's requests;
//! - `files` sends a profile trace over the same connection;
//! - `commits` keeps what the controller said of each checkpoint step;
//! - [`resume`] decides which checkpoint the worker resumes from.
//!
//! A crate of its own so that it builds without the controller and the
//! agent (`meshrun-core`): it needs only `meshrun-protocol`, and the
//! record and checkpoint types its messages carry.

mod client;
mod commits;
mod error;
mod files;
pub mod resume;

pub use client::{
    OnControllerLoss, ProfileRequest, Report, WorkerClient, HEARTBEAT_INTERVAL, UNSENT_REPORT_BYTES,
};
pub use commits::{NotCommitted, KEPT_OUTCOMES};
pub use error::WorkerError;
