//! meshrun's data loader engine (no Python here).
//!
//! A [`source::Source`] gives fixed-size records by index (token windows,
//! `.npy` rows, Parquet columns); [`order::Permutation`] fixes the global
//! order per `(seed, epoch)`; [`loader::Loader`] cuts the global batch of
//! each step, keeps this process's contiguous slice, and reads it in Rust
//! threads ahead of the consumer. The loader's whole state is one number,
//! the global sample offset, so a run resumes at the exact sample, with any
//! number of processes.

pub mod blob;
pub mod error;
pub mod loader;
pub mod order;
pub mod source;

pub use error::DataError;
pub use loader::{Batch, Loader, LoaderConfig, Wait};
pub use order::Permutation;
pub use source::{Dtype, Field, Source};
