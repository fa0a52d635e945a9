//! The cache of decoded run data blocks, shared by every run, sharded and
//! evicting the least recently used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Block;

/// A decoded data block with the tick it was last used at.
type CachedBlock = (Arc<Block>, u64);

const CACHE_SHARDS: usize = 16;

#[derive(Default)]
struct Shard {
    map: HashMap<(u64, u32), CachedBlock>,
    tick: u64,
    used: usize,
}

/// A cache of decoded data blocks, keyed by (run id, block number) so that
/// a reused segment can never serve a stale block. Sharded so that readers
/// on different blocks rarely meet on a lock.
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity: usize,
}

impl BlockCache {
    /// A cache holding about `capacity_bytes` of decoded blocks.
    pub fn new(capacity_bytes: usize) -> BlockCache {
        BlockCache {
            shards: (0..CACHE_SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_capacity: capacity_bytes / CACHE_SHARDS,
        }
    }

    fn shard(&self, key: (u64, u32)) -> std::sync::MutexGuard<'_, Shard> {
        let h =
            key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(key.1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        let i = (h >> 59) as usize % CACHE_SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn get(&self, key: (u64, u32)) -> Option<Arc<Block>> {
        let mut sh = self.shard(key);
        sh.tick += 1;
        let t = sh.tick;
        sh.map.get_mut(&key).map(|(b, last)| {
            *last = t;
            b.clone()
        })
    }

    pub(super) fn insert(&self, key: (u64, u32), block: Arc<Block>) {
        let mut sh = self.shard(key);
        sh.tick += 1;
        let t = sh.tick;
        sh.used += block.bytes();
        if sh.used > self.shard_capacity && sh.map.len() > 4 {
            // Evict the older half.
            let mut ticks: Vec<u64> = sh.map.values().map(|(_, t)| *t).collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 2];
            sh.map.retain(|_, (_, t)| *t > cut);
            sh.used = sh.map.values().map(|(b, _)| b.bytes()).sum::<usize>() + block.bytes();
        }
        if let Some((old, _)) = sh.map.insert(key, (block, t)) {
            sh.used = sh.used.saturating_sub(old.bytes());
        }
    }

    /// Bytes of the blocks it holds.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).used).sum()
    }

    /// Drop every block (memory pressure, `zlogfs drop-caches`): blocks
    /// in use stay alive in their readers' hands. Returns the bytes
    /// dropped.
    pub fn clear(&self) -> usize {
        let mut dropped = 0;
        for s in &self.shards {
            // Freed after the shard's lock is let go.
            let _gone = {
                let mut sh = s.lock().unwrap_or_else(|p| p.into_inner());
                dropped += sh.used;
                sh.used = 0;
                std::mem::take(&mut sh.map)
            };
        }
        dropped
    }

    /// Drop every block of run `id`.
    pub fn forget_run(&self, id: u64) {
        for s in &self.shards {
            let mut sh = s.lock().unwrap_or_else(|p| p.into_inner());
            sh.map.retain(|k, _| k.0 != id);
            sh.used = sh.map.values().map(|(b, _)| b.bytes()).sum();
        }
    }
}
