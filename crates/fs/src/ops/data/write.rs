//! Buffering writes: loading a stored chunk into a buffer (whole, or only
//! the patch blocks a write covers in part), writing into it, and handing
//! full chunks to compression ahead.

use zlogfs_engine::metrics::{self, Metrics};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::ops::patch::{is_marked, mark, runs_of};
use crate::state::buffers::Buf;
use crate::state::State;

/// A chunk's size, and how many of its bytes lie within its file's size.
#[derive(Clone, Copy)]
struct Room {
    cs: u32,
    within: u64,
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

impl State {
    /// The buffer of chunk `idx` of file `i`, loading its stored content
    /// first; it will be stored whole. `i`'s allocated count loses what
    /// of a reservation lay past its size (see [`State::insert_buf`]).
    pub(crate) fn dirty_mut(&mut self, i: &mut Inode, idx: u64) -> Result<&mut Vec<u8>> {
        let b = self.dirty_buf(i, idx, false)?;
        b.touched = None;
        Ok(b.data_mut())
    }

    /// The buffer of a chunk of file `i`, loading its stored content first
    /// (then, with `track`, tracking the blocks written, so that the
    /// commit may store only those).
    fn dirty_buf(&mut self, i: &mut Inode, idx: u64, track: bool) -> Result<&mut Buf> {
        self.complete(i.ino, idx)?;
        if self.bufs.get(i.ino, idx).is_none() {
            let e = self.stored_extent(i.ino, idx)?;
            let load = if track { Load::Track } else { Load::Whole };
            i.alloc -= self.insert_buf(i.ino, idx, self.room(i, idx), e, load)?;
        }
        Ok(self.bufs.get_mut(i.ino, idx).expect("just inserted"))
    }

    /// The bytes of chunk `idx` of file `i` that lie within its size.
    fn room(&self, i: &Inode, idx: u64) -> Room {
        let cs = self.cs(i);
        Room { cs: cs as u32, within: i.size.saturating_sub(idx * cs).min(cs) }
    }

