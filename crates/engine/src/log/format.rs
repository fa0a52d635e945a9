//! Byte layouts of the log: superblock, checkpoint slots, batches, summary
//! entries, blocks. docs/FORMAT.md describes the same layouts; the golden
//! tests at the bottom pin them so a silent format change fails a test.
//!
//! Integers in these structures are little-endian; integers inside index
//! keys are big-endian (see the index module).

use crate::bytes::{crc, Put, Reader};
use crate::error::{Error, Result};
use crate::store::{Geometry, META_SLOT_SIZE, SECTOR_SIZE};

/// The on-disk format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Incompatible feature: the image is two stores, a fast one (the
/// superblock's `fast_segments` first segments) and a bulk one.
pub const INCOMPAT_TWO_DEVICES: u64 = 1;
/// Incompatible feature: checkpoints may be a head block and part blocks
/// (block kinds 7 and 8, FORMAT.md §3.5). Set at mkfs, and on the first
/// read-write open of an image made before it.
pub const INCOMPAT_CHECKPOINT_PARTS: u64 = 2;
/// Incompatible feature bits this build understands.
pub const INCOMPAT_KNOWN: u64 = INCOMPAT_TWO_DEVICES | INCOMPAT_CHECKPOINT_PARTS;
/// Read-only-compatible feature bits this build understands (none yet).
pub const RO_COMPAT_KNOWN: u64 = 0;

/// Superblock magic.
pub const SUPER_MAGIC: [u8; 8] = *b"ZLOGFS\0\x1a";
/// Checkpoint slot magic.
pub const CKPT_MAGIC: [u8; 8] = *b"ZLCKPT\0\x1a";
/// Batch header magic.
pub const BATCH_MAGIC: [u8; 4] = *b"ZLB\x01";

/// Smallest segment the format allows.
pub const MIN_SEGMENT_SIZE: u32 = 128 * 1024;
/// Largest segment the format allows.
pub const MAX_SEGMENT_SIZE: u32 = 1 << 30;
/// Default segment size.
pub const DEFAULT_SEGMENT_SIZE: u32 = 4 * 1024 * 1024;

/// Offset of the crc32c that ends every metadata slot.
pub const SLOT_CRC_OFFSET: usize = META_SLOT_SIZE - 4;

/// Size of a batch header.
pub const BATCH_HEADER_SIZE: usize = 64;
/// Size of one summary entry.
pub const SUMMARY_ENTRY_SIZE: usize = 24;
/// Size of a block header.
pub const BLOCK_HEADER_SIZE: usize = 16;
/// Batches start at multiples of this.
pub const BATCH_ALIGN: u32 = SECTOR_SIZE as u32;
/// No segment chosen yet.
pub const NO_SEGMENT: u32 = u32::MAX;

/// Round `v` up to the batch alignment.
pub fn align_up(v: u32) -> u32 {
    v.div_ceil(BATCH_ALIGN) * BATCH_ALIGN
}

/// The superblock: what the image is and its shape. Written once at mkfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Format version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// Features an older reader may ignore.
    pub compat: u64,
    /// Features an older reader must refuse to open.
    pub incompat: u64,
    /// Features an older reader may only read.
    pub ro_compat: u64,
    /// Identifies this image; batches carry part of it.
    pub uuid: [u8; 16],
    /// Segment space.
    pub geometry: Geometry,
    /// When mkfs ran, nanoseconds since the Unix epoch.
    pub created_ns: u64,
    /// Of two devices: segments `0..fast_segments` are the fast device's,
    /// the rest the bulk device's; 0 for one device.
    pub fast_segments: u32,
    /// Which device of the image this superblock was read from.
    pub role: Role,
    /// Of two devices: the path the other device had when this one was
    /// last written (a hint to find it; its own superblock decides).
    pub partner: String,
}

/// Which device of an image a superblock describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// The only device.
    #[default]
    Single,
    /// The fast device of two: the metadata slots, the journal, the index.
    Fast,
    /// The bulk device of two: large files' data.
    Bulk,
}

impl Role {
    fn code(self) -> u32 {
        match self {
            Role::Single => 0,
            Role::Fast => 1,
            Role::Bulk => 2,
        }
    }
    fn from_code(c: u32) -> Option<Role> {
        [Role::Single, Role::Fast, Role::Bulk].into_iter().find(|r| r.code() == c)
    }
    /// Its name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Single => "the only device",
            Role::Fast => "the fast device",
            Role::Bulk => "the bulk device",
        }
    }
}

