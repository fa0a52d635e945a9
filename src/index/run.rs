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
use std::sync::atomic::{AtomicU64, Ordering as AtOrd};
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

/// Decode a data block payload; checks that entries are in internal order.
pub fn decode_data_block(buf: &[u8], what: &str) -> Result<Vec<Entry>> {
    let mut r = Reader::new(buf, what);
    let n = r.var_max(buf.len() as u64, "entry count")? as usize;
    let mut out: Vec<Entry> = Vec::with_capacity(n);
    for _ in 0..n {
        let shared = r.var()? as usize;
        let prev = out.last().map(|e| e.key.as_slice()).unwrap_or(&[]);
        if shared > prev.len() {
            return Err(r.err("shared key prefix longer than the previous key"));
        }
        let rest = r.lenbytes(MAX_KEY, "key length")?;
        let mut key = Vec::with_capacity(shared + rest.len());
        key.extend_from_slice(&prev[..shared]);
        key.extend_from_slice(rest);
        if key.len() > MAX_KEY {
            return Err(r.err("key too long"));
        }
        let seq = r.var()?;
        let value = match r.u8()? {
            0 => None,
            1 => Some(r.lenbytes(MAX_VALUE, "value length")?.to_vec()),
            t => return Err(r.err(format!("unknown entry type {t}"))),
        };
        if let Some(p) = out.last() {
            if cmp_internal(&p.key, p.seq, &key, seq) != Ordering::Less {
                return Err(r.err("entries out of order"));
            }
        }
        out.push(Entry { key, seq, value });
    }
    r.finish()?;
    Ok(out)
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

/// A Bloom filter over user keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    k: u8,
    bits: Vec<u8>,
}

fn bloom_hashes(key: &[u8]) -> (u32, u32) {
    let h1 = crc32c::crc32c(key);
    let h2 = crc32c::crc32c_append(0x9e37_79b9, key) | 1;
    (h1, h2)
}

impl Bloom {
    /// A filter for `n` keys at about 10 bits per key (1% false positives).
    pub fn build<'a>(n: usize, keys: impl Iterator<Item = &'a [u8]>) -> Bloom {
        let nbits = (n * 10).clamp(64, 1 << 30);
        let mut b = Bloom { k: 7, bits: vec![0u8; nbits.div_ceil(8)] };
        let m = (b.bits.len() * 8) as u64;
        for key in keys {
            let (h1, h2) = bloom_hashes(key);
            for i in 0..u32::from(b.k) {
                let bit = (u64::from(h1.wrapping_add(i.wrapping_mul(h2)))) % m;
                b.bits[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        b
    }
    /// False if `key` is certainly absent.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        let m = (self.bits.len() * 8) as u64;
        if m == 0 {
            return true;
        }
        let (h1, h2) = bloom_hashes(key);
        (0..u32::from(self.k)).all(|i| {
            let bit = (u64::from(h1.wrapping_add(i.wrapping_mul(h2)))) % m;
            self.bits[(bit / 8) as usize] & (1 << (bit % 8)) != 0
        })
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
        r.finish()?;
        Ok(Bloom { k, bits })
    }
}

/// A decoded data block with the tick it was last used at.
type CachedBlock = (Arc<Vec<Entry>>, u64);

/// A cache of decoded data blocks, keyed by (run id, block number) so that
/// a reused segment can never serve a stale block.
pub struct BlockCache {
    map: Mutex<HashMap<(u64, u32), CachedBlock>>,
    tick: AtomicU64,
    capacity_bytes: usize,
    used: AtomicU64,
}

impl BlockCache {
    /// A cache holding about `capacity_bytes` of decoded blocks.
    pub fn new(capacity_bytes: usize) -> BlockCache {
        BlockCache {
            map: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
            capacity_bytes,
            used: AtomicU64::new(0),
        }
    }

    fn get(&self, key: (u64, u32)) -> Option<Arc<Vec<Entry>>> {
        let t = self.tick.fetch_add(1, AtOrd::Relaxed);
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.get_mut(&key).map(|(b, last)| {
            *last = t;
            b.clone()
        })
    }

    fn insert(&self, key: (u64, u32), block: Arc<Vec<Entry>>, bytes: usize) {
        let t = self.tick.fetch_add(1, AtOrd::Relaxed);
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let used = self.used.fetch_add(bytes as u64, AtOrd::Relaxed) as usize + bytes;
        if used > self.capacity_bytes && m.len() > 4 {
            // Evict the older half.
            let mut ticks: Vec<u64> = m.values().map(|(_, t)| *t).collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 2];
            m.retain(|_, (_, t)| *t > cut);
            let kept: usize = m.values().map(|(b, _)| block_bytes(b)).sum();
            self.used.store(kept as u64, AtOrd::Relaxed);
        }
        if let Some((old, _)) = m.insert(key, (block, t)) {
            self.used.fetch_sub(block_bytes(&old) as u64, AtOrd::Relaxed);
        }
    }

    /// Drop every block of run `id`.
    pub fn forget_run(&self, id: u64) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|k, _| k.0 != id);
    }
}

