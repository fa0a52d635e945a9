//! Sorted runs: immutable, key-sorted files of index entries stored in the
//! log as compressed, checksummed blocks.
//!
//! A run is a sequence of data blocks (entries in internal order: key
//! ascending, sequence number descending), one sparse index block (the last
//! internal key of every data block and its address) and one filter block (a
//! Bloom filter over user keys). Its descriptor ([`RunMeta`]) lives in the
//! checkpoint.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::bytes::{Put, Reader};
use crate::error::{Error, Result};
use crate::log::format::{BlockAddr, BlockKind};
use crate::log::read_block;
use crate::store::Store;

use super::{Entry, MAX_KEY, MAX_VALUE};

/// The descriptor of a run, kept in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMeta {
    /// Unique id (never reused); owner of the run's blocks.
    pub id: u64,
    /// Number of entries.
    pub entries: u64,
    /// Smallest sequence number in the run.
    pub min_seq: u64,
    /// Largest sequence number in the run.
    pub max_seq: u64,
    /// Smallest key.
    pub min_key: Vec<u8>,
    /// Largest key.
    pub max_key: Vec<u8>,
    /// The sparse index block.
    pub index: BlockAddr,
    /// The filter block.
    pub filter: BlockAddr,
    /// Bytes of all its blocks on disk.
    pub bytes: u64,
}

impl RunMeta {
    /// Append the encoding.
    pub fn put(&self, v: &mut Vec<u8>) {
        v.put_var(self.id);
        v.put_var(self.entries);
        v.put_var(self.min_seq);
        v.put_var(self.max_seq);
        v.put_lenbytes(&self.min_key);
        v.put_lenbytes(&self.max_key);
        self.index.put(v);
        self.filter.put(v);
        v.put_var(self.bytes);
    }
    /// Decode.
    pub fn get(r: &mut Reader) -> Result<RunMeta> {
        Ok(RunMeta {
            id: r.var()?,
            entries: r.var()?,
            min_seq: r.var()?,
            max_seq: r.var()?,
            min_key: r.lenbytes(MAX_KEY, "key length")?.to_vec(),
            max_key: r.lenbytes(MAX_KEY, "key length")?.to_vec(),
            index: BlockAddr::get(r)?,
            filter: BlockAddr::get(r)?,
            bytes: r.var()?,
        })
    }
}

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
        self.keys.len()
            + self.vals.len()
            + self.ents.len() * std::mem::size_of::<Ent>()
            + self.slots.len() * 2
            + 64
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
        b.build_slots(distinct);
        Ok(b)
    }
}

/// Decode a data block payload into owned entries (see [`Block::decode`]).
pub fn decode_data_block(buf: &[u8], what: &str) -> Result<Vec<Entry>> {
    let b = Block::decode(buf, what)?;
    Ok((0..b.len()).map(|i| b.entry(i)).collect())
}

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

