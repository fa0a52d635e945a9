//! File data: buffered chunks, reads, truncation, holes, and storing a
//! group's chunks at commit (packing small ones together).
//!
//! Invariants (checked by fsck):
//! - a file has no chunk at or past `ceil(size / chunk_size)`, and no chunk
//!   holds bytes past `size`;
//! - `alloc` is the sum of the lengths of the file's chunks, buffered
//!   chunks counted at their buffered length.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use zlogfs_engine::engine::{BlockWrite, EncodedBlock};

use super::*;

mod buf {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The stamp of the next change of any buffer's bytes.
    static STAMP: AtomicU64 = AtomicU64::new(1);

    /// A buffered chunk.
    #[derive(Debug)]
    pub(crate) struct Buf {
        /// The chunk's whole logical content. Private, so that every
        /// change of it goes through [`Buf::data_mut`], which renews
        /// `stamp`: a block compressed from the bytes of one stamp is
        /// those bytes while the buffer has that stamp.
        data: Vec<u8>,
        stamp: u64,
        /// Patch blocks written since the buffer was loaded from the stored
        /// chunk (a bit per [`super::PATCH_BLOCK`]): outside them, `data`
        /// equals the stored chunk. None: the chunk is stored whole at commit
        /// (always, unless patches are on).
        pub touched: Option<Vec<u64>>,
        /// `data` is the chunk's only in the `touched` blocks (zeros elsewhere,
        /// and its length is the chunk's): the rest was never read, because a
        /// chunk of 16 patches is read from 16 packed blocks. Writers of whole
        /// blocks and the cleaner's moves make such buffers; they are stored as
        /// patches, and completed from the stored chunk (`complete`) by
        /// anything that needs the whole chunk. The cleaner drops its own at
        /// the end of a round if they were not stored.
        pub partial: bool,
    }

    impl Buf {
        pub fn new(data: Vec<u8>, touched: Option<Vec<u64>>, partial: bool) -> Buf {
            Buf { data, stamp: STAMP.fetch_add(1, Ordering::Relaxed), touched, partial }
        }

        pub fn data(&self) -> &[u8] {
            &self.data
        }

        /// The bytes, to change: the buffer gets a new stamp.
        pub fn data_mut(&mut self) -> &mut Vec<u8> {
            self.stamp = STAMP.fetch_add(1, Ordering::Relaxed);
            &mut self.data
        }

        /// Names the buffer's bytes as they are now.
        pub fn stamp(&self) -> u64 {
            self.stamp
        }

        /// Bytes, touched blocks, partial, stamp.
        pub fn into_parts(self) -> (Vec<u8>, Option<Vec<u64>>, bool, u64) {
            (self.data, self.touched, self.partial, self.stamp)
        }
    }
}

pub(super) use buf::Buf;

/// Bytes of chunks queued for compression ahead at most (each job holds a
/// copy). fio's 1 MiB sequential writes through the mount, median of 10
/// in turns: 451 MiB/s without compression ahead, 529 with 4 MiB queued
/// at most, 626 with 32 MiB (docs/ARCHITECTURE.md, Parallel compression).
const AHEAD_BYTES: usize = 32 << 20;

/// Full chunks compressed ahead of their commit, on the pool's threads,
/// while the writes that follow are taken: a sequential write's
/// compression overlaps its receiving instead of stopping it at every
/// commit (docs/ARCHITECTURE.md, Parallel compression). The commit uses a
/// block only if its buffer still has the stamp it was compressed at (so
/// the same bytes), the same length and the file the same codec.
#[derive(Default)]
pub(super) struct Ahead {
    map: HashMap<(Ino, u64), AheadBlock>,
    /// Jobs queued or running on the pool.
    jobs: Arc<AtomicUsize>,
}

struct AheadBlock {
    stamp: u64,
    spec: CodecSpec,
    len: usize,
    slot: Arc<Mutex<Slot>>,
}

enum Slot {
    Queued,
    Running,
    Done(EncodedBlock),
    /// Not wanted any more: a queued job skips its work, a running one
    /// drops its result.
    Dropped,
}

impl AheadBlock {
    /// The block, if its job is done; the job is told to stop otherwise.
    fn take(self) -> Option<EncodedBlock> {
        match std::mem::replace(&mut *lock(&self.slot), Slot::Dropped) {
            Slot::Done(e) => Some(e),
            _ => None,
        }
    }
}

impl Ahead {
    /// Forget every block (their buffers were stored or dropped).
    pub(super) fn clear(&mut self) {
        for (_, a) in self.map.drain() {
            a.take();
        }
    }
}

/// How a chunk is loaded into a new buffer.
#[derive(Clone, Copy)]
enum Load {
    /// Whole, to be stored whole.
    Whole,
    /// Whole, tracking the blocks written (they may become patches).
    Track,
    /// Only the blocks written, tracked (`Buf::partial`).
    Partial,
}

/// A chunk (or the patch of one) about to be stored.
struct Piece {
    ino: Ino,
    idx: u64,
    /// The chunk's bytes, or the patch's.
    data: Vec<u8>,
    spec: CodecSpec,
    /// Length of the buffer, as counted in the inode's `alloc`.
    counted: usize,
    /// Logical length of the chunk once stored (for a patch, the chunk's,
    /// not the patch's).
    len: usize,
    /// For a patch: the chunk's runs of patch blocks it replaces.
    patch: Option<Vec<(u32, u32)>>,
    /// For a whole chunk: its buffer's stamp (see [`Ahead`]).
    stamp: Option<u64>,
}

/// The most of a chunk's length its patches may replace before the chunk
/// is written whole again. The replaced bytes of an own base are released
/// from its segment's live count (`add_patch`), so the cleaner sees them
/// as dead and wins them back by merging the patches, however full the
/// device is: no share that shrinks as the device fills is needed (with
/// one, 4 KiB random overwrites on a 70%-full image wrote 6.8 device bytes
/// per byte at none from 85% live and 31 at none from 70%, against 3.2
/// with a fixed half; docs/BENCHMARKS.md).
///
/// Three quarters, not a half, since the cleaner stores what shows of a
/// patched base as patches instead of moving the chunk whole (so the
/// base's reduced count no longer bounds what a move costs). A chunk
/// written whole again is 16 blocks of fresh copies, most of which later
/// overwrites hide again: through FUSE, 4 KiB random overwrites near steady
/// state wrote 1.39 device bytes per byte with three quarters against 2.43
/// with a half (docs/BENCHMARKS.md).
pub(super) const MAX_PATCH_SHARE: f64 = 0.75;

/// Runs of set bits, as (first, count), below `n`.
fn runs_of(bits: &[u64], n: u32) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for b in 0..n {
        if bits.get(b as usize / 64).is_some_and(|w| w >> (b % 64) & 1 == 1) {
            match runs.last_mut() {
                Some((s, c)) if *s + *c == b => *c += 1,
                _ => runs.push((b, 1)),
            }
        }
    }
    runs
}

