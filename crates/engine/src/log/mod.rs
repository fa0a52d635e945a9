//! The log: fixed-size segments filled by batches appended at the tail.
//!
//! A batch is a header, blocks (each with its own header and crc), and a
//! summary naming every block's kind, owner and lengths. Batches start at
//! 512-byte boundaries. Each batch header carries a consecutive sequence
//! number and the crc of the previous batch, so roll-forward follows exactly
//! one chain and stops at the first batch that is torn, missing, or stale.
//!
//! [`LogWriter`] assembles the pending batch in memory and writes it out when
//! it is full, when a segment ends, or when the engine syncs.
//! [`scan`] walks the chain from a checkpoint's replay position.

pub mod format;
mod hold;

pub use hold::HoldFlag;

use std::sync::Arc;

use crate::bytes::crc;
use crate::codec::{self, CodecSpec};
use crate::error::{Error, Result};
use crate::store::{Geometry, Store};
use format::*;

/// Per-segment accounting kept for the cleaner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegUsage {
    /// Bytes of blocks in the segment still referenced.
    pub live: u32,
    /// Sequence number of the last batch written into the segment; 0 if
    /// the segment was never written.
    pub last_batch: u64,
}

/// Largest payload of one block before compression.
pub fn max_block_raw(g: Geometry) -> usize {
    (g.segment_size / 4) as usize
}

/// An encoded block waiting to be placed in a batch.
pub struct NewBlock {
    /// What it is.
    pub kind: BlockKind,
    /// Who owns it.
    pub owner: u64,
    /// Uncompressed length.
    pub raw_len: u32,
    /// Codec of the payload.
    codec: u8,
    /// Block header (crc included) and payload, ready to copy into a batch.
    sealed: Vec<u8>,
    /// The head it goes to.
    pub tier: Tier,
}

impl NewBlock {
    /// Compress `raw` with `spec` into a new block, header and crc
    /// included, so that callers compressing on many cores also checksum
    /// there and placing the block in the log is a copy.
    pub fn encode(kind: BlockKind, owner: u64, spec: CodecSpec, raw: &[u8]) -> NewBlock {
        let enc = codec::encode(spec, raw);
        let mut sealed = Vec::with_capacity(BLOCK_HEADER_SIZE + enc.data.len());
        BlockHeader {
            crc: 0,
            codec: enc.codec as u8,
            level: enc.level,
            raw_reason: enc.raw_reason,
            kind: kind as u8,
            raw_len: raw.len() as u32,
            stored_len: enc.data.len() as u32,
        }
        .seal(&enc.data, &mut sealed);
        NewBlock { kind, owner, raw_len: raw.len() as u32, codec: enc.codec as u8, sealed, tier: Tier::Fast }
    }

    /// A block as stored (`sealed`: header and payload, read from `addr`),
    /// verified, to be placed again unchanged under `owner`: its bytes,
    /// checksum included, do not depend on where it lies.
    pub fn verbatim(kind: BlockKind, owner: u64, sealed: Vec<u8>, addr: BlockAddr) -> Result<NewBlock> {
        let (h, _) = BlockHeader::open(&sealed, addr)?;
        if h.kind != kind as u8 {
            return Err(Error::corrupt(
                format!("block at {addr}"),
                format!("holds kind {} where a {} block was expected", h.kind, kind.name()),
            ));
        }
        Ok(NewBlock { kind, owner, raw_len: h.raw_len, codec: h.codec, sealed, tier: Tier::Fast })
    }

    /// The block, to go to the head of `tier`.
    pub fn on(mut self, tier: Tier) -> NewBlock {
        self.tier = tier;
        self
    }
    /// The block as it will be stored: header (crc included) and payload.
    pub fn bytes(&self) -> &[u8] {
        &self.sealed
    }
    /// Header and stored payload bytes.
    pub fn stored_len(&self) -> usize {
        self.sealed.len()
    }
}

/// The batch being assembled.
struct Pending {
    /// Header placeholder followed by the blocks placed so far.
    buf: Vec<u8>,
    entries: Vec<SummaryEntry>,
    /// Journal records of this batch; they become one journal block.
    journal: Vec<u8>,
    journal_owner: u64,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            buf: vec![0u8; BATCH_HEADER_SIZE],
            entries: Vec::new(),
            journal: Vec::new(),
            journal_owner: 0,
        }
    }
    fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.journal.is_empty()
    }
    /// Bytes the batch would take if written now, journal stored raw.
    fn projected(&self, extra_blocks: usize, extra_bytes: usize) -> usize {
        let jblock = if self.journal.is_empty() { 0 } else { BLOCK_HEADER_SIZE + self.journal.len() + 8 };
        let nblocks = self.entries.len() + extra_blocks + usize::from(!self.journal.is_empty());
        self.buf.len() + extra_bytes + jblock + nblocks * SUMMARY_ENTRY_SIZE
    }
}

/// Which head of the log a block goes to. With one device both are the
/// same; with two, `Fast` is the fast device's (journal, index,
/// checkpoints, metadata and small files) and `Bulk` the bulk device's
/// (full chunks of large files). A head whose device is full spills to
/// the other device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tier {
    /// The fast device.
    #[default]
    Fast,
    /// The bulk device.
    Bulk,
}

/// One head of the log: where its next batch goes, and that batch.
struct Head {
    seg: u32,
    offset: u32,
    /// Segment the head continues in when `seg` is full.
    next_seg: u32,
    /// The last batch written into `seg` named `next_seg`.
    next_named: bool,
    /// `batch_crc` of the last batch written in `seg` (0: none yet).
    seg_prev_crc: u32,
    pending: Pending,
}

impl Head {
    fn at(p: HeadPos) -> Head {
        Head {
            seg: p.seg,
            offset: p.offset,
            next_seg: p.next_seg,
            next_named: p.next_seg != NO_SEGMENT,
            seg_prev_crc: p.seg_prev_crc,
            pending: Pending::new(),
        }
    }
    fn pos(&self) -> HeadPos {
        HeadPos {
            seg: self.seg,
            offset: self.offset,
            next_seg: self.next_seg,
            seg_prev_crc: self.seg_prev_crc,
        }
    }
}

/// The writing end of the log. Owned by the engine under its lock.
///
/// One chain of batches (consecutive sequence numbers, each naming the
/// crc of the one before) written at one head, or with two devices at
/// two: head 0 on the fast device, head 1 on the bulk device, each
/// appending to its own segment. A batch with journal records is written
/// only after the other head's pending batch (whose blocks they may
/// name), so a crash that loses a batch loses every later one: recovery
/// follows the chain at whichever head holds the next batch.
pub struct LogWriter {
    store: Arc<dyn Store>,
    geometry: Geometry,
    log_id: u64,
    heads: Vec<Head>,
    /// Segments `0..fast_segments` are the fast device's.
    fast_segments: u32,
    /// Sequence number of the next batch written, at either head.
    batch_seq: u64,
    /// `batch_crc` of the last batch written.
    prev_crc: u32,
    /// Codec for journal blocks.
    journal_codec: CodecSpec,
    /// Per-segment usage.
    pub usage: Vec<SegUsage>,
    /// Highest batch seq known durable.
    pub durable_batch: u64,
    /// Segments that must not be reused: everything written at or after
    /// this batch seq (the older checkpoint's replay start).
    pub keep_from_batch: u64,
    /// Segments kept back for the engine's own writes (checkpoints, runs).
    pub reserve_segments: u32,
    /// Latched after a failed write or sync.
    pub failed: bool,
    /// Bytes written to the device (batches, padding included).
    pub device_bytes: u64,
    /// Stored bytes of blocks written, by kind (indexed by the kind byte).
    pub kind_bytes: [u64; 16],
    /// The same, by device (fast, bulk).
    pub device_kind_bytes: [[u64; 16]; 2],
    /// Journal blocks written since the replay start: (position, seg, len).
    pub journal_blocks: Vec<(u64, u32, u32)>,
    /// Drawn at open; written into every batch header.
    epoch: u32,
    /// Per segment: [`Store::freed`] was called since it was last in use.
    told_freed: Vec<bool>,
    /// Segments readers of the log as it was keep from reuse.
    holds: hold::Holds,
}

