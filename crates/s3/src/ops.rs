//! The store's operations on the cache image and the bucket: reads,
//! writes, syncs, the metadata slots.

use super::*;

impl Inner {
    pub(super) fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        if self.retired.load(Ordering::Acquire) {
            // The local image has a newer store's slots: its own are in
            // its manifest.
            if let Some(j) = SLOTS.iter().position(|&i| slot_of(i) == slot) {
                buf.copy_from_slice(&lock(&self.state).manifest.slots[j]);
                return Ok(());
            }
        }
        self.local.read_meta(slot, buf)
    }

    /// Read `buf` at `offset` of segment `seg` from the local image, as
    /// zeros from `written` on: bytes there are of no generation the store
    /// knows (what a killed process left is punched out at open, but a
    /// file system that cannot punch holes keeps it).
    pub(super) fn read_local(&self, seg: u32, offset: u32, buf: &mut [u8], written: u32) -> io::Result<()> {
        let known = (written.saturating_sub(offset) as usize).min(buf.len());
        self.local.read(seg, offset, &mut buf[..known])?;
        buf[known..].fill(0);
        Ok(())
    }

    pub(super) fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        if self.epoch == 0 {
            return Err(read_only_error());
        }
        self.check_ok()?;
        self.local.write_meta(slot, buf)?;
        lock(&self.state).meta_dirty = true;
        Ok(())
    }

    pub(super) fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        let g = self.geometry;
        if seg >= g.segment_count || u64::from(offset) + buf.len() as u64 > u64::from(g.segment_size) {
            return self.local.read(seg, offset, buf);
        }
        if buf.is_empty() {
            return Ok(());
        }
        let ranged = {
            // No hole punched under a read.
            let _g = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let (how, written) = {
                let mut st = lock(&self.state);
                let retired = self.retired.load(Ordering::Acquire);
                st.clock += 1;
                let now = st.clock;
                let s = &mut st.segs[seg as usize];
                s.last_use = now;
                let how = if retired {
                    let pieces = s.all_pieces();
                    // Past the end of the pieces is no byte of its state:
                    // an error, never the local image's.
                    Miss::Range(s.gen, pieces, u32::MAX)
                } else if offset >= s.local_from {
                    Miss::No
                } else {
                    s.misses += 1;
                    let small_cache = self.opts.cache_bytes < MIN_CACHED_SEGMENTS * u64::from(g.segment_size);
                    if small_cache || (s.misses <= RANGE_READS_BEFORE_FETCH && buf.len() <= RANGE_READ_MAX) {
                        let pieces = s.all_pieces();
                        Miss::Range(s.gen, pieces, s.local_from)
                    } else {
                        Miss::Whole
                    }
                };
                (how, s.written)
            };
            match how {
                Miss::No => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    self.read_local(seg, offset, buf, written)?;
                    Next::Done
                }
                Miss::Range(gen, pieces, local_from) => {
                    // The local part now; the requests without the gate
                    // (pieces never change), so no read waits on them.
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    let end = offset + buf.len() as u32;
                    if end > local_from {
                        let from = local_from.max(offset);
                        self.read_local(seg, from, &mut buf[(from - offset) as usize..], written)?;
                    }
                    Next::Range(gen, pieces, local_from)
                }
                Miss::Whole => {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    self.fetch(seg)?;
                    self.read_local(seg, offset, buf, written)?;
                    Next::Evict
                }
            }
        };
        match ranged {
            Next::Done => Ok(()),
            Next::Range(gen, pieces, local_from) => {
                self.read_range(seg, gen, &pieces, local_from, offset, buf)
            }
            Next::Evict => self.evict().map_err(|e| self.fail(e)),
        }
    }

    pub(super) fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        if self.epoch == 0 {
            return Err(read_only_error());
        }
        self.check_ok()?;
        let g = self.geometry;
        if seg >= g.segment_count || u64::from(offset) + data.len() as u64 > u64::from(g.segment_size) {
            return self.local.write(seg, offset, data);
        }
        let (new_gen, refetch) = {
            let mut st = lock(&self.state);
            let gen = if offset == 0 { Some(next_gen(&mut st)) } else { None };
            let s = &mut st.segs[seg as usize];
            if let Some(gen) = gen {
                s.retire();
                let local_ver = s.local_ver + 1;
                *s = Seg { gen, old: std::mem::take(&mut s.old), local_ver, dirty: true, ..Seg::default() };
                (true, false)
            } else {
                (false, offset < s.sent_end())
            }
        };
        if refetch {
            self.rewrite_tail(seg)?;
        }
        // The record names a new generation before the local image holds
        // a byte of it: a process killed before its next sync must not
        // leave bytes of it in a segment the record (and so the next open)
        // takes for the older one, which the bucket has.
        if refetch {
            self.persist_entries().map_err(|e| self.fail(e))?;
        } else if new_gen {
            self.persist_empty(seg).map_err(|e| self.fail(e))?;
        }
        self.local.write(seg, offset, data)?;
        let mut st = lock(&self.state);
        st.clock += 1;
        let now = st.clock;
        let s = &mut st.segs[seg as usize];
        s.written = s.written.max(offset + data.len() as u32);
        s.last_use = now;
        s.dirty = true;
        Ok(())
    }

    pub(super) fn sync(&self) -> io::Result<()> {
        self.check_ok()?;
        if self.epoch == 0 {
            return Ok(());
        }
        self.persist_entries().map_err(|e| self.fail(e))?;
        let inline = match self.opts.sync {
            SyncMode::Remote => true,
            // Back-pressure: past the backlog allowed, a sync waits for
            // the uploads.
            SyncMode::Local => self.backlog() > self.opts.max_backlog,
        };
        if inline {
            self.round(false).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    pub(super) fn discard(&self, _seg: u32) -> io::Result<()> {
        Ok(())
    }

    pub(super) fn sealed(&self, seg: u32) {
        if let Some(s) = lock(&self.state).segs.get_mut(seg as usize) {
            s.sealed = true;
        }
        self.ring();
    }

    pub(super) fn remote_stats(&self) -> Option<RemoteStats> {
        let c = &self.remote.counters;
        let st = lock(&self.state);
        let backlog = st.segs.iter().map(|s| u64::from(s.written.saturating_sub(s.sent_end()))).sum();
        Some(RemoteStats {
            puts: c.puts.load(Ordering::Relaxed),
            gets: c.gets.load(Ordering::Relaxed),
            lists: c.lists.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            bytes_up: c.bytes_up.load(Ordering::Relaxed),
            bytes_down: c.bytes_down.load(Ordering::Relaxed),
            cache_hits: self.hits.load(Ordering::Relaxed),
            cache_misses: self.misses.load(Ordering::Relaxed),
            backlog_bytes: backlog,
            failed_attempts: c.failed_attempts.load(Ordering::Relaxed),
            manifest: st.manifest.number,
        })
    }
}
