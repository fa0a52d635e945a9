//! Checkpoints: the body (run list, usage, deferred frees; FORMAT.md
//! §3.5), and writing one, which makes frees and flushed journal blocks
//! final.

use std::sync::atomic::Ordering as AtOrd;
use std::sync::Weak;

use crate::bytes::{Put, Reader};
use crate::error::{Error, Result};
use crate::index::run::{Run, RunMeta};
use crate::log::format::*;
use crate::log::{NewBlock, SegUsage};
use crate::store::MetaSlot;

use super::{lock, Core, Engine, Room};

/// Checkpoint bookkeeping.
pub(super) struct CkptState {
    pub(super) number: u64,
    pub(super) body: BlockAddr,
    pub(super) prev_body: BlockAddr,
    pub(super) replay: LogPos,
    pub(super) prev_replay_batch: u64,
    pub(super) flushed_seq: u64,
    pub(super) next_run_id: u64,
    pub(super) deferred: Vec<(u64, BlockAddr)>,
    /// Deferred frees a reader may still read: such a block stays counted
    /// past its checkpoint until the hold ends. In memory only, as a
    /// restart ends every reader (the block is freed by the checkpoints
    /// after it).
    pub(super) holds: Vec<(BlockAddr, Hold)>,
}

/// Why a deferred free waits past its checkpoint.
pub(super) enum Hold {
    /// A block of a run merged away, while a reader holds a version (or a
    /// cursor) with the run.
    Run(Weak<Run>),
    /// A block freed by the batch whose first sequence number this is,
    /// while a [`Snapshot`](super::Snapshot) older than that batch lives.
    Snapshot(u64),
}

impl Hold {
    /// Whether the hold still stands, given the oldest live snapshot.
    pub(super) fn stands(&self, oldest_snapshot: Option<u64>) -> bool {
        match self {
            Hold::Run(w) => w.strong_count() > 0,
            Hold::Snapshot(first) => oldest_snapshot.is_some_and(|s| s < *first),
        }
    }
}

/// What a checkpoint body holds (a block in the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointBody {
    /// Checkpoint number.
    pub number: u64,
    /// Every mutation with a sequence number up to this one is in a run.
    pub flushed_seq: u64,
    /// Next sequence number to assign.
    pub next_seq: u64,
    /// Reads below this sequence number may see merged-away versions.
    pub horizon: u64,
    /// Next run id.
    pub next_run_id: u64,
    /// Body of the previous checkpoint.
    pub prev_body: BlockAddr,
    /// Blocks freed by checkpoint N, usable once checkpoint N+1 is durable.
    pub deferred: Vec<(u64, BlockAddr)>,
    /// Runs, newest first.
    pub runs: Vec<RunMeta>,
    /// Segment usage as of the body (the body's own block excluded).
    pub usage: Vec<SegUsage>,
}

impl CheckpointBody {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.number);
        v.put_var(self.flushed_seq);
        v.put_var(self.next_seq);
        v.put_var(self.horizon);
        v.put_var(self.next_run_id);
        self.prev_body.put(&mut v);
        v.put_var(self.deferred.len() as u64);
        for (n, a) in &self.deferred {
            v.put_var(*n);
            a.put(&mut v);
        }
        v.put_var(self.runs.len() as u64);
        for r in &self.runs {
            r.put(&mut v);
        }
        v.put_var(self.usage.len() as u64);
        for u in &self.usage {
            v.put_var(u64::from(u.live));
            v.put_var(u.last_batch);
        }
        v
    }

    /// Decode.
    pub fn decode(buf: &[u8], what: &str) -> Result<CheckpointBody> {
        let mut r = Reader::new(buf, what);
        let number = r.var()?;
        let flushed_seq = r.var()?;
        let next_seq = r.var()?;
        let horizon = r.var()?;
        let next_run_id = r.var()?;
        let prev_body = BlockAddr::get(&mut r)?;
        let n = r.var_max(buf.len() as u64, "deferred count")?;
        let mut deferred = Vec::new();
        for _ in 0..n {
            deferred.push((r.var()?, BlockAddr::get(&mut r)?));
        }
        let n = r.var_max(buf.len() as u64, "run count")?;
        let mut runs = Vec::new();
        for _ in 0..n {
            runs.push(RunMeta::get(&mut r)?);
        }
        let n = r.var_max(buf.len() as u64, "segment count")?;
        let mut usage = Vec::new();
        for _ in 0..n {
            let live = r.var()?;
            let live = u32::try_from(live).map_err(|_| r.err("live bytes overflow"))?;
            usage.push(SegUsage { live, last_batch: r.var()? });
        }
        r.finish()?;
        Ok(CheckpointBody {
            number,
            flushed_seq,
            next_seq,
            horizon,
            next_run_id,
            prev_body,
            deferred,
            runs,
            usage,
        })
    }
}

