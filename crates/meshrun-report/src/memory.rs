//! The ranks' memory over the run, from `memory.jsonl`: one chart per rank
//! of its host memory in use (and its device's, where counted) against
//! its limit. A large run shows the ranks with the highest peaks.

use std::collections::BTreeMap;
use std::path::Path;

use meshrun_record::memory::MemoryRecord;
use meshrun_record::{names, read};

use crate::series::{downsample, Series};

/// How many ranks get a chart.
pub const MAX_CHARTS: usize = 8;

/// One rank's memory over the run (MiB against Unix seconds; one segment
/// per attempt).
#[derive(Debug, Clone, PartialEq)]
pub struct RankMemorySeries {
    pub rank: u32,
    pub host: Series,
    pub device: Series,
    pub peak: u64,
    pub limit: Option<u64>,
}

const MIB: f64 = 1_048_576.0;

/// Every rank's memory, the highest peaks first, at most [`MAX_CHARTS`];
/// lines that cannot be read are counted.
pub fn load(dir: &Path) -> (Vec<RankMemorySeries>, usize) {
    let mut ranks: BTreeMap<u32, (RankMemorySeries, u32)> = BTreeMap::new();
    let bad = read::jsonl_each(&dir.join(names::MEMORY), |line: MemoryRecord| {
        for m in line.ranks {
            let (r, attempt) = ranks.entry(m.rank).or_insert_with(|| {
                (
                    RankMemorySeries {
                        rank: m.rank,
                        host: Series {
                            name: "host memory in use".into(),
                            segments: Vec::new(),
                        },
                        device: Series {
                            name: "device memory in use".into(),
                            segments: Vec::new(),
                        },
                        peak: 0,
                        limit: None,
                    },
                    0,
                )
            });
            if *attempt != line.attempt || r.host.segments.is_empty() {
                r.host.segments.push(Vec::new());
                r.device.segments.push(Vec::new());
                *attempt = line.attempt;
            }
            #[allow(clippy::cast_precision_loss)]
            let mib = |b: u64| b as f64 / MIB;
            if m.current > 0 {
                if let Some(seg) = r.host.segments.last_mut() {
                    seg.push((line.time, mib(m.current)));
                }
            }
            if let (Some(d), Some(seg)) = (m.device_current, r.device.segments.last_mut()) {
                seg.push((line.time, mib(d)));
            }
            r.peak = r.peak.max(m.peak).max(m.device_peak.unwrap_or(0));
            r.limit = m.limit.or(r.limit);
        }
    })
    .unwrap_or(0);
    let mut out: Vec<RankMemorySeries> = ranks
        .into_values()
        .map(|(mut r, _)| {
            r.host.segments.retain(|s| !s.is_empty());
            r.device.segments.retain(|s| !s.is_empty());
            r.host = downsample(r.host);
            r.device = downsample(r.device);
            r
        })
        .collect();
    if out.len() > MAX_CHARTS {
        out.sort_by_key(|r| std::cmp::Reverse(r.peak));
        out.truncate(MAX_CHARTS);
        out.sort_by_key(|r| r.rank);
    }
    (out, bad)
}
