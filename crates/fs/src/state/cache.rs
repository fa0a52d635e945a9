//! The cache of decompressed blocks, and its epoch.
//!
//! A block is cached under its address. An address holds another block
//! once its segment is freed and written again, so the cache forgets a
//! block when the file system releases it and forgets whole segments the
//! cleaner reclaims. Reads that fetch blocks outside the lock (read-ahead
//! of uncached blocks) insert them only if the epoch did not move while
//! they read: the epoch moves whenever blocks may be placed or freed (a
//! commit, storing buffered chunks, a release, a reclaim).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use zlogfs_engine::BlockAddr;

/// Decompressed blocks, evicted first-in first-out, under a byte bound.
pub(crate) struct BlockCache {
    map: HashMap<BlockAddr, Arc<Vec<u8>>>,
    order: VecDeque<BlockAddr>,
    bytes: usize,
    limit: usize,
    epoch: u64,
}

impl BlockCache {
    /// An empty cache of at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        BlockCache { map: HashMap::new(), order: VecDeque::new(), bytes: 0, limit, epoch: 0 }
    }

    pub(crate) fn get(&self, a: &BlockAddr) -> Option<Arc<Vec<u8>>> {
        self.map.get(a).cloned()
    }

    /// Cache `v` as the block at `a`, evicting the oldest past the bound;
    /// a block larger than the whole cache is not kept.
    pub(crate) fn insert(&mut self, a: BlockAddr, v: Arc<Vec<u8>>) {
        if v.len() > self.limit {
            return;
        }
        self.bytes += v.len();
        if let Some(old) = self.map.insert(a, v) {
            self.bytes -= old.len();
        } else {
            self.order.push_back(a);
        }
        while self.bytes > self.limit {
            let Some(o) = self.order.pop_front() else { break };
            if let Some(old) = self.map.remove(&o) {
                self.bytes -= old.len();
            }
        }
        debug_assert!(
            self.bytes <= self.limit,
            "the cache holds {} bytes past its bound {}",
            self.bytes,
            self.limit
        );
    }

    /// Forget the block at `a` (released: its address may hold another
    /// once the release commits), and move the epoch: a read under way
    /// that fetched the block before the release must not put it back.
    pub(crate) fn remove(&mut self, a: &BlockAddr) {
        if let Some(old) = self.map.remove(a) {
            self.bytes -= old.len();
        }
        self.epoch += 1;
    }

    /// Forget every block of segments `segs` (freed: their addresses will
    /// hold other blocks).
    pub(crate) fn forget_segments(&mut self, segs: &[u32]) {
        let gone: Vec<BlockAddr> = self.map.keys().filter(|a| segs.contains(&a.seg)).copied().collect();
        for a in gone {
            self.remove(&a);
        }
    }

    /// Forget every block, the tables' own memory too. The epoch stays: a
    /// drop moves no block, so what a read under way fetched is still what
    /// its address holds (a caller whose blocks moved calls
    /// [`BlockCache::moved`] as well). Returns the bytes it held and the
    /// blocks, for the caller to free outside its lock.
    pub(crate) fn clear(&mut self) -> (usize, HashMap<BlockAddr, Arc<Vec<u8>>>) {
        let held = self.bytes;
        self.order = VecDeque::new();
        self.bytes = 0;
        (held, std::mem::take(&mut self.map))
    }

    /// Bytes of the blocks it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The epoch: a block read while it stays the same is what its
    /// address holds.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Blocks may be placed or freed from now on: move the epoch.
    pub(crate) fn moved(&mut self) {
        self.epoch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(seg: u32, offset: u32) -> BlockAddr {
        BlockAddr { seg, offset, len: 10 }
    }

    #[test]
    fn evicts_oldest_first_within_the_bound() {
        let mut c = BlockCache::new(100);
        c.insert(addr(1, 0), Arc::new(vec![0; 40]));
        c.insert(addr(1, 1), Arc::new(vec![1; 40]));
        c.insert(addr(2, 0), Arc::new(vec![2; 40]));
        assert!(c.get(&addr(1, 0)).is_none(), "the oldest went");
        assert_eq!(c.get(&addr(2, 0)).map(|b| b[0]), Some(2));
        c.insert(addr(3, 0), Arc::new(vec![3; 101]));
        assert!(c.get(&addr(3, 0)).is_none(), "larger than the cache");
        c.forget_segments(&[1]);
        assert!(c.get(&addr(1, 1)).is_none());
        assert!(c.get(&addr(2, 0)).is_some());
        let e = c.epoch();
        c.moved();
        assert!(c.epoch() > e);
        // A release moves it too, cached or not: a read that fetched the
        // block outside the lock must not cache it after its release.
        let e = c.epoch();
        c.remove(&addr(9, 0));
        assert!(c.epoch() > e, "a release moves the epoch");
    }
}