/// Free segments ordinary writes leave for deletes, the cleaner and the
/// index: enough for the cleaner to move the fullest victim a writer's
/// cleaning picks (95% live) with its margin, and one segment more for
/// the index writes that let its victims go
/// (docs/decisions/2026-12-03-a-reserve-kept-whole.md).
pub const RESERVE_SEGMENTS: u32 = 4;

/// Images of fewer segments (test images) keep 2, as before 2026-12-03.
const RESERVE_FULL_FROM: u32 = 32;

/// The reserve of a log of `count` segments.
pub fn reserve_for(count: u32) -> u32 {
    if count >= RESERVE_FULL_FROM {
        RESERVE_SEGMENTS
    } else {
        2
    }
}

/// How much of the reserve of free segments a write may use.
///
/// User data stops when only the reserve is left. The cleaner's copies
/// may use all of it but two segments; commits that free more than they
/// add (unlink, rmdir, truncate, rename) and those of changes already
/// accepted, all but one; index runs and checkpoints, which make freed
/// space usable, the last one too. Each class stops short of the room
/// the next one needs, so a full file system can still clean, delete,
/// keep what it accepted, and free what the cleaner emptied. (With a
/// reserve of 2, on logs under 32 segments, the cleaner and the deletes
/// both stop at 2 free.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Room {
    /// Ordinary writes: stop at the reserve.
    #[default]
    User,
    /// The cleaner's copies: may use the reserve but two segments, one
    /// for the commits below and one for the index, so that the commits
    /// of accepted changes and deletes still fit however far the cleaner
    /// went (CI at ccb7c3e: its copies of blocks points of history held
    /// took the reserve but one segment, and every commit failed).
    Clean,
    /// Deletes, and the commits of changes already accepted: may use the
    /// reserve but one segment.
    Relieve,
    /// The engine's own index and checkpoint writes.
    System,
}

impl Room {
    /// Free segments a write of this class needs before it may take one.
    pub fn need(self, reserve: u32) -> u32 {
        match self {
            Room::User => reserve + 1,
            Room::Clean => reserve.min(3),
            Room::Relieve => reserve.min(2),
            Room::System => 1,
        }
    }
}

/// Bytes kept free at the end of a segment whose successor is not chosen
/// yet: room for the empty batch that names it ([`LogWriter::block_room`]).
/// Batches start aligned and segments are whole alignment units, so a
/// batch placed within the rest less this leaves at least this much.
pub const NAMING_TAIL: usize = BATCH_ALIGN as usize;
const _: () = assert!(NAMING_TAIL >= BATCH_HEADER_SIZE);

/// Largest batch the writer assembles before writing it out.
const MAX_BATCH: usize = 1 << 20;

impl LogWriter {
    /// A writer that continues the log at `pos` (from recovery or mkfs);
    /// with two devices (`fast_segments` below the segment count),
    /// `pos.alt` is the bulk head's place.
    pub fn new(
        store: Arc<dyn Store>,
        log_id: u64,
        pos: LogPos,
        usage: Vec<SegUsage>,
        journal_codec: CodecSpec,
        fast_segments: u32,
    ) -> LogWriter {
        let geometry = store.geometry();
        let main = HeadPos {
            seg: pos.seg,
            offset: pos.offset,
            next_seg: pos.next_seg,
            seg_prev_crc: pos.seg_prev_crc,
        };
        let mut heads = vec![Head::at(main)];
        heads.extend(pos.alt.map(Head::at));
        LogWriter {
            store,
            geometry,
            log_id,
            heads,
            fast_segments: fast_segments.min(geometry.segment_count),
            batch_seq: pos.batch_seq,
            prev_crc: pos.prev_crc,
            journal_codec,
            usage,
            durable_batch: pos.batch_seq.saturating_sub(1),
            keep_from_batch: 0,
            reserve_segments: reserve_for(geometry.segment_count),
            failed: false,
            device_bytes: 0,
            kind_bytes: [0; 16],
            device_kind_bytes: [[0; 16]; 2],
            journal_blocks: Vec::new(),
            epoch: rand::random(),
            told_freed: vec![false; geometry.segment_count as usize],
            holds: hold::Holds::default(),
        }
    }

    /// Tell the store of each segment ever written that is free now and
    /// was not when it was last told ([`Store::freed`]).
    pub fn tell_freed(&mut self) {
        for seg in 0..self.geometry.segment_count {
            let i = seg as usize;
            if !self.is_takeable(seg) {
                self.told_freed[i] = false;
            } else if !self.told_freed[i] && self.usage[i].last_batch != 0 {
                self.told_freed[i] = true;
                self.store.freed(seg);
            }
        }
    }

    /// Where the next batch will go: at either head.
    pub fn pos(&self) -> LogPos {
        let h = &self.heads[0];
        LogPos {
            seg: h.seg,
            offset: h.offset,
            batch_seq: self.batch_seq,
            prev_crc: self.prev_crc,
            next_seg: h.next_seg,
            alt: self.heads.get(1).map(Head::pos),
            seg_prev_crc: h.seg_prev_crc,
        }
    }

    /// Whether a head writes in `seg` or goes on there.
    pub fn is_head(&self, seg: u32) -> bool {
        self.heads.iter().any(|h| h.seg == seg || h.next_seg == seg)
    }

    fn check_ok(&self) -> Result<()> {
        if self.failed {
            return Err(Error::Failed);
        }
        Ok(())
    }

    /// Segments that hold nothing live and are not needed by recovery.
    pub fn is_free(&self, seg: u32) -> bool {
        let u = self.usage[seg as usize];
        !self.is_head(seg) && u.live == 0 && !self.recovery_reads(seg)
    }

    /// Whether recovery may read segment `seg`: it was written at or after
    /// the older checkpoint's replay start.
    pub fn recovery_reads(&self, seg: u32) -> bool {
        let u = self.usage[seg as usize];
        u.last_batch != 0 && u.last_batch >= self.keep_from_batch
    }

    /// Number of free segments.
    pub fn free_segments(&self) -> u32 {
        (0..self.geometry.segment_count).filter(|&s| self.is_free(s)).count() as u32
    }

    /// Segments of the fast device (all of them with one device).
    pub fn fast_segments(&self) -> u32 {
        self.fast_segments
    }

