mod common;
use common::*;
use zlogfs::WriteBatch;

#[test]
fn put_get_flush_merge_reopen() {
    let store = fresh_store();
    let opts = small_opts();
    let e = open(&store, &opts).unwrap();
    for i in 0..2000u32 {
        let mut b = WriteBatch::new();
        b.put(format!("key{i:05}"), format!("value {i} {}", "z".repeat((i % 50) as usize)));
        e.write(&b).unwrap();
        if i % 3 == 0 {
            let mut b = WriteBatch::new();
            b.delete(format!("key{:05}", i / 2));
            e.write(&b).unwrap();
        }
    }
    e.sync().unwrap();
    let before = dump(&e).unwrap();
    assert!(e.stats().runs > 0, "{:?}", e.stats());
    e.merge().unwrap();
    assert_eq!(e.stats().runs, 1);
    assert_eq!(dump(&e).unwrap(), before);
    assert_eq!(e.get(b"key01999").unwrap(), Some(format!("value 1999 {}", "z".repeat(49)).into_bytes()));
    e.close().unwrap();
    let e = open(&store, &opts).unwrap();
    assert_eq!(dump(&e).unwrap(), before);
    drop(e);
    // Unclean: no close, no sync of the last writes.
    let e = open(&store, &opts).unwrap();
    let mut b = WriteBatch::new();
    b.put("after", "crash");
    e.write(&b).unwrap();
    e.sync().unwrap();
    drop(e);
    let e = open(&store, &opts).unwrap();
    assert_eq!(e.get(b"after").unwrap(), Some(b"crash".to_vec()));
    assert_eq!(dump(&e).unwrap().len(), before.len() + 1);
}
