//! meshrun's engine: the drivers that carry out what the plan and the
//! machine decide.
//!
//! - [`controller`] owns a run: it starts the agents, runs the server, the
//!   checkpoint committer and the driver loop that feeds the controller's
//!   state machine (the crate `meshrun-machine`) and does what it says,
//!   and restarts attempts (`controller::supervisor`);
//! - [`agent`] spawns and watches the workers of one host; [`leftovers`]
//!   and [`cgroup`] see that nothing a worker starts outlives it;
//! - [`rundir`] writes the run directory.
//!
//! Around it: planning (the request checked into a plan, and what each
//! worker is started with) is `meshrun-plan`; the protocol's messages are
//! `meshrun-protocol` and its connections `meshrun-channel`; the worker's
//! side, inside the user's Python process, is `meshrun-worker`, which
//! builds without this crate.

pub mod controller;
pub mod error;
pub mod limits;
pub mod rundir;

pub use controller::{execute, ExecOptions, Outcome, OutcomeStatus, StopHandle};
pub use error::CoreError;
