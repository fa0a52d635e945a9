//! A run's filter and sparse index are single blocks, so flushing or
//! merging more keys than one block can index must cut the output into
//! several runs with disjoint key ranges — not fail (which would latch the
//! engine) — and every key must stay readable.

mod common;
use common::*;
use zlogfs_engine::WriteBatch;

#[test]
fn many_keys_are_cut_into_several_runs() {
    let store = fresh_store(); // 128 KiB segments: blocks of at most 32 KiB
    let opts = zlogfs_engine::Options { memtable_bytes: 64 << 20, run_block_bytes: 4096, ..small_opts() };
    let e = open(&store, &opts).unwrap();
    let n = 60_000u32;
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut b = WriteBatch::new();
        for &i in chunk {
            b.put((i * 7919 % n).to_be_bytes().to_vec(), i.to_le_bytes().to_vec());
        }
        e.write(&b).unwrap();
    }
    e.flush().unwrap();
    let runs = e.stats().runs;
    assert!(runs >= 3, "60,000 keys must not fit one run at 128 KiB segments: {runs} runs");
    // Deletes of every third key, then a full merge of everything.
    let mut b = WriteBatch::new();
    for i in (0..n).step_by(3) {
        b.delete(i.to_be_bytes().to_vec());
        if b.ops.len() == 500 {
            e.write(&b).unwrap();
            b = WriteBatch::new();
        }
    }
    e.write(&b).unwrap();
    e.flush().unwrap();
    e.merge().unwrap();
    assert!(e.stats().runs >= 2);
    for i in (0..n).step_by(97) {
        let got = e.get(&i.to_be_bytes()).unwrap();
        assert_eq!(got.is_some(), i % 3 != 0, "key {i}");
    }
    let all = e.scan(&[], None, usize::MAX).unwrap();
    assert_eq!(all.len() as u32, n - n.div_ceil(3));
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "scan must be sorted and unique");
    e.close().unwrap();
    let e = open(&store, &opts).unwrap();
    assert_eq!(e.scan(&[], None, usize::MAX).unwrap(), all);
}

/// More keys than a few full runs hold (issue 45): a merge of full runs
/// wrote as many runs again, and the engine merged them for ever inside a
/// write (an import stalled at 1.2 million files, another spun while
/// closing). Merges by level are each bounded and end: every write and
/// the close return, level 0 holds at most `level0_runs` runs after the
/// close, the pieces of deeper levels are what a get probes (one a
/// level), and every key reads back.
#[test]
fn more_keys_than_full_runs_hold_do_not_stall_writes() {
    let geometry = zlogfs_engine::store::Geometry { segment_size: 128 << 10, segment_count: 512 };
    let store = std::sync::Arc::new(zlogfs_engine::store::FaultStore::new(geometry));
    zlogfs_engine::mkfs(store.clone()).expect("mkfs");
    // 128 KiB segments: a run holds at most 23,592 keys.
    let opts = zlogfs_engine::Options { memtable_bytes: 256 << 10, run_block_bytes: 4096, ..small_opts() };
    let n = 150_000u32;
    let (tx, rx) = std::sync::mpsc::channel();
    let s = store.clone();
    let o = opts.clone();
    std::thread::spawn(move || {
        let e = open(&s, &o).unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut b = WriteBatch::new();
            for &i in chunk {
                b.put((i * 7919 % n).to_be_bytes().to_vec(), i.to_le_bytes().to_vec());
            }
            e.write(&b).unwrap();
        }
        e.close().unwrap();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(120))
        .expect("150,000 keys into runs of 23,592: the writes or the close did not finish in 2 minutes");
    let e = open(&store, &opts).unwrap();
    let st = e.stats();
    eprintln!("{} runs, by level {:?}, {} entries", st.runs, st.runs_by_level, st.run_entries);
    assert!(st.runs > 7, "{} runs: more than full runs hold were written", st.runs);
    assert!(st.runs_by_level[0] <= opts.level0_runs, "level 0 after the close: {:?}", st.runs_by_level);
    assert!(st.runs_by_level.len() <= 4, "levels: {:?}", st.runs_by_level);
    for i in (0..n).step_by(101) {
        let k = i * 7919 % n;
        assert_eq!(e.get(&k.to_be_bytes()).unwrap(), Some(i.to_le_bytes().to_vec()), "key {k}");
    }
    let all = e.scan(&[], None, usize::MAX).unwrap();
    assert_eq!(all.len() as u32, n, "every key once");
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "scan must be sorted and unique");
    e.close().unwrap();
}
