//! Keys and records of the file system in the index (format version 2 of
//! the fs layer; see docs/FORMAT.md, "File system records").
//!
//! Every key starts with a one-byte tag, then big-endian integers, so that
//! related records sit next to each other: an inode's attributes, a
//! directory's entries by name, a file's chunks by offset, its xattrs by
//! name.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::error::{Error, Result};
use zlogfs_engine::BlockAddr;

/// An inode number. Allocated in creation order, never reused.
pub type Ino = u64;

/// The root directory.
pub const ROOT: Ino = 1;

/// Version of the fs-layer records, kept in the config record.
/// Version 2 added patched chunks (`Extent::Patched`, chunk type 3),
/// version 3 patched chunks that release the replaced part of their base
/// (chunk type 4), version 4 bases that are gone (type 5), version 5
/// chunks reserved by fallocate (`Extent::Reserved`, type 6, and the
/// reserved bytes of the counters record), version 6 inodes with a chunk
/// size of their own ([`Inode::chunk`]), version 7 named snapshots and
/// held frees, version 8 change records ([`change_key`]) and parents of
/// files as well as directories ([`Inode::parent`]). An image is marked by
/// the first
/// commit that writes such a record, so images that never had one stay
/// readable by older builds.
pub const FS_VERSION: u8 = 11;

const T_CONFIG: u8 = 0x01;
const T_TRIPLE: u8 = 0x02;
const T_COUNTERS: u8 = 0x03;
const T_CHANGES_FROM: u8 = 0x04;
const T_POLICY: u8 = 0x05;
const T_ORPHAN: u8 = 0x08;
const T_INODE: u8 = 0x10;
const T_DIRENT: u8 = 0x20;
const T_EXTENT: u8 = 0x30;
const T_XATTR: u8 = 0x40;
const T_SHARED: u8 = 0x50;
const T_HELD: u8 = 0x60;
const T_FORWARD: u8 = 0x61;
const T_SEG_BORN: u8 = 0x62;
const T_SNAPSHOT: u8 = 0x71;
const T_CHANGE: u8 = 0x72;

fn key(tag: u8, a: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(tag);
    k.extend_from_slice(&a.to_be_bytes());
    k
}

/// Records keyed by inode number first, for scans of a span of inode
/// numbers ([`ino_span`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByIno {
    /// Inode records.
    Inodes,
    /// The orphan list.
    Orphans,
    /// Chunk records.
    Extents,
    /// Extended attributes.
    Xattrs,
}

/// The key range of `what` for inode numbers `from..to` (`to` None: to
/// the end). A span from 0 starts at the tag and a span to the end ends at
/// the next, so that spans covering every inode number cover every key of
/// the tag, malformed ones included (each in the one span it sorts into).
pub fn ino_span(what: ByIno, from: Ino, to: Option<Ino>) -> (Vec<u8>, Vec<u8>) {
    let tag = match what {
        ByIno::Inodes => T_INODE,
        ByIno::Orphans => T_ORPHAN,
        ByIno::Extents => T_EXTENT,
        ByIno::Xattrs => T_XATTR,
    };
    let lo = if from == 0 { vec![tag] } else { key(tag, from) };
    (lo, to.map_or(vec![tag + 1], |t| key(tag, t)))
}

/// The key range of the shared-block records of blocks in segments
/// `from..to` (`to` None: to the end); spans covering every segment cover
/// every key of the tag, as [`ino_span`]'s do.
pub fn shared_span(from: u32, to: Option<u32>) -> (Vec<u8>, Vec<u8>) {
    let at = |seg: u32| [&[T_SHARED][..], &seg.to_be_bytes()].concat();
    let lo = if from == 0 { vec![T_SHARED] } else { at(from) };
    (lo, to.map_or(vec![T_SHARED + 1], at))
}

/// The file system's config record.
pub fn config_key() -> Vec<u8> {
    vec![T_CONFIG]
}
/// The lifetime write counters.
pub fn counters_key() -> Vec<u8> {
    vec![T_COUNTERS]
}
/// A (uid, gid, mode) triple by id.
pub fn triple_key(id: u32) -> Vec<u8> {
    let mut k = vec![T_TRIPLE];
    k.extend_from_slice(&id.to_be_bytes());
    k
}
/// First key after all triples.
pub fn triples_end() -> Vec<u8> {
    vec![T_TRIPLE + 1]
}
/// Parse a triple key.
pub fn triple_id(k: &[u8]) -> Option<u32> {
    (k.len() == 5 && k[0] == T_TRIPLE).then(|| u32::from_be_bytes([k[1], k[2], k[3], k[4]]))
}
/// An inode unlinked while open, to delete at the next open.
pub fn orphan_key(ino: Ino) -> Vec<u8> {
    key(T_ORPHAN, ino)
}
/// Range of orphan keys.
pub fn orphans_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_ORPHAN], vec![T_ORPHAN + 1])
}
/// An inode's attributes.
pub fn inode_key(ino: Ino) -> Vec<u8> {
    key(T_INODE, ino)
}
/// Range of all inode keys.
pub fn inodes_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_INODE], vec![T_INODE + 1])
}
/// A directory entry.
pub fn dirent_key(parent: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = key(T_DIRENT, parent);
    k.extend_from_slice(name);
    k
}
/// Range of a directory's entries.
pub fn dirents_range(parent: Ino) -> (Vec<u8>, Vec<u8>) {
    (key(T_DIRENT, parent), key(T_DIRENT, parent).into_iter().chain([0xff; 256]).collect())
}
/// Range of all directory entries.
pub fn all_dirents_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_DIRENT], vec![T_DIRENT + 1])
}
/// The chunk `idx` of a file.
pub fn extent_key(ino: Ino, idx: u64) -> Vec<u8> {
    let mut k = key(T_EXTENT, ino);
    k.extend_from_slice(&idx.to_be_bytes());
    k
}
/// Range of a file's chunks from `idx` on.
pub fn extents_from(ino: Ino, idx: u64) -> (Vec<u8>, Vec<u8>) {
    (extent_key(ino, idx), key(T_EXTENT, ino + 1))
}
/// Range of all chunks.
pub fn all_extents_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_EXTENT], vec![T_EXTENT + 1])
}
/// An extended attribute.
pub fn xattr_key(ino: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = key(T_XATTR, ino);
    k.extend_from_slice(name);
    k
}
/// Range of an inode's xattrs.
pub fn xattrs_range(ino: Ino) -> (Vec<u8>, Vec<u8>) {
    (key(T_XATTR, ino), key(T_XATTR, ino + 1))
}
/// The reference list of a data block shared by several chunks.
pub fn shared_key(a: BlockAddr) -> Vec<u8> {
    let mut k = vec![T_SHARED];
    k.extend_from_slice(&a.seg.to_be_bytes());
    k.extend_from_slice(&a.offset.to_be_bytes());
    k.extend_from_slice(&a.len.to_be_bytes());
    k
}
/// Range of all shared-block records.
#[cfg(test)]
pub fn all_shared_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_SHARED], vec![T_SHARED + 1])
}

