//! The commit group: index mutations of the operations accepted since the
//! last commit, kept in memory and written to the engine as ONE atomic
//! batch. Reads see them through [`Pending::get`] and [`merge_scan`].
//!
//! Why a group and not one engine batch per operation: file data is
//! buffered (to pack small files and compress whole chunks), and a crash
//! must leave a prefix of the accepted operations. If a rename were
//! committed while the data written before it still sat in memory, a crash
//! could keep the rename and lose the data. Committing data and metadata of
//! a group in one atomic batch makes every crash state the state after some
//! group, and groups are prefixes of the operation order.

use std::collections::{BTreeMap, HashSet};

use zlogfs_engine::BlockAddr;

use crate::event::{Event, What};
use crate::keys::Ino;

/// Journal bytes a free takes at most (an operation tag and a block
/// address).
pub const FREE_BYTES: usize = 13;

/// Journal bytes a held free's record takes at most (a put of its 25-byte
/// key and a born sequence number of up to 10 bytes, with their lengths).
pub const HELD_BYTES: usize = 40;

/// Estimated journal bytes of a put of a key and value of these lengths.
pub const fn put_bytes(key: usize, val: usize) -> usize {
    key + val + 8
}

/// Estimated journal bytes of a delete of a key of this length.
pub const fn del_bytes(key: usize) -> usize {
    key + 4
}

/// Mutations waiting for the next commit.
#[derive(Default)]
pub struct Pending {
    /// Final value of each touched key (None: deleted).
    pub map: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Data blocks no longer referenced.
    pub frees: Vec<BlockAddr>,
    /// Rough encoded size of the group (journal bytes).
    pub bytes: usize,
    /// What the operations did, in order, for the group's change record.
    pub events: Vec<Event>,
    /// The change record's encoded bytes at most, header aside.
    pub event_bytes: usize,
    /// (inode, metadata) of the data and metadata events noted: one each
    /// per group, none for an inode made in it (the feed lists it as
    /// created, whatever else happened to it).
    touched: HashSet<(Ino, bool)>,
}

impl Pending {
    /// The pending value of `key`: None when untouched, Some(None) when
    /// deleted.
    pub fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.map.get(key).map(|v| v.as_deref())
    }
    /// Set `key`.
    pub fn put(&mut self, key: Vec<u8>, val: Vec<u8>) {
        self.bytes += put_bytes(key.len(), val.len());
        self.map.insert(key, Some(val));
    }
    /// Delete `key`.
    pub fn del(&mut self, key: Vec<u8>) {
        self.bytes += del_bytes(key.len());
        self.map.insert(key, None);
    }
    /// Release a data block.
    pub fn free(&mut self, a: BlockAddr) {
        self.bytes += FREE_BYTES;
        self.frees.push(a);
    }
    /// Note a change (data and metadata changes once per inode).
    pub fn note(&mut self, e: Event) {
        let once = match e.what {
            What::Data => Some(false),
            What::Meta => Some(true),
            What::Made => {
                self.touched.extend([(e.ino, false), (e.ino, true)]);
                None
            }
            _ => None,
        };
        if once.is_some_and(|m| !self.touched.insert((e.ino, m))) {
            return;
        }
        self.bytes += e.bytes();
        self.event_bytes += e.bytes();
        self.events.push(e);
    }
    /// Add `later`'s mutations, which win over these.
    pub fn absorb(&mut self, later: Pending) {
        self.map.extend(later.map);
        self.frees.extend(later.frees);
        self.bytes += later.bytes;
        self.events.extend(later.events);
        self.event_bytes += later.event_bytes;
        self.touched.extend(later.touched);
    }
    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.frees.is_empty()
    }
}

/// Merge a sorted list of stored entries with the pending entries of the
/// range `[lo, hi)` (`hi` None: unbounded); pending values win.
pub fn merge_scan(
    stored: Vec<(Vec<u8>, Vec<u8>)>,
    pend: &Pending,
    lo: &[u8],
    hi: Option<&[u8]>,
    out: &mut Vec<(Vec<u8>, Vec<u8>)>,
) {
    use std::ops::Bound;
    let upper = match hi {
        Some(h) => Bound::Excluded(h),
        None => Bound::Unbounded,
    };
    let mut p = pend.map.range::<[u8], _>((Bound::Included(lo), upper)).peekable();
    let mut s = stored.into_iter().peekable();
    loop {
        let take_p = match (p.peek(), s.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((pk, _)), Some((sk, _))) => pk.as_slice() <= sk.as_slice(),
        };
        if take_p {
            let (k, v) = p.next().expect("peeked");
            if s.peek().is_some_and(|(sk, _)| sk == k) {
                s.next();
            }
            if let Some(v) = v {
                out.push((k.clone(), v.clone()));
            }
        } else {
            out.push(s.next().expect("peeked"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_overrides_stored() {
        let mut p = Pending::default();
        p.put(b"b".to_vec(), b"B".to_vec());
        p.del(b"c".to_vec());
        p.put(b"e".to_vec(), b"E".to_vec());
        p.put(b"z".to_vec(), b"Z".to_vec());
        let stored = vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec()),
            (b"c".to_vec(), b"3".to_vec()),
            (b"d".to_vec(), b"4".to_vec()),
        ];
        let mut out = vec![];
        merge_scan(stored, &p, b"a", Some(b"y"), &mut out);
        let got: Vec<_> = out.iter().map(|(k, v)| (k[0], v[0])).collect();
        assert_eq!(got, vec![(b'a', b'1'), (b'b', b'B'), (b'd', b'4'), (b'e', b'E')]);
    }
}
