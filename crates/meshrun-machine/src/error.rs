//! Why an attempt cannot go on, as the machine decides it: the hosts did
//! not come, could not see the storage, or left before the start. The
//! controller's `AttemptError` carries it.

use std::path::PathBuf;

/// "host 2", "hosts 1, 3".
fn hosts_named(hosts: &[u32]) -> String {
    let list: Vec<String> = hosts.iter().map(u32::to_string).collect();
    match hosts.len() {
        1 => format!("host {}", list[0]),
        _ => format!("hosts {}", list.join(", ")),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("{} did not join within {secs} s: start `meshrun join` there (or give it more time with --join-timeout)", hosts_named(missing))]
    AgentTimeout { missing: Vec<u32>, secs: u64 },
    #[error(
        "only {} host(s) came within {secs} s ({}), and the run needs at least {min} of its \
         {max} (--hosts {min}:{max}){rule}: start `meshrun join` on more hosts, or give a lower MIN",
        had.len(),
        if had.is_empty() { "none".to_string() } else { had.join(", ") }
    )]
    TooFewHosts {
        /// Each host there, as `host R (ADDRESS)`.
        had: Vec<String>,
        min: u32,
        max: u32,
        secs: u64,
        /// Why enough hosts were still too few (no count divides MAX).
        rule: String,
    },
    #[error(
        "host {host} ({ip}) cannot see the run's storage '{}': {problem}. Every host must reach \
         the storage at the same path: put it on a shared filesystem mounted on every host \
         (NFS, Lustre, a bind-mounted volume) and pass it with --storage, or use object storage",
        storage.display()
    )]
    StorageNotShared {
        host: u32,
        ip: String,
        storage: PathBuf,
        problem: String,
    },
    #[error("agent of host {host} {what} before the run started")]
    AgentGone { host: u32, what: String },
}
