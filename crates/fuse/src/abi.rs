//! The FUSE wire protocol (`include/uapi/linux/fuse.h`, protocol 7.40):
//! requests parsed from the kernel's bytes, replies encoded into bytes.
//!
//! Both transports give a request in the same three parts: the 40-byte
//! `fuse_in_header`, the operation's fixed-size argument struct, and the
//! variable part after it (names, write data). `/dev/fuse` delivers them
//! back to back in one read ([`split_dev`] cuts them apart); io_uring
//! delivers them in three separate areas of a ring entry. Every field is
//! read with bounds checks: a short or malformed request is an error
//! ([`Bad`]), answered with EIO, never a panic.

use std::time::Duration;

/// The protocol major version we speak.
pub const MAJOR: u32 = 7;
/// The protocol minor version we announce (the layouts below are 7.40's).
pub const MINOR: u32 = 40;
/// The oldest kernel minor version we serve (Linux 4.3): every layout we
/// read or write is the same from there to [`MINOR`].
pub const MIN_KERNEL_MINOR: u32 = 23;

/// `sizeof(struct fuse_in_header)`.
pub const IN_HEADER: usize = 40;
/// `sizeof(struct fuse_out_header)`.
pub const OUT_HEADER: usize = 16;

/// Operation codes (`enum fuse_opcode`).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
}

/// The name of an opcode, lower case ("read"), or None for one this
/// server does not know.
pub fn op_name(opcode: u32) -> Option<&'static str> {
    Some(match opcode {
        op::LOOKUP => "lookup",
        op::FORGET => "forget",
        op::GETATTR => "getattr",
        op::SETATTR => "setattr",
        op::READLINK => "readlink",
        op::SYMLINK => "symlink",
        op::MKNOD => "mknod",
        op::MKDIR => "mkdir",
        op::UNLINK => "unlink",
        op::RMDIR => "rmdir",
        op::RENAME => "rename",
        op::LINK => "link",
        op::OPEN => "open",
        op::READ => "read",
        op::WRITE => "write",
        op::STATFS => "statfs",
        op::RELEASE => "release",
        op::FSYNC => "fsync",
        op::SETXATTR => "setxattr",
        op::GETXATTR => "getxattr",
        op::LISTXATTR => "listxattr",
        op::REMOVEXATTR => "removexattr",
        op::FLUSH => "flush",
        op::INIT => "init",
        op::OPENDIR => "opendir",
        op::READDIR => "readdir",
        op::RELEASEDIR => "releasedir",
        op::FSYNCDIR => "fsyncdir",
        op::GETLK => "getlk",
        op::SETLK => "setlk",
        op::SETLKW => "setlkw",
        op::ACCESS => "access",
        op::CREATE => "create",
        op::INTERRUPT => "interrupt",
        op::BMAP => "bmap",
        op::DESTROY => "destroy",
        op::IOCTL => "ioctl",
        op::POLL => "poll",
        op::BATCH_FORGET => "batch_forget",
        op::FALLOCATE => "fallocate",
        op::READDIRPLUS => "readdirplus",
        op::RENAME2 => "rename2",
        op::LSEEK => "lseek",
        op::COPY_FILE_RANGE => "copy_file_range",
        op::SYNCFS => "syncfs",
        op::TMPFILE => "tmpfile",
        _ => return None,
    })
}

/// INIT flags (`FUSE_*` capability bits; bits 32-63 travel in `flags2`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    /// Not asked for (see `dev::WANT`); named for the test that says so.
    #[cfg_attr(not(test), expect(dead_code, reason = "only the test that says it is off names it"))]
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    /// With `HANDLE_KILLPRIV_V2`: clear the set-ID bits (a truncate by a
    /// caller without CAP_FSETID, or a chown).
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_write_in.write_flags`: with `HANDLE_KILLPRIV_V2`, the writer has
/// no CAP_FSETID, so the set-ID bits go.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_setxattr_in.setxattr_flags`: setting this access ACL clears the
/// set-group-ID bit (the caller is neither in the file's group nor has
/// CAP_FSETID).
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// `fuse_open_out.open_flags` bits.
pub mod fopen {
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const NOFLUSH: u32 = 1 << 5;
}

/// A request the kernel sent that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad(pub &'static str);

#[cfg(test)]
fn u16_at(b: &[u8], o: usize) -> Result<u16, Bad> {
    b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or(Bad("short request"))
}