/// The sparse index of run `meta` rebuilt from its data blocks, which the
/// log's summaries name (kind RunData, owner = the run's id): every
/// segment is read and walked. Only a whole run will do: its blocks must
/// hold exactly its entries, in ascending key ranges that do not overlap.
fn rebuild_index(store: &dyn Store, log_id: u64, meta: &RunMeta) -> Result<Vec<IndexEntry>> {
    let g = store.geometry();
    let mut found: Vec<((Vec<u8>, u64), IndexEntry, usize)> = Vec::new();
    let mut buf = vec![0u8; g.segment_size as usize];
    for seg in 0..g.segment_count {
        store.read(seg, 0, &mut buf).map_err(|e| Error::io(format!("reading segment {seg}"), e))?;
        let what = |off: usize| format!("segment {seg} at offset {off}");
        let mut blocks = Vec::new();
        // A summary that does not decode ends this segment's walk.
        let _ = crate::log::walk_segment(&buf, log_id, true, &what, |b| {
            for e in &b.entries {
                if e.kind == BlockKind::RunData as u8 && e.owner == meta.id {
                    blocks.push(BlockAddr { seg, offset: b.offset + e.offset, len: e.len });
                }
            }
            true
        });
        for addr in blocks {
            let (lo, hi) = (addr.offset as usize, (addr.offset + addr.len) as usize);
            let Some(bytes) = buf.get(lo..hi) else { continue };
            // A block whose own checksum fails is not one of the run's.
            let Ok(raw) = crate::log::decode_block(bytes, addr, BlockKind::RunData) else { continue };
            let b = Block::decode(&raw, &format!("data block of run {} at {addr}", meta.id))?;
            let n = b.len();
            if n == 0 {
                continue;
            }
            found.push((
                (b.key(0).to_vec(), b.seq(0)),
                IndexEntry { last_key: b.key(n - 1).to_vec(), last_seq: b.seq(n - 1), addr },
                n,
            ));
        }
    }
    // Internal order (key, then newest first); versions of one key may
    // end one block and begin the next.
    found.sort_by(|a, b| cmp_internal(&a.0 .0, a.0 .1, &b.0 .0, b.0 .1));
    let entries: usize = found.iter().map(|f| f.2).sum();
    let ordered = found
        .windows(2)
        .all(|w| cmp_internal(&w[0].1.last_key, w[0].1.last_seq, &w[1].0 .0, w[1].0 .1) == Ordering::Less);
    if entries as u64 != meta.entries || !ordered {
        return Err(Error::corrupt(
            format!("run {}", meta.id),
            format!("its data blocks in the log hold {entries} entries of its {}", meta.entries),
        ));
    }
    Ok(found.into_iter().map(|f| f.1).collect())
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

/// A blocked Bloom filter over user keys: every key's `k` bits fall in one
/// 64-byte line, so a probe costs one cache miss instead of `k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    k: u8,
    bits: Vec<u8>,
}

/// Bytes in one filter line.
const BLOOM_LINE: usize = 64;

/// splitmix64's finaliser: spreads every input bit over the output.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The line (byte offset) and the `k` bit positions within it of a key:
/// the line from one 64-bit hash, the positions from 9-bit slices of a
/// second, so the two choices are independent.
fn bloom_probe(bits_len: usize, k: u8, key: &[u8]) -> (usize, impl Iterator<Item = usize>) {
    let h = mix64(u64::from(crc32c::crc32c(key)) << 32 | u64::from(crc32c::crc32c_append(0x9e37_79b9, key)));
    let lines = (bits_len / BLOOM_LINE).max(1) as u64;
    let line = (((h >> 32) * lines) >> 32) as usize;
    let g = mix64(h ^ 0x2545_f491_4f6c_dd1d);
    let bits = (0..u32::from(k.min(7))).map(move |i| ((g >> (9 * i)) & 511) as usize);
    (line * BLOOM_LINE, bits)
}

impl Bloom {
    /// A filter for `n` keys at about 10 bits per key (about 1% false
    /// positives).
    pub fn build<'a>(n: usize, keys: impl Iterator<Item = &'a [u8]>) -> Bloom {
        let nbytes = (n * 10).div_ceil(8).clamp(BLOOM_LINE, 1 << 27).next_multiple_of(BLOOM_LINE);
        let mut b = Bloom { k: 7, bits: vec![0u8; nbytes] };
        for key in keys {
            let (base, probes) = bloom_probe(b.bits.len(), b.k, key);
            for bit in probes {
                b.bits[base + bit / 8] |= 1 << (bit % 8);
            }
        }
        b
    }
    /// A filter that rules out nothing (in place of a damaged one).
    pub fn everything() -> Bloom {
        Bloom { k: 7, bits: Vec::new() }
    }

    /// False if `key` is certainly absent.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        if self.bits.len() < BLOOM_LINE {
            return true;
        }
        let (base, mut probes) = bloom_probe(self.bits.len(), self.k, key);
        let line = &self.bits[base..base + BLOOM_LINE];
        probes.all(|bit| line[bit / 8] & (1 << (bit % 8)) != 0)
    }
    /// Encode the filter block payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.bits.len() + 8);
        v.put_u8(self.k);
        v.put_lenbytes(&self.bits);
        v
    }
    /// Decode a filter block payload.
    pub fn decode(buf: &[u8], what: &str) -> Result<Bloom> {
        let mut r = Reader::new(buf, what);
        let k = r.u8()?;
        if k == 0 || k > 30 {
            return Err(r.err(format!("bad hash count {k}")));
        }
        let bits = r.lenbytes(1 << 28, "filter length")?.to_vec();
        if bits.len() % BLOOM_LINE != 0 {
            return Err(r.err(format!("filter of {} bytes is not whole {BLOOM_LINE}-byte lines", bits.len())));
        }
        r.finish()?;
        Ok(Bloom { k, bits })
    }
}

