//! Helpers shared by the engine's randomised test suites.
#![allow(dead_code, reason = "each test program uses a part of the helpers")]

pub mod proc;
pub mod workload;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zlogfs::store::{FaultStore, Geometry, Store};
use zlogfs::{Engine, Options};

/// The seed for a randomised test: `ZLOGFS_SEED` if set, else random;
/// printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let s = std::env::var("ZLOGFS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("{test}: seed {s} (replay with ZLOGFS_SEED={s})");
    s
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

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

/// A new image on a fault-injecting store.
/// A new image on a fault-injecting store that turns every segment the
/// engine frees to junk (as an object store deletes it): a test that
/// reads a freed segment fails.
pub fn fresh_store() -> Arc<FaultStore> {
    let s = Arc::new(FaultStore::new(GEOMETRY));
    s.junk_freed(true);
    zlogfs::mkfs(s.clone()).expect("mkfs");
    s
}

pub fn open(store: &Arc<FaultStore>, opts: &Options) -> zlogfs::Result<Engine> {
    let s: Arc<dyn Store> = store.clone();
    Engine::open(s, opts.clone())
}

pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Keys under this prefix hold a reference to a data block.
pub const BLOB_PREFIX: &str = "blob/";

/// Everything the engine holds, with block references replaced by the
/// blocks' contents (so a lost or stale block shows as wrong data).
pub fn dump(e: &Engine) -> zlogfs::Result<Model> {
    dump_at(e, e.seq())
}

/// [`dump`] as of sequence number `seq`.
pub fn dump_at(e: &Engine, seq: u64) -> zlogfs::Result<Model> {
    let mut m = Model::new();
    for (k, v) in e.scan_at(&[], None, usize::MAX, seq)? {
        if k.starts_with(BLOB_PREFIX.as_bytes()) {
            let v = e.read_block(workload::decode_addr(&v))?;
            m.insert(k, v);
        } else {
            m.insert(k, v);
        }
    }
    Ok(m)
}

pub fn key(r: &mut StdRng) -> Vec<u8> {
    let n = r.gen_range(0..48u32);
    if r.gen_ratio(1, 10) {
        // A long key sharing a prefix with others.
        format!("long/{}/{}", "x".repeat(r.gen_range(1..300)), n).into_bytes()
    } else {
        format!("k{n:03}").into_bytes()
    }
}

pub fn value(r: &mut StdRng) -> Vec<u8> {
    let len = if r.gen_ratio(1, 20) { r.gen_range(1000..6000) } else { r.gen_range(0..120) };
    let fill = r.gen_range(b'a'..=b'z');
    (0..len).map(|i| if i % 7 == 0 { r.gen() } else { fill }).collect()
}

/// Incompressible bytes: `n` of a xorshift stream from `seed` (not 0).
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
