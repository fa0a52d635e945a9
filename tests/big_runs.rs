//! A run's filter and sparse index are single blocks, so flushing or
//! merging more keys than one block can index must cut the output into
//! several runs with disjoint key ranges — not fail (which would latch the
//! engine) — and every key must stay readable.

mod common;
use common::*;
use zlogfs::WriteBatch;

#[test]
fn many_keys_are_cut_into_several_runs() {
    let store = fresh_store(); // 128 KiB segments: blocks of at most 32 KiB
    let opts = zlogfs::Options { memtable_bytes: 64 << 20, run_block_bytes: 4096, ..small_opts() };
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
