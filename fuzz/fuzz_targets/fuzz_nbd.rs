//! A client's bytes against the NBD server (handshake, then requests) on
//! an in-memory file system: the server answers or hangs up, never
//! panics. The first byte picks whether a valid handshake comes first
//! (and with structured replies), so that requests are reached.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::store::{Geometry, MemStore, Store};
use zlogfs_fs::{mkfs, Fs, FsOptions, MkfsOptions, SetAttr, ROOT};
use zlogfs_nbd::replay::{handshake, Duplex};

/// A fresh file system per input, so that a crashing input crashes again
/// on its own (one shared across inputs made artifacts that depended on
/// every input before them).
fn fs() -> Arc<Fs> {
    let store: Arc<dyn Store> =
        Arc::new(MemStore::new(Geometry { segment_size: 256 << 10, segment_count: 16 }));
    let small = MkfsOptions { chunk_size: 64 << 10, pack_bytes: 64 << 10, ..MkfsOptions::default() };
    mkfs(store.clone(), &small).expect("mkfs");
    let fs = Fs::open(store, FsOptions { commit_interval: None, ..FsOptions::default() }).expect("open");
    let f = fs.create(ROOT, b"disk", 0o600, 0, 0).expect("create");
    fs.setattr(f.ino, &SetAttr { size: Some(256 << 10), ..SetAttr::default() }).expect("size");
    Arc::new(fs)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut input = if mode & 1 == 0 { handshake("disk", mode & 2 != 0) } else { Vec::new() };
    input.extend_from_slice(rest);
    let d = Duplex::new(input);
    // On this thread (threads' own allocations read as leaks here).
    let _ = zlogfs_nbd::serve_with(d.clone(), d, &fs(), mode & 4 != 0, 0);
});
