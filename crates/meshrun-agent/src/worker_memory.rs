//! A worker's memory: its limit (`--memory-per-proc`), what it uses and
//! has used at most, and whether the kernel's out-of-memory killer ended
//! one of its processes.
//!
//! Where the memory is counted depends on the machine:
//! - cgroup v2 with the memory controller enabled for this process's
//!   cgroup: the worker's own cgroup ([`crate::cgroup`]) gets `memory.max`
//!   and is read from `memory.current`, `memory.peak`, `memory.events`;
//! - else a cgroup v1 memory hierarchy this process may write to (a
//!   machine with cgroup v2 mounted but its controllers on v1): a cgroup
//!   per worker beside it, `memory.limit_in_bytes`, `memory.usage_in_bytes`,
//!   `memory.max_usage_in_bytes`, `memory.oom_control`;
//! - else, without a limit, the worker process's resident set from
//!   `/proc` (`VmRSS`, `VmHWM`). A limit asked for where neither cgroup
//!   works fails the worker's start with both reasons: running it
//!   unlimited would hide the very failure the limit is there to show.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use meshrun_protocol::FromAgent;
use meshrun_record::memory::{MemoryEnd, RankMemory};

use crate::cgroup::{self, WorkerCgroup};
use crate::leftovers::Contained;

/// How this agent limits and counts its workers' memory.
#[derive(Debug)]
pub enum MemoryControl {
    /// In the workers' own cgroup v2.
    V2,
    /// In a cgroup of its own per worker, under this v1 folder.
    V1 { base: PathBuf },
    /// Neither: why not (both reasons), said when a limit is asked for.
    None { why: String },
}

impl MemoryControl {
    /// Decides once per agent; `v2_base` is where worker cgroups v2 are
    /// made, when they are.
    pub fn detect(v2_base: Option<&Path>) -> Self {
        if let Some(v) = cgroup::turned_off() {
            return MemoryControl::None {
                why: format!("cgroups are turned off by {}={v}", cgroup::DISABLE_ENV),
            };
        }
        let v2 = match v2_base {
            Some(base) => v2_memory(base),
            None => Err("workers are not in cgroups v2".to_string()),
        };
        let v2_why = match v2 {
            Ok(()) => return MemoryControl::V2,
            Err(why) => why,
        };
        match v1_base() {
            Ok(base) => MemoryControl::V1 { base },
            Err(v1_why) => MemoryControl::None {
                why: format!("cgroup v2: {v2_why}; cgroup v1: {v1_why}"),
            },
        }
    }

    /// The memory of the worker of `rank` about to start in `v2` (its
    /// cgroup v2, if any), limited to `limit` bytes when given. An error
    /// says why the limit cannot be set.
    pub fn for_worker(
        &self,
        rank: u32,
        limit: Option<u64>,
        v2: Option<&WorkerCgroup>,
    ) -> Result<WorkerMemory, String> {
        let counted = match (self, v2) {
            (MemoryControl::V2, Some(cg)) => Counted::V2(cg.path().to_path_buf()),
            (MemoryControl::V1 { base }, _) => {
                let dir = cgroup::new_dir(base, rank).map_err(|(path, e)| {
                    format!("cannot make a cgroup v1 for it ({}): {e}", path.display())
                })?;
                Counted::V1 { dir, own: true }
            }
            (MemoryControl::V2, None) | (MemoryControl::None { .. }, _) => Counted::Proc,
        };
        let memory = WorkerMemory {
            counted,
            limit,
            peak: AtomicU64::new(0),
            pid: AtomicU64::new(0),
            oom_before: AtomicU64::new(0),
        };
        if let Some(bytes) = limit {
            if let Err(e) = memory.set_limit(bytes) {
                memory.remove();
                let why = match self {
                    MemoryControl::None { why } => why.clone(),
                    _ => e,
                };
                return Err(format!(
                    "cannot limit its memory to {bytes} bytes (--memory-per-proc, ScalingConfig.memory_per_worker): {why}"
                ));
            }
        }
        memory
            .oom_before
            .store(memory.oom_kills(), Ordering::Relaxed);
        Ok(memory)
    }
}

