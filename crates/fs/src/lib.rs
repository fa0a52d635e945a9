//! The POSIX file system layer: inodes, directories, links, xattrs and file
//! data as records of the index plus compressed data blocks in the log.
//! Usable as a library; the FUSE mount and the command-line tool are thin
//! front ends over [`Fs`].
//!
//! - Records and their encodings: [`keys`].
//! - Operations accepted since the last commit are one group ([`pending`]),
//!   written to the engine as one atomic batch; file data is buffered per
//!   chunk and compressed when the group commits (on fsync, every commit
//!   interval, and when buffers pass their bounds).
//! - At commit, chunks of small files are packed together into shared
//!   blocks, very small files go inline into the index, all-zero chunks
//!   become holes, and the other chunks are compressed one block each; all
//!   blocks of a group are compressed in parallel.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod acl;
pub mod keys;
pub mod pending;

mod check;
mod clean;
mod data;
mod error;
mod ops;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::engine::{self, Engine, Options, Room, WriteBatch};
use zlogfs_engine::error::Error as EngineError;
use zlogfs_engine::log::format::BlockAddr;
use zlogfs_engine::log::max_block_raw;
use zlogfs_engine::store::Store;

pub use check::{CheckReport, CodecUse, TreeUsage, Usage};
pub use clean::{CleanOptions, CleanReport};
pub use error::{Error, Result};
use keys::*;
pub use keys::{Counters, Ino, Inode, Kind, Time, ROOT};
use pending::Pending;

/// Parameters fixed when a file system is made.
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// Bytes of file data per chunk (a power of two, 4 KiB to 1 MiB).
    pub chunk_size: u32,
    /// Target raw size of a block of small files packed together.
    pub pack_bytes: u32,
    /// Files up to this many bytes live inline in the index.
    pub inline_max: u32,
    /// Default codec of file data.
    pub codec: CodecSpec,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            chunk_size: 64 << 10,
            pack_bytes: 128 << 10,
            inline_max: 512,
            // Level 2, not 3: zstd's fast strategy, where level 3 takes the
            // double-fast one. Sequential writes through the mount are a
            // third faster for about 4% more space on source trees
            // (docs/BENCHMARKS.md, bench/seqwrite.sh).
            codec: CodecSpec::new(CodecId::Zstd, 2),
            root_uid: 0,
            root_gid: 0,
        }
    }
}

/// When reads update atime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atime {
    /// Never.
    Noatime,
    /// When atime is not newer than mtime or ctime, or a day old (Linux's
    /// relatime).
    Relatime,
    /// On every read (strictatime).
    Strict,
}

/// What is made durable as soon as it is done, beyond fsync, syncfs, the
/// commit interval and close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Nothing more (the default).
    Lazy,
    /// Every operation that changes a directory: create, mknod, mkdir,
    /// symlink, link, unlink, rmdir, rename (`-o dirsync`).
    Dirs,
    /// Every operation that changes anything (`-o sync`).
    All,
}

/// Tunables of an open file system.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// The engine's tunables.
    pub engine: Options,
    /// Commit and sync at this interval (None: only on fsync, on pressure
    /// and at close).
    pub commit_interval: Option<Duration>,
    /// Buffered file data past which a commit starts.
    pub dirty_bytes: usize,
    /// Bytes of decompressed blocks to cache.
    pub cache_bytes: usize,
    /// atime policy.
    pub atime: Atime,
    /// Whether reading a directory updates its atime (under `atime`);
    /// `-o nodiratime` turns it off.
    pub diratime: bool,
    /// What is synced as soon as it is done.
    pub sync: SyncMode,
    /// Store small overwrites of stored chunks as patches beside them
    /// (docs/ARCHITECTURE.md, "Patches"). On by default; off, every
    /// overwrite rewrites its whole chunk.
    pub patches: bool,
    /// Open for reading only (a store opened read-only): nothing is
    /// written, not even what recovery or an open's orphans would; every
    /// change fails with EROFS, and reads update no atime.
    pub read_only: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            engine: Options::default(),
            commit_interval: Some(Duration::from_secs(5)),
            dirty_bytes: 256 << 20,
            cache_bytes: 128 << 20,
            atime: Atime::Relatime,
            diratime: true,
            sync: SyncMode::Lazy,
            patches: true,
            read_only: false,
        }
    }
}

