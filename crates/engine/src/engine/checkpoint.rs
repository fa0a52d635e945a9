//! Checkpoints: the body (run list, usage, deferred frees; FORMAT.md
//! §3.5), written as parts under a head, and writing one, which makes
//! frees and flushed journal blocks final.

use std::sync::atomic::Ordering as AtOrd;
use std::sync::Weak;

use crate::bytes::{Put, Reader};
use crate::codec::CodecSpec;
use crate::error::{Error, Result};
use crate::index::run::{Run, RunMeta};
use crate::log::format::*;
use crate::log::{max_block_raw, LogWriter, NewBlock, SegUsage};
use crate::store::MetaSlot;

use super::{lock, Core, Engine, Room};

/// Checkpoint bookkeeping.
pub(super) struct CkptState {
    pub(super) number: u64,
    /// The blocks of the newest durable checkpoint: its head (or its
    /// one-block body, on an image made before parts), then its parts.
    pub(super) body: Vec<BlockAddr>,
    /// The same of the checkpoint before it (empty before the first).
    pub(super) prev_body: Vec<BlockAddr>,
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
    /// Encode, as written in parts: with the runs' levels.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.encode_without_levels();
        for r in &self.runs {
            v.push(r.level);
            v.put_var(r.tombstones);
        }
        v
    }

    /// Encode as a one-block body (kind 5) was: without the levels.
    pub fn encode_without_levels(&self) -> Vec<u8> {
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

    /// Decode; `levels` for a body read from parts, which ends with the
    /// runs' levels (a one-block body has none: its runs are all level 0).
    pub fn decode(buf: &[u8], what: &str, levels: bool) -> Result<CheckpointBody> {
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
        if levels {
            for m in &mut runs {
                m.level = r.u8()?;
                m.tombstones = r.var()?;
                if m.tombstones > m.entries {
                    return Err(
                        r.err(format!("run {} of {} entries, {} tombstones", m.id, m.entries, m.tombstones))
                    );
                }
            }
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

/// Where a checkpoint body's parts are (the payload of a
/// [`BlockKind::CheckpointHead`] block, FORMAT.md §3.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointHead {
    /// Checkpoint number.
    pub number: u64,
    /// Length of the body: the parts' payloads, concatenated.
    pub body_len: u64,
    /// The body's parts, in order.
    pub parts: Vec<BlockAddr>,
    /// The previous checkpoint's parts, freed with its head.
    pub prev_parts: Vec<BlockAddr>,
}

/// Encoded bytes of a head beside its addresses (a bound for the varints).
const HEAD_FIXED: usize = 40;

/// The most parts a head can list, for a checkpoint and its predecessor
/// together, at `max_raw` bytes per block.
pub fn max_checkpoint_parts(max_raw: usize) -> usize {
    (max_raw - HEAD_FIXED) / BlockAddr::SIZE
}

impl CheckpointHead {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.number);
        v.put_var(self.body_len);
        for list in [&self.parts, &self.prev_parts] {
            v.put_var(list.len() as u64);
            list.iter().for_each(|a| a.put(&mut v));
        }
        v
    }

    /// Decode.
    pub fn decode(buf: &[u8], what: &str) -> Result<CheckpointHead> {
        let mut r = Reader::new(buf, what);
        let number = r.var()?;
        let body_len = r.var()?;
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.var_max((buf.len() / BlockAddr::SIZE) as u64, "part count")?;
            for _ in 0..n {
                list.push(BlockAddr::get(&mut r)?);
            }
        }
        r.finish()?;
        let [parts, prev_parts] = lists;
        Ok(CheckpointHead { number, body_len, parts, prev_parts })
    }
}