/// A free held back for snapshots (record version 7): (part of) block `a`
/// that the group of sequence numbers from `died` on stopped using, the
/// `n`th free of that group; the value is `var born` (version 8; empty
/// before: 0), a sequence number no record naming the block is older
/// than. Its bytes stay counted live in their segment until no snapshot
/// at or after `born` and before `died` is left.
pub fn held_key(a: BlockAddr, died: u64, n: u32) -> Vec<u8> {
    let mut k = vec![T_HELD];
    k.extend_from_slice(&a.seg.to_be_bytes());
    k.extend_from_slice(&a.offset.to_be_bytes());
    k.extend_from_slice(&a.len.to_be_bytes());
    k.extend_from_slice(&died.to_be_bytes());
    k.extend_from_slice(&n.to_be_bytes());
    k
}
/// A held free's value: its block's born.
pub fn encode_born(born: u64) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_var(born);
    v
}
/// Decode [`encode_born`] (empty, as version 7 wrote it: 0).
pub fn decode_born(v: &[u8], what: &str) -> Result<u64> {
    if v.is_empty() {
        return Ok(0);
    }
    let mut r = Reader::new(v, what);
    let born = r.var()?;
    r.finish()?;
    Ok(born)
}
/// The born of held free `k` = `v`; the key is described only if the
/// value is damaged (held frees are read by the thousand).
pub fn held_born(k: &[u8], v: &[u8]) -> Result<u64> {
    decode_born(v, "a held free").or_else(|_| decode_born(v, &describe_key(k)))
}
/// (block, died, n) of a held free's key.
pub fn parse_held_key(k: &[u8]) -> Option<(BlockAddr, u64, u32)> {
    if k.len() != 25 || k[0] != T_HELD {
        return None;
    }
    let w = |i: usize| u32::from_be_bytes([k[i], k[i + 1], k[i + 2], k[i + 3]]);
    let died = u64::from_be_bytes(k[13..21].try_into().ok()?);
    Some((BlockAddr { seg: w(1), offset: w(5), len: w(9) }, died, w(21)))
}
/// Range of all held frees.
pub fn all_held_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_HELD], vec![T_HELD + 1])
}
/// Range of the held frees of blocks in segment `seg`.
pub fn held_range_in(seg: u32) -> (Vec<u8>, Vec<u8>) {
    let mut lo = vec![T_HELD];
    lo.extend_from_slice(&seg.to_be_bytes());
    let mut hi = vec![T_HELD];
    hi.extend_from_slice(&(u64::from(seg) + 1).to_be_bytes()[4..]);
    if seg == u32::MAX {
        hi = vec![T_HELD + 1];
    }
    (lo, hi)
}

/// When segment `seg` started to take the blocks it holds (record
/// version 8): the value is `var seq`, a sequence number no record naming
/// a block there is older than (the block's "born", a lower bound).
pub fn seg_born_key(seg: u32) -> Vec<u8> {
    let mut k = vec![T_SEG_BORN];
    k.extend_from_slice(&seg.to_be_bytes());
    k
}
/// (seg) of a segment-born key.
pub fn parse_seg_born_key(k: &[u8]) -> Option<u32> {
    (k.len() == 5 && k[0] == T_SEG_BORN).then(|| u32::from_be_bytes([k[1], k[2], k[3], k[4]]))
}
/// Range of all segment-born records.
pub fn seg_borns_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_SEG_BORN], vec![T_SEG_BORN + 1])
}

/// A forward record (record version 8): the block that lay at `seg`,
/// `offset` was copied as it was stored, by the group whose first sequence
/// number is `moved`, to the address the value names ([`encode_addr`]).
/// A read as of a point before `moved` that names the old address reads
/// the copy.
pub fn forward_key(seg: u32, offset: u32, moved: u64) -> Vec<u8> {
    let mut k = vec![T_FORWARD];
    k.extend_from_slice(&seg.to_be_bytes());
    k.extend_from_slice(&offset.to_be_bytes());
    k.extend_from_slice(&moved.to_be_bytes());
    k
}
/// (seg, offset, moved) of a forward record's key.
pub fn parse_forward_key(k: &[u8]) -> Option<(u32, u32, u64)> {
    if k.len() != 17 || k[0] != T_FORWARD {
        return None;
    }
    let w = |i: usize| u32::from_be_bytes([k[i], k[i + 1], k[i + 2], k[i + 3]]);
    Some((w(1), w(5), u64::from_be_bytes(k[9..17].try_into().ok()?)))
}
/// Range of the forward records of the block at `seg`, `offset` moved
/// after sequence number `after`.
pub fn forward_range(seg: u32, offset: u32, after: u64) -> (Vec<u8>, Vec<u8>) {
    let lo = forward_key(seg, offset, after.saturating_add(1));
    let mut hi = forward_key(seg, offset, u64::MAX);
    hi.push(0);
    (lo, hi)
}
/// Range of all forward records.
pub fn all_forward_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_FORWARD], vec![T_FORWARD + 1])
}
/// A block address as a value: u32 seg, u32 offset, u32 len, big-endian.
pub fn encode_addr(a: BlockAddr) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&a.seg.to_be_bytes());
    v.extend_from_slice(&a.offset.to_be_bytes());
    v.extend_from_slice(&a.len.to_be_bytes());
    v
}
/// Decode [`encode_addr`].
pub fn decode_addr(v: &[u8], what: &str) -> Result<BlockAddr> {
    let mut r = Reader::new(v, what);
    let mut be = || r.array::<4>().map(u32::from_be_bytes);
    let a = BlockAddr { seg: be()?, offset: be()?, len: be()? };
    r.finish()?;
    Ok(a)
}
/// A named snapshot (record version 7); its value is [`Snapshot::encode`].
pub fn snapshot_key(name: &[u8]) -> Vec<u8> {
    let mut k = vec![T_SNAPSHOT];
    k.extend_from_slice(name);
    k
}
/// Range of all snapshots.
pub fn snapshots_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_SNAPSHOT], vec![T_SNAPSHOT + 1])
}

/// The change record of the commit group whose first sequence number is
/// `seq` (record version 8); its value is `changes::Record::encode`.
pub fn change_key(seq: u64) -> Vec<u8> {
    let mut k = vec![T_CHANGE];
    k.extend_from_slice(&seq.to_be_bytes());
    k
}
/// (seq) of a change record's key.
pub fn parse_change_key(k: &[u8]) -> Option<u64> {
    split(k, T_CHANGE).filter(|(_, r)| r.is_empty()).map(|(s, _)| s)
}
/// Range of all change records.
pub fn changes_range() -> (Vec<u8>, Vec<u8>) {
    (vec![T_CHANGE], vec![T_CHANGE + 1])
}
/// The retention policy of automatic points (record version 8): its text
/// (`crate::history::Policy`'s form). Absent: none.
pub fn policy_key() -> Vec<u8> {
    vec![T_POLICY]
}
/// Where the change records start (record version 8): every group after
/// the point its value names has its change record. Absent: none is kept.
pub fn changes_from_key() -> Vec<u8> {
    vec![T_CHANGES_FROM]
}

/// A named snapshot: the sequence number it reads at (the last of the
/// group committed before it), and when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Reads of the snapshot are reads at this sequence number.
    pub seq: u64,
    /// When it was taken.
    pub time: Time,
}

impl Snapshot {
    /// Encode: var seq, zvar sec, var nsec.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.seq);
        v.put_var(zigzag(self.time.sec));
        v.put_var(u64::from(self.time.nsec));
        v
    }
    /// Decode.
    pub fn decode(b: &[u8], what: &str) -> Result<Snapshot> {
        let mut r = Reader::new(b, what);
        let seq = r.var()?;
        let sec = unzigzag(r.var()?);
        let nsec = r.var_max(999_999_999, "nanoseconds")? as u32;
        r.finish()?;
        Ok(Snapshot { seq, time: Time { sec, nsec } })
    }
}

/// The first character of an automatic point's name (refused in the
/// names users give).
pub(crate) const AUTO: char = '@';

