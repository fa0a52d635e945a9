//! The types operations take and give: attributes, directory entries,
//! the caller, attribute changes, and the flags of rename, fallocate and
//! setxattr.

use crate::keys::{Ino, Kind, Time, S_IFMT};

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

/// Changes of [`Fs::setattr`](crate::Fs::setattr); None leaves a field alone.
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

/// Flags of [`Fs::rename`](crate::Fs::rename).
pub const RENAME_NOREPLACE: u32 = 1;

/// Flags of [`Fs::rename`](crate::Fs::rename).
pub const RENAME_EXCHANGE: u32 = 2;

/// Flags of [`Fs::fallocate`](crate::Fs::fallocate) (Linux values).
pub const FALLOC_FL_KEEP_SIZE: u32 = 1;

/// Deallocate the range (with KEEP_SIZE).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 2;

/// Zero the range.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// Flags of [`Fs::setxattr`](crate::Fs::setxattr).
pub const XATTR_CREATE: u32 = 1;

/// Flags of [`Fs::setxattr`](crate::Fs::setxattr).
pub const XATTR_REPLACE: u32 = 2;

/// Flag of [`Fs::setxattr`](crate::Fs::setxattr), zlogfs's own: setting this access ACL clears
/// the set-group-ID bit (the caller is neither in the file's group nor
/// has CAP_FSETID; the kernel says so with `FUSE_SETXATTR_ACL_KILL_SGID`).
pub const XATTR_KILL_SGID: u32 = 1 << 31;

/// The xattr holding a file's or directory's codec policy.
pub const XATTR_CODEC: &[u8] = b"user.zlogfs.codec";

/// The xattr holding a file's chunk size (settable while the file holds
/// no data) or a directory's (inherited by the files and directories made
/// in it): "4K" to the image's chunk size, a power of two. Not listed by
/// listxattr, so that copies (which set xattrs after the data) do not
/// trip over it.
pub const XATTR_CHUNK: &[u8] = b"user.zlogfs.chunk";

/// The xattr holding a file's or directory's device policy on an image
/// of two devices (inherited by the files and directories made in a
/// directory): "fast" or "bulk" puts its data there whatever its size;
/// "auto" (or none) goes by the image's small-file size.
pub const XATTR_TIER: &[u8] = b"user.zlogfs.tier";

/// The xattr holding a file's or directory's compression unit (inherited
/// by the files and directories made in a directory): "4K" to "1M", a
/// power of two; whole chunks stored together, one after another, are
/// compressed together in blocks of up to this size (a unit no larger
/// than the chunk size stores each chunk alone). Settable at any time: it
/// applies to chunks stored from then on. Not listed by listxattr.
pub const XATTR_UNIT: &[u8] = b"user.zlogfs.unit";

/// The xattr holding a file's or directory's cold form (inherited by the
/// files and directories made in a directory): "UNIT CODEC", such as
/// "256K zstd:9". The cleaner stores the whole chunks it moves that way:
/// compressed together in units of up to UNIT bytes with CODEC, where
/// writes keep the file's own unit and codec. Data stays put long enough
/// to be cleaned only if it is not rewritten, so the costlier form is
/// paid once, off the write path, for data that is read rather than
/// written; `zlogfs clean --max-live 1` moves everything now. Not listed
/// by listxattr.
pub const XATTR_COLD: &[u8] = b"user.zlogfs.cold";

/// The read-only xattr giving a file's stored (compressed) bytes.
pub const XATTR_PHYSICAL: &[u8] = b"user.zlogfs.physical";