/// Longest partner path a superblock records.
pub const MAX_PARTNER_PATH: usize = 2048;

impl Superblock {
    /// Encode into a metadata slot.
    pub fn encode(&self) -> [u8; META_SLOT_SIZE] {
        let mut v = Vec::with_capacity(META_SLOT_SIZE);
        v.extend_from_slice(&SUPER_MAGIC); // 0
        v.put_u32(self.version); // 8
        v.put_u32(0); // 12 reserved
        v.put_u64(self.compat); // 16
        v.put_u64(self.incompat); // 24
        v.put_u64(self.ro_compat); // 32
        v.extend_from_slice(&self.uuid); // 40
        v.put_u32(self.geometry.segment_size); // 56
        v.put_u32(self.geometry.segment_count); // 60
        v.put_u64(self.created_ns); // 64
        if self.incompat & INCOMPAT_TWO_DEVICES != 0 {
            v.put_u32(self.fast_segments); // 72
            v.put_u32(self.role.code()); // 76
                                         // A path too long to record is not recorded (it is a hint).
            let p = self.partner.as_bytes();
            let p = if p.len() > MAX_PARTNER_PATH { &[][..] } else { p };
            v.put_u32(p.len() as u32); // 80
            v.extend_from_slice(p); // 84
        }
        seal_slot(v)
    }

    /// Decode and validate a superblock slot.
    pub fn decode(buf: &[u8; META_SLOT_SIZE]) -> Result<Superblock> {
        if buf[..8] != SUPER_MAGIC {
            return Err(Error::NotAnImage(
                "no zlogfs superblock at the start (wrong magic); create one with `zlogfs mkfs`".into(),
            ));
        }
        check_slot_crc(buf, "superblock")?;
        let mut r = Reader::new(buf, "superblock");
        r.bytes(8)?;
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(Error::Unsupported(format!(
                "image format version {version}; this zlogfs reads version {FORMAT_VERSION} only{}",
                if version > FORMAT_VERSION { " (upgrade zlogfs)" } else { "" }
            )));
        }
        r.u32()?;
        let compat = r.u64()?;
        let incompat = r.u64()?;
        let ro_compat = r.u64()?;
        if incompat & !INCOMPAT_KNOWN != 0 {
            return Err(Error::Unsupported(format!(
                "image uses incompatible features {:#x} this zlogfs does not know",
                incompat & !INCOMPAT_KNOWN
            )));
        }
        if ro_compat & !RO_COMPAT_KNOWN != 0 {
            // Read-only opening does not exist yet: refuse rather than write.
            return Err(Error::Unsupported(format!(
                "image uses features {:#x} this zlogfs may only read, and read-only opening is not \
                 supported yet",
                ro_compat & !RO_COMPAT_KNOWN
            )));
        }
        let uuid = r.array::<16>()?;
        let segment_size = r.u32()?;
        let segment_count = r.u32()?;
        let created_ns = r.u64()?;
        let geometry = Geometry { segment_size, segment_count };
        validate_geometry(geometry).map_err(|e| Error::corrupt("superblock", e))?;
        let (mut fast_segments, mut role, mut partner) = (0, Role::Single, String::new());
        if incompat & INCOMPAT_TWO_DEVICES != 0 {
            fast_segments = r.u32()?;
            role = Role::from_code(r.u32()?)
                .ok_or_else(|| Error::corrupt("superblock", "unknown device role"))?;
            let n = r.u32()? as usize;
            if n > MAX_PARTNER_PATH {
                return Err(Error::corrupt("superblock", "partner path too long"));
            }
            partner = String::from_utf8(r.bytes(n)?.to_vec())
                .map_err(|_| Error::corrupt("superblock", "the partner path is not UTF-8"))?;
            if role == Role::Single || fast_segments < 4 || fast_segments > segment_count - 4 {
                return Err(Error::corrupt(
                    "superblock",
                    format!("{fast_segments} of {segment_count} segments on the fast device"),
                ));
            }
        }
        Ok(Superblock {
            version,
            compat,
            incompat,
            ro_compat,
            uuid,
            geometry,
            created_ns,
            fast_segments,
            role,
            partner,
        })
    }

    /// Segments on the fast device (all for one device).
    pub fn fast_segments(&self) -> u32 {
        if self.fast_segments == 0 {
            self.geometry.segment_count
        } else {
            self.fast_segments
        }
    }

    /// The first 8 bytes of the uuid, carried by every batch header.
    pub fn log_id(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.uuid[..8]);
        u64::from_le_bytes(b)
    }
}

