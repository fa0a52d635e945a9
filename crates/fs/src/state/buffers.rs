//! The chunk buffers: file data written since the last commit, a buffer
//! per chunk, and the blocks compressed ahead from full ones.
//!
//! Every buffer counts as a whole chunk against the bound that starts a
//! commit ([`Buffers::bytes`]), whatever its length: the count and the map
//! change together here, and nowhere else.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use zlogfs_engine::codec::CodecSpec;
use zlogfs_engine::engine::{EncodedBlock, Engine};

use crate::keys::Ino;
use crate::lock;

/// The stamp of the next change of any buffer's bytes.
static STAMP: AtomicU64 = AtomicU64::new(1);

/// A buffered chunk.
#[derive(Debug)]
pub(crate) struct Buf {
    /// The chunk's whole logical content. Private, so that every change of
    /// it goes through [`Buf::data_mut`], which renews `stamp`: a block
    /// compressed from the bytes of one stamp is those bytes while the
    /// buffer has that stamp.
    data: Vec<u8>,
    stamp: u64,
    /// Patch blocks written since the buffer was loaded from the stored
    /// chunk (a bit per [`crate::keys::PATCH_BLOCK`]): outside them, `data`
    /// equals the stored chunk. None: the chunk is stored whole at commit
    /// (always, unless patches are on).
    pub touched: Option<Vec<u64>>,
    /// `data` is the chunk's only in the `touched` blocks (zeros elsewhere,
    /// and its length is the chunk's): the rest was never read, because a
    /// chunk of 16 patches is read from 16 packed blocks. Writers of whole
    /// blocks and the cleaner's moves make such buffers; they are stored as
    /// patches, and completed from the stored chunk (`complete`) by
    /// anything that needs the whole chunk. The cleaner drops its own at
    /// the end of a round if they were not stored.
    pub partial: bool,
    /// The chunk size of the file: what the buffer counts as in the
    /// buffers' bytes, and the most `data` holds.
    chunk: u32,
}

impl Buf {
    /// A buffer of a chunk of `chunk` bytes.
    pub(crate) fn new(data: Vec<u8>, touched: Option<Vec<u64>>, partial: bool, chunk: u32) -> Buf {
        debug_assert!(!partial || touched.is_some(), "a partial buffer tracks its blocks");
        debug_assert!(
            data.len() <= chunk as usize,
            "a buffer of {} bytes for a {chunk}-byte chunk",
            data.len()
        );
        Buf { data, stamp: STAMP.fetch_add(1, Ordering::Relaxed), touched, partial, chunk }
    }

    /// The chunk size of the file (see the field).
    pub(crate) fn chunk(&self) -> u32 {
        self.chunk
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }

    /// The bytes, to change: the buffer gets a new stamp.
    pub(crate) fn data_mut(&mut self) -> &mut Vec<u8> {
        self.stamp = STAMP.fetch_add(1, Ordering::Relaxed);
        &mut self.data
    }

    /// Names the buffer's bytes as they are now.
    pub(crate) fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Bytes, touched blocks, partial, stamp.
    pub(crate) fn into_parts(self) -> (Vec<u8>, Option<Vec<u64>>, bool, u64) {
        (self.data, self.touched, self.partial, self.stamp)
    }
}

/// Buffers of many files, by inode and chunk index: what the buffers hand
/// to a commit, and what a failed commit hands back.
pub(crate) type Chunks = HashMap<Ino, BTreeMap<u64, Buf>>;

/// The buffered chunks of the group, counted.
pub(crate) struct Buffers {
    map: Chunks,
    /// Buffers in `map`.
    count: usize,
    /// Their bytes, each counted as a whole chunk of its file.
    bytes: usize,
    /// Buffered bytes (counted whole chunks) past which a commit starts.
    limit: usize,
    ahead: Ahead,
}

impl Buffers {
    pub(crate) fn new(limit: usize) -> Self {
        Buffers {
            map: HashMap::new(),
            count: 0,
            bytes: 0,
            limit: limit.max(1 << 20),
            ahead: Ahead::default(),
        }
    }

    pub(crate) fn get(&self, ino: Ino, idx: u64) -> Option<&Buf> {
        self.map.get(&ino).and_then(|m| m.get(&idx))
    }

    pub(crate) fn get_mut(&mut self, ino: Ino, idx: u64) -> Option<&mut Buf> {
        self.map.get_mut(&ino).and_then(|m| m.get_mut(&idx))
    }