pub(super) fn u32_at(b: &[u8], o: usize) -> Result<u32, Bad> {
    b.get(o..o + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or(Bad("short request"))
}

pub(super) fn u64_at(b: &[u8], o: usize) -> Result<u64, Bad> {
    let s = b.get(o..o + 8).ok_or(Bad("short request"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

/// The NUL-terminated string at the start of `b`, and what follows it.
fn cstr(b: &[u8]) -> Result<(&[u8], &[u8]), Bad> {
    let n = b.iter().position(|&c| c == 0).ok_or(Bad("name without NUL"))?;
    Ok((&b[..n], &b[n + 1..]))
}

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Length of the whole request (header, arguments, data).
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Result<InHeader, Bad> {
        if b.len() < IN_HEADER {
            return Err(Bad("short header"));
        }
        Ok(InHeader {
            len: u32_at(b, 0)?,
            opcode: u32_at(b, 4)?,
            unique: u64_at(b, 8)?,
            nodeid: u64_at(b, 16)?,
            uid: u32_at(b, 24)?,
            gid: u32_at(b, 28)?,
            pid: u32_at(b, 32)?,
        })
    }
}

/// The size of `opcode`'s fixed argument struct, as the kernel sends it
/// to a file system that announced [`MINOR`] and agreed on the INIT
/// `flags` (`FUSE_SETXATTR_EXT` makes SETXATTR's struct 16 bytes). Unknown
/// operations: 0 (everything is data).
pub fn arg_size(opcode: u32, flags: u64) -> usize {
    match opcode {
        op::SETXATTR if flags & init::SETXATTR_EXT != 0 => 16,
        op::FORGET | op::OPEN | op::OPENDIR | op::MKDIR | op::RENAME | op::LINK => 8,
        op::GETXATTR | op::LISTXATTR | op::SETXATTR | op::ACCESS | op::INTERRUPT => 8,
        op::BATCH_FORGET | op::SYNCFS => 8,
        op::GETATTR | op::FSYNC | op::FSYNCDIR | op::MKNOD | op::CREATE | op::TMPFILE => 16,
        op::RENAME2 | op::BMAP => 16,
        op::RELEASE | op::RELEASEDIR | op::FLUSH | op::LSEEK | op::POLL => 24,
        op::FALLOCATE | op::IOCTL => 32,
        op::READ | op::WRITE | op::READDIR | op::READDIRPLUS => 40,
        op::GETLK | op::SETLK | op::SETLKW => 48,
        op::COPY_FILE_RANGE => 56,
        op::SETATTR => 88,
        op::INIT => 64,
        _ => 0,
    }
}

/// Cut a request read from `/dev/fuse` into its header, argument struct
/// and data, under the INIT `flags` agreed (0 before INIT).
pub fn split_dev(msg: &[u8], flags: u64) -> Result<(InHeader, &[u8], &[u8]), Bad> {
    let h = InHeader::parse(msg)?;
    if h.len as usize != msg.len() {
        return Err(Bad("request length differs from what was read"));
    }
    let body = &msg[IN_HEADER..];
    let size = arg_size(h.opcode, flags);
    let n = size.min(body.len());
    // INIT's struct grew over the versions: an older kernel sends less.
    if n < size && h.opcode != op::INIT {
        return Err(Bad("short argument struct"));
    }
    Ok((h, &body[..n], &body[n..]))
}

/// What `SETATTR` changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Setattr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// `Some(None)`: set to now.
    pub atime: Option<Option<(i64, u32)>>,
    pub mtime: Option<Option<(i64, u32)>>,
    /// `FATTR_KILL_SUIDGID`: the change clears set-ID bits.
    pub kill_setid: bool,
}

/// One request's operation and its arguments, borrowed from the buffer
/// the request arrived in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    Lookup {
        name: &'a [u8],
    },
    /// FORGET: the kernel drops `nlookup` of its lookups of the request's
    /// node. No reply.
    Forget {
        nlookup: u64,
    },
    /// BATCH_FORGET: FORGETs of several nodes, as (node, nlookup) pairs
    /// of 16 bytes each ([`Op::batch_forgets`]). No reply.
    BatchForget {
        items: &'a [u8],
    },
    Getattr,
    Setattr(Setattr),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        name: &'a [u8],
        newdir: u64,
        newname: &'a [u8],
        flags: u32,
    },
    Link {
        ino: u64,
        newname: &'a [u8],
    },
    Open {
        /// open(2)'s flags.
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
        /// The descriptor's open flags (`O_NOATIME`).
        flags: u32,
    },
    Write {
        offset: u64,
        data: &'a [u8],
        /// [`WRITE_KILL_SUIDGID`]: the writer has no CAP_FSETID.
        kill_setid: bool,
    },
    Statfs,
    Release,
    Flush,
    Fsync {
        datasync: bool,
    },
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        flags: u32,
        /// [`SETXATTR_ACL_KILL_SGID`].
        kill_sgid: bool,
    },
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir,
    Fsyncdir {
        datasync: bool,
    },
    Access,
    Create {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    /// INTERRUPT: answered ENOSYS once, after which the kernel sends none.
    Interrupt,
    Destroy,
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        offset: u64,
        whence: u32,
    },
    CopyFileRange {
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    },
    Syncfs,
    /// An operation we do not implement: answered ENOSYS, and the kernel
    /// stops sending it or falls back (locks are then the kernel's own).
    Unsupported(u32),
}

