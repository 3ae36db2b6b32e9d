//! The block cache of remote data on the host's scratch disk.
//!
//! Fixed-size slots in a few files, created unlinked in the scratch folder
//! (so nothing is left behind, whatever ends the process), hold the blocks
//! fetched from object storage; an LRU map says which block sits in which
//! slot. Reads copy out of a read-only mapping of the files (the page cache
//! keeps hot blocks in memory without the process holding them, and a warm
//! read is a copy, as out of a local file, not a system call), so the
//! cache's size is a bound on disk, not on the loader's memory.
//!
//! Slots are reused without a lock held over the I/O: each slot has a
//! generation, odd while it is being rewritten; a reader notes it before
//! copying and checks it after, and treats a change as a miss.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use lru::LruCache;
use memmap2::Mmap;

use crate::error::DataError;

/// Which block of which object: the object's number in this cache, and the
/// block's index in the object.
pub type BlockId = (u32, u64);

/// Files the slots are spread over.
const FILES: usize = 8;

pub struct BlockCache {
    /// Slot `s` lives in `files[s % FILES]`: writers of different slots
    /// rarely meet on one file's inode lock, which a buffered write holds
    /// for the whole copy (three fetchers writing one file spent a sixth of
    /// a cold epoch's CPU spinning on it).
    files: Vec<File>,
    /// The same files mapped, for reads.
    maps: Vec<Mmap>,
    dir: PathBuf,
    block: u64,
    slots: usize,
    inner: Mutex<Inner>,
    /// Signalled when blocks being fetched land (or their fetch fails).
    landed: Condvar,
    next_object: AtomicU64,
    /// Bytes fetched from storage (for benchmarks and the cache's report).
    pub fetched: AtomicU64,
}

struct Inner {
    map: LruCache<BlockId, usize>,
    /// Blocks some thread is fetching now: others wait for them rather
    /// than fetch them again.
    fetching: HashSet<BlockId>,
    generation: Vec<u64>,
    free: Vec<usize>,
}

/// The scratch folder: `MESHRUN_SCRATCH`, else the system's temporary one.
pub fn scratch_dir() -> PathBuf {
    std::env::var_os("MESHRUN_SCRATCH").map_or_else(std::env::temp_dir, PathBuf::from)
}

/// The default cache size: 4 GiB, or half the free space of `dir` if that
/// is less (at least 64 MiB).
pub fn default_capacity(dir: &Path) -> u64 {
    const DEFAULT: u64 = 4 << 30;
    let free = nix::sys::statvfs::statvfs(dir)
        .map_or(DEFAULT * 2, |s| s.blocks_available() * s.fragment_size());
    DEFAULT.min(free / 2).max(64 << 20)
}

