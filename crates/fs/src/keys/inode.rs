//! Inodes and directory entries.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::error::Result;

use super::*;

/// The type of an inode, from the S_IFMT bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    Char,
    /// Block device.
    Block,
}

/// S_IFMT.
pub const S_IFMT: u32 = 0o170000;

impl Kind {
    /// The kind of a mode, if its type bits are valid.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & S_IFMT {
            0o100000 => Kind::File,
            0o040000 => Kind::Dir,
            0o120000 => Kind::Symlink,
            0o010000 => Kind::Fifo,
            0o140000 => Kind::Socket,
            0o020000 => Kind::Char,
            0o060000 => Kind::Block,
            _ => return None,
        })
    }
    /// The S_IFMT bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
            Kind::Char => 0o020000,
            Kind::Block => 0o060000,
        }
    }
    pub(crate) fn code(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::Char => 6,
            Kind::Block => 7,
        }
    }
    pub(crate) fn from_code(c: u8) -> Option<Kind> {
        Kind::from_mode(
            [0, 0o100000, 0o040000, 0o120000, 0o010000, 0o140000, 0o020000, 0o060000]
                .get(c as usize)
                .copied()?,
        )
    }
}

/// An inode's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// Its number.
    pub ino: Ino,
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Logical size in bytes.
    pub size: u64,
    /// Logical bytes in chunks that are not holes (st_blocks counts these).
    pub alloc: u64,
    /// Device number of device nodes.
    pub rdev: u64,
    /// Last access.
    pub atime: Time,
    /// Last modification of the contents.
    pub mtime: Time,
    /// Last change of the inode.
    pub ctime: Time,
    /// Creation.
    pub btime: Time,
    /// Parent directory; for other kinds the directory of their first
    /// link, 0 when unknown (made before record version 8, or that link
    /// removed while others remain). Change feeds name files by it.
    pub parent: Ino,
    /// Compression policy set on this inode (inherited by new entries of a
    /// directory).
    pub policy: Option<CodecSpec>,
    /// Chunk size of this file's data (a directory's is inherited by its
    /// new entries), a power of two from [`MIN_CHUNK`] to the image's
    /// chunk size; None: the image's. Fixed while a regular file holds
    /// data (record version 6).
    pub chunk: Option<u32>,
    /// On two devices, where this file's data goes (a directory's is
    /// inherited by its new entries); None: by its size (record version 9).
    pub tier: Option<TierPolicy>,
    /// Compression unit of this file's whole chunks (a directory's is
    /// inherited by its new entries): chunks stored in one commit, one
    /// after another, are compressed together in shared blocks of up to
    /// this many bytes; None: each chunk alone (record version 10).
    pub unit: Option<u32>,
    /// How the cleaner stores this file's whole chunks when it moves them
    /// (a directory's is inherited by its new entries); None: as writes
    /// do (record version 11).
    pub cold: Option<Cold>,
}

/// The form a file's data takes once the cleaner moves it
/// (`user.zlogfs.cold`): whole chunks compressed together in units of
/// `unit` bytes with `spec`, for data that has stayed put long enough to
/// be cleaned, where writes keep a cheaper unit and level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cold {
    /// Compression unit, a power of two from [`MIN_CHUNK`] to [`MAX_UNIT`].
    pub unit: u32,
    /// Codec and level.
    pub spec: CodecSpec,
}

/// Where a file's data goes on an image of two devices
/// (`user.zlogfs.tier`; "auto", by its size, is no policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierPolicy {
    /// The fast device, whatever its size.
    Fast,
    /// The bulk device, whatever its size.
    Bulk,
}

/// The smallest chunk size, of an image or of a file.
pub const MIN_CHUNK: u32 = 4096;

const F_NLINK: u64 = 1;
const F_RDEV: u64 = 2;
const F_ATIME: u64 = 4;
const F_CTIME: u64 = 8;
const F_BTIME: u64 = 16;
const F_ALLOC: u64 = 32;
const F_POLICY: u64 = 64;
const F_PARENT: u64 = 128;
const F_CHUNK: u64 = 256;
const F_TIER: u64 = 512;
const F_UNIT: u64 = 1024;
const F_COLD: u64 = 2048;