impl<'a> Op<'a> {
    /// Parse operation `opcode` from its argument struct and its data.
    ///
    /// Longer than a screen on purpose: one arm per opcode, each the
    /// layout of the kernel's struct for it (include/uapi/linux/fuse.h),
    /// read top to bottom beside that header.
    pub fn parse(opcode: u32, arg: &'a [u8], data: &'a [u8]) -> Result<Op<'a>, Bad> {
        let name = || cstr(data).map(|(n, _)| n);
        Ok(match opcode {
            op::LOOKUP => Op::Lookup { name: name()? },
            op::FORGET => Op::Forget { nlookup: u64_at(arg, 0)? },
            op::BATCH_FORGET => {
                let count = u32_at(arg, 0)? as usize;
                let items = count
                    .checked_mul(16)
                    .and_then(|n| data.get(..n))
                    .ok_or(Bad("batch forget shorter than its count"))?;
                Op::BatchForget { items }
            }
            op::GETATTR => Op::Getattr,
            op::SETATTR => {
                let valid = u32_at(arg, 0)?;
                let has = |bit| valid & bit != 0;
                let time = |set, now, sec_at, nsec_at| -> Result<Option<Option<(i64, u32)>>, Bad> {
                    Ok(if has(now) {
                        Some(None)
                    } else if has(set) {
                        Some(Some((u64_at(arg, sec_at)? as i64, u32_at(arg, nsec_at)?)))
                    } else {
                        None
                    })
                };
                Op::Setattr(Setattr {
                    mode: if has(fattr::MODE) { Some(u32_at(arg, 68)?) } else { None },
                    uid: if has(fattr::UID) { Some(u32_at(arg, 76)?) } else { None },
                    gid: if has(fattr::GID) { Some(u32_at(arg, 80)?) } else { None },
                    size: if has(fattr::SIZE) { Some(u64_at(arg, 16)?) } else { None },
                    atime: time(fattr::ATIME, fattr::ATIME_NOW, 32, 56)?,
                    mtime: time(fattr::MTIME, fattr::MTIME_NOW, 40, 60)?,
                    kill_setid: has(fattr::KILL_SUIDGID),
                })
            }
            op::READLINK => Op::Readlink,
            op::SYMLINK => {
                let (name, rest) = cstr(data)?;
                Op::Symlink { name, target: cstr(rest)?.0 }
            }
            op::MKNOD => Op::Mknod {
                name: name()?,
                mode: u32_at(arg, 0)?,
                rdev: u32_at(arg, 4)?,
                umask: u32_at(arg, 8)?,
            },
            op::MKDIR => Op::Mkdir { name: name()?, mode: u32_at(arg, 0)?, umask: u32_at(arg, 4)? },
            op::UNLINK => Op::Unlink { name: name()? },
            op::RMDIR => Op::Rmdir { name: name()? },
            op::RENAME | op::RENAME2 => {
                let (name, rest) = cstr(data)?;
                let flags = if opcode == op::RENAME2 { u32_at(arg, 8)? } else { 0 };
                Op::Rename { name, newdir: u64_at(arg, 0)?, newname: cstr(rest)?.0, flags }
            }
            op::LINK => Op::Link { ino: u64_at(arg, 0)?, newname: name()? },
            op::OPEN => Op::Open { flags: u32_at(arg, 0)? },
            op::READ => Op::Read {
                offset: u64_at(arg, 8)?,
                size: u32_at(arg, 16)?,
                flags: u32_at(arg, 32).unwrap_or(0),
            },
            op::WRITE => {
                let size = u32_at(arg, 16)? as usize;
                let data = data.get(..size).ok_or(Bad("write shorter than its size"))?;
                let kill_setid = u32_at(arg, 20)? & WRITE_KILL_SUIDGID != 0;
                Op::Write { offset: u64_at(arg, 8)?, data, kill_setid }
            }
            op::STATFS => Op::Statfs,
            op::RELEASE => Op::Release,
            op::FLUSH => Op::Flush,
            op::FSYNC => Op::Fsync { datasync: u32_at(arg, 8)? & 1 != 0 },
            op::FSYNCDIR => Op::Fsyncdir { datasync: u32_at(arg, 8)? & 1 != 0 },
            op::SETXATTR => {
                let (name, rest) = cstr(data)?;
                let size = u32_at(arg, 0)? as usize;
                let value = rest.get(..size).ok_or(Bad("xattr value shorter than its size"))?;
                // The extended struct (FUSE_SETXATTR_EXT) has setxattr_flags.
                let ext = if arg.len() >= 16 { u32_at(arg, 8)? } else { 0 };
                Op::Setxattr {
                    name,
                    value,
                    flags: u32_at(arg, 4)?,
                    kill_sgid: ext & SETXATTR_ACL_KILL_SGID != 0,
                }
            }
            op::GETXATTR => Op::Getxattr { name: name()?, size: u32_at(arg, 0)? },
            op::LISTXATTR => Op::Listxattr { size: u32_at(arg, 0)? },
            op::REMOVEXATTR => Op::Removexattr { name: name()? },
            op::OPENDIR => Op::Opendir,
            op::READDIR | op::READDIRPLUS => Op::Readdir {
                offset: u64_at(arg, 8)?,
                size: u32_at(arg, 16)?,
                plus: opcode == op::READDIRPLUS,
            },
            op::RELEASEDIR => Op::Releasedir,
            op::ACCESS => Op::Access,
            op::CREATE => Op::Create { name: name()?, mode: u32_at(arg, 4)?, umask: u32_at(arg, 8)? },
            op::INTERRUPT => Op::Interrupt,
            op::DESTROY => Op::Destroy,
            op::FALLOCATE => {
                Op::Fallocate { offset: u64_at(arg, 8)?, length: u64_at(arg, 16)?, mode: u32_at(arg, 24)? }
            }
            op::LSEEK => Op::Lseek { offset: u64_at(arg, 8)?, whence: u32_at(arg, 16)? },
            op::COPY_FILE_RANGE => Op::CopyFileRange {
                off_in: u64_at(arg, 8)?,
                ino_out: u64_at(arg, 16)?,
                off_out: u64_at(arg, 32)?,
                len: u64_at(arg, 40)?,
            },
            op::SYNCFS => Op::Syncfs,
            other => Op::Unsupported(other),
        })
    }

    /// Whether the kernel expects no reply on `/dev/fuse`.
    pub fn no_reply(&self) -> bool {
        matches!(self, Op::Forget { .. } | Op::BatchForget { .. })
    }

    /// The (node, nlookup) pairs of a BATCH_FORGET.
    pub fn batch_forgets(items: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
        items.chunks_exact(16).map(|c| (u64_at(c, 0).unwrap_or(0), u64_at(c, 8).unwrap_or(0)))
    }
}