/// Check a geometry against the format's limits.
pub fn validate_geometry(g: Geometry) -> std::result::Result<(), String> {
    if g.segment_size < MIN_SEGMENT_SIZE
        || g.segment_size > MAX_SEGMENT_SIZE
        || g.segment_size % BATCH_ALIGN != 0
    {
        return Err(format!(
            "segment size {} is not a multiple of {BATCH_ALIGN} between {MIN_SEGMENT_SIZE} and {MAX_SEGMENT_SIZE}",
            g.segment_size
        ));
    }
    if g.segment_count < 4 {
        return Err(format!("{} segments; at least 4 are needed", g.segment_count));
    }
    Ok(())
}

fn seal_slot(mut v: Vec<u8>) -> [u8; META_SLOT_SIZE] {
    assert!(v.len() <= SLOT_CRC_OFFSET, "metadata slot overflow");
    v.resize(SLOT_CRC_OFFSET, 0);
    let c = crc(&v);
    v.put_u32(c);
    let mut out = [0u8; META_SLOT_SIZE];
    out.copy_from_slice(&v);
    out
}

fn check_slot_crc(buf: &[u8; META_SLOT_SIZE], what: &str) -> Result<()> {
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&buf[SLOT_CRC_OFFSET..]);
    let expected = u32::from_le_bytes(stored);
    let got = crc(&buf[..SLOT_CRC_OFFSET]);
    if expected != got {
        return Err(Error::ChecksumMismatch { what: what.into(), expected, got });
    }
    Ok(())
}

/// A position in the log where a batch starts (or will start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogPos {
    /// Segment.
    pub seg: u32,
    /// Offset in the segment (a multiple of [`BATCH_ALIGN`]).
    pub offset: u32,
    /// Sequence number of the batch at this position.
    pub batch_seq: u64,
    /// `batch_crc` of the batch before it (0 before the first).
    pub prev_crc: u32,
    /// Segment the log continues in when this one is full.
    pub next_seg: u32,
    /// Of two devices: where the second head (the bulk device's data)
    /// writes its next batch; the chain goes on at either head.
    pub alt: Option<HeadPos>,
    /// Of two devices: `batch_crc` of the last batch in `seg` (0: none),
    /// which the next batch there names as `seg_prev_crc`.
    pub seg_prev_crc: u32,
}

/// Where one head of the log writes next: segment, offset, and the
/// segment it continues in (named by its last batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadPos {
    /// Segment.
    pub seg: u32,
    /// Offset in the segment (a multiple of [`BATCH_ALIGN`]).
    pub offset: u32,
    /// Segment it continues in when this one is full.
    pub next_seg: u32,
    /// `batch_crc` of the last batch in `seg` (0: none).
    pub seg_prev_crc: u32,
}

impl LogPos {
    /// Whether its heads lie inside geometry `g`, at batch boundaries (a
    /// checkpoint slot's crc does not vouch for the values it was given).
    pub fn fits(&self, g: Geometry) -> bool {
        let ok = |seg: u32, offset: u32, next: u32| {
            seg < g.segment_count
                && offset <= g.segment_size
                && offset % BATCH_ALIGN == 0
                && (next == NO_SEGMENT || next < g.segment_count)
        };
        ok(self.seg, self.offset, self.next_seg) && self.alt.is_none_or(|a| ok(a.seg, a.offset, a.next_seg))
    }
}

impl LogPos {
    fn put(&self, v: &mut Vec<u8>) {
        v.put_u32(self.seg);
        v.put_u32(self.offset);
        v.put_u64(self.batch_seq);
        v.put_u32(self.prev_crc);
        v.put_u32(self.next_seg);
    }
    fn get(r: &mut Reader) -> Result<LogPos> {
        Ok(LogPos {
            seg: r.u32()?,
            offset: r.u32()?,
            batch_seq: r.u64()?,
            prev_crc: r.u32()?,
            next_seg: r.u32()?,
            alt: None,
            seg_prev_crc: 0,
        })
    }
}

