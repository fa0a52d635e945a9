//! The index: an LSM tree of (key, sequence number, value or tombstone).
//!
//! New versions go to the active [`Memtable`]; a full memtable is frozen and
//! flushed into a sorted [`run::Run`]; runs are merged in the background.
//! Reads look at the memtables, then the runs from newest to oldest, and
//! take the newest version whose sequence number is at most the one read at.
//!
//! A range scan merges a cursor per memtable (256 versions copied per lock)
//! with a cursor per run whose key range meets the scan's. Decoded blocks
//! are cached in 16 shards keyed by (run id, block); run ids are never
//! reused, addresses are.

pub mod run;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering as AtOrd};
use std::sync::{Arc, RwLock};

use crate::error::Result;
use run::cmp_internal;

/// Largest key.
pub const MAX_KEY: usize = 4096;
/// Largest value.
pub const MAX_VALUE: usize = 64 * 1024;

/// One version of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The user key.
    pub key: Vec<u8>,
    /// Sequence number of the mutation that wrote it.
    pub seq: u64,
    /// The value; `None` is a tombstone (the key was deleted).
    pub value: Option<Vec<u8>>,
}

/// Memtable order: key ascending, then sequence number descending.
type MemKey = (Vec<u8>, Reverse<u64>);

/// Memory a memtable counts per version besides its key and value.
const MEM_ENTRY_OVERHEAD: usize = 64;

/// A run's bytes per entry besides its key and value, at most: the
/// varints of the shared prefix, suffix length, sequence number and value
/// length, and the type byte (FORMAT.md 3.2), and the entry's share of
/// its block's index entry, filter bits and headers.
const RUN_ENTRY_OVERHEAD: usize = 32;

/// The in-memory sorted buffer of recent versions.
#[derive(Default)]
pub struct Memtable {
    map: RwLock<BTreeMap<MemKey, Option<Vec<u8>>>>,
    bytes: AtomicUsize,
}

impl Memtable {
    /// An empty memtable.
    pub fn new() -> Memtable {
        Memtable::default()
    }

    /// Insert one version.
    pub fn insert(&self, key: Vec<u8>, seq: u64, value: Option<Vec<u8>>) {
        let sz = key.len() + value.as_ref().map_or(0, |v| v.len()) + MEM_ENTRY_OVERHEAD;
        self.bytes.fetch_add(sz, AtOrd::Relaxed);
        let mut m = self.map.write().unwrap_or_else(|p| p.into_inner());
        m.insert((key, Reverse(seq)), value);
    }

    /// Approximate memory used.
    pub fn bytes(&self) -> usize {
        self.bytes.load(AtOrd::Relaxed)
    }

    /// At most the bytes its run takes in the log, before compression:
    /// each version's key and value and [`RUN_ENTRY_OVERHEAD`].
    pub fn run_bytes_bound(&self) -> usize {
        self.bytes().saturating_sub(self.len() * (MEM_ENTRY_OVERHEAD - RUN_ENTRY_OVERHEAD))
    }

    /// Number of versions.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Newest version of `key` at or below `seq`.
    pub fn get(&self, key: &[u8], seq: u64) -> Option<Option<Vec<u8>>> {
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        if m.is_empty() {
            return None;
        }
        // (key, Reverse(seq)) sorts before older versions of key.
        let lo = (key.to_vec(), Reverse(seq));
        m.range(lo..).next().filter(|((k, _), _)| k.as_slice() == key).map(|(_, v)| v.clone())
    }

    /// Every version in internal order (tests; readers use a cursor).
    #[cfg(test)]
    pub fn entries(&self) -> Vec<Entry> {
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|((k, Reverse(s)), v)| Entry { key: k.clone(), seq: *s, value: v.clone() }).collect()
    }

    /// A cursor over the versions of `[start, end)` in internal order,
    /// copying [`MEM_CURSOR_BATCH`] versions at a time under the lock,
    /// each batch resuming just after the last version it gave: a scan
    /// takes what it reads, not the rest of the range (copied whole for
    /// every page, listing a directory of a million entries in the
    /// memtable was quadratic; issue 45). Versions inserted meanwhile
    /// may or may not be seen; they are newer than any sequence number
    /// read at when the cursor was made.
    pub fn cursor(self: &Arc<Self>, start: &[u8], end: Option<&[u8]>) -> MemCursor {
        MemCursor {
            mem: self.clone(),
            from: Bound::Included((start.to_vec(), Reverse(u64::MAX))),
            end: end.map(<[u8]>::to_vec),
            buf: std::collections::VecDeque::new(),
            done: false,
        }
    }
}

/// Versions a [`MemCursor`] copies per lock.
const MEM_CURSOR_BATCH: usize = 256;

