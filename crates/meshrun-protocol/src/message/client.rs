//! The conversation of `meshrun stop` and `meshrun profile` with a run's controller.

use serde::{Deserialize, Serialize};

/// What `meshrun stop` and `meshrun profile` ask of a run's controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientRequest {
    /// Stop the run: at once with `now`, else as on SIGTERM (a checkpoint
    /// first, when the program saves through `meshrun.report`).
    StopRun { now: bool },
    /// Trace `steps` steps of `ranks` (`None`: every rank) with
    /// `jax.profiler`, from their next report.
    ProfileRun { ranks: Option<Vec<u32>>, steps: u32 },
}

/// What the controller answers them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientReply {
    /// What the controller will do about it.
    StopAccepted { what: String },
    /// The capture began: the traces come to `dir`.
    ProfileAccepted { dir: String, ranks: Vec<u32> },
    /// The capture ended: `ranks` sent their traces, `missing` did not (and
    /// why). Sent on the same connection as `ProfileAccepted`.
    ProfileSaved {
        dir: String,
        ranks: Vec<u32>,
        missing: Vec<(u32, String)>,
    },
    /// Controller to a requester: it cannot do that, and why.
    Declined { reason: String },
}