/// `struct fuse_init_in`, as much of it as we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32` (flags2 only with `FUSE_INIT_EXT`).
    pub flags: u64,
}

impl InitIn {
    pub fn parse(arg: &[u8]) -> Result<InitIn, Bad> {
        let major = u32_at(arg, 0)?;
        let minor = u32_at(arg, 4)?;
        // A kernel of a newer major version sends only the version.
        let max_readahead = u32_at(arg, 8).unwrap_or(0);
        let lo = u32_at(arg, 12).unwrap_or(0) as u64;
        let hi = if lo & init::INIT_EXT != 0 { u32_at(arg, 16).unwrap_or(0) as u64 } else { 0 };
        Ok(InitIn { major, minor, max_readahead, flags: lo | hi << 32 })
    }
}

/// What we answer INIT with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOut {
    pub flags: u64,
    pub max_readahead: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub max_pages: u16,
}

impl InitOut {
    /// `struct fuse_init_out` (64 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        put32(&mut b, MAJOR);
        put32(&mut b, MINOR);
        put32(&mut b, self.max_readahead);
        put32(&mut b, self.flags as u32);
        b.extend_from_slice(&self.max_background.to_le_bytes());
        b.extend_from_slice(&self.congestion_threshold.to_le_bytes());
        put32(&mut b, self.max_write);
        put32(&mut b, 1); // time_gran: nanoseconds
        b.extend_from_slice(&self.max_pages.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes()); // map_alignment
        put32(&mut b, (self.flags >> 32) as u32);
        b.resize(64, 0);
        b
    }

    /// The answer to an INIT of a newer major version: our version only;
    /// the kernel then sends INIT again in ours.
    pub fn version_only() -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        put32(&mut b, MAJOR);
        put32(&mut b, MINOR);
        b.resize(64, 0);
        b
    }
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// A `struct fuse_out_header` for a reply of `body_len` bytes.
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&((OUT_HEADER + body_len) as u32).to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// Attributes as the kernel takes them (`struct fuse_attr`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    /// Not an attribute: the generation an entry reply carries, which
    /// tells a reused node id from the old one (NFS file handles).
    pub generation: u64,
}