    /// The device segment `seg` is on.
    pub fn tier_of(&self, seg: u32) -> Tier {
        if seg < self.fast_segments {
            Tier::Fast
        } else {
            Tier::Bulk
        }
    }

    /// Segments that hold nothing live but are still kept for recovery,
    /// because their journal batches are newer than the replay start:
    /// a memtable flush and two checkpoints free them.
    pub fn pinned_segments(&self) -> u32 {
        (0..self.geometry.segment_count)
            .filter(|&s| !self.is_head(s) && self.usage[s as usize].live == 0 && self.recovery_reads(s))
            .count() as u32
    }

    /// Free segments below which the engine frees pinned ones.
    pub fn low_water(&self) -> u32 {
        self.reserve_segments + 2 + self.geometry.segment_count / 16
    }

    /// The head blocks of `tier` go to.
    fn head_of(&self, tier: Tier) -> usize {
        usize::from(tier == Tier::Bulk && self.heads.len() > 1)
    }

    /// The segments of head `h`'s own device.
    fn home(&self, h: usize) -> std::ops::Range<u32> {
        if h == 0 {
            0..self.fast_segments
        } else {
            self.fast_segments..self.geometry.segment_count
        }
    }

    /// Choose head `h`'s next segment: a free one on its own device, or
    /// (spilling) on the other one.
    ///
    /// `now`: the head needs it now (not the best-effort naming of a
    /// successor ahead of time), so it may break the read pins' holds
    /// when only held segments are left ([`LogWriter::break_holds`]).
    fn choose_next(&mut self, h: usize, room: Room, now: bool) -> Result<()> {
        let need = room.need(self.reserve_segments) as usize;
        if self.heads[h].next_seg != NO_SEGMENT {
            // Named already, perhaps by a class that may go further into
            // the reserve (the index's): this write may move there only
            // where it could have chosen it, counted free.
            if self.free_segments() as usize + 1 < need {
                return Err(self.no_free_segment());
            }
            return Ok(());
        }
        let free = (0..self.geometry.segment_count).filter(|&s| self.is_free(s)).take(need.max(1)).count();
        if free < need {
            return Err(self.no_free_segment());
        }
        match self.pick(h, now) {
            Some(seg) => {
                let head = &mut self.heads[h];
                head.next_seg = seg;
                head.next_named = false;
                Ok(())
            }
            _ => Err(self.no_free_segment()),
        }
    }

    /// A free segment for head `h`, on its own device first: one no hold
    /// keeps; with `breaking`, a held one where a device has only those
    /// (the holds broken), rather than one of the other device.
    fn pick(&mut self, h: usize, breaking: bool) -> Option<u32> {
        let (home, count) = (self.home(h), self.geometry.segment_count);
        for on_home in [true, false] {
            let device = || (0..count).filter(|s| home.contains(s) == on_home);
            if let Some(s) = device().find(|&s| self.is_takeable(s)) {
                return Some(s);
            }
            if let Some(s) = device().find(|&s| self.is_free(s)) {
                if !breaking {
                    return None;
                }
                self.break_holds();
                return Some(s);
            }
        }
        None
    }

    fn no_free_segment(&self) -> Error {
        Error::NoSpace(format!(
            "no free segment left in the log ({} segments of {} bytes, {} free, {} reserved)",
            self.geometry.segment_count,
            self.geometry.segment_size,
            self.free_segments(),
            self.reserve_segments
        ))
    }

    /// NoSpace unless `n` blocks of `bytes` in all fit in the room a
    /// write of class `room` may use ([`LogWriter::room_for`]).
    pub fn check_room(&self, n: usize, bytes: usize, room: Room) -> Result<()> {
        let need = bytes + n * (8 + SUMMARY_ENTRY_SIZE);
        if need > self.room_for(room) {
            return Err(Error::NoSpace(format!(
                "{need} bytes of blocks do not fit in the log ({} segments of {} bytes, {} free, {} reserved)",
                self.geometry.segment_count,
                self.geometry.segment_size,
                self.free_segments(),
                self.reserve_segments
            )));
        }
        Ok(())
    }

    /// Bytes of blocks (with their summary entries and alignment) that a
    /// write of class `room` may still place: the rest of the current
    /// segment and the free segments it may take. Conservative: each
    /// segment is counted less room for the batch headers, summaries and
    /// alignment of the batches it will hold, and with two heads the
    /// rest of the segment is the head with less.
    ///
    /// With two heads, it is what the head with less may place: its
    /// segment's rest, its own named successor, and the free segments it
    /// may take, less one for the other head if that one has no successor
    /// named yet (writing its batch first, it may take one).
    ///
    /// Ordinary writes get nothing, not even the segment's rest, while
    /// fewer segments than the reserve are free: its rest is then the
    /// reserve classes' until cleaning makes the reserve whole.
    pub fn room_for(&self, room: Room) -> usize {
        self.room_counting(room, 0, true)
    }

    /// [`LogWriter::room_for`], counting `more` segments free besides
    /// those that are (the pinned ones a flush frees, for statfs), and the
    /// current segment's rest only when `here`.
    pub fn room_counting(&self, room: Room, more: u32, with_here: bool) -> usize {
        let usable = self.usable_per_segment();
        let free = (self.free_segments() + more) as usize;
        let keep = room.need(self.reserve_segments) as usize - 1;
        (0..self.heads.len())
            .map(|h| {
                let head = &self.heads[h];
                // Counted as a free segment is at most: the current one
                // freshly taken must not count more than before.
                let here = self
                    .seg_room(h)
                    .saturating_sub(head.pending.projected(0, 0) + 2 * BATCH_ALIGN as usize)
                    .min(usable)
                    * usize::from(with_here);
                let named = usize::from(head.next_seg != NO_SEGMENT);
                let others = self
                    .heads
                    .iter()
                    .enumerate()
                    .filter(|&(o, x)| o != h && x.next_seg == NO_SEGMENT)
                    .count();
                // As with one head: its named successor is one of the
                // segments, the reserve kept whole.
                let have = free + named;
                if room == Room::User && have < others + keep {
                    // The reserve is not whole (the cleaner, the index or
                    // deletes took some): the rest of the current segment
                    // is theirs until cleaning gives it back. Filled by
                    // creates instead, 512 bytes a commit, it left the
                    // cleaner no room, and a full image took no create
                    // after its deletes.
                    return 0;
                }
                here + have.saturating_sub(others + keep) * usable
            })
            .min()
            .unwrap_or(0)
    }

    /// Bytes of blocks a free segment is counted to hold: less room for
    /// the batch headers, summaries and alignment of the batches in it.
    pub fn usable_per_segment(&self) -> usize {
        let seg = self.geometry.segment_size as usize;
        seg.saturating_sub(seg / 16 + 2 * BATCH_ALIGN as usize)
    }

    fn seg_room(&self, h: usize) -> usize {
        (self.geometry.segment_size - self.heads[h].offset) as usize
    }

    /// Bytes head `h`'s batches may still take in its segment: all of its
    /// rest once a successor is chosen (the next batch names it), else
    /// all but [`NAMING_TAIL`], kept so that an empty batch can name the
    /// successor when one is free again. Without it a full log could fill
    /// a segment to its end unnamed, and the log could never go on.
    fn block_room(&self, h: usize) -> usize {
        let tail = if self.heads[h].next_seg == NO_SEGMENT { NAMING_TAIL } else { 0 };
        self.seg_room(h).saturating_sub(tail)
    }

