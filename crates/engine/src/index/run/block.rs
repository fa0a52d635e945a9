//! Run data blocks: entries in internal order (key ascending, sequence
//! number descending), prefix-compressed, with restart points for binary
//! search inside a block (FORMAT.md §3.2).

use std::cmp::Ordering;

use crate::bytes::{Put, Reader};
use crate::error::Result;

use super::super::{Entry, MAX_KEY, MAX_VALUE};

/// Internal order: key ascending, then sequence number descending.
pub fn cmp_internal(ak: &[u8], aseq: u64, bk: &[u8], bseq: u64) -> Ordering {
    ak.cmp(bk).then(bseq.cmp(&aseq))
}

/// Encode entries (in internal order) as a data block payload.
pub fn encode_data_block(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_var(entries.len() as u64);
    let mut prev: &[u8] = &[];
    for e in entries {
        let shared = prev.iter().zip(e.key.iter()).take_while(|(a, b)| a == b).count();
        v.put_var(shared as u64);
        v.put_lenbytes(&e.key[shared..]);
        v.put_var(e.seq);
        match &e.value {
            Some(val) => {
                v.put_u8(1);
                v.put_lenbytes(val);
            }
            None => v.put_u8(0),
        }
        prev = &e.key;
    }
    v
}

/// A decoded data block in a flat layout: keys end to end in one buffer,
/// values in another, and fixed-size records pointing into them, so that a
/// binary search touches few cache lines and decoding allocates three times.
pub struct Block {
    keys: Vec<u8>,
    vals: Vec<u8>,
    ents: Vec<Ent>,
    /// Open-addressing table: hash of a key -> index of its first (newest)
    /// version in the block; [`NO_SLOT`] when empty. Built at decode time,
    /// empty for blocks of more than 65,534 entries (binary search then).
    slots: Vec<u16>,
}

const NO_SLOT: u16 = u16::MAX;

/// One entry of a [`Block`].
#[derive(Clone, Copy)]
struct Ent {
    /// End of the key in `keys` (it starts where the previous one ends).
    key_end: u32,
    /// Start of the value in `vals`.
    val_off: u32,
    /// Value length, or [`TOMBSTONE`].
    val_len: u32,
    seq: u64,
}

const TOMBSTONE: u32 = u32::MAX;