/// A checkpoint slot: points at the checkpoint body (a block in the log) and
/// at the position replay starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSlot {
    /// Monotonic checkpoint number; slot A holds even, slot B odd numbers.
    pub number: u64,
    /// The image uuid (a slot from another mkfs is ignored).
    pub uuid: [u8; 16],
    /// Where the checkpoint body block is.
    pub body: BlockAddr,
    /// Where roll-forward starts.
    pub replay: LogPos,
    /// The first batch after the checkpoint body's batch: usage accounting
    /// restarts here.
    pub after_body: LogPos,
}

impl CheckpointSlot {
    /// Encode into a metadata slot.
    pub fn encode(&self) -> [u8; META_SLOT_SIZE] {
        let mut v = Vec::with_capacity(META_SLOT_SIZE);
        v.extend_from_slice(&CKPT_MAGIC); // 0
        v.put_u64(self.number); // 8
        v.extend_from_slice(&self.uuid); // 16
        self.body.put(&mut v); // 32
        self.replay.put(&mut v); // 44
        self.after_body.put(&mut v); // 68
        if let Some(a) = self.replay.alt {
            v.put_u32(1); // 92: the replay start's second head
            v.put_u32(a.seg); // 96
            v.put_u32(a.offset); // 100
            v.put_u32(a.next_seg); // 104
            v.put_u32(self.replay.seg_prev_crc); // 108: the fast head's last crc in its segment
            v.put_u32(a.seg_prev_crc); // 112: the bulk head's
        }
        seal_slot(v)
    }

    /// Decode a slot; `Ok(None)` for a never-written (all zero) slot.
    pub fn decode(buf: &[u8; META_SLOT_SIZE], what: &str) -> Result<Option<CheckpointSlot>> {
        if buf.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        if buf[..8] != CKPT_MAGIC {
            return Err(Error::corrupt(what, "wrong magic"));
        }
        check_slot_crc(buf, what)?;
        let mut r = Reader::new(buf, what);
        r.bytes(8)?;
        let number = r.u64()?;
        let uuid = r.array::<16>()?;
        let body = BlockAddr::get(&mut r)?;
        let mut replay = LogPos::get(&mut r)?;
        let after_body = LogPos::get(&mut r)?;
        if r.u32()? == 1 {
            let (seg, offset, next_seg) = (r.u32()?, r.u32()?, r.u32()?);
            replay.seg_prev_crc = r.u32()?;
            replay.alt = Some(HeadPos { seg, offset, next_seg, seg_prev_crc: r.u32()? });
        }
        Ok(Some(CheckpointSlot { number, uuid, body, replay, after_body }))
    }
}

/// Where a block is: segment, offset of its header, and its length
/// including the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockAddr {
    /// Segment.
    pub seg: u32,
    /// Offset of the block header in the segment.
    pub offset: u32,
    /// Header plus payload bytes.
    pub len: u32,
}

impl BlockAddr {
    /// Encoded size.
    pub const SIZE: usize = 12;
    /// Append the 12-byte encoding.
    pub fn put(&self, v: &mut Vec<u8>) {
        v.put_u32(self.seg);
        v.put_u32(self.offset);
        v.put_u32(self.len);
    }
    /// Decode the 12-byte encoding.
    pub fn get(r: &mut Reader) -> Result<BlockAddr> {
        Ok(BlockAddr { seg: r.u32()?, offset: r.u32()?, len: r.u32()? })
    }
}

impl std::fmt::Display for BlockAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "segment {} offset {} ({} bytes)", self.seg, self.offset, self.len)
    }
}

/// What a block holds. Recorded in its header and in the batch summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockKind {
    /// Index mutations in commit order.
    Journal = 1,
    /// Sorted entries of an index run.
    RunData = 2,
    /// The sparse key index of a run.
    RunIndex = 3,
    /// The key filter of a run.
    RunFilter = 4,
    /// A checkpoint body in one block (images made before checkpoint parts).
    Checkpoint = 5,
    /// File data owned by a layer above (owner = inode).
    Data = 6,
    /// A checkpoint's head: where its body's parts are.
    CheckpointHead = 7,
    /// A slice of a checkpoint body.
    CheckpointPart = 8,
}