    /// Make room at head `h` for `blocks` more blocks of `bytes` in its
    /// pending batch, writing it out or moving to the next segment as
    /// needed.
    fn make_room(&mut self, h: usize, blocks: usize, bytes: usize, room: Room) -> Result<()> {
        let fits = |w: &LogWriter| {
            let p = w.heads[h].pending.projected(blocks, bytes);
            p <= w.block_room(h) && p <= MAX_BATCH.max(bytes + 4096)
        };
        if fits(self) {
            return Ok(());
        }
        if !self.heads[h].pending.is_empty() {
            self.write_head(h, room)?;
        }
        if self.heads[h].pending.projected(blocks, bytes) > self.block_room(h) {
            self.advance(h, room)?;
        }
        if self.heads[h].pending.projected(blocks, bytes) > self.block_room(h) {
            return Err(Error::Invalid(format!(
                "{bytes} bytes do not fit in a {}-byte segment",
                self.geometry.segment_size
            )));
        }
        Ok(())
    }

    /// Heads whose segment is full to its end with no successor named:
    /// left by builds before [`NAMING_TAIL`] on a full log, the log cannot
    /// go on from them ([`LogWriter::jump`] mends them).
    pub fn stuck_heads(&self) -> Vec<usize> {
        (0..self.heads.len())
            .filter(|&h| self.heads[h].next_seg == NO_SEGMENT && self.seg_room(h) < BATCH_HEADER_SIZE)
            .collect()
    }

    /// Move head `h` to a free segment without naming it from the full
    /// one. Recovery reaches what is written there only from a checkpoint
    /// whose replay start is past the move: the caller flushes the index
    /// and writes one before any journal record
    /// (`Engine::mend_stuck_heads`). The segment it left stays as it is.
    pub fn jump(&mut self, h: usize) -> Result<u32> {
        self.choose_next(h, Room::System, true)?;
        Ok(self.move_to_next(h))
    }

    /// Head `h` goes on at the start of its chosen next segment (the one
    /// it leaves is sealed); returns that segment.
    fn move_to_next(&mut self, h: usize) -> u32 {
        let head = &mut self.heads[h];
        let left = head.seg;
        head.seg = head.next_seg;
        head.offset = 0;
        head.next_seg = NO_SEGMENT;
        head.next_named = false;
        head.seg_prev_crc = 0;
        let to = head.seg;
        self.store.sealed(left);
        to
    }

    /// Make head `h` fill its segment to the end without naming a
    /// successor, as builds before [`NAMING_TAIL`] could on a full log
    /// (for the test of the mend; the filler block leaks its bytes).
    #[cfg(test)]
    pub fn fill_unnamed(&mut self, h: usize) -> Result<()> {
        self.write_head(h, Room::User)?;
        let rest = self.seg_room(h);
        let pad = rest.saturating_sub(BATCH_HEADER_SIZE + SUMMARY_ENTRY_SIZE + BLOCK_HEADER_SIZE + 64);
        let raw = vec![0; pad];
        self.place(h, NewBlock::encode(BlockKind::Data, 0, CodecSpec::new(codec::CodecId::None, 0), &raw));
        self.heads[h].next_seg = NO_SEGMENT;
        // No successor can be chosen for it.
        let reserve = std::mem::replace(&mut self.reserve_segments, u32::MAX / 2);
        let r = self.write_head(h, Room::User);
        self.reserve_segments = reserve;
        r
    }

    /// Move head `h` to its next segment (naming it in a batch first).
    fn advance(&mut self, h: usize, room: Room) -> Result<()> {
        self.choose_next(h, room, true)?;
        if !self.heads[h].next_named {
            // An empty batch whose header names the next segment, so that
            // recovery can follow the log there.
            if self.seg_room(h) < BATCH_HEADER_SIZE {
                return Err(Error::NoSpace("log segment ended without a successor".into()));
            }
            self.write_head(h, room)?;
        }
        self.move_to_next(h);
        Ok(())
    }

    /// Place encoded blocks in the pending batches (of the heads their
    /// tiers say); returns their addresses. `room` says how much of the
    /// reserve the blocks may use.
    ///
    /// The blocks are placed all or none: when the log cannot take them
    /// all, NoSpace comes and none stays counted. (Placed blocks are live
    /// until their owner frees them; a caller that got an error for half
    /// of them would never reference, and so never free, the other half.)
    /// Usually NoSpace comes before any is placed. But the room check
    /// counts a segment's bytes, not the end a block too long for it
    /// leaves unused: blocks of more than a sixteenth of a segment can
    /// find the log full part way. Those placed are then written out and
    /// freed before the error returns ([`LogWriter::unplace`]).
    pub fn add_blocks(&mut self, blocks: Vec<NewBlock>, room: Room) -> Result<Vec<BlockAddr>> {
        self.check_ok()?;
        let max = max_block_raw(self.geometry);
        if let Some(b) = blocks
            .iter()
            .find(|b| b.raw_len as usize > max || b.stored_len() > max + 2 * BLOCK_HEADER_SIZE + 64)
        {
            return Err(Error::Invalid(format!(
                "{:?} block of {} bytes (owner {}) exceeds the limit of {max}",
                b.kind, b.raw_len, b.owner
            )));
        }
        let bytes: usize = blocks.iter().map(|b| b.stored_len()).sum();
        self.check_room(blocks.len(), bytes, room)?;
        let mut addrs = Vec::with_capacity(blocks.len());
        for b in blocks {
            let h = self.head_of(b.tier);
            let len = b.stored_len();
            if let Err(e) = self.make_room(h, 1, len + 8, room) {
                self.unplace(&addrs, room)?;
                return Err(e);
            }
            addrs.push(self.place(h, b));
        }
        Ok(addrs)
    }

