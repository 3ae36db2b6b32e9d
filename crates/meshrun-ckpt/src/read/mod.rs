//! Reading regions of leaves from a committed checkpoint, whatever the
//! layout it was saved with. Local shard files are memory-mapped; files in
//! an object store are read by byte ranges, many in flight. Either way
//! only the CRC chunks the requested region falls in are read, and each
//! is checked before its bytes are used.

mod copies;
mod file;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::boxes::{elements, intersect, runs};
use crate::error::CkptError;
use crate::manifest::Manifest;
use crate::shard::CHUNK;
use crate::store::Location;

pub use file::CHUNKS_PER_REQUEST;
use file::{Backing, Chunk, ShardFile};

pub fn itemsize(numpy_name: &str) -> Result<usize, CkptError> {
    Ok(match crate::shard::dtype(numpy_name)? {
        safetensors::Dtype::BOOL | safetensors::Dtype::U8 | safetensors::Dtype::I8 => 1,
        safetensors::Dtype::U16
        | safetensors::Dtype::I16
        | safetensors::Dtype::F16
        | safetensors::Dtype::BF16 => 2,
        safetensors::Dtype::U32 | safetensors::Dtype::I32 | safetensors::Dtype::F32 => 4,
        _ => 8,
    })
}

/// One region to read: leaf `leaf`'s `region`, into `out` (row-major,
/// exactly its bytes).
pub struct Request<'a> {
    pub leaf: &'a str,
    pub region: &'a [(usize, usize)],
    pub out: &'a mut [u8],
}

/// Bytes of regions read together at most (plus one request): what a
/// restore holds fetched at once, besides its outputs.
const READ_BATCH: usize = 256 << 20;

/// For each (file, tensor) a read needs: a leaf it belongs to (for
/// messages) and the chunks.
type Wanted = BTreeMap<(String, String), (String, BTreeSet<usize>)>;
type Loaded = HashMap<(String, String), HashMap<usize, Chunk>>;

pub struct Reader {
    dir: Location,
    manifest: Manifest,
    files: HashMap<String, ShardFile>,
    checked: HashSet<(PathBuf, String, usize)>,
    /// The rank reading: whose copy of a per-process leaf it gets.
    rank: u32,
    copies: HashMap<String, copies::Copy>,
}

impl Reader {
    pub fn open(dir: &Location) -> Result<Self, CkptError> {
        Ok(Self {
            manifest: crate::manifest::read(dir)?,
            dir: dir.clone(),
            files: HashMap::new(),
            checked: HashSet::new(),
            rank: 0,
            copies: HashMap::new(),
        })
    }

