//! A run's sparse index block: the last internal key of every data block
//! and its address (FORMAT.md §3.3).

use crate::bytes::{Put, Reader};
use crate::error::Result;
use std::cmp::Ordering;

use crate::log::format::BlockAddr;

use super::super::MAX_KEY;
use super::cmp_internal;

/// One entry of the sparse index: the last internal key of a data block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Last key in the block.
    pub last_key: Vec<u8>,
    /// Its sequence number.
    pub last_seq: u64,
    /// Where the block is.
    pub addr: BlockAddr,
}

/// Encode the sparse index block payload.
pub fn encode_index_block(idx: &[IndexEntry]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_var(idx.len() as u64);
    for e in idx {
        v.put_lenbytes(&e.last_key);
        v.put_var(e.last_seq);
        e.addr.put(&mut v);
    }
    v
}

/// Decode the sparse index block payload.
pub fn decode_index_block(buf: &[u8], what: &str) -> Result<Vec<IndexEntry>> {
    let mut r = Reader::new(buf, what);
    let n = r.var_max(buf.len() as u64, "block count")? as usize;
    let mut out: Vec<IndexEntry> = Vec::with_capacity(n);
    for _ in 0..n {
        let e = IndexEntry {
            last_key: r.lenbytes(MAX_KEY, "key length")?.to_vec(),
            last_seq: r.var()?,
            addr: BlockAddr::get(&mut r)?,
        };
        if let Some(p) = out.last() {
            if cmp_internal(&p.last_key, p.last_seq, &e.last_key, e.last_seq) != Ordering::Less {
                return Err(r.err("index entries out of order"));
            }
        }
        out.push(e);
    }
    r.finish()?;
    Ok(out)
}
