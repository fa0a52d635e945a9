//! Helpers shared by the engine's randomised test suites (the seed, the
//! small image and options are zlogfs-testkit's and the engine's
//! `testing` module's).
#![allow(dead_code, unused_imports, reason = "each test program uses a part of the helpers")]

pub mod workload;

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;
use zlogfs_engine::Engine;

pub use zlogfs_engine::testing::{fresh_store, open, small_opts, GEOMETRY};
pub use zlogfs_testkit::{rng, seed};

pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Keys under this prefix hold a reference to a data block.
pub const BLOB_PREFIX: &str = "blob/";

/// Everything the engine holds, with block references replaced by the
/// blocks' contents (so a lost or stale block shows as wrong data).
pub fn dump(e: &Engine) -> zlogfs_engine::Result<Model> {
    dump_at(e, e.seq())
}

/// [`dump`] as of sequence number `seq`.
pub fn dump_at(e: &Engine, seq: u64) -> zlogfs_engine::Result<Model> {
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
