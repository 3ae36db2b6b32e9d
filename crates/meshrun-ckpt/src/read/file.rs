//! One shard file of a checkpoint, local (memory-mapped) or in an object
//! store (read by byte ranges): its tensors, their CRCs, and the checked
//! 1 MiB chunks a read needs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;
use object_store::path::Path as Key;
use safetensors::tensor::Metadata;
use safetensors::SafeTensors;

use crate::error::CkptError;
use crate::shard::CHUNK;
use crate::store::{Client, Location};

/// Chunks fetched in one request from an object store.
pub const CHUNKS_PER_REQUEST: usize = 8;

/// Consecutive chunks of one tensor and the byte range that holds them.
pub(super) type ChunkRun = (Vec<usize>, Range<u64>);

pub(super) enum Backing {
    Mapped(Mmap),
    Remote { client: Arc<Client>, key: Key },
}

pub(super) struct ShardFile {
    /// The file's path, or its URL, for messages.
    pub(super) path: PathBuf,
    pub(super) backing: Backing,
    /// tensor name -> absolute byte range in the file
    pub(super) tensors: HashMap<String, (usize, usize)>,
    pub(super) crcs: HashMap<String, Vec<u32>>,
}

/// A checked CRC chunk: where its bytes are.
pub(super) enum Chunk {
    /// In the memory map, at this absolute range.
    Mapped(usize, usize),
    Fetched(Bytes),
}

