//! Uploads: the cache record's entries, upload rounds (pieces, then the
//! manifest that commits them), merging a sealed segment's pieces, the
//! uploader thread of sync=local, and deleting what no manifest names.

use super::*;

impl Inner {
    /// Delete, `keep_replaced` from now, pieces the newest manifest does
    /// not name that older writers left (replaced pieces not yet deleted,
    /// a crash between pieces and manifest, a fenced writer's uploads).
    /// Newer writers' pieces are never touched.
    pub(super) fn collect_garbage(&self, m: &Manifest) -> io::Result<()> {
        let mut dead = Vec::new();
        for key in self.remote.list("seg")? {
            let Some((seg, gen, p)) = self.remote.parse_piece(&key) else { continue };
            let used = m.segs.get(seg as usize).is_some_and(|s| {
                s.gen == gen
                    && s.pieces.iter().any(|q| (q.offset, q.epoch, q.writer) == (p.offset, p.epoch, p.writer))
            });
            // Older writers', and those of one that lost the claim of this
            // writer's epoch.
            let stale = p.epoch < self.epoch || (p.epoch == self.epoch && p.writer != self.writer);
            if !used && stale {
                dead.push(key);
            }
        }
        if !dead.is_empty() {
            // Readers may still be on the manifest that named some of them.
            tracing::info!("{}: {} unreferenced pieces, deleted in a while", self.opts.url, dead.len());
            self.doom(dead);
        }
        Ok(())
    }