    /// Reads per-process leaves as rank `rank` (rank 0 unless set).
    #[must_use]
    pub fn as_rank(mut self, rank: u32) -> Self {
        self.rank = rank;
        self.copies.clear();
        self
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn open_file(&mut self, name: &str) -> Result<(), CkptError> {
        if !self.files.contains_key(name) {
            let f = ShardFile::open(&self.dir, name)?;
            self.files.insert(name.to_string(), f);
        }
        Ok(())
    }

    /// Fills `out` (row-major) with `region` of leaf `path`.
    pub fn read_region(
        &mut self,
        path: &str,
        region: &[(usize, usize)],
        out: &mut [u8],
    ) -> Result<(), CkptError> {
        self.read_regions(&mut [Request {
            leaf: path,
            region,
            out,
        }])
    }

    /// Fills every request's `out` with its region, reading what they all
    /// need together: in an object store every range of every file is in
    /// flight at once (`CONCURRENCY` requests), a batch of up to
    /// `READ_BATCH` bytes at a time.
    pub fn read_regions(&mut self, requests: &mut [Request<'_>]) -> Result<(), CkptError> {
        let mut from = 0;
        while from < requests.len() {
            let mut to = from;
            let mut bytes = 0;
            while to < requests.len()
                && (to == from || bytes + requests[to].out.len() <= READ_BATCH)
            {
                bytes += requests[to].out.len();
                to += 1;
            }
            self.read_batch(&mut requests[from..to])?;
            from = to;
        }
        Ok(())
    }

    fn read_batch(&mut self, requests: &mut [Request<'_>]) -> Result<(), CkptError> {
        // Per request: (file, tensor, [(source, destination, length)]) of
        // every stored shard it overlaps, and the elements covered.
        let mut plans = Vec::with_capacity(requests.len());
        let mut wanted: Wanted = BTreeMap::new();
        let chosen = requests
            .iter()
            .map(|r| self.copy_for(r.leaf))
            .collect::<Result<Vec<_>, _>>()?;
        for (req, copy) in requests.iter().zip(chosen) {
            let leaf = crate::manifest::leaf(&self.manifest, req.leaf)?;
            let size = itemsize(&leaf.dtype)?;
            let expected = elements(req.region) * size;
            if req.out.len() != expected {
                return Err(CkptError::ShardSize {
                    leaf: req.leaf.to_string(),
                    got: req.out.len(),
                    expected,
                    region: req.region.to_vec(),
                });
            }
            let mut covered = 0;
            let mut copies = Vec::new();
            for shard in copies::shards_of(leaf, copy) {
                let Some(overlap) = intersect(&shard.region, req.region) else {
                    continue;
                };
                let mut spans = Vec::new();
                runs(
                    &shard.region,
                    req.region,
                    &overlap,
                    size,
                    |src, dst, len| {
                        spans.push((src, dst, len));
                    },
                );
                let entry = wanted
                    .entry((shard.file.clone(), shard.tensor.clone()))
                    .or_insert_with(|| (req.leaf.to_string(), BTreeSet::new()));
                entry.1.extend(
                    spans.iter().flat_map(|&(src, _, len)| {
                        (src / CHUNK)..=((src + len.max(1) - 1) / CHUNK)
                    }),
                );
                copies.push((shard.file.clone(), shard.tensor.clone(), spans));
                covered += elements(&overlap);
            }
            if covered != elements(req.region) {
                return Err(CkptError::Incomplete {
                    leaf: req.leaf.to_string(),
                    region: req.region.to_vec(),
                });
            }
            plans.push(copies);
        }
        let loaded = self.load(&wanted)?;
        for (req, copies) in requests.iter_mut().zip(plans) {
            for (file, tensor, spans) in copies {
                let f = &self.files[&file];
                let chunks = &loaded[&(file.clone(), tensor)];
                // Each span, piece by piece across the chunks it spans.
                for (src, dst, len) in spans {
                    let mut done = 0;
                    while done < len {
                        let at = src + done;
                        let chunk = f.bytes(&chunks[&(at / CHUNK)]);
                        let from = at % CHUNK;
                        let n = (chunk.len() - from).min(len - done);
                        req.out[dst + done..dst + done + n].copy_from_slice(&chunk[from..from + n]);
                        done += n;
                    }
                }
            }
        }
        Ok(())
    }

    /// The chunks `wanted` names, checked: mapped ones where they are, and
    /// in an object store all fetched together.
    fn load(&mut self, wanted: &Wanted) -> Result<Loaded, CkptError> {
        for (file, _) in wanted.keys() {
            self.open_file(file)?;
        }
        let mut loaded = Loaded::new();
        let mut fetches = Vec::new();
        for ((file, tensor), (leaf, chunks)) in wanted {
            let f = &self.files[file];
            match &f.backing {
                Backing::Mapped(_) => {
                    let got = f.chunks(tensor, leaf, chunks, &mut self.checked)?;
                    loaded.insert((file.clone(), tensor.clone()), got);
                }
                Backing::Remote { client, key } => {
                    for (group, range) in f.groups(tensor, chunks)? {
                        fetches.push((
                            Arc::clone(client),
                            file,
                            tensor,
                            leaf,
                            group,
                            key.clone(),
                            range,
                        ));
                    }
                }
            }
        }
        let Some(client) = fetches.first().map(|f| Arc::clone(&f.0)) else {
            return Ok(loaded);
        };
        let ranges = fetches.iter().map(|f| (f.5.clone(), f.6.clone())).collect();
        let bodies = client.get_many(ranges)?;
        for ((_, file, tensor, leaf, group, _, _), bytes) in fetches.into_iter().zip(bodies) {
            let map = loaded.entry((file.clone(), tensor.clone())).or_default();
            self.files[file].accept(tensor, leaf, &group, &bytes, map)?;
        }
        Ok(loaded)
    }

    /// Checks every chunk of every tensor, and that each shard the
    /// manifest lists holds the bytes of its region: whether the bytes are
    /// what was committed (an error here is [`CkptError::is_damage`], or
    /// the storage failing). Returns how many tensors were checked (of a
    /// directory checkpoint: how many files, each read whole and checked
    /// against its record). Whether it can be restored whole is
    /// [`Reader::check_whole`]'s verdict.
    pub fn verify_all(&mut self) -> Result<usize, CkptError> {
        if self.manifest.is_directory() {
            return crate::directory::verify_files(&self.dir, &self.manifest);
        }
        let leaves = self.manifest.leaves.clone();
        let mut n = 0;
        for leaf in &leaves {
            let size = itemsize(&leaf.dtype)?;
            for shard in &leaf.shards {
                self.open_file(&shard.file)?;
                let file = &self.files[&shard.file];
                let (start, end) = file.tensor(&shard.tensor)?;
                let expected = elements(&shard.region) * size;
                if end - start != expected {
                    return Err(CkptError::ShardSize {
                        leaf: leaf.path.clone(),
                        got: end - start,
                        expected,
                        region: shard.region.clone(),
                    });
                }
                // As many chunks as `chunk_crcs` makes (one for no bytes),
                // a bounded batch at a time.
                let all: Vec<usize> = (0..(end - start).div_ceil(CHUNK).max(1)).collect();
                for batch in all.chunks(64) {
                    let batch: BTreeSet<usize> = batch.iter().copied().collect();
                    file.chunks(&shard.tensor, &leaf.path, &batch, &mut self.checked)?;
                }
                n += 1;
            }
        }
        Ok(n)
    }

    /// Whether every leaf can be restored whole from what the manifest
    /// lists: the shards of a global array cover it, and so does each
    /// rank's copy of a per-process leaf. It reads no shard bytes; a
    /// checkpoint that fails it is whole but was committed so, not damaged
    /// ([`CkptError::Uncovered`]).
    pub fn check_whole(&self) -> Result<(), CkptError> {
        self.manifest
            .leaves
            .iter()
            .try_for_each(copies::check_covered)
    }
}

#[cfg(test)]
mod tests;
