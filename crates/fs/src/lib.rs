//! The POSIX file system layer: inodes, directories, links, xattrs and file
//! data as records of the index plus compressed data blocks in the log.
//! Usable as a library; the FUSE mount and the command-line tool are thin
//! front ends over [`Fs`].
//!
//! - Records and their encodings: [`keys`].
//! - Operations accepted since the last commit are one group, written to
//!   the engine as one atomic batch; file data is buffered per chunk and
//!   compressed when the group commits (on fsync, every commit interval,
//!   and when buffers pass their bounds).
//! - At commit, chunks of small files are packed together into shared
//!   blocks, very small files go inline into the index, all-zero chunks
//!   become holes, small overwrites of stored chunks become patches beside
//!   them, and the other chunks are compressed one block each; all blocks
//!   of a group are compressed in parallel.
//!
//! Inside, one lock guards the state ([`state`]), which is made of parts
//! that own their fields: the commit group ([`group`]), the chunk buffers
//! with compression ahead ([`buffers`]), the block cache with its epoch
//! ([`cache`]). The operations are `impl` blocks over it, by job:
//! [`namespace`], [`files`], [`xattr`], [`data`] (read, write, store,
//! trim), [`commit`], [`clean`], [`check`]; patch planning is pure code
//! ([`patch`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod changes;
pub mod history;
pub mod keys;

mod acl;
mod attr;
mod buffers;
mod cache;
mod check;
mod clean;
mod commit;
mod data;
mod error;
mod files;
mod filesystem;
mod forward;
mod group;
mod live;
mod namespace;
mod options;
mod patch;
mod pending;
mod points;
mod scrub;
mod snapshot;
mod state;
mod stats;
mod worker;
mod xattr;

use std::sync::{Mutex, MutexGuard};

pub use attr::{Attr, Caller, DirEntry, SetAttr, StatFs};
pub use attr::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
pub use attr::{RENAME_EXCHANGE, RENAME_NOREPLACE};
pub use attr::{XATTR_CHUNK, XATTR_CODEC, XATTR_CREATE, XATTR_KILL_SGID, XATTR_PHYSICAL, XATTR_REPLACE};
pub use attr::{XATTR_COLD, XATTR_TIER, XATTR_UNIT};
pub use changes::{ChangeFeed, ChangeOp, FileChange};
pub use check::{CheckReport, CodecUse, TreeUsage, Usage, CHECK_MEMORY};
pub use clean::{CleanOptions, CleanReport};
pub use error::{Error, Result};
pub use files::MAX_FILE_SIZE;
pub use filesystem::{mkfs, now, Fs, Invalidator};
pub use keys::{Config, Counters, Ino, Inode, Kind, Time, DEFAULT_SMALL_MAX, ROOT};
pub use live::Live;
pub use namespace::MAX_SYMLINK;
pub use options::{Atime, FsOptions, MkfsOptions, SyncMode};
pub use scrub::{ScrubOptions, ScrubReport};
pub use snapshot::parse_time;
pub use stats::FsStats;

/// Lock `m`, taking over a lock that a panicking thread left poisoned (the
/// panic is reported where it happened; the commit thread must not die of
/// it too).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