impl BlockCache {
    /// A cache of `capacity` bytes in blocks of `block` bytes (at least
    /// 8 blocks) in `dir`.
    pub fn new(dir: &Path, capacity: u64, block: u64) -> Result<Self, DataError> {
        let slots = usize::try_from(capacity / block).unwrap_or(usize::MAX);
        if slots < 8 {
            return Err(DataError::CacheTooSmall {
                capacity,
                need: 8 * block,
            });
        }
        std::fs::create_dir_all(dir).map_err(DataError::io("cannot create", dir))?;
        let files = (0..FILES)
            .map(|_| tempfile::tempfile_in(dir))
            .collect::<Result<Vec<_>, _>>()
            .map_err(DataError::io("cannot create the data cache in", dir))?;
        // Sparse files of their full size, so that one mapping covers every
        // slot; the disk is used as blocks are written.
        let per_file = (slots.div_ceil(FILES) as u64) * block;
        let maps = files
            .iter()
            .map(|f| {
                f.set_len(per_file)?;
                // SAFETY: the files are this cache's own, unlinked, so no
                // other process can change them; a slot rewritten while it
                // is copied from is caught by its generation (see `read`).
                #[allow(unsafe_code)]
                unsafe {
                    Mmap::map(f)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(DataError::io("cannot map the data cache in", dir))?;
        Ok(Self {
            files,
            maps,
            dir: dir.to_path_buf(),
            block,
            slots,
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                fetching: HashSet::new(),
                generation: vec![0; slots],
                free: (0..slots).rev().collect(),
            }),
            landed: Condvar::new(),
            next_object: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
        })
    }

    /// The file that holds `slot`, and where in it.
    fn place(&self, slot: usize) -> (&File, u64) {
        let n = self.files.len();
        (&self.files[slot % n], (slot / n) as u64 * self.block)
    }

    pub fn block(&self) -> u64 {
        self.block
    }

    pub fn capacity(&self) -> u64 {
        self.slots as u64 * self.block
    }

    /// A number for a new object's blocks.
    pub fn object_id(&self) -> u32 {
        u32::try_from(self.next_object.fetch_add(1, Ordering::Relaxed)).expect("fewer objects")
    }

    pub fn contains(&self, id: BlockId) -> bool {
        self.inner.lock().expect("cache lock").map.contains(&id)
    }

    /// Of `blocks`, those neither cached nor being fetched, now marked as
    /// being fetched by the caller (who must [`BlockCache::landed`] them),
    /// and those another thread is fetching.
    pub fn claim(&self, object: u32, blocks: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let mut inner = self.inner.lock().expect("cache lock");
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        for &b in blocks {
            let id = (object, b);
            if inner.map.contains(&id) {
                continue;
            }
            if inner.fetching.insert(id) {
                mine.push(b);
            } else {
                theirs.push(b);
            }
        }
        (mine, theirs)
    }

    /// The claimed `blocks` are in the cache (or their fetch failed).
    pub fn landed(&self, object: u32, blocks: &[u64]) {
        let mut inner = self.inner.lock().expect("cache lock");
        for &b in blocks {
            inner.fetching.remove(&(object, b));
        }
        self.landed.notify_all();
    }

    /// Waits until none of `blocks` is being fetched.
    pub fn wait(&self, object: u32, blocks: &[u64]) {
        let mut inner = self.inner.lock().expect("cache lock");
        while blocks
            .iter()
            .any(|&b| inner.fetching.contains(&(object, b)))
        {
            inner = self.landed.wait(inner).expect("cache lock");
        }
    }

    /// Copies `out.len()` bytes from `offset` within block `id`; `false` if
    /// the block is not (or no longer) cached.
    pub fn read(&self, id: BlockId, offset: u64, out: &mut [u8]) -> bool {
        let (slot, generation) = {
            let mut inner = self.inner.lock().expect("cache lock");
            let Some(&slot) = inner.map.get(&id) else {
                return false;
            };
            (slot, inner.generation[slot])
        };
        let n = self.files.len();
        let at =
            usize::try_from((slot / n) as u64 * self.block + offset).expect("a mapped offset fits");
        let map = &self.maps[slot % n];
        // A copy through a raw pointer, not a slice: the bytes may be
        // rewritten meanwhile by `insert` (then the generation differs and
        // the copy is thrown away).
        assert!(at + out.len() <= map.len(), "a read within its slot");
        #[allow(unsafe_code)]
        // SAFETY: in bounds (checked above); `out` is the caller's own buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(map.as_ptr().add(at), out.as_mut_ptr(), out.len());
        }
        let inner = self.inner.lock().expect("cache lock");
        inner.generation[slot] == generation
    }

    /// Stores block `id`, evicting the least recently used one if full.
    pub fn insert(&self, id: BlockId, data: &[u8]) -> Result<(), DataError> {
        debug_assert!(data.len() as u64 <= self.block);
        let slot = {
            let mut inner = self.inner.lock().expect("cache lock");
            if inner.map.contains(&id) {
                return Ok(());
            }
            let slot = match inner.free.pop() {
                Some(s) => s,
                None => inner.map.pop_lru().expect("a full cache has blocks").1,
            };
            inner.generation[slot] += 1;
            slot
        };
        let (file, at) = self.place(slot);
        let written = file.write_all_at(data, at);
        let mut inner = self.inner.lock().expect("cache lock");
        inner.generation[slot] += 1;
        if let Err(e) = written {
            inner.free.push(slot);
            return Err(DataError::io("cannot write the data cache in", &self.dir)(
                e,
            ));
        }
        // Two threads that fetched the same block: keep one slot.
        if let Some(old) = inner.map.put(id, slot) {
            inner.free.push(old);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_back_and_the_least_recently_used_goes() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::new(dir.path(), 8 * 16, 16).unwrap();
        for b in 0..8u8 {
            c.insert((0, u64::from(b)), &[b; 16]).unwrap();
        }
        let mut out = [0u8; 4];
        assert!(c.read((0, 3), 2, &mut out));
        assert_eq!(out, [3; 4]);
        // Block 0 is the least recently used (3 was just read): it goes.
        c.insert((1, 0), &[9; 16]).unwrap();
        assert!(!c.read((0, 0), 0, &mut out));
        assert!(c.read((0, 3), 0, &mut out));
        assert!(c.read((1, 0), 12, &mut out));
        assert_eq!(out, [9; 4]);
        assert!(BlockCache::new(dir.path(), 7 * 16, 16).is_err());
    }
}
