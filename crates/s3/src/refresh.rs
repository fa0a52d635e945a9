//! A reader moving to the writer's newest manifest, and a writer
//! rewriting a segment's uploaded tail.

use super::*;

impl Inner {
    /// A reader's store of the newest manifest, if it is newer than this
    /// one's: it takes over the cache directory (the segments whose
    /// generation and length did not change keep their cached bytes), and
    /// this store retires, reading every byte from the bucket from then
    /// on, so that the engines open on it still see their state.
    pub(super) fn refresh(&self) -> io::Result<Option<Inner>> {
        if self.epoch != 0 {
            return Ok(None);
        }
        if self.retired.load(Ordering::Acquire) {
            return Err(err(
                io::ErrorKind::Other,
                format!("{}: this store was replaced by a newer one: refresh that", self.opts.url),
            ));
        }
        let have = lock(&self.state).manifest.number;
        let newest = match self.remote.manifests()?.last() {
            Some(&n) if n > have => n,
            _ => return Ok(None),
        };
        let m = read_manifest(&self.remote, newest)?;
        let st0 = lock(&self.state);
        if m.image_id != st0.manifest.image_id || m.geometry != self.geometry {
            return Err(err(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: manifest {} is of another image (or another geometry) than manifest {}: the \
                     image was made again; remount",
                    self.opts.url, m.number, st0.manifest.number
                ),
            ));
        }
        drop(st0);
        // No read of the local image in flight, no eviction, while it
        // changes hands.
        let _g = self.gate.write().unwrap_or_else(|p| p.into_inner());
        let st = lock(&self.state);
        let mut segs = Vec::with_capacity(m.segs.len());
        // Cached bytes of states no store reads from now on.
        let mut stale = Vec::new();
        for (i, (old, o)) in st.segs.iter().zip(&m.segs).enumerate() {
            let end = o.end();
            let same = old.gen == o.gen && old.written == end;
            let local_from = if same { old.local_from } else { end };
            if !same && old.written > old.local_from {
                stale.push((i as u32, old.written));
            }
            segs.push(Seg {
                gen: o.gen,
                local_from,
                written: end,
                pieces: o.pieces.clone(),
                last_use: old.last_use,
                dirty: !same && o.gen != 0,
                ..Seg::default()
            });
        }
        for (&i, b) in SLOTS.iter().zip(&m.slots) {
            self.local.write_meta(slot_of(i), b)?;
        }
        self.retired.store(true, Ordering::Release);
        for (seg, upto) in stale {
            if let Err(e) = self.local.discard_prefix(seg, upto) {
                tracing::warn!(
                    "{}: dropping segment {seg}'s cached bytes of an older state: {e}",
                    self.opts.url
                );
            }
        }
        let next_gen = st.next_gen;
        let clock = st.clock;
        drop(st);
        let state = State { segs, freed: Vec::new(), manifest: m, next_gen, meta_dirty: false, clock };
        let counts = (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed));
        Ok(Some(Inner::with_parts(self.parts(), self.opts.clone(), state, (0, self.writer), counts)))
    }

    /// A write at `offset` into bytes the bucket already holds (the log
    /// was recovered short of them): the segment's bytes come local and it
    /// starts a new generation, uploaded whole at the next round.
    pub(super) fn rewrite_tail(&self, seg: u32) -> io::Result<()> {
        // No eviction between the fetch and the new generation.
        let _g = self.gate.read().unwrap_or_else(|p| p.into_inner());
        self.fetch(seg)?;
        let mut st = lock(&self.state);
        let gen = next_gen(&mut st);
        let s = &mut st.segs[seg as usize];
        s.retire();
        s.local_ver += 1;
        s.gen = gen;
        s.local_from = 0;
        s.dirty = true;
        Ok(())
    }
}
