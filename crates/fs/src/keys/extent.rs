//! Where a chunk of file data lives: inline, a block of its own, a share
//! of a packed block, patched, gone or reserved; and reference lists of
//! shared blocks.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::error::Result;
use zlogfs_engine::BlockAddr;

use super::*;

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
