//! The journal's records: a [`WriteBatch`] of puts, deletes and frees,
//! encoded after the sequence number of its first mutation
//! (FORMAT.md §3.1).

use crate::bytes::{Put, Reader};
use crate::error::Result;
use crate::index::{MAX_KEY, MAX_VALUE};
use crate::log::format::BlockAddr;
use crate::log::Room;

/// One mutation of a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Set a key.
    Put(Vec<u8>, Vec<u8>),
    /// Delete a key.
    Delete(Vec<u8>),
    /// A data block, or part of its bytes, is no longer referenced (space
    /// accounting; see [`WriteBatch::free`]).
    Free(BlockAddr),
}

/// Mutations applied atomically, in order, by one commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    /// The mutations.
    pub ops: Vec<Op>,
    /// How much of the log's reserve the batch's journal record may use
    /// (not part of the record).
    pub room: Room,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Add a put.
    pub fn put(&mut self, k: impl Into<Vec<u8>>, v: impl Into<Vec<u8>>) -> &mut Self {
        self.ops.push(Op::Put(k.into(), v.into()));
        self
    }
    /// Add a delete.
    pub fn delete(&mut self, k: impl Into<Vec<u8>>) -> &mut Self {
        self.ops.push(Op::Delete(k.into()));
        self
    }
    /// Release a data block: take `a.len` bytes off the live count of
    /// its segment. A caller may release a block in parts (addresses with
    /// the block's segment and offset and shorter lengths) as long as the
    /// parts add up to the block's length.
    pub fn free(&mut self, a: BlockAddr) -> &mut Self {
        self.ops.push(Op::Free(a));
        self
    }
    pub(super) fn encode(&self, first_seq: u64, out: &mut Vec<u8>) {
        out.put_var(first_seq);
        out.put_var(self.ops.len() as u64);
        for op in &self.ops {
            match op {
                Op::Put(k, v) => {
                    out.put_u8(1);
                    out.put_lenbytes(k);
                    out.put_lenbytes(v);
                }
                Op::Delete(k) => {
                    out.put_u8(2);
                    out.put_lenbytes(k);
                }
                Op::Free(a) => {
                    out.put_u8(3);
                    a.put(out);
                }
            }
        }
    }
}

/// Decode the journal records of one journal block.
pub fn decode_journal(buf: &[u8], what: &str) -> Result<Vec<(u64, WriteBatch)>> {
    let mut r = Reader::new(buf, what);
    let mut out = Vec::new();
    while !r.is_empty() {
        let first = r.var()?;
        let n = r.var_max(buf.len() as u64, "operation count")?;
        let mut b = WriteBatch::new();
        for _ in 0..n {
            match r.u8()? {
                1 => {
                    let k = r.lenbytes(MAX_KEY, "key length")?.to_vec();
                    let v = r.lenbytes(MAX_VALUE, "value length")?.to_vec();
                    b.ops.push(Op::Put(k, v));
                }
                2 => b.ops.push(Op::Delete(r.lenbytes(MAX_KEY, "key length")?.to_vec())),
                3 => b.ops.push(Op::Free(BlockAddr::get(&mut r)?)),
                t => return Err(r.err(format!("unknown journal operation {t}"))),
            }
        }
        out.push((first, b));
    }
    Ok(out)
}