#[derive(Debug)]
enum Counted {
    V2(PathBuf),
    V1 { dir: PathBuf, own: bool },
    Proc,
}

/// One worker's memory.
#[derive(Debug)]
pub struct WorkerMemory {
    counted: Counted,
    limit: Option<u64>,
    /// The most seen by a sample (what `/proc` gives cannot be read once
    /// the process is gone).
    peak: AtomicU64,
    pid: AtomicU64,
    oom_before: AtomicU64,
}

impl WorkerMemory {
    /// The `cgroup.procs` a starting worker writes to join, besides its
    /// cgroup v2 (a v1 cgroup is another hierarchy).
    pub fn opener(&self) -> std::io::Result<Option<fs::File>> {
        match &self.counted {
            Counted::V1 { dir, .. } => fs::File::options()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map(Some),
            _ => Ok(None),
        }
    }

    /// The worker started (or a spare took the rank over) as `pid`; a
    /// spare is moved into the v1 cgroup here.
    pub fn started(&self, pid: u32, adopt: bool) -> std::io::Result<()> {
        self.pid.store(u64::from(pid), Ordering::Relaxed);
        match (&self.counted, adopt) {
            (Counted::V1 { dir, .. }, true) => {
                fs::write(dir.join("cgroup.procs"), pid.to_string().as_bytes())
            }
            _ => Ok(()),
        }
    }

    fn set_limit(&self, bytes: u64) -> Result<(), String> {
        let write = |dir: &Path, file: &str| {
            fs::write(dir.join(file), bytes.to_string())
                .map_err(|e| format!("cannot write {}: {e}", dir.join(file).display()))
        };
        match &self.counted {
            Counted::V2(dir) => {
                write(dir, "memory.max")?;
                // No swap to run into instead of the limit (absent where
                // the kernel has no swap accounting).
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                Ok(())
            }
            Counted::V1 { dir, .. } => {
                write(dir, "memory.limit_in_bytes")?;
                let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
                Ok(())
            }
            Counted::Proc => Err("no memory cgroup".into()),
        }
    }

    /// What the worker uses now and has used at most, in bytes; nothing
    /// once its processes are gone (an emptied cgroup reads 0 bytes, which
    /// is no figure of the worker's: its last sample stands).
    pub fn sample(&self, rank: u32) -> Option<RankMemory> {
        if let Counted::V2(dir) | Counted::V1 { dir, .. } = &self.counted {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).ok()?;
            if procs.trim().is_empty() {
                return None;
            }
        }
        let (current, peak) = match &self.counted {
            Counted::V2(dir) => (
                read_u64(&dir.join("memory.current"))?,
                read_u64(&dir.join("memory.peak")).unwrap_or(0),
            ),
            Counted::V1 { dir, .. } => (
                read_u64(&dir.join("memory.usage_in_bytes"))?,
                read_u64(&dir.join("memory.max_usage_in_bytes")).unwrap_or(0),
            ),
            Counted::Proc => {
                let pid = self.pid.load(Ordering::Relaxed);
                proc_rss(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)?
            }
        };
        let seen = peak.max(current);
        let peak = self.peak.fetch_max(seen, Ordering::Relaxed).max(seen);
        Some(RankMemory {
            rank,
            current,
            peak,
            limit: self.limit,
            device_current: None,
            device_peak: None,
        })
    }

    /// How the worker's memory ended; read once it has exited, before its
    /// cgroup goes.
    pub fn end(&self) -> MemoryEnd {
        let peak = match &self.counted {
            Counted::V2(dir) => read_u64(&dir.join("memory.peak")),
            Counted::V1 { dir, .. } => read_u64(&dir.join("memory.max_usage_in_bytes")),
            Counted::Proc => None,
        }
        .unwrap_or(0)
        .max(self.peak.load(Ordering::Relaxed));
        MemoryEnd {
            peak,
            limit: self.limit,
            oom_killed: self.oom_kills() > self.oom_before.load(Ordering::Relaxed),
        }
    }

    fn oom_kills(&self) -> u64 {
        let (path, key) = match &self.counted {
            Counted::V2(dir) => (dir.join("memory.events"), "oom_kill"),
            Counted::V1 { dir, .. } => (dir.join("memory.oom_control"), "oom_kill"),
            Counted::Proc => return 0,
        };
        fs::read_to_string(path)
            .ok()
            .and_then(|text| field(&text, key))
            .unwrap_or(0)
    }

    /// Removes a v1 cgroup made for the worker, once its processes are gone
    /// (the v2 one goes with the worker's containment).
    pub fn remove(&self) -> bool {
        match &self.counted {
            Counted::V1 { dir, own: true } => match fs::remove_dir(dir) {
                Ok(()) => true,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            },
            _ => true,
        }
    }
}

