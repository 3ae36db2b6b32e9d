//! When this host's workers reached their steps: each appends records to
//! its file in the run's scratch folder (`names::step_file`), and the agent
//! reads what is new once a second and sends it in one message, brought
//! onto the controller's clock. Straggler detection (the controller's
//! `stragglers`) rests on these times; a message per host keeps their cost
//! flat in the number of ranks per host.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use meshrun_record::names::STEP_RECORD_BYTES;

/// The most records one message carries; the rest wait for the next.
const MAX_PER_MESSAGE: usize = 20_000;

/// Reads the step files of one attempt on this host.
pub struct StepReader {
    dir: PathBuf,
    /// rank -> bytes already read.
    offsets: HashMap<u32, u64>,
}

impl StepReader {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            offsets: HashMap::new(),
        }
    }

    /// The records written since the last call, as `(rank, step, ns)` with
    /// `offset_ns` added to the times.
    pub fn read_new(&mut self, offset_ns: i64) -> Vec<(u32, u64, i64)> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rank) = name
                .to_str()
                .and_then(|n| n.strip_prefix("rank-"))
                .and_then(|n| n.strip_suffix(".bin"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let at = self.offsets.entry(rank).or_insert(0);
            let room = MAX_PER_MESSAGE.saturating_sub(out.len());
            if room == 0 {
                break;
            }
            let Ok(bytes) = read_from(&entry.path(), *at, room * STEP_RECORD_BYTES) else {
                continue;
            };
            // Only whole records: a write in progress is read next time.
            let whole = bytes.len() / STEP_RECORD_BYTES * STEP_RECORD_BYTES;
            *at += whole as u64;
            for r in bytes[..whole].chunks_exact(STEP_RECORD_BYTES) {
                let step = u64::from_le_bytes(r[..8].try_into().unwrap_or_default());
                let ns = i64::from_le_bytes(r[8..].try_into().unwrap_or_default());
                out.push((rank, step, ns.saturating_add(offset_ns)));
            }
        }
        out
    }
}

/// Up to `limit` bytes of `path` from `offset`.
fn read_from(path: &std::path::Path, offset: u64, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.take(limit as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The offset from this host's clock to the controller's, from probes
/// answered at once: each answer says the controller's time somewhere
/// within the round trip, so the estimate with the shortest round trip
/// is the tightest (as NTP's clock filter keeps it). Only the newest
/// samples are weighed, so that a clock that drifts or is stepped is
/// followed within a window rather than held to its first best sample.
#[derive(Debug, Default)]
pub struct ClockOffset {
    /// (round trip, offset) of the newest samples, in ns.
    recent: std::collections::VecDeque<(i64, i64)>,
    samples: u32,
}

/// Samples weighed: at one probe every 10 heartbeats, about 80 s (a clock
/// off by 50 ppm drifts 4 ms in that time).
const CLOCK_WINDOW: usize = 8;

impl ClockOffset {
    /// An answer to a probe sent at `sent_ns`, received at `now_ns`.
    pub fn sample(&mut self, sent_ns: i64, controller_ns: i64, now_ns: i64) {
        let rtt = now_ns.saturating_sub(sent_ns);
        if rtt < 0 {
            return;
        }
        let offset = controller_ns.saturating_sub(sent_ns.saturating_add(rtt / 2));
        self.samples = self.samples.saturating_add(1);
        if self.recent.len() == CLOCK_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back((rtt, offset));
    }

    /// Add to this host's times to get the controller's (0 until the
    /// first answer).
    pub fn offset_ns(&self) -> i64 {
        // The newest of equally short round trips.
        self.recent
            .iter()
            .rev()
            .min_by_key(|(rtt, _)| *rtt)
            .map_or(0, |(_, o)| *o)
    }

    /// Whether to probe at this heartbeat: every one of the first few,
    /// then one in ten (clocks drift slowly).
    pub fn due(&self, heartbeat: u64) -> bool {
        self.samples < 5 || heartbeat.is_multiple_of(10)
    }
}

/// Unix time in ns on this host's clock.
pub fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn record(step: u64, ns: i64) -> Vec<u8> {
        [step.to_le_bytes(), ns.to_le_bytes()].concat()
    }

    #[test]
    fn only_new_whole_records_are_read_and_shifted_onto_the_controllers_clock() {
        let dir = tempfile::tempdir().unwrap();
        let path = meshrun_record::names::step_file(dir.path(), 3);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&record(1, 1_000)).unwrap();
        f.write_all(&record(2, 2_000)[..10]).unwrap();
        let mut reader = StepReader::new(dir.path().to_path_buf());
        assert_eq!(reader.read_new(5), vec![(3, 1, 1_005)]);
        f.write_all(&record(2, 2_000)[10..]).unwrap();
        f.write_all(&record(3, 3_000)).unwrap();
        assert_eq!(reader.read_new(5), vec![(3, 2, 2_005), (3, 3, 3_005)]);
        assert!(reader.read_new(5).is_empty());
    }

    #[test]
    fn the_offset_comes_from_the_shortest_round_trip() {
        let mut c = ClockOffset::default();
        assert_eq!(c.offset_ns(), 0);
        // The controller is 1_000 ahead; a slow answer is skewed.
        c.sample(0, 1_000 + 50, 100);
        c.sample(200, 200 + 1_000 + 5, 210);
        c.sample(400, 400 + 1_000 + 900, 1_400);
        assert_eq!(c.offset_ns(), 1_000);
        assert!(c.due(7), "every heartbeat probes until 5 answers");
        c.sample(600, 600 + 1_000 + 40, 700);
        c.sample(800, 800 + 1_000 + 40, 900);
        assert_eq!(c.offset_ns(), 1_000);
        assert!(!c.due(7) && c.due(10));
    }

    #[test]
    fn a_clock_stepped_later_is_followed_within_the_window() {
        let mut c = ClockOffset::default();
        // A tight sample at first: 1_000 ahead.
        c.sample(0, 1_000 + 5, 10);
        // The host's clock is then stepped 500 back: every later sample,
        // looser, says 1_500.
        for i in 1..CLOCK_WINDOW as i64 {
            let sent = i * 1_000;
            c.sample(sent, sent + 1_500 + 20, sent + 40);
            assert_eq!(c.offset_ns(), 1_000, "the tight sample is in the window");
        }
        let sent = 100_000;
        c.sample(sent, sent + 1_500 + 20, sent + 40);
        assert_eq!(c.offset_ns(), 1_500, "the first sample has left the window");
    }
}
