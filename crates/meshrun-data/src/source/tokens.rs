//! Token files as nanoGPT writes them: a flat array of uint8/uint16/uint32
//! tokens. Record i is the window of `seq_len + 1` tokens starting at token
//! `i * seq_len` (inputs and the next-token targets), so consecutive windows
//! share one token and every token but the last is a target exactly once
//! per epoch.

use std::ops::Range;

use super::{fingerprint, Dtype, Field, Source};
use crate::blob::{Blob, CacheConfig};
use crate::error::DataError;

pub struct TokenFile {
    blob: Blob,
    seq_len: u64,
    itemsize: usize,
    records: u64,
    fields: Vec<Field>,
    fingerprint: String,
    /// Kept for the cache's report.
    cache: CacheConfig,
}

impl TokenFile {
    /// `path`: a local path or an object URL (`s3://bucket/train.bin`).
    pub fn open(
        path: &str,
        dtype: &str,
        seq_len: u64,
        cache: CacheConfig,
    ) -> Result<Self, DataError> {
        let dtype = match dtype {
            "uint8" | "u8" => Dtype::U8,
            "uint16" | "u16" => Dtype::U16,
            "uint32" | "u32" => Dtype::U32,
            other => return Err(DataError::BadDtype(other.into(), Dtype::TOKEN_CHOICES)),
        };
        if seq_len == 0 {
            return Err(DataError::BadSeqLen(seq_len));
        }
        let blob = Blob::open(path, &cache, 0)?;
        let size = blob.len();
        let itemsize = dtype.itemsize();
        if size % itemsize as u64 != 0 {
            return Err(DataError::Truncated {
                path: path.into(),
                size,
                itemsize,
                dtype: dtype.numpy_name().into(),
            });
        }
        let tokens = size / itemsize as u64;
        if tokens < seq_len + 1 {
            return Err(DataError::TooShort {
                path: path.into(),
                have: tokens,
                need: seq_len + 1,
            });
        }
        let description = format!("tokens:{}:{seq_len}", dtype.numpy_name());
        Ok(Self {
            fingerprint: fingerprint(&description, &[&blob])?,
            blob,
            seq_len,
            itemsize,
            records: (tokens - 1) / seq_len,
            fields: vec![Field {
                name: "tokens".into(),
                dtype,
                shape: vec![seq_len as usize + 1],
            }],
            cache,
        })
    }

    fn range(&self, index: u64) -> Range<u64> {
        let start = index * self.seq_len * self.itemsize as u64;
        start..start + (self.seq_len + 1) * self.itemsize as u64
    }
}

impl Source for TokenFile {
    fn records(&self) -> u64 {
        self.records
    }

    fn fields(&self) -> &[Field] {
        &self.fields
    }

    fn read(&self, index: u64, out: &mut [&mut [u8]]) -> Result<(), DataError> {
        self.blob.read_at(self.range(index).start, out[0])
    }

    fn prefetch(&self, records: &[u64]) -> Result<(), DataError> {
        let ranges: Vec<Range<u64>> = records.iter().map(|&r| self.range(r)).collect();
        self.blob.prefetch(&ranges)
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn fetched(&self) -> u64 {
        self.cache.fetched()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn open(p: &Path, dtype: &str, seq_len: u64) -> Result<TokenFile, DataError> {
        TokenFile::open(p.to_str().unwrap(), dtype, seq_len, CacheConfig::new(None))
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn windows_overlap_by_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u8> = (0u16..10).flat_map(u16::to_le_bytes).collect();
        let f = open(&write(dir.path(), "t.bin", &tokens), "uint16", 3).unwrap();
        assert_eq!(f.records(), 3); // (10 - 1) / 3
        let mut buf = vec![0u8; 8];
        f.read(1, &mut [&mut buf]).unwrap();
        let got: Vec<u16> = buf
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, vec![3, 4, 5, 6]);
    }

    #[test]
    fn truncated_and_short_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "odd.bin", &[1, 2, 3]);
        let e = open(&p, "uint16", 1).err().unwrap().to_string();
        assert!(
            e.contains("odd.bin") && e.contains("not a multiple of 2"),
            "{e}"
        );
        let p = write(dir.path(), "short.bin", &[1, 2, 3]);
        let e = open(&p, "uint8", 8).err().unwrap().to_string();
        assert!(e.contains("holds 3 tokens") && e.contains("= 9"), "{e}");
        let e = open(&dir.path().join("none.bin"), "uint8", 8)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = open(&p, "float32", 1).err().unwrap().to_string();
        assert!(e.contains("uint8, uint16, uint32"), "{e}");
    }
}
