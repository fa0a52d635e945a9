//! Several writer and reader threads with background flushing and merging
//! and group commit: every acknowledged write is readable, readers never see
//! a torn batch, and the result survives a reopen.

mod common;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use zlogfs_engine::{Options, WriteBatch};

#[test]
fn writers_readers_and_background_merges() {
    let store = fresh_store();
    let opts = Options { background: true, ..small_opts() };
    let e = Arc::new(open(&store, &opts).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..4u32 {
        let e = e.clone();
        handles.push(std::thread::spawn(move || {
            for i in 0..1500u32 {
                // Each batch writes the same counter under two keys:
                // readers must never see them differ (atomic batches).
                let mut b = WriteBatch::new();
                b.put(format!("t{t}/a"), i.to_be_bytes().to_vec());
                b.put(format!("t{t}/b"), i.to_be_bytes().to_vec());
                b.put(format!("t{t}/k{i:05}"), vec![t as u8; 40]);
                if i % 50 == 0 {
                    e.write_sync(&b).unwrap();
                } else {
                    e.write(&b).unwrap();
                }
            }
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let e = e.clone();
        let stop = stop.clone();
        readers.push(std::thread::spawn(move || {
            let mut checks = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let snap = e.snapshot();
                for t in 0..4u32 {
                    let a = e.get_at(format!("t{t}/a").as_bytes(), snap.seq).unwrap();
                    let b = e.get_at(format!("t{t}/b").as_bytes(), snap.seq).unwrap();
                    assert_eq!(a, b, "a batch was seen half applied");
                    checks += 1;
                }
            }
            checks
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let checks: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(checks > 0);
    assert!(e.background_error().is_none(), "{:?}", e.background_error());
    e.sync().unwrap();
    let all = dump(&e).unwrap();
    assert_eq!(all.len(), 4 * (2 + 1500));
    let stats = e.stats();
    assert!(stats.checkpoint > 0, "background flushes must have run: {stats:?}");
    let e = Arc::try_unwrap(e).ok().expect("threads are done");
    e.close().unwrap();
    let e = open(&store, &opts).unwrap();
    assert_eq!(dump(&e).unwrap(), all);
}
