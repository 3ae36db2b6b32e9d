//! Why a rank failed: recorded in `run.json` and `events.jsonl`, worded
//! once here for the failure summary, `meshrun runs` and the report.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::memory::{Bytes, Limit, StateNeed};

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(sig)) => {
                let name = nix::sys::signal::Signal::try_from(sig)
                    .map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_string());
                write!(f, "signal {sig} ({name})")
            }
            (None, None) => f.write_str("unknown exit"),
        }
    }
}

/// Why a rank (or host) failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// The user's code raised and meshrun's worker code reported it.
    Exception {
        exception: String,
        message: String,
        traceback: String,
    },
    /// The user's code called `sys.exit` with a non-zero code (reported
    /// at once: JAX's shutdown barrier may hold the process for minutes).
    SystemExit {
        code: i32,
        argument: String,
        traceback: String,
    },
    /// The process ended with a non-zero status or a signal.
    Exit { exit: ExitInfo },
    /// The process could not be started; `deterministic` when another
    /// attempt would meet the same (a folder or program missing on its
    /// host), so the run ends without one.
    SpawnFailed {
        error: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        deterministic: bool,
    },
    /// A host's agent went away with workers still running.
    AgentLost { host: u32, error: String },
    /// No `meshrun.report` from this rank for the hang timeout, or for the
    /// finish timeout after rank `after_finish_of` finished its program.
    Hang {
        secs: f64,
        last_step: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_finish_of: Option<u32>,
        /// Where each rank is in its calls of programs across processes
        /// (see `program`), when any were made.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        wavefront: String,
    },
    /// The process is there but its heartbeats stopped (frozen, stopped).
    Unresponsive { secs: f64 },
    /// Its connection to the controller broke while it was running.
    ConnectionLost,
    /// Its host went silent, agent and workers alike: the host is cut off
    /// from the controller (its network down, its machine gone).
    HostUnreachable { host: u32, ip: String, secs: f64 },
    /// No step reported within the start timeout while the cluster held
    /// back resources the run asked for (`waiting`, as Ray described it).
    StartTimeout { secs: f64, waiting: String },
    /// It ran out of memory: the kernel's out-of-memory killer ended it
    /// (`killed`), or XLA could not allocate (`allocation`, its
    /// `RESOURCE_EXHAUSTED` with `message` and `traceback`).
    OutOfMemory {
        host: u32,
        how: OomHow,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        need: Option<StateNeed>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        traceback: String,
    },
    /// The ranks' programs parted: at call `call` of the programs that
    /// span every process, this rank ran one that rank `other` did not run
    /// with it (another program, or none: `other` had finished its
    /// program). `detail` says what each ran and what differs.
    ProgramsParted {
        call: u64,
        other: u32,
        detail: String,
    },
}

/// How a rank ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomHow {
    Killed,
    Allocation,
}

/// The longest piece of XLA's message a headline quotes.
const QUOTED_CHARS: usize = 160;

fn out_of_memory(
    host: u32,
    how: OomHow,
    limit: Option<u64>,
    peak: Option<u64>,
    need: Option<&StateNeed>,
    message: &str,
) -> String {
    let peak = peak.map_or_else(String::new, |p| format!(", its peak {}", Bytes(p)));
    let mut s = match (how, limit) {
        (OomHow::Killed, Some(limit)) => format!(
            "ran out of memory on host {host}: the kernel's out-of-memory killer ended it at \
             its limit of {}{peak}",
            Limit(limit)
        ),
        (OomHow::Killed, None) => format!(
            "ran out of memory on host {host}: the kernel's out-of-memory killer ended it (no \
             limit was set: the host ran out{peak})"
        ),
        (OomHow::Allocation, limit) => {
            let first = message.lines().next().unwrap_or_default().trim();
            let quoted: String = first.chars().take(QUOTED_CHARS).collect();
            let cut = if quoted.len() < first.len() {
                "..."
            } else {
                ""
            };
            let limit =
                limit.map_or_else(String::new, |l| format!(" under its limit of {}", Limit(l)));
            format!("ran out of memory on host {host}: XLA could not allocate{limit}{peak} ({quoted}{cut})")
        }
    };
    match need {
        Some(need) => {
            s.push_str("; ");
            s.push_str(&need.words());
            if !need.fits.is_empty() {
                s.push_str("; ");
                s.push_str(&need.fits);
            }
        }
        None => s.push_str(
            "; what its state needs per device is not known: call \
             meshrun.sharding.describe(state) in the program to have it said here",
        ),
    }
    s
}

