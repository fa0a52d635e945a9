//! The sparse index in one flat buffer, searched without chasing a
//! pointer per entry.

use std::cmp::Ordering;

use super::{cmp_internal, IndexEntry};

/// The sparse index in a flat layout for searching: the last keys of the
/// data blocks end to end, with their sequence numbers.
pub(super) struct FlatIndex {
    keys: Vec<u8>,
    ends: Vec<u32>,
    seqs: Vec<u64>,
}

impl FlatIndex {
    pub(super) fn new(index: &[IndexEntry]) -> FlatIndex {
        let mut f = FlatIndex {
            keys: Vec::with_capacity(index.iter().map(|e| e.last_key.len()).sum()),
            ends: Vec::with_capacity(index.len()),
            seqs: Vec::with_capacity(index.len()),
        };
        for e in index {
            f.keys.extend_from_slice(&e.last_key);
            f.ends.push(f.keys.len() as u32);
            f.seqs.push(e.last_seq);
        }
        f
    }

    pub(super) fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.keys[start..self.ends[i] as usize]
    }

    /// The first block whose last internal key is at or after (key, seq).
    pub(super) fn search(&self, key: &[u8], seq: u64) -> usize {
        let (mut lo, mut hi) = (0, self.ends.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if cmp_internal(self.key(mid), self.seqs[mid], key, seq) == Ordering::Less {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}