/// `sizeof(struct fuse_attr)`.
const ATTR: usize = 88;
/// `sizeof(struct fuse_entry_out)`.
pub const ENTRY_OUT: usize = 40 + ATTR;
/// `sizeof(struct fuse_dirent)` without its name.
const DIRENT: usize = 24;

fn put_attr(b: &mut Vec<u8>, a: &FileAttr) {
    for v in [a.ino, a.size, a.blocks, a.atime.0 as u64, a.mtime.0 as u64, a.ctime.0 as u64] {
        put64(b, v);
    }
    for v in [a.atime.1, a.mtime.1, a.ctime.1, a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0] {
        put32(b, v);
    }
}

fn split_duration(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// `struct fuse_entry_out` onto `b`.
pub fn put_entry(b: &mut Vec<u8>, a: &FileAttr, entry_ttl: Duration, attr_ttl: Duration) {
    let (es, en) = split_duration(entry_ttl);
    let (as_, an) = split_duration(attr_ttl);
    put64(b, a.ino);
    put64(b, a.generation);
    put64(b, es);
    put64(b, as_);
    put32(b, en);
    put32(b, an);
    put_attr(b, a);
}

/// `struct fuse_attr_out`.
pub fn attr_out(a: &FileAttr, ttl: Duration) -> Vec<u8> {
    let (s, n) = split_duration(ttl);
    let mut b = Vec::with_capacity(16 + ATTR);
    put64(&mut b, s);
    put32(&mut b, n);
    put32(&mut b, 0);
    put_attr(&mut b, a);
    b
}

/// `struct fuse_open_out` onto `b`.
pub fn put_open(b: &mut Vec<u8>, open_flags: u32) {
    put64(b, 0); // fh: nothing is kept per open file
    put32(b, open_flags);
    put32(b, 0);
}

/// `struct fuse_write_out` (also the reply of COPY_FILE_RANGE).
pub fn write_out(n: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&n.to_le_bytes());
    b
}

/// `struct fuse_getxattr_out`: the size of a value or list.
pub fn xattr_size(n: u32) -> [u8; 8] {
    write_out(n)
}

/// `struct fuse_lseek_out`.
pub fn lseek_out(off: u64) -> [u8; 8] {
    off.to_le_bytes()
}

/// `struct fuse_statfs_out`.
#[expect(clippy::too_many_arguments, reason = "one argument per field of the kernel's struct")]
pub fn statfs_out(
    blocks: u64,
    bfree: u64,
    bavail: u64,
    files: u64,
    ffree: u64,
    bsize: u32,
    namelen: u32,
    frsize: u32,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(80);
    for v in [blocks, bfree, bavail, files, ffree] {
        put64(&mut b, v);
    }
    for v in [bsize, namelen, frsize] {
        put32(&mut b, v);
    }
    b.resize(80, 0);
    b
}

/// A READDIR or READDIRPLUS reply, filled up to the size the kernel asked
/// for.
pub struct DirBuf {
    buf: Vec<u8>,
    limit: usize,
}

impl DirBuf {
    pub fn new(limit: u32) -> DirBuf {
        let limit = limit as usize;
        DirBuf { buf: Vec::with_capacity(limit.min(64 << 10)), limit }
    }

    /// Add a `struct fuse_dirent`; false (and nothing added) when it does
    /// not fit.
    pub fn add(&mut self, ino: u64, off: u64, mode: u32, name: &[u8]) -> bool {
        self.push(None, ino, off, mode, name)
    }

    /// Add a `struct fuse_direntplus` (the entry's lookup reply, then its
    /// dirent); false when it does not fit.
    pub fn add_plus(
        &mut self,
        a: &FileAttr,
        off: u64,
        name: &[u8],
        entry_ttl: Duration,
        attr_ttl: Duration,
    ) -> bool {
        self.push(Some((a, entry_ttl, attr_ttl)), a.ino, off, a.mode, name)
    }

