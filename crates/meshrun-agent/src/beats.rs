//! This host's workers' heartbeats: each worker overwrites its file
//! (`names::beat_file`) with the time every second it has nothing else to
//! send, and the agent names, once a second, the ranks whose file moved.
//! One message per host replaces one heartbeat per rank: at 10,000 ranks
//! on hosts of 8, 1,250 messages a second instead of 10,000.

use std::collections::HashMap;
use std::path::PathBuf;

/// Reads the heartbeat files of one attempt on this host.
pub struct BeatReader {
    dir: PathBuf,
    /// rank -> the last time read from its file.
    seen: HashMap<u32, u64>,
}

impl BeatReader {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            seen: HashMap::new(),
        }
    }

    /// The ranks whose heartbeat moved since the last call, in order.
    pub fn moved(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let Some(rank) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("rank-"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(bytes) = std::fs::read(entry.path()) else {
                continue;
            };
            let Some(time) = bytes
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
            else {
                continue;
            };
            if self.seen.insert(rank, time) != Some(time) {
                out.push(rank);
            }
        }
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshrun_record::names::beat_file;

    #[test]
    fn a_rank_is_named_once_per_beat_and_a_silent_one_not_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("beats");
        let mut reader = BeatReader::new(dir.clone());
        assert!(reader.moved().is_empty(), "no folder yet");
        std::fs::create_dir_all(&dir).unwrap();
        let beat =
            |rank: u32, t: u64| std::fs::write(beat_file(&dir, rank), t.to_le_bytes()).unwrap();
        beat(3, 10);
        beat(1, 10);
        std::fs::write(dir.join("rank-9"), b"half").unwrap();
        assert_eq!(reader.moved(), vec![1, 3], "a torn file is not a beat");
        assert!(reader.moved().is_empty(), "nothing moved");
        beat(3, 11);
        assert_eq!(reader.moved(), vec![3], "rank 1 is silent");
    }
}
