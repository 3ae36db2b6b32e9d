//! Load test of the controller (see `tests/load.rs`): the `fake-worker`
//! binary stands in for the Python interpreter a run starts, and speaks the
//! control protocol through the same Rust client the real workers use.

/// The environment the fake worker reads besides meshrun's own contract.
pub const RATE_ENV: &str = "MESHRUN_LOAD_RATE";
pub const SECONDS_ENV: &str = "MESHRUN_LOAD_SECONDS";
/// Where to connect instead of `MESHRUN_CONTROL_ADDR`: a test's proxy
/// between the worker and the controller.
pub const CONNECT_ENV: &str = "MESHRUN_LOAD_CONNECT";
/// A JSON object of metrics added to every record.
pub const METRICS_ENV: &str = "MESHRUN_LOAD_METRICS";
