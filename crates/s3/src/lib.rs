//! An image whose segments live in an S3-compatible bucket.
//!
//! The log's store contract (append inside a segment, never rewrite it
//! until it is written again from offset 0) lets each upload be an
//! immutable object: a *piece* of a segment's generation, created only if
//! absent. Every write lands first in a local cache directory (a sparse
//! image file of the same geometry plus a record of what it holds), which
//! keeps the open tail of the log durable and serves reads; uploads
//! happen at sync points. After the pieces of an upload round, a numbered
//! *manifest* (the metadata slots and the piece table) is created only if
//! absent: that one conditional put commits the round, and it fences
//! writers, since of two that read manifest `n` only one creates `n + 1`.
//! A writer claims the image at open by creating the next manifest; its
//! number is the writer's epoch, part of every piece name it uploads, so a
//! stale writer's uploads never collide with the new one's, and its next
//! manifest fails: it latches with a message.
//!
//! Sync modes ([`SyncMode`]): `local` makes a sync durable in the cache
//! directory and uploads when a segment is sealed and at checkpoints;
//! `remote` uploads at every sync. docs/SEMANTICS.md states what each
//! keeps across a crash, and docs/FORMAT.md §10 the objects' bytes.
//!
//! sync=local uploads in a thread (`upload_loop`), with back-pressure on
//! syncs past `max_backlog`. A sealed segment in more than `MAX_PIECES`
//! pieces gets a new generation at a later round (`merge_sealed`, one per
//! round) and goes up whole. A read below a segment's `local_from` takes
//! a ranged request for a short read among its first misses, else fetches
//! the segment into the cache image. Clean segments are evicted least
//! recently used past `cache_bytes`, the cache's record saying so before
//! the hole is punched. Requests go through `object_store` on a small
//! tokio runtime that the synchronous methods block on. `refresh` builds a
//! store of a newer manifest that takes over the cache directory
//! (unchanged segments keep their bytes) and retires the old one under
//! the cache's gate: from then on it reads its own pieces with ranged
//! GETs. The writer deletes replaced pieces no sooner than `keep_replaced`
//! (60 s) after the manifest that dropped them.

#![cfg_attr(not(test), deny(clippy::expect_used))]

mod cache;
mod manifest;
mod remote;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use zlogfs_engine::store::{FileStore, Geometry, MetaSlot, RemoteStats, Store, META_SLOT_SIZE};

use cache::{CacheFile, Entry, Header};
use manifest::{Manifest, Piece, SegObjects, SLOTS};
use remote::{Created, Remote};

/// Manifests kept behind the newest (for readers still on an older one).
const KEEP_MANIFESTS: u64 = 8;
/// Pieces uploaded at once in a round.
const UPLOAD_BATCH: usize = 8;
/// A sealed segment in more pieces than this (each sync under
/// sync=remote makes one, each upload round under sync=local) is
/// uploaded again whole, as one object, at the next round, and the
/// pieces go: reading it from the bucket then takes one request, not one
/// per sync that wrote it.
const MAX_PIECES: usize = 4;
/// A read the cache misses takes a ranged request for its own bytes when
/// it is at most this long, and it is among the first such reads of its
/// segment since the segment was last fetched; otherwise the segment is
/// fetched whole (what sequential readers and the cleaner want).
const RANGE_READ_MAX: usize = 256 << 10;
const RANGE_READS_BEFORE_FETCH: u32 = 2;
/// A cache that cannot hold this many segments never fetches one whole:
/// every miss takes a ranged request for its own bytes. Fetched whole
/// into a cache of two segments, a reader going between an index segment
/// and data segments evicted what it fetched before using it: reading a
/// 25.6 MB image through an 8 MiB cache downloaded 218.6 MB.
const MIN_CACHED_SEGMENTS: u64 = 8;

/// Whether a round uploads sealed segment `s` again whole (see
/// [`MAX_PIECES`], counting the piece its bytes not yet uploaded would
/// make): all its bytes must be local.
fn merges(s: &Seg) -> bool {
    let tail = usize::from(s.written > s.sent_end());
    s.sealed && s.local_from == 0 && s.written > 0 && s.pieces.len() + s.sent.len() + tail > MAX_PIECES
}

/// `s3://BUCKET/PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The folder of the image's objects in it ("" for the top).
    pub prefix: String,
}

