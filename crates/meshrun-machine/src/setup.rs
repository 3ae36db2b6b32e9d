//! What an attempt is started with, besides the plan.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What the attempt was started with, besides the plan.
#[derive(Debug, Clone)]
pub struct Setup {
    pub attempt: u32,
    pub run_id: String,
    pub token_hex: String,
    pub control_addr: String,
    /// The `XLA_FLAGS` of the controller's environment, merged into the
    /// workers' (read by the driver: the machine reads no environment).
    pub user_xla_flags: Option<String>,
    /// The checkpoint step this attempt resumes from.
    pub resume_step: Option<u64>,
    /// How long the agents may take to join.
    pub join_timeout: Duration,
    /// The pickled function of `Trainer.fit`, sent to every agent.
    pub payload: Option<Arc<[u8]>>,
    /// A marker the controller wrote into the run's storage, which every
    /// agent must read back before anything is launched.
    pub storage_probe: Option<StorageProbe>,
    /// Joined agents get ranks from 1: host 0 is the controller's own.
    pub first_joined_host: u32,
    /// A memory checkpoint an earlier attempt committed, newer than (or
    /// as new as) `resume_step`: restored instead when every host can
    /// make it whole.
    pub memory_step: Option<u64>,
    /// Elastic runs: the host count the attempt before ran on.
    pub previous_hosts: Option<u32>,
    /// Elastic runs: the hosts that make the attempt start without waiting
    /// for the rest (`None`: all of them). A restart expects as many as
    /// the attempt before, or as many as it stopped to grow to.
    pub expected_hosts: Option<u32>,
    /// Why the attempt runs on another host count than the one before
    /// (set by the machine when it sizes the attempt).
    pub resize_reason: Option<String>,
}

/// See [`Setup::storage_probe`].
#[derive(Debug, Clone)]
pub struct StorageProbe {
    /// The storage folder, as the user named it (for messages).
    pub storage: PathBuf,
    /// The marker file in it.
    pub path: PathBuf,
    /// What the marker holds.
    pub expect: String,
}
