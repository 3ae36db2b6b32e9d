//! Child processes as whole trees: every worker (and agent) leads its own
//! process group, so stopping it stops whatever it started too, and a
//! Ctrl-C at the terminal reaches meshrun alone, which then decides.

use std::process::ExitStatus;

use meshrun_protocol::ExitInfo;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

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

/// Whether a process with this pid exists (a zombie included).
pub fn process_exists(pid: u32) -> bool {
    !matches!(
        kill(Pid::from_raw(pid as i32), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// One line of `/proc/<pid>/stat`, the fields meshrun needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub ppid: u32,
    pub pgrp: u32,
    pub zombie: bool,
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may
/// itself hold spaces and parentheses, so the fields are read after the
/// last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let (head, tail) = text.rsplit_once(')')?;
    let pid = head.split_once(' ')?.0.parse().ok()?;
    let mut fields = tail.split_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        ppid: parent,
        pgrp: group,
        zombie: state == "Z" || state == "X",
    })
}

/// Every process this process can see.
pub fn processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|text| parse_stat(&text))
        .collect()
}

/// The live members of process group `pgid` (its leader may be gone).
pub fn group_members(pgid: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|p| p.pgrp == pgid && !p.zombie)
        .map(|p| p.pid)
        .collect()
}

/// Whether `pid` has a handler for `signal` (its `SigCgt` mask in
/// `/proc/PID/status`). A signal without one may end the process: meshrun
/// sends SIGUSR1 for a worker's stacks only to a worker that catches it
/// (one still importing has not installed the handler yet).
pub fn catches(pid: u32, signal: Signal) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .as_deref()
        .and_then(caught_mask)
        .is_some_and(|mask| mask & (1u64 << (signal as i32 - 1)) != 0)
}

fn caught_mask(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The value of `name` in the environment `pid` was started with, when
/// it can be read (same user, or root).
pub fn start_env(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env_value(&environ, name)
}

fn env_value(environ: &[u8], name: &str) -> Option<String> {
    environ.split(|b| *b == 0).find_map(|entry| {
        let rest = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(rest).into_owned())
    })
}

/// Makes this process the one that inherits the orphans among its
/// descendants (instead of init), so a worker's children that left its
/// process group can still be found. Only for a process that is an agent
/// and nothing else: it must then reap them, see [`reap`].
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// Collects the exit of child `pid` if it has ended; true if it was reaped
/// (or is no child of ours any more).
pub fn reap(pid: u32) -> bool {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    !matches!(
        waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::StillAlive)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_signal_is_read_from_the_status_mask() {
        // SIGUSR1 is signal 10: bit 9.
        let status = "Name:\tpython\nSigIgn:\t0000000001001000\nSigCgt:\t0000000180000202\n";
        let mask = caught_mask(status).unwrap();
        assert_ne!(mask & (1 << 9), 0);
        assert_eq!(mask & (1 << 14), 0, "SIGTERM (15) is not caught here");
        // This test process does not catch SIGUSR1.
        assert!(!catches(std::process::id(), Signal::SIGUSR1));
    }

    #[test]
    fn stat_fields_come_after_the_last_parenthesis() {
        let text = "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 120 0 0 0";
        assert_eq!(
            parse_stat(text),
            Some(ProcStat {
                pid: 4242,
                ppid: 17,
                pgrp: 4242,
                zombie: false
            })
        );
        assert!(parse_stat("7 (x) Z 1 7 7 0").unwrap().zombie);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_stat_parses() {
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        let stat = parse_stat(&me).unwrap();
        assert_eq!(stat.pid, std::process::id());
        assert_eq!(stat.ppid, nix::unistd::getppid().as_raw() as u32);
    }

    #[test]
    fn environment_values_are_matched_by_whole_name() {
        let environ = b"MESHRUN_RANKS=9\0MESHRUN_RANK=3\0X=a=b\0";
        assert_eq!(env_value(environ, "MESHRUN_RANK").as_deref(), Some("3"));
        assert_eq!(env_value(environ, "X").as_deref(), Some("a=b"));
        assert_eq!(env_value(environ, "Y"), None);
    }
}