    /// Give back the blocks an [`LogWriter::add_blocks`] placed before it
    /// failed: the pending batches written (a block is counted when its
    /// batch is), then each block freed, so that no count stays for
    /// blocks no owner will reference. Their bytes are dead, for the
    /// cleaner; a crash before the next checkpoint counts them again,
    /// as it does the copies of a cleaning pass whose commit was lost.
    fn unplace(&mut self, addrs: &[BlockAddr], room: Room) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        tracing::debug!("the log filled part way through {} blocks: giving them back", addrs.len());
        self.free_placed(addrs, room)
    }

    /// Free blocks placed by [`LogWriter::add_blocks`] that no owner will
    /// reference, written or not: the waiting batches are written first,
    /// since a block is counted when its batch is written (freed before,
    /// its count would come back with the batch).
    pub fn free_placed(&mut self, addrs: &[BlockAddr], room: Room) -> Result<()> {
        self.check_ok()?;
        for h in (0..self.heads.len()).rev() {
            if !self.heads[h].pending.is_empty() {
                self.write_head(h, room)?;
            }
        }
        addrs.iter().for_each(|&a| self.free_block(a));
        Ok(())
    }

    fn place(&mut self, h: usize, b: NewBlock) -> BlockAddr {
        let head = &mut self.heads[h];
        // Blocks start 8-byte aligned inside the batch.
        let pad = (8 - head.pending.buf.len() % 8) % 8;
        head.pending.buf.resize(head.pending.buf.len() + pad, 0);
        let off = head.pending.buf.len();
        let len = b.sealed.len();
        head.pending.buf.extend_from_slice(&b.sealed);
        head.pending.entries.push(SummaryEntry {
            kind: b.kind as u8,
            codec: b.codec,
            offset: off as u32,
            len: len as u32,
            raw_len: b.raw_len,
            owner: b.owner,
        });
        BlockAddr { seg: head.seg, offset: head.offset + off as u32, len: len as u32 }
    }

    /// Append one journal record (already encoded) to the pending batch
    /// of the fast head.
    pub fn add_journal(&mut self, record: &[u8], first_seq: u64, room: Room) -> Result<()> {
        self.check_ok()?;
        let max = max_block_raw(self.geometry);
        if self.heads[0].pending.journal.len() + record.len() > max {
            if record.len() > max {
                return Err(Error::Invalid(format!(
                    "commit of {} bytes exceeds the journal limit of {max}",
                    record.len()
                )));
            }
            self.write_head(0, room)?;
        }
        // Room for the record in the journal block, stored raw at worst.
        // The block's header, alignment padding and summary entry are
        // always reserved: make_room may write the batch out, leaving this
        // record the first of a new journal block.
        let need = record.len() + BLOCK_HEADER_SIZE + 8 + SUMMARY_ENTRY_SIZE;
        if room == Room::User && need > self.room_for(Room::User) {
            return Err(Error::NoSpace(format!(
                "a journal record of {} bytes does not fit outside the log's reserve ({} free segments of {}, {} reserved)",
                record.len(),
                self.free_segments(),
                self.geometry.segment_count,
                self.reserve_segments
            )));
        }
        self.make_room(0, 0, need, room)?;
        let p = &mut self.heads[0].pending;
        if p.journal.is_empty() {
            p.journal_owner = first_seq;
        }
        p.journal.extend_from_slice(record);
        Ok(())
    }

    /// True when nothing waits to be written.
    pub fn pending_empty(&self) -> bool {
        self.heads.iter().all(|h| h.pending.is_empty())
    }

    /// If `addr` lies in a pending batch, its bytes.
    pub fn read_pending(&self, addr: BlockAddr) -> Option<Vec<u8>> {
        let h = self.heads.iter().find(|h| addr.seg == h.seg && addr.offset >= h.offset)?;
        let start = (addr.offset - h.offset) as usize;
        h.pending.buf.get(start..start + addr.len as usize).map(|b| b.to_vec())
    }

    /// Write the pending batches to the store (not synced), the bulk
    /// head's first. Writes an empty batch at the fast head when nothing
    /// is pending (used to name the next segment).
    pub fn write_pending(&mut self, room: Room) -> Result<()> {
        if self.heads[0].pending.is_empty() && self.heads.get(1).is_some_and(|h| !h.pending.is_empty()) {
            return self.write_head(1, room);
        }
        self.write_head(0, room)
    }

    /// Write head `h`'s pending batch (an empty one when nothing is
    /// pending). The fast head's batch may hold journal records naming
    /// blocks of the bulk head's pending batch: that one goes first.
    fn write_head(&mut self, h: usize, room: Room) -> Result<()> {
        self.check_ok()?;
        if h == 0 && self.heads.len() > 1 && !self.heads[1].pending.is_empty() {
            self.write_head(1, room)?;
        }
        if !self.heads[h].pending.journal.is_empty() {
            let p = &mut self.heads[h].pending;
            let j = std::mem::take(&mut p.journal);
            let b = NewBlock::encode(BlockKind::Journal, p.journal_owner, self.journal_codec, &j);
            let addr = self.place(h, b);
            self.journal_blocks.push((self.batch_seq, addr.seg, addr.len));
        }
        // Name the successor segment in every batch once there is one.
        if self.heads[h].next_seg == NO_SEGMENT {
            // Best effort: a full device is reported when the segment ends.
            if let Err(e) = self.choose_next(h, room, false) {
                tracing::debug!("no successor segment named yet: {e}");
            }
        }
        let (seq, prev_crc, durable, epoch, log_id) =
            (self.batch_seq, self.prev_crc, self.durable_batch, self.epoch, self.log_id);
        let seg_size = self.geometry.segment_size as usize;
        let head = &mut self.heads[h];
        let mut p = std::mem::replace(&mut head.pending, Pending::new());
        let summary_off = p.buf.len();
        for e in &p.entries {
            e.put(&mut p.buf);
        }
        let total_len = p.buf.len();
        // Pair assertion with make_room: a batch never crosses its segment.
        assert!(
            head.offset as usize + total_len <= seg_size,
            "batch of {total_len} bytes at offset {} overruns segment {}",
            head.offset,
            head.seg
        );
        let mut hd = BatchHeader {
            batch_crc: 0,
            log_id,
            seq,
            prev_crc,
            total_len: total_len as u32,
            summary_off: summary_off as u32,
            summary_count: p.entries.len() as u32,
            next_seg: head.next_seg,
            epoch,
            durable_seq: durable,
            seg_prev_crc: head.seg_prev_crc,
            bulk_head: h == 1,
        };
        p.buf[..BATCH_HEADER_SIZE].copy_from_slice(&hd.encode());
        hd.batch_crc = crc(&p.buf[8..total_len]);
        p.buf[4..8].copy_from_slice(&hd.batch_crc.to_le_bytes());
        let padded = align_up(total_len as u32) as usize;
        p.buf.resize(padded.min(seg_size - head.offset as usize), 0);
        if let Err(e) = self.store.write(head.seg, head.offset, &p.buf) {
            let (seg, offset) = (head.seg, head.offset);
            self.failed = true;
            return Err(Error::io(format!("writing batch {seq} to segment {seg} at {offset}"), e));
        }
        head.next_named = head.next_seg != NO_SEGMENT;
        head.offset += p.buf.len() as u32;
        head.seg_prev_crc = hd.batch_crc;
        let seg = head.seg;
        self.device_bytes += p.buf.len() as u64;
        let dev = usize::from(self.tier_of(seg) == Tier::Bulk);
        let u = &mut self.usage[seg as usize];
        u.last_batch = seq;
        for e in &p.entries {
            self.kind_bytes[usize::from(e.kind & 15)] += u64::from(e.len);
            self.device_kind_bytes[dev][usize::from(e.kind & 15)] += u64::from(e.len);
            u.live = u.live.saturating_add(e.len);
        }
        self.batch_seq += 1;
        self.prev_crc = hd.batch_crc;
        Ok(())
    }

    /// Write out what is pending and make everything durable.
    pub fn sync(&mut self) -> Result<()> {
        if !self.pending_empty() {
            self.write_pending(Room::User)?;
        }
        self.sync_store()
    }

    /// Sync the store only (the caller wrote what it wanted written).
    pub fn sync_store(&mut self) -> Result<()> {
        self.check_ok()?;
        if let Err(e) = self.store.sync() {
            self.failed = true;
            return Err(Error::io("syncing the device", e));
        }
        self.durable_batch = self.batch_seq - 1;
        Ok(())
    }

    /// A block is no longer referenced.
    pub fn free_block(&mut self, addr: BlockAddr) {
        if let Some(u) = self.usage.get_mut(addr.seg as usize) {
            u.live = u.live.saturating_sub(addr.len);
        }
    }

    /// The device's shape.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The engine's view of the device: the store.
    #[cfg(test)]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

