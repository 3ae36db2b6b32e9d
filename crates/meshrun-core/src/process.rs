//! Child processes as whole trees: every worker (and agent) leads its own
//! process group, so stopping it stops whatever it started too, and a
//! Ctrl-C at the terminal reaches meshrun alone, which then decides.

use std::process::ExitStatus;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::protocol::ExitInfo;

/// Sends `signal` to the process group led by `pid`. A group that is
/// already gone is not an error: stopping is idempotent.
pub fn signal_group(pid: u32, signal: Signal) {
    let _ = killpg(Pid::from_raw(pid as i32), signal);
}

/// Sends `signal` to the process `pid` alone.
pub fn signal_process(pid: u32, signal: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), signal);
}

pub fn exit_info(status: ExitStatus) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    ExitInfo {
        code: status.code(),
        signal: status.signal(),
    }
}
