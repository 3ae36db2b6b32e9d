//! A cgroup (v2) per worker, so that whatever a worker starts can be found
//! and ended when it ends, even processes that left its process group or
//! its session (`setsid`, `start_new_session=True`): membership of a cgroup
//! is inherited by every fork and cannot be dropped without privileges.
//!
//! Worker cgroups are made under the cgroup of the process that spawns the
//! workers (found from `/proc/self/cgroup` and the unified mount in
//! `/proc/self/mountinfo`), named `meshrun-<pid>-<n>-rank<r>` after the
//! spawning process. Where none can be made (no unified hierarchy, not
//! root and nothing delegated), [`Hierarchy::detect`] says why and the
//! caller falls back to process groups (see `leftovers`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::signal::Signal;

use crate::process::{process_exists, signal_process};

/// Set to `0` (or `off`) to keep workers out of cgroups, as on a machine
/// where none can be made (the process-group fallback is then used).
pub const DISABLE_ENV: &str = "MESHRUN_CGROUP";

const PREFIX: &str = "meshrun-";

/// Numbers the cgroups this process makes: with one host the agent lives
/// in the controller's process, and every attempt spawns new workers.
static NEXT: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("turned off by {DISABLE_ENV}={0}")]
    Disabled(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: &'static str,
        source: io::Error,
    },
    #[error("no cgroup2 file system is mounted (none in /proc/self/mountinfo)")]
    NoUnifiedMount,
    #[error("this process has no cgroup v2 path (no '0::' line in /proc/self/cgroup)")]
    NoOwnCgroup,
    #[error("this process's cgroup '{own}' is not under the cgroup2 mount's root '{root}'")]
    OutsideMount { own: String, root: String },
    #[error("cannot make a cgroup in {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
}

/// Where worker cgroups are made: this process's own cgroup.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    base: PathBuf,
}

impl Hierarchy {
    /// Finds this process's cgroup and checks that cgroups can be made in
    /// it and processes moved into them. Cgroups left by a process that
    /// no longer exists (a crashed agent) are ended and removed first.
    pub fn detect() -> Result<Self, CgroupError> {
        if let Some(v) = turned_off() {
            return Err(CgroupError::Disabled(v));
        }
        let read = |path: &'static str| {
            fs::read_to_string(path).map_err(|source| CgroupError::Read { path, source })
        };
        let mountinfo = read("/proc/self/mountinfo")?;
        let own = read("/proc/self/cgroup")?;
        let mount = unified_mount(&mountinfo).ok_or(CgroupError::NoUnifiedMount)?;
        let own = own_cgroup(&own).ok_or(CgroupError::NoOwnCgroup)?;
        let base = resolve(&mount, own).ok_or_else(|| CgroupError::OutsideMount {
            own: own.to_string(),
            root: mount.root.clone(),
        })?;
        let hierarchy = Hierarchy { base };
        hierarchy.remove_stale();
        // Moving a process needs write access to the cgroup.procs of the
        // common ancestor, which is this cgroup.
        let procs = hierarchy.base.join("cgroup.procs");
        nix::unistd::access(&procs, nix::unistd::AccessFlags::W_OK).map_err(|e| {
            CgroupError::Create {
                path: procs,
                source: e.into(),
            }
        })?;
        let probe = hierarchy.create(u32::MAX)?;
        probe.try_remove();
        Ok(hierarchy)
    }

    /// The cgroup worker cgroups are made in.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Makes a new, empty cgroup for the worker of `rank`.
    pub fn create(&self, rank: u32) -> Result<WorkerCgroup, CgroupError> {
        new_dir(&self.base, rank)
            .map(|dir| WorkerCgroup { dir })
            .map_err(|(path, source)| CgroupError::Create { path, source })
    }

    /// Ends and removes the worker cgroups whose maker is gone: their
    /// processes are leftovers nobody supervises.
    fn remove_stale(&self) {
        let Ok(entries) = fs::read_dir(&self.base) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name.to_str().and_then(owner_pid) else {
                continue;
            };
            if process_exists(owner) {
                continue;
            }
            let stale = WorkerCgroup { dir: entry.path() };
            let pids = stale.kill();
            for _ in 0..50 {
                if stale.try_remove() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // An empty one is housekeeping (a controller that was killed
            // left it); only processes it had to end are news.
            if pids.is_empty() {
                tracing::debug!(
                    cgroup = %stale.dir.display(),
                    "removed the empty cgroup of a meshrun process that no longer exists (pid {owner})"
                );
            } else {
                tracing::warn!(
                    cgroup = %stale.dir.display(),
                    "removed the cgroup of a meshrun process that no longer exists (pid {owner}); ended {} process(es) left in it: {pids:?}",
                    pids.len()
                );
            }
        }
    }
}