/// See [`Memtable::cursor`].
pub struct MemCursor {
    mem: Arc<Memtable>,
    /// Where the next batch starts: the first version, or just after the
    /// last one given (internal keys are unique, so resuming is exact).
    from: Bound<MemKey>,
    end: Option<Vec<u8>>,
    buf: std::collections::VecDeque<Entry>,
    done: bool,
}

impl MemCursor {
    fn refill(&mut self) {
        let m = self.mem.map.read().unwrap_or_else(|p| p.into_inner());
        for ((k, Reverse(s)), v) in m.range((self.from.clone(), Bound::Unbounded)).take(MEM_CURSOR_BATCH) {
            if self.end.as_ref().is_some_and(|e| k >= e) {
                self.done = true;
                break;
            }
            self.buf.push_back(Entry { key: k.clone(), seq: *s, value: v.clone() });
        }
        match self.buf.back() {
            Some(e) if self.buf.len() == MEM_CURSOR_BATCH => {
                self.from = Bound::Excluded((e.key.clone(), Reverse(e.seq)));
            }
            _ => self.done = true,
        }
    }
}

impl Iterator for MemCursor {
    type Item = Entry;
    fn next(&mut self) -> Option<Entry> {
        if self.buf.is_empty() && !self.done {
            self.refill();
        }
        self.buf.pop_front()
    }
}

/// Merges sorted sources of entries into one stream in internal order.
/// Sources earlier in the list win ties (they never occur: every version
/// has its own sequence number).
pub struct MergeIter<I: Iterator<Item = Result<Entry>>> {
    sources: Vec<I>,
    heap: BinaryHeap<Reverse<HeapItem>>,
    failed: bool,
}

/// A heap item: an entry and the source it came from.
#[derive(PartialEq, Eq)]
pub struct HeapItem(Entry, usize);

impl Ord for HeapItem {
    fn cmp(&self, o: &Self) -> Ordering {
        cmp_internal(&self.0.key, self.0.seq, &o.0.key, o.0.seq).then(self.1.cmp(&o.1))
    }
}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl<I: Iterator<Item = Result<Entry>>> MergeIter<I> {
    /// Merge `sources`, each already in internal order.
    pub fn new(sources: Vec<I>) -> Result<Self> {
        let mut m = MergeIter { sources, heap: BinaryHeap::new(), failed: false };
        for i in 0..m.sources.len() {
            m.pull(i)?;
        }
        Ok(m)
    }

    fn pull(&mut self, i: usize) -> Result<()> {
        if let Some(e) = self.sources[i].next() {
            self.heap.push(Reverse(HeapItem(e?, i)));
        }
        Ok(())
    }
}

impl<I: Iterator<Item = Result<Entry>>> Iterator for MergeIter<I> {
    type Item = Result<Entry>;
    fn next(&mut self) -> Option<Result<Entry>> {
        if self.failed {
            return None;
        }
        let Reverse(HeapItem(e, i)) = self.heap.pop()?;
        if let Err(err) = self.pull(i) {
            self.failed = true;
            return Some(Err(err));
        }
        Some(Ok(e))
    }
}

