//! `--memory-per-proc SIZE`: the memory each worker may use. On CPU it
//! is the worker's host memory (its cgroup's limit, set by the agent), and
//! so the memory of its devices; on CUDA it is the memory of the worker's
//! GPU that XLA may take (`XLA_PYTHON_CLIENT_MEM_FRACTION`, worked out by
//! the worker's bootstrap from the GPU's size, since only it sees the GPU).

use std::fmt;

use meshrun_record::memory::Bytes;
use serde::{Deserialize, Serialize};

/// Below this, a worker cannot even import JAX: a limit that small is a
/// typo (`512K` for `512M`), said as such rather than run into an
/// out-of-memory kill before the program's first line.
pub const MIN_MEMORY_PER_PROC: u64 = 256 << 20;

/// A size in bytes, as the user wrote it and as it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemoryLimit(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error(
        "cannot read '{text}' as a size: {why}; write a number of bytes with a unit, such as \
         2GiB, 1500MiB or 3.5GB (KiB/MiB/GiB are powers of 1024, KB/MB/GB and K/M/G of 1000)"
    )]
    Unreadable { text: String, why: String },
    #[error(
        "{text} ({bytes}) is less than the {min} a worker needs to start Python and JAX; \
         give at least 256MiB (did you mean {text_m}?)",
        bytes = Bytes(*bytes), min = Bytes(MIN_MEMORY_PER_PROC)
    )]
    TooSmall {
        text: String,
        bytes: u64,
        text_m: String,
    },
}

impl MemoryLimit {
    /// Reads `2GiB`, `1500MiB`, `3.5GB`, `4G` (units as `bytesize` reads
    /// them: the `i` units are powers of 1024).
    pub fn parse(text: &str) -> Result<Self, SizeError> {
        Self::from_bytes(parse_bytes(text)?, text.trim())
    }

    /// A limit given as a number of bytes (the Python API's int).
    pub fn from_bytes(bytes: u64, text: &str) -> Result<Self, SizeError> {
        if bytes < MIN_MEMORY_PER_PROC {
            let digits: String = text
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            return Err(SizeError::TooSmall {
                text: text.to_string(),
                bytes,
                text_m: format!("{}MiB", if digits.is_empty() { "512" } else { &digits }),
            });
        }
        Ok(MemoryLimit(bytes))
    }
}

/// Bytes from a size as a user writes it (`2GiB`, `1500MiB`, `3.5GB`),
/// with no lower bound: the one reading of sizes, for the CLI, the Python
/// API and `meshrun.planning`.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    trimmed
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|why| SizeError::Unreadable {
            text: text.to_string(),
            why: why
                .trim_start_matches(&format!("couldn't parse {trimmed:?} into a ByteSize, "))
                .to_string(),
        })
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Bytes(self.0).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_read_with_binary_and_decimal_units() {
        assert_eq!(MemoryLimit::parse("2GiB").unwrap().0, 2 << 30);
        assert_eq!(MemoryLimit::parse(" 1500MiB ").unwrap().0, 1500 << 20);
        assert_eq!(MemoryLimit::parse("3.5GB").unwrap().0, 3_500_000_000);
        assert_eq!(MemoryLimit::parse("1.5 gib").unwrap().0, 3 << 29);
    }

    #[test]
    fn a_wrong_size_says_what_was_seen_and_what_is_accepted() {
        let e = MemoryLimit::parse("lots").unwrap_err().to_string();
        assert!(e.starts_with("cannot read 'lots' as a size: "), "{e}");
        assert!(e.contains("such as 2GiB, 1500MiB or 3.5GB"), "{e}");
        let e = MemoryLimit::parse("512K").unwrap_err().to_string();
        assert!(
            e.starts_with("512K (500 KiB) is less than the 256 MiB"),
            "{e}"
        );
        assert!(e.contains("did you mean 512MiB?"), "{e}");
    }
}