/// The value of [`DISABLE_ENV`] when it turns cgroups off.
pub(crate) fn turned_off() -> Option<String> {
    std::env::var(DISABLE_ENV)
        .ok()
        .filter(|v| matches!(v.as_str(), "0" | "off" | "false" | "no"))
}

/// Makes a new, empty cgroup folder for the worker of `rank` in `base`
/// (of either version), named after this process.
pub(crate) fn new_dir(base: &Path, rank: u32) -> Result<PathBuf, (PathBuf, io::Error)> {
    let pid = std::process::id();
    let mut tries = 0;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("{PREFIX}{pid}-{n}-rank{rank}"));
        tries += 1;
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            // Left by an earlier process with this pid: take the next.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 1000 => {}
            Err(source) => return Err((dir, source)),
        }
    }
}

/// Ends and removes the worker cgroups in `base` (of either version) whose
/// maker is gone.
pub(crate) fn remove_stale_in(base: &Path) {
    Hierarchy {
        base: base.to_path_buf(),
    }
    .remove_stale();
}

/// One worker's cgroup.
#[derive(Debug)]
pub struct WorkerCgroup {
    dir: PathBuf,
}

impl WorkerCgroup {
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Opens the file a process writes to join; the spawner keeps it open
    /// across the fork so the child joins with one `write` (see [`join`]).
    pub fn opener(&self) -> io::Result<File> {
        // std opens with O_CLOEXEC: the worker's program never sees it.
        File::options()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
    }

    /// Moves a running process (a warm spare taking over a rank) in.
    pub fn adopt(&self, pid: u32) -> io::Result<()> {
        self.opener()?.write_all(pid.to_string().as_bytes())
    }

