//! The key space: one tag byte, then big-endian integers, per record.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::error::Result;
use zlogfs_engine::BlockAddr;

use super::*;

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

/// The smallest key after `k`: where a walk that has seen `k` goes on.
pub fn key_after(k: &[u8]) -> Vec<u8> {
    [k, &[0]].concat()
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
/// `seq` (record version 8); its value is `event::Record::encode`.
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
/// (`crate::retention::Policy`'s form). Absent: none.
pub fn policy_key() -> Vec<u8> {
    vec![T_POLICY]
}
/// Where the change records start (record version 8): every group after
/// the point its value names has its change record. Absent: none is kept.
pub fn changes_from_key() -> Vec<u8> {
    vec![T_CHANGES_FROM]
}

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
