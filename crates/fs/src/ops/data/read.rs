//! Reading file data: a stored chunk's bytes (from its block, its shared
//! block, inline, or a base with patches over it), buffered chunks, and
//! SEEK_DATA / SEEK_HOLE.

use std::sync::Arc;

use zlogfs_engine::error::Error as EngineError;
use zlogfs_engine::metrics::{self, Metrics};
use zlogfs_engine::BlockAddr;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::State;

/// Damage met reading bytes `[lo, hi)` of inode `ino`, said with them.
pub(crate) fn in_file(e: Error, ino: Ino, lo: u64, hi: u64) -> Error {
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
    /// Bytes of data per chunk of file `i`: its own chunk size, or the
    /// image's.
    pub(crate) fn cs(&self, i: &Inode) -> u64 {
        i.chunk.map_or(self.group.chunk_size(), u64::from)
    }

    pub(crate) fn stored_extent(&self, ino: Ino, idx: u64) -> Result<Option<Extent>> {
        match self.get(&extent_key(ino, idx))? {
            Some(v) => Ok(Some(Extent::decode(&v, &format!("chunk {idx} of inode {ino}"))?)),
            None => Ok(None),
        }
    }

    pub(crate) fn block(&mut self, a: BlockAddr) -> Result<Arc<Vec<u8>>> {
        let a = self.forward(a)?;
        if let Some(b) = self.cache.get(&a) {
            return Ok(b);
        }
        let b = Arc::new(self.eng.read_block(a)?);
        self.cache.insert(a, b.clone());
        Ok(b)
    }

    /// Append bytes `[from, to)` of a stored chunk to `out`.
    pub(crate) fn copy_extent(
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

    pub(crate) fn extent_bytes(&mut self, ino: Ino, idx: u64, e: &Extent) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(e.len() as usize);
        self.copy_extent(ino, idx, e, 0, e.len() as usize, &mut v)?;
        Ok(v)
    }

    /// Read `[off, off + len)` clipped to the size.
    pub(crate) fn read_data(&mut self, i: &Inode, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = off.saturating_add(len as u64).min(i.size);
        let mut out = Vec::with_capacity(end.saturating_sub(off) as usize);
        let cs = self.cs(i);
        let mut pos = off;
        while pos < end {
            let idx = pos / cs;
            let from = (pos - idx * cs) as usize;
            let to = ((end - idx * cs).min(cs)) as usize;
            self.complete(i.ino, idx)?;
            if let Some(b) = self.bufs.get(i.ino, idx) {
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
    pub(crate) fn uncached_blocks(&mut self, i: &Inode, off: u64, len: usize) -> Result<Vec<BlockAddr>> {
        let end = off.saturating_add(len as u64).min(i.size);
        let cs = self.cs(i);
        let mut out = Vec::new();
        let mut idx = off / cs;
        while idx * cs < end {
            if self.bufs.get(i.ino, idx).is_none() {
                if let Some(e) = self.stored_extent(i.ino, idx)? {
                    extent_blocks(&e, &mut out);
                }
            }
            idx += 1;
        }
        if self.at.is_some() {
            // As `block` reads them.
            out = out.into_iter().map(|a| self.forward(a)).collect::<Result<_>>()?;
        }
        let looked = out.len() as u64;
        out.retain(|a| self.cache.get(a).is_none());
        // A block may come up again further on (a unit's block between
        // patches of its chunks).
        let mut seen = std::collections::HashSet::new();
        out.retain(|a| seen.insert(*a));
        let c = &metrics::global().counters;
        Metrics::add(&c.cache_misses, out.len() as u64);
        Metrics::add(&c.cache_hits, looked - out.len() as u64);
        Ok(out)
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`. None: ENXIO.
    pub(crate) fn seek(&mut self, i: &Inode, off: u64, data: bool) -> Result<Option<u64>> {
        if off >= i.size {
            return Ok(None);
        }
        let cs = self.cs(i);
        let last = (i.size - 1) / cs;
        let mut c = off / cs;
        // Stored chunks are found by index scans from `c`, buffered ones in
        // the buffers: the cost follows the number of data chunks
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
            if data {
                let next_dirty = self.bufs.next_from(i.ino, c);
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
                if (j < stored.len() && stored[j] == c) || self.bufs.contains(i.ino, c) {
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
    /// [`State::physical`] with the chunks not committed yet counted at
    /// their buffered length (their compression is not known before they
    /// are stored: an upper bound); and whether there were any.
    pub(crate) fn physical_now(&self, ino: Ino) -> Result<(u64, bool)> {
        let (lo, hi) = extents_from(ino, 0);
        let mut total = 0;
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            let whole =
                parse_extent_key(&k).and_then(|(_, idx)| self.bufs.get(ino, idx)).is_some_and(|b| !b.partial);
            if !whole {
                total += Extent::decode(&v, &format!("chunk of inode {ino} ({k:02x?})"))?.phys();
            }
        }
        let buffered = self.bufs.chunks_from(ino, 0);
        for idx in &buffered {
            total += self.bufs.get(ino, *idx).map_or(0, |b| b.data().len() as u64);
        }
        Ok((total, !buffered.is_empty()))
    }

    pub(crate) fn physical(&self, ino: Ino) -> Result<u64> {
        let (lo, hi) = extents_from(ino, 0);
        let mut total = 0;
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            total += Extent::decode(&v, &format!("chunk of inode {ino} ({k:02x?})"))?.phys();
        }
        Ok(total)
    }
}

/// The stored blocks chunk `e` reads (its own or shared block, a
/// patched chunk's base and patches).
pub(crate) fn extent_blocks(e: &Extent, out: &mut Vec<BlockAddr>) {
    match e {
        Extent::Own(a, _) => out.push(*a),
        Extent::Shared { addr, .. } => out.push(*addr),
        Extent::Patched { base, patches, .. } => {
            extent_blocks(base, out);
            for p in patches {
                extent_blocks(&p.piece, out);
            }
        }
        Extent::Inline(_) | Extent::Gone(_) | Extent::Reserved(_) => {}
    }
}
