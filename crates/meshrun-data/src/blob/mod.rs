//! The bytes of one data file, local or in object storage, read by range.
//!
//! A local file is memory-mapped. An object (`s3://bucket/key`, `gs://`,
//! `az://`) is read in blocks through the [`cache::BlockCache`] on the
//! scratch disk: [`Blob::prefetch`] fetches every missing block a batch
//! needs at once, many requests in flight, and [`Blob::read_at`] copies out
//! of the cache (fetching a block itself only if it was evicted in
//! between). Records, order and slicing are the sources' business and do
//! not change with where the bytes come from.

pub mod cache;

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;
use meshrun_store::{Client, Key, Location};

use crate::error::DataError;
use cache::BlockCache;

pub use meshrun_store::is_url;

pub enum Blob {
    /// A local file: mapped for record reads (token windows and rows are
    /// copied straight out of the page cache), read with `pread` for
    /// Parquet's pages, so that a data set larger than memory read through
    /// Parquet never becomes resident in the process by its mapping.
    Local {
        path: String,
        file: std::fs::File,
        mmap: Mmap,
    },
    Remote(Arc<Remote>),
}

pub struct Remote {
    client: Arc<Client>,
    key: Key,
    url: String,
    size: u64,
    id: u32,
    cache: Arc<BlockCache>,
    /// The whole data set fits in the cache: from the first read on, the
    /// file is streamed into it in the background, in order, since an
    /// epoch reads every byte of it anyway ([`Remote::sweep`]).
    sweep: bool,
    sweep_started: std::sync::Once,
}

/// How remote data is cached: made on the first remote file a source opens.
pub struct CacheConfig {
    /// Bytes of scratch disk; `None`: [`cache::default_capacity`].
    pub capacity: Option<u64>,
    cache: std::sync::OnceLock<Arc<BlockCache>>,
}

impl CacheConfig {
    pub fn new(capacity: Option<u64>) -> Self {
        Self {
            capacity,
            cache: std::sync::OnceLock::new(),
        }
    }

    /// The cache, made with blocks of `block` bytes if it does not exist.
    fn get(&self, block: u64) -> Result<Arc<BlockCache>, DataError> {
        if let Some(c) = self.cache.get() {
            return Ok(Arc::clone(c));
        }
        let dir = cache::scratch_dir().join(format!("meshrun-data-{}", nix::unistd::getuid()));
        let made = Arc::new(BlockCache::new(&dir, self.bytes(), block)?);
        Ok(Arc::clone(self.cache.get_or_init(|| made)))
    }

    /// The cache's size in bytes.
    fn bytes(&self) -> u64 {
        self.capacity
            .unwrap_or_else(|| cache::default_capacity(&cache::scratch_dir()))
    }

    /// Bytes fetched from storage so far by this source's files.
    pub fn fetched(&self) -> u64 {
        self.cache
            .get()
            .map_or(0, |c| c.fetched.load(std::sync::atomic::Ordering::Relaxed))
    }
}

const LARGE_BLOCK: u64 = 4 << 20;

/// Blocks the background sweep asks for at a time.
const SWEEP_ROUND: u64 = 2 * meshrun_store::remote::CONCURRENCY as u64;

/// Block size: large blocks (few requests, full bandwidth) when the data
/// fits in a cache of many of them, so that each byte is fetched once;
/// smaller ones when it does not, so that a shuffled read of a small record
/// does not fetch megabytes it will not use before they are evicted.
pub fn block_size(total: u64, capacity: u64) -> u64 {
    if total <= capacity && capacity / LARGE_BLOCK >= 64 {
        LARGE_BLOCK
    } else {
        256 << 10
    }
}

impl Blob {
    /// A local path or an object URL. `total` is the size of the whole data
    /// set the file belongs to (it picks the block size) or 0 if unknown.
    pub fn open(text: &str, cache: &CacheConfig, total: u64) -> Result<Self, DataError> {
        match Location::parse(text)? {
            Location::Local(path) => Self::local(&path),
            Location::Remote(dir) => {
                let url = dir.url();
                let size = dir
                    .client
                    .size(&dir.key)?
                    .ok_or_else(|| DataError::Missing(url.clone()))?;
                let cache = cache.get(block_size(total.max(size), cache.bytes()))?;
                let sweep = cache.block() >= LARGE_BLOCK && total.max(size) <= cache.capacity();
                Ok(Self::Remote(Arc::new(Remote {
                    client: dir.client,
                    key: dir.key,
                    url,
                    size,
                    id: cache.object_id(),
                    cache,
                    sweep,
                    sweep_started: std::sync::Once::new(),
                })))
            }
        }
    }

