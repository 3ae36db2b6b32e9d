//! Reading regions of leaves from a committed checkpoint, whatever the
//! layout it was saved with. Local shard files are memory-mapped; files in
//! an object store are read by byte ranges, many in flight. Either way
//! only the CRC chunks the requested region falls in are read, and each
//! is checked before its bytes are used.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;
use object_store::path::Path as Key;
use safetensors::tensor::Metadata;
use safetensors::SafeTensors;

use crate::boxes::{elements, intersect, runs};
use crate::error::CkptError;
use crate::manifest::Manifest;
use crate::shard::CHUNK;
use crate::store::{Client, Location};

/// Chunks fetched in one request from an object store.
pub(crate) const CHUNKS_PER_REQUEST: usize = 8;

enum Backing {
    Mapped(Mmap),
    Remote { client: Arc<Client>, key: Key },
}

struct ShardFile {
    /// The file's path, or its URL, for messages.
    path: PathBuf,
    backing: Backing,
    /// tensor name -> absolute byte range in the file
    tensors: HashMap<String, (usize, usize)>,
    crcs: HashMap<String, Vec<u32>>,
}

/// A checked CRC chunk: where its bytes are.
enum Chunk {
    /// In the memory map, at this absolute range.
    Mapped(usize, usize),
    Fetched(Bytes),
}