/// Sends a worker's memory every [`SAMPLE_EVERY`] heartbeats, and only
/// what moved (now or at most) by [`MOVED`] since it was last sent: a quiet
/// host sends nothing. The peak at a worker's exit comes with its exit.
#[derive(Debug, Default)]
pub struct Sampler {
    ticks: u32,
    sent: HashMap<u32, (u64, u64)>,
}

/// Heartbeats (of a second) between samples.
const SAMPLE_EVERY: u32 = 2;
/// Less movement than this is not news.
const MOVED: u64 = 1 << 20;

impl Sampler {
    /// Whether this heartbeat samples.
    pub fn due(&mut self) -> bool {
        self.ticks = self.ticks.wrapping_add(1);
        self.ticks.is_multiple_of(SAMPLE_EVERY)
    }

    /// On a heartbeat: when a sample is due, the message of the memory of
    /// `live` workers that moved.
    pub fn on_tick(&mut self, live: &HashMap<u32, Contained>) -> Option<FromAgent> {
        if live.is_empty() || !self.due() {
            return None;
        }
        let samples = live
            .iter()
            .filter_map(|(rank, w)| w.memory.as_ref()?.sample(*rank));
        let ranks = self.moved(samples);
        (!ranks.is_empty()).then_some(FromAgent::WorkerMemory { ranks })
    }

    /// The samples that moved since they were last sent.
    pub fn moved(&mut self, samples: impl IntoIterator<Item = RankMemory>) -> Vec<RankMemory> {
        samples
            .into_iter()
            .filter(|m| {
                // Measured from what was sent: a slow creep is sent too, once
                // it adds up.
                let moved = self.sent.get(&m.rank).is_none_or(|&(current, peak)| {
                    current.abs_diff(m.current) >= MOVED || peak.abs_diff(m.peak) >= MOVED
                });
                if moved {
                    self.sent.insert(m.rank, (m.current, m.peak));
                }
                moved
            })
            .collect()
    }
}

/// Whether the memory controller is on for cgroups made under `base`.
fn v2_memory(base: &Path) -> Result<(), String> {
    let subtree = base.join("cgroup.subtree_control");
    let on = |text: &str| text.split_whitespace().any(|c| c == "memory");
    let text = fs::read_to_string(&subtree)
        .map_err(|e| format!("cannot read {}: {e}", subtree.display()))?;
    if on(&text) {
        return Ok(());
    }
    let controllers = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    if !on(&controllers) {
        return Err(format!(
            "the memory controller is not delegated to {} (its cgroup.controllers: '{}')",
            base.display(),
            controllers.trim()
        ));
    }
    fs::write(&subtree, "+memory").map_err(|e| {
        format!(
            "cannot enable the memory controller in {}: {e}",
            subtree.display()
        )
    })
}

/// This process's cgroup v1 memory folder, where cgroups can be made.
fn v1_base() -> Result<PathBuf, String> {
    let own = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let path = v1_memory_path(&own).ok_or("no memory line in /proc/self/cgroup")?;
    let mount = v1_memory_mount(&mountinfo).ok_or("no cgroup v1 memory mount")?;
    let base = cgroup::resolve(&mount, path)
        .ok_or_else(|| format!("this process's memory cgroup '{path}' is not under its mount"))?;
    cgroup::remove_stale_in(&base);
    let probe = cgroup::new_dir(&base, u32::MAX)
        .map_err(|(path, e)| format!("cannot make a cgroup in {}: {e}", path.display()))?;
    let _ = fs::remove_dir(&probe);
    Ok(base)
}