impl Engine {
    /// Write a checkpoint: the run list and usage go into a body (part
    /// blocks under a head block), then a checkpoint slot points at it.
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
        let oldest = super::oldest_holding(&lock(&self.sh.snapshots));
        core.ckpt.holds.retain(|(_, h)| h.stands(oldest));
        let held: std::collections::HashSet<BlockAddr> = core.ckpt.holds.iter().map(|&(a, _)| a).collect();
        let (ready, later): (Vec<_>, Vec<_>) =
            core.ckpt.deferred.iter().partition(|&&(n, a)| n < number && !held.contains(&a));
        for &(_, a) in &ready {
            sub(&mut usage, a);
        }
        for &a in &core.ckpt.prev_body {
            sub(&mut usage, a);
        }
        // A merge's outputs not yet installed: a restart drops them.
        for &(_, a) in &core.unplaced {
            sub(&mut usage, a);
        }
        let body = CheckpointBody {
            number,
            flushed_seq: core.ckpt.flushed_seq,
            next_seq: core.next_seq,
            horizon: self.sh.horizon.load(AtOrd::Acquire),
            next_run_id: core.ckpt.next_run_id,
            prev_body: core.ckpt.body.first().copied().unwrap_or_default(),
            deferred: later.clone(),
            runs: ver.runs.iter().map(|r| r.meta.clone()).collect(),
            usage,
        };
        let prev_parts = core.ckpt.body.get(1..).unwrap_or_default().to_vec();
        let codec = self.sh.opts.index_codec;
        let blocks = place_body(&mut core.log, number, codec, &body.encode(), prev_parts)?;
        let addr = blocks[0];
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
        for &a in &core.ckpt.prev_body {
            core.log.free_block(a);
        }
        core.ckpt.deferred = later;
        core.ckpt.prev_body = std::mem::replace(&mut core.ckpt.body, blocks);
        core.ckpt.number = number;
        core.log.keep_from_batch = core.ckpt.prev_replay_batch.min(replay.batch_seq);
        core.ckpt.prev_replay_batch = replay.batch_seq;
        core.log.tell_freed();
        Ok(())
    }
}