impl S3Url {
    /// None when `s` is not an `s3://` address; an error when it is one
    /// without a bucket.
    pub fn parse(s: &str) -> Option<Result<S3Url, String>> {
        let rest = s.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(format!("{s}: no bucket (use s3://BUCKET/PREFIX)")));
        }
        Some(Ok(S3Url { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() }))
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// When a sync returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// When the cache directory holds the data; uploads follow at sealed
    /// segments and checkpoints.
    #[default]
    Local,
    /// When the bucket holds it.
    Remote,
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<SyncMode, String> {
        match s {
            "local" => Ok(SyncMode::Local),
            "remote" => Ok(SyncMode::Remote),
            _ => Err(format!("sync mode {s:?}: use local or remote")),
        }
    }
}

/// How to open an image in a bucket.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Where.
    pub url: S3Url,
    /// The local cache directory (created if missing; one image per
    /// directory; locked while open).
    pub cache_dir: PathBuf,
    /// When a sync returns.
    pub sync: SyncMode,
    /// Open without claiming the image: nothing is written to the bucket.
    pub read_only: bool,
    /// Bytes of segments already in the bucket the cache keeps (least
    /// recently used go first); data not yet uploaded is always kept.
    pub cache_bytes: u64,
    /// sync=local: how often the uploader looks for something to upload
    /// (it also starts when a segment is full).
    pub upload_every: Duration,
    /// sync=local: past this many bytes not yet uploaded, a sync waits
    /// for the uploads.
    pub max_backlog: u64,
    /// The server's address, when not AWS_ENDPOINT_URL's (or AWS's).
    pub endpoint: Option<String>,
    /// How long a request is retried (with backoff) before it fails.
    pub retry_for: Duration,
    /// How long a writer keeps the pieces a new manifest no longer names:
    /// readers still on an older manifest read them until they refresh.
    pub keep_replaced: Duration,
}

impl S3Options {
    /// Defaults for `url` and `cache_dir`: sync=local, a cache of 1 GiB,
    /// uploads every 5 seconds, a backlog of at most 256 MiB.
    pub fn new(url: S3Url, cache_dir: PathBuf) -> S3Options {
        S3Options {
            url,
            cache_dir,
            sync: SyncMode::Local,
            read_only: false,
            cache_bytes: 1 << 30,
            upload_every: Duration::from_secs(5),
            max_backlog: 256 << 20,
            endpoint: None,
            retry_for: retry_budget(),
            keep_replaced: Duration::from_secs(60),
        }
    }
}

/// How long a request is retried by default: 60 seconds, or
/// `ZLOGFS_S3_RETRY_SECONDS` from the environment (a server restart or a
/// load balancer's failover must be ridden out, not latch the image).
pub const DEFAULT_RETRY_SECS: u64 = 60;

fn retry_budget() -> Duration {
    let secs = std::env::var("ZLOGFS_S3_RETRY_SECONDS").ok().and_then(|v| v.trim().parse::<u64>().ok());
    Duration::from_secs(secs.unwrap_or(DEFAULT_RETRY_SECS))
}

/// One segment as this store sees it.
#[derive(Debug, Clone, Default)]
struct Seg {
    gen: u64,
    /// Bytes `[local_from, written)` are in the local image; bytes below
    /// `local_from` are in the bucket. Never above `uploaded()`.
    local_from: u32,
    written: u32,
    /// The pieces of `gen` the newest manifest names, contiguous from 0.
    pieces: Vec<Piece>,
    /// Pieces uploaded after those (a sealed segment's, sent at once),
    /// that the next manifest will name.
    sent: Vec<Piece>,
    /// Earlier generations' pieces, deleted once a manifest without them
    /// is in the bucket.
    old: Vec<(u64, Vec<Piece>)>,
    sealed: bool,
    last_use: u64,
    /// Reads served by ranged requests since the segment came local.
    misses: u32,
    /// Bumped whenever bytes come local (a fetch) or are chosen to go (an
    /// eviction): an eviction punches only if nothing did either since
    /// it chose.
    local_ver: u64,
    /// Its cache record entry changed since the last sync.
    dirty: bool,
}

impl Seg {
    /// Bytes a manifest names.
    fn uploaded(&self) -> u32 {
        self.pieces.last().map_or(0, Piece::end)
    }

    /// The pieces in the bucket, named by a manifest or not yet, in order.
    fn all_pieces(&self) -> Vec<Piece> {
        let mut pieces = self.pieces.clone();
        pieces.extend_from_slice(&self.sent);
        pieces
    }

