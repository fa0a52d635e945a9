//! Making and opening an image in a bucket: the first manifest, the
//! latest one, the cache directory trusted or made afresh, and the claim
//! that fences a stale writer.

use super::*;

impl Inner {
    /// Make a new, empty image at `opts.url` (which must hold none) with
    /// `geometry`; the engine's mkfs then writes it.
    pub(super) fn create(opts: S3Options, geometry: Geometry) -> io::Result<Inner> {
        if geometry.segment_count > manifest::MAX_SEGMENTS {
            return Err(err(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} segments: an image in a bucket has at most {} (use larger segments or a smaller size)",
                    geometry.segment_count,
                    manifest::MAX_SEGMENTS
                ),
            ));
        }
        let remote = Remote::new(&opts.url, opts.endpoint.as_deref(), opts.retry_for)?;
        if let Some(n) = remote.manifests()?.last() {
            return Err(err(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} already holds a zlogfs image (manifest {n}): use another prefix, or delete its \
                     objects first",
                    opts.url
                ),
            ));
        }
        if let Some((_, h)) = CacheFile::open(&record_path(&opts.cache_dir))? {
            if h.epoch != 0 {
                return Err(err(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "cache directory {} holds the cache of another image: give another --cache, or \
                         delete it",
                        opts.cache_dir.display()
                    ),
                ));
            }
        }
        let image_id: [u8; 16] = rand::random();
        let m = Manifest::new(0, image_id, geometry);
        let writer = new_writer_id();
        let (local, cache) = fresh_cache(&opts.cache_dir, &m, 1, writer)?;
        let segs = vec![Seg::default(); geometry.segment_count as usize];
        Ok(Inner::assemble(remote, local, cache, opts, m, segs, (1, writer)))
    }

    /// Open the image at `opts.url`: read its newest manifest, reuse the
    /// cache directory when it holds this image's newest state (else
    /// rebuild it), and unless read-only, claim the image (see the crate
    /// documentation) and upload what the cache held that the bucket
    /// lacked.
    pub(super) fn open(opts: S3Options) -> io::Result<Inner> {
        let mut last = None;
        for _ in 0..3 {
            match Inner::open_once(opts.clone()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => last = Some(e),
                r => return r,
            }
        }
        Err(last.unwrap_or_else(|| err(io::ErrorKind::Other, "claiming the image failed".into())))
    }

    pub(super) fn open_once(opts: S3Options) -> io::Result<Inner> {
        let remote = Remote::new(&opts.url, opts.endpoint.as_deref(), opts.retry_for)?;
        let m = latest_manifest(&remote)?;
        let epoch = match (opts.read_only, m.number.checked_add(1)) {
            (true, _) => 0,
            (false, Some(n)) => n,
            (false, None) => {
                return Err(err(
                    io::ErrorKind::InvalidData,
                    format!("{}: manifest {} is the last", opts.url, m.number),
                ))
            }
        };
        let writer = new_writer_id();
        // Read-only too: a cache that holds what the bucket lacks is read,
        // never rebuilt over.
        let kept = trusted_cache(&opts.cache_dir, &m)?;
        let (local, cache, segs) = match kept {
            Some(k) => k,
            None => {
                // A reader's cache (epoch 0) is never trusted by a writer.
                let (ce, cw) = if opts.read_only { (0, 0) } else { (m.epoch, m.writer) };
                let (local, cache) = fresh_cache(&opts.cache_dir, &m, ce, cw)?;
                let segs = segs_from(&m, &cache)?;
                (local, cache, segs)
            }
        };
        let s = Inner::assemble(remote, local, cache, opts, m, segs, (epoch, writer));
        if epoch != 0 {
            if let Err(e) = s.claim() {
                // Nothing more goes to the bucket from this one (not even
                // at drop).
                s.latch(&e.to_string());
                return Err(e);
            }
        }
        Ok(s)
    }

    pub(super) fn assemble(
        remote: Remote,
        local: FileStore,
        cache: CacheFile,
        opts: S3Options,
        manifest: Manifest,
        segs: Vec<Seg>,
        (epoch, writer): (u64, u64),
    ) -> Inner {
        // Generations only grow: past every one the bucket or the cache
        // knows, and (a writer's) from its epoch in the high 32 bits up, so
        // that one a manifest never named (an emptied segment's) is not
        // given again by a later writer that lost the cache.
        let top = segs.iter().flat_map(|s| std::iter::once(s.gen).chain(s.old.iter().map(|o| o.0))).max();
        let known = top.unwrap_or(0).max(manifest.segs.iter().map(|s| s.gen).max().unwrap_or(0));
        let next_gen = (known + 1).max(epoch << 32);
        let state = State { segs, freed: Vec::new(), manifest, next_gen, meta_dirty: false, clock: 0 };
        let parts = CacheParts {
            remote: Arc::new(remote),
            local: Arc::new(local),
            cache: Arc::new(cache),
            persist: Arc::new(Mutex::new(())),
            gate: Arc::new(RwLock::new(())),
        };
        Inner::with_parts(parts, opts, state, (epoch, writer), (0, 0))
    }

    /// A store of `state` on `parts` (its own, or shared with the store
    /// it replaces), its cache counters starting at `(hits, misses)`.
    pub(super) fn with_parts(
        parts: CacheParts,
        opts: S3Options,
        state: State,
        (epoch, writer): (u64, u64),
        (hits, misses): (u64, u64),
    ) -> Inner {
        let CacheParts { remote, local, cache, persist, gate } = parts;
        Inner {
            remote,
            local,
            cache,
            opts,
            geometry: state.manifest.geometry,
            epoch,
            writer,
            state: Mutex::new(state),
            round: Mutex::new(()),
            persist,
            gate,
            retired: AtomicBool::new(false),
            doomed: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            hits: AtomicU64::new(hits),
            misses: AtomicU64::new(misses),
            wake: (Mutex::new((false, false)), Condvar::new()),
        }
    }

    /// The cache directory and the client, to share with a newer store.
    pub(super) fn parts(&self) -> CacheParts {
        CacheParts {
            remote: Arc::clone(&self.remote),
            local: Arc::clone(&self.local),
            cache: Arc::clone(&self.cache),
            persist: Arc::clone(&self.persist),
            gate: Arc::clone(&self.gate),
        }
    }

    /// Create the next manifest as this writer's: from then on, an older
    /// writer's next round fails. Then delete what crashed or fenced
    /// writers left unreferenced.
    pub(super) fn claim(&self) -> io::Result<()> {
        self.persist_entries()?;
        match self.round(true) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Someone else claimed the same number: start over.
                return Err(err(io::ErrorKind::Interrupted, format!("{e}")));
            }
            Err(e) => return Err(e),
        }
        let m = lock(&self.state).manifest.clone();
        self.cache.write_header(Header {
            image_id: m.image_id,
            epoch: self.epoch,
            writer: self.writer,
            segment_count: self.geometry.segment_count,
        })?;
        self.cache.sync()?;
        if let Err(e) = self.collect_garbage(&m) {
            tracing::warn!("{}: removing unreferenced objects: {e}", self.opts.url);
        }
        Ok(())
    }
}