    pub fn local(path: &Path) -> Result<Self, DataError> {
        crate::source::check_exists(path)?;
        let file = std::fs::File::open(path).map_err(DataError::io("cannot open", path))?;
        // SAFETY: the file is opened read-only; meshrun never writes to a
        // data file it reads, and a file changed under a run is caught by
        // the fingerprint when the run resumes.
        #[allow(unsafe_code)]
        let mmap = unsafe { Mmap::map(&file) }.map_err(DataError::io("cannot map", path))?;
        Ok(Self::Local {
            path: path.display().to_string(),
            file,
            mmap,
        })
    }

    /// The path or URL, for messages.
    pub fn name(&self) -> &str {
        match self {
            Self::Local { path, .. } => path,
            Self::Remote(r) => &r.url,
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Self::Local { mmap, .. } => mmap.len() as u64,
            Self::Remote(r) => r.size,
        }
    }

    /// Bytes the block cache holds (unbounded for a local file).
    pub fn cache_room(&self) -> u64 {
        match self {
            Self::Local { .. } => u64::MAX,
            Self::Remote(r) => r.cache.capacity(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fetches what `ranges` need that is not cached (a no-op locally), as
    /// a batch about to be built needs it: the first such call on a file
    /// that fits in the cache also starts streaming the rest of it in.
    pub fn prefetch(&self, ranges: &[Range<u64>]) -> Result<(), DataError> {
        if let Self::Remote(r) = self {
            Remote::start_sweep(r);
        }
        self.fetch(ranges)
    }

    /// Fetches what `ranges` need that is not cached (a no-op locally),
    /// and nothing more.
    pub fn fetch(&self, ranges: &[Range<u64>]) -> Result<(), DataError> {
        match self {
            Self::Local { .. } => Ok(()),
            Self::Remote(r) => {
                let mut blocks: Vec<u64> = ranges
                    .iter()
                    .filter(|range| range.start < range.end)
                    .flat_map(|range| r.blocks(range))
                    .collect();
                blocks.sort_unstable();
                blocks.dedup();
                r.fetch_missing(&blocks)
            }
        }
    }

    /// Copies `out.len()` bytes starting at `offset`.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataError> {
        match self {
            Self::Local { mmap, .. } => {
                let start = usize::try_from(offset).expect("a mapped offset fits");
                out.copy_from_slice(&mmap[start..start + out.len()]);
                Ok(())
            }
            Self::Remote(r) => r.read_at(offset, out),
        }
    }

    /// `len` bytes from `offset`, as one buffer.
    pub fn bytes(&self, offset: u64, len: usize) -> Result<Bytes, DataError> {
        match self {
            Self::Local { file, path, .. } => {
                use std::os::unix::fs::FileExt;
                let mut out = vec![0u8; len];
                file.read_exact_at(&mut out, offset)
                    .map_err(DataError::io("cannot read", path.as_str()))?;
                Ok(out.into())
            }
            Self::Remote(r) => {
                r.prefetch_range(offset..offset + len as u64)?;
                let mut out = vec![0u8; len];
                r.read_at(offset, &mut out)?;
                Ok(out.into())
            }
        }
    }
}

impl Remote {
    fn start_sweep(me: &Arc<Self>) {
        if !me.sweep {
            return;
        }
        me.sweep_started.call_once(|| {
            let weak = Arc::downgrade(me);
            // A thread that cannot start only costs the read-ahead.
            let _ = std::thread::Builder::new()
                .name("meshrun-data-sweep".into())
                .spawn(move || Self::sweep(&weak));
        });
    }

    /// Streams every block of the file into the cache, in order, a round
    /// of requests at a time, skipping what the loader's threads have
    /// fetched or are fetching; ends with the file, or when the source is
    /// dropped. Its errors are left to the reads that need the blocks.
    fn sweep(weak: &std::sync::Weak<Self>) {
        block_signals();
        let mut next = 0;
        loop {
            let Some(me) = weak.upgrade() else { return };
            let blocks = me.size.div_ceil(me.cache.block());
            if next >= blocks {
                return;
            }
            let round: Vec<u64> = (next..(next + SWEEP_ROUND).min(blocks)).collect();
            next += SWEEP_ROUND;
            if me.fetch_missing(&round).is_err() {
                return;
            }
        }
    }

    fn blocks(&self, range: &Range<u64>) -> Range<u64> {
        let b = self.cache.block();
        range.start / b..range.end.min(self.size).div_ceil(b)
    }

    fn block_range(&self, block: u64) -> Range<u64> {
        let b = self.cache.block();
        block * b..((block + 1) * b).min(self.size)
    }

    fn prefetch_range(&self, range: Range<u64>) -> Result<(), DataError> {
        let blocks: Vec<u64> = self.blocks(&range).collect();
        self.fetch_missing(&blocks)
    }

    /// Fetches those of `blocks` that are neither cached nor being fetched
    /// by another thread, then waits for the ones that are: two loader
    /// threads that need the same block fetch it once. Each block goes into
    /// the cache as it arrives, and whoever waits for it goes on.
    fn fetch_missing(&self, blocks: &[u64]) -> Result<(), DataError> {
        let (mine, theirs) = self.cache.claim(self.id, blocks);
        // Warm reads (everything cached) end here, without a trip through
        // the storage runtime.
        if mine.is_empty() && theirs.is_empty() {
            return Ok(());
        }
        let mut landed = vec![false; mine.len()];
        let requests: Vec<_> = mine
            .iter()
            .map(|&b| (self.key.clone(), self.block_range(b)))
            .collect();
        let result = if requests.is_empty() {
            Ok(())
        } else {
            self.client.get_each(requests, |i, body: Bytes| {
                self.cache
                    .fetched
                    .fetch_add(body.len() as u64, std::sync::atomic::Ordering::Relaxed);
                let stored = self.cache.insert((self.id, mine[i]), &body);
                landed[i] = true;
                self.cache.landed(self.id, &mine[i..=i]);
                stored
            })
        };
        // A failed fetch releases the blocks it claimed: their waiters
        // fetch them themselves (and meet the error, if it lasts).
        let failed: Vec<u64> = mine
            .iter()
            .zip(&landed)
            .filter(|(_, done)| !**done)
            .map(|(&b, _)| b)
            .collect();
        self.cache.landed(self.id, &failed);
        self.cache.wait(self.id, &theirs);
        result
    }

    /// Fetches `blocks` (many requests in flight) into the cache, and
    /// returns them.
    fn fetch(&self, blocks: &[u64]) -> Result<Vec<Bytes>, DataError> {
        let requests = blocks
            .iter()
            .map(|&b| (self.key.clone(), self.block_range(b)))
            .collect();
        let bodies = self.client.get_many(requests)?;
        for (&b, body) in blocks.iter().zip(&bodies) {
            self.cache
                .fetched
                .fetch_add(body.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.cache.insert((self.id, b), body)?;
        }
        Ok(bodies)
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataError> {
        let b = self.cache.block();
        let mut done = 0usize;
        while done < out.len() {
            let at = offset + done as u64;
            let (block, within) = (at / b, at % b);
            let n = ((b - within) as usize).min(out.len() - done);
            let dst = &mut out[done..done + n];
            if !self.cache.read((self.id, block), within, dst) {
                // Not cached (never fetched, or evicted since): fetch it
                // now and copy from what came back.
                let body = self.fetch(&[block])?.remove(0);
                let start = within as usize;
                if body.len() < start + n {
                    return Err(DataError::Changed(self.url.clone()));
                }
                dst.copy_from_slice(&body[start..start + n]);
            }
            done += n;
        }
        Ok(())
    }
}

/// In a Python process, signals are for Python's main thread to take (see
/// the binding's `signals` module).
fn block_signals() {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
}

/// A `Read + Seek` over a blob (for header parsers and Parquet's footer).
pub struct Cursor {
    blob: Arc<Blob>,
    pos: u64,
}

impl Cursor {
    pub fn new(blob: Arc<Blob>, pos: u64) -> Self {
        Self { blob, pos }
    }

    pub fn position(&self) -> u64 {
        self.pos
    }
}

impl Read for Cursor {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.blob.len().saturating_sub(self.pos);
        // Bounded reads: a remote cursor fetches what is asked, and readers
        // of headers ask for a little at a time.
        let n = (buf.len() as u64).min(left).min(1 << 20) as usize;
        self.blob
            .read_at(self.pos, &mut buf[..n])
            .map_err(std::io::Error::other)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Cursor {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let len = self.blob.len();
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| std::io::Error::other("seek before the start"))?;
        Ok(self.pos)
    }
}