impl ShardFile {
    fn open(dir: &Location, name: &str) -> Result<Self, CkptError> {
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
                let text = r.client.get_ranges(&key, vec![8..8 + header as u64])?;
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

    fn tensor(&self, name: &str) -> Result<(usize, usize), CkptError> {
        self.tensors
            .get(name)
            .copied()
            .ok_or_else(|| CkptError::Format {
                path: self.path.clone(),
                message: format!("no tensor '{name}'"),
            })
    }

    /// The absolute byte range of chunk `chunk` of a tensor at `start..end`.
    fn chunk_range(start: usize, end: usize, chunk: usize) -> (usize, usize) {
        let lo = start + chunk * CHUNK;
        (lo, (lo + CHUNK).min(end))
    }

    fn check_bytes(
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
    fn chunks(
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
    fn groups(
        &self,
        name: &str,
        chunks: &BTreeSet<usize>,
    ) -> Result<Vec<(Vec<usize>, Range<u64>)>, CkptError> {
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
    fn accept(
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

    fn bytes<'a>(&'a self, chunk: &'a Chunk) -> &'a [u8] {
        match (chunk, &self.backing) {
            (Chunk::Mapped(lo, hi), Backing::Mapped(mmap)) => &mmap[*lo..*hi],
            (Chunk::Fetched(b), _) => b,
            (Chunk::Mapped(..), Backing::Remote { .. }) => {
                unreachable!("mapped chunk of a remote file")
            }
        }
    }
}

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
}

impl Reader {
    pub fn open(dir: &Location) -> Result<Self, CkptError> {
        Ok(Self {
            manifest: Manifest::read(dir)?,
            dir: dir.clone(),
            files: HashMap::new(),
            checked: HashSet::new(),
        })
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
        for req in requests.iter() {
            let leaf = self.manifest.leaf(req.leaf)?;
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
            for shard in &leaf.shards {
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
        let fetched = client.get_many(ranges)?;
        for ((_, file, tensor, leaf, group, _, _), bytes) in fetches.into_iter().zip(fetched) {
            let map = loaded.entry((file.clone(), tensor.clone())).or_default();
            self.files[file].accept(tensor, leaf, &group, &bytes, map)?;
        }
        Ok(loaded)
    }

    /// Checks every chunk of every tensor, and that the manifest agrees
    /// with the files: each shard holds the bytes of its region and the
    /// shards of a leaf add up to the whole leaf (a manifest that does not
    /// would fail a restore, or read the wrong bytes). Returns how many
    /// tensors were checked.
    pub fn verify_all(&mut self) -> Result<usize, CkptError> {
        let leaves = self.manifest.leaves.clone();
        let mut n = 0;
        for leaf in &leaves {
            let size = itemsize(&leaf.dtype)?;
            let mut covered = 0;
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
                covered += elements(&shard.region);
                n += 1;
            }
            let whole: Vec<(usize, usize)> = leaf.shape.iter().map(|&d| (0, d)).collect();
            if covered != elements(&whole) {
                return Err(CkptError::Incomplete {
                    leaf: leaf.path.clone(),
                    region: whole,
                });
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::{commit, committed, tmp_dir};
    use crate::manifest::{Leaf, FORMAT_VERSION};
    use crate::shard::{write_rank_file, ShardIn};
    use bytes::Bytes;

    /// Saves an (8, 6) float32 leaf as 4 row blocks over 2 "ranks", then
    /// reads it back by columns, whole, and as one element.
    #[test]
    fn resharded_reads_and_crc_detection() {
        let root = tempfile::tempdir().unwrap();
        let values: Vec<f32> = (0..48).map(|i| i as f32 * 0.5).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let tmp = tmp_dir(root.path(), 7);
        std::fs::create_dir_all(&tmp).unwrap();
        let mut leaf = Leaf {
            path: "w".into(),
            dtype: "float32".into(),
            shape: vec![8, 6],
            shards: vec![],
        };
        for rank in 0..2u32 {
            let shards: Vec<ShardIn> = (0..2)
                .map(|k| {
                    let r = (rank * 2 + k) as usize;
                    ShardIn {
                        leaf: "w".into(),
                        dtype: "float32".into(),
                        region: vec![(r * 2, r * 2 + 2), (0, 6)],
                        data: Bytes::copy_from_slice(&bytes[r * 48..(r + 1) * 48]),
                    }
                })
                .collect();
            leaf.shards.extend(
                write_rank_file(&tmp, rank, &shards)
                    .unwrap()
                    .into_iter()
                    .map(|(_, s)| s),
            );
        }
        let manifest = Manifest {
            format: FORMAT_VERSION,
            step: 7,
            leaves: vec![leaf],
            extra: serde_json::json!({}),
            attempt: None,
        };
        let dir = commit(&root.path().into(), &manifest).unwrap();
        assert_eq!(
            committed(&root.path().into()).unwrap(),
            vec![(7, dir.clone())]
        );

        let mut reader = Reader::open(&dir).unwrap();
        let mut whole = vec![0u8; 48 * 4];
        reader
            .read_region("w", &[(0, 8), (0, 6)], &mut whole)
            .unwrap();
        assert_eq!(whole, bytes);
        let mut cols = vec![0u8; 8 * 2 * 4];
        reader
            .read_region("w", &[(0, 8), (3, 5)], &mut cols)
            .unwrap();
        let got: Vec<f32> = cols
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want: Vec<f32> = (0..8)
            .flat_map(|r| [values[r * 6 + 3], values[r * 6 + 4]])
            .collect();
        assert_eq!(got, want);
        assert_eq!(reader.verify_all().unwrap(), 4);

        // Flip one byte of rank 1's data: verify and reads of it fail, naming
        // the file and the tensor; reads of rank 0's rows still work.
        let file = dir.local().unwrap().join("rank-1.safetensors");
        let mut raw = std::fs::read(&file).unwrap();
        let n = raw.len();
        raw[n - 3] ^= 0xff;
        std::fs::write(&file, raw).unwrap();
        let mut reader = Reader::open(&dir).unwrap();
        let err = reader.verify_all().unwrap_err().to_string();
        assert!(
            err.contains("rank-1.safetensors") && err.contains("tensor 'w:1'"),
            "{err}"
        );
        let mut top = vec![0u8; 2 * 6 * 4];
        reader
            .read_region("w", &[(0, 2), (0, 6)], &mut top)
            .unwrap();
        let err = reader
            .read_region("w", &[(6, 8), (0, 6)], &mut top)
            .unwrap_err()
            .to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
    }
}
