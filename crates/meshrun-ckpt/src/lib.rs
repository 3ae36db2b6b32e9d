//! meshrun's checkpoint engine (no Python here).
//!
//! Every process writes the shards it owns to one safetensors file of its
//! own ([`shard::write_rank_file`]), with a CRC-32C per 1 MiB chunk of every
//! tensor. The controller, once every rank has written, records all shards
//! in `manifest.json` and renames the folder ([`commit`]); a folder without
//! a manifest is never read. Restore asks for any region of any leaf
//! ([`read::Reader`]) and gets it assembled from whichever stored shards
//! overlap it, reading (and checking) only the chunks it needs, so a
//! checkpoint restores onto another process count or mesh. Before each
//! attempt the controller picks the checkpoint to resume from: the newest
//! that verifies, or the step asked for ([`resume`]).

pub mod boxes;
pub mod commit;
pub mod directory;
pub mod error;
pub mod executable;
pub mod manifest;
pub mod read;
pub mod resume;
pub mod shard;

pub use error::CkptError;
/// Where checkpoints live: the storage seam, re-exported for the
/// engine's own modules and its callers.
pub use meshrun_store as store;