/// Split a key of `tag` + u64 + rest.
fn split(k: &[u8], tag: u8) -> Option<(u64, &[u8])> {
    if k.len() < 9 || k[0] != tag {
        return None;
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&k[1..9]);
    Some((u64::from_be_bytes(a), &k[9..]))
}
/// What the record of key `k` is, in words (for reports of damage).
pub fn describe_key(k: &[u8]) -> String {
    let lossy = |n: &[u8]| String::from_utf8_lossy(n).into_owned();
    if let Some(i) = parse_inode_key(k) {
        return format!("inode {i}");
    }
    if let Some((p, n)) = parse_dirent_key(k) {
        return format!("entry {:?} of directory {p}", lossy(n));
    }
    if let Some((i, c)) = parse_extent_key(k) {
        return format!("chunk {c} of inode {i}");
    }
    if let Some((i, n)) = parse_xattr_key(k) {
        return format!("xattr {:?} of inode {i}", lossy(n));
    }
    if let Some(i) = parse_orphan_key(k) {
        return format!("orphan record of inode {i}");
    }
    if let Some(a) = parse_shared_key(k) {
        return format!("reference list of block {a}");
    }
    if let Some((seg, offset, m)) = parse_forward_key(k) {
        return format!("forward record of the block at {seg}:{offset} (moved from sequence number {m})");
    }
    if let Some(seg) = parse_seg_born_key(k) {
        return format!("the record of when segment {seg} started to take its blocks");
    }
    if let Some((a, died, _)) = parse_held_key(k) {
        return format!("held free of block {a} (from sequence number {died})");
    }
    if let Some(s) = parse_change_key(k) {
        return format!("change record of the group from sequence number {s}");
    }
    if k.first() == Some(&T_SNAPSHOT) {
        return format!("snapshot {:?}", lossy(&k[1..]));
    }
    match k.first() {
        Some(&T_CONFIG) => "the config record".into(),
        Some(&T_TRIPLE) => "an owner triple".into(),
        Some(&T_COUNTERS) => "the counters record".into(),
        Some(&T_CHANGES_FROM) => "the record of where change records start".into(),
        Some(&T_POLICY) => "the retention policy of automatic points".into(),
        _ => format!("key {k:02x?}"),
    }
}

/// (ino) of an inode or orphan key.
pub fn parse_inode_key(k: &[u8]) -> Option<Ino> {
    split(k, T_INODE).filter(|(_, r)| r.is_empty()).map(|(i, _)| i)
}
/// (ino) of an orphan key.
pub fn parse_orphan_key(k: &[u8]) -> Option<Ino> {
    split(k, T_ORPHAN).filter(|(_, r)| r.is_empty()).map(|(i, _)| i)
}
/// (parent, name) of a directory entry key.
pub fn parse_dirent_key(k: &[u8]) -> Option<(Ino, &[u8])> {
    split(k, T_DIRENT)
}
/// (ino, chunk) of an extent key.
pub fn parse_extent_key(k: &[u8]) -> Option<(Ino, u64)> {
    let (ino, r) = split(k, T_EXTENT)?;
    let idx: [u8; 8] = r.try_into().ok()?;
    Some((ino, u64::from_be_bytes(idx)))
}
/// (ino, name) of an xattr key.
pub fn parse_xattr_key(k: &[u8]) -> Option<(Ino, &[u8])> {
    split(k, T_XATTR)
}
/// The block address of a shared-block key.
pub fn parse_shared_key(k: &[u8]) -> Option<BlockAddr> {
    if k.len() != 13 || k[0] != T_SHARED {
        return None;
    }
    let w = |i: usize| u32::from_be_bytes([k[i], k[i + 1], k[i + 2], k[i + 3]]);
    Some(BlockAddr { seg: w(1), offset: w(5), len: w(9) })
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The file system's parameters and counters (the config record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Bytes of file data per chunk.
    pub chunk_size: u32,
    /// Target raw size of a block packing small files together.
    pub pack_bytes: u32,
    /// Files up to this size live inline in the index.
    pub inline_max: u32,
    /// Codec of file data when no policy says otherwise.
    pub codec: CodecSpec,
    /// Timestamps are stored as deltas from this second.
    pub base_sec: i64,
    /// Next inode number to allocate.
    pub next_ino: Ino,
    /// Next (uid, gid, mode) triple id.
    pub next_triple: u32,
    /// Record version: 1 until a patched chunk is written, then 3 (2 on
    /// images patched by builds before chunk type 4).
    pub version: u8,
    /// On two devices, files larger than this keep their own chunks on
    /// the bulk one ([`DEFAULT_SMALL_MAX`] when the record leaves it out).
    pub small_max: u64,
}

/// The default of [`Config::small_max`].
pub const DEFAULT_SMALL_MAX: u64 = 64 << 10;

impl Config {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.version];
        v.put_var(u64::from(self.chunk_size));
        v.put_var(u64::from(self.pack_bytes));
        v.put_var(u64::from(self.inline_max));
        v.put_u8(self.codec.id as u8);
        v.put_u8(self.codec.level);
        v.put_var(zigzag(self.base_sec));
        v.put_var(self.next_ino);
        v.put_var(u64::from(self.next_triple));
        if self.small_max != DEFAULT_SMALL_MAX {
            v.put_var(self.small_max);
        }
        v
    }
    /// Decode, refusing versions this build does not know.
    pub fn decode(b: &[u8]) -> Result<Config> {
        let mut r = Reader::new(b, "file system config record");
        let ver = r.u8()?;
        if ver == 0 || ver > FS_VERSION {
            return Err(Error::Unsupported(format!(
                "file system records of version {ver}; this build reads versions 1 to {FS_VERSION}"
            )));
        }
        let chunk_size = r.var_max(1 << 24, "chunk size")? as u32;
        let pack_bytes = r.var_max(1 << 26, "pack size")? as u32;
        let inline_max = r.var_max(1 << 16, "inline limit")? as u32;
        let id = r.u8()?;
        let level = r.u8()?;
        let id = CodecId::from_u8(id).ok_or_else(|| r.err(format!("unknown codec {id}")))?;
        let base_sec = unzigzag(r.var()?);
        let next_ino = r.var()?;
        let next_triple = r.var_max(u64::from(u32::MAX), "triple counter")? as u32;
        let small_max = if r.is_empty() { DEFAULT_SMALL_MAX } else { r.var_max(1 << 40, "small-file size")? };
        r.finish()?;
        if chunk_size < 4096 || !chunk_size.is_power_of_two() {
            return Err(r.err(format!("chunk size {chunk_size} is not a power of two of at least 4096")));
        }
        Ok(Config {
            chunk_size,
            pack_bytes,
            inline_max,
            codec: CodecSpec::new(id, level),
            base_sec,
            next_ino,
            next_triple,
            version: ver,
            small_max,
        })
    }
}

/// Lifetime write counters (the counters record), committed with each
/// group: bytes users wrote, and bytes the engine wrote to the log's
/// segments up to the previous group (a group's own journal record is
/// counted by the next one; close records the last group's, so only what
/// that record's own commit and the final checkpoint write goes
/// uncounted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Bytes passed to `write` (and imported).
    pub user_bytes: u64,
    /// Bytes written to the device: blocks, journal, runs, checkpoints.
    pub device_bytes: u64,
    /// Bytes of chunks reserved by fallocate and not written yet
    /// ([`Extent::Reserved`]): free space that writers of other data may
    /// not take. Written only when not 0 (record version 5).
    pub reserved: u64,
}

