//! The loader: cuts each global batch, keeps this process's slice, and
//! reads it in Rust threads ahead of the consumer.
//!
//! Global step `s` of epoch `e` covers positions `[i*B, (i+1)*B)` of that
//! epoch's permutation, where `i = s mod steps_per_epoch`; process `p` of `P`
//! takes the contiguous positions `[p*B/P, (p+1)*B/P)` of it. Without
//! `drop_last`, the final batch of an epoch runs past the data; those
//! positions are zero-filled and masked out. State is the global sample
//! offset `s*B`; any process count resumes from it.
//!
//! Thread `w` of `T` builds the steps `start + w, start + w + T, ...` into a
//! bounded channel of its own, and the consumer takes from the channels in
//! turn, so batches arrive in step order with no reordering buffer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::DataError;
use crate::order::Permutation;
use crate::source::Source;

#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub global_batch: u64,
    pub rank: u64,
    pub processes: u64,
    pub seed: u64,
    pub shuffle: bool,
    pub drop_last: bool,
    /// Batches read ahead, in all threads together.
    pub prefetch: usize,
    pub threads: usize,
    /// Global samples already consumed (a multiple of `global_batch`).
    pub start_offset: u64,
    /// Stop after this many epochs; `None` runs on.
    pub epochs: Option<u64>,
}

/// This process's slice of one global batch.
#[derive(Debug)]
pub struct Batch {
    pub step: u64,
    pub epoch: u64,
    /// One buffer per field: `local_batch * record_bytes` bytes.
    pub fields: Vec<Vec<u8>>,
    /// 1 for real records, 0 for padding (only without `drop_last`).
    pub mask: Vec<u8>,
    /// The record index of each row, -1 for padding.
    pub indices: Vec<i64>,
}

/// The geometry every thread shares.
struct Plan {
    source: Arc<dyn Source>,
    cfg: LoaderConfig,
    local: u64,
    steps_per_epoch: u64,
}

impl Plan {
    fn build(&self, step: u64) -> Result<Batch, DataError> {
        let epoch = step / self.steps_per_epoch;
        let first =
            (step % self.steps_per_epoch) * self.cfg.global_batch + self.cfg.rank * self.local;
        let n = self.source.records();
        let perm = Permutation::new(n, self.cfg.seed, epoch);
        let mut buffers: Vec<Vec<u8>> = self
            .source
            .fields()
            .iter()
            .map(|f| vec![0u8; f.record_bytes() * self.local as usize])
            .collect();
        let mut mask = vec![0u8; self.local as usize];
        let mut indices = vec![-1i64; self.local as usize];
        let mut rows = Vec::with_capacity(self.local as usize);
        for row in 0..self.local as usize {
            let position = first + row as u64;
            if position >= n {
                continue; // padding: zeros, mask 0
            }
            let record = if self.cfg.shuffle {
                perm.get(position)
            } else {
                position
            };
            rows.push((row, record));
            mask[row] = 1;
            indices[row] = record as i64;
        }
        self.source.read_rows(&rows, &mut buffers)?;
        Ok(Batch {
            step,
            epoch,
            fields: buffers,
            mask,
            indices,
        })
    }
}

/// Why [`Loader::next_timeout`] or [`Loader::try_next`] gave no batch.
#[derive(Debug)]
pub enum Wait {
    /// Not built yet: ask again.
    Pending,
    /// The batch could not be read (a storage error, a file changed): the
    /// loader stops there.
    Failed(DataError),
}

