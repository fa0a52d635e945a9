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

/// Ask the allocator to return what is free to the kernel now (after the
/// caches were dropped): `mi_collect` collects this thread's heap and
/// forces the delayed purges of freed memory program-wide, which an idle
/// daemon otherwise never reaches (it kept its size for the 10 s watched
/// after a 168 MiB drop; blocks still on a busy reader's pages go when
/// that thread next allocates). The binary's allocator is mimalloc; where
/// it is not (this crate's tests), mimalloc's heaps are empty and this
/// does next to nothing.
pub fn give_back_memory() {
    // SAFETY: mi_collect has no preconditions: mimalloc's API lets any
    // thread call it at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
