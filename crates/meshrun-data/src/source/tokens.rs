//! Token files as nanoGPT writes them: a flat array of uint8/uint16/uint32
//! tokens. Record i is the window of `seq_len + 1` tokens starting at token
//! `i * seq_len` (inputs and the next-token targets), so consecutive windows
//! share one token and every token but the last is a target exactly once
//! per epoch.

use std::path::Path;

use memmap2::Mmap;

use super::{check_exists, fingerprint, Dtype, Field, Source};
use crate::error::DataError;

pub struct TokenFile {
    mmap: Mmap,
    seq_len: u64,
    itemsize: usize,
    records: u64,
    fields: Vec<Field>,
    fingerprint: String,
}

impl TokenFile {
    pub fn open(path: &Path, dtype: &str, seq_len: u64) -> Result<Self, DataError> {
        let dtype = match dtype {
            "uint8" | "u8" => Dtype::U8,
            "uint16" | "u16" => Dtype::U16,
            "uint32" | "u32" => Dtype::U32,
            other => return Err(DataError::BadDtype(other.into(), Dtype::TOKEN_CHOICES)),
        };
        if seq_len == 0 {
            return Err(DataError::BadSeqLen(seq_len));
        }
        check_exists(path)?;
        let file = std::fs::File::open(path).map_err(DataError::io("cannot open", path))?;
        let size = file
            .metadata()
            .map_err(DataError::io("cannot stat", path))?
            .len();
        let itemsize = dtype.itemsize();
        if size % itemsize as u64 != 0 {
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                size,
                itemsize,
                dtype: dtype.numpy_name().into(),
            });
        }
        let tokens = size / itemsize as u64;
        if tokens < seq_len + 1 {
            return Err(DataError::TooShort {
                path: path.display().to_string(),
                have: tokens,
                need: seq_len + 1,
            });
        }
        // SAFETY: the file is opened read-only; meshrun never writes to a
        // data file it reads, and a file changed under a run is caught by
        // the fingerprint when the run resumes.
        #[allow(unsafe_code)]
        let mmap = unsafe { Mmap::map(&file) }.map_err(DataError::io("cannot map", path))?;
        let description = format!("tokens:{}:{seq_len}", dtype.numpy_name());
        Ok(Self {
            fingerprint: fingerprint(&description, &[path])?,
            mmap,
            seq_len,
            itemsize,
            records: (tokens - 1) / seq_len,
            fields: vec![Field {
                name: "tokens".into(),
                dtype,
                shape: vec![seq_len as usize + 1],
            }],
        })
    }
}

impl Source for TokenFile {
    fn records(&self) -> u64 {
        self.records
    }

    fn fields(&self) -> &[Field] {
        &self.fields
    }

    fn read(&self, index: u64, out: &mut [&mut [u8]]) {
        let start = (index * self.seq_len) as usize * self.itemsize;
        let len = (self.seq_len as usize + 1) * self.itemsize;
        out[0].copy_from_slice(&self.mmap[start..start + len]);
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn windows_overlap_by_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u8> = (0u16..10).flat_map(u16::to_le_bytes).collect();
        let f = TokenFile::open(&write(dir.path(), "t.bin", &tokens), "uint16", 3).unwrap();
        assert_eq!(f.records(), 3); // (10 - 1) / 3
        let mut buf = vec![0u8; 8];
        f.read(1, &mut [&mut buf]);
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
        let e = TokenFile::open(&p, "uint16", 1).err().unwrap().to_string();
        assert!(
            e.contains("odd.bin") && e.contains("not a multiple of 2"),
            "{e}"
        );
        let p = write(dir.path(), "short.bin", &[1, 2, 3]);
        let e = TokenFile::open(&p, "uint8", 8).err().unwrap().to_string();
        assert!(e.contains("holds 3 tokens") && e.contains("= 9"), "{e}");
        let e = TokenFile::open(&dir.path().join("none.bin"), "uint8", 8)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = TokenFile::open(&p, "float32", 1).err().unwrap().to_string();
        assert!(e.contains("uint8, uint16, uint32"), "{e}");
    }
}
