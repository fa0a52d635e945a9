//! The config record, the counters, and (uid, gid, mode) triples.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::error::{Error, Result};

use super::*;

/// The file system's parameters and counters (the config record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Bytes of file data per chunk.
    pub chunk_size: u32,
    /// Target raw size of a block packing small files together.
    pub pack_bytes: u32,
    /// Files up to this size live inline in the index.
    pub inline_max: u32,
    /// Codec of file data when no policy says otherwise.
    pub codec: CodecSpec,
    /// Timestamps are stored as deltas from this second.
    pub base_sec: i64,
    /// Next inode number to allocate.
    pub next_ino: Ino,
    /// Next (uid, gid, mode) triple id.
    pub next_triple: u32,
    /// Record version: the highest version (see [`super::FS_VERSION`])
    /// whose records the image holds; mkfs starts at 1, or at 8 when
    /// automatic points of history are kept (they write change records).
    pub version: u8,
    /// On two devices, files larger than this keep their own chunks on
    /// the bulk one ([`DEFAULT_SMALL_MAX`] when the record leaves it out).
    pub small_max: u64,
}

/// The default of [`Config::small_max`].
pub const DEFAULT_SMALL_MAX: u64 = 64 << 10;

impl Config {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.version];
        v.put_var(u64::from(self.chunk_size));
        v.put_var(u64::from(self.pack_bytes));
        v.put_var(u64::from(self.inline_max));
        v.put_u8(self.codec.id as u8);
        v.put_u8(self.codec.level);
        v.put_var(zigzag(self.base_sec));
        v.put_var(self.next_ino);
        v.put_var(u64::from(self.next_triple));
        if self.small_max != DEFAULT_SMALL_MAX {
            v.put_var(self.small_max);
        }
        v
    }
    /// Decode, refusing versions this build does not know.
    pub fn decode(b: &[u8]) -> Result<Config> {
        let mut r = Reader::new(b, "file system config record");
        let ver = r.u8()?;
        if ver == 0 || ver > FS_VERSION {
            return Err(Error::Unsupported(format!(
                "file system records of version {ver}; this build reads versions 1 to {FS_VERSION}"
            )));
        }
        let chunk_size = r.var_max(1 << 24, "chunk size")? as u32;
        let pack_bytes = r.var_max(1 << 26, "pack size")? as u32;
        let inline_max = r.var_max(1 << 16, "inline limit")? as u32;
        let id = r.u8()?;
        let level = r.u8()?;
        let id = CodecId::from_u8(id).ok_or_else(|| r.err(format!("unknown codec {id}")))?;
        let base_sec = unzigzag(r.var()?);
        let next_ino = r.var()?;
        let next_triple = r.var_max(u64::from(u32::MAX), "triple counter")? as u32;
        let small_max = if r.is_empty() { DEFAULT_SMALL_MAX } else { r.var_max(1 << 40, "small-file size")? };
        r.finish()?;
        if chunk_size < 4096 || !chunk_size.is_power_of_two() {
            return Err(r.err(format!("chunk size {chunk_size} is not a power of two of at least 4096")));
        }
        Ok(Config {
            chunk_size,
            pack_bytes,
            inline_max,
            codec: CodecSpec::new(id, level),
            base_sec,
            next_ino,
            next_triple,
            version: ver,
            small_max,
        })
    }
}

/// Lifetime write counters (the counters record), committed with each
/// group: bytes users wrote, and bytes the engine wrote to the log's
/// segments up to the previous group (a group's own journal record is
/// counted by the next one; close records the last group's, so only what
/// that record's own commit and the final checkpoint write goes
/// uncounted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Bytes passed to `write` (and imported).
    pub user_bytes: u64,
    /// Bytes written to the device: blocks, journal, runs, checkpoints.
    pub device_bytes: u64,
    /// Bytes of chunks reserved by fallocate and not written yet
    /// ([`Extent::Reserved`]): free space that writers of other data may
    /// not take. Written only when not 0 (record version 5).
    pub reserved: u64,
}

impl Counters {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.user_bytes);
        v.put_var(self.device_bytes);
        if self.reserved > 0 {
            v.put_var(self.reserved);
        }
        v
    }
    /// Decode.
    pub fn decode(b: &[u8]) -> Result<Counters> {
        let mut r = Reader::new(b, "file system counters record");
        let mut c = Counters { user_bytes: r.var()?, device_bytes: r.var()?, reserved: 0 };
        if r.peek().is_some() {
            c.reserved = r.var()?;
            if c.reserved == 0 {
                return Err(r.err("reserved bytes present but 0 (written only when not 0)"));
            }
        }
        r.finish()?;
        Ok(c)
    }
}

/// Encode a (uid, gid, mode) triple.
pub fn encode_triple(t: (u32, u32, u32)) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_var(u64::from(t.0));
    v.put_var(u64::from(t.1));
    v.put_var(u64::from(t.2));
    v
}
/// Decode a triple.
pub fn decode_triple(b: &[u8]) -> Result<(u32, u32, u32)> {
    let mut r = Reader::new(b, "(uid, gid, mode) triple");
    let m = u64::from(u32::MAX);
    let t = (r.var_max(m, "uid")? as u32, r.var_max(m, "gid")? as u32, r.var_max(m, "mode")? as u32);
    r.finish()?;
    Ok(t)
}