impl ShardFile {
    pub(super) fn open(dir: &Location, name: &str) -> Result<Self, CkptError> {
        let path = dir.join(name).as_path();
        let bad = |message: String| CkptError::Format {
            path: path.clone(),
            message,
        };
        let (backing, header, meta) = match dir {
            Location::Local(dir) => {
                let path = dir.join(name);
                let file = std::fs::File::open(&path).map_err(|source| {
                    if source.kind() == std::io::ErrorKind::NotFound {
                        CkptError::MissingShard(path.clone())
                    } else {
                        CkptError::Io {
                            what: "cannot open",
                            path: path.clone(),
                            source,
                        }
                    }
                })?;
                // SAFETY: committed checkpoint files are never written again.
                #[allow(unsafe_code)]
                let mmap =
                    unsafe { Mmap::map(&file) }.map_err(CkptError::io("cannot map", &path))?;
                let (header, meta) =
                    SafeTensors::read_metadata(&mmap).map_err(|e| bad(e.to_string()))?;
                (Backing::Mapped(mmap), header, meta)
            }
            Location::Remote(r) => {
                let key = r.object(name);
                let (len, size) = r.client.get_head(&key, 8)?;
                let len: [u8; 8] = len[..]
                    .try_into()
                    .map_err(|_| bad(format!("{size} bytes: no header")))?;
                let header = u64::from_le_bytes(len) as usize;
                if (header as u64) + 8 > size {
                    return Err(bad(format!(
                        "a header of {header} bytes in a file of {size}"
                    )));
                }
                let text = r
                    .client
                    .get_ranges(&key, std::iter::once(8..8 + header as u64).collect())?;
                let meta: Metadata =
                    serde_json::from_slice(&text[0]).map_err(|e| bad(e.to_string()))?;
                let data_end = meta.tensors().values().map(|t| t.data_offsets.1).max();
                if 8 + header as u64 + data_end.unwrap_or(0) as u64 != size {
                    return Err(bad(format!(
                        "the header describes {} bytes of data, the file has {}",
                        data_end.unwrap_or(0),
                        size - 8 - header as u64
                    )));
                }
                let backing = Backing::Remote {
                    client: Arc::clone(&r.client),
                    key,
                };
                (backing, header, meta)
            }
        };
        let data_start = 8 + header;
        let tensors = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                (
                    name,
                    (
                        data_start + info.data_offsets.0,
                        data_start + info.data_offsets.1,
                    ),
                )
            })
            .collect();
        let mut crcs = HashMap::new();
        for (key, value) in meta.metadata().iter().flatten() {
            if let Some(name) = key.strip_prefix("crc:") {
                let list = value
                    .split(',')
                    .map(|h| u32::from_str_radix(h, 16))
                    .collect::<Result<Vec<u32>, _>>()
                    .map_err(|e| bad(format!("bad CRC list for '{name}': {e}")))?;
                crcs.insert(name.to_string(), list);
            }
        }
        Ok(Self {
            path,
            backing,
            tensors,
            crcs,
        })
    }

    pub(super) fn tensor(&self, name: &str) -> Result<(usize, usize), CkptError> {
        self.tensors
            .get(name)
            .copied()
            .ok_or_else(|| CkptError::Format {
                path: self.path.clone(),
                message: format!("no tensor '{name}'"),
            })
    }

    /// The absolute byte range of chunk `chunk` of a tensor at `start..end`.
    pub(super) fn chunk_range(start: usize, end: usize, chunk: usize) -> (usize, usize) {
        let lo = start + chunk * CHUNK;
        (lo, (lo + CHUNK).min(end))
    }

    pub(super) fn check_bytes(
        &self,
        name: &str,
        leaf: &str,
        chunk: usize,
        bytes: &[u8],
    ) -> Result<(), CkptError> {
        let want = self.crcs.get(name).and_then(|c| c.get(chunk)).copied();
        if want == Some(crc32c::crc32c(bytes)) {
            return Ok(());
        }
        Err(CkptError::Crc {
            path: self.path.clone(),
            tensor: name.to_string(),
            leaf: leaf.to_string(),
            start: chunk * CHUNK,
            end: chunk * CHUNK + bytes.len(),
        })
    }

    /// Chunks `chunks` of tensor `name`, each checked (a mapped chunk once
    /// per reader: `checked` remembers). Fetched ones come
    /// `CHUNKS_PER_REQUEST` to a request, many requests in flight.
    pub(super) fn chunks(
        &self,
        name: &str,
        leaf: &str,
        chunks: &BTreeSet<usize>,
        checked: &mut HashSet<(PathBuf, String, usize)>,
    ) -> Result<HashMap<usize, Chunk>, CkptError> {
        let (start, end) = self.tensor(name)?;
        let mut out = HashMap::with_capacity(chunks.len());
        match &self.backing {
            Backing::Mapped(mmap) => {
                for &c in chunks {
                    let (lo, hi) = Self::chunk_range(start, end, c);
                    if hi > mmap.len() {
                        return Err(CkptError::Format {
                            path: self.path.clone(),
                            message: format!("tensor '{name}' ends past the end of the file"),
                        });
                    }
                    let key = (self.path.clone(), name.to_string(), c);
                    if !checked.contains(&key) {
                        self.check_bytes(name, leaf, c, &mmap[lo..hi])?;
                        checked.insert(key);
                    }
                    out.insert(c, Chunk::Mapped(lo, hi));
                }
            }
            Backing::Remote { client, key } => {
                let groups = self.groups(name, chunks)?;
                let ranges = groups.iter().map(|(_, r)| r.clone()).collect();
                let fetched = client.get_ranges(key, ranges)?;
                for ((group, _), bytes) in groups.iter().zip(fetched) {
                    self.accept(name, leaf, group, &bytes, &mut out)?;
                }
            }
        }
        Ok(out)
    }

    /// Runs of consecutive chunks of tensor `name`, cut to
    /// `CHUNKS_PER_REQUEST`, with the byte range of each.
    pub(super) fn groups(
        &self,
        name: &str,
        chunks: &BTreeSet<usize>,
    ) -> Result<Vec<ChunkRun>, CkptError> {
        let (start, end) = self.tensor(name)?;
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for &c in chunks {
            match groups.last_mut() {
                Some(g) if g.len() < CHUNKS_PER_REQUEST && g[g.len() - 1] + 1 == c => g.push(c),
                _ => groups.push(vec![c]),
            }
        }
        Ok(groups
            .into_iter()
            .map(|g| {
                let (lo, _) = Self::chunk_range(start, end, g[0]);
                let (_, hi) = Self::chunk_range(start, end, g[g.len() - 1]);
                (g, lo as u64..hi as u64)
            })
            .collect())
    }

    /// Checks and keeps the chunks of `group`, fetched as `bytes`.
    pub(super) fn accept(
        &self,
        name: &str,
        leaf: &str,
        group: &[usize],
        bytes: &Bytes,
        out: &mut HashMap<usize, Chunk>,
    ) -> Result<(), CkptError> {
        let (start, end) = self.tensor(name)?;
        let base = Self::chunk_range(start, end, group[0]).0;
        for &c in group {
            let (lo, hi) = Self::chunk_range(start, end, c);
            if hi - base > bytes.len() {
                return Err(CkptError::Format {
                    path: self.path.clone(),
                    message: format!("tensor '{name}' ends past the end of the file"),
                });
            }
            let piece = bytes.slice(lo - base..hi - base);
            self.check_bytes(name, leaf, c, &piece)?;
            out.insert(c, Chunk::Fetched(piece));
        }
        Ok(())
    }

    pub(super) fn bytes<'a>(&'a self, chunk: &'a Chunk) -> &'a [u8] {
        match (chunk, &self.backing) {
            (Chunk::Mapped(lo, hi), Backing::Mapped(mmap)) => &mmap[*lo..*hi],
            (Chunk::Fetched(b), _) => b,
            (Chunk::Mapped(..), Backing::Remote { .. }) => {
                unreachable!("mapped chunk of a remote file")
            }
        }
    }
}
