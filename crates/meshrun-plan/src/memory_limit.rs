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
         2GiB, 1500MiB or 3.5GB (KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000)"
    )]
    Unreadable { text: String, why: String },
    #[error(
        "'{text}' is ambiguous: {letter} means a power of 1000 to some tools ({number}{letter}B, as \
         Kubernetes reads it) and of 1024 to others ({number}{letter}iB, as Slurm's --mem and Docker's -m \
         read it); write {number}{letter}B or {number}{letter}iB"
    )]
    Ambiguous {
        text: String,
        number: String,
        letter: char,
    },
    #[error(
        "{text} ({bytes}) is less than the {min} a worker needs to start Python and JAX; \
         give at least 256MiB{hint}",
        bytes = Bytes(*bytes), min = Bytes(MIN_MEMORY_PER_PROC)
    )]
    TooSmall {
        text: String,
        bytes: u64,
        /// " (did you mean 512MiB?)": the same number in a unit that is
        /// enough, or nothing when none is.
        hint: String,
    },
}

impl MemoryLimit {
    /// Reads `2GiB`, `1500MiB`, `3.5GB` (units as `bytesize` reads
    /// them: the `i` units are powers of 1024; a lone `K`, `M` or `G` is
    /// refused as ambiguous).
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
                hint: enough_unit(&digits)
                    .map_or_else(String::new, |m| format!(" (did you mean {m}?)")),
            });
        }
        Ok(MemoryLimit(bytes))
    }
}

/// `digits` in the smallest of MiB and GiB that makes it enough for a
/// worker (`512K` most likely meant `512MiB`, `1k` meant `1GiB`); none
/// for a number no unit makes enough (0).
fn enough_unit(digits: &str) -> Option<String> {
    let n: f64 = digits.parse().ok()?;
    ["MiB", "GiB"]
        .into_iter()
        .zip([1u64 << 20, 1 << 30])
        .find_map(|(unit, size)| {
            #[allow(clippy::cast_precision_loss)]
            let enough = n * size as f64 >= MIN_MEMORY_PER_PROC as f64;
            enough.then(|| format!("{digits}{unit}"))
        })
}

/// Why `text` is not a size, in words about sizes (not the parser's).
fn unreadable(text: &str, parser: String) -> String {
    let trimmed = text.trim();
    match trimmed.chars().next() {
        None => "it is empty".to_string(),
        Some('-') => "a size cannot be negative".to_string(),
        Some(c) if !c.is_ascii_digit() && c != '.' => "it does not start with a number".to_string(),
        _ if trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') => {
            "a number without a unit is a count of bytes, which is whole".to_string()
        }
        _ => parser,
    }
}

/// Bytes from a size as a user writes it (`2GiB`, `1500MiB`, `3.5GB`),
/// with no lower bound: the one reading of sizes, for the CLI, the Python
/// API and `meshrun.planning`.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    // `2560M`: MB to bytesize and Kubernetes, MiB to Slurm and Docker. Not
    // guessed: the user says which.
    let number = trimmed
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .trim_end();
    let unit = trimmed[number.len()..].trim();
    if let [letter] = unit.chars().collect::<Vec<_>>()[..] {
        let letter = letter.to_ascii_uppercase();
        if "KMGTPE".contains(letter) && !number.is_empty() {
            return Err(SizeError::Ambiguous {
                text: text.to_string(),
                number: number.to_string(),
                letter,
            });
        }
    }
    trimmed
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|why| SizeError::Unreadable {
            text: text.to_string(),
            why: unreadable(
                text,
                why.trim_start_matches(&format!("couldn't parse {trimmed:?} into a ByteSize, "))
                    .to_string(),
            ),
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
        let e = MemoryLimit::parse("512KiB").unwrap_err().to_string();
        assert!(
            e.starts_with("512KiB (512 KiB) is less than the 256 MiB"),
            "{e}"
        );
        assert!(e.contains("did you mean 512MiB?"), "{e}");
        // What a parser would say is said about sizes instead, and no
        // suggestion is one that is refused too.
        for (text, why) in [
            ("-1", "a size cannot be negative"),
            ("abc", "it does not start with a number"),
            (
                "1.5",
                "a number without a unit is a count of bytes, which is whole",
            ),
            ("", "it is empty"),
        ] {
            let e = MemoryLimit::parse(text).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("cannot read '{text}' as a size: {why};")),
                "{e}"
            );
        }
        let e = MemoryLimit::parse("1kB").unwrap_err().to_string();
        assert!(
            e.ends_with("give at least 256MiB (did you mean 1GiB?)"),
            "{e}"
        );
        // A lone K, M or G is MB to some tools and MiB to others: refused,
        // naming both.
        for text in ["2560M", "2g", "512 K"] {
            let e = MemoryLimit::parse(text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("'{text}' is ambiguous: ")), "{e}");
        }
        let e = MemoryLimit::parse("2560M").unwrap_err().to_string();
        assert!(e.ends_with("write 2560MB or 2560MiB"), "{e}");
        let e = MemoryLimit::parse("0").unwrap_err().to_string();
        assert!(e.ends_with("give at least 256MiB"), "{e}");
    }
}
