//! A named snapshot's record.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::error::Result;

use super::*;

/// A named snapshot: the sequence number it reads at (the last of the
/// group committed before it), and when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Reads of the snapshot are reads at this sequence number.
    pub seq: u64,
    /// When it was taken.
    pub time: Time,
}

impl Snapshot {
    /// Encode: var seq, zvar sec, var nsec.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.seq);
        v.put_var(zigzag(self.time.sec));
        v.put_var(u64::from(self.time.nsec));
        v
    }
    /// Decode.
    pub fn decode(b: &[u8], what: &str) -> Result<Snapshot> {
        let mut r = Reader::new(b, what);
        let seq = r.var()?;
        let sec = unzigzag(r.var()?);
        let nsec = r.var_max(999_999_999, "nanoseconds")? as u32;
        r.finish()?;
        Ok(Snapshot { seq, time: Time { sec, nsec } })
    }
}

/// The first character of an automatic point's name (refused in the
/// names users give).
pub(crate) const AUTO: char = '@';
