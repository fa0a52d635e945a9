//! Counters of an open file system ([`crate::Fs::stats`]), and its
//! operations' times in the process's metrics.

use std::sync::{Arc, OnceLock};

use zlogfs_engine::metrics::{self, Histogram};

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
    /// Automatic points of history dropped for room.
    pub points_dropped: u64,
    /// Counted live bytes of the segments the cleaner freed, when picked.
    pub clean_live: u64,
    /// atime updates dropped: the log had no room outside the reserve, or
    /// the commit that would have made room for them failed.
    pub atime_dropped: u64,
    /// Errors of background work (the commit thread's commits and syncs,
    /// background cleaning), each also logged.
    pub background_errors: u64,
    /// The last of them.
    pub last_background_error: Option<String>,
    /// The error that stopped the engine's background flush and merge
    /// (the engine then writes nothing more until reopened).
    pub engine_background_error: Option<String>,
}

/// The file system's operations in the process's metrics
/// ([`zlogfs_engine::metrics`]), their handles kept for the hot paths.
pub(crate) struct OpTimes {
    /// A commit group written (by a writer, fsync, the commit thread).
    pub(crate) commit: Arc<Histogram>,
    /// fsync and fdatasync of a file or directory.
    pub(crate) fsync: Arc<Histogram>,
    /// A sync of the whole file system (syncfs, `zlogfs sync`).
    pub(crate) sync: Arc<Histogram>,
    /// One round of the cleaner (on demand or in the background).
    pub(crate) clean_round: Arc<Histogram>,
    /// A cleaning pass asked for (`zlogfs clean`).
    pub(crate) clean: Arc<Histogram>,
}

/// The handles.
pub(crate) fn op_times() -> &'static OpTimes {
    static T: OnceLock<OpTimes> = OnceLock::new();
    T.get_or_init(|| {
        let m = metrics::global();
        OpTimes {
            commit: m.op("commit"),
            fsync: m.op("fsync"),
            sync: m.op("sync"),
            clean_round: m.op("clean.round"),
            clean: m.op("clean.pass"),
        }
    })
}