fn block_bytes(b: &[Entry]) -> usize {
    b.iter().map(|e| e.key.len() + e.value.as_ref().map_or(0, |v| v.len()) + 48).sum()
}

/// An open run: descriptor, sparse index and filter in memory.
pub struct Run {
    /// The descriptor.
    pub meta: RunMeta,
    /// The sparse index.
    pub index: Vec<IndexEntry>,
    filter: Bloom,
}

impl Run {
    /// Load a run's index and filter from the store.
    pub fn open(store: &dyn Store, meta: RunMeta) -> Result<Run> {
        let raw = read_block(store, meta.index, BlockKind::RunIndex)?;
        let index = decode_index_block(&raw, &format!("index block of run {} at {}", meta.id, meta.index))?;
        let raw = read_block(store, meta.filter, BlockKind::RunFilter)?;
        let filter = Bloom::decode(&raw, &format!("filter block of run {} at {}", meta.id, meta.filter))?;
        Ok(Run { meta, index, filter })
    }

    /// Every block address of the run (for space accounting).
    pub fn blocks(&self) -> Vec<BlockAddr> {
        let mut v: Vec<BlockAddr> = self.index.iter().map(|e| e.addr).collect();
        v.push(self.meta.index);
        v.push(self.meta.filter);
        v
    }

    /// Data block `i`, through the cache.
    pub fn block(&self, store: &dyn Store, cache: &BlockCache, i: usize) -> Result<Arc<Vec<Entry>>> {
        let key = (self.meta.id, i as u32);
        if let Some(b) = cache.get(key) {
            return Ok(b);
        }
        let addr = self.index[i].addr;
        let raw = read_block(store, addr, BlockKind::RunData)?;
        let what = format!("data block {i} of run {} at {addr}", self.meta.id);
        let entries = decode_data_block(&raw, &what)?;
        // Pair assertion: the block ends where the sparse index says.
        match entries.last() {
            Some(l) if l.key == self.index[i].last_key && l.seq == self.index[i].last_seq => {}
            _ => return Err(Error::corrupt(what, "does not end with the key its index entry names")),
        }
        let b = Arc::new(entries);
        cache.insert(key, b.clone(), block_bytes(&b));
        Ok(b)
    }

    /// The first data block that may hold internal key (key, seq).
    fn find_block(&self, key: &[u8], seq: u64) -> usize {
        self.index.partition_point(|e| cmp_internal(&e.last_key, e.last_seq, key, seq) == Ordering::Less)
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
        let i = self.find_block(key, seq);
        if i >= self.index.len() {
            return Ok(None);
        }
        let b = self.block(store, cache, i)?;
        let j = b.partition_point(|e| cmp_internal(&e.key, e.seq, key, seq) == Ordering::Less);
        match b.get(j) {
            Some(e) if e.key == key => Ok(Some(e.value.clone())),
            _ => Ok(None),
        }
    }

    /// A cursor over entries with key >= `start`, in internal order.
    pub fn cursor(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        cache: Arc<BlockCache>,
        start: &[u8],
    ) -> RunCursor {
        let bi = self.find_block(start, u64::MAX);
        RunCursor { run: self.clone(), store, cache, bi, block: None, ei: 0, start: start.to_vec() }
    }
}

/// Iterates a run's entries from a start key.
pub struct RunCursor {
    run: Arc<Run>,
    store: Arc<dyn Store>,
    cache: Arc<BlockCache>,
    bi: usize,
    block: Option<Arc<Vec<Entry>>>,
    ei: usize,
    start: Vec<u8>,
}

impl Iterator for RunCursor {
    type Item = Result<Entry>;
    fn next(&mut self) -> Option<Result<Entry>> {
        loop {
            if let Some(b) = &self.block {
                if let Some(e) = b.get(self.ei) {
                    self.ei += 1;
                    return Some(Ok(e.clone()));
                }
                self.block = None;
                self.bi += 1;
            }
            if self.bi >= self.run.index.len() {
                return None;
            }
            match self.run.block(self.store.as_ref(), &self.cache, self.bi) {
                Ok(b) => {
                    self.ei = b.partition_point(|e| e.key.as_slice() < self.start.as_slice());
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

impl Run {
    /// A run just written, from its parts (no need to read it back).
    pub fn from_parts(meta: RunMeta, index: Vec<IndexEntry>, filter: Bloom) -> Run {
        Run { meta, index, filter }
    }
}