/// A batch found by [`walk_segment`]: its header, its offset in the
/// segment, and its blocks' summary entries.
pub struct WalkedBatch {
    /// The header.
    pub header: BatchHeader,
    /// Its offset in the segment.
    pub offset: u32,
    /// Its summary entries (block offsets are relative to the batch).
    pub entries: Vec<SummaryEntry>,
}

/// Walk the chain of batches of log `log_id` from the start of a segment
/// whose bytes are `buf`: each batch whole, its crc right, and each the
/// successor of the one before (sequence number and `prev_crc`). `f` gets
/// each; the walk stops at the first batch that is not one of the chain,
/// at the end of the segment, or when `f` returns false, and returns the
/// offset where it stopped. A summary that does not decode is an error.
/// `salvage` lets a batch whose crc is wrong through (its header still
/// chains on): for salvage, where each block is trusted only if its own
/// checksum is right.
pub fn walk_segment(
    buf: &[u8],
    log_id: u64,
    salvage: bool,
    what: &dyn Fn(usize) -> String,
    mut f: impl FnMut(&WalkedBatch) -> bool,
) -> Result<usize> {
    let mut off = 0usize;
    let mut prev: Option<(u64, u32)> = None;
    while off + BATCH_HEADER_SIZE <= buf.len() {
        let Some(h) = BatchHeader::decode(&buf[off..])? else { break };
        let whole = h.log_id == log_id
            && (h.total_len as usize) >= BATCH_HEADER_SIZE
            && off + h.total_len as usize <= buf.len()
            && prev.is_none_or(|(s, c)| {
                // The chain's next batch, or (two heads) a later one that
                // names this one as the one before it in the segment.
                (h.seq == s + 1 && h.prev_crc == c) || (h.seq > s && h.seg_prev_crc == c && c != 0)
            })
            && (salvage || crc(&buf[off + 8..off + h.total_len as usize]) == h.batch_crc);
        if !whole {
            break;
        }
        let entries = SummaryEntry::decode_all(&buf[off..off + h.total_len as usize], &h, &what(off))?;
        prev = Some((h.seq, h.batch_crc));
        let next = align_up((off + h.total_len as usize) as u32) as usize;
        if !f(&WalkedBatch { header: h, offset: off as u32, entries }) {
            break;
        }
        off = next;
    }
    Ok(off)
}

/// Read and verify a block, returning its header and decompressed payload.
pub fn read_block(store: &dyn Store, addr: BlockAddr, expect: BlockKind) -> Result<Vec<u8>> {
    decode_block(&read_sealed(store, addr)?, addr, expect)
}

/// The stored bytes of the block at `addr` (header and payload), not
/// verified.
pub fn read_sealed(store: &dyn Store, addr: BlockAddr) -> Result<Vec<u8>> {
    let g = store.geometry();
    if addr.seg >= g.segment_count
        || u64::from(addr.offset) + u64::from(addr.len) > u64::from(g.segment_size)
        || (addr.len as usize) < BLOCK_HEADER_SIZE
    {
        return Err(Error::corrupt(format!("reference to block at {addr}"), "outside the device"));
    }
    let mut buf = vec![0u8; addr.len as usize];
    store
        .read(addr.seg, addr.offset, &mut buf)
        .map_err(|e| Error::io(format!("reading block at {addr}"), e))?;
    Ok(buf)
}

/// Verify and decompress a block read from `addr`.
pub fn decode_block(buf: &[u8], addr: BlockAddr, expect: BlockKind) -> Result<Vec<u8>> {
    let (h, payload) = BlockHeader::open(buf, addr)?;
    if h.kind != expect as u8 {
        return Err(Error::corrupt(
            format!("block at {addr}"),
            format!("holds kind {} where a {} block was expected", h.kind, expect.name()),
        ));
    }
    let max = max_block_raw(Geometry { segment_size: MAX_SEGMENT_SIZE, segment_count: 1 });
    if h.raw_len as usize > max {
        return Err(Error::corrupt(format!("block at {addr}"), "raw length out of range"));
    }
    codec::decode(h.codec, payload, h.raw_len as usize)
        .map_err(|e| Error::corrupt(format!("{} block at {addr}", expect.name()), e.to_string()))
}

/// A batch found by [`scan`].
pub struct ScannedBatch<'a> {
    /// Where it starts.
    pub pos: LogPos,
    /// Its header.
    pub header: BatchHeader,
    /// Its bytes (header to end of summary).
    pub bytes: &'a [u8],
    /// Its summary.
    pub entries: Vec<SummaryEntry>,
}

impl ScannedBatch<'_> {
    /// The address of the `i`th block.
    pub fn addr(&self, i: usize) -> BlockAddr {
        let e = &self.entries[i];
        BlockAddr { seg: self.pos.seg, offset: self.pos.offset + e.offset, len: e.len }
    }
    /// The bytes of the `i`th block (header included).
    pub fn block_bytes(&self, i: usize) -> &[u8] {
        let e = &self.entries[i];
        &self.bytes[e.offset as usize..(e.offset + e.len) as usize]
    }
}

/// Try to read a valid batch continuing the chain at `pos`.
fn read_batch(store: &dyn Store, log_id: u64, pos: LogPos, buf: &mut Vec<u8>) -> Result<Option<BatchHeader>> {
    let seg_size = store.geometry().segment_size;
    if pos.offset as usize + BATCH_HEADER_SIZE > seg_size as usize {
        return Ok(None);
    }
    let mut hb = [0u8; BATCH_HEADER_SIZE];
    store
        .read(pos.seg, pos.offset, &mut hb)
        .map_err(|e| Error::io(format!("reading the log at segment {} offset {}", pos.seg, pos.offset), e))?;
    let Some(h) = BatchHeader::decode(&hb)? else { return Ok(None) };
    if h.log_id != log_id
        || h.seq != pos.batch_seq
        || h.prev_crc != pos.prev_crc
        || (h.total_len as usize) < BATCH_HEADER_SIZE
        || u64::from(pos.offset) + u64::from(h.total_len) > u64::from(seg_size)
    {
        return Ok(None);
    }
    buf.resize(h.total_len as usize, 0);
    store
        .read(pos.seg, pos.offset, buf)
        .map_err(|e| Error::io(format!("reading batch {} in segment {}", h.seq, pos.seg), e))?;
    if crc(&buf[8..]) != h.batch_crc {
        return Ok(None);
    }
    Ok(Some(h))
}

/// Where the batch after one at a head may be: right after it, or at
/// the start of the segment its head named next.
fn continuations(h: HeadPos, seg_count: u32) -> impl Iterator<Item = (u32, u32)> {
    let next = (h.next_seg != NO_SEGMENT && h.next_seg < seg_count).then_some((h.next_seg, 0));
    std::iter::once((h.seg, h.offset)).chain(next)
}