/// Attributes as `stat` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Kind.
    pub kind: Kind,
    /// Full mode (type and permission bits).
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number.
    pub rdev: u64,
    /// Logical size.
    pub size: u64,
    /// 512-byte units of logical bytes not in holes.
    pub blocks: u64,
    /// Access time.
    pub atime: Time,
    /// Modification time.
    pub mtime: Time,
    /// Change time.
    pub ctime: Time,
    /// Birth time.
    pub btime: Time,
    /// Preferred I/O size.
    pub blksize: u32,
}

/// A directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: Vec<u8>,
    /// Inode.
    pub ino: Ino,
    /// Kind.
    pub kind: Kind,
}

/// What `statfs` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    /// Block size of the counts below.
    pub bsize: u32,
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks (as if nothing compressed).
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes that may still be created.
    pub ffree: u64,
    /// Longest name.
    pub namelen: u32,
}

/// Who makes a change, as far as Linux's rules for the set-ID bits need
/// to know (a FUSE mount learns it from the kernel and /proc; a library
/// user says it). Without one, a change keeps the bits, as a caller with
/// CAP_FSETID would.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// Has CAP_FSETID (root, usually).
    pub fsetid: bool,
    /// Its file system group and supplementary groups.
    pub groups: Vec<u32>,
}

const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IXGRP: u32 = 0o010;

impl Caller {
    fn in_group(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }

    /// Whether set-group-ID goes from a file of `mode` and group `gid`
    /// (Linux's `setattr_should_drop_sgid`, 6.2 on): when the file is
    /// group-executable, or the caller is neither in its group nor has
    /// CAP_FSETID. Without group execute the bit stays for those who may
    /// set it.
    fn drops_sgid(&self, mode: u32, gid: u32) -> bool {
        mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !(self.fsetid || self.in_group(gid)))
    }

    /// The set-ID bits a write, truncate, fallocate or copy into a
    /// regular file of `mode` and group `gid` clears: none with
    /// CAP_FSETID; else set-user-ID, and set-group-ID as
    /// [`Caller::drops_sgid`] says (Linux's `should_remove_suid`).
    pub fn cleared_by_write(&self, mode: u32, gid: u32) -> u32 {
        if self.fsetid || mode & S_IFMT != S_IFREG {
            return 0;
        }
        (mode & S_ISUID) | if self.drops_sgid(mode, gid) { S_ISGID } else { 0 }
    }

    /// The set-ID bits a chown of a file of `mode` and group `gid`
    /// clears: set-user-ID always, set-group-ID as [`Caller::drops_sgid`]
    /// says; a directory keeps both (Linux's `chown_common`).
    pub fn cleared_by_chown(&self, mode: u32, gid: u32) -> u32 {
        if mode & S_IFMT == S_IFDIR {
            return 0;
        }
        (mode & S_ISUID) | if self.drops_sgid(mode, gid) { S_ISGID } else { 0 }
    }
}

/// Changes of [`Fs::setattr`]; None leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    /// Permission bits (the type bits are kept).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Truncate or extend to this size.
    pub size: Option<u64>,
    /// Access time (None: keep; Some(None): now).
    pub atime: Option<Option<Time>>,
    /// Modification time (None: keep; Some(None): now).
    pub mtime: Option<Option<Time>>,
    /// Change time to set explicitly (import); otherwise now.
    pub ctime: Option<Time>,
    /// Birth time to set explicitly (import).
    pub btime: Option<Time>,
    /// Who truncates or chowns, when the set-ID bits should go as
    /// [`Caller`] says (None: they stay).
    pub by: Option<Caller>,
}

/// Flags of [`Fs::rename`].
pub const RENAME_NOREPLACE: u32 = 1;
/// Flags of [`Fs::rename`].
pub const RENAME_EXCHANGE: u32 = 2;

/// Flags of [`Fs::fallocate`] (Linux values).
pub const FALLOC_FL_KEEP_SIZE: u32 = 1;
/// Deallocate the range (with KEEP_SIZE).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 2;
/// Zero the range.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// Flags of [`Fs::setxattr`].
pub const XATTR_CREATE: u32 = 1;
/// Flags of [`Fs::setxattr`].
pub const XATTR_REPLACE: u32 = 2;
/// Flag of [`Fs::setxattr`], zlogfs's own: setting this access ACL clears
/// the set-group-ID bit (the caller is neither in the file's group nor
/// has CAP_FSETID; the kernel says so with `FUSE_SETXATTR_ACL_KILL_SGID`).
pub const XATTR_KILL_SGID: u32 = 1 << 31;

