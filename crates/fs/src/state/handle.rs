//! The handle of an open file system ([`Fs`]) and what it shares with its
//! commit thread ([`Inner`]): the state behind its lock, sync and commit.
//! Opening, closing and making one are in [`crate::filesystem`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zlogfs_engine::engine::Engine;

use crate::error::{Error, Result};
use crate::keys::{Config, Ino};
use crate::state::State;
use crate::{lock, FsStats, SyncMode};

/// What the file system's handle and its commit thread share.
pub(crate) struct Inner {
    pub(crate) st: Mutex<State>,
    /// Requests waiting for `st` ([`Fs::st`]): admin walks give way to
    /// them ([`Fs::st_after_requests`]).
    pub(crate) waiting: AtomicUsize,
    pub(crate) stop: Mutex<bool>,
    pub(crate) wake: Condvar,
}

impl Inner {
    pub(crate) fn new(st: State) -> Inner {
        Inner {
            st: Mutex::new(st),
            waiting: AtomicUsize::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        }
    }
}

/// How long an admin walk lets requests waiting for the state go first,
/// at most, before it takes the state for its next page: it gets at least
/// about half of the lock's time under a steady stream of requests.
const GIVE_WAY: Duration = Duration::from_millis(10);

/// What [`Fs::drop_caches`] gave back, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachesDropped {
    /// Decompressed file and metadata blocks.
    pub blocks: usize,
    /// Decoded blocks of the index's runs.
    pub index: usize,
}

/// An open file system.
pub struct Fs {
    pub(crate) inner: Arc<Inner>,
    pub(crate) eng: Arc<Engine>,
    pub(crate) worker: Option<JoinHandle<()>>,
    pub(crate) sync_mode: SyncMode,
    pub(crate) invalidator: std::sync::RwLock<Option<Invalidator>>,
}

/// Told that bytes `[off, off + len)` of a file changed through another
/// front end than the one that set it: a FUSE session sets one that drops
/// the kernel's cached pages of the range, and the NBD server reports its
/// writes, trims and zero writes to it ([`Fs::changed_elsewhere`]).
pub type Invalidator = Arc<dyn Fn(Ino, u64, u64) + Send + Sync>;

impl Fs {
    /// Set (or clear) the [`Invalidator`].
    pub fn set_invalidator(&self, f: Option<Invalidator>) {
        *self.invalidator.write().unwrap_or_else(|p| p.into_inner()) = f;
    }

    /// The [`Invalidator`] set.
    pub fn invalidator(&self) -> Option<Invalidator> {
        self.invalidator.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Bytes `[off, off + len)` of `ino` changed through a front end that
    /// is not the one that set the [`Invalidator`]: tell it.
    pub fn changed_elsewhere(&self, ino: Ino, off: u64, len: u64) {
        let f = self.invalidator.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(f) = f {
            f(ino, off, len);
        }
    }

    /// A count that moves on before held blocks (those only snapshots
    /// read) are moved or released: a read through a [`Fs::view`] that
    /// saw it stay the same saw no block move under it.
    pub fn held_generation(&self) -> u64 {
        self.st().held_gen.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Forget every cached block (a view does when held blocks moved: an
    /// address it cached may hold another block now).
    pub fn drop_cache(&self) {
        let gone = {
            let mut st = self.st();
            st.cache.moved();
            st.cache.clear().1
        };
        drop(gone);
    }

    /// Free both caches, decompressed blocks and decoded index blocks
    /// (memory pressure, `zlogfs drop-caches`): they fill again as
    /// requests read. Returns the bytes each held. The blocks are freed
    /// outside the state's lock (an NBD daemon's cache is up to 4 GiB).
    pub fn drop_caches(&self) -> CachesDropped {
        let (blocks, gone) = self.st().cache.clear();
        drop(gone);
        CachesDropped { blocks, index: self.eng.drop_index_cache() }
    }

    /// Bytes of decompressed blocks cached now.
    pub fn block_cache_bytes(&self) -> usize {
        self.st().cache.bytes()
    }

    pub(crate) fn st(&self) -> MutexGuard<'_, State> {
        self.inner.waiting.fetch_add(1, Ordering::AcqRel);
        let g = lock(&self.inner.st);
        self.inner.waiting.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// The state for the next page of an admin walk, once the requests
    /// waiting for it had their turn (up to [`GIVE_WAY`]): std's lock is
    /// not fair, and a walk that takes it back as it lets go would hold
    /// requests up for the whole walk (issue 45).
    pub(crate) fn st_after_requests(&self) -> MutexGuard<'_, State> {
        let start = Instant::now();
        while self.inner.waiting.load(Ordering::Acquire) > 0 && start.elapsed() < GIVE_WAY {
            std::thread::yield_now();
        }
        lock(&self.inner.st)
    }

    /// The engine underneath.
    pub fn engine(&self) -> &Engine {
        &self.eng
    }

    /// The config record.
    pub fn config(&self) -> Config {
        self.st().group.cfg().clone()
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        let mut s = self.st().stats.clone();
        s.engine_background_error = self.eng.background_error();
        s
    }

    /// Mend the damage the engine worked around at open (a superblock
    /// read from its copy, runs with a rebuilt index or no filter): what
    /// it was. EROFS on a read-only file system.
    pub fn repair(&self) -> Result<Vec<String>> {
        let mut st = self.st();
        if st.read_only {
            return Err(Error::read_only("the file system is open read-only: nothing can be repaired"));
        }
        st.commit()?;
        drop(st);
        self.eng.sync()?;
        Ok(self.eng.repair()?)
    }

    /// Write the current group to the log (not synced).
    pub fn commit(&self) -> Result<()> {
        self.st().commit()
    }

    /// Commit and make everything durable (syncfs).
    pub fn sync(&self) -> Result<()> {
        let start = std::time::Instant::now();
        let r = self.sync_now();
        crate::stats::op_times().sync.since(start, 0);
        r
    }

    fn sync_now(&self) -> Result<()> {
        self.st().commit()?;
        Ok(self.eng.sync()?)
    }

    /// After an operation that succeeded: sync if the [`SyncMode`] asks
    /// for it (`dir`: the operation changed a directory).
    pub(crate) fn synced<T>(&self, r: Result<T>, dir: bool) -> Result<T> {
        let v = r?;
        match self.sync_mode {
            SyncMode::All => self.sync()?,
            SyncMode::Dirs if dir => self.sync()?,
            _ => {}
        }
        Ok(v)
    }

    /// fsync/fdatasync of one file: this file system commits whole groups,
    /// so this is [`Fs::sync`].
    pub fn fsync(&self, _ino: Ino, _datasync: bool) -> Result<()> {
        let start = std::time::Instant::now();
        let r = self.sync_now();
        crate::stats::op_times().fsync.since(start, 0);
        r
    }

    /// Stop the commit thread and wait for it.
    pub(crate) fn stop_worker(&mut self) {
        *lock(&self.inner.stop) = true;
        self.inner.wake.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.stop_worker();
    }
}
