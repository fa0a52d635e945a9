//! The engine's half of the cleaner: choosing segments, listing what they
//! hold, and reclaiming them once the layer above has moved its data out.
//!
//! A segment holds blocks of five kinds. Data blocks belong to the layer
//! above, which alone knows whether they are referenced; it copies the
//! live ones to the log head and frees the old ones in a commit (see
//! `Fs::clean`). The engine's own blocks die by themselves once the
//! engine moves past them:
//!
//! - run blocks, when their run is rewritten: [`Engine::reclaim`] merges the
//!   runs that have blocks in the victims;
//! - journal blocks, when a checkpoint moves the replay start past them:
//!   when a victim is newer than the older checkpoint's replay start, the
//!   memtable is flushed and two checkpoints are written (older victims
//!   need neither, and their frees only have to be made durable);
//! - checkpoint bodies, two checkpoints later: the same two checkpoints.
//!
//! After that, a victim whose every block is dead is free. Its usage count
//! should already be zero; when it is not, the difference is space that a
//! failed operation or a torn commit left counted (FORMAT.md section 7,
//! "Known leaks"), and it is dropped, once it is certain that nothing will
//! free those blocks again.

use std::collections::HashSet;

use super::*;
use crate::log;

/// A block found in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegBlock {
    /// Where it is.
    pub addr: BlockAddr,
    /// Its kind.
    pub kind: BlockKind,
    /// Its summary owner (the inode for file data, 0 for shared blocks).
    pub owner: u64,
    /// Decompressed length.
    pub raw_len: u32,
    /// The batch that holds it.
    pub batch: u64,
}

/// What reading a segment that must be fetched (from a bucket) counts in
/// a victim's cost, against 1 for one read locally: a GET of a whole
/// segment takes a few times a local read, and is paid for.
pub const REMOTE_READ_COST: f64 = 3.0;

/// A segment worth cleaning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Victim {
    /// The segment.
    pub seg: u32,
    /// Live bytes in it, as counted.
    pub live: u32,
    /// Cost-benefit score: higher is better.
    pub score: f64,
}

/// What [`Engine::reclaim`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Victims now free.
    pub freed: u32,
    /// Bytes counted live in freed victims that no block accounted for.
    pub leaked: u64,
    /// Victims still holding live blocks, with what holds them.
    pub busy: Vec<(u32, String)>,
    /// Whether the memtable was flushed and checkpoints written (some
    /// victim was newer than the replay start).
    pub flushed: bool,
}

impl Engine {
    /// Segments worth cleaning, best first, at most `max`, by the cost and
    /// benefit of Rosenblum and Ousterhout: `(1 - u) * age / (1 + u)`, with
    /// `u` the live fraction and `age` the batches written since the
    /// segment's last one. Segments more than `max_live` full are left
    /// alone (cleaning them would cost more than it frees). Segments with
    /// nothing live that are kept only for recovery come first: they cost
    /// nothing to free. Reading a segment counts 1 in the cost when the
    /// store holds it locally and [`REMOTE_READ_COST`] when it must be
    /// fetched ([`Store::cached`](crate::store::Store::cached)): of two
    /// alike, the cached one goes first.
    pub fn pick_victims(&self, max: usize, max_live: f64) -> Vec<Victim> {
        self.pick_victims_on(max, max_live, None, None)
    }