/// The xattr holding a file's or directory's codec policy.
pub const XATTR_CODEC: &[u8] = b"user.zlogfs.codec";
/// The read-only xattr giving a file's stored (compressed) bytes.
pub const XATTR_PHYSICAL: &[u8] = b"user.zlogfs.physical";
/// Setting this xattr on the root directory runs a cleaning pass (value:
/// the most segments to clean, or `all`); reading it gives the last
/// pass's report as JSON. It is never stored.
pub const XATTR_CLEAN: &[u8] = b"user.zlogfs.clean";

/// Counters of the file system layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Commits written.
    pub commits: u64,
    /// User bytes written through `write`.
    pub bytes_written: u64,
    /// Logical bytes of chunks committed.
    pub chunk_bytes: u64,
    /// Blocks of packed small files written.
    pub pack_blocks: u64,
    /// Chunks stored inline.
    pub inline_chunks: u64,
    /// Chunks found all zero and stored as holes.
    pub zero_chunks: u64,
    /// Patches written (blocks of a stored chunk written again, stored
    /// beside it instead of rewriting the chunk).
    pub patches: u64,
    /// Stored bytes of blocks written by writers: chunks written whole.
    pub whole_stored: u64,
    /// Whole chunks stored from a block compressed ahead, as a write
    /// filled them (the rest of `whole_stored` was compressed at commit).
    pub ahead_used: u64,
    /// Stored bytes of blocks written by writers: packs of small chunks
    /// and patches.
    pub pack_stored: u64,
    /// Stored bytes of blocks the cleaner wrote.
    pub clean_stored: u64,
    /// Segments the cleaner freed.
    pub clean_freed: u64,
    /// Counted live bytes of the segments the cleaner freed, when picked.
    pub clean_live: u64,
    /// atime updates dropped: the log had no room outside the reserve, or
    /// the commit that would have made room for them failed.
    pub atime_dropped: u64,
}

/// Decompressed blocks, evicted first-in first-out.
struct Cache {
    map: HashMap<BlockAddr, Arc<Vec<u8>>>,
    order: VecDeque<BlockAddr>,
    bytes: usize,
    limit: usize,
}

impl Cache {
    fn get(&self, a: &BlockAddr) -> Option<Arc<Vec<u8>>> {
        self.map.get(a).cloned()
    }
    fn insert(&mut self, a: BlockAddr, v: Arc<Vec<u8>>) {
        if v.len() > self.limit {
            return;
        }
        self.bytes += v.len();
        if let Some(old) = self.map.insert(a, v) {
            self.bytes -= old.len();
        } else {
            self.order.push_back(a);
        }
        while self.bytes > self.limit {
            let Some(o) = self.order.pop_front() else { break };
            if let Some(old) = self.map.remove(&o) {
                self.bytes -= old.len();
            }
        }
    }
    fn remove(&mut self, a: &BlockAddr) {
        if let Some(old) = self.map.remove(a) {
            self.bytes -= old.len();
        }
    }
    /// Forget every block of segments `segs` (freed: their addresses will
    /// hold other blocks).
    fn forget_segments(&mut self, segs: &[u32]) {
        let gone: Vec<BlockAddr> = self.map.keys().filter(|a| segs.contains(&a.seg)).copied().collect();
        for a in gone {
            self.remove(&a);
        }
    }
}