    /// Buffer chunk `idx` (of `room.cs` bytes), stored as `e`, loaded as
    /// `load` says (a chunk not stored in a block is always loaded whole
    /// and not tracked). A reservation becomes zeros up to the size only
    /// (a buffer holds no bytes past the size); what it reserved past
    /// the size is given back, and returned: the caller takes it off the
    /// file's allocated count.
    fn insert_buf(&mut self, ino: Ino, idx: u64, room: Room, e: Option<Extent>, load: Load) -> Result<u64> {
        let cs = room.cs;
        if e.as_ref().is_some_and(|e| e.len() > u64::from(cs)) {
            return Err(Error::corrupt(
                format!("chunk {idx} of inode {ino}"),
                format!(
                    "holds {} bytes, more than the file's chunk size {cs}",
                    e.as_ref().map_or(0, Extent::len)
                ),
            ));
        }
        let words = (cs / PATCH_BLOCK).div_ceil(64) as usize;
        let mut dropped = 0;
        let buf = match e {
            Some(e @ (Extent::Own(..) | Extent::Shared { .. } | Extent::Patched { .. })) => match load {
                Load::Partial => Buf::new(vec![0; e.len() as usize], Some(vec![0; words]), true, cs),
                Load::Track => Buf::new(self.extent_bytes(ino, idx, &e)?, Some(vec![0; words]), false, cs),
                Load::Whole => Buf::new(self.extent_bytes(ino, idx, &e)?, None, false, cs),
            },
            Some(Extent::Reserved(len)) => {
                // The chunk is written now: its reservation within the size
                // becomes this buffer (counted in the buffers' bytes from
                // here on), and the record goes, as a hole's would have
                // none.
                self.release(ino, idx, &Extent::Reserved(len))?;
                self.del(extent_key(ino, idx));
                let kept = u64::from(len).min(room.within);
                dropped = u64::from(len) - kept;
                Buf::new(vec![0; kept as usize], None, false, cs)
            }
            Some(e) => Buf::new(self.extent_bytes(ino, idx, &e)?, None, false, cs),
            None => Buf::new(Vec::new(), None, false, cs),
        };
        self.bufs.insert(ino, idx, buf);
        Ok(dropped)
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
            self.bufs.get_mut(ino, idx).expect("buffered").data_mut()[lo..hi].copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// Make a partial buffer whole: the stored chunk, with the buffer's
    /// touched blocks over it.
    pub(crate) fn complete(&mut self, ino: Ino, idx: u64) -> Result<()> {
        let Some(mut b) = self.bufs.remove(ino, idx) else {
            return Ok(());
        };
        let r = self.complete_buf(ino, idx, &mut b);
        self.bufs.insert(ino, idx, b);
        r
    }

    pub(crate) fn complete_buf(&mut self, ino: Ino, idx: u64, b: &mut Buf) -> Result<()> {
        if !b.partial {
            return Ok(());
        }
        let runs = runs_of(b.touched.as_deref().unwrap_or(&[]), b.chunk() / PATCH_BLOCK);
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
    fn write_buf(&mut self, i: &mut Inode, idx: u64, from: usize, n: usize) -> Result<&mut Buf> {
        let ino = i.ino;
        if self.bufs.get(ino, idx).is_none() {
            let e = self.stored_extent(ino, idx)?;
            let load = match (self.patches, self.cleaning) {
                (true, false) => Load::Partial,
                (true, true) => Load::Track,
                (false, _) => Load::Whole,
            };
            i.alloc -= self.insert_buf(ino, idx, self.room(i, idx), e, load)?;
        }
        let b = self.bufs.get(ino, idx).expect("buffered");
        if !b.partial {
            let track = self.patches;
            return self.dirty_buf(i, idx, track);
        }
        // Blocks the write covers only in part, not yet in the buffer:
        // their stored bytes first.
        let pb = PATCH_BLOCK as usize;
        let mut need = Vec::new();
        for blk in [from / pb, (from + n).saturating_sub(1) / pb] {
            let (lo, hi) = (blk * pb, ((blk + 1) * pb).min(b.data().len()));
            let whole = from <= lo && from + n >= hi;
            let had = b.touched.as_deref().is_some_and(|t| is_marked(t, blk));
            if lo < hi && !whole && !had && !need.contains(&(lo, hi)) {
                need.push((lo, hi));
            }
        }
        self.fill_partial(ino, idx, &need)?;
        Ok(self.bufs.get_mut(ino, idx).expect("buffered"))
    }

    /// For the cleaner: store the blocks `runs` of a stored chunk again,
    /// as a patch holding the chunk's current bytes there, so that the
    /// block of the patch that covered them can be freed without
    /// rewriting the whole chunk. A chunk already buffered whole is left
    /// as it is (it is stored whole).
    pub(crate) fn move_patch(&mut self, ino: Ino, idx: u64, cs: u32, runs: &[(u32, u32)]) -> Result<()> {
        if self.bufs.get(ino, idx).is_none() {
            // Read only the blocks moved (a partial buffer).
            let e = self.stored_extent(ino, idx)?;
            if e.is_none() {
                return Err(Error::corrupt(
                    format!("chunk {idx} of inode {ino}"),
                    "moved but it has no record",
                ));
            }
            // A patched chunk: never a reservation, so nothing is dropped.
            let room = Room { cs, within: u64::from(cs) };
            self.insert_buf(ino, idx, room, e, if self.cleaning { Load::Partial } else { Load::Track })?;
        }
        let b = self.bufs.get(ino, idx).expect("buffered");
        if b.partial {
            let len = b.data().len() as u64;
            let ranges: Vec<(usize, usize)> =
                spans(runs, len).map(|(lo, hi)| (lo as usize, hi as usize)).collect();
            self.fill_partial(ino, idx, &ranges)?;
        }
        if let Some(t) = &mut self.bufs.get_mut(ino, idx).expect("buffered").touched {
            for &(s, n) in runs {
                mark(t, s as usize..(s + n) as usize);
            }
        }
        Ok(())
    }

    /// Forget a buffered chunk; returns its length.
    pub(crate) fn drop_dirty(&mut self, ino: Ino, idx: u64) -> Option<usize> {
        self.bufs.remove(ino, idx).map(|b| b.data().len())
    }

    /// Bytes of a write of `len` at `off` that need room of their own: not
    /// those that land in a buffered chunk (counted whole already) or in
    /// a chunk's reservation (its room was set aside by fallocate).
    pub(crate) fn fresh_bytes(&self, i: &Inode, off: u64, len: usize) -> Result<usize> {
        let (ino, cs) = (i.ino, self.cs(i));
        let end = off.saturating_add(len as u64);
        let mut fresh = 0u64;
        let mut pos = off;
        while pos < end {
            let idx = pos / cs;
            let to = end.min((idx + 1) * cs);
            if self.bufs.get(ino, idx).is_none() {
                let reserved = match self.group.counters().reserved {
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
    pub(crate) fn write_data(&mut self, i: &mut Inode, off: u64, data: &[u8]) -> Result<()> {
        let cs = self.cs(i);
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let idx = at / cs;
            let from = (at - idx * cs) as usize;
            let n = (cs as usize - from).min(data.len() - pos);
            // Blocks are tracked only when they may become patches.
            let b = self.write_buf(i, idx, from, n)?;
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
        self.group.counters_mut().user_bytes += data.len() as u64;
        Metrics::add(&metrics::global().counters.user_bytes_written, data.len() as u64);
        Ok(())
    }

    /// Compress chunk `idx` of `i` on the pool now, with the file's codec
    /// ([`crate::state::buffers::Buffers::compress_ahead`]), unless the cleaner
    /// runs or the chunk is likely stored with its neighbours (a file
    /// with a compression unit larger than its chunks).
    fn compress_ahead(&mut self, i: &Inode, idx: u64) {
        let joins = i.unit.is_some_and(|u| u64::from(u) > self.cs(i));
        if !self.cleaning && !joins {
            self.bufs.compress_ahead(i.ino, idx, i.policy.unwrap_or(self.group.cfg().codec));
        }
    }
}
