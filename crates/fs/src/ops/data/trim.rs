//! Giving stored data back: releasing a chunk's blocks, holes, truncation
//! (in steps under an orphan record when long), deleting an inode's data,
//! and fallocate's reservations.

use zlogfs_engine::BlockAddr;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::State;

/// A chunk fallocate reserves: `(index, bytes reserved already, bytes to
/// reserve)`.
type Reservation = (u64, u32, u32);

impl State {
    /// Release a stored chunk's hold on its blocks.
    pub(crate) fn release(&mut self, ino: Ino, idx: u64, e: &Extent) -> Result<()> {
        match e {
            Extent::Inline(_) | Extent::Gone(_) => {}
            Extent::Reserved(len) => {
                self.group.counters_mut().reserved =
                    self.group.counters().reserved.saturating_sub(u64::from(*len))
            }
            Extent::Patched { base, patches, freed } => {
                self.release_base(ino, idx, base, *freed)?;
                for p in patches {
                    self.release(ino, idx, &p.piece)?;
                }
            }
            Extent::Own(a, _) => {
                self.group.free(*a);
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
                    self.group.free(BlockAddr { len: addr.len.saturating_sub(released), ..*addr });
                    self.cache.remove(addr);
                } else {
                    // This chunk's share of the block is dead: release it
                    // from the segment's live count, so that the cleaner
                    // sees it, keeping at least a byte counted for the
                    // chunks that still use the block.
                    let n = (*phys).min(addr.len.saturating_sub(released).saturating_sub(1));
                    if n > 0 {
                        self.group.free(BlockAddr { len: n, ..*addr });
                    }
                    self.put(k, encode_refs(&refs, released + n));
                }
            }
        }
        Ok(())
    }

    /// Release a patched chunk's base, of which the patches released
    /// `freed` bytes already (an own base's; the rest goes now).
    pub(crate) fn release_base(&mut self, ino: Ino, idx: u64, base: &Extent, freed: u32) -> Result<()> {
        match *base {
            Extent::Own(a, _) => {
                self.group.free(BlockAddr { len: a.len - freed, ..a });
                self.cache.remove(&a);
                Ok(())
            }
            ref b => self.release(ino, idx, b),
        }
    }

    /// Commit in the middle of a long operation on file `i`: `i` is saved
    /// first, and read back after, as the commit's store may change it
    /// (a buffered chunk stored as a hole, or cut to the size, comes off
    /// its allocated count). Kept as it was, the copy's count went back
    /// over the store's when the operation saved it at its end (issue 44,
    /// item 9: xfstests generic/213's fallocate and truncate).
    fn commit_midway(&mut self, i: &mut Inode) -> Result<()> {
        self.save(i);
        self.commit()?;
        *i = self.inode(i.ino)?;
        Ok(())
    }

    /// Make chunk `idx` a hole: drop its buffer and its stored extent. A
    /// buffered chunk is counted in `alloc` at its buffer's length only.
    /// What can fail (reading the stored extent, releasing it) comes
    /// before the buffer is dropped, so that a failure leaves the chunk
    /// and its count as they were.
    fn punch_chunk(&mut self, i: &mut Inode, idx: u64) -> Result<()> {
        let stored = self.stored_extent(i.ino, idx)?;
        if let Some(e) = &stored {
            self.release(i.ino, idx, e)?;
            self.del(extent_key(i.ino, idx));
        }
        let buffered = self.drop_dirty(i.ino, idx);
        let counted = match (buffered, stored) {
            (Some(n), _) => n as u64,
            (None, Some(e)) => e.len(),
            (None, None) => 0,
        };
        i.alloc = i.alloc.saturating_sub(counted);
        Ok(())
    }

    /// Zero `[off, off + len)` within the size: whole chunks become holes.
    pub(crate) fn zero_range(&mut self, i: &mut Inode, off: u64, len: u64) -> Result<()> {
        let end = off.saturating_add(len).min(i.size);
        let cs = self.cs(i);
        let mut pos = off;
        while pos < end {
            let idx = pos / cs;
            let from = pos - idx * cs;
            let to = (end - idx * cs).min(cs);
            let chunk_len = (i.size - idx * cs).min(cs);
            if from == 0 && to >= chunk_len {
                self.punch_chunk(i, idx)?;
            } else {
                let stored = self.bufs.contains(i.ino, idx) || self.stored_extent(i.ino, idx)?.is_some();
                if stored {
                    let buf = self.dirty_mut(i, idx)?;
                    let hi = (to as usize).min(buf.len());
                    if (from as usize) < hi {
                        buf[from as usize..hi].fill(0);
                    }
                }
            }
            pos = idx * cs + to;
            if self.group_full() {
                self.commit_midway(i)?;
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
    pub(crate) fn reserve(&mut self, i: &mut Inode, off: u64, end: u64) -> Result<()> {
        let (plan, need) = self.reserve_plan(i, off, end)?;
        if plan.is_empty() {
            return Ok(());
        }
        // Room for all of it at once, so that the room is made knowing
        // what it is for (asked for in parts, cleaning for the first part
        // copied blocks only points of history held, points dropped for
        // the next part, and the copies took room df had counted free).
        // What the caller changed in `i` (ZERO_RANGE's punch lowered its
        // count) is saved first; the commit may change the file too, so
        // `i` is read back after it.
        if need > self.space_hint.saturating_sub(self.bufs.bytes() as u64) {
            self.save(i);
            if self.pre_write(need as usize)? {
                *i = self.inode(i.ino)?;
            }
        }
        self.group.mark_version(8);
        for (idx, have, want) in plan {
            self.put(extent_key(i.ino, idx), Extent::Reserved(want).encode());
            let more = u64::from(want - have);
            self.group.counters_mut().reserved += more;
            i.alloc += more;
            if self.group_full() {
                self.commit_midway(i)?;
            }
        }
        Ok(())
    }

    /// The chunks [`State::reserve`] reserves, and the bytes they need.
    /// ENOSPC, with nothing changed, as soon as they need more than all
    /// the room a writer could make ([`State::room_with_history`]): a
    /// range larger than the log is not listed chunk by chunk. Past the
    /// room counted first, what is pending is committed, and the list
    /// made again: the commit stores the buffered chunks it left out (an
    /// all-zero one as a hole, to be reserved after all).
    fn reserve_plan(&mut self, i: &mut Inode, off: u64, end: u64) -> Result<(Vec<Reservation>, u64)> {
        let cs = self.cs(i);
        let mut most = None;
        'again: loop {
            let mut plan: Vec<Reservation> = Vec::new();
            let mut need = 0u64;
            for idx in off / cs..end.div_ceil(cs) {
                if self.bufs.get(i.ino, idx).is_some() {
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
                if need <= self.space_hint.saturating_sub(self.bufs.bytes() as u64) {
                    continue;
                }
                let Some(most) = most else {
                    most = Some(self.room_after_commit(i)?);
                    continue 'again;
                };
                if need > most {
                    return Err(Error::NoSpace(format!(
                        "fallocate of {} bytes at {off}: at most {most} bytes of the log can be made free",
                        end - off
                    )));
                }
            }
            return Ok((plan, need));
        }
    }

    /// [`State::room_with_history`] once what is pending is committed,
    /// and durable where it frees blocks (what the group frees counts
    /// then: ZERO_RANGE's punch), counted afresh, less what stays
    /// buffered. What the
    /// caller changed in `i` is saved first, and `i` read back after the
    /// commit, which may change the file too.
    fn room_after_commit(&mut self, i: &mut Inode) -> Result<u64> {
        self.save(i);
        let frees = !self.group.pending().frees.is_empty();
        self.commit()?;
        *i = self.inode(i.ino)?;
        if frees {
            self.eng.sync()?;
        }
        // What points of history hold may have been counted before
        // deletes (committed or not) that they hold.
        self.purgeable_at = None;
        Ok(self.room_with_history()?.saturating_sub(self.bufs.bytes() as u64))
    }

    /// Release the reservations of chunks in `[off, end)` past the size
    /// (left by fallocate with KEEP_SIZE), which a punched hole takes.
    pub(crate) fn unreserve_past_size(&mut self, i: &mut Inode, off: u64, end: u64) -> Result<()> {
        let cs = self.cs(i);
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
    pub(crate) fn set_len(&mut self, i: &mut Inode, size: u64) -> Result<()> {
        if size < i.size {
            let cs = self.cs(i);
            let keep = size.div_ceil(cs);
            if size % cs != 0 {
                let idx = size / cs;
                let has = self.bufs.contains(i.ino, idx) || self.stored_extent(i.ino, idx)?.is_some();
                if has {
                    let buf = self.dirty_mut(i, idx)?;
                    let n = (size - idx * cs) as usize;
                    let cut = buf.len().saturating_sub(n);
                    buf.truncate(n);
                    i.alloc -= cut as u64;
                }
            }
            for idx in self.bufs.chunks_from(i.ino, keep) {
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
                self.commit_midway(i)?;
            }
        }
        if marked {
            self.del(orphan_key(i.ino));
        }
        Ok(())
    }

    /// Finish an orphan record: code 0 deletes the inode, code n > 0
    /// deletes its chunks from n - 1 on.
    pub(crate) fn trim_all(&mut self, ino: Ino, code: u64) -> Result<()> {
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
    pub(crate) fn destroy(&mut self, i: &mut Inode) -> Result<()> {
        for idx in self.bufs.chunks_from(i.ino, 0) {
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
}