impl BlockKind {
    /// Decode a kind byte.
    pub fn from_u8(v: u8) -> Option<BlockKind> {
        Some(match v {
            1 => BlockKind::Journal,
            2 => BlockKind::RunData,
            3 => BlockKind::RunIndex,
            4 => BlockKind::RunFilter,
            5 => BlockKind::Checkpoint,
            6 => BlockKind::Data,
            7 => BlockKind::CheckpointHead,
            8 => BlockKind::CheckpointPart,
            _ => return None,
        })
    }
    /// Every kind.
    pub const ALL: [BlockKind; 8] = [
        BlockKind::Journal,
        BlockKind::RunData,
        BlockKind::RunIndex,
        BlockKind::RunFilter,
        BlockKind::Checkpoint,
        BlockKind::Data,
        BlockKind::CheckpointHead,
        BlockKind::CheckpointPart,
    ];
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BlockKind::Journal => "journal",
            BlockKind::RunData => "run data",
            BlockKind::RunIndex => "run index",
            BlockKind::RunFilter => "run filter",
            BlockKind::Checkpoint => "checkpoint",
            BlockKind::Data => "data",
            BlockKind::CheckpointHead => "checkpoint head",
            BlockKind::CheckpointPart => "checkpoint part",
        }
    }
}

/// The 16-byte header in front of every block's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// crc32c of header bytes 4..16 and the payload.
    pub crc: u32,
    /// Codec that wrote the payload.
    pub codec: u8,
    /// Codec level.
    pub level: u8,
    /// Why the payload is stored raw (`codec::raw_reason` bits), or 0.
    pub raw_reason: u8,
    /// What the block holds.
    pub kind: u8,
    /// Length after decompression.
    pub raw_len: u32,
    /// Length of the stored payload.
    pub stored_len: u32,
}

impl BlockHeader {
    /// Encode header + payload, computing the crc.
    pub fn seal(mut self, payload: &[u8], out: &mut Vec<u8>) {
        let mut h = Vec::with_capacity(12);
        h.put_u8(self.codec);
        h.put_u8(self.level);
        h.put_u8(self.raw_reason);
        h.put_u8(self.kind);
        h.put_u32(self.raw_len);
        h.put_u32(self.stored_len);
        let mut c = crc32c::crc32c(&h);
        c = crc32c::crc32c_append(c, payload);
        self.crc = c;
        out.put_u32(c);
        out.extend_from_slice(&h);
        out.extend_from_slice(payload);
    }

    /// Parse the 16 header bytes (nothing verified: the crc covers the
    /// payload too).
    pub fn parse(r: &mut Reader) -> Result<BlockHeader> {
        Ok(BlockHeader {
            crc: r.u32()?,
            codec: r.u8()?,
            level: r.u8()?,
            raw_reason: r.u8()?,
            kind: r.u8()?,
            raw_len: r.u32()?,
            stored_len: r.u32()?,
        })
    }

    /// Parse and verify a whole block (header + payload) read from `addr`.
    /// Returns the header and the payload.
    pub fn open(buf: &[u8], addr: BlockAddr) -> Result<(BlockHeader, &[u8])> {
        let what = format!("block at {addr}");
        let mut r = Reader::new(buf, &what);
        let h = BlockHeader::parse(&mut r)?;
        let stored_crc = h.crc;
        let got = crc(&buf[4..]);
        if got != stored_crc {
            return Err(Error::ChecksumMismatch { what, expected: stored_crc, got });
        }
        if h.stored_len as usize != buf.len() - BLOCK_HEADER_SIZE {
            return Err(Error::corrupt(
                what,
                format!("payload length {} does not match the address", h.stored_len),
            ));
        }
        Ok((h, &buf[BLOCK_HEADER_SIZE..]))
    }
}

/// The fixed header at the start of every batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// crc32c of the batch from byte 8 to `total_len`.
    pub batch_crc: u32,
    /// [`Superblock::log_id`].
    pub log_id: u64,
    /// Consecutive batch sequence number.
    pub seq: u64,
    /// `batch_crc` of the previous batch: a chain that stale batches left in
    /// a reused or torn region cannot continue.
    pub prev_crc: u32,
    /// Batch length from its first byte to the end of the summary.
    pub total_len: u32,
    /// Offset of the summary from the batch start.
    pub summary_off: u32,
    /// Number of summary entries (= blocks).
    pub summary_count: u32,
    /// Segment the log continues in after this one.
    pub next_seg: u32,
    /// A random number drawn each time the image is opened. A batch
    /// rewritten after a crash therefore never has the crc of the batch it
    /// replaces, so stale batches after it cannot chain on again.
    pub epoch: u32,
    /// Highest batch seq known durable when this batch was written: lets
    /// recovery tell a damaged synced batch from a torn tail.
    pub durable_seq: u64,
    /// `batch_crc` of the batch before it in its segment (0 for the first
    /// there): with two heads, batches of a segment are not consecutive
    /// in the chain, and this chains them for a walk of the segment.
    pub seg_prev_crc: u32,
    /// Written at the bulk head of two (else the fast or only one):
    /// recovery takes a batch only at its own head's places.
    pub bulk_head: bool,
}

