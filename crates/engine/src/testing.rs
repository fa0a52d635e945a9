//! Helpers for the tests of this crate and of the crates above it (the
//! `testing` feature): a small geometry, options that make flushes and
//! merges happen on little data, a new image on the fault-injecting store.

use std::sync::Arc;

use crate::store::{FaultStore, Geometry, Store};
use crate::{Engine, Options};

/// A small image: 96 segments of 128 KiB.
pub const GEOMETRY: Geometry = Geometry { segment_size: 128 * 1024, segment_count: 96 };

/// Options that make flushes, merges and many blocks happen on small data,
/// deterministically (no background thread).
pub fn small_opts() -> Options {
    Options {
        memtable_bytes: 8 * 1024,
        level0_runs: 3,
        run_block_bytes: 700,
        background: false,
        cache_bytes: 64 * 1024,
        ..Options::default()
    }
}

/// A new image of [`GEOMETRY`] on a fault-injecting store that turns
/// every segment the engine frees to junk (as an object store deletes
/// it): a test that reads a freed segment fails.
///
/// # Panics
/// When mkfs fails on the memory store.
pub fn fresh_store() -> Arc<FaultStore> {
    let s = Arc::new(FaultStore::new(GEOMETRY));
    s.junk_freed(true);
    crate::mkfs(s.clone()).expect("mkfs on a fresh memory store");
    s
}

/// The engine of `store`, opened with `opts`.
pub fn open(store: &Arc<FaultStore>, opts: &Options) -> crate::Result<Engine> {
    let s: Arc<dyn Store> = store.clone();
    Engine::open(s, opts.clone())
}
