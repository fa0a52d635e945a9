//! Sorted runs: immutable, key-sorted files of index entries stored in the
//! log as compressed, checksummed blocks.
//!
//! A run is a sequence of data blocks (entries in internal order: key
//! ascending, sequence number descending), one sparse index block (the last
//! internal key of every data block and its address) and one filter block (a
//! Bloom filter over user keys). Its descriptor ([`RunMeta`]) lives in the
//! checkpoint.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::bytes::{Put, Reader};
use crate::error::{Error, Result};
use crate::log::format::{BlockAddr, BlockKind};
use crate::log::read_block;
use crate::store::Store;

use super::{Entry, MAX_KEY};

mod block;
mod bloom;
mod cache;
mod flat;
mod sparse;

#[cfg(feature = "fuzzing")]
pub use block::decode_data_block;
pub use block::{cmp_internal, encode_data_block, Block};
pub use bloom::{key_hash, Bloom};
pub use cache::BlockCache;
use flat::FlatIndex;
pub use sparse::{decode_index_block, encode_index_block, IndexEntry};

/// The descriptor of a run, kept in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMeta {
    /// Unique id (never reused); owner of the run's blocks.
    pub id: u64,
    /// Its level (0: flushed; below: pieces of one sorted run a level).
    /// Kept in the checkpoint body's level section, not in this encoding.
    pub level: u8,
    /// Number of entries.
    pub entries: u64,
    /// How many of them are tombstones (kept with the level).
    pub tombstones: u64,
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
            level: 0,
            entries: r.var()?,
            tombstones: 0,
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
        let walked = crate::log::walk_segment(&buf, log_id, true, &what, |b| {
            for e in &b.entries {
                if e.kind == BlockKind::RunData as u8 && e.owner == meta.id {
                    blocks.push(BlockAddr { seg, offset: b.offset + e.offset, len: e.len });
                }
            }
            true
        });
        if let Err(e) = walked {
            tracing::debug!("rebuilding run {}: the walk of segment {seg} stops: {e}", meta.id);
        }
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
        self.block_via_cache(store, cache, i, true)
    }

    /// Data block `i`: from the cache if it holds it, else from the
    /// store, and then cached only if `fill`.
    fn block_via_cache(
        &self,
        store: &dyn Store,
        cache: &BlockCache,
        i: usize,
        fill: bool,
    ) -> Result<Arc<Block>> {
        let key = (self.meta.id, i as u32);
        if let Some(b) = cache.get(key) {
            return Ok(b);
        }
        let b = Arc::new(self.read_block(store, i)?);
        if fill {
            cache.insert(key, b.clone());
        }
        Ok(b)
    }

    /// Data block `i` read from the store and checked, past the cache
    /// (scrub and fsck verify what the device holds).
    pub fn read_block(&self, store: &dyn Store, i: usize) -> Result<Block> {
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
        RunCursor {
            run: self.clone(),
            store,
            cache,
            fill: true,
            bi,
            block: None,
            ei: 0,
            start: start.to_vec(),
        }
    }

    /// A cursor over all its entries for a merge: it reads the blocks the
    /// cache holds but adds none, since the run goes when the merge is
    /// installed (as RocksDB's compactions read with `fill_cache` off).
    /// Otherwise every merge would fill the cache to its bound with blocks
    /// no reader asked for, evicting the ones readers did.
    pub fn merge_cursor(self: &Arc<Self>, store: Arc<dyn Store>, cache: Arc<BlockCache>) -> RunCursor {
        RunCursor { fill: false, ..self.cursor(store, cache, &[]) }
    }
}

/// Iterates a run's entries from a start key.
pub struct RunCursor {
    run: Arc<Run>,
    store: Arc<dyn Store>,
    cache: Arc<BlockCache>,
    /// Whether blocks read from the store are added to the cache.
    fill: bool,
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
            match self.run.block_via_cache(self.store.as_ref(), &self.cache, self.bi, self.fill) {
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

    /// The filter's bytes for fixed keys, pinned (the value the build
    /// from keys gave at 420beb2): they are on disk
    /// (FORMAT.md §3.4), so building from key hashes must set the bits
    /// building from keys did.
    #[test]
    fn filter_bytes_are_pinned() {
        let keys: Vec<Vec<u8>> = (0..1_000u32).map(|i| format!("key {i}").into_bytes()).collect();
        let b = Bloom::build(keys.len(), keys.iter().map(|k| k.as_slice()));
        assert_eq!(crc32c::crc32c(&b.encode()), 3_948_178_197, "the filter's bytes changed");
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