    /// Bytes in the bucket, named by a manifest or not yet.
    fn sent_end(&self) -> u32 {
        self.sent.last().map_or_else(|| self.uploaded(), Piece::end)
    }

    /// A new generation begins (or the segment is written again below
    /// what was sent): every piece of the old one goes at the next
    /// manifest.
    fn retire(&mut self) {
        let mut old = std::mem::take(&mut self.pieces);
        old.append(&mut self.sent);
        if !old.is_empty() {
            self.old.push((self.gen, old));
        }
    }

    fn entry(&self) -> Entry {
        Entry { gen: self.gen, local_from: self.local_from, written: self.written }
    }
}

struct State {
    segs: Vec<Seg>,
    /// Segments emptied by [`Inner::freed`] whose local bytes are still to
    /// be punched: (segment, its `local_ver` then, bytes).
    freed: Vec<(u32, u64, u32)>,
    /// The newest manifest in the bucket that this store knows (read at
    /// open or written since).
    manifest: Manifest,
    next_gen: u64,
    meta_dirty: bool,
    clock: u64,
}

/// The store's state, shared with its uploader thread.
struct Inner {
    remote: Arc<Remote>,
    /// The cache directory's image and record: shared with the stores a
    /// reader's [`Inner::refresh`] made (each segment's bytes in it are
    /// the newest store's; an older one, once retired, reads none).
    local: Arc<FileStore>,
    cache: Arc<CacheFile>,
    opts: S3Options,
    geometry: Geometry,
    /// This writer's epoch (0 when read-only).
    epoch: u64,
    /// This writer's random id (pieces and manifests carry it).
    writer: u64,
    state: Mutex<State>,
    /// One upload round at a time.
    round: Mutex<()>,
    /// One writer of the cache record at a time.
    persist: Arc<Mutex<()>>,
    /// Reads of the local image hold it shared; punching holes in it
    /// (eviction) or handing it to a newer store, exclusive.
    gate: Arc<RwLock<()>>,
    /// A reader that a newer store of the same cache replaced: it reads
    /// every byte from the bucket.
    retired: AtomicBool,
    /// Pieces no manifest names since the time given, deleted once
    /// `keep_replaced` has passed.
    doomed: Mutex<Vec<(Instant, Vec<object_store::path::Path>)>>,
    /// Latched: nothing more is written, every operation fails.
    failed: AtomicBool,
    /// Why it latched, which every later failure repeats.
    failure: Mutex<Option<String>>,
    hits: AtomicU64,
    misses: AtomicU64,
    /// The uploader's doorbell: (stop, rung).
    wake: (Mutex<(bool, bool)>, Condvar),
}

/// What a reader's newer store shares with the one it replaces.
struct CacheParts {
    remote: Arc<Remote>,
    local: Arc<FileStore>,
    cache: Arc<CacheFile>,
    persist: Arc<Mutex<()>>,
    gate: Arc<RwLock<()>>,
}