/// The newest manifest in the bucket.
pub(super) fn latest_manifest(remote: &Remote) -> io::Result<Manifest> {
    let Some(&n) = remote.manifests()?.last() else {
        return Err(err(
            io::ErrorKind::NotFound,
            format!("{} holds no zlogfs image (make one with `zlogfs mkfs {}`)", remote.url(), remote.url()),
        ));
    };
    read_manifest(remote, n)
}

/// Manifest number `n`, checked.
pub(super) fn read_manifest(remote: &Remote, n: u64) -> io::Result<Manifest> {
    let bytes = remote.get(&remote.manifest_key(n), None)?;
    let m = Manifest::decode(&bytes)
        .map_err(|e| err(io::ErrorKind::InvalidData, format!("{}: manifest {n}: {e}", remote.url())))?;
    if m.number != n {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("{}: manifest {n} says it is number {}", remote.url(), m.number),
        ));
    }
    Ok(m)
}

pub(super) fn image_path(dir: &Path) -> PathBuf {
    dir.join("image")
}

pub(super) fn record_path(dir: &Path) -> PathBuf {
    dir.join("state")
}

/// A new local image for the image of manifest `m`: its metadata slots
/// from `m`, every segment in the bucket.
pub(super) fn fresh_cache(
    dir: &Path,
    m: &Manifest,
    epoch: u64,
    writer: u64,
) -> io::Result<(FileStore, CacheFile)> {
    std::fs::create_dir_all(dir)
        .map_err(|e| err(e.kind(), format!("cache directory {}: {e}", dir.display())))?;
    // The old record goes first: a crash while the image is made again
    // must not leave a record that trusts it.
    CacheFile::remove(&record_path(dir)).map_err(|e| cache_error(dir, e))?;
    let local = FileStore::create(image_path(dir), m.geometry).map_err(|e| cache_error(dir, e))?;
    for (&i, b) in SLOTS.iter().zip(&m.slots) {
        local.write_meta(slot_of(i), b)?;
    }
    local.sync()?;
    let h = Header { image_id: m.image_id, epoch, writer, segment_count: m.geometry.segment_count };
    let cache = CacheFile::create(&record_path(dir), h)?;
    Ok((local, cache))
}