/// Set the bits of `blocks` (bits past the bitmap are ignored).
fn mark(bits: &mut [u64], blocks: std::ops::Range<usize>) {
    for b in blocks {
        if let Some(w) = bits.get_mut(b / 64) {
            *w |= 1 << (b % 64);
        }
    }
}

/// The patches of `patches` (oldest first) that still show some block
/// once `over` (runs written after all of them) is laid on top.
fn visible<'a>(patches: &'a [Patch], over: &[(u32, u32)]) -> Vec<&'a Patch> {
    let mut hidden: Vec<(u32, u32)> = over.to_vec();
    let mut out = Vec::new();
    for p in patches.iter().rev() {
        if !covers(&hidden, &p.runs) {
            out.push(p);
        }
        hidden.extend_from_slice(&p.runs);
    }
    out.reverse();
    out
}

/// The blocks of patch `i` of `patches` (oldest first) that no later
/// patch hides, as runs.
pub(super) fn shows(patches: &[Patch], i: usize) -> Vec<(u32, u32)> {
    let over: Vec<(u32, u32)> = patches[i + 1..].iter().flat_map(|p| p.runs.iter().copied()).collect();
    shown(&patches[i].runs, &over)
}

/// The blocks of `runs` that no run of `over` hides, as runs.
pub(super) fn shown(runs: &[(u32, u32)], over: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &(s, n) in runs {
        for b in s..s + n {
            if over.iter().any(|&(os, on)| os <= b && b < os + on) {
                continue;
            }
            match out.last_mut() {
                Some((ls, lc)) if *ls + *lc == b => *lc += 1,
                _ => out.push((b, 1)),
            }
        }
    }
    out
}

/// True when every block of `inner` is in `outer`.
fn covers(outer: &[(u32, u32)], inner: &[(u32, u32)]) -> bool {
    inner.iter().all(|&(s, c)| (s..s + c).all(|b| outer.iter().any(|&(os, oc)| os <= b && b < os + oc)))
}

/// The share of a base's `stored` bytes that `patches` replace in a chunk
/// of `len` bytes: stored bytes times the fraction of the chunk the
/// patches cover together, rounded down. Compression is not uniform over
/// a chunk, so this is an estimate; it is only ever used for space
/// accounting, and the base's release adds up to its stored bytes.
fn replaced_share(patches: &[Patch], stored: u32, len: u32) -> u32 {
    let mut spans: Vec<(u64, u64)> = patches.iter().flat_map(|p| p.spans(u64::from(len))).collect();
    spans.sort_unstable();
    let (mut covered, mut end) = (0u64, 0u64);
    for (a, b) in spans {
        let a = a.max(end);
        if b > a {
            covered += b - a;
            end = b;
        }
    }
    (u64::from(stored) * covered / u64::from(len).max(1)) as u32
}

/// Damage met reading bytes `[lo, hi)` of inode `ino`, said with them.
fn in_file(e: Error, ino: Ino, lo: u64, hi: u64) -> Error {
    let whose = |what: String| format!("{what}, which holds bytes {lo}..{hi} of inode {ino}");
    match e {
        Error::Engine(EngineError::ChecksumMismatch { what, expected, got }) => {
            Error::Engine(EngineError::ChecksumMismatch { what: whose(what), expected, got })
        }
        Error::Engine(EngineError::Corrupt { what, detail }) => {
            Error::Engine(EngineError::Corrupt { what: whose(what), detail })
        }
        e => e,
    }
}

impl State {
    pub(super) fn cs(&self) -> u64 {
        u64::from(self.cfg.chunk_size)
    }

    pub(super) fn stored_extent(&self, ino: Ino, idx: u64) -> Result<Option<Extent>> {
        match self.get(&extent_key(ino, idx))? {
            Some(v) => Ok(Some(Extent::decode(&v, &format!("chunk {idx} of inode {ino}"))?)),
            None => Ok(None),
        }
    }

    pub(super) fn block(&mut self, a: BlockAddr) -> Result<Arc<Vec<u8>>> {
        if let Some(b) = self.cache.get(&a) {
            return Ok(b);
        }
        let b = Arc::new(self.eng.read_block(a)?);
        self.cache.insert(a, b.clone());
        Ok(b)
    }

    /// Append bytes `[from, to)` of a stored chunk to `out`.
    fn copy_extent(
        &mut self,
        ino: Ino,
        idx: u64,
        e: &Extent,
        from: usize,
        to: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let bad = |d: String| Error::corrupt(format!("chunk {idx} of inode {ino}"), d);
        let (buf, base): (Arc<Vec<u8>>, usize) = match e {
            Extent::Patched { base, patches, .. } => {
                // The base, then each patch over it where it meets [from, to).
                let start = out.len();
                self.copy_extent(ino, idx, base, from, to, out)?;
                let len = base.len();
                for p in patches {
                    let mut at = 0u64;
                    for (lo, hi) in p.spans(len) {
                        let (a, b) = (lo.max(from as u64), hi.min(to as u64));
                        if a < b {
                            let mut bytes = Vec::with_capacity((b - a) as usize);
                            let skip = (at + a - lo) as usize;
                            self.copy_extent(ino, idx, &p.piece, skip, skip + (b - a) as usize, &mut bytes)?;
                            let o = start + (a - from as u64) as usize;
                            out[o..o + bytes.len()].copy_from_slice(&bytes);
                        }
                        at += hi - lo;
                    }
                }
                return Ok(());
            }
            Extent::Gone(_) | Extent::Reserved(_) => {
                out.resize(out.len() + (to - from), 0);
                return Ok(());
            }
            Extent::Inline(b) => {
                let have = b.len().min(to);
                if from < have {
                    out.extend_from_slice(&b[from..have]);
                }
                out.resize(out.len() + (to - from.max(have)), 0);
                return Ok(());
            }
            Extent::Own(a, len) => {
                let b = self.block(*a)?;
                if b.len() != *len as usize {
                    return Err(bad(format!("block {a} holds {} bytes, the extent says {len}", b.len())));
                }
                (b, 0)
            }
            Extent::Shared { addr, off, len, .. } => {
                let b = self.block(*addr)?;
                if (*off as usize + *len as usize) > b.len() {
                    return Err(bad(format!(
                        "piece {off}+{len} lies outside block {addr} of {} bytes",
                        b.len()
                    )));
                }
                (b, *off as usize)
            }
        };
        let len = e.len() as usize;
        let have = len.min(to);
        if from < have {
            out.extend_from_slice(&buf[base + from..base + have]);
        }
        out.resize(out.len() + (to - from.max(have)), 0);
        Ok(())
    }

