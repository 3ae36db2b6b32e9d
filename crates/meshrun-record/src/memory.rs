//! A rank's memory: what it uses and has used at most, against its limit
//! (`--memory-per-proc`), on its host and on its devices; and what its
//! program's state needs per device (from `meshrun.sharding.describe`),
//! which an out-of-memory failure is explained with.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

/// One rank's memory at a moment (its peak so far included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankMemory {
    pub rank: u32,
    /// Host bytes in use: the worker's cgroup's count (its page cache
    /// included, as the limit counts it), else the worker's resident set.
    pub current: u64,
    /// The most host bytes it has used.
    pub peak: u64,
    /// Its limit, when the run set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Bytes in use on its first device and their peak, where the backend
    /// counts them (`device.memory_stats()`: GPUs and TPUs, not CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_current: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_peak: Option<u64>,
}

/// One line of `memory.jsonl`: ranks whose memory moved, at `time`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Unix seconds.
    pub time: f64,
    pub attempt: u32,
    pub ranks: Vec<RankMemory>,
}

/// How a worker's memory ended, as its agent read it once it exited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEnd {
    pub peak: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The kernel's out-of-memory killer ended a process of the worker's
    /// (its cgroup's `oom_kill` count went up).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

/// What a program's state needs on each device, as the worker's
/// `meshrun.sharding.describe` of it said, and what would fit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateNeed {
    /// Bytes on each device, in all and by top-level part (`params`,
    /// `opt`, ...), in the tree's order.
    pub per_device: u64,
    #[serde(default)]
    pub parts: Vec<(String, u64)>,
    /// Bytes of the whole state, unsharded.
    pub total: u64,
    /// The mesh the state was placed on, as `data=1 fsdp=4 tensor=1`.
    #[serde(default)]
    pub mesh: String,
    /// What the planner suggests, in words ("with fsdp=4 the state is
    /// 0.41 GiB per device, peak about 1.2 GiB"); empty when it has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fits: String,
}

impl StateNeed {
    /// "its state needs 1.80 GiB per device (params 0.45 GiB, opt 0.90
    /// GiB) on mesh data=1 fsdp=1 tensor=1"
    pub fn words(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(name, b)| format!("{name} {}", Bytes(*b)))
            .collect();
        let mut s = format!("its state needs {} per device", Bytes(self.per_device));
        if !parts.is_empty() {
            let _ = write!(s, " ({})", parts.join(", "));
        }
        if !self.mesh.is_empty() {
            let _ = write!(s, " on mesh {}", self.mesh);
        }
        s
    }
}

/// Bytes as a person reads them: `1.50 GiB`, `640 MiB`, `12 KiB`.
#[derive(Debug, Clone, Copy)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[allow(clippy::cast_precision_loss)]
        let b = self.0 as f64;
        if self.0 >= 1 << 30 {
            write!(f, "{:.2} GiB", b / f64::from(1u32 << 30))
        } else if self.0 >= 1 << 20 {
            write!(f, "{:.0} MiB", b / f64::from(1u32 << 20))
        } else if self.0 >= 1 << 10 {
            write!(f, "{:.0} KiB", b / 1024.0)
        } else {
            write!(f, "{} bytes", self.0)
        }
    }
}

/// A memory limit, said in the units it was most likely given in: one
/// that is a whole number of KiB reads as [`Bytes`] (`2560MiB` is
/// "2.50 GiB"); one in powers of 1000 (`2.5GB`) reads so, with its binary
/// reading beside it ("2.5 GB (2.33 GiB)"), never as a rounded power of
/// 1024 alone that the user never wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub u64);

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n.is_multiple_of(1024) || n < 1000 {
            return Bytes(n).fmt(f);
        }
        let (unit, name) = [(1_000_000_000, "GB"), (1_000_000, "MB"), (1_000, "KB")]
            .into_iter()
            .find(|(u, _)| n >= *u)
            .unwrap_or((1, "bytes"));
        #[allow(clippy::cast_precision_loss)]
        let text = format!("{:.3}", n as f64 / unit as f64);
        let text = text.trim_end_matches('0').trim_end_matches('.');
        write!(f, "{text} {name} ({})", Bytes(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_said_in_the_units_it_was_given_in() {
        assert_eq!(Limit(2560 << 20).to_string(), "2.50 GiB");
        assert_eq!(Limit(2_500_000_000).to_string(), "2.5 GB (2.33 GiB)");
        assert_eq!(Limit(3_000_000_000).to_string(), "3 GB (2.79 GiB)");
        assert_eq!(Limit(1_500_000).to_string(), "1.5 MB (1 MiB)");
        assert_eq!(Limit(512).to_string(), "512 bytes");
    }

    #[test]
    fn bytes_read_as_a_person_would() {
        assert_eq!(Bytes(3 << 29).to_string(), "1.50 GiB");
        assert_eq!(Bytes(640 << 20).to_string(), "640 MiB");
        assert_eq!(Bytes(12 << 10).to_string(), "12 KiB");
        assert_eq!(Bytes(12).to_string(), "12 bytes");
    }

    #[test]
    fn a_state_need_is_worded_with_its_parts_and_mesh() {
        let need = StateNeed {
            per_device: 3 << 29,
            parts: vec![("params".into(), 1 << 29), ("opt".into(), 1 << 30)],
            total: 3 << 29,
            mesh: "data=1 fsdp=1 tensor=1".into(),
            fits: String::new(),
        };
        assert_eq!(
            need.words(),
            "its state needs 1.50 GiB per device (params 512 MiB, opt 1.00 GiB) on mesh \
             data=1 fsdp=1 tensor=1"
        );
    }
}