/// Mutable state, behind one lock.
struct State {
    eng: Arc<Engine>,
    cfg: Config,
    cfg_dirty: bool,
    pend: Pending,
    /// Buffered chunks: the full logical content of each, from the chunk's
    /// start (shorter than a chunk at the end of a file).
    dirty: HashMap<Ino, std::collections::BTreeMap<u64, data::Buf>>,
    /// Full chunks compressed on the pool as writes fill them.
    ahead: data::Ahead,
    /// Moves whenever blocks may be placed in the log or freed (a commit,
    /// storing buffered chunks, the cleaner's reclaim): a block read at an
    /// address while it did not move is what that address holds.
    epoch: u64,
    dirty_bytes: usize,
    dirty_chunks: usize,
    triples: HashMap<(u32, u32, u32), u32>,
    triple_ids: HashMap<u32, (u32, u32, u32)>,
    open: HashMap<Ino, u32>,
    cache: Cache,
    /// Commit when the group's estimated journal bytes pass this.
    max_group: usize,
    dirty_limit: usize,
    atime: Atime,
    diratime: bool,
    stats: FsStats,
    /// Lifetime counters, as of the last committed group plus this one.
    counters: Counters,
    /// Counters as last committed.
    counters_saved: Counters,
    /// Engine device bytes when `counters.device_bytes` was last updated.
    dev_seen: u64,
    /// Free log bytes as of the last commit: buffered data past this is
    /// committed before a write is accepted, so that a full log gives the
    /// writer ENOSPC instead of failing a later commit.
    space_hint: u64,
    /// The group holds changes other than removals (new inodes, names,
    /// xattrs, attribute and time changes, atime updates): it may not use
    /// the part of the log's reserve that deletes and the cleaner may use.
    grew: bool,
    /// A cleaning round is running (its commits do not clean).
    cleaning: bool,
    /// Small overwrites may be stored as patches ([`FsOptions::patches`]).
    patches: bool,
    /// Nothing may be written ([`FsOptions::read_only`]).
    read_only: bool,
    /// The report of the last pass run through [`XATTR_CLEAN`].
    last_clean: Option<CleanReport>,
    /// Commits so far when cleaning last failed to make the room a writer
    /// needed (see `clean_for`).
    futile_at: Option<u64>,
}

