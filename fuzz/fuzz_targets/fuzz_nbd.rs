//! A client's bytes against the NBD server (handshake, then requests) on
//! an in-memory file system: the server answers or hangs up, never
//! panics. The first byte picks whether a valid handshake comes first
//! (and with structured replies), so that requests are reached, whether
//! the export is read-only, and whether the file system is full.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::store::{Geometry, MemStore, Store};
use zlogfs_fs::{mkfs, Fs, FsOptions, MkfsOptions, SetAttr, ROOT};
use zlogfs_nbd::replay::{handshake, Duplex};

/// A store holding a file system with the exported file and, when
/// `full`, another file that fills it, so that requests meet ENOSPC (a
/// file system shared across inputs reached that only after many).
fn prepared(full: bool) -> MemStore {
    let store = Arc::new(MemStore::new(Geometry { segment_size: 256 << 10, segment_count: 8 }));
    let small = MkfsOptions { chunk_size: 64 << 10, pack_bytes: 64 << 10, ..MkfsOptions::default() };
    let s: Arc<dyn Store> = store.clone();
    mkfs(s.clone(), &small).expect("mkfs");
    let fs = Fs::open(s, FsOptions { commit_interval: None, ..FsOptions::default() }).expect("open");
    let f = fs.create(ROOT, b"disk", 0o600, 0, 0).expect("create");
    fs.setattr(f.ino, &SetAttr { size: Some(256 << 10), ..SetAttr::default() }).expect("size");
    if full {
        let g = fs.create(ROOT, b"filler", 0o600, 0, 0).expect("create");
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = vec![0u8; 256 << 10];
        for at in (0..).step_by(noise.len()) {
            for b in noise.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            if fs.write(g.ino, at, &noise).is_err() {
                break;
            }
        }
    }
    fs.close().expect("close");
    store.fork()
}

/// A fresh file system per input, opened on a copy of a prepared store,
/// so that a crashing input crashes again on its own (one file system
/// shared across inputs made artifacts that depended on every input
/// before them).
fn fs(full: bool) -> Arc<Fs> {
    static STORES: OnceLock<[MemStore; 2]> = OnceLock::new();
    let stores = STORES.get_or_init(|| [prepared(false), prepared(true)]);
    let store: Arc<dyn Store> = Arc::new(stores[usize::from(full)].fork());
    Arc::new(Fs::open(store, FsOptions { commit_interval: None, ..FsOptions::default() }).expect("open"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut input = if mode & 1 == 0 { handshake("disk", mode & 2 != 0) } else { Vec::new() };
    input.extend_from_slice(rest);
    let d = Duplex::new(input);
    // On this thread (threads' own allocations read as leaks here).
    let _ = zlogfs_nbd::serve_with(d.clone(), d, &fs(mode & 8 != 0), mode & 4 != 0, 0);
});