    /// Add a `struct fuse_direntplus` with node id 0: the name alone,
    /// for the kernel to look up when it is used.
    pub fn add_plus_unlooked(&mut self, ino: u64, off: u64, mode: u32, name: &[u8]) -> bool {
        let none = FileAttr::default();
        self.push(Some((&none, Duration::ZERO, Duration::ZERO)), ino, off, mode, name)
    }

    fn push(
        &mut self,
        plus: Option<(&FileAttr, Duration, Duration)>,
        ino: u64,
        off: u64,
        mode: u32,
        name: &[u8],
    ) -> bool {
        let head = if plus.is_some() { ENTRY_OUT + DIRENT } else { DIRENT };
        let len = (head + name.len()).next_multiple_of(8);
        if self.buf.len() + len > self.limit {
            return false;
        }
        let start = self.buf.len();
        if let Some((a, e, t)) = plus {
            put_entry(&mut self.buf, a, e, t);
        }
        put64(&mut self.buf, ino);
        put64(&mut self.buf, off);
        put32(&mut self.buf, name.len() as u32);
        put32(&mut self.buf, (mode & libc::S_IFMT) >> 12);
        self.buf.extend_from_slice(name);
        self.buf.resize(start + len, 0);
        true
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as `/dev/fuse` delivers it.
    fn msg(opcode: u32, arg: &[u8], data: &[u8]) -> Vec<u8> {
        let len = IN_HEADER + arg.len() + data.len();
        let mut m = Vec::new();
        put32(&mut m, len as u32);
        put32(&mut m, opcode);
        put64(&mut m, 77); // unique
        put64(&mut m, 5); // nodeid
        for v in [1000u32, 100, 4242, 0] {
            put32(&mut m, v);
        }
        m.extend_from_slice(arg);
        m.extend_from_slice(data);
        m
    }

    fn parse(m: &[u8]) -> Result<(InHeader, Op<'_>), Bad> {
        parse_with(m, 0)
    }

    fn parse_with(m: &[u8], flags: u64) -> Result<(InHeader, Op<'_>), Bad> {
        let (h, arg, data) = split_dev(m, flags)?;
        Ok((h, Op::parse(h.opcode, arg, data)?))
    }

    #[test]
    fn header_and_names() {
        let m = msg(op::LOOKUP, &[], b"file\0");
        let (h, o) = parse(&m).unwrap();
        assert_eq!((h.unique, h.nodeid, h.uid, h.gid, h.pid), (77, 5, 1000, 100, 4242));
        assert_eq!(o, Op::Lookup { name: b"file" });

        let m = msg(op::SYMLINK, &[], b"link\0/target/path\0");
        assert_eq!(parse(&m).unwrap().1, Op::Symlink { name: b"link", target: b"/target/path" });

        let mut arg = Vec::new();
        put64(&mut arg, 9);
        put32(&mut arg, 1); // RENAME_NOREPLACE
        put32(&mut arg, 0);
        let m = msg(op::RENAME2, &arg, b"a\0b\0");
        assert_eq!(parse(&m).unwrap().1, Op::Rename { name: b"a", newdir: 9, newname: b"b", flags: 1 });
        let m = msg(op::RENAME, &arg[..8], b"a\0b\0");
        assert_eq!(parse(&m).unwrap().1, Op::Rename { name: b"a", newdir: 9, newname: b"b", flags: 0 });
    }

    #[test]
    fn write_setxattr_and_setattr() {
        let mut arg = vec![0u8; 40];
        arg[8..16].copy_from_slice(&4096u64.to_le_bytes());
        arg[16..20].copy_from_slice(&3u32.to_le_bytes());
        let m = msg(op::WRITE, &arg, b"abc");
        assert_eq!(parse(&m).unwrap().1, Op::Write { offset: 4096, data: b"abc", kill_setid: false });
        arg[20..24].copy_from_slice(&WRITE_KILL_SUIDGID.to_le_bytes());
        let m = msg(op::WRITE, &arg, b"abc");
        assert_eq!(parse(&m).unwrap().1, Op::Write { offset: 4096, data: b"abc", kill_setid: true });

        let mut arg = Vec::new();
        put32(&mut arg, 2); // value size
        put32(&mut arg, 1); // XATTR_CREATE
        let m = msg(op::SETXATTR, &arg, b"user.x\0vv");
        let x = Op::Setxattr { name: b"user.x", value: b"vv", flags: 1, kill_sgid: false };
        assert_eq!(parse(&m).unwrap().1, x);
        // With FUSE_SETXATTR_EXT the struct is 16 bytes, with the kill flag.
        put32(&mut arg, SETXATTR_ACL_KILL_SGID);
        put32(&mut arg, 0);
        let m = msg(op::SETXATTR, &arg, b"user.x\0vv");
        let x = Op::Setxattr { name: b"user.x", value: b"vv", flags: 1, kill_sgid: true };
        assert_eq!(parse_with(&m, init::SETXATTR_EXT).unwrap().1, x);
        // Read without the flag, the same bytes are a different request.
        assert_ne!(parse(&m).map(|r| r.1), Ok(x));

        let mut arg = vec![0u8; 88];
        let valid = fattr::MODE | fattr::SIZE | fattr::MTIME | fattr::ATIME_NOW | fattr::KILL_SUIDGID;
        arg[0..4].copy_from_slice(&valid.to_le_bytes());
        arg[16..24].copy_from_slice(&123u64.to_le_bytes());
        arg[40..48].copy_from_slice(&(-5i64 as u64).to_le_bytes());
        arg[60..64].copy_from_slice(&9u32.to_le_bytes());
        arg[68..72].copy_from_slice(&0o100644u32.to_le_bytes());
        let m = msg(op::SETATTR, &arg, &[]);
        assert_eq!(
            parse(&m).unwrap().1,
            Op::Setattr(Setattr {
                mode: Some(0o100644),
                size: Some(123),
                atime: Some(None),
                mtime: Some(Some((-5, 9))),
                kill_setid: true,
                ..Setattr::default()
            })
        );
    }

    #[test]
    fn forgets() {
        let m = msg(op::FORGET, &7u64.to_le_bytes(), &[]);
        assert_eq!(parse(&m).unwrap().1, Op::Forget { nlookup: 7 });
        let mut arg = Vec::new();
        put32(&mut arg, 2);
        put32(&mut arg, 0);
        let mut data = Vec::new();
        for v in [5u64, 1, 9, 3] {
            put64(&mut data, v);
        }
        let m = msg(op::BATCH_FORGET, &arg, &data);
        let (_, o) = parse(&m).unwrap();
        let Op::BatchForget { items } = o else { panic!("{o:?}") };
        assert_eq!(Op::batch_forgets(items).collect::<Vec<_>>(), [(5, 1), (9, 3)]);
        // A count past the data is an error, not a short list.
        let m = msg(op::BATCH_FORGET, &arg, &data[..24]);
        assert!(parse(&m).is_err());
    }

    #[test]
    fn malformed_requests_are_errors() {
        // A name without its NUL, a write shorter than it says, a short
        // struct, a length that is not what was read.
        assert!(parse(&msg(op::LOOKUP, &[], b"file")).is_err());
        let mut arg = vec![0u8; 40];
        arg[16..20].copy_from_slice(&10u32.to_le_bytes());
        assert!(parse(&msg(op::WRITE, &arg, b"abc")).is_err());
        assert!(parse(&msg(op::READ, &[0u8; 8], &[])).is_err());
        let mut m = msg(op::GETATTR, &[0u8; 16], &[]);
        m.push(0);
        assert!(parse(&m).is_err());
        assert!(split_dev(&[0u8; 10], 0).is_err());
        // An unknown operation parses, to be answered ENOSYS.
        assert_eq!(parse(&msg(999, &[], b"xyz")).unwrap().1, Op::Unsupported(999));
    }

    /// Whatever the kernel (or a damaged buffer) hands over, parsing returns
    /// an operation or an error and never panics: random bytes after a
    /// header, and every prefix and one-byte corruption of random requests
    /// of every opcode. Seeded by `ZLOGFS_SEED`, printed.
    #[test]
    fn random_requests_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(zlogfs_testkit::seed("abi decoders"));
        let mut parsed = 0;
        for _ in 0..20_000 {
            let opcode = rng.gen_range(0..60u32);
            let flags = if rng.gen_bool(0.5) { init::SETXATTR_EXT } else { 0 };
            let arg: Vec<u8> =
                (0..rng.gen_range(0..=arg_size(opcode, flags) + 8)).map(|_| rng.gen()).collect();
            let mut data: Vec<u8> = (0..rng.gen_range(0..64)).map(|_| rng.gen_range(0..4u8) * 40).collect();
            if rng.gen_bool(0.5) {
                data.push(0);
            }
            let mut m = msg(opcode, &arg, &data);
            if rng.gen_bool(0.3) {
                let i = rng.gen_range(0..m.len());
                m[i] = rng.gen();
            }
            let cut = if rng.gen_bool(0.3) { rng.gen_range(0..=m.len()) } else { m.len() };
            parsed += parse_with(&m[..cut], flags).is_ok() as u32;
            if opcode == op::INIT {
                let _ = InitIn::parse(&arg);
            }
            // The io_uring path: header, argument and payload apart.
            let _ = Op::parse(opcode, &arg, &data);
        }
        // The generator is not so hostile that nothing parses.
        assert!(parsed > 1000, "only {parsed} of 20000 parsed");
    }