pub(super) fn cache_error(dir: &Path, e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        return err(
            e.kind(),
            format!(
                "cache directory {} is in use (the image is mounted or open in another zlogfs command): \
                 use its mount point, or give another --cache",
                dir.display()
            ),
        );
    }
    err(e.kind(), format!("cache directory {}: {e}", dir.display()))
}

/// Segments as manifest `m` has them, none local; recorded so.
pub(super) fn segs_from(m: &Manifest, cache: &CacheFile) -> io::Result<Vec<Seg>> {
    let mut segs = Vec::with_capacity(m.segs.len());
    for (i, o) in m.segs.iter().enumerate() {
        let end = o.end();
        let s = Seg { gen: o.gen, local_from: end, written: end, pieces: o.pieces.clone(), ..Seg::default() };
        if o.gen != 0 {
            cache.set_entry(i as u32, s.entry())?;
        }
        segs.push(s);
    }
    cache.sync()?;
    Ok(segs)
}

/// The cache directory's image and record when they hold this image's
/// newest state: the record names the image and the writer of manifest
/// `m`, and each segment agrees with it. None otherwise (rebuild).
pub(super) fn trusted_cache(
    dir: &Path,
    m: &Manifest,
) -> io::Result<Option<(FileStore, CacheFile, Vec<Seg>)>> {
    let Some((cache, h)) = CacheFile::open(&record_path(dir))? else { return Ok(None) };
    if h.image_id != m.image_id {
        return Err(err(
            io::ErrorKind::AlreadyExists,
            format!(
                "cache directory {} holds the cache of another image: give another --cache, or delete it",
                dir.display()
            ),
        ));
    }
    // Only the cache of the writer that wrote the newest manifest holds
    // its newest state (a reader's cache has epoch 0).
    let ours = h.epoch != 0 && h.epoch == m.epoch && h.writer == m.writer;
    if !ours || h.segment_count != m.geometry.segment_count {
        if h.epoch != 0 {
            tracing::warn!(
                "{}: another writer (epoch {}) wrote after this cache's (epoch {}): what only this cache \
                 held is dropped",
                dir.display(),
                m.epoch,
                h.epoch
            );
        }
        return Ok(None);
    }
    let disagree = |what: String| {
        err(
            io::ErrorKind::InvalidData,
            format!(
                "cache directory {}: {what}; if the bucket holds everything (the last writer closed \
                 cleanly, or synced with sync=remote), delete the directory to rebuild it from the bucket",
                dir.display()
            ),
        )
    };
    let local = FileStore::open(image_path(dir)).and_then(|f| f.with_geometry(m.geometry)).map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            cache_error(dir, e)
        } else {
            disagree(format!("its image: {e}"))
        }
    })?;
    let size = m.geometry.segment_size;
    let mut segs = Vec::with_capacity(m.segs.len());
    for (i, o) in m.segs.iter().enumerate() {
        let e = cache.entry(i as u32)?;
        if e.written > size || e.local_from > size {
            return Err(disagree(format!("segment {i}'s record is out of range")));
        }
        let s = if e.gen == o.gen && e.local_from <= o.end() {
            // Bytes past what the record says were written are in the
            // bucket only.
            let local_from = if e.written >= o.end() { e.local_from } else { o.end() };
            Seg {
                gen: o.gen,
                local_from,
                written: e.written.max(o.end()),
                pieces: o.pieces.clone(),
                ..Seg::default()
            }
        } else if e.gen > o.gen && e.local_from == 0 {
            let old = if o.pieces.is_empty() { vec![] } else { vec![(o.gen, o.pieces.clone())] };
            Seg { gen: e.gen, local_from: 0, written: e.written, old, ..Seg::default() }
        } else if e.gen > o.gen && o.pieces.is_empty() {
            // Emptied (the engine freed it) by a round whose manifest is
            // in the bucket, before the record said so: nothing of it is
            // needed.
            Seg { gen: e.gen, dirty: true, ..Seg::default() }
        } else if e.gen < o.gen {
            // A round named a generation the record had not caught up
            // with when the process died: no sync covered it (each one
            // records every changed entry first), so the bucket's is the
            // state to go on from.
            let end = o.end();
            Seg {
                gen: o.gen,
                local_from: end,
                written: end,
                pieces: o.pieces.clone(),
                dirty: true,
                ..Seg::default()
            }
        } else {
            return Err(disagree(format!("segment {i} disagrees with the bucket")));
        };
        // Bytes past `written` are what a process killed before its next
        // sync put there (the record is written after the local image is
        // synced): no sync vouched for them and the bucket lacks them, so
        // they go, and recovery finds the state the bucket will hold.
        if s.written < size {
            local.discard_range(i as u32, s.written, size - s.written).map_err(|e| cache_error(dir, e))?;
        }
        segs.push(s);
    }
    Ok(Some((local, cache, segs)))
}