/// The largest compression unit of a file.
pub const MAX_UNIT: u32 = 1 << 20;

impl Inode {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        Kind::from_mode(self.mode).unwrap_or(Kind::File)
    }
    /// The (uid, gid, mode) triple.
    pub fn triple(&self) -> (u32, u32, u32) {
        (self.uid, self.gid, self.mode)
    }

    /// Encode with the id of its triple: fields equal to their usual value
    /// are left out and flagged absent; times are deltas (from `base_sec`
    /// for mtime, from mtime for the others).
    pub fn encode(&self, triple: u32, base_sec: i64) -> Vec<u8> {
        let def_nlink = if self.kind() == Kind::Dir { 2 } else { 1 };
        let mut f = 0;
        f |= if self.nlink != def_nlink { F_NLINK } else { 0 };
        f |= if self.rdev != 0 { F_RDEV } else { 0 };
        f |= if self.atime != self.mtime { F_ATIME } else { 0 };
        f |= if self.ctime != self.mtime { F_CTIME } else { 0 };
        f |= if self.btime != self.ctime { F_BTIME } else { 0 };
        f |= if self.alloc != self.size { F_ALLOC } else { 0 };
        f |= if self.policy.is_some() { F_POLICY } else { 0 };
        f |= if self.parent != 0 { F_PARENT } else { 0 };
        f |= if self.chunk.is_some() { F_CHUNK } else { 0 };
        f |= if self.tier.is_some() { F_TIER } else { 0 };
        f |= if self.unit.is_some() { F_UNIT } else { 0 };
        f |= if self.cold.is_some() { F_COLD } else { 0 };
        let mut v = Vec::with_capacity(24);
        v.put_var(f);
        v.put_var(u64::from(triple));
        v.put_var(self.size);
        self.mtime.put_delta(base_sec, &mut v);
        if f & F_NLINK != 0 {
            v.put_var(u64::from(self.nlink));
        }
        if f & F_RDEV != 0 {
            v.put_var(self.rdev);
        }
        if f & F_ATIME != 0 {
            self.atime.put_delta(self.mtime.sec, &mut v);
        }
        if f & F_CTIME != 0 {
            self.ctime.put_delta(self.mtime.sec, &mut v);
        }
        if f & F_BTIME != 0 {
            self.btime.put_delta(self.ctime.sec, &mut v);
        }
        if f & F_ALLOC != 0 {
            v.put_var(self.alloc);
        }
        if let Some(p) = self.policy {
            v.put_u8(p.id as u8);
            v.put_u8(p.level);
        }
        if f & F_PARENT != 0 {
            v.put_var(self.parent);
        }
        if let Some(c) = self.chunk {
            v.put_u8(c.trailing_zeros() as u8);
        }
        if let Some(t) = self.tier {
            v.put_u8(if t == TierPolicy::Fast { 1 } else { 2 });
        }
        if let Some(u) = self.unit {
            v.put_u8(u.trailing_zeros() as u8);
        }
        if let Some(c) = self.cold {
            v.put_u8(c.unit.trailing_zeros() as u8);
            v.put_u8(c.spec.id as u8);
            v.put_u8(c.spec.level);
        }
        v
    }

    /// Decode; `triple` resolves a triple id.
    pub fn decode(
        ino: Ino,
        b: &[u8],
        base_sec: i64,
        triple: impl Fn(u32) -> Option<(u32, u32, u32)>,
    ) -> Result<Inode> {
        let what = format!("inode {ino}");
        let mut r = Reader::new(b, &what);
        let f = r.var()?;
        if f >= 4096 {
            return Err(r.err(format!("unknown flags {f:#x}")));
        }
        let tid = r.var_max(u64::from(u32::MAX), "triple id")? as u32;
        let (uid, gid, mode) =
            triple(tid).ok_or_else(|| r.err(format!("unknown (uid, gid, mode) triple {tid}")))?;
        if Kind::from_mode(mode).is_none() {
            return Err(r.err(format!("mode {mode:o} has no valid file type")));
        }
        let size = r.var()?;
        let mtime = Time::get_delta(base_sec, &mut r)?;
        let dir = mode & S_IFMT == 0o040000;
        let nlink = if f & F_NLINK != 0 {
            r.var_max(u64::from(u32::MAX), "link count")? as u32
        } else if dir {
            2
        } else {
            1
        };
        let rdev = if f & F_RDEV != 0 { r.var()? } else { 0 };
        let atime = if f & F_ATIME != 0 { Time::get_delta(mtime.sec, &mut r)? } else { mtime };
        let ctime = if f & F_CTIME != 0 { Time::get_delta(mtime.sec, &mut r)? } else { mtime };
        let btime = if f & F_BTIME != 0 { Time::get_delta(ctime.sec, &mut r)? } else { ctime };
        let alloc = if f & F_ALLOC != 0 { r.var()? } else { size };
        let policy = if f & F_POLICY != 0 { Some(get_spec(&mut r, "policy")?) } else { None };
        let parent = if f & F_PARENT != 0 { r.var()? } else { 0 };
        let chunk = if f & F_CHUNK != 0 {
            let shift = r.u8()?;
            if !(MIN_CHUNK.trailing_zeros() as u8..=24).contains(&shift) {
                return Err(r.err(format!("chunk size 2^{shift} out of range")));
            }
            Some(1u32 << shift)
        } else {
            None
        };
        let tier = if f & F_TIER != 0 {
            match r.u8()? {
                1 => Some(TierPolicy::Fast),
                2 => Some(TierPolicy::Bulk),
                t => return Err(r.err(format!("unknown device policy {t}"))),
            }
        } else {
            None
        };
        let unit = if f & F_UNIT != 0 { Some(get_unit(&mut r)?) } else { None };
        let cold = if f & F_COLD != 0 {
            let unit = get_unit(&mut r)?;
            let spec = get_spec(&mut r, "cold form")?;
            Some(Cold { unit, spec })
        } else {
            None
        };
        r.finish()?;
        Ok(Inode {
            ino,
            mode,
            uid,
            gid,
            nlink,
            size,
            alloc,
            rdev,
            atime,
            mtime,
            ctime,
            btime,
            parent,
            policy,
            chunk,
            tier,
            unit,
            cold,
        })
    }
}

