//! What a file system is made with ([`MkfsOptions`]) and opened with
//! ([`FsOptions`]).

use std::time::Duration;

use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::engine::Options;

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
    /// Retention policy of automatic points of history (none: only named
    /// snapshots are kept).
    pub history: crate::retention::Policy,
    /// On two devices, files larger than this keep their own chunks on
    /// the bulk one.
    pub small_max: u64,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            chunk_size: 64 << 10,
            pack_bytes: 128 << 10,
            inline_max: 512,
            // Level 2, not 3: zstd's fast strategy, where level 3 takes the
            // double-fast one. Sequential writes through the mount: 248
            // MiB/s against 178, for 4.4% more space on the Linux source
            // tree (docs/decisions/2026-11-25-default-codec-zstd2.md).
            codec: CodecSpec::new(CodecId::Zstd, 2),
            root_uid: 0,
            root_gid: 0,
            history: crate::retention::Policy::NONE,
            small_max: crate::keys::DEFAULT_SMALL_MAX,
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
    /// (crates/fs/src/ops/patch.rs). On by default; off, every
    /// overwrite rewrites its whole chunk.
    pub patches: bool,
    /// Open for reading only (a store opened read-only): nothing is
    /// written, not even what recovery or an open's orphans would; every
    /// change fails with EROFS, and reads update no atime.
    pub read_only: bool,
    /// Open the named snapshot instead of the present (read-only).
    pub snapshot: Option<String>,
    /// Open the kept point this names instead of the present (read-only):
    /// a clock token of one, or a time (the newest at or before it).
    pub at: Option<String>,
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
            snapshot: None,
            at: None,
        }
    }
}
