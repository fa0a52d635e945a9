//! Helpers for the tests of this crate and of the crates above it (the
//! `testing` feature): a new file system in one call, written once.

use std::sync::Arc;

use zlogfs_engine::store::{Geometry, MemStore, Store};

use crate::{mkfs, Fs, FsOptions, MkfsOptions};

/// `o` for a test: no commit thread (the test commits when it says).
pub fn quiet(o: FsOptions) -> FsOptions {
    FsOptions { commit_interval: None, ..o }
}

/// The file system on `store`, opened with `opts`.
///
/// # Panics
/// When it does not open.
pub fn open(store: &Arc<dyn Store>, opts: FsOptions) -> Fs {
    Fs::open(store.clone(), opts).expect("open the test's file system")
}

/// A new file system made with `mk` on `store`, opened with `opts`.
///
/// # Panics
/// When mkfs or open fails.
pub fn fresh_on(store: Arc<dyn Store>, mk: &MkfsOptions, opts: FsOptions) -> (Arc<dyn Store>, Fs) {
    mkfs(store.clone(), mk).expect("mkfs on the test's store");
    let fs = open(&store, opts);
    (store, fs)
}

/// A new file system on a memory store of `g`, made with the defaults and
/// opened without a commit thread.
///
/// # Panics
/// When mkfs or open fails.
pub fn fresh(g: Geometry) -> (Arc<dyn Store>, Fs) {
    fresh_on(Arc::new(MemStore::new(g)), &MkfsOptions::default(), quiet(FsOptions::default()))
}