/// A decoded data block with the tick it was last used at.
type CachedBlock = (Arc<Block>, u64);

const CACHE_SHARDS: usize = 16;

#[derive(Default)]
struct Shard {
    map: HashMap<(u64, u32), CachedBlock>,
    tick: u64,
    used: usize,
}

/// A cache of decoded data blocks, keyed by (run id, block number) so that
/// a reused segment can never serve a stale block. Sharded so that readers
/// on different blocks rarely meet on a lock.
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity: usize,
}

impl BlockCache {
    /// A cache holding about `capacity_bytes` of decoded blocks.
    pub fn new(capacity_bytes: usize) -> BlockCache {
        BlockCache {
            shards: (0..CACHE_SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_capacity: capacity_bytes / CACHE_SHARDS,
        }
    }

    fn shard(&self, key: (u64, u32)) -> std::sync::MutexGuard<'_, Shard> {
        let h =
            key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(key.1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        let i = (h >> 59) as usize % CACHE_SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: (u64, u32)) -> Option<Arc<Block>> {
        let mut sh = self.shard(key);
        sh.tick += 1;
        let t = sh.tick;
        sh.map.get_mut(&key).map(|(b, last)| {
            *last = t;
            b.clone()
        })
    }

    fn insert(&self, key: (u64, u32), block: Arc<Block>) {
        let mut sh = self.shard(key);
        sh.tick += 1;
        let t = sh.tick;
        sh.used += block.bytes();
        if sh.used > self.shard_capacity && sh.map.len() > 4 {
            // Evict the older half.
            let mut ticks: Vec<u64> = sh.map.values().map(|(_, t)| *t).collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 2];
            sh.map.retain(|_, (_, t)| *t > cut);
            sh.used = sh.map.values().map(|(b, _)| b.bytes()).sum::<usize>() + block.bytes();
        }
        if let Some((old, _)) = sh.map.insert(key, (block, t)) {
            sh.used = sh.used.saturating_sub(old.bytes());
        }
    }

    /// Drop every block of run `id`.
    pub fn forget_run(&self, id: u64) {
        for s in &self.shards {
            let mut sh = s.lock().unwrap_or_else(|p| p.into_inner());
            sh.map.retain(|k, _| k.0 != id);
            sh.used = sh.map.values().map(|(b, _)| b.bytes()).sum();
        }
    }
}

/// The sparse index in a flat layout for searching: the last keys of the
/// data blocks end to end, with their sequence numbers.
struct FlatIndex {
    keys: Vec<u8>,
    ends: Vec<u32>,
    seqs: Vec<u64>,
}

impl FlatIndex {
    fn new(index: &[IndexEntry]) -> FlatIndex {
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

    fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.keys[start..self.ends[i] as usize]
    }