/// Walk the log from `start`, calling `visit` for every batch of the chain,
/// and return the position after the last one (where writing continues).
/// With two heads, each next batch is looked for at both.
///
/// The walk ends at the first position holding no valid continuation: the
/// torn or unwritten tail. If a later batch shows that the batch at the end
/// had been synced (its `durable_seq` covers it), the log is damaged, not
/// torn, and that is an error naming the place.
pub fn scan(
    store: &dyn Store,
    log_id: u64,
    start: LogPos,
    mut visit: impl FnMut(&ScannedBatch) -> Result<()>,
) -> Result<LogPos> {
    let mut pos = start;
    let mut buf = Vec::new();
    let seg_count = store.geometry().segment_count;
    let main = |p: &LogPos| HeadPos {
        seg: p.seg,
        offset: p.offset,
        next_seg: p.next_seg,
        seg_prev_crc: p.seg_prev_crc,
    };
    loop {
        let heads: Vec<(bool, HeadPos)> =
            std::iter::once((false, main(&pos))).chain(pos.alt.map(|a| (true, a))).collect();
        let mut found = None;
        'look: for (alt, head) in heads {
            for (seg, offset) in continuations(head, seg_count) {
                let at = LogPos { seg, offset, ..pos };
                // Only a batch of this head: a place one head left may be
                // where the other writes later (a segment reused).
                match read_batch(store, log_id, at, &mut buf)? {
                    Some(h) if h.bulk_head == alt => {
                        found = Some((alt, at, h));
                        break 'look;
                    }
                    _ => {}
                }
            }
        }
        let Some((alt, at, h)) = found else { break };
        let what = format!("summary of batch {} in segment {} at {}", h.seq, at.seg, at.offset);
        let entries = SummaryEntry::decode_all(&buf, &h, &what)?;
        visit(&ScannedBatch { pos: at, header: h, bytes: &buf, entries })?;
        let head = HeadPos {
            seg: at.seg,
            offset: align_up(at.offset + h.total_len),
            next_seg: h.next_seg,
            seg_prev_crc: h.batch_crc,
        };
        if alt {
            pos.alt = Some(head);
        } else {
            (pos.seg, pos.offset, pos.next_seg, pos.seg_prev_crc) =
                (head.seg, head.offset, head.next_seg, head.seg_prev_crc);
        }
        pos.batch_seq = h.seq + 1;
        pos.prev_crc = h.batch_crc;
    }
    check_not_damaged(store, log_id, pos)?;
    Ok(pos)
}

