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

//!
//! The files, by job: [`options`] (the address, the sync mode, the
//! options), [`open`] (making and opening an image, the claim), [`ops`]
//! (the store's reads, writes and syncs), [`upload`] (rounds, the
//! uploader thread, deleting what no manifest names), [`cached`]
//! (eviction, reads of what the cache lacks), [`refresh`] (a reader
//! following the writer), [`cache`] (the cache directory's record),
//! [`manifest`] (a manifest's bytes), [`remote`] (requests to the bucket).
//! This file holds the state they share and the [`S3Store`] handle.

#![cfg_attr(not(test), deny(clippy::expect_used))]

mod cache;
mod cached;
mod manifest;
mod open;
mod ops;
mod options;
mod refresh;
mod remote;
mod upload;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use zlogfs_engine::store::{FileStore, Geometry, MetaSlot, RemoteStats, Store, META_SLOT_SIZE};

use cache::{CacheFile, Entry, Header};
use manifest::{Manifest, Piece, SegObjects, SLOTS};
use open::read_manifest;
#[cfg(test)]
use open::{fresh_cache, trusted_cache};
pub use options::{S3Options, S3Url, SyncMode, DEFAULT_RETRY_SECS};
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