impl BatchHeader {
    /// Encode the header (with `batch_crc` as given).
    pub fn encode(&self) -> [u8; BATCH_HEADER_SIZE] {
        let mut v = Vec::with_capacity(BATCH_HEADER_SIZE);
        v.extend_from_slice(&BATCH_MAGIC); // 0
        v.put_u32(self.batch_crc); // 4
        v.put_u64(self.log_id); // 8
        v.put_u64(self.seq); // 16
        v.put_u32(self.prev_crc); // 24
        v.put_u32(self.total_len); // 28
        v.put_u32(self.summary_off); // 32
        v.put_u32(self.summary_count); // 36
        v.put_u32(self.next_seg); // 40
        v.put_u32(self.epoch); // 44
        v.put_u64(self.durable_seq); // 48
        v.put_u32(self.seg_prev_crc); // 56
        v.put_u32(u32::from(self.bulk_head)); // 60 flags: 1 the bulk head
        let mut out = [0u8; BATCH_HEADER_SIZE];
        out.copy_from_slice(&v);
        out
    }

    /// Decode a header; `None` when the magic is absent (no batch here).
    pub fn decode(buf: &[u8]) -> Result<Option<BatchHeader>> {
        if buf.len() < BATCH_HEADER_SIZE || buf[..4] != BATCH_MAGIC {
            return Ok(None);
        }
        let mut r = Reader::new(buf, "batch header");
        r.bytes(4)?;
        let batch_crc = r.u32()?;
        let log_id = r.u64()?;
        let seq = r.u64()?;
        let prev_crc = r.u32()?;
        let total_len = r.u32()?;
        let summary_off = r.u32()?;
        let summary_count = r.u32()?;
        let next_seg = r.u32()?;
        let epoch = r.u32()?;
        let durable_seq = r.u64()?;
        let seg_prev_crc = r.u32()?;
        let bulk_head = r.u32()? & 1 == 1;
        Ok(Some(BatchHeader {
            batch_crc,
            log_id,
            seq,
            prev_crc,
            total_len,
            summary_off,
            summary_count,
            next_seg,
            epoch,
            durable_seq,
            seg_prev_crc,
            bulk_head,
        }))
    }
}

/// One summary entry: a block of the batch, what it is and who owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryEntry {
    /// [`BlockKind`] as a byte.
    pub kind: u8,
    /// Codec of the payload.
    pub codec: u8,
    /// Offset of the block header from the batch start.
    pub offset: u32,
    /// Header plus payload length.
    pub len: u32,
    /// Decompressed payload length.
    pub raw_len: u32,
    /// Owner: inode for data, run id for run blocks, first seq for journal.
    pub owner: u64,
}

impl SummaryEntry {
    /// Append the 24-byte encoding.
    pub fn put(&self, v: &mut Vec<u8>) {
        v.put_u8(self.kind);
        v.put_u8(self.codec);
        v.put_u16(0);
        v.put_u32(self.offset);
        v.put_u32(self.len);
        v.put_u32(self.raw_len);
        v.put_u64(self.owner);
    }