/// Place checkpoint `number`'s encoded body in the log as part blocks
/// under a head block that also lists `prev_parts`; returns the head's
/// address, then the parts'. All or none are placed.
pub(super) fn place_body(
    log: &mut LogWriter,
    number: u64,
    codec: CodecSpec,
    body: &[u8],
    prev_parts: Vec<BlockAddr>,
) -> Result<Vec<BlockAddr>> {
    let max = max_block_raw(log.geometry());
    let count = body.len().div_ceil(max);
    if count + prev_parts.len() > max_checkpoint_parts(max) {
        return Err(Error::NoSpace(format!(
            "a checkpoint body of {} bytes needs {count} parts of {max} bytes, and a head lists at most \
             {} with its predecessor's: make the image with larger segments",
            body.len(),
            max_checkpoint_parts(max)
        )));
    }
    let parts: Vec<NewBlock> =
        body.chunks(max).map(|c| NewBlock::encode(BlockKind::CheckpointPart, number, codec, c)).collect();
    // Room for the parts and the head (stored at most a little past its
    // raw size) first, so that both are placed or neither. A segment's end
    // that a part does not fit is left empty: up to a part's length lost
    // in each segment they take, which `check_room` does not count.
    let head_bound = HEAD_FIXED + BlockAddr::SIZE * (count + prev_parts.len()) + 3 * BLOCK_HEADER_SIZE + 64;
    let bytes = parts.iter().map(|p| p.stored_len()).sum::<usize>() + head_bound;
    let largest = parts.iter().map(|p| p.stored_len()).max().unwrap_or(0).max(head_bound);
    let ends = bytes.div_ceil(log.usable_per_segment().saturating_sub(largest).max(1)) + 1;
    log.check_room(parts.len() + 1, bytes + ends * largest, Room::System)?;
    let parts = log.add_blocks(parts, Room::System)?;
    let head = CheckpointHead { number, body_len: body.len() as u64, parts, prev_parts };
    let blk = NewBlock::encode(BlockKind::CheckpointHead, number, codec, &head.encode());
    match log.add_blocks(vec![blk], Room::System) {
        Ok(a) => Ok(a.into_iter().chain(head.parts).collect()),
        Err(e) => {
            // Not reached (room was checked, the head is within the block
            // limit), but if it were: parts placed and never referenced
            // would stay counted. Latch rather than write on.
            log.failed = true;
            tracing::error!("checkpoint {number}: its head could not follow its parts: {e}");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::recovery::make_image;
    use super::*;
    use crate::engine::{mkfs, read_superblock};
    use crate::store::{Geometry, MemStore, Store};
    use crate::{Options, WriteBatch};

    fn opts() -> Options {
        Options { background: false, ..Options::default() }
    }

    /// A new image of `count` segments of 128 KiB, open.
    fn fresh(count: u32) -> (Geometry, Arc<dyn Store>, Engine) {
        let g = Geometry { segment_size: 128 << 10, segment_count: count };
        let store: Arc<dyn Store> = Arc::new(MemStore::new(g));
        mkfs(store.clone()).unwrap();
        let e = Engine::open(store.clone(), opts()).unwrap();
        (g, store, e)
    }

    fn put(e: &Engine, from: u32, to: u32) {
        for i in from..to {
            let mut b = WriteBatch::new();
            b.put(format!("k{i:06}").into_bytes(), vec![i as u8; 200]);
            e.write(&b).unwrap();
        }
        e.sync().unwrap();
    }

    fn check(e: &Engine, to: u32) {
        for i in 0..to {
            assert_eq!(e.get(format!("k{i:06}").as_bytes()).unwrap(), Some(vec![i as u8; 200]), "key {i}");
        }
        // With no data blocks, each segment's count is the engine's own
        // blocks exactly: every part of a freed checkpoint was freed.
        for (s, (u, own)) in e.usage_check().unwrap().into_iter().enumerate() {
            assert_eq!(u64::from(u.live), own, "segment {s}");
        }
    }

    /// Issue 45: at 256 KiB segments and 8 GiB the body (two varints a
    /// segment) outgrew its one block and every checkpoint failed. Here
    /// 40,000 segments of 128 KiB make a body of over 80 KB against
    /// blocks of 32 KiB.
    #[test]
    fn a_body_larger_than_a_block_is_written_in_parts_and_read_back() {
        let (_, store, e) = fresh(40_000);
        for round in 0..6 {
            put(&e, round * 100, (round + 1) * 100);
            e.flush().unwrap();
            e.checkpoint().unwrap();
        }
        let parts = lock(&e.sh.core).ckpt.body.len() - 1;
        assert!(parts >= 3, "{parts} parts");
        check(&e, 600);
        drop(e);
        let e = Engine::open(store.clone(), opts()).unwrap();
        assert_eq!(lock(&e.sh.core).ckpt.body.len() - 1, parts, "the parts read back");
        assert_eq!(lock(&e.sh.core).ckpt.prev_body.len() - 1, parts, "the previous checkpoint's too");
        check(&e, 600);
        put(&e, 600, 700);
        e.checkpoint().unwrap();
        e.checkpoint().unwrap();
        check(&e, 700);
    }

    /// A damaged part is found (by the part's checksum and its batch's)
    /// and the open refuses with what is damaged, as for a one-block body.
    #[test]
    fn a_damaged_part_is_refused_with_where_it_is() {
        let (_, store, e) = fresh(40_000);
        put(&e, 0, 100);
        e.flush().unwrap();
        put(&e, 100, 200);
        let part = lock(&e.sh.core).ckpt.body[2];
        drop(e);
        let mut buf = vec![0u8; 64];
        store.read(part.seg, part.offset + 32, &mut buf).unwrap();
        buf[7] ^= 0x10;
        store.write(part.seg, part.offset + 32, &buf).unwrap();
        let err = Engine::open(store.clone(), opts()).err().expect("a damaged part is found");
        assert!(err.is_corruption(), "{err}");
        assert!(err.to_string().contains(&format!("segment {}", part.seg)), "{err}");
    }

    /// The head's limit, at its edge and one past it: parts of this
    /// checkpoint and of the one before together.
    #[test]
    fn a_head_lists_at_most_max_checkpoint_parts() {
        let (g, store, e) = fresh(64);
        let max = max_block_raw(g);
        let limit = max_checkpoint_parts(max);
        let prev = vec![BlockAddr { seg: 1, offset: 4096, len: 100 }; limit - 2];
        let codec = e.sh.opts.index_codec;
        let mut core = lock(&e.sh.core);
        let placed = place_body(&mut core.log, 9, codec, &vec![7u8; 2 * max], prev.clone()).unwrap();
        assert_eq!(placed.len(), 3, "a head and two parts");
        core.log.write_pending(Room::System).unwrap();
        let raw = crate::log::read_block(store.as_ref(), placed[0], BlockKind::CheckpointHead).unwrap();
        let head = CheckpointHead::decode(&raw, "head").unwrap();
        assert_eq!((head.parts.len(), head.prev_parts.len(), head.body_len), (2, limit - 2, 2 * max as u64));
        let pos = core.log.pos();
        let err = place_body(&mut core.log, 10, codec, &vec![7u8; 2 * max + 1], prev).unwrap_err();
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
        assert!(err.to_string().contains("larger segments"), "{err}");
        assert!(core.log.pending_empty(), "nothing placed by the refused body");
        assert_eq!(core.log.pos(), pos);
    }

    /// On a log with room (by `check_room`'s count) for a body's parts
    /// but not for its head too, nor for the segment ends parts of a
    /// quarter segment leave, nothing is placed or written: NoSpace, and no
    /// part that no checkpoint names (placed, they would stay counted).
    #[test]
    fn a_body_the_log_cannot_take_whole_places_nothing() {
        let (g, _, e) = fresh(64);
        let codec = CodecSpec::new(crate::codec::CodecId::None, 0);
        let mut core = lock(&e.sh.core);
        let room = core.log.room_for(Room::System);
        // Stored raw, parts of a quarter segment: three fit a segment of
        // 128 KiB, so about 86% of what `check_room` counts is placeable.
        // A body of 95% passes its count, head and all:
        let max = max_block_raw(g);
        let len = room * 95 / 100;
        let c = len.div_ceil(max);
        let counted = len + c * BLOCK_HEADER_SIZE + HEAD_FIXED + 12 * c + 3 * BLOCK_HEADER_SIZE + 64;
        assert!(core.log.check_room(c + 1, counted, Room::System).is_ok(), "the count alone would take it");
        let body: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let (pos, live) = (core.log.pos(), core.log.usage.iter().map(|u| u64::from(u.live)).sum::<u64>());
        let err = place_body(&mut core.log, 9, codec, &body, Vec::new()).unwrap_err();
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
        assert!(core.log.pending_empty(), "nothing placed");
        assert_eq!(core.log.pos(), pos, "nothing written");
        assert_eq!(core.log.usage.iter().map(|u| u64::from(u.live)).sum::<u64>(), live, "nothing counted");
        assert!(!core.log.failed);
    }

    /// An image made before checkpoint parts opens read-only as it is,
    /// and its first read-write open turns the feature on (superblock and
    /// copy) before writing checkpoints in parts; nothing is lost.
    #[test]
    fn an_image_made_before_parts_opens_and_turns_them_on() {
        let g = Geometry { segment_size: 128 << 10, segment_count: 64 };
        let store: Arc<dyn Store> = Arc::new(MemStore::new(g));
        make_image(store.clone(), false).unwrap();
        assert_eq!(read_superblock(store.as_ref()).unwrap().incompat & INCOMPAT_CHECKPOINT_PARTS, 0);
        let ro = Engine::open(store.clone(), Options { read_only: true, ..opts() }).unwrap();
        assert_eq!(lock(&ro.sh.core).ckpt.body.len(), 1, "one block of kind 5");
        drop(ro);
        assert_eq!(read_superblock(store.as_ref()).unwrap().incompat & INCOMPAT_CHECKPOINT_PARTS, 0);
        let e = Engine::open(store.clone(), opts()).unwrap();
        for slot in [crate::store::MetaSlot::Super, crate::store::MetaSlot::SuperCopy] {
            let mut buf = [0u8; crate::store::META_SLOT_SIZE];
            store.read_meta(slot, &mut buf).unwrap();
            let sb = Superblock::decode(&buf).unwrap();
            assert_ne!(sb.incompat & INCOMPAT_CHECKPOINT_PARTS, 0, "{slot:?}");
        }
        put(&e, 0, 100);
        e.flush().unwrap();
        check(&e, 100);
        put(&e, 100, 150);
        e.checkpoint().unwrap();
        check(&e, 150);
        drop(e);
        let e = Engine::open(store.clone(), opts()).unwrap();
        assert_eq!(lock(&e.sh.core).ckpt.body.len(), 2, "a head and one part");
        check(&e, 150);
    }
}
