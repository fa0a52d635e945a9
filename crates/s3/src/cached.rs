//! The cache directory's segments: eviction past the cache's size, and
//! reads of what it lacks (a ranged request, or the whole segment).

use super::*;

impl Inner {
    /// Drop the least recently used segments the bucket holds whole until
    /// the cache is within its budget. The record says so (durably)
    /// before the bytes go, and only the bytes chosen go: `[0, written)`
    /// of a generation nobody changed meanwhile (an append lands past
    /// them; a fetch or a new generation makes the segment be skipped).
    /// Freed segments' bytes go too.
    pub(super) fn evict(&self) -> io::Result<()> {
        if self.retired.load(Ordering::Acquire) {
            return Ok(());
        }
        let victims: Vec<(u32, u64, u32)> = {
            let mut st = lock(&self.state);
            let mut out = std::mem::take(&mut st.freed);
            let cached: u64 = st.segs.iter().map(|s| u64::from(s.written.saturating_sub(s.local_from))).sum();
            if cached > self.opts.cache_bytes {
                let mut clean: Vec<(u64, u32)> = st
                    .segs
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.written > s.local_from && s.written == s.uploaded())
                    .map(|(i, s)| (s.last_use, i as u32))
                    .collect();
                clean.sort_unstable();
                let mut over = cached - self.opts.cache_bytes;
                for (_, seg) in clean {
                    if over == 0 {
                        break;
                    }
                    let s = &mut st.segs[seg as usize];
                    over = over.saturating_sub(u64::from(s.written - s.local_from));
                    s.local_from = s.written;
                    s.local_ver += 1;
                    s.dirty = true;
                    out.push((seg, s.local_ver, s.written));
                }
            }
            out
        };
        self.punch(victims)
    }

    /// Punch out `[0, upto)` of each segment of `victims` (segment,
    /// `local_ver` when chosen, `upto`) that nothing changed since: the
    /// record says so (durably) first.
    pub(super) fn punch(&self, victims: Vec<(u32, u64, u32)>) -> io::Result<()> {
        if victims.is_empty() {
            return Ok(());
        }
        self.persist_entries()?;
        let _g = self.gate.write().unwrap_or_else(|p| p.into_inner());
        if self.retired.load(Ordering::Acquire) {
            // The local image is a newer store's now.
            return Ok(());
        }
        let st = lock(&self.state);
        for (seg, ver, upto) in victims {
            let s = &st.segs[seg as usize];
            // Evicted: nothing came local since (an append lands past
            // `upto`); freed: not written again.
            if s.local_ver == ver && (s.local_from == upto || s.written == 0) {
                self.local.discard_prefix(seg, upto)?;
            }
        }
        Ok(())
    }

    /// The engine needs nothing of segment `seg` any more: its pieces go
    /// (after the next manifest, and `keep_replaced`), its cached bytes at
    /// the next eviction.
    pub(super) fn freed(&self, seg: u32) {
        if self.epoch == 0 {
            return;
        }
        let mut st = lock(&self.state);
        match st.segs.get(seg as usize) {
            Some(s) if s.written > 0 || s.sent_end() > 0 => {}
            _ => return,
        }
        // A new generation, with nothing in it: an upload of the old one
        // still in flight is then known as stale when it lands.
        let gen = next_gen(&mut st);
        let s = &mut st.segs[seg as usize];
        s.retire();
        let local_ver = s.local_ver + 1;
        *s = Seg { gen, old: std::mem::take(&mut s.old), local_ver, dirty: true, ..Seg::default() };
        // All of it: bytes of an earlier, longer generation may be there.
        st.freed.push((seg, local_ver, self.geometry.segment_size));
        // The next manifest differs: a round is due.
        st.meta_dirty = true;
    }

    /// Bring segment `seg`'s bytes from the bucket into the local image.
    pub(super) fn fetch(&self, seg: u32) -> io::Result<()> {
        let (gen, pieces, local_from) = {
            let st = lock(&self.state);
            let s = &st.segs[seg as usize];
            (s.gen, s.pieces.clone(), s.local_from)
        };
        let want: Vec<Piece> = pieces.into_iter().filter(|p| p.offset < local_from).collect();
        let keys: Vec<_> = want.iter().map(|p| self.remote.piece_key(seg, gen, p)).collect();
        let bodies = self.remote.get_many(&keys)?;
        let mut st = lock(&self.state);
        let s = &mut st.segs[seg as usize];
        if s.gen != gen {
            return Ok(());
        }
        for (p, body) in want.iter().zip(&bodies) {
            if body.len() != p.len as usize {
                return Err(err(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: piece {} is {} bytes, the manifest says {}",
                        self.opts.url,
                        self.remote.piece_key(seg, gen, p).as_ref(),
                        body.len(),
                        p.len
                    ),
                ));
            }
            self.local.write(seg, p.offset, body)?;
        }
        s.local_from = s.local_from.min(want.first().map_or(s.local_from, |p| p.offset));
        s.local_ver += 1;
        s.misses = 0;
        s.dirty = true;
        Ok(())
    }

    /// Fill the part of `buf` (read at `offset` of segment `seg`) below
    /// `local_from` with ranged requests to `pieces` of generation `gen`;
    /// nothing is cached.
    pub(super) fn read_range(
        &self,
        seg: u32,
        gen: u64,
        pieces: &[Piece],
        local_from: u32,
        offset: u32,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let remote_end = (offset + buf.len() as u32).min(local_from);
        let mut got = 0u32;
        for p in pieces.iter().filter(|p| p.offset < remote_end && p.end() > offset) {
            let (a, b) = (p.offset.max(offset), p.end().min(remote_end));
            let key = self.remote.piece_key(seg, gen, p);
            let data = self.remote.get(&key, Some(u64::from(a - p.offset)..u64::from(b - p.offset)))?;
            if data.len() != (b - a) as usize {
                return Err(err(
                    io::ErrorKind::InvalidData,
                    format!("{}: piece {} is shorter than the manifest says", self.opts.url, key.as_ref()),
                ));
            }
            buf[(a - offset) as usize..(b - offset) as usize].copy_from_slice(&data);
            got += b - a;
        }
        if got != remote_end.saturating_sub(offset) {
            return Err(err(
                io::ErrorKind::InvalidData,
                format!("{}: segment {seg}: no piece holds bytes {offset}..{remote_end}", self.opts.url),
            ));
        }
        Ok(())
    }
}