    /// [`Engine::pick_victims`] among the segments of one device of two
    /// (`on`), or of all, and of those last written before batch `before`
    /// (a pass that moves everything it meets must not meet its own
    /// output again).
    pub fn pick_victims_on(
        &self,
        max: usize,
        max_live: f64,
        on: Option<Tier>,
        before: Option<u64>,
    ) -> Vec<Victim> {
        let core = lock(&self.sh.core);
        let g = self.sh.sb.geometry;
        let now = core.log.pos().batch_seq;
        let mut v: Vec<Victim> = (0..g.segment_count)
            .filter(|&s| on.is_none_or(|t| core.log.tier_of(s) == t))
            .filter(|&s| before.is_none_or(|b| core.log.usage[s as usize].last_batch < b))
            .filter(|&s| !core.log.is_head(s) && !core.log.is_free(s))
            .filter_map(|s| {
                let u = core.log.usage[s as usize];
                let frac = f64::from(u.live) / f64::from(g.segment_size);
                if !super::within_live(u64::from(u.live), g.segment_size, max_live) {
                    return None;
                }
                let age = now.saturating_sub(u.last_batch).max(1) as f64;
                let read = if self.sh.store.cached(s) { 1.0 } else { REMOTE_READ_COST };
                let score = if u.live == 0 { f64::INFINITY } else { (1.0 - frac) * age / (read + frac) };
                Some(Victim { seg: s, live: u.live, score })
            })
            .collect();
        v.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.seg.cmp(&b.seg)));
        v.truncate(max);
        v
    }

    /// The sequence number the next batch written will have.
    pub fn next_batch(&self) -> u64 {
        lock(&self.sh.core).log.pos().batch_seq
    }

    /// Whether segment `seg` holds something behind the log's heads (the
    /// cleaner's victims must; one may have become free since it was
    /// picked, its last blocks released by moves out of other victims).
    pub fn segment_in_use(&self, seg: u32) -> bool {
        let core = lock(&self.sh.core);
        seg < self.sh.sb.geometry.segment_count && !core.log.is_head(seg) && !core.log.is_free(seg)
    }

    /// The last batch written to segment `seg` (it changes only when the
    /// log writes there, so a segment freed and taken again shows a new
    /// one); None past the device.
    pub fn segment_last_batch(&self, seg: u32) -> Option<u64> {
        lock(&self.sh.core).log.usage.get(seg as usize).map(|u| u.last_batch)
    }

    /// Bytes of blocks a write of class `room` may still place in the log.
    pub fn room_bytes(&self, room: Room) -> u64 {
        lock(&self.sh.core).log.room_for(room) as u64
    }

    /// Bytes in segments in use that no live block takes: what cleaning
    /// could give back (before the cost of moving what is live).
    pub fn dead_bytes(&self) -> u64 {
        let core = lock(&self.sh.core);
        let g = self.sh.sb.geometry;
        (0..g.segment_count)
            .filter(|&s| !core.log.is_head(s) && !core.log.is_free(s))
            .map(|s| u64::from(g.segment_size.saturating_sub(core.log.usage[s as usize].live)))
            .sum()
    }

    /// The blocks of segment `seg`'s current contents: the chain of batches
    /// from its start up to the last one written there (stale bytes of an
    /// earlier use of the segment do not chain on and are not listed).
    /// Verifies every batch's crc; an error means the segment cannot be
    /// cleaned safely.
    pub fn segment_blocks(&self, seg: u32) -> Result<Vec<SegBlock>> {
        let g = self.sh.sb.geometry;
        let last = {
            let core = lock(&self.sh.core);
            if seg >= g.segment_count || core.log.is_head(seg) || core.log.is_free(seg) {
                return Err(Error::Invalid(format!(
                    "segment {seg} is not a segment in use behind the log head"
                )));
            }
            core.log.usage[seg as usize].last_batch
        };
        let mut buf = vec![0u8; g.segment_size as usize];
        self.sh.store.read(seg, 0, &mut buf).map_err(|e| Error::io(format!("reading segment {seg}"), e))?;
        let what = |off: usize| format!("segment {seg} at offset {off}");
        let mut out = Vec::new();
        let mut reached = 0u64;
        let stop = log::walk_segment(&buf, self.sh.sb.log_id(), false, &what, |b| {
            if b.header.seq > last {
                return false;
            }
            for e in &b.entries {
                out.push((*e, b.offset, b.header.seq));
            }
            reached = b.header.seq;
            reached < last
        })?;
        if reached != last {
            return Err(Error::corrupt(
                what(stop),
                format!("the batch chain of the segment ends before batch {last}, its last one (after batch {reached})"),
            ));
        }
        out.into_iter()
            .map(|(e, off, batch)| {
                let kind = BlockKind::from_u8(e.kind).ok_or_else(|| {
                    Error::corrupt(what(off as usize), format!("unknown block kind {}", e.kind))
                })?;
                Ok(SegBlock {
                    addr: BlockAddr { seg, offset: off + e.offset, len: e.len },
                    kind,
                    owner: e.owner,
                    raw_len: e.raw_len,
                    batch,
                })
            })
            .collect()
    }

    /// Free `segs` once the layer above has moved every live data block out
    /// of them (the caller's promise: no data block in `segs` is referenced
    /// any more, and its frees were committed). Rewrites the index runs
    /// with blocks there and, when a victim is newer than the replay start,
    /// flushes the memtable and writes two checkpoints, so that the
    /// engine's own blocks there die; makes the frees durable; then drops
    /// the counts of any leaked blocks left in victims that hold nothing
    /// live.
    pub fn reclaim(&self, segs: &[u32]) -> Result<Reclaimed> {
        self.check_ok()?;
        let set: HashSet<u32> = segs.iter().copied().collect();
        {
            // The merge lock keeps the run list's runs in it (a merge under
            // way finishes first); flushes only add level-0 runs.
            let _m = lock(&self.sh.merge_lock);
            let ver = self.version();
            // Each run with a block there is written again alone, at its
            // level and place (a merge of several could span pieces
            // between them).
            let touched: Vec<_> = ver
                .runs
                .iter()
                .filter(|r| r.blocks().iter().any(|a| set.contains(&a.seg)))
                .cloned()
                .collect();
            self.rewrite_runs(&touched)?;
        }
        // A victim written after the older checkpoint's replay start holds
        // journal blocks recovery reads, or blocks freed only by the next
        // checkpoints: flush (a checkpoint moves the replay start to the
        // tail), then one more checkpoint so that the older slot moves past
        // too, and the bodies written before both are freed. Older victims
        // need only their frees made durable. (A flush rewrites the
        // memtable into a run, and the runs it feeds are merged later: with
        // one per cleaning round, the index outgrew the journal.)
        let pinned = {
            let core = lock(&self.sh.core);
            segs.iter()
                .any(|&s| core.log.recovery_reads(s) || core.ckpt.deferred.iter().any(|&(_, a)| a.seg == s))
        };
        if pinned {
            self.flush()?;
            self.checkpoint()?;
        } else {
            self.sync()?;
        }
        let mut out = Reclaimed { flushed: pinned, ..Reclaimed::default() };
        // Victims whose count is not zero: look at what is left in them.
        let mut left = Vec::new();
        for &s in segs {
            let live = lock(&self.sh.core).log.usage[s as usize].live;
            if live == 0 {
                out.freed += 1;
            } else {
                left.push(s);
            }
        }
        for s in left {
            // Freed by the merge or flush above and already taken again
            // by a head of the log (only free segments become heads).
            if lock(&self.sh.core).log.is_head(s) {
                out.freed += 1;
                continue;
            }
            let blocks = match self.segment_blocks(s) {
                Ok(b) => b,
                Err(e) => {
                    out.busy.push((s, e.to_string()));
                    continue;
                }
            };
            let _g = lock(&self.sh.ckpt_lock);
            let ver = self.version();
            let mut core = lock(&self.sh.core);
            // Frees a checkpoint has yet to apply, of blocks here: held for
            // a snapshot, or no longer held but counted until then.
            let deferred: HashSet<u32> =
                core.ckpt.deferred.iter().filter(|(_, a)| a.seg == s).map(|(_, a)| a.offset).collect();
            let held = blocks.iter().find_map(|b| {
                let why = match b.kind {
                    BlockKind::Data => core
                        .pending_frees
                        .iter()
                        // A free may release part of a block's count (FORMAT.md,
                        // journal operation 3): match the block, not the length.
                        .any(|&(_, _, a)| a.seg == b.addr.seg && a.offset == b.addr.offset)
                        .then_some("a free not yet durable")
                        .or_else(|| {
                            deferred
                                .contains(&b.addr.offset)
                                .then_some("a free a checkpoint has yet to apply")
                        }),
                    BlockKind::Journal => core
                        .log
                        .journal_blocks
                        .iter()
                        .any(|&(batch, seg, _)| batch == b.batch && seg == s)
                        .then_some("a journal block recovery still needs"),
                    BlockKind::RunData | BlockKind::RunIndex | BlockKind::RunFilter => {
                        (ver.runs.iter().any(|r| r.meta.id == b.owner)
                            || core.ckpt.deferred.iter().any(|&(_, a)| a == b.addr))
                        .then_some("an index run in use")
                        .or_else(|| {
                            core.unplaced
                                .iter()
                                .any(|&(_, a)| a == b.addr)
                                .then_some("an index run being written")
                        })
                    }
                    BlockKind::Checkpoint | BlockKind::CheckpointHead | BlockKind::CheckpointPart => {
                        (core.ckpt.body.contains(&b.addr) || core.ckpt.prev_body.contains(&b.addr))
                            .then_some("a checkpoint in use")
                    }
                };
                why.map(|w| format!("{w} ({} block at {})", b.kind.name(), b.addr))
            });
            match held {
                Some(why) => out.busy.push((s, why)),
                None => {
                    let u = &mut core.log.usage[s as usize];
                    out.leaked += u64::from(u.live);
                    u.live = 0;
                    out.freed += 1;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::store::{Geometry, MemStore, MetaSlot, Store, META_SLOT_SIZE};
    use crate::{Options, WriteBatch};

    /// A memory store whose odd segments count as not cached while `remote`
    /// is set.
    struct HalfRemote(MemStore, AtomicBool);

    impl Store for HalfRemote {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> std::io::Result<()> {
            self.0.read_meta(slot, buf)
        }
        fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> std::io::Result<()> {
            self.0.write_meta(slot, buf)
        }
        fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> std::io::Result<()> {
            self.0.read(seg, offset, buf)
        }
        fn write(&self, seg: u32, offset: u32, data: &[u8]) -> std::io::Result<()> {
            self.0.write(seg, offset, data)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.0.sync()
        }
        fn discard(&self, seg: u32) -> std::io::Result<()> {
            self.0.discard(seg)
        }
        fn cached(&self, seg: u32) -> bool {
            !self.1.load(Ordering::Relaxed) || seg % 2 == 0
        }
    }

    #[test]
    fn victims_the_store_must_fetch_score_lower() {
        let g = Geometry { segment_size: 256 << 10, segment_count: 64 };
        let store = Arc::new(HalfRemote(MemStore::new(g), AtomicBool::new(false)));
        crate::mkfs(store.clone()).unwrap();
        let e = Engine::open(store.clone(), Options { background: false, ..Options::default() }).unwrap();
        for i in 0..300u32 {
            let mut b = WriteBatch::new();
            let v: Vec<u8> = (0..8192u32).map(|j| (j.wrapping_mul(2654435761) ^ i) as u8).collect();
            b.put(format!("k{i:05}").into_bytes(), v);
            e.write(&b).unwrap();
        }
        e.sync().unwrap();
        e.settle().unwrap();
        for i in (0..300u32).step_by(2) {
            let mut b = WriteBatch::new();
            b.delete(format!("k{i:05}").into_bytes());
            e.write(&b).unwrap();
        }
        e.settle().unwrap();
        let local = e.pick_victims(usize::MAX, 1.0);
        store.1.store(true, Ordering::Relaxed);
        let mixed = e.pick_victims(usize::MAX, 1.0);
        let finite: Vec<&Victim> = local.iter().filter(|v| v.score.is_finite()).collect();
        assert!(finite.iter().any(|v| v.seg % 2 == 1), "some odd segment to compare");
        for v in finite {
            let m = mixed.iter().find(|m| m.seg == v.seg).unwrap();
            if v.seg % 2 == 0 {
                assert_eq!(m.score, v.score, "a cached segment keeps its score");
            } else {
                assert!(m.score < v.score, "segment {}: {} fetched vs {} local", v.seg, m.score, v.score);
            }
        }
    }
}
