//! Damage: what the engine worked around at open, checks of every run
//! block, the exact usage check fsck makes, and repair.

use crate::error::{Error, Result};
use crate::log::format::*;
use crate::log::SegUsage;
use crate::store::MetaSlot;

use super::recovery::read_superblock_noting;
use super::{lock, Engine};

/// A data block of an index run that cannot be read.
#[derive(Debug)]
pub struct DamagedBlock {
    /// The run.
    pub run: u64,
    /// The block.
    pub addr: BlockAddr,
    /// The last key of the block before it (the run's first key for its
    /// first block): the block held keys from about here...
    pub from: Vec<u8>,
    /// ...to its own last key, which the run's index names.
    pub to: Vec<u8>,
    /// Why it cannot be read.
    pub error: Error,
}

impl Engine {
    /// The blocks of each index run in use: (run id, index block, filter
    /// block, data blocks).
    pub fn run_blocks(&self) -> Vec<(u64, BlockAddr, BlockAddr, Vec<BlockAddr>)> {
        let ver = self.version();
        ver.runs
            .iter()
            .map(|r| {
                let mut data = r.blocks();
                data.truncate(data.len().saturating_sub(2));
                (r.meta.id, r.meta.index, r.meta.filter, data)
            })
            .collect()
    }

    /// Read every data block of every index run from the store (not the
    /// cache: neither served from it nor added to it), checking its
    /// checksum and that it ends with the key its index entry names: the
    /// damaged ones. The records they held cannot be read.
    pub fn verify_runs(&self) -> Vec<DamagedBlock> {
        let ver = self.version();
        let mut bad = Vec::new();
        for r in &ver.runs {
            for i in 0..r.index.len() {
                if let Err(error) = r.read_block(self.sh.store.as_ref(), i) {
                    let from = if i == 0 { r.meta.min_key.clone() } else { r.index[i - 1].last_key.clone() };
                    let to = r.index[i].last_key.clone();
                    bad.push(DamagedBlock { run: r.meta.id, addr: r.index[i].addr, from, to, error });
                }
            }
        }
        bad
    }

    /// Damage found at open and worked around: each says what and how.
    pub fn damage(&self) -> Vec<String> {
        lock(&self.sh.damage).clone()
    }

    /// Mend what [`Engine::damage`] lists: the superblock rewritten from
    /// its copy, and every run rewritten (a merge writes new index and
    /// filter blocks). Returns what was mended.
    pub fn repair(&self) -> Result<Vec<String>> {
        self.check_ok()?;
        let found = self.damage();
        if found.is_empty() {
            return Ok(found);
        }
        let (_, sb_note) = read_superblock_noting(self.sh.store.as_ref())?;
        if sb_note.is_some() {
            self.sh
                .store
                .write_meta(MetaSlot::Super, &self.sh.sb.encode())
                .map_err(|e| Error::io("rewriting the superblock", e))?;
            self.sh.store.sync().map_err(|e| Error::io("syncing the superblock", e))?;
        }
        Self::keep_superblock_copy(&self.sh)?;
        self.merge()?;
        lock(&self.sh.damage).clear();
        Ok(found)
    }

    /// Per segment, the usage count and the bytes of the engine's own live
    /// blocks in it: the blocks of the index runs in use and of those
    /// waiting for a checkpoint to free them, the journal blocks recovery
    /// still reads, and the two checkpoint bodies in use. With the data
    /// blocks the layer above references, they should make the count
    /// exactly (fsck checks it); taken under the locks a merge and a
    /// flush hold, so no run is half written. Pending frees and writes are made
    /// durable first.
    pub fn usage_check(&self) -> Result<Vec<(SegUsage, u64)>> {
        self.sync()?;
        // Blocks of a run being written may wait in a batch, not counted
        // yet: no merge runs while this counts.
        let _m = lock(&self.sh.merge_lock);
        let _g = lock(&self.sh.ckpt_lock);
        let ver = self.version();
        let core = lock(&self.sh.core);
        let mut own = vec![0u64; core.log.usage.len()];
        let mut add = |a: BlockAddr| {
            if let Some(n) = own.get_mut(a.seg as usize) {
                *n += u64::from(a.len);
            }
        };
        for r in &ver.runs {
            r.blocks().into_iter().for_each(&mut add);
        }
        core.ckpt.deferred.iter().for_each(|&(_, a)| add(a));
        core.log.journal_blocks.iter().for_each(|&(_, seg, len)| add(BlockAddr { seg, offset: 0, len }));
        core.ckpt.body.iter().chain(&core.ckpt.prev_body).for_each(|&a| add(a));
        Ok(core.log.usage.iter().copied().zip(own).collect())
    }
}
