//! zlogfs: a log-structured file system with transparent, on-line
//! compression.
//!
//! The layers are crates of their own, so that an import upwards does not
//! compile (docs/ARCHITECTURE.md, "Crates"):
//! - `zlogfs-engine`: store, codec, log, index, engine;
//! - `zlogfs-fs`: the POSIX file system layer over the engine;
//! - `zlogfs-fuse`: the FUSE mount;
//! - this crate: the command-line tool; [`tools`], its whole-tree
//!   commands (import, export) and reports (stats, du, fsck); and
//!   [`control`], the channel through which the commands reach a mounted
//!   image's daemon.
//!
//! The names below give the tests, benchmarks and fuzz targets, which
//! exercise the whole stack, one path to each layer.

// serde_json's json! macro recurses once per field: the stats report has
// about fifty.
#![recursion_limit = "256"]

pub use zlogfs_engine::{bytes, codec, engine, error, metrics, store};
pub use zlogfs_engine::{mkfs, Engine, Error, Op, Options, Result, Snapshot, WriteBatch};
pub use zlogfs_engine::{validate_geometry, BlockAddr, BlockKind, Role, Tier, DEFAULT_SEGMENT_SIZE};
pub use zlogfs_fs as fs;

/// The front ends over the file system.
pub mod frontends {
    pub use zlogfs_fuse as fuse;
}

pub mod control;
pub mod tools;