    /// Every process in the cgroup and in any cgroup a member made below it.
    pub fn members(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        collect_members(&self.dir, &mut pids);
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// SIGKILLs every member (through `cgroup.kill` where the kernel has
    /// it, 5.14 and later, which also catches a process forked meanwhile)
    /// and returns the pids that were members.
    pub fn kill(&self) -> Vec<u32> {
        let pids = self.members();
        if pids.is_empty() {
            return pids;
        }
        let killed = File::options()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"));
        if killed.is_err() {
            // Older kernels: one by one, again while new ones appear.
            for _ in 0..10 {
                let now = self.members();
                if now.is_empty() {
                    break;
                }
                for pid in now {
                    signal_process(pid, Signal::SIGKILL);
                }
            }
        }
        pids
    }

    /// Removes the cgroup (and any below it) once no process is left in
    /// it; false while one still is. A cgroup already gone counts as
    /// removed.
    pub fn try_remove(&self) -> bool {
        remove_tree(&self.dir)
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is open
/// as `procs_fd` (`0` means the writer itself). Runs between fork and exec,
/// so it makes one raw system call and allocates nothing.
pub fn join(procs_fd: RawFd) -> io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: writes one byte from a static buffer to a descriptor the
    // parent opened and keeps open until the spawn returns.
    let n = unsafe { libc::write(procs_fd, b"0".as_ptr().cast(), 1) };
    if n == 1 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn collect_members(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    for sub in subdirs(dir) {
        collect_members(&sub, pids);
    }
}

fn remove_tree(dir: &Path) -> bool {
    for sub in subdirs(dir) {
        remove_tree(&sub);
    }
    match fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A cgroup2 mount: where it is mounted and which cgroup is its root (not
/// `/` when a container sees part of the host's hierarchy).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Mount {
    pub point: PathBuf,
    pub root: String,
}

/// The first cgroup2 mount in a `/proc/<pid>/mountinfo` text.
pub(crate) fn unified_mount(mountinfo: &str) -> Option<Mount> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        if fs.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = mount.split_whitespace().collect();
        Some(Mount {
            root: unescape(fields.get(3)?),
            point: PathBuf::from(unescape(fields.get(4)?)),
        })
    })
}

/// The cgroup v2 path in a `/proc/<pid>/cgroup` text (its `0::` line).
pub(crate) fn own_cgroup(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
        .filter(|p| p.starts_with('/'))
}

/// The directory of cgroup `own` under `mount`.
pub(crate) fn resolve(mount: &Mount, own: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        own
    } else {
        let rest = own.strip_prefix(mount.root.as_str())?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    Some(mount.point.join(rel.trim_start_matches('/')))
}

/// The pid of the process that made a worker cgroup, from its name.
pub(crate) fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, rest) = rest.split_once('-')?;
    rest.contains("-rank").then_some(())?;
    pid.parse().ok()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        if let (b'\\', Some(digits)) = (bytes[i], digits) {
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
31 25 0:27 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory
";

    #[test]
    fn the_unified_mount_is_found_among_v1_ones() {
        assert_eq!(
            unified_mount(HYBRID),
            Some(Mount {
                point: "/sys/fs/cgroup/unified".into(),
                root: "/".into()
            })
        );
        assert_eq!(
            unified_mount("42 31 0:39 / /x rw - cgroup cgroup rw,memory\n"),
            None
        );
    }

    #[test]
    fn optional_fields_and_escapes_do_not_confuse_the_parser() {
        let line = "50 30 0:40 /docker/abc /my\\040cg rw shared:3 master:1 - cgroup2 none rw\n";
        assert_eq!(
            unified_mount(line),
            Some(Mount {
                point: "/my cg".into(),
                root: "/docker/abc".into()
            })
        );
    }

    #[test]
    fn the_v2_line_of_proc_cgroup_is_used() {
        let text = "9:name=systemd:/\n4:memory:/x/y\n0::/user.slice/session-3.scope\n";
        assert_eq!(own_cgroup(text), Some("/user.slice/session-3.scope"));
        assert_eq!(own_cgroup("0::/\n"), Some("/"));
        assert_eq!(own_cgroup("4:memory:/x\n"), None);
    }

    #[test]
    fn own_cgroup_resolves_under_the_mount_root() {
        let host = Mount {
            point: "/sys/fs/cgroup".into(),
            root: "/".into(),
        };
        assert_eq!(resolve(&host, "/"), Some("/sys/fs/cgroup".into()));
        assert_eq!(resolve(&host, "/a/b"), Some("/sys/fs/cgroup/a/b".into()));
        let container = Mount {
            point: "/sys/fs/cgroup".into(),
            root: "/docker/abc".into(),
        };
        assert_eq!(
            resolve(&container, "/docker/abc"),
            Some("/sys/fs/cgroup".into())
        );
        assert_eq!(
            resolve(&container, "/docker/abc/w"),
            Some("/sys/fs/cgroup/w".into())
        );
        assert_eq!(resolve(&container, "/docker/abcd"), None);
        assert_eq!(resolve(&container, "/other"), None);
    }

    #[test]
    fn the_maker_is_read_from_the_name() {
        assert_eq!(owner_pid("meshrun-4242-7-rank3"), Some(4242));
        assert_eq!(owner_pid("meshrun-4242-0-rank4294967295"), Some(4242));
        assert_eq!(owner_pid("meshrun-x-0-rank1"), None);
        assert_eq!(owner_pid("other-4242-0-rank1"), None);
        assert_eq!(owner_pid("meshrun-4242"), None);
    }
}