    fn extent_bytes(&mut self, ino: Ino, idx: u64, e: &Extent) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(e.len() as usize);
        self.copy_extent(ino, idx, e, 0, e.len() as usize, &mut v)?;
        Ok(v)
    }

    /// The buffer of a chunk, loading its stored content first; it will be
    /// stored whole.
    pub(super) fn dirty_mut(&mut self, ino: Ino, idx: u64) -> Result<&mut Vec<u8>> {
        let b = self.dirty_buf(ino, idx, false)?;
        b.touched = None;
        Ok(b.data_mut())
    }

    /// The buffer of a chunk, loading its stored content first (then, with
    /// `track`, tracking the blocks written, so that the commit may store
    /// only those).
    fn dirty_buf(&mut self, ino: Ino, idx: u64, track: bool) -> Result<&mut Buf> {
        self.complete(ino, idx)?;
        if self.buffered(ino, idx).is_none() {
            let e = self.stored_extent(ino, idx)?;
            self.insert_buf(ino, idx, e, if track { Load::Track } else { Load::Whole })?;
        }
        Ok(self.buffered_mut(ino, idx).expect("just inserted"))
    }

    fn buffered(&self, ino: Ino, idx: u64) -> Option<&Buf> {
        self.dirty.get(&ino).and_then(|m| m.get(&idx))
    }

    fn buffered_mut(&mut self, ino: Ino, idx: u64) -> Option<&mut Buf> {
        self.dirty.get_mut(&ino).and_then(|m| m.get_mut(&idx))
    }

    /// Buffer chunk `idx`, stored as `e`, loaded as `load` says (a chunk
    /// not stored in a block is always loaded whole and not tracked).
    fn insert_buf(&mut self, ino: Ino, idx: u64, e: Option<Extent>, load: Load) -> Result<()> {
        let words = (self.cfg.chunk_size / PATCH_BLOCK).div_ceil(64) as usize;
        let buf = match e {
            Some(e @ (Extent::Own(..) | Extent::Shared { .. } | Extent::Patched { .. })) => match load {
                Load::Partial => Buf::new(vec![0; e.len() as usize], Some(vec![0; words]), true),
                Load::Track => Buf::new(self.extent_bytes(ino, idx, &e)?, Some(vec![0; words]), false),
                Load::Whole => Buf::new(self.extent_bytes(ino, idx, &e)?, None, false),
            },
            Some(Extent::Reserved(len)) => {
                // The chunk is written now: its reservation becomes this
                // buffer (counted in `dirty_bytes` from here on), and the
                // record goes, as a hole's would have none.
                self.release(ino, idx, &Extent::Reserved(len))?;
                self.del(extent_key(ino, idx));
                Buf::new(vec![0; len as usize], None, false)
            }
            Some(e) => Buf::new(self.extent_bytes(ino, idx, &e)?, None, false),
            None => Buf::new(Vec::new(), None, false),
        };
        self.dirty_bytes += self.cfg.chunk_size as usize;
        self.dirty_chunks += 1;
        self.dirty.entry(ino).or_default().insert(idx, buf);
        Ok(())
    }

    /// Copy the stored chunk's bytes of `ranges` into its partial buffer.
    fn fill_partial(&mut self, ino: Ino, idx: u64, ranges: &[(usize, usize)]) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        let e = self.stored_extent(ino, idx)?.ok_or_else(|| {
            Error::corrupt(format!("chunk {idx} of inode {ino}"), "a partial buffer but no record")
        })?;
        let mut bytes = Vec::new();
        for &(lo, hi) in ranges {
            bytes.clear();
            self.copy_extent(ino, idx, &e, lo, hi, &mut bytes)?;
            self.buffered_mut(ino, idx).expect("buffered").data_mut()[lo..hi].copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// Make a partial buffer whole: the stored chunk, with the buffer's
    /// touched blocks over it.
    fn complete(&mut self, ino: Ino, idx: u64) -> Result<()> {
        let Some(mut b) = self.dirty.get_mut(&ino).and_then(|m| m.remove(&idx)) else {
            return Ok(());
        };
        let r = self.complete_buf(ino, idx, &mut b);
        self.dirty.entry(ino).or_default().insert(idx, b);
        r
    }

    fn complete_buf(&mut self, ino: Ino, idx: u64, b: &mut Buf) -> Result<()> {
        if !b.partial {
            return Ok(());
        }
        let runs = runs_of(b.touched.as_deref().unwrap_or(&[]), self.cfg.chunk_size / PATCH_BLOCK);
        let e = self.stored_extent(ino, idx)?.ok_or_else(|| {
            Error::corrupt(format!("chunk {idx} of inode {ino}"), "a partial buffer but no record")
        })?;
        let mut full = self.extent_bytes(ino, idx, &e)?;
        full.resize(b.data().len(), 0);
        for (lo, hi) in spans(&runs, b.data().len() as u64) {
            full[lo as usize..hi as usize].copy_from_slice(&b.data()[lo as usize..hi as usize]);
        }
        *b.data_mut() = full;
        b.partial = false;
        Ok(())
    }

    /// The buffer for a write of `[from, from + n)` of a chunk. With
    /// patches on, a stored chunk is not read whole: the buffer is partial,
    /// and only the blocks the write covers in part are read.
    fn write_buf(&mut self, ino: Ino, idx: u64, from: usize, n: usize) -> Result<&mut Buf> {
        if self.buffered(ino, idx).is_none() {
            let e = self.stored_extent(ino, idx)?;
            let load = match (self.patches, self.cleaning) {
                (true, false) => Load::Partial,
                (true, true) => Load::Track,
                (false, _) => Load::Whole,
            };
            self.insert_buf(ino, idx, e, load)?;
        }
        let b = self.buffered(ino, idx).expect("buffered");
        if !b.partial {
            return self.dirty_buf(ino, idx, self.patches);
        }
        // Blocks the write covers only in part, not yet in the buffer:
        // their stored bytes first.
        let pb = PATCH_BLOCK as usize;
        let mut need = Vec::new();
        for blk in [from / pb, (from + n).saturating_sub(1) / pb] {
            let (lo, hi) = (blk * pb, ((blk + 1) * pb).min(b.data().len()));
            let whole = from <= lo && from + n >= hi;
            let had =
                b.touched.as_ref().and_then(|t| t.get(blk / 64)).is_some_and(|w| w >> (blk % 64) & 1 == 1);
            if lo < hi && !whole && !had && !need.contains(&(lo, hi)) {
                need.push((lo, hi));
            }
        }
        self.fill_partial(ino, idx, &need)?;
        Ok(self.buffered_mut(ino, idx).expect("buffered"))
    }

    /// For the cleaner: store the blocks `runs` of a stored chunk again,
    /// as a patch holding the chunk's current bytes there, so that the
    /// block of the patch that covered them can be freed without
    /// rewriting the whole chunk. A chunk already buffered whole is left
    /// as it is (it is stored whole).
    pub(super) fn move_patch(&mut self, ino: Ino, idx: u64, runs: &[(u32, u32)]) -> Result<()> {
        if self.buffered(ino, idx).is_none() {
            // Read only the blocks moved (a partial buffer).
            let e = self.stored_extent(ino, idx)?;
            if e.is_none() {
                return Err(Error::corrupt(
                    format!("chunk {idx} of inode {ino}"),
                    "moved but it has no record",
                ));
            }
            self.insert_buf(ino, idx, e, if self.cleaning { Load::Partial } else { Load::Track })?;
        }
        let b = self.buffered(ino, idx).expect("buffered");
        if b.partial {
            let len = b.data().len() as u64;
            let ranges: Vec<(usize, usize)> =
                spans(runs, len).map(|(lo, hi)| (lo as usize, hi as usize)).collect();
            self.fill_partial(ino, idx, &ranges)?;
        }
        if let Some(t) = &mut self.buffered_mut(ino, idx).expect("buffered").touched {
            for &(s, n) in runs {
                mark(t, s as usize..(s + n) as usize);
            }
        }
        Ok(())
    }

    /// Forget a buffered chunk; returns its length.
    fn drop_dirty(&mut self, ino: Ino, idx: u64) -> Option<usize> {
        let m = self.dirty.get_mut(&ino)?;
        let b = m.remove(&idx)?;
        if m.is_empty() {
            self.dirty.remove(&ino);
        }
        self.dirty_bytes -= self.cfg.chunk_size as usize;
        self.dirty_chunks -= 1;
        Some(b.data().len())
    }

    /// Read `[off, off + len)` clipped to the size.
    pub(super) fn read_data(&mut self, i: &Inode, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = off.saturating_add(len as u64).min(i.size);
        let mut out = Vec::with_capacity(end.saturating_sub(off) as usize);
        let cs = self.cs();
        let mut pos = off;
        while pos < end {
            let idx = pos / cs;
            let from = (pos - idx * cs) as usize;
            let to = ((end - idx * cs).min(cs)) as usize;
            self.complete(i.ino, idx)?;
            let dirty = self.dirty.get(&i.ino).and_then(|m| m.get(&idx));
            if let Some(b) = dirty {
                let b = b.data();
                let have = b.len().min(to);
                if from < have {
                    out.extend_from_slice(&b[from..have]);
                }
                out.resize(out.len() + (to - from.max(have)), 0);
            } else {
                match self.stored_extent(i.ino, idx)? {
                    Some(e) => self
                        .copy_extent(i.ino, idx, &e, from, to, &mut out)
                        .map_err(|err| in_file(err, i.ino, idx * cs, (idx + 1) * cs))?,
                    None => out.resize(out.len() + (to - from), 0),
                }
            }
            pos = idx * cs + to as u64;
        }
        Ok(out)
    }

    /// The blocks a read of `[off, off + len)` would read that are not
    /// cached (chunks buffered are read from their buffers).
    pub(super) fn uncached_blocks(&mut self, i: &Inode, off: u64, len: usize) -> Result<Vec<BlockAddr>> {
        fn blocks(e: &Extent, out: &mut Vec<BlockAddr>) {
            match e {
                Extent::Own(a, _) => out.push(*a),
                Extent::Shared { addr, .. } => out.push(*addr),
                Extent::Patched { base, patches, .. } => {
                    blocks(base, out);
                    for p in patches {
                        blocks(&p.piece, out);
                    }
                }
                Extent::Inline(_) | Extent::Gone(_) | Extent::Reserved(_) => {}
            }
        }
        let end = off.saturating_add(len as u64).min(i.size);
        let cs = self.cs();
        let mut out = Vec::new();
        let mut idx = off / cs;
        while idx * cs < end {
            if self.buffered(i.ino, idx).is_none() {
                if let Some(e) = self.stored_extent(i.ino, idx)? {
                    blocks(&e, &mut out);
                }
            }
            idx += 1;
        }
        out.retain(|a| self.cache.get(a).is_none());
        out.dedup();
        Ok(out)
    }

    /// Bytes of a write of `len` at `off` that need room of their own: not
    /// those that land in a buffered chunk (counted whole already) or in
    /// a chunk's reservation (its room was set aside by fallocate).
    pub(super) fn fresh_bytes(&self, ino: Ino, off: u64, len: usize) -> Result<usize> {
        let cs = self.cs();
        let end = off.saturating_add(len as u64);
        let mut fresh = 0u64;
        let mut pos = off;
        while pos < end {
            let idx = pos / cs;
            let to = end.min((idx + 1) * cs);
            if self.buffered(ino, idx).is_none() {
                let reserved = match self.counters.reserved {
                    0 => 0,
                    _ => match self.stored_extent(ino, idx)? {
                        Some(Extent::Reserved(n)) => idx * cs + u64::from(n),
                        _ => 0,
                    },
                };
                fresh += to - pos.max(reserved.min(to));
            }
            pos = to;
        }
        Ok(fresh as usize)
    }

    /// Write `data` at `off`, growing the size; times are the caller's.
    pub(super) fn write_data(&mut self, i: &mut Inode, off: u64, data: &[u8]) -> Result<()> {
        let cs = self.cs();
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let idx = at / cs;
            let from = (at - idx * cs) as usize;
            let n = (cs as usize - from).min(data.len() - pos);
            // Blocks are tracked only when they may become patches.
            let b = self.write_buf(i.ino, idx, from, n)?;
            if let Some(t) = &mut b.touched {
                let pb = PATCH_BLOCK as usize;
                mark(t, from / pb..(from + n).div_ceil(pb));
            }
            let buf = b.data_mut();
            let old = buf.len();
            if buf.len() < from + n {
                buf.resize(from + n, 0);
            }
            buf[from..from + n].copy_from_slice(&data[pos..pos + n]);
            let grown = buf.len() - old;
            i.alloc += grown as u64;
            pos += n;
            if from + n == cs as usize {
                // A write that reaches a chunk's end: the writer is likely
                // done with it.
                self.compress_ahead(i, idx);
            }
        }
        if !data.is_empty() {
            i.size = i.size.max(off + data.len() as u64);
        }
        self.stats.bytes_written += data.len() as u64;
        self.counters.user_bytes += data.len() as u64;
        Ok(())
    }

    /// Compress chunk `idx` of `i` on the pool now, if it is buffered
    /// whole, full and not tracked for patches, and fewer than
    /// [`AHEAD_BYTES`] of chunks wait for the pool already.
    fn compress_ahead(&mut self, i: &Inode, idx: u64) {
        let cs = self.cs() as usize;
        if self.cleaning || self.ahead.jobs.load(Ordering::Relaxed) >= (AHEAD_BYTES / cs).max(1) {
            return;
        }
        let Some(b) = self.buffered(i.ino, idx) else { return };
        if b.partial || b.touched.is_some() || b.data().len() != cs {
            return;
        }
        let (raw, stamp) = (b.data().to_vec(), b.stamp());
        let (ino, spec) = (i.ino, i.policy.unwrap_or(self.cfg.codec));
        let slot = Arc::new(Mutex::new(Slot::Queued));
        let (job_slot, jobs) = (Arc::clone(&slot), Arc::clone(&self.ahead.jobs));
        jobs.fetch_add(1, Ordering::Relaxed);
        rayon::spawn(move || {
            let go = {
                let mut s = lock(&job_slot);
                let queued = matches!(*s, Slot::Queued);
                if queued {
                    *s = Slot::Running;
                }
                queued
            };
            if go {
                let e = Engine::encode_data(ino, spec, &raw);
                let mut s = lock(&job_slot);
                if matches!(*s, Slot::Running) {
                    *s = Slot::Done(e);
                }
            }
            jobs.fetch_sub(1, Ordering::Relaxed);
        });
        if let Some(old) = self.ahead.map.insert((ino, idx), AheadBlock { stamp, spec, len: cs, slot }) {
            old.take();
        }
    }

    /// The block compressed ahead for chunk `idx` of `ino`, if it was
    /// made from these bytes (`stamp`), at this length and codec.
    fn take_ahead(
        &mut self,
        ino: Ino,
        idx: u64,
        stamp: u64,
        spec: CodecSpec,
        len: usize,
    ) -> Option<EncodedBlock> {
        let a = self.ahead.map.remove(&(ino, idx))?;
        let same = a.stamp == stamp && a.spec == spec && a.len == len;
        // Taken either way: a block of other bytes is dropped, its job
        // stopped.
        a.take().filter(|_| same)
    }

    /// Release a stored chunk's hold on its blocks.
    pub(super) fn release(&mut self, ino: Ino, idx: u64, e: &Extent) -> Result<()> {
        match e {
            Extent::Inline(_) | Extent::Gone(_) => {}
            Extent::Reserved(len) => {
                self.counters.reserved = self.counters.reserved.saturating_sub(u64::from(*len))
            }
            Extent::Patched { base, patches, freed } => {
                self.release_base(ino, idx, base, *freed)?;
                for p in patches {
                    self.release(ino, idx, &p.piece)?;
                }
            }
            Extent::Own(a, _) => {
                self.pend.free(*a);
                self.cache.remove(a);
            }
            Extent::Shared { addr, phys, .. } => {
                let k = shared_key(*addr);
                let (mut refs, released) = match self.get(&k)? {
                    Some(v) => decode_refs(&v)?,
                    None => {
                        return Err(Error::corrupt(
                            format!("block {addr}"),
                            format!("chunk {idx} of inode {ino} shares it but it has no reference list"),
                        ))
                    }
                };
                // A chunk is listed once for each of its pieces in the
                // block (patches of several of its blocks may share one).
                if let Some(n) = refs.iter().position(|&r| r == (ino, idx)) {
                    refs.remove(n);
                }
                if refs.is_empty() {
                    // The rest of the block.
                    self.del(k);
                    self.pend.free(BlockAddr { len: addr.len.saturating_sub(released), ..*addr });
                    self.cache.remove(addr);
                } else {
                    // This chunk's share of the block is dead: release it
                    // from the segment's live count, so that the cleaner
                    // sees it, keeping at least a byte counted for the
                    // chunks that still use the block.
                    let n = (*phys).min(addr.len.saturating_sub(released).saturating_sub(1));
                    if n > 0 {
                        self.pend.free(BlockAddr { len: n, ..*addr });
                    }
                    self.put(k, encode_refs(&refs, released + n));
                }
            }
        }
        Ok(())
    }

    /// Release a patched chunk's base, of which the patches released
    /// `freed` bytes already (an own base's; the rest goes now).
    fn release_base(&mut self, ino: Ino, idx: u64, base: &Extent, freed: u32) -> Result<()> {
        match *base {
            Extent::Own(a, _) => {
                self.pend.free(BlockAddr { len: a.len - freed, ..a });
                self.cache.remove(&a);
                Ok(())
            }
            ref b => self.release(ino, idx, b),
        }
    }

    /// Make chunk `idx` a hole: drop its buffer and its stored extent. A
    /// buffered chunk is counted in `alloc` at its buffer's length only.
    fn punch_chunk(&mut self, i: &mut Inode, idx: u64) -> Result<()> {
        let buffered = self.drop_dirty(i.ino, idx);
        let stored = self.stored_extent(i.ino, idx)?;
        if let Some(e) = &stored {
            self.release(i.ino, idx, e)?;
            self.del(extent_key(i.ino, idx));
        }
        let counted = match (buffered, stored) {
            (Some(n), _) => n as u64,
            (None, Some(e)) => e.len(),
            (None, None) => 0,
        };
        i.alloc = i.alloc.saturating_sub(counted);
        Ok(())
    }

    /// Zero `[off, off + len)` within the size: whole chunks become holes.
    pub(super) fn zero_range(&mut self, i: &mut Inode, off: u64, len: u64) -> Result<()> {
        let end = off.saturating_add(len).min(i.size);
        let cs = self.cs();
        let mut pos = off;
        while pos < end {
            let idx = pos / cs;
            let from = pos - idx * cs;
            let to = (end - idx * cs).min(cs);
            let chunk_len = (i.size - idx * cs).min(cs);
            if from == 0 && to >= chunk_len {
                self.punch_chunk(i, idx)?;
            } else {
                let stored = self.dirty.get(&i.ino).is_some_and(|m| m.contains_key(&idx))
                    || self.stored_extent(i.ino, idx)?.is_some();
                if stored {
                    let buf = self.dirty_mut(i.ino, idx)?;
                    let hi = (to as usize).min(buf.len());
                    if (from as usize) < hi {
                        buf[from as usize..hi].fill(0);
                    }
                }
            }
            pos = idx * cs + to;
            if self.group_full() {
                self.save(i);
                self.commit()?;
            }
        }
        Ok(())
    }

    /// fallocate's allocation: reserve every chunk of `[off, end)` that
    /// is neither stored nor buffered ([`Extent::Reserved`], from the
    /// chunk's start to `end` or the chunk's end), uncompressed, so that
    /// the first write of the range never meets ENOSPC; ENOSPC when the
    /// free log (less what is reserved already) cannot hold it, with
    /// nothing reserved. A chunk stored already is not reserved again: in
    /// a log, its overwrites need room as any write does.
    pub(super) fn reserve(&mut self, i: &mut Inode, off: u64, end: u64) -> Result<()> {
        let cs = self.cs();
        let mut plan: Vec<(u64, u32, u32)> = Vec::new();
        let mut need = 0u64;
        for idx in off / cs..end.div_ceil(cs) {
            if self.buffered(i.ino, idx).is_some() {
                continue;
            }
            let want = (end - idx * cs).min(cs) as u32;
            let have = match self.stored_extent(i.ino, idx)? {
                None => 0,
                Some(Extent::Reserved(have)) if have < want => have,
                Some(_) => continue,
            };
            plan.push((idx, have, want));
            need += u64::from(want - have);
            if need > self.space_hint.saturating_sub(self.dirty_bytes as u64) {
                // Commits, cleans, or says ENOSPC, before anything changed.
                self.pre_write(need as usize)?;
            }
        }
        if plan.is_empty() {
            return Ok(());
        }
        self.mark_version(FS_VERSION);
        for (idx, have, want) in plan {
            self.put(extent_key(i.ino, idx), Extent::Reserved(want).encode());
            let more = u64::from(want - have);
            self.counters.reserved += more;
            i.alloc += more;
            if self.group_full() {
                self.save(i);
                self.commit()?;
            }
        }
        Ok(())
    }

    /// Release the reservations of chunks in `[off, end)` past the size
    /// (left by fallocate with KEEP_SIZE), which a punched hole takes.
    pub(super) fn unreserve_past_size(&mut self, i: &mut Inode, off: u64, end: u64) -> Result<()> {
        let cs = self.cs();
        let start = off.max(i.size);
        for idx in start.div_ceil(cs)..end.div_ceil(cs) {
            if let Some(e @ Extent::Reserved(len)) = self.stored_extent(i.ino, idx)? {
                if idx * cs + u64::from(len) <= end {
                    self.release(i.ino, idx, &e)?;
                    self.del(extent_key(i.ino, idx));
                    i.alloc = i.alloc.saturating_sub(u64::from(len));
                }
            }
        }
        Ok(())
    }

    /// Set the size. Shrinking drops chunks past the end (committing in
    /// steps, under an orphan record, when there are many).
    pub(super) fn set_len(&mut self, i: &mut Inode, size: u64) -> Result<()> {
        if size < i.size {
            let cs = self.cs();
            let keep = size.div_ceil(cs);
            if size % cs != 0 {
                let idx = size / cs;
                let has = self.dirty.get(&i.ino).is_some_and(|m| m.contains_key(&idx))
                    || self.stored_extent(i.ino, idx)?.is_some();
                if has {
                    let buf = self.dirty_mut(i.ino, idx)?;
                    let n = (size - idx * cs) as usize;
                    let cut = buf.len().saturating_sub(n);
                    buf.truncate(n);
                    i.alloc -= cut as u64;
                }
            }
            let gone: Vec<u64> = self
                .dirty
                .get(&i.ino)
                .map(|m| m.range(keep..).map(|(&k, _)| k).collect())
                .unwrap_or_default();
            for idx in gone {
                self.punch_chunk(i, idx)?;
            }
            i.size = size;
            self.trim_extents(i, keep, 1 + keep)?;
        }
        i.size = size;
        Ok(())
    }

    /// Delete stored chunks from `from` on. When they do not fit in one
    /// group, intermediate groups are committed with an orphan record
    /// (`code`) so that a crash finishes the job at the next open.
    fn trim_extents(&mut self, i: &mut Inode, from: u64, code: u64) -> Result<()> {
        let (lo, hi) = extents_from(i.ino, from);
        let mut marked = false;
        loop {
            let batch = self.scan(&lo, &hi, 256)?;
            let more = batch.len() == 256;
            for (k, v) in batch {
                let Some((_, idx)) = parse_extent_key(&k) else { continue };
                let e = Extent::decode(&v, &format!("chunk {idx} of inode {}", i.ino))?;
                self.release(i.ino, idx, &e)?;
                self.del(k);
                i.alloc = i.alloc.saturating_sub(e.len());
            }
            if !more {
                break;
            }
            if self.group_full() {
                let mut v = Vec::new();
                zlogfs_engine::bytes::Put::put_var(&mut v, code);
                self.put(orphan_key(i.ino), v);
                marked = true;
                self.save(i);
                self.commit()?;
            }
        }
        if marked {
            self.del(orphan_key(i.ino));
        }
        Ok(())
    }

    /// Finish an orphan record: code 0 deletes the inode, code n > 0
    /// deletes its chunks from n - 1 on.
    pub(super) fn trim_all(&mut self, ino: Ino, code: u64) -> Result<()> {
        let mut i = match self.inode(ino) {
            Ok(i) => i,
            Err(Error::NotFound(_)) => {
                self.del(orphan_key(ino));
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if code == 0 {
            self.destroy(&mut i)
        } else {
            self.trim_extents(&mut i, code - 1, code)?;
            self.save(&i);
            self.del(orphan_key(ino));
            Ok(())
        }
    }

    /// Delete an inode with no links and no open handles, with its data and
    /// xattrs.
    pub(super) fn destroy(&mut self, i: &mut Inode) -> Result<()> {
        let chunks: Vec<u64> =
            self.dirty.get(&i.ino).map(|m| m.keys().copied().collect()).unwrap_or_default();
        for idx in chunks {
            self.drop_dirty(i.ino, idx);
        }
        self.put(orphan_key(i.ino), vec![0]);
        self.trim_extents(i, 0, 0)?;
        let (lo, hi) = xattrs_range(i.ino);
        for (k, _) in self.scan(&lo, &hi, usize::MAX)? {
            self.del(k);
        }
        self.del(inode_key(i.ino));
        self.del(orphan_key(i.ino));
        Ok(())
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`. None: ENXIO.
    pub(super) fn seek(&mut self, i: &Inode, off: u64, data: bool) -> Result<Option<u64>> {
        if off >= i.size {
            return Ok(None);
        }
        let cs = self.cs();
        let last = (i.size - 1) / cs;
        let mut c = off / cs;
        // Stored chunks are found by index scans from `c`, buffered ones in
        // the dirty map: the cost follows the number of data chunks
        // crossed, never the size of a hole.
        const STEP: usize = 1024;
        loop {
            if c > last {
                return Ok(if data { None } else { Some(i.size) });
            }
            let (lo, hi) = extents_from(i.ino, c);
            let stored: Vec<u64> = self
                .scan(&lo, &hi, if data { 1 } else { STEP })?
                .iter()
                .filter_map(|(k, _)| parse_extent_key(k).map(|(_, idx)| idx))
                .collect();
            let dirty = self.dirty.get(&i.ino);
            if data {
                let next_dirty = dirty.and_then(|m| m.range(c..).next().map(|(&k, _)| k));
                let next = match (stored.first().copied(), next_dirty) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => match a.or(b) {
                        Some(n) => n,
                        None => return Ok(None),
                    },
                };
                return Ok((next <= last).then(|| (next * cs).max(off)));
            }
            let full = stored.len() >= STEP;
            let mut j = 0;
            loop {
                if c > last {
                    return Ok(Some(i.size));
                }
                while j < stored.len() && stored[j] < c {
                    j += 1;
                }
                if (j < stored.len() && stored[j] == c) || dirty.is_some_and(|m| m.contains_key(&c)) {
                    c += 1;
                    continue;
                }
                if j == stored.len() && full {
                    break; // past this batch: scan again from `c`
                }
                return Ok(Some((c * cs).max(off)));
            }
        }
    }

    /// Stored bytes of a file's chunks.
    pub(super) fn physical(&self, ino: Ino) -> Result<u64> {
        let (lo, hi) = extents_from(ino, 0);
        let mut total = 0;
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            total += Extent::decode(&v, &format!("chunk of inode {ino} ({k:02x?})"))?.phys();
        }
        Ok(total)
    }

    /// Compress and store the buffered chunks of the group, and point the
    /// files at them. On failure the buffers are kept.
    pub(super) fn store_dirty(&mut self, room: Room) -> Result<()> {
        self.epoch += 1;
        let dirty = std::mem::take(&mut self.dirty);
        self.dirty_bytes = 0;
        self.dirty_chunks = 0;
        let r = self.store_chunks(dirty, room);
        if !self.cleaning {
            // Every buffer was stored or put back with a new stamp; the
            // cleaner's rounds set writers' buffers aside, and leave their
            // blocks for when they are stored.
            self.ahead.clear();
        }
        match r {
            Ok(()) => Ok(()),
            Err((e, Some(back))) => {
                self.dirty_chunks = back.values().map(|m| m.len()).sum();
                self.dirty_bytes = self.dirty_chunks * self.cfg.chunk_size as usize;
                self.dirty = back;
                Err(e)
            }
            Err((e, None)) => Err(e),
        }
    }

    /// The runs of patch blocks to store instead of the whole chunk, or
    /// None to store it whole. `len` is the chunk's length, `touched` the
    /// blocks written since it was loaded from `stored`.
    fn plan_patch(&self, stored: Option<&Extent>, len: usize, touched: &[u64]) -> Option<Vec<(u32, u32)>> {
        let e = stored?;
        if matches!(e, Extent::Inline(_)) || e.len() != len as u64 {
            return None;
        }
        let len = len as u64;
        let runs = runs_of(touched, len.div_ceil(u64::from(PATCH_BLOCK)) as u32);
        if self.cleaning {
            // While cleaning, writers' buffers are set aside, and the only
            // buffers that track blocks are patches the cleaner moves
            // (`move_patch`): they replace no more than the patches they
            // replace, whatever the share.
            return (!runs.is_empty()).then_some(runs);
        }
        let bytes: u64 = spans(&runs, len).map(|(a, b)| b - a).sum();
        let (old, gone): (&[Patch], bool) = match e {
            Extent::Patched { patches, base, .. } => (patches, matches!(**base, Extent::Gone(_))),
            _ => (&[], false),
        };
        let kept = visible(old, &runs);
        let (n, before) = kept.iter().fold((0, 0), |(n, b), p| (n + 1, b + p.piece.len()));
        // A chunk without a base has nothing to merge into: its patches
        // are all it is, and their share does not matter.
        let fits = bytes > 0
            && n < MAX_PATCHES
            && (gone || (bytes + before) as f64 <= len as f64 * MAX_PATCH_SHARE)
            && bytes < self.cs() / 2;
        fits.then_some(runs)
    }

    #[allow(clippy::type_complexity)]
    fn store_chunks(
        &mut self,
        dirty: HashMap<Ino, BTreeMap<u64, Buf>>,
        room: Room,
    ) -> std::result::Result<(), (Error, Option<HashMap<Ino, BTreeMap<u64, Buf>>>)> {
        let cs = self.cs();
        let mut inos: Vec<Ino> = dirty.keys().copied().collect();
        inos.sort_unstable();
        // Classify without changing anything, so that a failure can put
        // the buffers back.
        let mut inodes = Vec::new();
        for &ino in &inos {
            match self.inode(ino) {
                Ok(i) => inodes.push(i),
                // Deleted since its data was buffered.
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err((e, Some(dirty))),
            }
        }
        let mut dirty = dirty;
        // Partial buffers that will not be patches are made whole first,
        // while a failure can still put every buffer back.
        for i in &inodes {
            let Some(mut m) = dirty.remove(&i.ino) else { continue };
            let mut r = Ok(());
            for (&idx, b) in m.iter_mut().filter(|(_, b)| b.partial) {
                let lim = i.size.saturating_sub(idx * cs).min(cs) as usize;
                let stored = self.stored_extent(i.ino, idx).ok().flatten();
                let t = b.touched.as_deref().unwrap_or(&[]);
                if self.plan_patch(stored.as_ref(), b.data().len().min(lim), t).is_none() {
                    r = self.complete_buf(i.ino, idx, b);
                    if r.is_err() {
                        break;
                    }
                }
            }
            dirty.insert(i.ino, m);
            if let Err(e) = r {
                return Err((e, Some(dirty)));
            }
        }
        let (mut own, mut pack, mut inline, mut holes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Buffers stored as patches, to put back if storing fails.
        let mut patched: HashMap<(Ino, u64), Buf> = HashMap::new();
        for i in &inodes {
            let spec = i.policy.unwrap_or(self.cfg.codec);
            let chunks = dirty.remove(&i.ino).unwrap_or_default();
            for (idx, buf) in chunks {
                let (mut data, touched, partial, stamp) = buf.into_parts();
                let lim = i.size.saturating_sub(idx * cs).min(cs) as usize;
                let counted = data.len();
                data.truncate(lim);
                // A partial buffer's zeros outside its blocks are not the
                // chunk's: it is never a hole.
                let mut zero = !partial && (data.is_empty() || is_zero(&data));
                let plan = match &touched {
                    Some(t) if !zero => {
                        // An unreadable record: store the chunk whole (its
                        // install meets the error, as any chunk's would).
                        let stored = self.stored_extent(i.ino, idx).ok().flatten();
                        self.plan_patch(stored.as_ref(), data.len(), t)
                    }
                    _ => None,
                };
                if partial && plan.is_none() {
                    // Made whole above unless the plan changed since, which
                    // nothing in between does.
                    let mut b = Buf::new(data, touched.clone(), partial);
                    if let Err(e) = self.complete_buf(i.ino, idx, &mut b) {
                        return Err((e, None));
                    }
                    data = b.into_parts().0;
                    data.truncate(lim);
                    zero = data.is_empty() || is_zero(&data);
                }
                if let Some(runs) = plan {
                    // A patch per block: a later write of a block hides a
                    // whole patch, which is dropped and released, so no
                    // patch keeps bytes that no longer show (they would
                    // count as live).
                    let len = data.len();
                    let mut counted = counted;
                    for (s, n) in runs {
                        for b in s..s + n {
                            let one = vec![(b, 1)];
                            let (lo, hi) = spans(&one, len as u64).next().expect("one run");
                            let bytes = data[lo as usize..hi as usize].to_vec();
                            pack.push(Piece {
                                ino: i.ino,
                                idx,
                                data: bytes,
                                spec,
                                counted,
                                len,
                                patch: Some(one),
                                stamp: None,
                            });
                            // The chunk's count is settled once.
                            counted = len;
                        }
                    }
                    patched.insert((i.ino, idx), Buf::new(data, touched, partial));
                    continue;
                }
                let len = data.len();
                // A completed partial buffer's bytes are not those of its
                // stamp (and it was never compressed ahead).
                let stamp = (!partial).then_some(stamp);
                let p = Piece { ino: i.ino, idx, data, spec, counted, len, patch: None, stamp };
                if zero {
                    holes.push(p);
                } else if idx == 0 && i.size <= u64::from(self.cfg.inline_max) {
                    inline.push(p);
                } else if (p.data.len() as u64) < cs / 2 {
                    pack.push(p);
                } else {
                    own.push(p);
                }
            }
        }
        // Pack small chunks, by codec, in inode order (files created
        // together sit together).
        pack.sort_by_key(|p| (p.spec.id as u8, p.spec.level, p.ino, p.idx));
        let mut packs: Vec<(CodecSpec, Vec<u8>, Vec<usize>)> = Vec::new();
        for (n, p) in pack.iter().enumerate() {
            let fits = packs.last().is_some_and(|(s, b, _)| {
                *s == p.spec && b.len() + p.data.len() <= self.cfg.pack_bytes as usize
            });
            if !fits {
                packs.push((p.spec, Vec::new(), Vec::new()));
            }
            let last = packs.last_mut().expect("pushed");
            last.1.extend_from_slice(&p.data);
            last.2.push(n);
        }
        let ready: Vec<Option<EncodedBlock>> = own
            .iter()
            .map(|p| p.stamp.and_then(|st| self.take_ahead(p.ino, p.idx, st, p.spec, p.data.len())))
            .collect();
        self.stats.ahead_used += ready.iter().filter(|r| r.is_some()).count() as u64;
        let mut reqs: Vec<BlockWrite> = own
            .iter()
            .zip(ready)
            .map(|(p, ready)| BlockWrite { owner: p.ino, spec: p.spec, raw: &p.data[..], ready })
            .collect();
        reqs.extend(packs.iter().map(|(s, b, _)| BlockWrite::new(0, *s, &b[..])));
        let addrs = if reqs.is_empty() {
            Vec::new()
        } else {
            match self.eng.write_blocks(room, reqs) {
                Ok(a) => a,
                Err(e) => {
                    let mut back: HashMap<Ino, BTreeMap<u64, Buf>> = HashMap::new();
                    for p in own.into_iter().chain(pack).chain(inline).chain(holes) {
                        let b = match patched.remove(&(p.ino, p.idx)) {
                            Some(b) => b,
                            // Another patch of a chunk already put back.
                            None if p.patch.is_some() => continue,
                            None => Buf::new(p.data, None, false),
                        };
                        back.entry(p.ino).or_default().insert(p.idx, b);
                    }
                    return Err((e.into(), Some(back)));
                }
            }
        };
        drop(patched);
        for (n, a) in addrs.iter().enumerate() {
            let b = u64::from(a.len);
            match (self.cleaning, n < own.len()) {
                (true, _) => self.stats.clean_stored += b,
                (false, true) => self.stats.whole_stored += b,
                (false, false) => self.stats.pack_stored += b,
            }
        }
        // From here on the blocks exist; point the files at them.
        let r = (|| -> Result<()> {
            for p in own.iter().chain(&pack).chain(&inline) {
                if p.counted > p.len {
                    self.uncount(p.ino, (p.counted - p.len) as u64)?;
                }
            }
            for (p, a) in own.iter().zip(&addrs) {
                self.install(p.ino, p.idx, Extent::Own(*a, p.data.len() as u32))?;
                self.stats.chunk_bytes += p.data.len() as u64;
            }
            for ((_, raw, members), a) in packs.iter().zip(&addrs[own.len()..]) {
                let mut off = 0u32;
                let refs: Vec<(Ino, u64)> = members.iter().map(|&n| (pack[n].ino, pack[n].idx)).collect();
                self.put(shared_key(*a), encode_refs(&refs, 0));
                for &n in members {
                    let p = &pack[n];
                    let len = p.data.len() as u32;
                    let phys = (u64::from(a.len) * u64::from(len)).div_ceil(raw.len().max(1) as u64) as u32;
                    let piece = Extent::Shared { addr: *a, off, len, phys };
                    match &p.patch {
                        Some(runs) => self.add_patch(p.ino, p.idx, runs.clone(), piece)?,
                        None => self.install(p.ino, p.idx, piece)?,
                    }
                    off += len;
                    self.stats.chunk_bytes += u64::from(len);
                }
                self.stats.pack_blocks += 1;
            }
            for p in inline {
                self.stats.chunk_bytes += p.data.len() as u64;
                self.stats.inline_chunks += 1;
                self.install(p.ino, p.idx, Extent::Inline(p.data))?;
            }
            for p in holes {
                if let Some(e) = self.stored_extent(p.ino, p.idx)? {
                    self.release(p.ino, p.idx, &e)?;
                    self.del(extent_key(p.ino, p.idx));
                }
                self.stats.zero_chunks += 1;
                self.uncount(p.ino, p.counted as u64)?;
            }
            Ok(())
        })();
        r.map_err(|e| (e, None))
    }

    /// Add a patch to a stored chunk, dropping the patches it covers, and
    /// release the part of an own base the patches now replace from its
    /// segment's live count (so that the cleaner sees it as dead).
    fn add_patch(&mut self, ino: Ino, idx: u64, runs: Vec<(u32, u32)>, piece: Extent) -> Result<()> {
        let (mut base, mut patches, mut freed) = match self.stored_extent(ino, idx)? {
            Some(Extent::Patched { base, patches, freed }) => (base, patches, freed),
            Some(e @ (Extent::Own(..) | Extent::Shared { .. })) => (Box::new(e), Vec::new(), 0),
            other => {
                return Err(Error::corrupt(
                    format!("chunk {idx} of inode {ino}"),
                    format!("a patch was made for it as stored, but it is now {other:?}"),
                ))
            }
        };
        patches.push(Patch { runs, piece });
        // Patches that newer ones hide entirely are dropped.
        let keep: Vec<Patch> = visible(&patches, &[]).into_iter().cloned().collect();
        for p in &patches {
            if !keep.contains(p) {
                self.release(ino, idx, &p.piece)?;
            }
        }
        patches = keep;
        let len = base.len();
        if covers_all(&patches, len.div_ceil(u64::from(PATCH_BLOCK)) as u32) {
            // Nothing of the base shows: release it (the rest of it, for an
            // own base) and keep the chunk as its patches.
            self.release_base(ino, idx, &base, freed)?;
            base = Box::new(Extent::Gone(len as u32));
            freed = 0;
        } else if let Extent::Own(a, len) = *base {
            let dead = replaced_share(&patches, a.len, len);
            if dead > freed {
                self.pend.free(BlockAddr { len: dead - freed, ..a });
                freed = dead;
            }
        }
        self.mark_version(4);
        self.stats.patches += 1;
        self.put(extent_key(ino, idx), Extent::Patched { base, patches, freed }.encode());
        Ok(())
    }

    /// Record that the image holds records of fs version `v` (older
    /// builds then refuse it instead of misreading them).
    fn mark_version(&mut self, v: u8) {
        if self.cfg.version < v {
            self.cfg.version = v;
            self.cfg_dirty = true;
        }
    }

    /// Take `n` bytes off an inode's allocated count.
    fn uncount(&mut self, ino: Ino, n: u64) -> Result<()> {
        let mut i = self.inode(ino)?;
        i.alloc = i.alloc.saturating_sub(n);
        self.save(&i);
        Ok(())
    }

    fn install(&mut self, ino: Ino, idx: u64, e: Extent) -> Result<()> {
        if let Some(old) = self.stored_extent(ino, idx)? {
            self.release(ino, idx, &old)?;
        }
        self.put(extent_key(ino, idx), e.encode());
        Ok(())
    }
}