struct Inner {
    st: Mutex<State>,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// An open file system.
pub struct Fs {
    inner: Arc<Inner>,
    eng: Arc<Engine>,
    worker: Option<JoinHandle<()>>,
    sync_mode: SyncMode,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The coarse clock of timestamps: wall time truncated to milliseconds
/// (Linux's own file times come from a clock of 1-10 ms granularity).
pub fn now() -> Time {
    let t = Time::from_system(std::time::SystemTime::now());
    Time { sec: t.sec, nsec: t.nsec / 1_000_000 * 1_000_000 }
}

/// Make an empty file system on `store`: the engine's format plus the
/// config record and the root directory.
pub fn mkfs(store: Arc<dyn Store>, o: &MkfsOptions) -> Result<()> {
    let max = max_block_raw(store.geometry()) as u32;
    if !o.chunk_size.is_power_of_two() || o.chunk_size < 4096 || o.chunk_size > (1 << 20) {
        return Err(Error::Invalid(format!(
            "chunk size {} is not a power of two from 4 KiB to 1 MiB",
            o.chunk_size
        )));
    }
    if o.chunk_size > max || o.pack_bytes > max {
        return Err(Error::Invalid(format!(
            "chunk size {} or pack size {} exceeds the largest block of this segment size ({max})",
            o.chunk_size, o.pack_bytes
        )));
    }
    if o.inline_max > 4096 {
        return Err(Error::Invalid(format!("inline limit {} exceeds 4096", o.inline_max)));
    }
    engine::mkfs(store.clone())?;
    let eng = Engine::open(store, Options { background: false, ..Options::default() })?;
    let t = now();
    let cfg = Config {
        chunk_size: o.chunk_size,
        pack_bytes: o.pack_bytes.max(o.chunk_size),
        inline_max: o.inline_max,
        codec: o.codec.normalized(),
        base_sec: t.sec,
        next_ino: ROOT + 1,
        next_triple: 1,
        version: 1,
    };
    let root = Inode {
        ino: ROOT,
        mode: 0o040755,
        uid: o.root_uid,
        gid: o.root_gid,
        nlink: 2,
        size: 0,
        alloc: 0,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
        btime: t,
        parent: ROOT,
        policy: None,
    };
    let mut b = WriteBatch::new();
    b.put(config_key(), cfg.encode());
    b.put(triple_key(0), encode_triple(root.triple()));
    b.put(inode_key(ROOT), root.encode(0, cfg.base_sec));
    eng.write_sync(&b)?;
    Ok(eng.close()?)
}

impl Fs {
    /// Open the file system on `store`, recovering it to its last durable
    /// state and finishing deletes and truncations a crash interrupted.
    pub fn open(store: Arc<dyn Store>, opts: FsOptions) -> Result<Fs> {
        let eng_opts = Options { read_only: opts.read_only || opts.engine.read_only, ..opts.engine.clone() };
        let eng = Arc::new(Engine::open(store, eng_opts)?);
        let cfg = match eng.get(&config_key())? {
            Some(v) => Config::decode(&v)?,
            None => {
                return Err(Error::Engine(EngineError::NotAnImage(
                    "the image has a zlogfs engine but no file system in it (run zlogfs mkfs)".into(),
                )))
            }
        };
        let mut triples = HashMap::new();
        let mut triple_ids = HashMap::new();
        for (k, v) in eng.scan(&triple_key(0), Some(&triples_end()), usize::MAX)? {
            let id = triple_id(&k).ok_or_else(|| Error::corrupt("triple key", format!("{k:02x?}")))?;
            let t = decode_triple(&v)?;
            triples.insert(t, id);
            triple_ids.insert(id, t);
        }
        let counters = match eng.get(&counters_key())? {
            Some(v) => Counters::decode(&v)?,
            None => Counters::default(),
        };
        let max_group = max_block_raw(eng.superblock().geometry) / 2;
        let st = State {
            eng: eng.clone(),
            cfg,
            cfg_dirty: false,
            pend: Pending::default(),
            dirty: HashMap::new(),
            ahead: data::Ahead::default(),
            epoch: 0,
            dirty_bytes: 0,
            dirty_chunks: 0,
            triples,
            triple_ids,
            open: HashMap::new(),
            cache: Cache { map: HashMap::new(), order: VecDeque::new(), bytes: 0, limit: opts.cache_bytes },
            max_group,
            dirty_limit: opts.dirty_bytes.max(1 << 20),
            atime: if opts.read_only { Atime::Noatime } else { opts.atime },
            diratime: opts.diratime,
            read_only: opts.read_only,
            patches: opts.patches,
            stats: FsStats::default(),
            counters,
            counters_saved: counters,
            dev_seen: eng.device_bytes_written(),
            space_hint: eng.free_bytes().saturating_sub(counters.reserved),
            grew: false,
            cleaning: false,
            last_clean: None,
            futile_at: None,
        };
        let inner = Arc::new(Inner { st: Mutex::new(st), stop: Mutex::new(false), wake: Condvar::new() });
        if !opts.read_only {
            let mut st = lock(&inner.st);
            st.finish_orphans()?;
            st.commit()?;
            eng.sync()?;
        }
        let worker = opts.commit_interval.map(|iv| {
            let w = Arc::downgrade(&inner);
            let e = eng.clone();
            std::thread::Builder::new()
                .name("zlogfs-commit".into())
                .spawn(move || commit_loop(w, e, iv))
                .expect("spawning the commit thread")
        });
        Ok(Fs { inner, eng, worker, sync_mode: opts.sync })
    }

    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.inner.st)
    }

    /// The engine underneath.
    pub fn engine(&self) -> &Engine {
        &self.eng
    }

    /// The config record.
    pub fn config(&self) -> Config {
        self.st().cfg.clone()
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        self.st().stats.clone()
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
        self.st().commit()?;
        Ok(self.eng.sync()?)
    }

    /// After an operation that succeeded: sync if the [`SyncMode`] asks
    /// for it (`dir`: the operation changed a directory).
    fn synced<T>(&self, r: Result<T>, dir: bool) -> Result<T> {
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
        self.sync()
    }

    /// Commit, sync, flush the index and checkpoint ([`Engine::settle`]),
    /// and close: the next open replays nothing.
    pub fn close(mut self) -> Result<()> {
        self.stop_worker();
        if self.st().read_only {
            return Ok(());
        }
        self.sync()?;
        Ok(self.eng.settle()?)
    }