impl Counters {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.user_bytes);
        v.put_var(self.device_bytes);
        if self.reserved > 0 {
            v.put_var(self.reserved);
        }
        v
    }
    /// Decode.
    pub fn decode(b: &[u8]) -> Result<Counters> {
        let mut r = Reader::new(b, "file system counters record");
        let mut c = Counters { user_bytes: r.var()?, device_bytes: r.var()?, reserved: 0 };
        if r.peek().is_some() {
            c.reserved = r.var()?;
            if c.reserved == 0 {
                return Err(r.err("reserved bytes present but 0 (written only when not 0)"));
            }
        }
        r.finish()?;
        Ok(c)
    }
}

/// A point in time, in seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Time {
    /// Seconds (negative before 1970).
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

impl Time {
    /// From a SystemTime.
    pub fn from_system(t: std::time::SystemTime) -> Time {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    Time { sec: -s, nsec: 0 }
                } else {
                    Time { sec: -s - 1, nsec: 1_000_000_000 - n }
                }
            }
        }
    }
    /// To a SystemTime.
    pub fn to_system(self) -> std::time::SystemTime {
        let base = std::time::UNIX_EPOCH;
        if self.sec >= 0 {
            base + std::time::Duration::new(self.sec as u64, self.nsec)
        } else {
            base - std::time::Duration::from_secs(self.sec.unsigned_abs())
                + std::time::Duration::from_nanos(u64::from(self.nsec))
        }
    }
    fn put_delta(self, base: i64, v: &mut Vec<u8>) {
        v.put_var(zigzag(self.sec.wrapping_sub(base)));
        v.put_var(u64::from(self.nsec));
    }
    fn get_delta(base: i64, r: &mut Reader) -> Result<Time> {
        let sec = base.wrapping_add(unzigzag(r.var()?));
        let nsec = r.var_max(999_999_999, "nanoseconds")? as u32;
        Ok(Time { sec, nsec })
    }
}

/// The type of an inode, from the S_IFMT bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    Char,
    /// Block device.
    Block,
}

/// S_IFMT.
pub const S_IFMT: u32 = 0o170000;

impl Kind {
    /// The kind of a mode, if its type bits are valid.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & S_IFMT {
            0o100000 => Kind::File,
            0o040000 => Kind::Dir,
            0o120000 => Kind::Symlink,
            0o010000 => Kind::Fifo,
            0o140000 => Kind::Socket,
            0o020000 => Kind::Char,
            0o060000 => Kind::Block,
            _ => return None,
        })
    }
    /// The S_IFMT bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
            Kind::Char => 0o020000,
            Kind::Block => 0o060000,
        }
    }
    pub(crate) fn code(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::Char => 6,
            Kind::Block => 7,
        }
    }
    pub(crate) fn from_code(c: u8) -> Option<Kind> {
        Kind::from_mode(
            [0, 0o100000, 0o040000, 0o120000, 0o010000, 0o140000, 0o020000, 0o060000]
                .get(c as usize)
                .copied()?,
        )
    }
}

/// An inode's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// Its number.
    pub ino: Ino,
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Logical size in bytes.
    pub size: u64,
    /// Logical bytes in chunks that are not holes (st_blocks counts these).
    pub alloc: u64,
    /// Device number of device nodes.
    pub rdev: u64,
    /// Last access.
    pub atime: Time,
    /// Last modification of the contents.
    pub mtime: Time,
    /// Last change of the inode.
    pub ctime: Time,
    /// Creation.
    pub btime: Time,
    /// Parent directory; for other kinds the directory of their first
    /// link, 0 when unknown (made before record version 8, or that link
    /// removed while others remain). Change feeds name files by it.
    pub parent: Ino,
    /// Compression policy set on this inode (inherited by new entries of a
    /// directory).
    pub policy: Option<CodecSpec>,
    /// Chunk size of this file's data (a directory's is inherited by its
    /// new entries), a power of two from [`MIN_CHUNK`] to the image's
    /// chunk size; None: the image's. Fixed while a regular file holds
    /// data (record version 6).
    pub chunk: Option<u32>,
    /// On two devices, where this file's data goes (a directory's is
    /// inherited by its new entries); None: by its size (record version 9).
    pub tier: Option<TierPolicy>,
    /// Compression unit of this file's whole chunks (a directory's is
    /// inherited by its new entries): chunks stored in one commit, one
    /// after another, are compressed together in shared blocks of up to
    /// this many bytes; None: each chunk alone (record version 10).
    pub unit: Option<u32>,
    /// How the cleaner stores this file's whole chunks when it moves them
    /// (a directory's is inherited by its new entries); None: as writes
    /// do (record version 11).
    pub cold: Option<Cold>,
}

/// The form a file's data takes once the cleaner moves it
/// (`user.zlogfs.cold`): whole chunks compressed together in units of
/// `unit` bytes with `spec`, for data that has stayed put long enough to
/// be cleaned, where writes keep a cheaper unit and level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cold {
    /// Compression unit, a power of two from [`MIN_CHUNK`] to [`MAX_UNIT`].
    pub unit: u32,
    /// Codec and level.
    pub spec: CodecSpec,
}

/// Where a file's data goes on an image of two devices
/// (`user.zlogfs.tier`; "auto", by its size, is no policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierPolicy {
    /// The fast device, whatever its size.
    Fast,
    /// The bulk device, whatever its size.
    Bulk,
}

/// The smallest chunk size, of an image or of a file.
pub const MIN_CHUNK: u32 = 4096;

const F_NLINK: u64 = 1;
const F_RDEV: u64 = 2;
const F_ATIME: u64 = 4;
const F_CTIME: u64 = 8;
const F_BTIME: u64 = 16;
const F_ALLOC: u64 = 32;
const F_POLICY: u64 = 64;
const F_PARENT: u64 = 128;
const F_CHUNK: u64 = 256;
const F_TIER: u64 = 512;
const F_UNIT: u64 = 1024;
const F_COLD: u64 = 2048;

/// The largest compression unit of a file.
pub const MAX_UNIT: u32 = 1 << 20;