/// Keep what reads at or after `horizon`, and at each of the kept
/// `points` (ascending), can see: every version newer than `horizon`, and
/// per key the newest version at or below the horizon and at or below
/// each point. A tombstone so kept is dropped when `drop_tombstones` says
/// no older run exists and no point lies below it (then nothing older is
/// kept either, so its absence reads the same).
pub fn retain_versions<'a>(
    input: impl Iterator<Item = Result<Entry>> + 'a,
    horizon: u64,
    points: &'a [u64],
    drop_tombstones: bool,
) -> impl Iterator<Item = Result<Entry>> + 'a {
    // The seqs a read may ask for at or below the horizon: the points
    // under it, then the horizon itself.
    let below = points.partition_point(|&p| p < horizon);
    let targets: Vec<u64> = points[..below].iter().copied().chain(std::iter::once(horizon)).collect();
    let mut last_key: Option<Vec<u8>> = None;
    // The seq of the previous (newer) version of the same key.
    let mut newer = u64::MAX;
    input.filter_map(move |r| {
        let e = match r {
            Ok(e) => e,
            Err(err) => return Some(Err(err)),
        };
        if last_key.as_deref() != Some(e.key.as_slice()) {
            last_key = Some(e.key.clone());
            newer = u64::MAX;
        }
        let next_newer = std::mem::replace(&mut newer, e.seq);
        if e.seq > horizon {
            return Some(Ok(e));
        }
        // Kept when some target sees it: a target at or above its seq and
        // below the next newer version's.
        let i = targets.partition_point(|&t| t < e.seq);
        if targets.get(i).is_none_or(|&t| t >= next_newer) {
            return None;
        }
        if e.value.is_none() && drop_tombstones && i == 0 {
            return None;
        }
        Some(Ok(e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(k: &str, seq: u64, v: Option<&str>) -> Entry {
        Entry { key: k.as_bytes().to_vec(), seq, value: v.map(|v| v.as_bytes().to_vec()) }
    }

    #[test]
    fn memtable_versions() {
        let m = Memtable::new();
        m.insert(b"a".to_vec(), 1, Some(b"1".to_vec()));
        m.insert(b"a".to_vec(), 3, None);
        m.insert(b"a".to_vec(), 5, Some(b"5".to_vec()));
        assert_eq!(m.get(b"a", 0), None);
        assert_eq!(m.get(b"a", 2), Some(Some(b"1".to_vec())));
        assert_eq!(m.get(b"a", 4), Some(None));
        assert_eq!(m.get(b"a", 9), Some(Some(b"5".to_vec())));
        assert_eq!(m.get(b"b", 9), None);
        assert_eq!(m.entries().iter().map(|e| e.seq).collect::<Vec<_>>(), vec![5, 3, 1]);
    }

    #[test]
    fn merge_and_retain() {
        let a = vec![Ok(e("a", 5, Some("x"))), Ok(e("c", 2, None))];
        let b = vec![Ok(e("a", 1, Some("y"))), Ok(e("b", 3, Some("z"))), Ok(e("c", 1, Some("w")))];
        let merged: Vec<Entry> =
            MergeIter::new(vec![a.into_iter(), b.into_iter()]).unwrap().map(|r| r.unwrap()).collect();
        let order: Vec<(String, u64)> =
            merged.iter().map(|e| (String::from_utf8(e.key.clone()).unwrap(), e.seq)).collect();
        assert_eq!(
            order,
            vec![("a".into(), 5), ("a".into(), 1), ("b".into(), 3), ("c".into(), 2), ("c".into(), 1)]
        );
        let kept: Vec<Entry> =
            retain_versions(merged.clone().into_iter().map(Ok), 10, &[], true).map(|r| r.unwrap()).collect();
        assert_eq!(kept, vec![e("a", 5, Some("x")), e("b", 3, Some("z"))]);
        let kept: Vec<Entry> =
            retain_versions(merged.into_iter().map(Ok), 1, &[], false).map(|r| r.unwrap()).collect();
        assert_eq!(kept.len(), 5);
    }

    /// What a read at `seq` sees of `key` in `entries` (internal order).
    fn read_at(entries: &[Entry], key: &[u8], seq: u64) -> Option<Vec<u8>> {
        entries.iter().find(|e| e.key == key && e.seq <= seq).and_then(|e| e.value.clone())
    }

    /// Random version histories merged with random points and horizons:
    /// every read at the horizon, above it, or at a point sees what it saw
    /// before, and nothing else is kept.
    #[test]
    fn retained_versions_read_the_same_at_every_point() {
        use rand::{Rng, SeedableRng};
        let seed = zlogfs_testkit::seed("retained versions");
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        for round in 0..500 {
            let mut all = Vec::new();
            let mut seq = 0;
            for k in 0..r.gen_range(1..6u8) {
                for _ in 0..r.gen_range(1..12) {
                    seq += r.gen_range(1..4);
                    let v = r.gen_bool(0.8).then(|| vec![k, seq as u8]);
                    all.push(Entry { key: vec![k], seq, value: v });
                }
            }
            all.sort_by(|a, b| a.key.cmp(&b.key).then(b.seq.cmp(&a.seq)));
            let horizon = r.gen_range(0..=seq + 1);
            let mut points: Vec<u64> = (0..r.gen_range(0..6)).map(|_| r.gen_range(0..=seq + 1)).collect();
            points.sort_unstable();
            points.dedup();
            let bottom = r.gen_bool(0.5);
            let kept: Vec<Entry> = retain_versions(all.clone().into_iter().map(Ok), horizon, &points, bottom)
                .map(|x| x.unwrap())
                .collect();
            let reads: Vec<u64> = points.iter().copied().chain(horizon..=seq + 1).collect();
            for k in 0..6u8 {
                for &at in &reads {
                    assert_eq!(
                        read_at(&kept, &[k], at),
                        read_at(&all, &[k], at),
                        "round {round}: key {k} at {at}, horizon {horizon}, points {points:?}"
                    );
                }
            }
            // Nothing kept that no read needs: each kept version at or
            // below the horizon is the one some read sees.
            for e in kept.iter().filter(|e| e.seq <= horizon && e.value.is_some()) {
                let seen = reads.iter().any(|&at| {
                    all.iter().find(|x| x.key == e.key && x.seq <= at).is_some_and(|x| x.seq == e.seq)
                });
                assert!(seen, "round {round}: kept {e:?} that no read sees");
            }
        }
    }
}