impl Block {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.ents.len()
    }
    /// True when the block holds no entry.
    #[cfg(feature = "fuzzing")]
    pub fn is_empty(&self) -> bool {
        self.ents.is_empty()
    }
    /// Key of entry `i`.
    pub fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ents[i - 1].key_end as usize };
        &self.keys[start..self.ents[i].key_end as usize]
    }
    /// Sequence number of entry `i`.
    pub fn seq(&self, i: usize) -> u64 {
        self.ents[i].seq
    }
    /// Value of entry `i` (`None` for a tombstone).
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        let e = self.ents[i];
        (e.val_len != TOMBSTONE).then(|| &self.vals[e.val_off as usize..(e.val_off + e.val_len) as usize])
    }
    /// Entry `i`, owned.
    pub fn entry(&self, i: usize) -> Entry {
        Entry { key: self.key(i).to_vec(), seq: self.seq(i), value: self.value(i).map(|v| v.to_vec()) }
    }
    /// The first entry at or after internal key (key, seq).
    pub fn search(&self, key: &[u8], seq: u64) -> usize {
        let (mut lo, mut hi) = (0, self.ents.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if cmp_internal(self.key(mid), self.seq(mid), key, seq) == Ordering::Less {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
    /// Memory held.
    pub fn bytes(&self) -> usize {
        self.keys.capacity()
            + self.vals.capacity()
            + self.ents.capacity() * std::mem::size_of::<Ent>()
            + self.slots.capacity() * 2
            + std::mem::size_of::<Block>()
    }

    /// The newest version of `key` at or below `seq` in this block, given
    /// that this is the block the sparse index chose for (key, seq).
    pub fn find(&self, key: &[u8], seq: u64) -> Option<usize> {
        let mut j = if self.slots.is_empty() {
            self.search(key, seq)
        } else {
            let mask = self.slots.len() - 1;
            let mut h = crc32c::crc32c(key) as usize & mask;
            loop {
                match self.slots[h] {
                    NO_SLOT => return None,
                    i if self.key(i as usize) == key => break i as usize,
                    _ => h = (h + 1) & mask,
                }
            }
        };
        // Versions run newest first: skip those newer than `seq`.
        while j < self.len() && self.key(j) == key {
            if self.seq(j) <= seq {
                return Some(j);
            }
            j += 1;
        }
        None
    }

    fn build_slots(&mut self, distinct: usize) {
        if self.ents.len() >= usize::from(NO_SLOT) {
            return;
        }
        let size = (distinct * 2).next_power_of_two().max(8);
        let mask = size - 1;
        self.slots = vec![NO_SLOT; size];
        for i in 0..self.ents.len() {
            if i > 0 && self.key(i - 1) == self.key(i) {
                continue;
            }
            let mut h = crc32c::crc32c(self.key(i)) as usize & mask;
            while self.slots[h] != NO_SLOT {
                h = (h + 1) & mask;
            }
            self.slots[h] = i as u16;
        }
    }

    /// Decode a data block payload; checks that entries are in internal
    /// order and sizes stay within the format's limits.
    pub fn decode(buf: &[u8], what: &str) -> Result<Block> {
        let mut r = Reader::new(buf, what);
        let n = r.var_max(buf.len() as u64, "entry count")? as usize;
        let mut b = Block {
            keys: Vec::with_capacity(buf.len()),
            vals: Vec::new(),
            ents: Vec::with_capacity(n),
            slots: Vec::new(),
        };
        let mut prev_start = 0usize;
        let mut distinct = 0usize;
        for i in 0..n {
            let shared = r.var()? as usize;
            let prev_len = b.keys.len() - prev_start;
            if shared > prev_len {
                return Err(r.err("shared key prefix longer than the previous key"));
            }
            let rest = r.lenbytes(MAX_KEY, "key length")?;
            if shared + rest.len() > MAX_KEY {
                return Err(r.err("key too long"));
            }
            let start = b.keys.len();
            b.keys.extend_from_within(prev_start..prev_start + shared);
            b.keys.extend_from_slice(rest);
            let seq = r.var()?;
            let (val_off, val_len) = match r.u8()? {
                0 => (0, TOMBSTONE),
                1 => {
                    let v = r.lenbytes(MAX_VALUE, "value length")?;
                    let off = b.vals.len();
                    b.vals.extend_from_slice(v);
                    (off as u32, v.len() as u32)
                }
                t => return Err(r.err(format!("unknown entry type {t}"))),
            };
            let key_end = u32::try_from(b.keys.len()).map_err(|_| r.err("block too large"))?;
            b.ents.push(Ent { key_end, val_off, val_len, seq });
            if i > 0 {
                let pk = &b.keys[prev_start..start];
                let ps = b.ents[i - 1].seq;
                match cmp_internal(pk, ps, &b.keys[start..], seq) {
                    Ordering::Less => {}
                    _ => return Err(r.err("entries out of order")),
                }
                if pk != &b.keys[start..] {
                    distinct += 1;
                }
            } else {
                distinct = 1;
            }
            prev_start = start;
        }
        r.finish()?;
        // Cached blocks are counted by what they hold (issue 45: spare
        // room uncounted let a cache take twice its bound).
        b.keys.shrink_to_fit();
        b.vals.shrink_to_fit();
        b.build_slots(distinct);
        Ok(b)
    }
}

/// Decode a data block payload into owned entries (see [`Block::decode`]).
#[cfg(feature = "fuzzing")]
pub fn decode_data_block(buf: &[u8], what: &str) -> Result<Vec<Entry>> {
    let b = Block::decode(buf, what)?;
    Ok((0..b.len()).map(|i| b.entry(i)).collect())
}