impl Inode {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        Kind::from_mode(self.mode).unwrap_or(Kind::File)
    }
    /// The (uid, gid, mode) triple.
    pub fn triple(&self) -> (u32, u32, u32) {
        (self.uid, self.gid, self.mode)
    }

    /// Encode with the id of its triple: fields equal to their usual value
    /// are left out and flagged absent; times are deltas (from `base_sec`
    /// for mtime, from mtime for the others).
    pub fn encode(&self, triple: u32, base_sec: i64) -> Vec<u8> {
        let def_nlink = if self.kind() == Kind::Dir { 2 } else { 1 };
        let mut f = 0;
        f |= if self.nlink != def_nlink { F_NLINK } else { 0 };
        f |= if self.rdev != 0 { F_RDEV } else { 0 };
        f |= if self.atime != self.mtime { F_ATIME } else { 0 };
        f |= if self.ctime != self.mtime { F_CTIME } else { 0 };
        f |= if self.btime != self.ctime { F_BTIME } else { 0 };
        f |= if self.alloc != self.size { F_ALLOC } else { 0 };
        f |= if self.policy.is_some() { F_POLICY } else { 0 };
        f |= if self.parent != 0 { F_PARENT } else { 0 };
        f |= if self.chunk.is_some() { F_CHUNK } else { 0 };
        f |= if self.tier.is_some() { F_TIER } else { 0 };
        f |= if self.unit.is_some() { F_UNIT } else { 0 };
        f |= if self.cold.is_some() { F_COLD } else { 0 };
        let mut v = Vec::with_capacity(24);
        v.put_var(f);
        v.put_var(u64::from(triple));
        v.put_var(self.size);
        self.mtime.put_delta(base_sec, &mut v);
        if f & F_NLINK != 0 {
            v.put_var(u64::from(self.nlink));
        }
        if f & F_RDEV != 0 {
            v.put_var(self.rdev);
        }
        if f & F_ATIME != 0 {
            self.atime.put_delta(self.mtime.sec, &mut v);
        }
        if f & F_CTIME != 0 {
            self.ctime.put_delta(self.mtime.sec, &mut v);
        }
        if f & F_BTIME != 0 {
            self.btime.put_delta(self.ctime.sec, &mut v);
        }
        if f & F_ALLOC != 0 {
            v.put_var(self.alloc);
        }
        if let Some(p) = self.policy {
            v.put_u8(p.id as u8);
            v.put_u8(p.level);
        }
        if f & F_PARENT != 0 {
            v.put_var(self.parent);
        }
        if let Some(c) = self.chunk {
            v.put_u8(c.trailing_zeros() as u8);
        }
        if let Some(t) = self.tier {
            v.put_u8(if t == TierPolicy::Fast { 1 } else { 2 });
        }
        if let Some(u) = self.unit {
            v.put_u8(u.trailing_zeros() as u8);
        }
        if let Some(c) = self.cold {
            v.put_u8(c.unit.trailing_zeros() as u8);
            v.put_u8(c.spec.id as u8);
            v.put_u8(c.spec.level);
        }
        v
    }

    /// Decode; `triple` resolves a triple id.
    pub fn decode(
        ino: Ino,
        b: &[u8],
        base_sec: i64,
        triple: impl Fn(u32) -> Option<(u32, u32, u32)>,
    ) -> Result<Inode> {
        let what = format!("inode {ino}");
        let mut r = Reader::new(b, &what);
        let f = r.var()?;
        if f >= 4096 {
            return Err(r.err(format!("unknown flags {f:#x}")));
        }
        let tid = r.var_max(u64::from(u32::MAX), "triple id")? as u32;
        let (uid, gid, mode) =
            triple(tid).ok_or_else(|| r.err(format!("unknown (uid, gid, mode) triple {tid}")))?;
        if Kind::from_mode(mode).is_none() {
            return Err(r.err(format!("mode {mode:o} has no valid file type")));
        }
        let size = r.var()?;
        let mtime = Time::get_delta(base_sec, &mut r)?;
        let dir = mode & S_IFMT == 0o040000;
        let nlink = if f & F_NLINK != 0 {
            r.var_max(u64::from(u32::MAX), "link count")? as u32
        } else if dir {
            2
        } else {
            1
        };
        let rdev = if f & F_RDEV != 0 { r.var()? } else { 0 };
        let atime = if f & F_ATIME != 0 { Time::get_delta(mtime.sec, &mut r)? } else { mtime };
        let ctime = if f & F_CTIME != 0 { Time::get_delta(mtime.sec, &mut r)? } else { mtime };
        let btime = if f & F_BTIME != 0 { Time::get_delta(ctime.sec, &mut r)? } else { ctime };
        let alloc = if f & F_ALLOC != 0 { r.var()? } else { size };
        let policy = if f & F_POLICY != 0 { Some(get_spec(&mut r, "policy")?) } else { None };
        let parent = if f & F_PARENT != 0 { r.var()? } else { 0 };
        let chunk = if f & F_CHUNK != 0 {
            let shift = r.u8()?;
            if !(MIN_CHUNK.trailing_zeros() as u8..=24).contains(&shift) {
                return Err(r.err(format!("chunk size 2^{shift} out of range")));
            }
            Some(1u32 << shift)
        } else {
            None
        };
        let tier = if f & F_TIER != 0 {
            match r.u8()? {
                1 => Some(TierPolicy::Fast),
                2 => Some(TierPolicy::Bulk),
                t => return Err(r.err(format!("unknown device policy {t}"))),
            }
        } else {
            None
        };
        let unit = if f & F_UNIT != 0 { Some(get_unit(&mut r)?) } else { None };
        let cold = if f & F_COLD != 0 {
            let unit = get_unit(&mut r)?;
            let spec = get_spec(&mut r, "cold form")?;
            Some(Cold { unit, spec })
        } else {
            None
        };
        r.finish()?;
        Ok(Inode {
            ino,
            mode,
            uid,
            gid,
            nlink,
            size,
            alloc,
            rdev,
            atime,
            mtime,
            ctime,
            btime,
            parent,
            policy,
            chunk,
            tier,
            unit,
            cold,
        })
    }
}

/// A compression unit: its power of two.
fn get_unit(r: &mut Reader) -> Result<u32> {
    let shift = r.u8()?;
    if !(MIN_CHUNK.trailing_zeros() as u8..=MAX_UNIT.trailing_zeros() as u8).contains(&shift) {
        return Err(r.err(format!("compression unit 2^{shift} out of range")));
    }
    Ok(1u32 << shift)
}

/// A codec and level, of the inode field `what`.
fn get_spec(r: &mut Reader, what: &str) -> Result<CodecSpec> {
    let id = r.u8()?;
    let level = r.u8()?;
    let id = CodecId::from_u8(id).ok_or_else(|| r.err(format!("unknown codec {id} in {what}")))?;
    Ok(CodecSpec::new(id, level))
}

/// Encode a (uid, gid, mode) triple.
pub fn encode_triple(t: (u32, u32, u32)) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_var(u64::from(t.0));
    v.put_var(u64::from(t.1));
    v.put_var(u64::from(t.2));
    v
}
/// Decode a triple.
pub fn decode_triple(b: &[u8]) -> Result<(u32, u32, u32)> {
    let mut r = Reader::new(b, "(uid, gid, mode) triple");
    let m = u64::from(u32::MAX);
    let t = (r.var_max(m, "uid")? as u32, r.var_max(m, "gid")? as u32, r.var_max(m, "mode")? as u32);
    r.finish()?;
    Ok(t)
}

/// Encode a directory entry's value.
pub fn encode_dirent(ino: Ino, kind: Kind) -> Vec<u8> {
    let mut v = Vec::with_capacity(6);
    v.put_var(ino);
    v.put_u8(kind.code());
    v
}
/// Decode a directory entry's value.
pub fn decode_dirent(b: &[u8]) -> Result<(Ino, Kind)> {
    let mut r = Reader::new(b, "directory entry");
    let ino = r.var()?;
    let c = r.u8()?;
    let kind = Kind::from_code(c).ok_or_else(|| r.err(format!("unknown file type {c}")))?;
    r.finish()?;
    Ok((ino, kind))
}

/// Where a chunk of file data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extent {
    /// In the index itself.
    Inline(Vec<u8>),
    /// A data block of its own, holding exactly this chunk.
    Own(BlockAddr, u32),
    /// A piece of a data block shared with other chunks.
    Shared {
        /// The block.
        addr: BlockAddr,
        /// Offset of the chunk in the block's decoded bytes.
        off: u32,
        /// Length of the chunk.
        len: u32,
        /// Share of the block's stored bytes charged to this chunk.
        phys: u32,
    },
    /// A stored chunk (`Own` or `Shared`) with blocks of it written again
    /// since, kept beside it instead of rewriting the whole chunk. Later
    /// patches win where they overlap earlier ones.
    Patched {
        /// The chunk as last written whole; its length is the chunk's.
        base: Box<Extent>,
        /// Oldest first; at most [`MAX_PATCHES`].
        patches: Vec<Patch>,
        /// Stored bytes of an `Own` base already released from its
        /// segment's live count, for the part of it the patches replace
        /// (0 for a shared base). Releasing the base later releases the
        /// rest.
        freed: u32,
    },
    /// Only as a patched chunk's base: a base its patches replace
    /// entirely, released and not stored (the chunk's length).
    Gone(u32),
    /// Space set aside by fallocate for the first write of the chunk's
    /// first `len` bytes, which read as zeros until written (an unwritten
    /// extent). It may lie past the file's size (`FALLOC_FL_KEEP_SIZE`).
    /// Its bytes count in [`Counters::reserved`] until it is replaced.
    Reserved(u32),
}

