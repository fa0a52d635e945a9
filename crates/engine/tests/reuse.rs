//! Segment reuse: a long workload on an image far smaller than the bytes it
//! writes. Journal segments die at checkpoints and run segments after
//! merges; the log must recycle them (no cleaner yet) without ever
//! replaying a stale batch left in a reused segment, across clean reopens
//! and power cuts.

mod common;
use std::sync::Arc;

use common::*;
use rand::Rng;
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::engine::{BlockWrite, Room};
use zlogfs_engine::store::{CrashMode, FaultStore, Geometry};
use zlogfs_engine::WriteBatch;

#[test]
fn small_image_recycles_segments_across_crashes() {
    let seed = seed("small_image_recycles_segments_across_crashes");
    let mut r = rng(seed);
    let g = Geometry { segment_size: 128 * 1024, segment_count: 24 };
    let st = Arc::new(FaultStore::new(g));
    zlogfs_engine::mkfs(st.clone()).unwrap();
    let opts = small_opts();
    let mut e = open(&st, &opts).unwrap();
    let mut model = Model::new();
    let mut written = 0u64;
    for i in 0..20000u32 {
        let k = format!("key{:03}", r.gen_range(0..150)).into_bytes();
        let v: Vec<u8> = (0..r.gen_range(100..800)).map(|_| r.gen_range(b'a'..=b'h')).collect();
        written += v.len() as u64;
        let mut b = WriteBatch::new();
        b.put(k.clone(), v.clone());
        e.write(&b).unwrap_or_else(|err| panic!("seed {seed} write {i}: {err}"));
        model.insert(k, v);
        if i % 97 == 0 {
            e.sync().unwrap();
        }
        if i % 400 == 399 {
            e.merge().unwrap_or_else(|err| panic!("seed {seed} merge at {i}: {err}"));
        }
        if i % 1000 == 999 {
            // Power cut right after a sync: nothing may be lost.
            e.sync().unwrap();
            drop(e);
            st.power_cut(
                [CrashMode::TearLast, CrashMode::Reorder, CrashMode::DropUnsynced][(i / 1000 % 3) as usize],
                seed ^ u64::from(i),
            );
            e = open(&st, &opts).unwrap_or_else(|err| panic!("seed {seed} reopen at {i}: {err}"));
            assert_eq!(dump(&e).unwrap(), model, "seed {seed} after crash at {i}");
        }
    }
    let s = e.stats();
    eprintln!("wrote {written} value bytes through a {} byte log; {s:?}", g.capacity());
    assert!(written > 2 * g.capacity(), "the workload must overrun the image to test reuse");
    assert_eq!(dump(&e).unwrap(), model);
}

#[test]
fn full_log_gives_no_space_and_loses_nothing() {
    // Live data that grows until the log is full: writers get NoSpace,
    // never a panic or a damaged image, and everything synced survives.
    let seed = seed("full_log_gives_no_space_and_loses_nothing");
    let mut r = rng(seed);
    let g = Geometry { segment_size: 128 * 1024, segment_count: 12 };
    let st = Arc::new(FaultStore::new(g));
    zlogfs_engine::mkfs(st.clone()).unwrap();
    let opts = small_opts();
    let e = open(&st, &opts).unwrap();
    let mut model = Model::new();
    let mut synced = Model::new();
    let mut full = false;
    for i in 0..100_000u32 {
        let v: Vec<u8> = (0..r.gen_range(200..1500)).map(|_| r.gen()).collect();
        let mut b = WriteBatch::new();
        b.put(format!("key{i:06}"), v.clone());
        match e.write(&b).and_then(|_| if i % 10 == 0 { e.sync() } else { Ok(()) }) {
            Ok(_) => {
                model.insert(format!("key{i:06}").into_bytes(), v);
                if i % 10 == 0 {
                    synced = model.clone();
                }
            }
            Err(zlogfs_engine::Error::NoSpace(msg)) => {
                eprintln!("seed {seed}: full after {i} writes: {msg}");
                full = true;
                break;
            }
            Err(err) => panic!("seed {seed}: expected NoSpace, got {err}"),
        }
    }
    assert!(full, "the log never filled");
    drop(e);
    let e = open(&st, &opts).unwrap_or_else(|err| panic!("seed {seed}: reopen of a full image: {err}"));
    let got = dump(&e).unwrap();
    assert!(got.len() >= synced.len(), "seed {seed}: synced data lost");
    for (k, v) in &synced {
        assert_eq!(got.get(k), Some(v), "seed {seed}");
    }
}

#[test]
fn blocks_that_do_not_fit_are_not_placed_at_all() {
    // A group of data blocks larger than the free log: NoSpace before any
    // of them is placed, so no live, unreferenced block is left behind;
    // a group that fits still goes in afterwards.
    let g = Geometry { segment_size: 128 * 1024, segment_count: 12 };
    let st = Arc::new(FaultStore::new(g));
    zlogfs_engine::mkfs(st.clone()).unwrap();
    let e = open(&st, &small_opts()).unwrap();
    let mut r = rng(seed("blocks_that_do_not_fit_are_not_placed_at_all"));
    let raw: Vec<Vec<u8>> = (0..80).map(|_| (0..30_000).map(|_| r.gen()).collect()).collect();
    let refs: Vec<&[u8]> = raw.iter().map(|v| &v[..]).collect();
    let live0 = e.stats().live_bytes;
    fn writes<'a>(refs: &[&'a [u8]]) -> Vec<BlockWrite<'a>> {
        refs.iter().map(|r| BlockWrite::new(7, CodecSpec::new(CodecId::None, 0), r)).collect()
    }
    let err = e.write_blocks(Room::User, writes(&refs)).expect_err("2.4 MB into 1.5 MB");
    assert!(matches!(err, zlogfs_engine::Error::NoSpace(_)), "{err}");
    assert_eq!(e.stats().live_bytes, live0, "a failed group left live bytes behind");
    let addrs = e.write_blocks(Room::User, writes(&refs[..4])).expect("four blocks fit");
    assert_eq!(e.read_block(addrs[3]).unwrap(), raw[3]);
}