impl Cause {
    /// One line: "raised `ValueError`: boom", "exit code 3", ...
    pub fn headline(&self) -> String {
        match self {
            Cause::Exception {
                exception, message, ..
            } if message.is_empty() => format!("raised {exception}"),
            Cause::Exception {
                exception, message, ..
            } => format!("raised {exception}: {message}"),
            // Worded as the exit status it asked for, which the process may
            // never reach (meshrun stops it if JAX holds it at exit).
            Cause::SystemExit { code, argument, .. } => {
                format!("ended with exit code {code} (called sys.exit({argument}))")
            }
            Cause::Exit { exit } => format!("ended with {exit}"),
            Cause::SpawnFailed { error, .. } => format!("could not start: {error}"),
            Cause::AgentLost { host, error } => format!("lost its agent (host {host}): {error}"),
            Cause::Hang {
                secs,
                last_step,
                after_finish_of,
                wavefront,
            } => {
                let last = last_step.map_or_else(
                    || "before its first report".to_string(),
                    |s| format!("after step {s}"),
                );
                let mut words = match after_finish_of {
                    Some(first) => format!(
                        "hung: no report for {secs:.0} s ({last}) while rank {first} had \
                         finished its program; see where each rank was below"
                    ),
                    None => format!("hung: no report for {secs:.0} s ({last}); see the stacks"),
                };
                if !wavefront.is_empty() {
                    words.push_str("; ");
                    words.push_str(wavefront);
                }
                words
            }
            Cause::Unresponsive { secs } => {
                format!("stopped sending heartbeats for {secs:.0} s (frozen or stopped?)")
            }
            Cause::ConnectionLost => "lost its connection to the controller".to_string(),
            Cause::HostUnreachable { host, ip, secs } => {
                format!("is on host {host} ({ip}), unreachable for {secs:.0} s")
            }
            Cause::OutOfMemory {
                host,
                how,
                limit,
                peak,
                need,
                message,
                ..
            } => out_of_memory(*host, *how, *limit, *peak, need.as_ref(), message),
            Cause::StartTimeout { secs, waiting } => format!(
                "reported no step in {secs:.0} s while the cluster held back resources: \
                 {waiting}; free them or add nodes, or raise --start-timeout"
            ),
            Cause::ProgramsParted { detail, .. } => {
                format!("{detail} (see docs/debugging.md)")
            }
        }
    }
}

impl Cause {
    /// Whether the headline names the rank's host itself ("is on host 1
    /// (10.0.0.12), ..."): a page that puts the host beside the rank then
    /// leaves it out, so that neither is said twice.
    pub fn names_host(&self) -> bool {
        matches!(
            self,
            Cause::AgentLost { .. } | Cause::HostUnreachable { .. } | Cause::OutOfMemory { .. }
        )
    }
}

impl Cause {
    /// Whether a restart would end the same way, whatever it restores: a
    /// fact of the hosts, not of the run's progress.
    pub fn restart_cannot_change(&self) -> bool {
        matches!(
            self,
            Cause::SpawnFailed {
                deterministic: true,
                ..
            } | Cause::ProgramsParted { .. }
        )
    }
}

/// The first failure of an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub rank: u32,
    pub host: u32,
    pub attempt: u32,
    pub cause: Cause,
    /// How the rank's process finally ended, when it is known.
    pub exit: Option<ExitInfo>,
}

/// The one-line cause of a failure read back from its JSON form; a kind
/// this version does not know is shown as it is.
pub fn headline_of(cause: &serde_json::Value) -> String {
    match serde_json::from_value::<Cause>(cause.clone()) {
        Ok(c) => c.headline(),
        Err(_) if cause.is_null() => "failed (no cause recorded)".to_string(),
        Err(_) => format!("failed: {cause}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn causes_read_back_as_the_summary_words_them() {
        let exc = json!({"kind": "exception", "exception": "ValueError", "message": "boom", "traceback": "..."});
        assert_eq!(headline_of(&exc), "raised ValueError: boom");
        let exit = json!({"kind": "exit", "exit": {"code": 3, "signal": null}});
        assert_eq!(headline_of(&exit), "ended with exit code 3");
        let hang = json!({"kind": "hang", "secs": 30.0, "last_step": 7});
        assert!(headline_of(&hang).starts_with("hung: no report for 30 s (after step 7)"));
        let new_kind = json!({"kind": "cosmic_ray"});
        assert_eq!(headline_of(&new_kind), r#"failed: {"kind":"cosmic_ray"}"#);
        assert_eq!(headline_of(&Value::Null), "failed (no cause recorded)");
    }

    #[test]
    fn a_signal_is_named() {
        let killed = ExitInfo {
            code: None,
            signal: Some(9),
        };
        assert_eq!(killed.to_string(), "signal 9 (SIGKILL)");
        assert!(!killed.success());
    }
}