/// Bytes per patch block: patches replace whole blocks of this size (the
/// last block of a chunk may be short).
pub const PATCH_BLOCK: u32 = 4096;

/// Most patches one chunk carries.
pub const MAX_PATCHES: usize = 16;

/// Blocks of a chunk written again: `runs` of patch blocks (first block,
/// count), ascending and apart, whose bytes lie one after another in
/// `piece` (`Own` or `Shared`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    /// (first block, number of blocks).
    pub runs: Vec<(u32, u32)>,
    /// Where the bytes are.
    pub piece: Extent,
}

impl Patch {
    /// Byte ranges `[start, end)` of the chunk this patch replaces, in
    /// the order of its bytes, for a chunk of `len` bytes.
    pub fn spans(&self, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        spans(&self.runs, len)
    }
}

/// True when `patches` together cover every one of a chunk's `blocks`
/// patch blocks.
pub fn covers_all(patches: &[Patch], blocks: u32) -> bool {
    let mut bits = vec![false; blocks as usize];
    for p in patches {
        for &(s, n) in &p.runs {
            for b in s..s.saturating_add(n).min(blocks) {
                bits[b as usize] = true;
            }
        }
    }
    bits.iter().all(|&b| b)
}

/// Byte ranges of patch-block runs in a chunk of `len` bytes.
pub fn spans(runs: &[(u32, u32)], len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let b = u64::from(PATCH_BLOCK);
    runs.iter().map(move |&(s, n)| {
        let lo = (u64::from(s) * b).min(len);
        (lo, ((u64::from(s) + u64::from(n)) * b).min(len))
    })
}

impl Extent {
    /// Logical length.
    pub fn len(&self) -> u64 {
        match self {
            Extent::Inline(b) => b.len() as u64,
            Extent::Own(_, len) => u64::from(*len),
            Extent::Shared { len, .. } => u64::from(*len),
            Extent::Patched { base, .. } => base.len(),
            Extent::Gone(len) | Extent::Reserved(len) => u64::from(*len),
        }
    }
    /// Stored (compressed) bytes charged to this chunk.
    pub fn phys(&self) -> u64 {
        match self {
            Extent::Inline(b) => b.len() as u64,
            Extent::Own(a, _) => u64::from(a.len),
            Extent::Shared { phys, .. } => u64::from(*phys),
            Extent::Patched { base, patches, .. } => {
                base.phys() + patches.iter().map(|p| p.piece.phys()).sum::<u64>()
            }
            Extent::Gone(_) | Extent::Reserved(_) => 0,
        }
    }
    /// The simple extents (`Inline`, `Own`, `Shared`) this one is made
    /// of: itself, or a patched chunk's base and patch pieces.
    pub fn parts(&self) -> Vec<&Extent> {
        match self {
            Extent::Patched { base, patches, .. } => {
                std::iter::once(&**base).chain(patches.iter().map(|p| &p.piece)).collect()
            }
            e => vec![e],
        }
    }
    /// The block a simple extent lies in.
    pub fn addr(&self) -> Option<BlockAddr> {
        match self {
            Extent::Own(a, _) | Extent::Shared { addr: a, .. } => Some(*a),
            _ => None,
        }
    }
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.put(&mut v);
        v
    }
    fn put(&self, v: &mut Vec<u8>) {
        match self {
            Extent::Inline(b) => {
                v.put_u8(0);
                v.extend_from_slice(b);
            }
            Extent::Own(a, len) => {
                v.put_u8(1);
                put_addr(v, *a);
                v.put_var(u64::from(*len));
            }
            Extent::Shared { addr, off, len, phys } => {
                v.put_u8(2);
                put_addr(v, *addr);
                v.put_var(u64::from(*off));
                v.put_var(u64::from(*len));
                v.put_var(u64::from(*phys));
            }
            Extent::Patched { base, patches, freed } => {
                v.put_u8(4);
                base.put(v);
                v.put_var(u64::from(*freed));
                v.put_var(patches.len() as u64);
                for p in patches {
                    v.put_var(p.runs.len() as u64);
                    for &(s, n) in &p.runs {
                        v.put_var(u64::from(s));
                        v.put_var(u64::from(n));
                    }
                    p.piece.put(v);
                }
            }
            Extent::Gone(len) => {
                v.put_u8(5);
                v.put_var(u64::from(*len));
            }
            Extent::Reserved(len) => {
                v.put_u8(6);
                v.put_var(u64::from(*len));
            }
        }
    }
    /// Decode.
    pub fn decode(b: &[u8], what: &str) -> Result<Extent> {
        let mut r = Reader::new(b, what);
        let e = match b.first() {
            Some(0) => return Ok(Extent::Inline(b[1..].to_vec())),
            Some(t @ (3 | 4)) => {
                r.u8()?;
                let base = if r.peek() == Some(5) && *t == 4 {
                    r.u8()?;
                    Extent::Gone(r.var_max(u64::from(u32::MAX), "length")? as u32)
                } else {
                    Self::get_block(&mut r)?
                };
                let freed = if *t == 4 { r.var_max(u64::from(u32::MAX), "freed bytes")? as u32 } else { 0 };
                let can = match base {
                    Extent::Own(a, _) => a.len,
                    _ => 0,
                };
                if freed > can {
                    return Err(r.err(format!(
                        "{freed} bytes of its base released, which has {can} stored bytes of its own"
                    )));
                }
                let len = base.len();
                let blocks = len.div_ceil(u64::from(PATCH_BLOCK));
                let n = r.var_max(MAX_PATCHES as u64, "patch count")? as usize;
                if n == 0 {
                    return Err(r.err("a patched chunk without patches"));
                }
                let mut patches = Vec::with_capacity(n);
                for _ in 0..n {
                    let m = r.var_max(blocks, "patch run count")? as usize;
                    let mut runs = Vec::with_capacity(m);
                    let mut next = 0u64;
                    for _ in 0..m {
                        let s = r.var_max(blocks, "patch block")?;
                        let c = r.var_max(blocks, "patch blocks")?;
                        if s < next || c == 0 || s + c > blocks {
                            return Err(r.err(format!(
                                "patch run {s}+{c} overlaps the one before or lies outside the chunk's {blocks} blocks"
                            )));
                        }
                        next = s + c + 1;
                        runs.push((s as u32, c as u32));
                    }
                    let piece = Self::get_block(&mut r)?;
                    let need: u64 = spans(&runs, len).map(|(a, b)| b - a).sum();
                    if m == 0 || piece.len() != need {
                        return Err(r.err(format!(
                            "a patch of {} bytes replaces {need} bytes of the chunk",
                            piece.len()
                        )));
                    }
                    patches.push(Patch { runs, piece });
                }
                if matches!(base, Extent::Gone(_)) && !covers_all(&patches, blocks as u32) {
                    return Err(r.err("its base is gone, but its patches do not cover the whole chunk"));
                }
                Extent::Patched { base: Box::new(base), patches, freed }
            }
            Some(6) => {
                r.u8()?;
                let len = r.var_max(1 << 20, "reserved length")? as u32;
                if len == 0 {
                    return Err(r.err("a reservation of no bytes"));
                }
                Extent::Reserved(len)
            }
            _ => Self::get_block(&mut r)?,
        };
        r.finish()?;
        Ok(e)
    }
    /// An `Own` or `Shared` extent.
    fn get_block(r: &mut Reader) -> Result<Extent> {
        Ok(match r.u8()? {
            1 => {
                let a = get_addr(r)?;
                Extent::Own(a, r.var_max(u64::from(u32::MAX), "length")? as u32)
            }
            2 => {
                let addr = get_addr(r)?;
                let m = u64::from(u32::MAX);
                let off = r.var_max(m, "offset")? as u32;
                let len = r.var_max(m, "length")? as u32;
                let phys = r.var_max(m, "stored bytes")? as u32;
                Extent::Shared { addr, off, len, phys }
            }
            t => return Err(r.err(format!("unknown extent type {t}"))),
        })
    }
}