/// See the crate documentation.
pub struct S3Store {
    inner: Arc<Inner>,
    uploader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

fn read_only_error() -> io::Error {
    err(io::ErrorKind::PermissionDenied, "the image is open read-only".into())
}

fn slot_of(i: u64) -> MetaSlot {
    match i {
        0 => MetaSlot::Super,
        1 => MetaSlot::CheckpointA,
        2 => MetaSlot::CheckpointB,
        3 => MetaSlot::Pairing,
        _ => MetaSlot::SuperCopy,
    }
}

impl Inner {
    /// Make a new, empty image at `opts.url` (which must hold none) with
    /// `geometry`; the engine's mkfs then writes it.
    fn create(opts: S3Options, geometry: Geometry) -> io::Result<Inner> {
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
    fn open(opts: S3Options) -> io::Result<Inner> {
        let mut last = None;
        for _ in 0..3 {
            match Inner::open_once(opts.clone()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => last = Some(e),
                r => return r,
            }
        }
        Err(last.unwrap_or_else(|| err(io::ErrorKind::Other, "claiming the image failed".into())))
    }

    fn open_once(opts: S3Options) -> io::Result<Inner> {
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

    fn assemble(
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
    fn with_parts(
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
    fn parts(&self) -> CacheParts {
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
    fn claim(&self) -> io::Result<()> {
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

    /// Delete, `keep_replaced` from now, pieces the newest manifest does
    /// not name that older writers left (replaced pieces not yet deleted,
    /// a crash between pieces and manifest, a fenced writer's uploads).
    /// Newer writers' pieces are never touched.
    fn collect_garbage(&self, m: &Manifest) -> io::Result<()> {
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

    /// Fails once the store latched, saying why (an I/O error: EIO
    /// through the mount).
    fn check_ok(&self) -> io::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            let why = lock(&self.failure).clone().unwrap_or_default();
            return Err(io::Error::other(format!(
                "{}: this store stopped after an earlier failure ({why}); remount to go on",
                self.opts.url
            )));
        }
        Ok(())
    }

    /// Latch: nothing more is written; later operations fail with `why`.
    fn latch(&self, why: &str) {
        lock(&self.failure).get_or_insert_with(|| why.to_string());
        self.failed.store(true, Ordering::Release);
    }

    fn fail(&self, e: io::Error) -> io::Error {
        self.latch(&e.to_string());
        tracing::error!("{}: {e}", self.opts.url);
        e
    }

    /// Write the cache record entries that changed. They are taken
    /// first, then the local image is synced, then they are written: an
    /// entry never claims bytes that are not durable. One call at a time,
    /// so that none returns before the entries another one took are
    /// written; on failure the entries are marked again.
    fn persist_entries(&self) -> io::Result<()> {
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
    fn persist_empty(&self, seg: u32) -> io::Result<()> {
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
    fn round(&self, force: bool) -> io::Result<()> {
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
    fn cut(&self) -> io::Result<(Manifest, Vec<Upload>, Vec<object_store::path::Path>)> {
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
    fn merge_sealed(&self, st: &mut State) -> Vec<object_store::path::Path> {
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
    fn committed(&self, m: Manifest, uploads: &[Upload]) {
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
    fn put_pieces(&self, uploads: &[Upload]) -> io::Result<()> {
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
    fn upload_sealed(&self) -> io::Result<()> {
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
    fn after_commit(&self, deletes: Vec<object_store::path::Path>) {
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
    fn doom(&self, keys: Vec<object_store::path::Path>) {
        if !keys.is_empty() {
            lock(&self.doomed).push((Instant::now(), keys));
        }
    }

    /// What [`Inner::doom`] was given `keep_replaced` ago or earlier.
    fn take_due(&self) -> Vec<object_store::path::Path> {
        let mut doomed = lock(&self.doomed);
        let keep = self.opts.keep_replaced;
        let ripe = doomed.iter().take_while(|(t, _)| t.elapsed() >= keep).count();
        doomed.drain(..ripe).flat_map(|(_, d)| d).collect()
    }

    /// Delete `keys`, which no manifest names any more; a failure only
    /// leaves garbage (collected at the next claim): logged.
    fn delete_unreferenced(&self, keys: Vec<object_store::path::Path>) {
        if keys.is_empty() {
            return;
        }
        if let Err(e) = self.remote.delete(keys) {
            tracing::warn!("{}: deleting objects no longer referenced: {e}", self.opts.url);
        }
    }

    /// Drop the least recently used segments the bucket holds whole until
    /// the cache is within its budget. The record says so (durably)
    /// before the bytes go, and only the bytes chosen go: `[0, written)`
    /// of a generation nobody changed meanwhile (an append lands past
    /// them; a fetch or a new generation makes the segment be skipped).
    /// Freed segments' bytes go too.
    fn evict(&self) -> io::Result<()> {
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
    fn punch(&self, victims: Vec<(u32, u64, u32)>) -> io::Result<()> {
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
    fn freed(&self, seg: u32) {
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
    fn fetch(&self, seg: u32) -> io::Result<()> {
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
    fn read_range(
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

    /// A reader's store of the newest manifest, if it is newer than this
    /// one's: it takes over the cache directory (the segments whose
    /// generation and length did not change keep their cached bytes), and
    /// this store retires, reading every byte from the bucket from then
    /// on, so that the engines open on it still see their state.
    fn refresh(&self) -> io::Result<Option<Inner>> {
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
    fn rewrite_tail(&self, seg: u32) -> io::Result<()> {
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

/// Whether `url` holds an image (a manifest).
pub fn image_exists(url: &S3Url) -> io::Result<bool> {
    Ok(!Remote::new(url, None, Duration::from_secs(60))?.manifests()?.is_empty())
}

/// A writer's random id (never 0, which marks none).
fn new_writer_id() -> u64 {
    rand::random::<u64>() | 1
}

fn next_gen(st: &mut State) -> u64 {
    let g = st.next_gen;
    st.next_gen += 1;
    g
}

/// What a read does after the part it did under the gate.
enum Next {
    Done,
    /// Ranged requests for the bytes below `local_from`.
    Range(u64, Vec<Piece>, u32),
    /// Trim the cache (a segment was fetched whole).
    Evict,
}

/// How a read finds its bytes.
enum Miss {
    /// In the local image.
    No,
    /// With ranged requests: the generation, its pieces, `local_from`.
    Range(u64, Vec<Piece>, u32),
    /// By fetching the segment whole first.
    Whole,
}

struct Upload {
    seg: u32,
    gen: u64,
    piece: Piece,
    data: Vec<u8>,
}

/// The newest manifest in the bucket.
fn latest_manifest(remote: &Remote) -> io::Result<Manifest> {
    let Some(&n) = remote.manifests()?.last() else {
        return Err(err(
            io::ErrorKind::NotFound,
            format!("{} holds no zlogfs image (make one with `zlogfs mkfs {}`)", remote.url(), remote.url()),
        ));
    };
    read_manifest(remote, n)
}

/// Manifest number `n`, checked.
fn read_manifest(remote: &Remote, n: u64) -> io::Result<Manifest> {
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

fn image_path(dir: &Path) -> PathBuf {
    dir.join("image")
}

fn record_path(dir: &Path) -> PathBuf {
    dir.join("state")
}

/// A new local image for the image of manifest `m`: its metadata slots
/// from `m`, every segment in the bucket.
fn fresh_cache(dir: &Path, m: &Manifest, epoch: u64, writer: u64) -> io::Result<(FileStore, CacheFile)> {
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

fn cache_error(dir: &Path, e: io::Error) -> io::Error {
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
fn segs_from(m: &Manifest, cache: &CacheFile) -> io::Result<Vec<Seg>> {
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
fn trusted_cache(dir: &Path, m: &Manifest) -> io::Result<Option<(FileStore, CacheFile, Vec<Seg>)>> {
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

impl Inner {
    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
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
    fn read_local(&self, seg: u32, offset: u32, buf: &mut [u8], written: u32) -> io::Result<()> {
        let known = (written.saturating_sub(offset) as usize).min(buf.len());
        self.local.read(seg, offset, &mut buf[..known])?;
        buf[known..].fill(0);
        Ok(())
    }

    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        if self.epoch == 0 {
            return Err(read_only_error());
        }
        self.check_ok()?;
        self.local.write_meta(slot, buf)?;
        lock(&self.state).meta_dirty = true;
        Ok(())
    }

    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
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

    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
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

    fn sync(&self) -> io::Result<()> {
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

    fn discard(&self, _seg: u32) -> io::Result<()> {
        Ok(())
    }

    fn sealed(&self, seg: u32) {
        if let Some(s) = lock(&self.state).segs.get_mut(seg as usize) {
            s.sealed = true;
        }
        self.ring();
    }

    fn remote_stats(&self) -> Option<RemoteStats> {
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

impl Inner {
    /// Whether the bucket lacks something the cache holds (or holds a
    /// sealed segment in pieces a round merges).
    fn behind(&self) -> bool {
        let st = lock(&self.state);
        st.meta_dirty || st.segs.iter().any(|s| s.written > s.uploaded() || merges(s))
    }

    /// Bytes the cache holds that the bucket lacks.
    fn backlog(&self) -> u64 {
        lock(&self.state).segs.iter().map(|s| u64::from(s.written.saturating_sub(s.sent_end()))).sum()
    }

    /// Upload what the bucket lacks, now; a failure latches the store.
    fn catch_up(&self) -> io::Result<()> {
        self.check_ok()?;
        if self.epoch == 0 || !self.behind() {
            return Ok(());
        }
        self.persist_entries().and_then(|()| self.round(false)).map_err(|e| self.fail(e))
    }

    fn ring(&self) {
        lock(&self.wake.0).1 = true;
        self.wake.1.notify_one();
    }

    /// The uploader thread (sync=local): a round when a segment is sealed
    /// and every `upload_every`, until told to stop.
    fn upload_loop(&self) {
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

impl S3Store {
    /// Make a new, empty image at `opts.url` (which must hold none) with
    /// `geometry`; the engine's mkfs then writes it.
    pub fn create(opts: S3Options, geometry: Geometry) -> io::Result<S3Store> {
        Ok(S3Store::start(Inner::create(opts, geometry)?))
    }

    /// Open the image at `opts.url`: read its newest manifest, reuse the
    /// cache directory when it holds this image's newest state (else
    /// rebuild it), and unless read-only, claim the image (see the crate
    /// documentation) and upload what the cache held that the bucket
    /// lacked.
    pub fn open(opts: S3Options) -> io::Result<S3Store> {
        Ok(S3Store::start(Inner::open(opts)?))
    }

    fn start(inner: Inner) -> S3Store {
        let inner = Arc::new(inner);
        let uploader = (inner.epoch != 0 && inner.opts.sync == SyncMode::Local).then(|| {
            let i = Arc::clone(&inner);
            std::thread::Builder::new().name("zlogfs-upload".into()).spawn(move || i.upload_loop())
        });
        let uploader = match uploader {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                tracing::warn!(
                    "{}: no uploader thread ({e}): uploads happen when the backlog is full and at close",
                    inner.opts.url
                );
                None
            }
            None => None,
        };
        S3Store { inner, uploader: Mutex::new(uploader) }
    }

    /// Stop as a process killed at this moment would (for tests of
    /// recovery): nothing more goes to the bucket or the cache directory
    /// from this store, and its operations fail with EIO; the cache
    /// directory keeps what reached it.
    pub fn abandon(&self) {
        self.inner.latch("abandoned, as a killed process would be");
        lock(&self.inner.wake.0).0 = true;
        self.inner.ring();
    }

    /// Stop the uploader thread and upload what the bucket lacks.
    fn finish(&self) -> io::Result<()> {
        lock(&self.inner.wake.0).0 = true;
        self.inner.ring();
        if let Some(h) = lock(&self.uploader).take() {
            if h.join().is_err() {
                tracing::error!("{}: the uploader thread panicked", self.inner.opts.url);
            }
        }
        let r = self.inner.catch_up();
        if r.is_ok() {
            // What is not yet due stays (readers may still read it) until
            // a later writer has been open long enough.
            let due = self.inner.take_due();
            self.inner.delete_unreferenced(due);
        }
        r
    }
}

impl Drop for S3Store {
    /// A clean close uploads what the bucket lacks (the engine synced
    /// before), so that another machine sees everything.
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::error!(
                "{}: uploading at close: {e} (the cache directory keeps it)",
                self.inner.opts.url
            );
        }
    }
}

impl Store for S3Store {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }
    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.inner.read_meta(slot, buf)
    }
    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.inner.write_meta(slot, buf)
    }
    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(seg, offset, buf)
    }
    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        self.inner.write(seg, offset, data)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn discard(&self, seg: u32) -> io::Result<()> {
        self.inner.discard(seg)
    }
    fn sealed(&self, seg: u32) {
        self.inner.sealed(seg)
    }
    fn freed(&self, seg: u32) {
        self.inner.freed(seg)
    }
    fn remote_stats(&self) -> Option<RemoteStats> {
        self.inner.remote_stats()
    }
    fn cached(&self, seg: u32) -> bool {
        lock(&self.inner.state).segs.get(seg as usize).is_none_or(|s| s.local_from == 0 || s.written == 0)
    }
    fn close(&self) -> io::Result<()> {
        self.finish()
    }
    fn refresh(&self) -> io::Result<Option<Arc<dyn Store>>> {
        Ok(self.inner.refresh()?.map(|i| Arc::new(S3Store::start(i)) as Arc<dyn Store>))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kill after a round's manifest dropped a freed segment but before
    /// the record said so: the record's older entry (evicted in part) is
    /// read as the segment emptied, not as a disagreement that would make
    /// the cache directory unopenable.
    #[test]
    fn a_record_behind_a_manifest_that_emptied_a_segment_opens() {
        let dir = std::env::temp_dir().join(format!("zlogfs-s3-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let geometry = Geometry { segment_size: 64 << 10, segment_count: 4 };
        let mut m = Manifest::new(3, [7; 16], geometry);
        m.epoch = 2;
        m.writer = 9;
        let (local, cache) = fresh_cache(&dir, &m, 2, 9).unwrap();
        // Segment 1: generation 5, the first 4 KiB uploaded and evicted,
        // written to 8 KiB; the manifest names nothing of it (emptied).
        cache.set_entry(1, Entry { gen: 5, local_from: 4096, written: 8192 }).unwrap();
        cache.sync().unwrap();
        drop((local, cache));
        let (_, _, segs) = trusted_cache(&dir, &m).unwrap().expect("the cache is this writer's");
        assert_eq!((segs[1].gen, segs[1].written, segs[1].local_from), (5, 0, 0));
        assert!(segs[1].dirty, "the record is brought up to date");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