    fn stop_worker(&mut self) {
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

fn commit_loop(w: Weak<Inner>, eng: Arc<Engine>, iv: Duration) {
    loop {
        let Some(inner) = w.upgrade() else { return };
        {
            let stop = lock(&inner.stop);
            if *stop {
                return;
            }
            let (stop, _) = inner.wake.wait_timeout(stop, iv).unwrap_or_else(|p| p.into_inner());
            if *stop {
                return;
            }
        }
        let busy = {
            let mut st = lock(&inner.st);
            let busy = !st.pend.is_empty() || !st.dirty.is_empty() || st.cfg_dirty;
            // An error here is reported again by the next operation that
            // needs the engine (it latches); nothing is lost by waiting.
            busy && st.commit().is_ok()
        };
        if busy {
            let _ = eng.sync();
        }
        // Clean in the background when free segments run low, a round at a
        // time so that requests are served in between. An error latches
        // the engine or is met again by the writer that needs the space.
        let g = eng.superblock().geometry;
        // Few: free segments kept idle are space the cleaner cannot use to
        // let dead bytes gather, and with a tenth of the image kept free,
        // 4 KiB random overwrites of a 70%-full image wrote 5.0 device
        // bytes per byte against 3.8 with 6 segments (docs/BENCHMARKS.md).
        // A writer that finds no room cleans for itself (`clean_for`).
        // Both clean in bursts (`CLEAN_BURST`).
        let low = (g.segment_count / 64).max(6);
        let es = eng.stats();
        if es.free_segments + es.pinned_segments < low {
            let opts = CleanOptions {
                max_live: 0.8,
                target_free: Some(low + clean::CLEAN_BURST),
                ..CleanOptions::default()
            };
            let (mut rep, mut tried) = (CleanReport::default(), std::collections::HashSet::new());
            while !*lock(&inner.stop) {
                match lock(&inner.st).clean_round(&opts, &mut rep, &mut tried) {
                    Ok(true) => {}
                    _ => break,
                }
            }
        }
    }
}

fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    words.all(|w| u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) == 0)
        && words.remainder().iter().all(|&x| x == 0)
}

fn name_str(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

/// Check a name for a new directory entry.
fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::invalid(format!("invalid name {:?}", name_str(name))));
    }
    if name.len() > 255 {
        return Err(Error::name_too_long(format!("name of {} bytes exceeds 255", name.len())));
    }
    if name.iter().any(|&c| c == b'/' || c == 0) {
        return Err(Error::invalid(format!("name {:?} contains '/' or NUL", name_str(name))));
    }
    Ok(())
}

