//! Where segments live. A store is a set of fixed-size segments addressed by
//! (segment, offset), plus a few fixed 4 KiB metadata slots kept apart from
//! the segments: the superblock (0), the two checkpoint slots (1 and 2),
//! two devices' pairing record (3) and the superblock's copy (15).
//!
//! Contract (what lets a segment become one object in an object store, or
//! live on a second device, without a format change):
//! - inside a segment, the engine only appends: a write starts at the end of
//!   what the engine considers the segment's valid contents (after a crash
//!   that is the end of the recovered log, which may be before bytes a torn
//!   write left behind);
//! - a written segment is written again only from offset 0, and only once
//!   nothing in it is live and neither checkpoint's recovery reads it; a
//!   store that must know sees that offset-0 write (a bucket starts a new
//!   generation there): [`Store::freed`] may come later or not at all;
//! - metadata slots are rewritten whole, always 4 KiB at a time;
//! - nothing is durable until [`Store::sync`] returns `Ok`.

use std::io;
use std::sync::Arc;

#[cfg(any(test, feature = "testing"))]
mod fault;
mod file;
mod mem;
mod metered;
mod two;

#[cfg(any(test, feature = "testing"))]
pub use fault::{CrashMode, FaultConfig, FaultStore, OpKind, Target};
pub use file::FileStore;
pub use mem::MemStore;
pub(crate) use metered::Metered;
pub use two::{check_not_a_copy, check_pair, Pairing, TwoStore};

/// Size of one metadata slot.
pub const META_SLOT_SIZE: usize = 4096;
/// Bytes reserved at the start of an image file or device for metadata
/// slots; segment 0 starts here. Room for 16 slots, 5 used today.
pub const META_AREA_SIZE: u64 = 64 * 1024;
/// The unit a device writes atomically at best; torn writes tear here.
pub const SECTOR_SIZE: usize = 512;

/// A fixed metadata slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaSlot {
    /// The superblock: written at mkfs, read at open.
    Super,
    /// Checkpoint slot A (even checkpoint numbers).
    CheckpointA,
    /// Checkpoint slot B (odd checkpoint numbers).
    CheckpointB,
    /// Of two devices, on each: which use of the pair it last took part
    /// in ([`crate::store::two`]'s pairing record), so that an older copy
    /// of one device is refused beside the other.
    Pairing,
    /// A copy of the superblock, in the last slot: read when the
    /// superblock is damaged.
    SuperCopy,
}

impl MetaSlot {
    /// The slot's index in the metadata area.
    pub fn index(self) -> u64 {
        match self {
            MetaSlot::Super => 0,
            MetaSlot::CheckpointA => 1,
            MetaSlot::CheckpointB => 2,
            MetaSlot::Pairing => 3,
            MetaSlot::SuperCopy => 15,
        }
    }
}

/// Metadata slots a store keeps (the metadata area's 16).
pub const META_SLOTS: usize = 16;

/// The shape of a store's segment space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per segment; a multiple of [`SECTOR_SIZE`].
    pub segment_size: u32,
    /// Number of segments.
    pub segment_count: u32,
}

impl Geometry {
    /// Total bytes of segment space.
    pub fn capacity(&self) -> u64 {
        u64::from(self.segment_size) * u64::from(self.segment_count)
    }
}

/// A device holding segments and metadata slots.
///
/// Implementations are shared between threads; every method takes `&self`.
/// Reads and writes outside the geometry fail with `InvalidInput`.
pub trait Store: Send + Sync {
    /// The segment space.
    fn geometry(&self) -> Geometry;
    /// Read a whole metadata slot.
    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()>;
    /// Overwrite a whole metadata slot (not durable until [`Store::sync`]).
    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()>;
    /// Read `buf.len()` bytes of segment `seg` at `offset`. Bytes never
    /// written read as zeros.
    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()>;
    /// Append `data` to segment `seg` at `offset` (see the module contract).
    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()>;
    /// Make every write so far durable.
    fn sync(&self) -> io::Result<()>;
    /// The engine no longer needs segment `seg`; it may be rewritten from
    /// offset 0. A hint: an implementation may do nothing.
    fn discard(&self, seg: u32) -> io::Result<()>;
    /// Of an image of two stores ([`TwoStore`]): the segments of the fast
    /// one (they come first). None for one store.
    fn fast_segments(&self) -> Option<u32> {
        None
    }
    /// Of an image of two stores: the paths of the fast and the bulk one.
    fn names(&self) -> Option<(String, String)> {
        None
    }
    /// The engine has left segment `seg` and appends nothing more to it
    /// until it is written again from offset 0. A hint (a store that keeps
    /// segments as objects uploads it whole); the default does nothing.
    fn sealed(&self, _seg: u32) {}
    /// Segment `seg` holds nothing the image needs any more (nothing
    /// live, nothing recovery reads from either checkpoint): the engine
    /// may write it again from offset 0 at any time. A hint (a store that
    /// keeps segments as objects deletes them); the default does nothing.
    fn freed(&self, _seg: u32) {}
    /// Whether segment `seg` can be read without a request to another
    /// machine (a store in a bucket: whether its cache holds it whole).
    /// The cleaner prefers such victims. True for a local store.
    fn cached(&self, _seg: u32) -> bool {
        true
    }
    /// The engine closes cleanly (after its last sync): a store that keeps
    /// data elsewhere finishes sending it, and says when it cannot.
    fn close(&self) -> io::Result<()> {
        Ok(())
    }
    /// Of a read-only store of an image that another process writes
    /// elsewhere (an object store): a store of the image's newest durable
    /// state, when it is newer than this one's; open a new engine on it.
    /// This store keeps serving the state it had to the engines open on
    /// it (reads may get slower), for as long as the writer keeps that
    /// state's data. None for a local store, or when nothing is newer.
    fn refresh(&self) -> io::Result<Option<Arc<dyn Store>>> {
        Ok(None)
    }
    /// Of a store that keeps its segments elsewhere (an object store): its
    /// requests, traffic and cache. None for a local store.
    fn remote_stats(&self) -> Option<RemoteStats> {
        None
    }
}

/// What a store that keeps its segments in an object store did since it
/// was opened ([`Store::remote_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Objects written (segment pieces and manifests).
    pub puts: u64,
    /// Object reads (whole or ranges).
    pub gets: u64,
    /// Listings.
    pub lists: u64,
    /// Objects deleted.
    pub deletes: u64,
    /// Bytes uploaded.
    pub bytes_up: u64,
    /// Bytes downloaded.
    pub bytes_down: u64,
    /// Reads served by the local cache.
    pub cache_hits: u64,
    /// Reads that had to fetch from the object store.
    pub cache_misses: u64,
    /// Bytes the cache holds that the object store does not yet have.
    pub backlog_bytes: u64,
    /// Request attempts that failed (errors, timeouts, 429 and 5xx
    /// replies): each was retried, or failed its request.
    pub failed_attempts: u64,
    /// The newest manifest this store wrote or read.
    pub manifest: u64,
}

fn check_range(g: Geometry, seg: u32, offset: u32, len: usize) -> io::Result<()> {
    let end = u64::from(offset) + len as u64;
    if seg >= g.segment_count || end > u64::from(g.segment_size) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "segment {seg} offset {offset} length {len} is outside the store \
                 ({} segments of {} bytes)",
                g.segment_count, g.segment_size
            ),
        ));
    }
    Ok(())
}
