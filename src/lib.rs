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
/// caches were dropped): blocks freed by one thread belong to the pages of
/// the threads that read them, which mimalloc purges only when those
/// threads next allocate; an idle daemon kept its size for minutes. The
/// binary's allocator is mimalloc; where it is not (this crate's tests),
/// mimalloc's own heap is empty and this does nothing.
pub fn give_back_memory() {
    // SAFETY: mi_collect has no preconditions: mimalloc's API lets any
    // thread call it at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