impl State {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.pend.get(key) {
            Some(v) => Ok(v.map(|v| v.to_vec())),
            None => Ok(self.eng.get(key)?),
        }
    }

    fn put(&mut self, key: Vec<u8>, val: Vec<u8>) {
        self.pend.put(key, val);
    }

    fn del(&mut self, key: Vec<u8>) {
        self.pend.del(key);
    }

    /// Entries of `[lo, hi)`, pending mutations applied, at most `limit`.
    fn scan(&self, lo: &[u8], hi: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut cur = lo.to_vec();
        let step = limit.clamp(64, 4096);
        loop {
            let stored = self.eng.scan(&cur, Some(hi), step)?;
            let done = stored.len() < step;
            let next = if done {
                hi.to_vec()
            } else {
                let mut k = stored.last().map(|(k, _)| k.clone()).unwrap_or_default();
                k.push(0);
                k
            };
            pending::merge_scan(stored, &self.pend, &cur, Some(&next), &mut out);
            if done || out.len() >= limit {
                break;
            }
            cur = next;
        }
        out.truncate(limit);
        Ok(out)
    }

    fn inode(&self, ino: Ino) -> Result<Inode> {
        match self.get(&inode_key(ino))? {
            Some(v) => {
                let base = self.cfg.base_sec;
                Ok(Inode::decode(ino, &v, base, |id| self.triple_ids.get(&id).copied())?)
            }
            None => Err(Error::not_found(format!("inode {ino} does not exist"))),
        }
    }

    fn save(&mut self, i: &Inode) {
        let t = i.triple();
        let id = match self.triples.get(&t) {
            Some(&id) => id,
            None => {
                let id = self.cfg.next_triple;
                self.cfg.next_triple += 1;
                self.cfg_dirty = true;
                self.triples.insert(t, id);
                self.triple_ids.insert(id, t);
                self.put(triple_key(id), encode_triple(t));
                id
            }
        };
        let v = i.encode(id, self.cfg.base_sec);
        self.put(inode_key(i.ino), v);
    }

    fn lookup_entry(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, Kind)>> {
        match self.get(&dirent_key(parent, name))? {
            Some(v) => Ok(Some(decode_dirent(&v)?)),
            None => Ok(None),
        }
    }

    fn dir(&self, ino: Ino) -> Result<Inode> {
        let i = self.inode(ino)?;
        if i.kind() != Kind::Dir {
            return Err(Error::not_dir(format!("inode {ino} is not a directory")));
        }
        Ok(i)
    }

    /// A directory that can take new entries: not removed (a removed
    /// directory may still be open, but POSIX gives it no new names).
    fn live_dir(&self, ino: Ino) -> Result<Inode> {
        let i = self.dir(ino)?;
        if i.nlink == 0 {
            return Err(Error::not_found(format!("directory {ino} was removed")));
        }
        Ok(i)
    }

    fn attr(&self, i: &Inode) -> Attr {
        Attr {
            ino: i.ino,
            kind: i.kind(),
            mode: i.mode,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            size: i.size,
            blocks: i.alloc.div_ceil(512),
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            btime: i.btime,
            blksize: self.cfg.chunk_size,
        }
    }

    /// Before an operation that changes anything but only removes:
    /// commit first when the group or the buffers are past their bounds,
    /// so that one more operation fits in the group; and mark the group
    /// as one that may not use the reserve.
    fn pre_op(&mut self) -> Result<()> {
        self.bound_group()?;
        self.grew = true;
        Ok(())
    }

    /// Commit when the group or the buffers are past their bounds; EROFS
    /// when nothing may change.
    fn bound_group(&mut self) -> Result<()> {
        if self.read_only {
            return Err(Error::read_only("the file system is open read-only"));
        }
        if self.pend.bytes + self.dirty_chunks * 64 > self.max_group / 2
            || self.dirty_bytes > self.dirty_limit
        {
            self.commit()?;
        }
        Ok(())
    }

    /// Group bytes left before a commit is needed inside a long operation.
    fn group_full(&self) -> bool {
        self.pend.bytes + self.dirty_chunks * 64 > self.max_group * 3 / 4
    }

    /// Write the group: compress and store buffered chunks, then apply all
    /// pending mutations as one atomic engine batch.
    fn commit(&mut self) -> Result<()> {
        // A group that only removes or renames may use part of the reserve,
        // so that a full file system can still delete.
        let room = if self.grew || !self.dirty.is_empty() { Room::User } else { Room::Relieve };
        self.commit_as(room)
    }

    /// Commit, allowed to use `room` of the log's reserve.
    fn commit_as(&mut self, room: Room) -> Result<()> {
        self.epoch += 1;
        if !self.dirty.is_empty() {
            match self.store_dirty(room) {
                Err(Error::NoSpace(_)) if !self.cleaning => {
                    // Clean, then try once more; then, since the data was
                    // accepted, with the part of the reserve deletes may
                    // use (the index and checkpoints may have taken the
                    // room counted when it was accepted).
                    self.clean_for(self.dirty_bytes as u64)?;
                    match self.store_dirty(room) {
                        Err(Error::NoSpace(_)) if room == Room::User => self.store_dirty(Room::Relieve)?,
                        r => r?,
                    }
                }
                r => r?,
            }
        }
        if self.cfg_dirty {
            let v = self.cfg.encode();
            self.put(config_key(), v);
            self.cfg_dirty = false;
        }
        if self.pend.is_empty() {
            return Ok(());
        }
        let dev = self.eng.device_bytes_written();
        self.counters.device_bytes += dev.saturating_sub(self.dev_seen);
        self.dev_seen = dev;
        if self.counters != self.counters_saved {
            self.put(counters_key(), self.counters.encode());
        }
        let mut b = WriteBatch::new();
        b.room = room;
        for (k, v) in &self.pend.map {
            match v {
                Some(v) => b.put(k.clone(), v.clone()),
                None => b.delete(k.clone()),
            };
        }
        for a in &self.pend.frees {
            b.free(*a);
        }
        match self.eng.write(&b).map_err(Error::from) {
            // The group was accepted against the room counted then, which
            // the index and checkpoints may have taken since: its journal
            // record (a group is bounded to a fraction of a segment) may
            // use the part of the reserve deletes may use, rather than
            // fail every later change. Nothing was placed by the failure.
            Err(Error::NoSpace(_)) if room == Room::User => {
                b.room = Room::Relieve;
                self.eng.write(&b)?;
            }
            r => {
                r?;
            }
        }
        self.pend = Pending::default();
        self.grew = false;
        self.counters_saved = self.counters;
        self.stats.commits += 1;
        self.space_hint = self.free_now();
        Ok(())
    }

    /// Before buffering `len` more bytes: when the buffered data could
    /// outgrow the free log (counted uncompressed), commit first to learn
    /// what it really takes; ENOSPC when the log is full.
    fn pre_write(&mut self, len: usize) -> Result<()> {
        if (self.dirty_bytes + len) as u64 <= self.space_hint {
            return Ok(());
        }
        self.commit()?;
        self.space_hint = self.free_now();
        if len as u64 > self.space_hint {
            // Blocks freed by deletes count as free once their journal
            // record is durable: sync, and look again.
            self.eng.sync()?;
            self.space_hint = self.free_now();
        }
        if len as u64 > self.space_hint && !self.cleaning {
            // Clean segments with dead space until the write fits.
            self.clean_for(len as u64)?;
        }
        if len as u64 > self.space_hint {
            return Err(Error::NoSpace(format!(
                "{} bytes free in the log for a write of {len} bytes",
                self.space_hint
            )));
        }
        Ok(())
    }

    /// Free log bytes for writes other than into reserved chunks: the
    /// free segments outside the reserve, less what fallocate reserved.
    fn free_now(&self) -> u64 {
        self.eng.free_bytes().saturating_sub(self.counters.reserved)
    }

    /// Before an operation that adds about `len` bytes of records (a new
    /// inode, name or xattr): the group must still fit outside the
    /// reserve once it holds them, so that it can always be committed. A
    /// group that cannot would fail every later change, deletes too. So
    /// commit first when the log may be short of room, and answer ENOSPC
    /// when it is: the room left in the log's current segment and the
    /// free ones counts here, as the commit places its records there.
    fn pre_grow(&mut self, len: usize) -> Result<()> {
        let need = |st: &State| (st.dirty_bytes + st.pend.bytes + len) as u64;
        if need(self) <= self.space_hint {
            return Ok(());
        }
        self.commit()?;
        let room = |st: &State| st.eng.room_bytes(Room::User);
        if need(self) > room(self) {
            self.eng.sync()?;
        }
        if need(self) > room(self) && !self.cleaning {
            self.clean_for(need(self))?;
        }
        if need(self) > room(self) {
            return Err(Error::NoSpace(format!(
                "{} bytes of room in the log for {len} bytes of new records",
                room(self)
            )));
        }
        Ok(())
    }

    /// Before an operation that only removes or shrinks (unlink, rmdir,
    /// rename, truncate, a punched hole): when the log is short of room
    /// and the group holds new records or data, commit it first, while
    /// it fits outside the reserve, so that the removal commits on its
    /// own and may use the part of the reserve kept for it.
    fn pre_relieve(&mut self) -> Result<()> {
        self.bound_group()?;
        let seg = u64::from(self.eng.superblock().geometry.segment_size);
        let held = (self.pend.bytes + self.dirty_bytes) as u64;
        if (self.grew || !self.dirty.is_empty()) && self.space_hint < held + 4 * seg {
            self.commit()?;
        }
        Ok(())
    }

    fn alloc_ino(&mut self) -> Ino {
        self.grew = true;
        let i = self.cfg.next_ino;
        self.cfg.next_ino += 1;
        self.cfg_dirty = true;
        i
    }

    /// Delete what an orphan record says is left to delete.
    fn finish_orphans(&mut self) -> Result<()> {
        let (lo, hi) = orphans_range();
        loop {
            let batch = self.scan(&lo, &hi, 64)?;
            if batch.is_empty() {
                return Ok(());
            }
            for (k, v) in batch {
                let ino =
                    parse_orphan_key(&k).ok_or_else(|| Error::corrupt("orphan key", format!("{k:02x?}")))?;
                let from = zlogfs_engine::bytes::Reader::new(&v, "orphan record").var()?;
                self.trim_all(ino, from)?;
            }
        }
    }
}
