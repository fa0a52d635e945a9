//! Keys and records of the file system in the index (the fs layer's
//! records, versioned by [`FS_VERSION`]; see docs/FORMAT.md, "File system
//! records"), one file per kind: the key space ([`key`]), the config and
//! counters ([`config`]), inodes and directory entries ([`inode`]), file
//! chunks and patches ([`extent`]), times ([`time`]), snapshots
//! ([`snapshot`]).
//!
//! Every key starts with a one-byte tag, then big-endian integers, so that
//! related records sit next to each other: an inode's attributes, a
//! directory's entries by name, a file's chunks by offset, its xattrs by
//! name.

mod config;
mod extent;
mod inode;
mod key;
mod snapshot;
mod time;

pub use config::*;
pub use extent::*;
pub use inode::*;
pub use key::*;
pub use snapshot::*;
pub use time::*;

/// An inode number. Allocated in creation order, never reused.
pub type Ino = u64;

/// The root directory.
pub const ROOT: Ino = 1;

/// Version of the fs-layer records, kept in the config record.
/// Version 2 added patched chunks (`Extent::Patched`, chunk type 3),
/// version 3 patched chunks that release the replaced part of their base
/// (chunk type 4), version 4 bases that are gone (type 5), version 5
/// chunks reserved by fallocate (`Extent::Reserved`, type 6, and the
/// reserved bytes of the counters record), version 6 inodes with a chunk
/// size of their own ([`Inode::chunk`]), version 7 named snapshots and
/// held frees, version 8 change records ([`change_key`]) and parents of
/// files as well as directories ([`Inode::parent`]), version 9 a tier
/// policy per inode ([`Inode::tier`]), version 10 a compression unit
/// ([`Inode::unit`]), version 11 a cold form ([`Inode::cold`]). An image
/// is marked by the first commit that writes such a record, so images
/// that never had one stay readable by older builds.
pub const FS_VERSION: u8 = 11;

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests;
