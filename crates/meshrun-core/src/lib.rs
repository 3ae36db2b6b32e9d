//! meshrun's engine: everything that plans, supervises and records a run.
//!
//! The roles of the architecture note map onto modules:
//! - [`plan`] turns a user's request into a validated [`plan::RunPlan`];
//! - [`controller`] owns a run: it starts the agents, hands out ranks,
//!   supervises the workers and writes the run directory;
//! - [`agent`] spawns and watches the workers of one host; [`leftovers`]
//!   and [`cgroup`] see that nothing a worker starts outlives it;
//! - [`worker_env`] is what each worker is started with (the environment
//!   contract and its credential).
//!
//! The one authenticated TCP protocol they all speak, and the run token it
//! is keyed by, are the crate `meshrun-protocol`; the worker's side of it,
//! inside the user's Python process, is the crate `meshrun-worker`, which
//! builds without this one.

pub mod agent;
pub mod cgroup;
pub mod controller;
pub mod error;
pub mod gpu;
pub mod launcher_env;
pub mod leftovers;
pub mod limits;
pub mod plan;
pub mod process;
pub mod rundir;
pub mod worker_env;

pub use controller::{execute, ExecOptions, Outcome, OutcomeStatus, StopHandle};
pub use error::{CoreError, UsageError};
pub use plan::{Entry, FailurePolicy, PlatformChoice, RayTarget, RunPlan, RunSpec, Tee};