    pub(crate) fn contains(&self, ino: Ino, idx: u64) -> bool {
        self.get(ino, idx).is_some()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Buffered chunks.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Buffered bytes, each buffer counted as a whole chunk.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bound past which a commit starts.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Buffer chunk `idx` of `ino`, which has no buffer yet.
    pub(crate) fn insert(&mut self, ino: Ino, idx: u64, b: Buf) {
        let n = b.chunk as usize;
        let old = self.map.entry(ino).or_default().insert(idx, b);
        debug_assert!(old.is_none(), "chunk {idx} of inode {ino} was buffered twice");
        self.bytes += n;
        match old {
            Some(o) => self.bytes -= o.chunk as usize,
            None => self.count += 1,
        }
    }

    /// Take the buffer of chunk `idx` of `ino` out.
    pub(crate) fn remove(&mut self, ino: Ino, idx: u64) -> Option<Buf> {
        let m = self.map.get_mut(&ino)?;
        let b = m.remove(&idx)?;
        if m.is_empty() {
            self.map.remove(&ino);
        }
        self.count -= 1;
        self.bytes -= b.chunk as usize;
        Some(b)
    }

    /// The buffered chunk indexes of `ino` from `from` on, ascending.
    pub(crate) fn chunks_from(&self, ino: Ino, from: u64) -> Vec<u64> {
        self.map.get(&ino).map(|m| m.range(from..).map(|(&k, _)| k).collect()).unwrap_or_default()
    }

    /// The first buffered chunk index of `ino` at or after `from`.
    pub(crate) fn next_from(&self, ino: Ino, from: u64) -> Option<u64> {
        self.map.get(&ino).and_then(|m| m.range(from..).next().map(|(&k, _)| k))
    }

    /// Every buffer, for a commit to store; the buffers are empty after.
    pub(crate) fn take_all(&mut self) -> Chunks {
        self.count = 0;
        self.bytes = 0;
        std::mem::take(&mut self.map)
    }

    /// Put buffers back (a failed commit's, or the writers' set aside by a
    /// cleaning round). A chunk buffered meanwhile keeps the newer buffer.
    pub(crate) fn restore(&mut self, back: Chunks) {
        for (ino, chunks) in back {
            let m = self.map.entry(ino).or_default();
            for (idx, b) in chunks {
                m.entry(idx).or_insert(b);
            }
        }
        self.count = self.map.values().map(|m| m.len()).sum();
        self.bytes = self.map.values().flat_map(|m| m.values()).map(|b| b.chunk as usize).sum();
    }

    /// Drop every buffer.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.count = 0;
        self.bytes = 0;
    }

    /// Compress chunk `idx` of `ino` with `spec` on the pool now, if it is
    /// buffered whole, full and not tracked for patches, and fewer than
    /// [`AHEAD_BYTES`] of chunks wait for the pool already.
    pub(crate) fn compress_ahead(&mut self, ino: Ino, idx: u64, spec: CodecSpec) {
        let Some(b) = self.get(ino, idx) else { return };
        let cs = b.chunk as usize;
        if self.ahead.jobs.load(Ordering::Relaxed) >= (AHEAD_BYTES / cs).max(1) {
            return;
        }
        if b.partial || b.touched.is_some() || b.data().len() != cs {
            return;
        }
        let (raw, stamp) = (b.data().to_vec(), b.stamp());
        self.ahead.queue(ino, idx, stamp, spec, raw);
    }

    /// The block compressed ahead for chunk `idx` of `ino`, if it was
    /// made from these bytes (`stamp`), at this length and codec.
    pub(crate) fn take_ahead(
        &mut self,
        ino: Ino,
        idx: u64,
        stamp: u64,
        spec: CodecSpec,
        len: usize,
    ) -> Option<EncodedBlock> {
        let a = self.ahead.map.remove(&(ino, idx))?;
        let same = a.stamp == stamp && a.spec == spec && a.len == len;
        // Taken either way: a block of other bytes is dropped, its job
        // stopped.
        a.take().filter(|_| same)
    }

    /// Forget every block compressed ahead (their buffers were stored or
    /// dropped).
    pub(crate) fn clear_ahead(&mut self) {
        for (_, a) in self.ahead.map.drain() {
            a.take();
        }
    }
}

/// Bytes of chunks queued for compression ahead at most (each job holds a
/// copy). fio's 1 MiB sequential writes through the mount, median of 10
/// in turns: 451 MiB/s without compression ahead, 529 with 4 MiB queued
/// at most, 626 with 32 MiB (docs/decisions/2026-11-25-compression-ahead.md).
const AHEAD_BYTES: usize = 32 << 20;