pub struct Loader {
    channels: Vec<Receiver<Result<Batch, DataError>>>,
    next_step: u64,
    start_step: u64,
    end_step: Option<u64>,
    global_batch: u64,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Loader {
    pub fn start(source: Arc<dyn Source>, cfg: &LoaderConfig) -> Result<Self, DataError> {
        let n = source.records();
        for (name, v) in [
            ("global_batch_size", cfg.global_batch),
            ("processes", cfg.processes),
            ("prefetch", cfg.prefetch as u64),
            ("threads", cfg.threads as u64),
        ] {
            if v == 0 {
                return Err(DataError::NotPositive(name, v));
            }
        }
        if cfg.rank >= cfg.processes {
            return Err(DataError::BadRank {
                rank: cfg.rank,
                processes: cfg.processes,
            });
        }
        if !cfg.global_batch.is_multiple_of(cfg.processes) {
            return Err(DataError::BatchNotDivisible {
                batch: cfg.global_batch,
                processes: cfg.processes,
            });
        }
        if n == 0 {
            return Err(DataError::Empty("no records".into()));
        }
        if cfg.drop_last && cfg.global_batch > n {
            return Err(DataError::BatchLargerThanData {
                batch: cfg.global_batch,
                records: n,
            });
        }
        let steps_per_epoch = if cfg.drop_last {
            n / cfg.global_batch
        } else {
            n.div_ceil(cfg.global_batch)
        };
        let start_step = cfg.start_offset / cfg.global_batch;
        let end_step = cfg.epochs.map(|e| e * steps_per_epoch);
        let threads_n = cfg.threads;
        let per_thread = cfg.prefetch.div_ceil(threads_n).max(1);
        let plan = Arc::new(Plan {
            local: cfg.global_batch / cfg.processes,
            source,
            steps_per_epoch,
            cfg: cfg.clone(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut channels = Vec::with_capacity(threads_n);
        let mut threads = Vec::with_capacity(threads_n);
        for w in 0..threads_n as u64 {
            let (tx, rx) = mpsc::sync_channel(per_thread);
            channels.push(rx);
            let plan = Arc::clone(&plan);
            let stop = Arc::clone(&stop);
            let handle = std::thread::Builder::new()
                .name(format!("meshrun-data-{w}"))
                .spawn(move || {
                    produce(
                        &plan,
                        start_step + w,
                        threads_n as u64,
                        end_step,
                        &tx,
                        &stop,
                    );
                })
                .map_err(DataError::io("cannot start loader thread", "meshrun-data"))?;
            threads.push(handle);
        }
        Ok(Self {
            channels,
            next_step: start_step,
            start_step,
            end_step,
            global_batch: cfg.global_batch,
            stop,
            threads,
        })
    }

    /// The next batch, waiting at most `timeout`. `Ok(None)` at the end of
    /// the last epoch; `Err(Wait::Pending)` when the wait timed out (call
    /// again); `Err(Wait::Failed)` when the batch could not be read.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Batch>, Wait> {
        if self.end_step.is_some_and(|end| self.next_step >= end) {
            return Ok(None);
        }
        let w = ((self.next_step - self.start_step) % self.channels.len() as u64) as usize;
        match self.channels[w].recv_timeout(timeout) {
            Ok(batch) => {
                self.next_step += 1;
                Ok(Some(batch.map_err(Wait::Failed)?))
            }
            Err(RecvTimeoutError::Timeout) => Err(Wait::Pending),
            Err(RecvTimeoutError::Disconnected) => Ok(None),
        }
    }

    /// The next batch if it is already built; `Err(Wait::Pending)` if it
    /// is not yet (then wait with [`Loader::next_timeout`]).
    pub fn try_next(&mut self) -> Result<Option<Batch>, Wait> {
        if self.end_step.is_some_and(|end| self.next_step >= end) {
            return Ok(None);
        }
        let w = ((self.next_step - self.start_step) % self.channels.len() as u64) as usize;
        match self.channels[w].try_recv() {
            Ok(batch) => {
                self.next_step += 1;
                Ok(Some(batch.map_err(Wait::Failed)?))
            }
            Err(mpsc::TryRecvError::Empty) => Err(Wait::Pending),
            Err(mpsc::TryRecvError::Disconnected) => Ok(None),
        }
    }

    /// Global samples consumed so far: the loader's whole state.
    pub fn offset(&self) -> u64 {
        self.next_step * self.global_batch
    }
}

fn produce(
    plan: &Plan,
    first: u64,
    stride: u64,
    end: Option<u64>,
    tx: &SyncSender<Result<Batch, DataError>>,
    stop: &AtomicBool,
) {
    let mut next = first;
    while !stop.load(Ordering::Relaxed) && end.is_none_or(|e| next < e) {
        let built = plan.build(next);
        let failed = built.is_err();
        if tx.send(built).is_err() || failed {
            return;
        }
        next += stride;
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receivers unblocks producers waiting on a full channel.
        self.channels.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Dtype, Field};

    /// Record i is the u32 value i.
    struct Counting(u64, Vec<Field>);

    impl Counting {
        fn with_records(n: u64) -> Arc<dyn Source> {
            Arc::new(Self(
                n,
                vec![Field {
                    name: "i".into(),
                    dtype: Dtype::U32,
                    shape: vec![],
                }],
            ))
        }
    }

    impl Source for Counting {
        fn records(&self) -> u64 {
            self.0
        }
        fn fields(&self) -> &[Field] {
            &self.1
        }
        fn read(&self, index: u64, out: &mut [&mut [u8]]) -> Result<(), DataError> {
            out[0].copy_from_slice(&(index as u32).to_le_bytes());
            Ok(())
        }
        fn fingerprint(&self) -> &'static str {
            "counting"
        }
    }

    fn cfg(batch: u64, rank: u64, processes: u64) -> LoaderConfig {
        LoaderConfig {
            global_batch: batch,
            rank,
            processes,
            seed: 7,
            shuffle: true,
            drop_last: true,
            prefetch: 4,
            threads: 2,
            start_offset: 0,
            epochs: Some(1),
        }
    }

    fn drain(source: &Arc<dyn Source>, c: &LoaderConfig) -> Vec<Vec<i64>> {
        let mut l = Loader::start(Arc::clone(source), c).unwrap();
        let mut out = Vec::new();
        while let Some(b) = l.next_timeout(Duration::from_secs(10)).unwrap() {
            out.push(b.indices);
        }
        out
    }

    #[test]
    fn every_record_once_per_epoch_across_processes() {
        let src = Counting::with_records(1000);
        let mut seen: Vec<i64> = (0..4)
            .flat_map(|r| drain(&src, &cfg(40, r, 4)).concat())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn global_batches_do_not_depend_on_process_count() {
        let src = Counting::with_records(500);
        let one = drain(&src, &cfg(20, 0, 1));
        for p in [2, 4] {
            let parts: Vec<Vec<Vec<i64>>> = (0..p).map(|r| drain(&src, &cfg(20, r, p))).collect();
            for (step, whole) in one.iter().enumerate() {
                let joined: Vec<i64> = parts.iter().flat_map(|r| r[step].clone()).collect();
                assert_eq!(&joined, whole, "step {step} with {p} processes");
            }
        }
    }

    #[test]
    fn resume_equals_the_uninterrupted_stream() {
        let src = Counting::with_records(300);
        let mut c = cfg(10, 0, 1);
        c.epochs = Some(2);
        let whole = drain(&src, &c);
        c.start_offset = 170;
        let resumed = drain(&src, &c);
        assert_eq!(resumed, whole[17..]);
    }

    #[test]
    fn padding_is_masked() {
        let src = Counting::with_records(25);
        let mut c = cfg(10, 0, 1);
        c.drop_last = false;
        let mut l = Loader::start(Arc::clone(&src), &c).unwrap();
        let mut last = None;
        while let Some(b) = l.next_timeout(Duration::from_secs(5)).unwrap() {
            last = Some(b);
        }
        let last = last.unwrap();
        assert_eq!(last.mask, vec![1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
        assert!(last.indices[5..].iter().all(|i| *i == -1));
    }

    #[test]
    fn bad_requests_are_refused() {
        let src = Counting::with_records(25);
        let e = Loader::start(Arc::clone(&src), &cfg(10, 0, 3))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not divisible by the 3 processes"), "{e}");
        let e = Loader::start(Arc::clone(&src), &cfg(30, 0, 1))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("larger than the data set (25 records)"), "{e}");
    }
}
