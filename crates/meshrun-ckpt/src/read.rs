//! Reading regions of leaves from a committed checkpoint, whatever the
//! layout it was saved with. Shard files are memory-mapped; only the bytes
//! of the requested region are copied, and only the CRC chunks those bytes
//! fall in are read and checked.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::SafeTensors;

use crate::boxes::{elements, intersect, runs};
use crate::error::CkptError;
use crate::manifest::Manifest;
use crate::shard::CHUNK;

struct ShardFile {
    path: PathBuf,
    mmap: Mmap,
    /// tensor name -> absolute byte range in the file
    tensors: HashMap<String, (usize, usize)>,
    crcs: HashMap<String, Vec<u32>>,
}

impl ShardFile {
    fn open(path: PathBuf) -> Result<Self, CkptError> {
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
        let mmap = unsafe { Mmap::map(&file) }.map_err(CkptError::io("cannot map", &path))?;
        let bad = |message: String| CkptError::Format {
            path: path.clone(),
            message,
        };
        let (header, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| bad(e.to_string()))?;
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
            mmap,
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

    /// Checks chunk `chunk` of tensor `name`.
    fn check(&self, name: &str, leaf: &str, chunk: usize) -> Result<(), CkptError> {
        let (start, end) = self.tensor(name)?;
        let lo = start + chunk * CHUNK;
        let hi = (lo + CHUNK).min(end);
        let want = self.crcs.get(name).and_then(|c| c.get(chunk)).copied();
        let got = crc32c::crc32c(&self.mmap[lo..hi]);
        if want == Some(got) {
            Ok(())
        } else {
            Err(CkptError::Crc {
                path: self.path.clone(),
                tensor: name.to_string(),
                leaf: leaf.to_string(),
                start: lo - start,
                end: hi - start,
            })
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

pub struct Reader {
    dir: PathBuf,
    manifest: Manifest,
    files: HashMap<String, ShardFile>,
    checked: HashSet<(String, String, usize)>,
}

impl Reader {
    pub fn open(dir: &Path) -> Result<Self, CkptError> {
        Ok(Self {
            manifest: Manifest::read(dir)?,
            dir: dir.to_path_buf(),
            files: HashMap::new(),
            checked: HashSet::new(),
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn file(&mut self, name: &str) -> Result<&ShardFile, CkptError> {
        if !self.files.contains_key(name) {
            let f = ShardFile::open(self.dir.join(name))?;
            self.files.insert(name.to_string(), f);
        }
        Ok(&self.files[name])
    }

    /// Fills `out` (row-major) with `region` of leaf `path`.
    pub fn read_region(
        &mut self,
        path: &str,
        region: &[(usize, usize)],
        out: &mut [u8],
    ) -> Result<(), CkptError> {
        let leaf = self.manifest.leaf(path)?.clone();
        let size = itemsize(&leaf.dtype)?;
        let expected = elements(region) * size;
        if out.len() != expected {
            return Err(CkptError::ShardSize {
                leaf: path.to_string(),
                got: out.len(),
                expected,
                region: region.to_vec(),
            });
        }
        let mut covered = 0;
        for shard in &leaf.shards {
            let Some(overlap) = intersect(&shard.region, region) else {
                continue;
            };
            // Which CRC chunks the copy touches, checked once each.
            let mut spans = Vec::new();
            runs(&shard.region, region, &overlap, size, |src, _, len| {
                spans.push((src, len));
            });
            let chunks: HashSet<usize> = spans
                .iter()
                .flat_map(|&(src, len)| (src / CHUNK)..=((src + len.max(1) - 1) / CHUNK))
                .collect();
            for chunk in chunks {
                let key = (shard.file.clone(), shard.tensor.clone(), chunk);
                if !self.checked.contains(&key) {
                    self.file(&shard.file)?.check(&shard.tensor, path, chunk)?;
                    self.checked.insert(key);
                }
            }
            let file = self.file(&shard.file)?;
            let (start, _) = file.tensor(&shard.tensor)?;
            let bytes = &file.mmap[start..];
            runs(&shard.region, region, &overlap, size, |src, dst, len| {
                out[dst..dst + len].copy_from_slice(&bytes[src..src + len]);
            });
            covered += elements(&overlap);
        }
        if covered != elements(region) {
            return Err(CkptError::Incomplete {
                leaf: path.to_string(),
                region: region.to_vec(),
            });
        }
        Ok(())
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
                let file = self.file(&shard.file)?;
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
                // counted without computing their CRCs a first time.
                for chunk in 0..(end - start).div_ceil(CHUNK).max(1) {
                    file.check(&shard.tensor, &leaf.path, chunk)?;
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
                        data: &bytes[r * 48..(r + 1) * 48],
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
        let dir = commit(root.path(), &manifest).unwrap();
        assert_eq!(committed(root.path()), vec![(7, dir.clone())]);

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
        let file = dir.join("rank-1.safetensors");
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