    /// The first block whose last internal key is at or after (key, seq).
    fn search(&self, key: &[u8], seq: u64) -> usize {
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

/// An open run: descriptor, sparse index and filter in memory.
pub struct Run {
    /// The descriptor.
    pub meta: RunMeta,
    /// The sparse index.
    pub index: Vec<IndexEntry>,
    flat: FlatIndex,
    filter: Bloom,
}

impl Run {
    /// Load a run's index and filter from the store.
    pub fn open(store: &dyn Store, meta: RunMeta) -> Result<Run> {
        let raw = read_block(store, meta.index, BlockKind::RunIndex)?;
        let index = decode_index_block(&raw, &format!("index block of run {} at {}", meta.id, meta.index))?;
        let raw = read_block(store, meta.filter, BlockKind::RunFilter)?;
        let filter = Bloom::decode(&raw, &format!("filter block of run {} at {}", meta.id, meta.filter))?;
        Ok(Run::from_parts(meta, index, filter))
    }

    /// Open a run whose index or filter block is damaged (`err`, from
    /// [`Run::open`]): a damaged filter is done without (every lookup reads
    /// the run); a damaged index is rebuilt from the run's data blocks,
    /// found in the log by their summaries (owner = the run's id). Returns
    /// the run and what was done; `err` when the index cannot be rebuilt
    /// whole (a data block is missing or damaged too).
    pub fn open_damaged(store: &dyn Store, log_id: u64, meta: RunMeta, err: Error) -> Result<(Run, String)> {
        let what = format!("run {}", meta.id);
        let mut notes = Vec::new();
        let index = match read_block(store, meta.index, BlockKind::RunIndex)
            .and_then(|raw| decode_index_block(&raw, &format!("index block of {what} at {}", meta.index)))
        {
            Ok(i) => i,
            Err(e) => {
                let rebuilt = rebuild_index(store, log_id, &meta).map_err(|_| err)?;
                notes.push(format!("its index block is damaged ({e}): rebuilt from its data blocks"));
                rebuilt
            }
        };
        let filter = match read_block(store, meta.filter, BlockKind::RunFilter)
            .and_then(|raw| Bloom::decode(&raw, &format!("filter block of {what} at {}", meta.filter)))
        {
            Ok(f) => f,
            Err(e) => {
                notes.push(format!("its filter block is damaged ({e}): every lookup reads the run"));
                Bloom::everything()
            }
        };
        Ok((Run::from_parts(meta, index, filter), format!("{what}: {}", notes.join("; "))))
    }

    /// A run just written, from its parts (no need to read it back).
    pub fn from_parts(meta: RunMeta, index: Vec<IndexEntry>, filter: Bloom) -> Run {
        Run { flat: FlatIndex::new(&index), meta, index, filter }
    }

    /// Every block address of the run (for space accounting).
    pub fn blocks(&self) -> Vec<BlockAddr> {
        let mut v: Vec<BlockAddr> = self.index.iter().map(|e| e.addr).collect();
        v.push(self.meta.index);
        v.push(self.meta.filter);
        v
    }

    /// Data block `i`, through the cache.
    pub fn block(&self, store: &dyn Store, cache: &BlockCache, i: usize) -> Result<Arc<Block>> {
        let key = (self.meta.id, i as u32);
        if let Some(b) = cache.get(key) {
            return Ok(b);
        }
        let addr = self.index[i].addr;
        let raw = read_block(store, addr, BlockKind::RunData)?;
        let what = format!("data block {i} of run {} at {addr}", self.meta.id);
        let b = Block::decode(&raw, &what)?;
        // Pair assertion: the block ends where the sparse index says.
        let n = b.len();
        if n == 0
            || b.key(n - 1) != self.index[i].last_key.as_slice()
            || b.seq(n - 1) != self.index[i].last_seq
        {
            return Err(Error::corrupt(what, "does not end with the key its index entry names"));
        }
        let b = Arc::new(b);
        cache.insert(key, b.clone());
        Ok(b)
    }

    /// The newest version of `key` with sequence number at most `seq`:
    /// `Some(None)` for a tombstone, `None` if the run has no such version.
    pub fn get(
        &self,
        store: &dyn Store,
        cache: &BlockCache,
        key: &[u8],
        seq: u64,
    ) -> Result<Option<Option<Vec<u8>>>> {
        if seq < self.meta.min_seq
            || key < self.meta.min_key.as_slice()
            || key > self.meta.max_key.as_slice()
            || !self.filter.may_contain(key)
        {
            return Ok(None);
        }
        let i = self.flat.search(key, seq);
        if i >= self.index.len() {
            return Ok(None);
        }
        let b = self.block(store, cache, i)?;
        Ok(b.find(key, seq).map(|j| b.value(j).map(|v| v.to_vec())))
    }

    /// A cursor over entries with key >= `start`, in internal order.
    pub fn cursor(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        cache: Arc<BlockCache>,
        start: &[u8],
    ) -> RunCursor {
        let bi = self.flat.search(start, u64::MAX);
        RunCursor { run: self.clone(), store, cache, bi, block: None, ei: 0, start: start.to_vec() }
    }
}

/// Iterates a run's entries from a start key.
pub struct RunCursor {
    run: Arc<Run>,
    store: Arc<dyn Store>,
    cache: Arc<BlockCache>,
    bi: usize,
    block: Option<Arc<Block>>,
    ei: usize,
    start: Vec<u8>,
}

impl Iterator for RunCursor {
    type Item = Result<Entry>;
    fn next(&mut self) -> Option<Result<Entry>> {
        loop {
            if let Some(b) = &self.block {
                if self.ei < b.len() {
                    self.ei += 1;
                    return Some(Ok(b.entry(self.ei - 1)));
                }
                self.block = None;
                self.bi += 1;
            }
            if self.bi >= self.run.index.len() {
                return None;
            }
            match self.run.block(self.store.as_ref(), &self.cache, self.bi) {
                Ok(b) => {
                    self.ei = b.search(&self.start, u64::MAX);
                    self.block = Some(b);
                }
                Err(e) => {
                    self.bi = usize::MAX - 1;
                    return Some(Err(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bloom_has_no_false_negatives_and_few_false_positives() {
        let keys: Vec<Vec<u8>> = (0..20_000u32).map(|i| i.to_be_bytes().to_vec()).collect();
        let b = Bloom::build(keys.len(), keys.iter().map(|k| k.as_slice()));
        assert!(keys.iter().all(|k| b.may_contain(k)));
        let fp = (20_000..120_000u32).filter(|i| b.may_contain(&i.to_be_bytes())).count();
        assert!(fp < 3_000, "{fp} false positives in 100,000 (want about 1-2%)");
        let d = Bloom::decode(&b.encode(), "filter").unwrap();
        assert_eq!(d, b);
    }

    #[test]
    fn flat_block_round_trip() {
        let es: Vec<Entry> = (0..300u32)
            .map(|i| Entry {
                key: format!("key{:04}", i / 2).into_bytes(),
                seq: u64::from(1000 - i % 2),
                value: (i % 7 != 0).then(|| vec![i as u8; (i % 50) as usize]),
            })
            .collect();
        let b = Block::decode(&encode_data_block(&es), "block").unwrap();
        assert_eq!((0..b.len()).map(|i| b.entry(i)).collect::<Vec<_>>(), es);
        assert_eq!(b.search(b"key0010", u64::MAX), 20);
        assert_eq!(b.search(b"key0010", 999), 21);
        // The hash index agrees with the binary search.
        assert_eq!(b.find(b"key0010", u64::MAX), Some(20));
        assert_eq!(b.find(b"key0010", 999), Some(21));
        assert_eq!(b.find(b"key0010", 998), None);
        assert_eq!(b.find(b"key9999", u64::MAX), None);
        for i in 0..b.len() {
            for seq in [998, 999, 1000, u64::MAX] {
                let j = b.search(b.key(i), seq);
                let want = (j < b.len() && b.key(j) == b.key(i)).then_some(j);
                assert_eq!(b.find(b.key(i), seq), want);
            }
        }
    }
}