/// Full chunks compressed ahead of their commit, on the pool's threads,
/// while the writes that follow are taken: a sequential write's
/// compression overlaps its receiving instead of stopping it at every
/// commit. The commit uses a block only if its buffer still has the stamp
/// it was compressed at (so the same bytes), the same length and the file
/// the same codec.
#[derive(Default)]
struct Ahead {
    map: HashMap<(Ino, u64), AheadBlock>,
    /// Jobs queued or running on the pool.
    jobs: Arc<AtomicUsize>,
}

struct AheadBlock {
    stamp: u64,
    spec: CodecSpec,
    len: usize,
    slot: Arc<Mutex<Slot>>,
}

enum Slot {
    Queued,
    Running,
    Done(EncodedBlock),
    /// Not wanted any more: a queued job skips its work, a running one
    /// drops its result.
    Dropped,
}

impl AheadBlock {
    /// The block, if its job is done; the job is told to stop otherwise.
    fn take(self) -> Option<EncodedBlock> {
        match std::mem::replace(&mut *lock(&self.slot), Slot::Dropped) {
            Slot::Done(e) => Some(e),
            _ => None,
        }
    }
}

impl Ahead {
    /// Queue the compression of `raw`, the bytes of chunk `idx` of `ino`
    /// at `stamp`, replacing (and stopping) an older job for the chunk.
    fn queue(&mut self, ino: Ino, idx: u64, stamp: u64, spec: CodecSpec, raw: Vec<u8>) {
        let len = raw.len();
        let slot = Arc::new(Mutex::new(Slot::Queued));
        let (job_slot, jobs) = (Arc::clone(&slot), Arc::clone(&self.jobs));
        jobs.fetch_add(1, Ordering::Relaxed);
        rayon::spawn(move || {
            let go = {
                let mut s = lock(&job_slot);
                let queued = matches!(*s, Slot::Queued);
                if queued {
                    *s = Slot::Running;
                }
                queued
            };
            if go {
                let e = Engine::encode_data(ino, spec, &raw);
                let mut s = lock(&job_slot);
                if matches!(*s, Slot::Running) {
                    *s = Slot::Done(e);
                }
            }
            jobs.fetch_sub(1, Ordering::Relaxed);
        });
        if let Some(old) = self.map.insert((ino, idx), AheadBlock { stamp, spec, len, slot }) {
            old.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_the_map() {
        let mut b = Buffers::new(0);
        assert_eq!(b.limit(), 1 << 20, "at least a MiB");
        b.insert(1, 0, Buf::new(vec![1], None, false, 4096));
        b.insert(1, 3, Buf::new(vec![2], None, false, 4096));
        b.insert(2, 0, Buf::new(vec![3], None, false, 65536));
        assert_eq!((b.count(), b.bytes()), (3, 2 * 4096 + 65536), "each counted as a chunk of its file");
        assert_eq!(b.chunks_from(1, 1), vec![3]);
        assert_eq!(b.next_from(1, 1), Some(3));
        assert!(b.remove(1, 0).is_some() && b.remove(1, 0).is_none());
        let all = b.take_all();
        assert!(b.is_empty() && b.bytes() == 0);
        b.insert(2, 0, Buf::new(vec![9], None, false, 65536));
        b.restore(all);
        assert_eq!((b.count(), b.bytes()), (2, 4096 + 65536));
        assert_eq!(b.get(2, 0).map(|x| x.data()[0]), Some(9), "the newer buffer stays");
        b.clear();
        assert!(b.is_empty() && b.get(1, 3).is_none());
    }

    #[test]
    fn a_changed_buffer_has_a_new_stamp() {
        let mut b = Buf::new(vec![0; 8], None, false, 4096);
        let s = b.stamp();
        b.data_mut()[0] = 1;
        assert_ne!(b.stamp(), s);
    }

    #[test]
    fn a_block_compressed_ahead_is_taken_only_for_the_same_bytes() {
        let spec = CodecSpec::new(zlogfs_engine::codec::CodecId::Zstd, 1);
        let mut b = Buffers::new(1 << 20);
        b.insert(7, 0, Buf::new(vec![5; 4096], None, false, 4096));
        b.compress_ahead(7, 0, spec);
        let stamp = b.get(7, 0).map(Buf::stamp).unwrap_or(0);
        // Wait for the pool's job.
        let mut got = None;
        for _ in 0..1000 {
            if b.ahead.jobs.load(Ordering::Relaxed) == 0 {
                got = b.take_ahead(7, 0, stamp, spec, 4096);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(got.is_some(), "the block compressed ahead");
        b.compress_ahead(7, 0, spec);
        assert!(b.take_ahead(7, 0, stamp + 1, spec, 4096).is_none(), "other bytes");
        assert!(b.take_ahead(7, 0, stamp, spec, 4096).is_none(), "taken once");
    }
}