/// Look past the end of the chain for a batch written after the end
/// position had been synced: evidence of damage rather than a torn tail.
fn check_not_damaged(store: &dyn Store, log_id: u64, end: LogPos) -> Result<()> {
    let g = store.geometry();
    let main = HeadPos { seg: end.seg, offset: end.offset, next_seg: end.next_seg, seg_prev_crc: 0 };
    let mut places = Vec::new();
    for head in std::iter::once(main).chain(end.alt) {
        // From the head's end itself: with two heads, the batch that shows
        // damage may lie at the other head's end (and one at an end has a
        // seq above the end's only if it is such a batch).
        places.push((head.seg, head.offset));
        if head.next_seg != NO_SEGMENT && head.next_seg < g.segment_count {
            places.push((head.next_seg, 0));
        }
    }
    for (seg, from) in places {
        if from as usize + BATCH_HEADER_SIZE > g.segment_size as usize {
            continue;
        }
        let mut rest = vec![0u8; (g.segment_size - from) as usize];
        store.read(seg, from, &mut rest).map_err(|e| Error::io(format!("reading segment {seg}"), e))?;
        for off in (0..rest.len()).step_by(BATCH_ALIGN as usize) {
            if let Ok(Some(h)) = BatchHeader::decode(&rest[off..]) {
                // Only a whole, valid batch is evidence.
                let whole = rest
                    .get(off..off + h.total_len as usize)
                    .is_some_and(|b| b.len() >= BATCH_HEADER_SIZE && crc(&b[8..]) == h.batch_crc);
                if whole && h.log_id == log_id && h.seq > end.batch_seq && h.durable_seq >= end.batch_seq {
                    return Err(Error::corrupt(
                        format!(
                            "log batch {} in segment {} at offset {}",
                            end.batch_seq, end.seg, end.offset
                        ),
                        format!(
                            "it is damaged or missing, but batch {} (segment {seg} offset {}) was \
                             written after it had been synced",
                            h.seq,
                            from as usize + off
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn writer() -> LogWriter {
        writer_of(8, None)
    }

    /// A writer on `count` segments; with `fast`, the first `fast` are a
    /// fast device's and the bulk head starts after them.
    pub(super) fn writer_of(count: u32, fast: Option<u32>) -> LogWriter {
        let g = Geometry { segment_size: MIN_SEGMENT_SIZE, segment_count: count };
        let store: Arc<dyn Store> = Arc::new(MemStore::new(g));
        let alt = fast.map(|f| HeadPos { seg: f, offset: 0, next_seg: NO_SEGMENT, seg_prev_crc: 0 });
        let pos = LogPos {
            seg: 0,
            offset: 0,
            batch_seq: 1,
            prev_crc: 0,
            next_seg: NO_SEGMENT,
            alt,
            seg_prev_crc: 0,
        };
        let usage = vec![SegUsage::default(); count as usize];
        LogWriter::new(store, 7, pos, usage, CodecSpec::new(codec::CodecId::None, 0), fast.unwrap_or(count))
    }

    fn start(w: &LogWriter) -> LogPos {
        let alt = w.heads.get(1).map(|_| HeadPos {
            seg: w.fast_segments,
            offset: 0,
            next_seg: NO_SEGMENT,
            seg_prev_crc: 0,
        });
        LogPos { seg: 0, offset: 0, batch_seq: 1, prev_crc: 0, next_seg: NO_SEGMENT, alt, seg_prev_crc: 0 }
    }

    /// Blocks of a quarter segment: three fit a segment, though the room
    /// check counts nearly four. A call the check lets through finds the
    /// log full part way: NoSpace, and none of its blocks stays counted.
    #[test]
    fn blocks_that_fill_the_log_part_way_stay_uncounted() {
        let mut w = writer_of(10, None);
        let none = CodecSpec::new(codec::CodecId::None, 0);
        let max = max_block_raw(w.geometry());
        let room = w.room_for(Room::User);
        let n = room / (max + BLOCK_HEADER_SIZE + 8 + SUMMARY_ENTRY_SIZE);
        let blocks: Vec<NewBlock> =
            (0..n).map(|i| NewBlock::encode(BlockKind::Data, i as u64, none, &vec![i as u8; max])).collect();
        assert!(n > 3 * (room / w.usable_per_segment() + 1), "{n} blocks: more than fit");
        let live = |w: &LogWriter| w.usage.iter().map(|u| u64::from(u.live)).sum::<u64>();
        let before = live(&w);
        let err = w.add_blocks(blocks, Room::User).unwrap_err();
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
        w.sync().unwrap();
        assert_eq!(live(&w), before, "no block of the failed call stays counted");
        assert!(!w.failed);
    }

    /// Two heads: data blocks to the bulk segments, journal records to the
    /// fast ones, one chain that a scan follows across both (and across
    /// the segments each moves to), a walk of each segment listing exactly
    /// the blocks written there.
    #[test]
    fn two_heads_make_one_chain() {
        let mut w = writer_of(24, Some(6));
        let mut placed: Vec<BlockAddr> = Vec::new();
        for i in 0..400u64 {
            let raw = vec![i as u8; 3000 + (i as usize % 7) * 500];
            let tier = if i % 3 == 0 { Tier::Fast } else { Tier::Bulk };
            let b =
                NewBlock::encode(BlockKind::Data, i, CodecSpec::new(codec::CodecId::None, 0), &raw).on(tier);
            let a = w.add_blocks(vec![b], Room::User).unwrap()[0];
            assert_eq!(a.seg >= 6, tier == Tier::Bulk, "block {i} at {a}");
            placed.push(a);
            w.add_journal(&[i as u8; 200], i, Room::User).unwrap();
        }
        w.sync().unwrap();
        let end = w.pos();
        assert!(end.alt.is_some_and(|a| a.seg > 6) && end.seg > 0, "both heads moved on: {end:?}");
        let mut seen = Vec::new();
        let got = scan(w.store().as_ref(), 7, start(&w), |b| {
            for i in 0..b.entries.len() {
                if b.entries[i].kind == BlockKind::Data as u8 {
                    seen.push(b.addr(i));
                }
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(got, end, "the scan ends where the writer goes on");
        seen.sort();
        let mut want = placed.clone();
        want.sort();
        assert_eq!(seen, want, "the scan saw every block, at both heads");
        // A walk of each segment: only its own batches, though the chain
        // interleaves them with the other head's.
        for seg in 0..24u32 {
            let mut buf = vec![0u8; MIN_SEGMENT_SIZE as usize];
            w.store().read(seg, 0, &mut buf).unwrap();
            let mut n = 0;
            walk_segment(&buf, 7, false, &|o| format!("{seg}:{o}"), |b| {
                n += b.entries.iter().filter(|e| e.kind == BlockKind::Data as u8).count();
                true
            })
            .unwrap();
            assert_eq!(n, placed.iter().filter(|a| a.seg == seg).count(), "segment {seg}");
        }
    }

    /// Regression: a journal record that arrives when the pending batch no
    /// longer fits must not leave the next batch overrunning the segment
    /// (the record's block overhead was once forgotten after the write-out).
    #[test]
    fn journal_records_never_overrun_a_segment() {
        for size in (380..460).step_by(7) {
            let mut w = writer();
            let rec = vec![0x5a; size];
            let mut n = 0;
            while w.pos().seg < 3 {
                w.add_journal(&rec, n, Room::User).unwrap();
                n += 1;
                if n % 9 == 0 {
                    w.write_pending(Room::User).unwrap();
                }
            }
        }
    }

    /// A log full for users' writes still names its next segment for
    /// deletes (issue 44, item 2): users' batches leave the end of a
    /// segment whose successor is not chosen free, so that a write that
    /// may use the reserve goes on to a new segment. (They once filled it
    /// to the end unnamed, and every later write failed with "log segment
    /// ended without a successor", across reopens too.)
    #[test]
    fn a_full_log_keeps_room_to_name_its_successor() {
        for size in (150..1400).step_by(97) {
            let mut w = writer();
            let rec = vec![0x5a; size];
            let mut n = 0;
            loop {
                match w.add_journal(&rec, n, Room::User) {
                    Ok(()) => n += 1,
                    Err(Error::NoSpace(_)) => break,
                    Err(e) => panic!("record size {size}: {e}"),
                }
                if n % 3 == 0 {
                    w.write_pending(Room::User).unwrap();
                }
            }
            let seg = w.pos().seg;
            while w.pos().seg == seg {
                w.add_journal(&rec, n, Room::Relieve)
                    .unwrap_or_else(|e| panic!("record size {size}: a delete after the log filled: {e}"));
                w.write_pending(Room::Relieve).unwrap();
                n += 1;
            }
        }
    }

    /// Once a delete's records took a segment of the reserve, users get
    /// no room, not even the rest of that segment (filled by creates, it
    /// once left the cleaner nothing): `room_for` says 0 and a user's
    /// journal record is refused, while deletes go on; the reserve is
    /// [`RESERVE_SEGMENTS`] from 32 segments, 2 below; the cleaner may
    /// take all of it but two segments, deletes all of it but one.
    #[test]
    fn users_wait_while_the_reserve_is_not_whole() {
        assert_eq!((reserve_for(31), reserve_for(32)), (2, RESERVE_SEGMENTS));
        let mut w = writer_of(40, None);
        assert_eq!(w.reserve_segments, RESERVE_SEGMENTS);
        let rec = vec![0x5a; 700];
        let mut n = 0;
        while w.add_journal(&rec, n, Room::User).is_ok() {
            n += 1;
            w.write_pending(Room::User).expect("write");
        }
        assert_eq!(w.free_segments(), RESERVE_SEGMENTS, "users stop at the reserve");
        let seg = w.pos().seg;
        while w.pos().seg == seg {
            w.add_journal(&rec, n, Room::Relieve).expect("a delete on a full log");
            w.write_pending(Room::Relieve).expect("write");
            n += 1;
        }
        assert!(w.free_segments() < RESERVE_SEGMENTS);
        assert_eq!(w.room_for(Room::User), 0, "the new segment's rest is the reserve's");
        assert!(matches!(w.add_journal(&rec, n, Room::User), Err(Error::NoSpace(_))));
        while w.add_journal(&rec, n, Room::Clean).and_then(|()| w.write_pending(Room::Clean)).is_ok() {
            n += 1;
        }
        assert_eq!(w.free_segments(), 2, "the cleaner left a segment to the commits and one to the index");
        // A successor the index names now (an empty batch) is not the
        // cleaner's to take: it could not have chosen it.
        w.write_pending(Room::System).expect("the index names a successor");
        assert_eq!(w.free_segments(), 1);
        let seg = w.pos().seg;
        while w.add_journal(&rec, n, Room::Clean).and_then(|()| w.write_pending(Room::Clean)).is_ok() {
            n += 1;
        }
        assert_eq!(w.pos().seg, seg, "the cleaner moved into the successor the index named");
        while w.add_journal(&rec, n, Room::Relieve).and_then(|()| w.write_pending(Room::Relieve)).is_ok() {
            n += 1;
        }
        assert_eq!(w.free_segments(), 1, "deletes took the reserve but the index's segment");
    }

    #[test]
    fn scan_follows_the_chain_across_segments() {
        let mut w = writer();
        for i in 0..1000u64 {
            w.add_journal(&[i as u8; 300], i, Room::User).unwrap();
            if i % 5 == 0 {
                w.write_pending(Room::User).unwrap();
            }
        }
        w.sync().unwrap();
        let end = w.pos();
        assert!(end.seg >= 2, "the workload must span segments");
        let start = start(&w);
        let mut batches = 0;
        let got = scan(w.store().as_ref(), 7, start, |_| {
            batches += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(got, end);
        assert_eq!(batches as u64, end.batch_seq - 1);
        // Another log id sees nothing.
        let other = scan(w.store().as_ref(), 8, start, |_| Ok(())).unwrap();
        assert_eq!(other.batch_seq, 1);
    }
}