    /// Write the cache record entries that changed. They are taken
    /// first, then the local image is synced, then they are written: an
    /// entry never claims bytes that are not durable. One call at a time,
    /// so that none returns before the entries another one took are
    /// written; on failure the entries are marked again.
    pub(super) fn persist_entries(&self) -> io::Result<()> {
        let _p = lock(&self.persist);
        let dirty: Vec<(u32, Entry)> = {
            let mut st = lock(&self.state);
            st.segs
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| s.dirty)
                .map(|(i, s)| {
                    s.dirty = false;
                    (i as u32, s.entry())
                })
                .collect()
        };
        if dirty.is_empty() {
            return self.local.sync();
        }
        let r = self.local.sync().and_then(|()| {
            for &(seg, e) in &dirty {
                self.cache.set_entry(seg, e)?;
            }
            self.cache.sync()
        });
        if r.is_err() {
            let mut st = lock(&self.state);
            for (seg, _) in dirty {
                st.segs[seg as usize].dirty = true;
            }
        }
        r
    }

    /// Record segment `seg`'s entry alone, now: a new generation with
    /// nothing written yet vouches for no byte, so unlike
    /// [`Inner::persist_entries`] the local image needs no sync first.
    pub(super) fn persist_empty(&self, seg: u32) -> io::Result<()> {
        let p = lock(&self.persist);
        let e = lock(&self.state).segs[seg as usize].entry();
        if e.written != 0 {
            drop(p);
            return self.persist_entries();
        }
        self.cache.set_entry(seg, e)?;
        self.cache.sync()
    }

    /// Upload every byte the bucket lacks, then the next manifest (when
    /// something is missing, or `force`). Taking the round lock first
    /// means a round another thread began, which may carry what the
    /// caller synced, has ended.
    pub(super) fn round(&self, force: bool) -> io::Result<()> {
        let _r = lock(&self.round);
        self.check_ok()?;
        if !force && !self.behind() {
            return Ok(());
        }
        let (next, uploads, deletes) = self.cut()?;
        self.put_pieces(&uploads)?;
        let key = self.remote.manifest_key(next.number);
        // A manifest above this one means another writer took over, even
        // if this number was free (deleted as old).
        if self.remote.put_create(&key, next.encode())? == Created::Taken
            || self.remote.manifest_after(next.number)?
        {
            return Err(err(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{}: another writer took over the image (it wrote manifest {} first); this one \
                     stops here: remount to go on from the newest state",
                    self.opts.url, next.number
                ),
            ));
        }
        self.committed(next, &uploads);
        self.after_commit(deletes);
        Ok(())
    }

    /// What a round uploads: the bytes each segment's generation has that
    /// the bucket lacks, and the manifest that will name them.
    pub(super) fn cut(&self) -> io::Result<(Manifest, Vec<Upload>, Vec<object_store::path::Path>)> {
        // The slots and the segments as of one moment: under the lock.
        let mut st = lock(&self.state);
        let mut slots = Vec::with_capacity(SLOTS.len());
        for &i in &SLOTS {
            let mut b = [0u8; META_SLOT_SIZE];
            self.local.read_meta(slot_of(i), &mut b)?;
            slots.push(b);
        }
        st.meta_dirty = false;
        let mut next = st.manifest.clone();
        next.number += 1;
        next.epoch = self.epoch;
        next.writer = self.writer;
        next.slots = slots;
        let mut uploads = Vec::new();
        let mut deletes = self.merge_sealed(&mut st);
        for (i, s) in st.segs.iter_mut().enumerate() {
            let seg = i as u32;
            for (gen, pieces) in s.old.drain(..) {
                deletes.extend(pieces.iter().map(|p| self.remote.piece_key(seg, gen, p)));
            }
            let from = s.sent_end();
            let mut pieces = s.all_pieces();
            if s.written > from {
                let mut data = vec![0u8; (s.written - from) as usize];
                self.local.read(seg, from, &mut data)?;
                let piece =
                    Piece { offset: from, len: s.written - from, epoch: self.epoch, writer: self.writer };
                pieces.push(piece);
                uploads.push(Upload { seg, gen: s.gen, piece, data });
            }
            next.segs[i] = SegObjects { gen: s.gen, pieces };
        }
        Ok((next, uploads, deletes))
    }

    /// Sealed segments in more than [`MAX_PIECES`] pieces get a new
    /// generation with none, so that the round uploads each whole, as one
    /// object; their bytes stay the same. Returns the pieces they leave,
    /// to go once the round's manifest is in the bucket. (A new
    /// generation rather than a new piece of the old one: a piece's name
    /// has its offset, not its length, so a whole piece from offset 0
    /// would take the name of the first one.)
    ///
    /// One segment per round: under sync=remote the round is part of an
    /// fsync, which then uploads at most one segment more.
    pub(super) fn merge_sealed(&self, st: &mut State) -> Vec<object_store::path::Path> {
        let mut deletes = Vec::new();
        if let Some(i) = st.segs.iter().position(merges) {
            let gen = next_gen(st);
            let s = &mut st.segs[i];
            deletes.extend(s.all_pieces().iter().map(|p| self.remote.piece_key(i as u32, s.gen, p)));
            s.gen = gen;
            s.pieces.clear();
            s.sent.clear();
            // The record follows (else a reopen fetches what is local).
            s.dirty = true;
        }
        deletes
    }

    /// The manifest `m` is in the bucket: the pieces it names are.
    pub(super) fn committed(&self, m: Manifest, uploads: &[Upload]) {
        let mut st = lock(&self.state);
        for (s, o) in st.segs.iter_mut().zip(&m.segs) {
            if s.gen == o.gen {
                s.pieces.clone_from(&o.pieces);
                s.sent.clear();
            }
        }
        for u in uploads {
            let s = &mut st.segs[u.seg as usize];
            if s.gen != u.gen {
                // Written again from 0 meanwhile: the piece goes at the
                // next manifest.
                s.old.push((u.gen, vec![u.piece]));
            }
        }
        st.manifest = m;
    }

    /// Create the pieces of `uploads`, a few at once. A name already taken
    /// with other bytes means another writer took over.
    pub(super) fn put_pieces(&self, uploads: &[Upload]) -> io::Result<()> {
        for chunk in uploads.chunks(UPLOAD_BATCH) {
            let items = chunk
                .iter()
                .map(|u| (self.remote.piece_key(u.seg, u.gen, &u.piece), u.data.clone()))
                .collect();
            let created = self.remote.put_many(items)?;
            if let Some(i) = created.iter().position(|c| *c == Created::Taken) {
                let u = &chunk[i];
                return Err(err(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{}: piece {:?} was written by another writer: this writer was fenced off",
                        self.opts.url,
                        self.remote.piece_key(u.seg, u.gen, &u.piece).as_ref()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Upload the bytes of sealed segments the bucket lacks, without a
    /// manifest: the next round's manifest names them. So that a full
    /// segment goes up whole, in one request, as soon as it is full.
    pub(super) fn upload_sealed(&self) -> io::Result<()> {
        let _r = lock(&self.round);
        self.check_ok()?;
        let uploads: Vec<Upload> = {
            let st = lock(&self.state);
            let mut v = Vec::new();
            // Those a round merges wait for it (their bytes go up once).
            let due = |s: &Seg| s.sealed && s.written > s.sent_end() && !merges(s);
            for (i, s) in st.segs.iter().enumerate().filter(|(_, s)| due(s)) {
                let from = s.sent_end();
                let mut data = vec![0u8; (s.written - from) as usize];
                self.local.read(i as u32, from, &mut data)?;
                let piece =
                    Piece { offset: from, len: s.written - from, epoch: self.epoch, writer: self.writer };
                v.push(Upload { seg: i as u32, gen: s.gen, piece, data });
            }
            v
        };
        self.put_pieces(&uploads)?;
        let mut st = lock(&self.state);
        for u in uploads {
            let s = &mut st.segs[u.seg as usize];
            if s.gen == u.gen && s.sent_end() == u.piece.offset {
                s.sent.push(u.piece);
            } else {
                s.old.push((u.gen, vec![u.piece]));
            }
        }
        Ok(())
    }

    /// Delete old manifests, and what manifests stopped naming
    /// `keep_replaced` ago (`deletes` now stop); then keep the cache
    /// within its budget. Failures only leave garbage (collected at the
    /// next claim): they are logged.
    pub(super) fn after_commit(&self, deletes: Vec<object_store::path::Path>) {
        let n = lock(&self.state).manifest.number;
        let mut due = Vec::new();
        if n > KEEP_MANIFESTS {
            due.push(self.remote.manifest_key(n - KEEP_MANIFESTS));
        }
        self.doom(deletes);
        due.extend(self.take_due());
        self.delete_unreferenced(due);
        if let Err(e) = self.evict() {
            tracing::error!("{}: trimming the cache: {}", self.opts.url, self.fail(e));
        }
    }

    /// `keys` are named by no manifest from now on: deleted once
    /// `keep_replaced` has passed.
    pub(super) fn doom(&self, keys: Vec<object_store::path::Path>) {
        if !keys.is_empty() {
            lock(&self.doomed).push((Instant::now(), keys));
        }
    }

    /// What [`Inner::doom`] was given `keep_replaced` ago or earlier.
    pub(super) fn take_due(&self) -> Vec<object_store::path::Path> {
        let mut doomed = lock(&self.doomed);
        let keep = self.opts.keep_replaced;
        let ripe = doomed.iter().take_while(|(t, _)| t.elapsed() >= keep).count();
        doomed.drain(..ripe).flat_map(|(_, d)| d).collect()
    }

    /// Delete `keys`, which no manifest names any more; a failure only
    /// leaves garbage (collected at the next claim): logged.
    pub(super) fn delete_unreferenced(&self, keys: Vec<object_store::path::Path>) {
        if keys.is_empty() {
            return;
        }
        if let Err(e) = self.remote.delete(keys) {
            tracing::warn!("{}: deleting objects no longer referenced: {e}", self.opts.url);
        }
    }

    /// Whether the bucket lacks something the cache holds (or holds a
    /// sealed segment in pieces a round merges).
    pub(super) fn behind(&self) -> bool {
        let st = lock(&self.state);
        st.meta_dirty || st.segs.iter().any(|s| s.written > s.uploaded() || merges(s))
    }

    /// Bytes the cache holds that the bucket lacks.
    pub(super) fn backlog(&self) -> u64 {
        lock(&self.state).segs.iter().map(|s| u64::from(s.written.saturating_sub(s.sent_end()))).sum()
    }

    /// Upload what the bucket lacks, now; a failure latches the store.
    pub(super) fn catch_up(&self) -> io::Result<()> {
        self.check_ok()?;
        if self.epoch == 0 || !self.behind() {
            return Ok(());
        }
        self.persist_entries().and_then(|()| self.round(false)).map_err(|e| self.fail(e))
    }

    pub(super) fn ring(&self) {
        lock(&self.wake.0).1 = true;
        self.wake.1.notify_one();
    }

    /// The uploader thread (sync=local): a round when a segment is sealed
    /// and every `upload_every`, until told to stop.
    pub(super) fn upload_loop(&self) {
        let every = self.opts.upload_every;
        let mut last = std::time::Instant::now();
        let mut bell = lock(&self.wake.0);
        loop {
            if bell.0 {
                return;
            }
            if !bell.1 {
                let wait = every.saturating_sub(last.elapsed());
                bell = match self.wake.1.wait_timeout(bell, wait) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
            if bell.0 || self.failed.load(Ordering::Acquire) {
                return;
            }
            bell.1 = false;
            drop(bell);
            // On time: a round with a manifest, and the deletions due
            // (which a round makes too, but an idle writer makes none);
            // else (rung by a sealed segment) that segment's bytes only.
            let r = if last.elapsed() >= every {
                last = std::time::Instant::now();
                let r = self.catch_up();
                self.delete_unreferenced(self.take_due());
                r
            } else {
                self.upload_sealed().map_err(|e| self.fail(e))
            };
            if let Err(e) = r {
                tracing::error!("{}: uploading: {e}", self.opts.url);
            }
            bell = lock(&self.wake.0);
        }
    }
}
