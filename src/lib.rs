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
//! The layers' own crates are the way to them: tests, benchmarks and
//! the binary name `zlogfs_engine`, `zlogfs_fs` and the front ends'
//! crates, not re-exports here (docs/ARCHITECTURE.md, "Crates").

// serde_json's json! macro recurses once per field: the stats report has
// about fifty.
#![recursion_limit = "256"]

pub mod control;
pub mod tools;