    /// Decode the summary of a batch whose bytes are `batch`.
    pub fn decode_all(batch: &[u8], h: &BatchHeader, what: &str) -> Result<Vec<SummaryEntry>> {
        let start = h.summary_off as usize;
        let n = h.summary_count as usize;
        let end = n
            .checked_mul(SUMMARY_ENTRY_SIZE)
            .and_then(|l| l.checked_add(start))
            .filter(|&e| e == h.total_len as usize && e <= batch.len())
            .ok_or_else(|| Error::corrupt(what, "summary does not fit the batch"))?;
        let mut r = Reader::new(&batch[start..end], what);
        let mut out = Vec::with_capacity(n);
        let mut prev_end = BATCH_HEADER_SIZE as u64;
        for _ in 0..n {
            let kind = r.u8()?;
            let codec = r.u8()?;
            r.u16()?;
            let e = SummaryEntry {
                kind,
                codec,
                offset: r.u32()?,
                len: r.u32()?,
                raw_len: r.u32()?,
                owner: r.u64()?,
            };
            let block_end = u64::from(e.offset) + u64::from(e.len);
            if u64::from(e.offset) < prev_end
                || block_end > start as u64
                || (e.len as usize) < BLOCK_HEADER_SIZE
            {
                return Err(r.err(format!(
                    "block at batch offset {} length {} overlaps or leaves the batch",
                    e.offset, e.len
                )));
            }
            if BlockKind::from_u8(kind).is_none() {
                return Err(r.err(format!("unknown block kind {kind}")));
            }
            prev_end = block_end;
            out.push(e);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            compat: 0,
            incompat: 0,
            ro_compat: 0,
            uuid: *b"0123456789abcdef",
            geometry: Geometry { segment_size: DEFAULT_SEGMENT_SIZE, segment_count: 16 },
            created_ns: 1_700_000_000_000_000_000,
            fast_segments: 0,
            role: Role::Single,
            partner: String::new(),
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn slot() -> CheckpointSlot {
        let pos = LogPos {
            seg: 1,
            offset: 512,
            batch_seq: 7,
            prev_crc: 0xdead_beef,
            next_seg: 2,
            alt: None,
            seg_prev_crc: 0,
        };
        CheckpointSlot {
            number: 3,
            uuid: *b"0123456789abcdef",
            body: BlockAddr { seg: 1, offset: 64, len: 300 },
            replay: pos,
            after_body: LogPos { offset: 1024, batch_seq: 8, ..pos },
        }
    }

    fn batch_header() -> BatchHeader {
        BatchHeader {
            batch_crc: 0x0102_0304,
            log_id: 0x1122_3344_5566_7788,
            seq: 9,
            prev_crc: 0xa1b2_c3d4,
            total_len: 4000,
            summary_off: 3952,
            summary_count: 2,
            next_seg: 5,
            epoch: 0xfeed_face,
            durable_seq: 8,
            seg_prev_crc: 0,
            bulk_head: false,
        }
    }

    /// Golden encodings: if one of these fails, the on-disk format changed.
    /// Bump FORMAT_VERSION, update docs/FORMAT.md, and only then the string.
    #[test]
    fn golden_encodings() {
        let sb = sb().encode();
        assert_eq!(
            hex(&sb[..72]),
            "5a4c4f474653001a0100000000000000000000000000000000000000000000000000000000000000\
             30313233343536373839616263646566000040001000000000002a36fe9c9717"
        );
        assert!(sb[72..SLOT_CRC_OFFSET].iter().all(|&x| x == 0));
        assert_eq!(hex(&sb[SLOT_CRC_OFFSET..]), GOLDEN_SB_CRC);
        let sl = slot().encode();
        assert_eq!(hex(&sl[..92]), GOLDEN_SLOT);
        assert_eq!(hex(&batch_header().encode()), GOLDEN_BATCH);
        let mut v = Vec::new();
        SummaryEntry { kind: 6, codec: 2, offset: 64, len: 100, raw_len: 200, owner: 42 }.put(&mut v);
        assert_eq!(hex(&v), "060200004000000064000000c80000002a00000000000000");
        let mut v = Vec::new();
        BlockHeader { crc: 0, codec: 2, level: 3, raw_reason: 0, kind: 1, raw_len: 10, stored_len: 3 }
            .seal(b"xyz", &mut v);
        assert_eq!(hex(&v), GOLDEN_BLOCK);
    }

    const GOLDEN_SB_CRC: &str = "f0c5358e";
    const GOLDEN_SLOT: &str = "5a4c434b5054001a030000000000000030313233343536373839616263646566\
        01000000400000002c01000001000000000200000700000000000000efbeadde02000000\
        01000000000400000800000000000000efbeadde02000000";
    const GOLDEN_BATCH: &str = "5a4c42010403020188776655443322110900000000000000d4c3b2a1a00f0000\
        700f00000200000005000000cefaedfe08000000000000000000000000000000";
    const GOLDEN_BLOCK: &str = "f047182b020300010a0000000300000078797a";

    #[test]
    fn slot_round_trip() {
        let s = slot();
        assert_eq!(CheckpointSlot::decode(&s.encode(), "slot").unwrap(), Some(s));
        assert_eq!(CheckpointSlot::decode(&[0u8; META_SLOT_SIZE], "slot").unwrap(), None);
        let mut b = slot().encode();
        b[40] ^= 4;
        assert!(matches!(CheckpointSlot::decode(&b, "slot"), Err(Error::ChecksumMismatch { .. })));
    }

    #[test]
    fn superblock_rejects_damage_and_versions() {
        let mut b = sb().encode();
        b[60] ^= 1;
        assert!(matches!(Superblock::decode(&b), Err(Error::ChecksumMismatch { .. })));
        let mut s = sb();
        s.version = 2;
        assert!(matches!(Superblock::decode(&s.encode()), Err(Error::Unsupported(_))));
        // Two devices: the partner path round-trips; one not UTF-8 is
        // damage; one too long is not recorded.
        let two = Superblock {
            incompat: INCOMPAT_TWO_DEVICES,
            fast_segments: 4,
            role: Role::Bulk,
            partner: "/srv/fast.img".into(),
            ..sb()
        };
        assert_eq!(Superblock::decode(&two.encode()).unwrap(), two);
        let mut bad = two.encode();
        bad[84] = 0xff;
        let c = crc(&bad[..SLOT_CRC_OFFSET]);
        bad[SLOT_CRC_OFFSET..].copy_from_slice(&c.to_le_bytes());
        assert!(Superblock::decode(&bad).is_err(), "a partner path that is not UTF-8");
        let long = Superblock { partner: "é".repeat(MAX_PARTNER_PATH), ..two.clone() };
        assert_eq!(Superblock::decode(&long.encode()).unwrap().partner, "");
        // Found by fuzz_superblock: a partner of bytes that are not UTF-8
        // decoded lossily and did not round-trip.
        let found: &[u8] = &[
            0x5a, 0x4c, 0x4f, 0x47, 0x46, 0x53, 0x0, 0x1a, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0,
            0x0, 0x80, 0x0, 0x0, 0x0, 0x0, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0,
            0x0, 0x0, 0x0, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x61, 0x62, 0x63,
            0x64, 0x65, 0x66, 0x0, 0x0, 0x40, 0x0, 0x10, 0x0, 0x0, 0x0, 0x0, 0x0, 0x2a, 0x36, 0xfe, 0x9c,
            0x97, 0x17, 0x4, 0x0, 0x0, 0x0, 0x2, 0x0, 0x0, 0x0, 0x0, 0x8, 0x0, 0x0, 0x0, 0x0, 0x0, 0x97,
            0x17, 0x0, 0x2, 0x0, 0x0, 0x0, 0x0, 0x0,
        ];
        let mut slot = [0u8; META_SLOT_SIZE];
        slot[..found.len()].copy_from_slice(found);
        let c = crc(&slot[..SLOT_CRC_OFFSET]);
        slot[SLOT_CRC_OFFSET..].copy_from_slice(&c.to_le_bytes());
        if let Ok(sb) = Superblock::decode(&slot) {
            assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        }
        let mut s = sb();
        s.incompat = 4;
        assert!(matches!(Superblock::decode(&s.encode()), Err(Error::Unsupported(_))));
        assert!(matches!(Superblock::decode(&[0u8; 4096]), Err(Error::NotAnImage(_))));
    }

    #[test]
    fn batch_header_and_block_round_trip() {
        let h = BatchHeader {
            batch_crc: 7,
            log_id: 9,
            seq: 11,
            prev_crc: 13,
            total_len: 512,
            summary_off: 100,
            summary_count: 2,
            next_seg: 3,
            epoch: 1,
            durable_seq: 10,
            seg_prev_crc: 0x1234_5678,
            bulk_head: true,
        };
        assert_eq!(BatchHeader::decode(&h.encode()).unwrap(), Some(h));
        let mut out = Vec::new();
        BlockHeader { crc: 0, codec: 0, level: 0, raw_reason: 1, kind: 6, raw_len: 3, stored_len: 3 }
            .seal(b"abc", &mut out);
        let addr = BlockAddr { seg: 0, offset: 0, len: out.len() as u32 };
        let (bh, p) = BlockHeader::open(&out, addr).unwrap();
        assert_eq!(p, b"abc");
        assert_eq!(bh.kind, 6);
        out[17] ^= 0x10;
        assert!(matches!(BlockHeader::open(&out, addr), Err(Error::ChecksumMismatch { .. })));
    }
}