/// A compression unit: its power of two.
fn get_unit(r: &mut Reader) -> Result<u32> {
    let shift = r.u8()?;
    if !(MIN_CHUNK.trailing_zeros() as u8..=MAX_UNIT.trailing_zeros() as u8).contains(&shift) {
        return Err(r.err(format!("compression unit 2^{shift} out of range")));
    }
    Ok(1u32 << shift)
}

/// A codec and level, of the inode field `what`.
fn get_spec(r: &mut Reader, what: &str) -> Result<CodecSpec> {
    let id = r.u8()?;
    let level = r.u8()?;
    let id = CodecId::from_u8(id).ok_or_else(|| r.err(format!("unknown codec {id} in {what}")))?;
    Ok(CodecSpec::new(id, level))
}

/// Encode a directory entry's value.
pub fn encode_dirent(ino: Ino, kind: Kind) -> Vec<u8> {
    let mut v = Vec::with_capacity(6);
    v.put_var(ino);
    v.put_u8(kind.code());
    v
}
/// Decode a directory entry's value.
pub fn decode_dirent(b: &[u8]) -> Result<(Ino, Kind)> {
    let mut r = Reader::new(b, "directory entry");
    let ino = r.var()?;
    let c = r.u8()?;
    let kind = Kind::from_code(c).ok_or_else(|| r.err(format!("unknown file type {c}")))?;
    r.finish()?;
    Ok((ino, kind))
}