impl Engine {
    /// Write a checkpoint: the run list and usage go into a body block, then
    /// a checkpoint slot points at it.
    pub fn checkpoint(&self) -> Result<()> {
        self.check_ok()?;
        let _g = lock(&self.sh.ckpt_lock);
        self.checkpoint_locked(None)
    }

    pub(super) fn checkpoint_locked(&self, flushed: Option<(LogPos, u64)>) -> Result<()> {
        let _s = lock(&self.sh.sync_lock);
        let mut core = lock(&self.sh.core);
        let r = self.checkpoint_core(&mut core, flushed);
        self.latch(&core, r)
    }

    pub(super) fn checkpoint_core(&self, core: &mut Core, flushed: Option<(LogPos, u64)>) -> Result<()> {
        // Everything before the body durable, so frees it implies are in.
        core.log.sync()?;
        self.apply_frees(core);
        let ver = self.version();
        if let Some((end, seq)) = flushed {
            core.ckpt.replay = end;
            core.ckpt.flushed_seq = seq;
        }
        if ver.frozen.is_empty() && ver.active.is_empty() {
            // Nothing unflushed: replay can start at the tail.
            core.ckpt.replay = core.log.pos();
            core.ckpt.flushed_seq = core.next_seq - 1;
        }
        let replay = core.ckpt.replay;
        let number = core.ckpt.number + 1;
        // Journal blocks before the replay start are dead once this
        // checkpoint is durable; segment reuse waits for the older slot too.
        let jb = std::mem::take(&mut core.log.journal_blocks);
        let (dead, keep): (Vec<_>, Vec<_>) = jb.into_iter().partition(|&(b, _, _)| b < replay.batch_seq);
        core.log.journal_blocks = keep;
        for (_, seg, len) in dead {
            core.log.free_block(BlockAddr { seg, offset: 0, len });
        }
        // Usage as it will be once this checkpoint is durable.
        let mut usage = core.log.usage.clone();
        let sub = |usage: &mut Vec<SegUsage>, a: BlockAddr| {
            if let Some(u) = usage.get_mut(a.seg as usize) {
                u.live = u.live.saturating_sub(a.len);
            }
        };
        let oldest = lock(&self.sh.snapshots).keys().next().copied();
        core.ckpt.holds.retain(|(_, h)| h.stands(oldest));
        let held: std::collections::HashSet<BlockAddr> = core.ckpt.holds.iter().map(|&(a, _)| a).collect();
        let (ready, later): (Vec<_>, Vec<_>) =
            core.ckpt.deferred.iter().partition(|&&(n, a)| n < number && !held.contains(&a));
        for &(_, a) in &ready {
            sub(&mut usage, a);
        }
        if number >= 2 {
            sub(&mut usage, core.ckpt.prev_body);
        }
        let body = CheckpointBody {
            number,
            flushed_seq: core.ckpt.flushed_seq,
            next_seq: core.next_seq,
            horizon: self.sh.horizon.load(AtOrd::Acquire),
            next_run_id: core.ckpt.next_run_id,
            prev_body: core.ckpt.body,
            deferred: later.clone(),
            runs: ver.runs.iter().map(|r| r.meta.clone()).collect(),
            usage,
        };
        let blk = NewBlock::encode(BlockKind::Checkpoint, number, self.sh.opts.index_codec, &body.encode());
        let addr = core.log.add_blocks(vec![blk], Room::System)?[0];
        core.log.write_pending(Room::System)?;
        let after_body = core.log.pos();
        core.log.sync_store()?;
        let slot = CheckpointSlot { number, uuid: self.sh.sb.uuid, body: addr, replay, after_body };
        let which = if number % 2 == 0 { MetaSlot::CheckpointA } else { MetaSlot::CheckpointB };
        if let Err(e) = self.sh.store.write_meta(which, &slot.encode()) {
            core.log.failed = true;
            return Err(Error::io(format!("writing checkpoint slot {which:?}"), e));
        }
        core.log.sync_store()?;
        // Durable: apply what it implies.
        for (_, a) in ready {
            core.log.free_block(a);
        }
        if number >= 2 {
            core.log.free_block(core.ckpt.prev_body);
        }
        core.ckpt.deferred = later;
        core.ckpt.prev_body = core.ckpt.body;
        core.ckpt.body = addr;
        core.ckpt.number = number;
        core.log.keep_from_batch = core.ckpt.prev_replay_batch.min(replay.batch_seq);
        core.ckpt.prev_replay_batch = replay.batch_seq;
        core.log.tell_freed();
        Ok(())
    }
}