    #[test]
    fn init_in_and_out() {
        let mut arg = Vec::new();
        for v in [7u32, 45, 131072, (init::INIT_EXT | init::ASYNC_READ) as u32, 0x200] {
            put32(&mut arg, v);
        }
        arg.resize(64, 0);
        let i = InitIn::parse(&arg).unwrap();
        assert_eq!((i.major, i.minor, i.max_readahead), (7, 45, 131072));
        assert_eq!(i.flags, init::INIT_EXT | init::ASYNC_READ | init::OVER_IO_URING);
        // flags2 counts only with INIT_EXT.
        arg[12..16].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(InitIn::parse(&arg).unwrap().flags, 1);

        let o = InitOut {
            flags: init::INIT_EXT | init::OVER_IO_URING,
            max_readahead: 1 << 20,
            max_background: 16,
            congestion_threshold: 12,
            max_write: 1 << 20,
            max_pages: 256,
        }
        .encode();
        assert_eq!(o.len(), 64);
        assert_eq!(u32_at(&o, 12).unwrap() as u64, init::INIT_EXT);
        assert_eq!(u32_at(&o, 20).unwrap(), 1 << 20);
        assert_eq!(u16_at(&o, 28).unwrap(), 256);
        assert_eq!(u32_at(&o, 32).unwrap(), 0x200);
    }