/// The v1 memory hierarchy's path in a `/proc/<pid>/cgroup` text.
pub(crate) fn v1_memory_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path.trim_end())
    })
}

/// The cgroup v1 mount with the memory controller in a mountinfo text.
pub(crate) fn v1_memory_mount(mountinfo: &str) -> Option<cgroup::Mount> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split_whitespace();
        let (kind, options) = (fs.next()?, fs.nth(1)?);
        if kind != "cgroup" || !options.split(',').any(|o| o == "memory") {
            return None;
        }
        let fields: Vec<&str> = mount.split_whitespace().collect();
        Some(cgroup::Mount {
            root: (*fields.get(3)?).to_string(),
            point: PathBuf::from(*fields.get(4)?),
        })
    })
}

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status` text, in bytes.
pub(crate) fn proc_rss(status: &str) -> Option<(u64, u64)> {
    let kib = |key: &str| {
        status.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some((kib("VmRSS")? * 1024, kib("VmHWM").unwrap_or(0) * 1024))
}

/// The number after `key` in a `key value` per line text.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_memory_hierarchy_is_found() {
        let own = "9:name=systemd:/\n4:memory:/containers/abc\n0::/\n";
        assert_eq!(v1_memory_path(own), Some("/containers/abc"));
        assert_eq!(v1_memory_path("3:cpu,cpuacct:/x\n0::/\n"), None);
        let info = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let mount = v1_memory_mount(info).unwrap();
        assert_eq!(mount.point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(
            cgroup::resolve(&mount, "/containers/abc"),
            Some("/sys/fs/cgroup/memory/containers/abc".into())
        );
    }

    #[test]
    fn a_worker_whose_processes_are_gone_has_no_sample() {
        let dir = tempfile::tempdir().unwrap();
        for (file, text) in [
            ("memory.current", "4096\n"),
            ("memory.peak", "8192\n"),
            ("cgroup.procs", "42\n"),
        ] {
            fs::write(dir.path().join(file), text).unwrap();
        }
        let w = WorkerMemory {
            counted: Counted::V2(dir.path().to_path_buf()),
            limit: Some(1 << 30),
            peak: AtomicU64::new(0),
            pid: AtomicU64::new(42),
            oom_before: AtomicU64::new(0),
        };
        assert_eq!(w.sample(0).map(|m| (m.current, m.peak)), Some((4096, 8192)));
        // The worker exited: its cgroup is empty and reads 0 bytes.
        fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        fs::write(dir.path().join("memory.current"), "0\n").unwrap();
        assert_eq!(w.sample(0), None);
    }

    #[test]
    fn only_memory_that_moved_is_sent_again() {
        let m = |rank, current, peak| RankMemory {
            rank,
            current,
            peak,
            ..RankMemory::default()
        };
        let mut sampler = Sampler::default();
        assert!(!sampler.due());
        assert!(sampler.due());
        let first = sampler.moved([m(0, 100 << 20, 100 << 20), m(1, 50 << 20, 60 << 20)]);
        assert_eq!(first.len(), 2);
        let same = sampler.moved([m(0, (100 << 20) + 10, 100 << 20), m(1, 50 << 20, 60 << 20)]);
        assert!(same.is_empty(), "{same:?}");
        let moved = sampler.moved([m(0, 120 << 20, 120 << 20), m(1, 50 << 20, 60 << 20)]);
        assert_eq!(moved, vec![m(0, 120 << 20, 120 << 20)]);
        // A peak creeping by 600 KiB a sample: sent once it adds up to 1 MiB.
        let creep = |k: u64| m(1, 50 << 20, (60 << 20) + k * (600 << 10));
        assert!(sampler.moved([creep(1)]).is_empty());
        assert_eq!(sampler.moved([creep(2)]), vec![creep(2)]);
    }

    #[test]
    fn counts_are_read_from_their_files() {
        let status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(proc_rss(status), Some((100 << 20, 200 << 20)));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(field(v1, "oom_kill"), Some(2));
        let v2 = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(field(v2, "oom_kill"), Some(1));
        assert_eq!(field(v2, "oom"), Some(1));
    }
}