fn put_addr(v: &mut Vec<u8>, a: BlockAddr) {
    v.put_var(u64::from(a.seg));
    v.put_var(u64::from(a.offset));
    v.put_var(u64::from(a.len));
}
fn get_addr(r: &mut Reader) -> Result<BlockAddr> {
    let m = u64::from(u32::MAX);
    Ok(BlockAddr {
        seg: r.var_max(m, "segment")? as u32,
        offset: r.var_max(m, "offset")? as u32,
        len: r.var_max(m, "block length")? as u32,
    })
}

/// Encode the list of chunks referencing a shared block.
pub fn encode_refs(refs: &[(Ino, u64)], released: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_var(refs.len() as u64);
    for &(i, c) in refs {
        v.put_var(i);
        v.put_var(c);
    }
    if released > 0 {
        v.put_var(u64::from(released));
    }
    v
}
/// Decode a shared block's references, and the bytes of the block
/// already released from its segment's live count for chunks that no
/// longer use it (absent before records version 4: none).
pub fn decode_refs(b: &[u8]) -> Result<(Vec<(Ino, u64)>, u32)> {
    let mut r = Reader::new(b, "shared block references");
    let n = r.var_max(1 << 20, "reference count")? as usize;
    let mut v = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        v.push((r.var()?, r.var()?));
    }
    let released = if r.is_empty() { 0 } else { r.var_max(u64::from(u32::MAX), "released bytes")? as u32 };
    r.finish()?;
    Ok((v, released))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_round_trip_and_size() {
        let t = Time { sec: 1_700_000_000, nsec: 0 };
        let mut i = Inode {
            ino: 5,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 1234,
            alloc: 1234,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            parent: 0,
            policy: None,
            chunk: None,
            tier: None,
            unit: None,
            cold: None,
        };
        let b = i.encode(3, 1_700_000_000);
        // flags, triple, size (2), mtime (2)
        assert_eq!(b.len(), 6, "{b:?}");
        let tr = |id| (id == 3).then_some((0, 0, 0o100644));
        assert_eq!(Inode::decode(5, &b, 1_700_000_000, tr).unwrap(), i);
        i.nlink = 7;
        i.rdev = 0x0801;
        i.atime.nsec = 5;
        i.ctime = Time { sec: 1_800_000_000, nsec: 999_999_999 };
        i.btime = Time { sec: -5, nsec: 1 };
        i.alloc = 65536;
        i.policy = Some(CodecSpec::new(CodecId::Lz4, 0));
        i.parent = 9;
        i.chunk = Some(16384);
        i.tier = Some(TierPolicy::Bulk);
        i.unit = Some(128 << 10);
        let b = i.encode(3, 1_700_000_000);
        assert_eq!(Inode::decode(5, &b, 1_700_000_000, tr).unwrap(), i);
        assert!(Inode::decode(5, &b, 0, |_| None).is_err());
        // A chunk size out of range is refused, not used.
        let mut bad = b.clone();
        let n = bad.len() - 3; // the chunk size, before the device policy and unit
        bad[n] = 40;
        assert!(Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string().contains("chunk size"));
        let mut bad = b.clone();
        let n = bad.len() - 2;
        bad[n] = 7;
        assert!(Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string().contains("device policy"));
        for shift in [11, 21] {
            let mut bad = b.clone();
            *bad.last_mut().unwrap() = shift;
            let e = Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string();
            assert!(e.contains("compression unit"), "{e}");
        }
        // The cold form: unit, codec, level after the rest.
        i.cold = Some(Cold { unit: 256 << 10, spec: CodecSpec::new(CodecId::Zstd, 9) });
        let b = i.encode(3, 1_700_000_000);
        assert_eq!(Inode::decode(5, &b, 1_700_000_000, tr).unwrap(), i);
        let mut bad = b.clone();
        let n = bad.len() - 2;
        bad[n] = 200;
        let e = Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string();
        assert!(e.contains("unknown codec 200 in cold form"), "{e}");
        let mut bad = b.clone();
        let n = bad.len() - 3;
        bad[n] = 22;
        let e = Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string();
        assert!(e.contains("compression unit 2^22"), "{e}");
        for n in 0..b.len() {
            let _ = Inode::decode(5, &b[..n], 1_700_000_000, tr);
        }
    }

    #[test]
    fn time_conversions() {
        for t in [Time { sec: -1, nsec: 5 }, Time { sec: 0, nsec: 0 }, Time { sec: 12345, nsec: 999 }] {
            assert_eq!(Time::from_system(t.to_system()), t);
        }
    }

    #[test]
    fn held_and_snapshot_records_round_trip() {
        let a = BlockAddr { seg: 7, offset: 4096, len: 300 };
        let k = held_key(a, 12345, 2);
        assert_eq!(parse_held_key(&k), Some((a, 12345, 2)));
        assert!(parse_held_key(&k[..24]).is_none() && parse_shared_key(&k).is_none());
        let (lo, hi) = all_held_range();
        assert!(lo <= k && k < hi);
        assert!(describe_key(&k).contains("held free"), "{}", describe_key(&k));
        let s = Snapshot { seq: 99, time: Time { sec: -3, nsec: 5 } };
        assert_eq!(Snapshot::decode(&s.encode(), "snapshot").unwrap(), s);
        assert!(Snapshot::decode(&[], "snapshot").is_err());
        let k = snapshot_key(b"before-upgrade");
        let (lo, hi) = snapshots_range();
        assert!(lo <= k && k < hi && describe_key(&k).contains("before-upgrade"));
    }

    #[test]
    fn extent_and_key_round_trips() {
        let a = BlockAddr { seg: 3, offset: 4096, len: 777 };
        for e in [
            Extent::Inline(b"hello".to_vec()),
            Extent::Inline(vec![]),
            Extent::Own(a, 65536),
            Extent::Shared { addr: a, off: 10, len: 20, phys: 5 },
        ] {
            assert_eq!(Extent::decode(&e.encode(), "x").unwrap(), e);
        }
        assert_eq!(parse_shared_key(&shared_key(a)), Some(a));
        assert_eq!(parse_extent_key(&extent_key(7, 9)), Some((7, 9)));
        assert_eq!(parse_dirent_key(&dirent_key(7, b"n")), Some((7, &b"n"[..])));
        assert!(dirent_key(1, &[0xff; 255]) < dirents_range(1).1);
        assert!(dirents_range(1).1 < dirent_key(2, b""));
        assert_eq!(decode_refs(&encode_refs(&[(1, 2), (3, 4)], 0)).unwrap(), (vec![(1, 2), (3, 4)], 0));
        assert_eq!(decode_refs(&encode_refs(&[(1, 2)], 700)).unwrap(), (vec![(1, 2)], 700));
        assert_eq!(decode_dirent(&encode_dirent(99, Kind::Socket)).unwrap(), (99, Kind::Socket));
    }

    #[test]
    fn patched_extents_round_trip_and_bad_ones_are_refused() {
        let a = BlockAddr { seg: 3, offset: 4096, len: 777 };
        let b = BlockAddr { seg: 4, offset: 0, len: 300 };
        // A chunk of 10000 bytes: blocks 0, 1 and a short block 2 (1808 bytes).
        let base = Extent::Own(a, 10_000);
        let p1 = Patch {
            runs: vec![(0, 1), (2, 1)],
            piece: Extent::Shared { addr: b, off: 7, len: 4096 + 1808, phys: 90 },
        };
        let p2 = Patch { runs: vec![(1, 1)], piece: Extent::Own(b, 4096) };
        let e = Extent::Patched {
            base: Box::new(base.clone()),
            patches: vec![p1.clone(), p2.clone()],
            freed: 300,
        };
        assert_eq!(Extent::decode(&e.encode(), "x").unwrap(), e);
        // Chunk type 3 (record version 2) is type 4 without the freed bytes.
        let old = Extent::Patched { base: Box::new(base.clone()), patches: vec![p1.clone()], freed: 0 };
        let mut v = old.encode();
        assert_eq!(v[0], 4);
        v[0] = 3;
        v.remove(base.encode().len() + 1);
        assert_eq!(Extent::decode(&v, "x").unwrap(), old);
        // No more released than the base's own stored bytes.
        for (base, freed) in [(base.clone(), 778), (p1.piece.clone(), 1)] {
            let v = Extent::Patched { base: Box::new(base), patches: vec![p2.clone()], freed }.encode();
            let err = Extent::decode(&v, "x").unwrap_err().to_string();
            assert!(err.contains(&format!("{freed} bytes of its base released")), "{err}");
        }
        assert_eq!(e.len(), 10_000);
        assert_eq!(e.phys(), 777 + 90 + 300);
        assert_eq!(e.parts(), vec![&base, &p1.piece, &p2.piece]);
        assert_eq!(p1.spans(10_000).collect::<Vec<_>>(), vec![(0, 4096), (8192, 10_000)]);
        let bad = |patches: Vec<Patch>, base: Extent| {
            let v = Extent::Patched { base: Box::new(base), patches, freed: 0 }.encode();
            Extent::decode(&v, "x").expect_err("must be refused").to_string()
        };
        let piece = |len| Extent::Shared { addr: b, off: 0, len, phys: 1 };
        assert!(bad(vec![], base.clone()).contains("without patches"));
        // Runs that overlap, touch, lie outside or are empty.
        for runs in [vec![(0, 2), (1, 1)], vec![(0, 1), (1, 1)], vec![(2, 2)], vec![(0, 0)]] {
            let p = Patch { runs, piece: piece(4096) };
            assert!(bad(vec![p], base.clone()).contains("patch run"));
        }
        // A piece shorter than the blocks it replaces.
        let p = Patch { runs: vec![(0, 1)], piece: piece(4000) };
        assert!(bad(vec![p], base.clone()).contains("replaces 4096"));
        // A base that is not a block.
        let p = Patch { runs: vec![(0, 1)], piece: piece(4096) };
        assert!(bad(vec![p.clone()], Extent::Inline(vec![1; 10])).contains("unknown extent type 0"));
        let nested = Extent::Patched { base: Box::new(base.clone()), patches: vec![p.clone()], freed: 0 };
        assert!(bad(vec![p.clone()], nested).contains("unknown extent type 4"));
        // Cut short anywhere: an error, never a panic.
        let full = e.encode();
        for n in 0..full.len() {
            assert!(Extent::decode(&full[..n], "x").is_err(), "prefix of {n} bytes accepted");
        }
        // A base that is gone: only where the patches cover every block,
        // and never as a chunk of its own or in a type 3 record.
        let gone =
            Extent::Patched { base: Box::new(Extent::Gone(10_000)), patches: vec![p1.clone(), p2], freed: 0 };
        let v = gone.encode();
        assert_eq!(Extent::decode(&v, "x").unwrap(), gone);
        assert_eq!((gone.len(), gone.phys()), (10_000, 90 + 300));
        let mut v3 = v.clone();
        v3[0] = 3;
        assert!(Extent::decode(&v3, "x").unwrap_err().to_string().contains("unknown extent type 5"));
        assert!(bad(vec![p1], Extent::Gone(10_000)).contains("do not cover the whole chunk"));
        assert!(Extent::decode(&Extent::Gone(10).encode(), "x")
            .unwrap_err()
            .to_string()
            .contains("unknown extent type 5"));
        for n in 0..v.len() {
            assert!(Extent::decode(&v[..n], "x").is_err(), "prefix of {n} bytes accepted");
        }
    }

    #[test]
    fn config_versions() {
        let c = Config {
            chunk_size: 65536,
            pack_bytes: 131072,
            inline_max: 512,
            codec: CodecSpec::new(CodecId::Zstd, 3),
            base_sec: 1_700_000_000,
            next_ino: 5,
            next_triple: 2,
            version: 1,
            small_max: DEFAULT_SMALL_MAX,
        };
        for version in 1..=FS_VERSION {
            let c = Config { version, ..c.clone() };
            assert_eq!(Config::decode(&c.encode()).unwrap(), c);
        }
        // The small-file size only when it is not the default: records
        // of images made before it stay the same bytes.
        let other = Config { small_max: 4096, ..c.clone() };
        assert_eq!(other.encode().len(), c.encode().len() + 2);
        assert_eq!(Config::decode(&other.encode()).unwrap(), other);
        let mut v = c.encode();
        v[0] = FS_VERSION + 1;
        let e = Config::decode(&v).unwrap_err().to_string();
        assert!(
            e.contains(&format!("version {}; this build reads versions 1 to {FS_VERSION}", FS_VERSION + 1)),
            "{e}"
        );
    }

    #[test]
    fn counters_round_trip() {
        let c = Counters { user_bytes: 1 << 40, device_bytes: 300, reserved: 0 };
        let b = c.encode();
        // Golden bytes: two LEB128 varints (FORMAT.md §9, tag 0x03).
        assert_eq!(b, [0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0xac, 0x02]);
        assert_eq!(Counters::decode(&b).unwrap(), c);
        assert!(Counters::decode(&b[..5]).is_err());
        assert!(Counters::decode(&[b.as_slice(), &[0]].concat()).is_err());
        // Reserved bytes, when there are any, are a third varint.
        let r = Counters { reserved: 65536, ..c };
        assert_eq!(r.encode(), [b.as_slice(), &[0x80, 0x80, 0x04]].concat());
        assert_eq!(Counters::decode(&r.encode()).unwrap(), r);
        let e = Extent::Reserved(4097);
        assert_eq!(e.encode(), [6, 0x81, 0x20]);
        assert_eq!(Extent::decode(&e.encode(), "t").unwrap(), e);
        assert!(Extent::decode(&[6, 0], "t").is_err(), "a reservation of nothing");
        assert!(Extent::decode(&[6, 0x81, 0x80, 0x80, 0x01], "t").is_err(), "more than a chunk's 1 MiB");
        assert!(triple_key(u32::MAX) < counters_key() && counters_key() < orphan_key(0));
    }
}