    #[test]
    fn replies_have_the_kernels_sizes() {
        let a = FileAttr { ino: 3, mode: libc::S_IFDIR | 0o755, atime: (-1, 5), ..FileAttr::default() };
        let mut e = Vec::new();
        put_entry(&mut e, &a, Duration::from_millis(1500), Duration::ZERO);
        assert_eq!(e.len(), 128);
        assert_eq!(u64_at(&e, 16).unwrap(), 1); // entry_valid seconds
        assert_eq!(u32_at(&e, 32).unwrap(), 500_000_000);
        assert_eq!(u64_at(&e, 40 + 24).unwrap(), u64::MAX); // atime -1
        assert_eq!(attr_out(&a, Duration::from_secs(1)).len(), 104);
        let mut o = Vec::new();
        put_open(&mut o, fopen::KEEP_CACHE);
        assert_eq!(o.len(), 16);
        assert_eq!(statfs_out(1, 2, 3, 4, 5, 6, 7, 8).len(), 80);
        assert_eq!(out_header(9, -2, 8), {
            let mut h = [0u8; 16];
            h[0] = 24;
            h[4..8].copy_from_slice(&(-2i32).to_le_bytes());
            h[8] = 9;
            h
        });
    }

    #[test]
    fn dirents_are_aligned_and_stop_when_full() {
        let mut d = DirBuf::new(64);
        assert!(d.add(7, 3, libc::S_IFREG, b"abc")); // 24 + 3 -> 32
        assert!(d.add(8, 4, libc::S_IFDIR, b"defgh")); // 32
        assert!(!d.add(9, 5, libc::S_IFREG, b"x"));
        let b = d.into_bytes();
        assert_eq!(b.len(), 64);
        assert_eq!(u32_at(&b, 16).unwrap(), 3);
        assert_eq!(u32_at(&b, 20).unwrap(), libc::DT_REG as u32);
        assert_eq!(&b[24..27], b"abc");
        assert_eq!(u32_at(&b, 32 + 20).unwrap(), libc::DT_DIR as u32);

        let mut d = DirBuf::new(4096);
        let a = FileAttr { ino: 11, mode: libc::S_IFLNK | 0o777, ..FileAttr::default() };
        assert!(d.add_plus(&a, 99, b"l", Duration::ZERO, Duration::ZERO));
        let b = d.into_bytes();
        assert_eq!(b.len(), 128 + 24 + 8);
        assert_eq!(u64_at(&b, 128).unwrap(), 11);
        assert_eq!(u64_at(&b, 136).unwrap(), 99);
    }
}
