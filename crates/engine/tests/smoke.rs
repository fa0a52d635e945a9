//! Smoke tests of the engine: put, get, flush, merge, reopen; and an
//! open after a clean close that does not scan the log.

mod common;
use common::*;
use zlogfs_engine::WriteBatch;

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

/// Counts the bytes read through it.
struct CountingStore {
    inner: std::sync::Arc<zlogfs_engine::store::FaultStore>,
    read: std::sync::atomic::AtomicU64,
}

impl zlogfs_engine::store::Store for CountingStore {
    fn geometry(&self) -> zlogfs_engine::store::Geometry {
        self.inner.geometry()
    }
    fn read_meta(
        &self,
        slot: zlogfs_engine::store::MetaSlot,
        buf: &mut [u8; zlogfs_engine::store::META_SLOT_SIZE],
    ) -> std::io::Result<()> {
        self.read.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.inner.read_meta(slot, buf)
    }
    fn write_meta(
        &self,
        slot: zlogfs_engine::store::MetaSlot,
        buf: &[u8; zlogfs_engine::store::META_SLOT_SIZE],
    ) -> std::io::Result<()> {
        self.inner.write_meta(slot, buf)
    }
    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> std::io::Result<()> {
        self.read.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.inner.read(seg, offset, buf)
    }
    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> std::io::Result<()> {
        self.inner.write(seg, offset, data)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn discard(&self, seg: u32) -> std::io::Result<()> {
        self.inner.discard(seg)
    }
}

/// A clean close flushes the index, so the next open reads the index and
/// not the log: it used to scan every batch since the last memtable flush,
/// data blocks included.
#[test]
fn open_after_a_clean_close_does_not_scan_the_log() {
    use rand::RngCore;
    let seed = seed("open_after_a_clean_close_does_not_scan_the_log");
    let mut r = rng(seed);
    let store = fresh_store();
    // A memtable that never fills here: without the close's flush, the
    // whole log would be replayed.
    let opts = zlogfs_engine::Options { memtable_bytes: 1 << 20, ..small_opts() };
    let e = open(&store, &opts).unwrap();
    let mut data = vec![0u8; 16 << 10];
    for i in 0..128u32 {
        r.fill_bytes(&mut data);
        workload::write_blob(&e, format!("{BLOB_PREFIX}{i:04}").as_bytes(), &data).unwrap();
    }
    e.sync().unwrap();
    let before = dump(&e).unwrap();
    e.close().unwrap();

    let counting = std::sync::Arc::new(CountingStore { inner: store.clone(), read: 0.into() });
    let s: std::sync::Arc<dyn zlogfs_engine::store::Store> = counting.clone();
    let e = zlogfs_engine::Engine::open(s, opts.clone()).unwrap();
    let at_open = counting.read.load(std::sync::atomic::Ordering::Relaxed);
    // 2 MiB of data went into the log; open may read the metadata slots,
    // the checkpoint, the index run and the rest of the tail segment.
    let bound = 3 * u64::from(GEOMETRY.segment_size);
    assert!(at_open < bound, "open read {at_open} bytes (bound {bound}) after a clean close");
    assert_eq!(dump(&e).unwrap(), before);
}
