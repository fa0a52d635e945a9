//! The storage engine: one log holding journal records, index runs, data
//! blocks and checkpoints; an LSM index over it; recovery from the newest
//! valid checkpoint by rolling the log forward.
//!
//! Locks, always taken in this order: `ckpt` (one flush, merge or checkpoint
//! at a time), `sync` (the group-commit leader), `core` (log writer, sequence
//! numbers, memtable switch), `version` (what readers see).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtOrd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

use rayon::prelude::*;

use crate::bytes::{Put, Reader};
use crate::codec::{CodecId, CodecSpec};
use crate::error::{Error, Result};
use crate::index::run::{encode_data_block, encode_index_block, BlockCache, Bloom, IndexEntry, Run, RunMeta};
use crate::index::{retain_versions, Entry, Memtable, MergeIter, MAX_KEY, MAX_VALUE};
use crate::log::format::*;
mod clean;

pub use crate::log::Room;
use crate::log::{self, max_block_raw, LogWriter, NewBlock, SegUsage};
use crate::store::{MetaSlot, Store};
pub use clean::{Reclaimed, SegBlock, Victim};

/// A data block of an index run that cannot be read.
#[derive(Debug)]
pub struct DamagedBlock {
    /// The run.
    pub run: u64,
    /// The block.
    pub addr: BlockAddr,
    /// The last key of the block before it (the run's first key for its
    /// first block): the block held keys from about here...
    pub from: Vec<u8>,
    /// ...to its own last key, which the run's index names.
    pub to: Vec<u8>,
    /// Why it cannot be read.
    pub error: Error,
}

/// Tunables of an open engine (none of them is part of the format).
#[derive(Debug, Clone)]
pub struct Options {
    /// Freeze and flush the memtable past this many bytes.
    pub memtable_bytes: usize,
    /// Merge runs when there are more than this many.
    pub max_runs: usize,
    /// Target uncompressed size of a run data block.
    pub run_block_bytes: usize,
    /// Codec for index runs and checkpoints.
    pub index_codec: CodecSpec,
    /// Codec for journal blocks.
    pub journal_codec: CodecSpec,
    /// Flush and merge on a background thread (otherwise inline).
    pub background: bool,
    /// Bytes of decoded run blocks to cache.
    pub cache_bytes: usize,
    /// The store is open read-only: write nothing, not even the
    /// superblock's copy an older image lacks.
    pub read_only: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            memtable_bytes: 32 << 20,
            max_runs: 6,
            run_block_bytes: 16 << 10,
            index_codec: CodecSpec::new(CodecId::Zstd, 3),
            journal_codec: CodecSpec::new(CodecId::Zstd, 1),
            background: true,
            cache_bytes: 256 << 20,
            read_only: false,
        }
    }
}

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
    fn encode(&self, first_seq: u64, out: &mut Vec<u8>) {
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

/// What a checkpoint body holds (a block in the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointBody {
    /// Checkpoint number.
    pub number: u64,
    /// Every mutation with a sequence number up to this one is in a run.
    pub flushed_seq: u64,
    /// Next sequence number to assign.
    pub next_seq: u64,
    /// Reads below this sequence number may see merged-away versions.
    pub horizon: u64,
    /// Next run id.
    pub next_run_id: u64,
    /// Body of the previous checkpoint.
    pub prev_body: BlockAddr,
    /// Blocks freed by checkpoint N, usable once checkpoint N+1 is durable.
    pub deferred: Vec<(u64, BlockAddr)>,
    /// Runs, newest first.
    pub runs: Vec<RunMeta>,
    /// Segment usage as of the body (the body's own block excluded).
    pub usage: Vec<SegUsage>,
}

impl CheckpointBody {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.put_var(self.number);
        v.put_var(self.flushed_seq);
        v.put_var(self.next_seq);
        v.put_var(self.horizon);
        v.put_var(self.next_run_id);
        self.prev_body.put(&mut v);
        v.put_var(self.deferred.len() as u64);
        for (n, a) in &self.deferred {
            v.put_var(*n);
            a.put(&mut v);
        }
        v.put_var(self.runs.len() as u64);
        for r in &self.runs {
            r.put(&mut v);
        }
        v.put_var(self.usage.len() as u64);
        for u in &self.usage {
            v.put_var(u64::from(u.live));
            v.put_var(u.last_batch);
        }
        v
    }

    /// Decode.
    pub fn decode(buf: &[u8], what: &str) -> Result<CheckpointBody> {
        let mut r = Reader::new(buf, what);
        let number = r.var()?;
        let flushed_seq = r.var()?;
        let next_seq = r.var()?;
        let horizon = r.var()?;
        let next_run_id = r.var()?;
        let prev_body = BlockAddr::get(&mut r)?;
        let n = r.var_max(buf.len() as u64, "deferred count")?;
        let mut deferred = Vec::new();
        for _ in 0..n {
            deferred.push((r.var()?, BlockAddr::get(&mut r)?));
        }
        let n = r.var_max(buf.len() as u64, "run count")?;
        let mut runs = Vec::new();
        for _ in 0..n {
            runs.push(RunMeta::get(&mut r)?);
        }
        let n = r.var_max(buf.len() as u64, "segment count")?;
        let mut usage = Vec::new();
        for _ in 0..n {
            let live = r.var()?;
            let live = u32::try_from(live).map_err(|_| r.err("live bytes overflow"))?;
            usage.push(SegUsage { live, last_batch: r.var()? });
        }
        r.finish()?;
        Ok(CheckpointBody {
            number,
            flushed_seq,
            next_seq,
            horizon,
            next_run_id,
            prev_body,
            deferred,
            runs,
            usage,
        })
    }
}

/// Create an empty image on `store`: superblock and the first checkpoint.
pub fn mkfs(store: Arc<dyn Store>) -> Result<Superblock> {
    let geometry = store.geometry();
    validate_geometry(geometry).map_err(Error::Invalid)?;
    let uuid: [u8; 16] = rand::random();
    let created_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let sb = Superblock {
        version: FORMAT_VERSION,
        compat: 0,
        incompat: 0,
        ro_compat: 0,
        uuid,
        geometry,
        created_ns,
    };
    let start = LogPos { seg: 0, offset: 0, batch_seq: 1, prev_crc: 0, next_seg: NO_SEGMENT };
    let usage = vec![SegUsage::default(); geometry.segment_count as usize];
    let mut log = LogWriter::new(store.clone(), sb.log_id(), start, usage, Options::default().journal_codec);
    let body = CheckpointBody {
        number: 0,
        flushed_seq: 0,
        next_seq: 1,
        horizon: 0,
        next_run_id: 1,
        prev_body: BlockAddr::default(),
        deferred: Vec::new(),
        runs: Vec::new(),
        usage: log.usage.clone(),
    };
    let blk = NewBlock::encode(BlockKind::Checkpoint, 0, Options::default().index_codec, &body.encode());
    let addr = log.add_blocks(vec![blk], Room::System)?[0];
    log.write_pending(Room::System)?;
    let slot = CheckpointSlot { number: 0, uuid, body: addr, replay: start, after_body: log.pos() };
    let wr = |s: MetaSlot, b: &[u8; 4096]| {
        store.write_meta(s, b).map_err(|e| Error::io(format!("writing {s:?}"), e))
    };
    wr(MetaSlot::CheckpointA, &slot.encode())?;
    wr(MetaSlot::CheckpointB, &[0u8; 4096])?;
    wr(MetaSlot::SuperCopy, &sb.encode())?;
    store.sync().map_err(|e| Error::io("syncing the new image", e))?;
    // The superblock last: an image without one is not an image.
    wr(MetaSlot::Super, &sb.encode())?;
    store.sync().map_err(|e| Error::io("syncing the new image", e))?;
    Ok(sb)
}

/// Read and check the superblock: the primary, or its copy when the
/// primary is damaged.
pub fn read_superblock(store: &dyn Store) -> Result<Superblock> {
    read_superblock_noting(store).map(|(sb, _)| sb)
}

/// [`read_superblock`], and what was wrong with the primary when its copy
/// (metadata slot 15, FORMAT.md §2.1) was used. An unsupported version or
/// feature is the primary's answer: the copy is not asked.
pub fn read_superblock_noting(store: &dyn Store) -> Result<(Superblock, Option<String>)> {
    let read = |slot: MetaSlot| -> Result<Superblock> {
        let mut buf = [0u8; 4096];
        store.read_meta(slot, &mut buf).map_err(|e| Error::io(format!("reading {slot:?}"), e))?;
        Superblock::decode(&buf)
    };
    match read(MetaSlot::Super) {
        Ok(sb) => Ok((sb, None)),
        Err(e @ Error::Unsupported(_)) => Err(e),
        Err(e) => match read(MetaSlot::SuperCopy) {
            Ok(sb) => {
                Ok((sb, Some(format!("the superblock is damaged ({e}); its copy in slot 15 was read"))))
            }
            Err(_) => Err(e),
        },
    }
}

/// A frozen memtable waiting to be flushed.
struct Frozen {
    mem: Arc<Memtable>,
    /// Log position after its last record.
    end: LogPos,
    /// Its largest sequence number.
    max_seq: u64,
}

/// What readers see: memtables and runs.
struct Version {
    active: Arc<Memtable>,
    /// Newest first.
    frozen: Vec<Arc<Frozen>>,
    /// Newest first.
    runs: Vec<Arc<Run>>,
}

/// A run being written.
struct RunBuilder {
    meta: RunMeta,
    index: Vec<IndexEntry>,
    /// Distinct keys, for the filter.
    keys: Vec<Vec<u8>>,
    /// Finished data blocks not yet placed in the log.
    blocks: Vec<Vec<Entry>>,
    /// The data block being filled.
    cur: Vec<Entry>,
    cur_bytes: usize,
    /// Bytes the sparse index will take.
    index_bytes: usize,
}

impl RunBuilder {
    fn new(id: u64) -> RunBuilder {
        RunBuilder {
            meta: RunMeta {
                id,
                entries: 0,
                min_seq: u64::MAX,
                max_seq: 0,
                min_key: Vec::new(),
                max_key: Vec::new(),
                index: BlockAddr::default(),
                filter: BlockAddr::default(),
                bytes: 0,
            },
            index: Vec::new(),
            keys: Vec::new(),
            blocks: Vec::new(),
            cur: Vec::new(),
            cur_bytes: 0,
            index_bytes: 0,
        }
    }

    /// Add an entry; true when enough finished blocks wait to be placed.
    fn push(&mut self, e: Entry, block_bytes: usize) -> bool {
        if self.meta.entries == 0 {
            self.meta.min_key = e.key.clone();
        }
        self.meta.entries += 1;
        self.meta.min_seq = self.meta.min_seq.min(e.seq);
        self.meta.max_seq = self.meta.max_seq.max(e.seq);
        self.meta.max_key.clone_from(&e.key);
        self.cur_bytes += e.key.len() + e.value.as_ref().map_or(0, |v| v.len()) + 12;
        self.cur.push(e);
        if self.cur_bytes >= block_bytes {
            self.blocks.push(std::mem::take(&mut self.cur));
            self.cur_bytes = 0;
        }
        self.blocks.len() >= 32
    }
}

/// Checkpoint bookkeeping.
struct CkptState {
    number: u64,
    body: BlockAddr,
    prev_body: BlockAddr,
    replay: LogPos,
    prev_replay_batch: u64,
    flushed_seq: u64,
    next_run_id: u64,
    deferred: Vec<(u64, BlockAddr)>,
}

struct Core {
    log: LogWriter,
    next_seq: u64,
    ckpt: CkptState,
    /// Frees waiting for their journal batch to become durable.
    pending_frees: Vec<(u64, BlockAddr)>,
}

struct Shared {
    store: Arc<dyn Store>,
    sb: Superblock,
    opts: Options,
    core: Mutex<Core>,
    version: RwLock<Arc<Version>>,
    sync_lock: Mutex<()>,
    ckpt_lock: Mutex<()>,
    cache: Arc<BlockCache>,
    visible: AtomicU64,
    horizon: AtomicU64,
    failed: AtomicBool,
    snapshots: Mutex<BTreeMap<u64, usize>>,
    bg: (Mutex<BgState>, Condvar),
    /// Damage found at open and worked around (a superblock read from its
    /// copy, a run whose index was rebuilt or that has no filter), until
    /// [`Engine::repair`] mends it.
    damage: Mutex<Vec<String>>,
}

#[derive(Default)]
struct BgState {
    stop: bool,
    work: bool,
    error: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counters for `stats` and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Segments in the store.
    pub segments: u32,
    /// Segments free for reuse.
    pub free_segments: u32,
    /// Segments with nothing live, kept only until the next memtable
    /// flush moves the replay start past them (the engine does that when
    /// free segments run low): free space in all but name.
    pub pinned_segments: u32,
    /// Segments kept for deletes, the cleaner and the engine's own writes.
    pub reserve_segments: u32,
    /// Live bytes of blocks.
    pub live_bytes: u64,
    /// Bytes written to the device since open.
    pub device_bytes_written: u64,
    /// Stored bytes of blocks written since open, by block kind (indexed
    /// by the kind byte of FORMAT.md: 1 journal ... 6 data).
    pub kind_bytes: [u64; 8],
    /// Number of index runs.
    pub runs: usize,
    /// Entries in all runs.
    pub run_entries: u64,
    /// Bytes of all runs' blocks on disk.
    pub run_bytes: u64,
    /// Versions in memtables.
    pub memtable_entries: usize,
    /// Last checkpoint number.
    pub checkpoint: u64,
    /// Highest visible sequence number.
    pub seq: u64,
}

/// A data block compressed and checksummed ahead of its write
/// ([`Engine::encode_data`]).
pub struct EncodedBlock(NewBlock);

/// An open image.
pub struct Engine {
    sh: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

/// A pinned read point: versions it can see are kept by merges.
pub struct Snapshot {
    sh: Arc<Shared>,
    /// The sequence number it reads at.
    pub seq: u64,
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let mut s = lock(&self.sh.snapshots);
        if let Some(c) = s.get_mut(&self.seq) {
            *c -= 1;
            if *c == 0 {
                s.remove(&self.seq);
            }
        }
    }
}

impl Engine {
    /// Open the image on `store`, recovering to its last durable state.
    pub fn open(store: Arc<dyn Store>, opts: Options) -> Result<Engine> {
        let (sb, sb_note) = read_superblock_noting(store.as_ref())?;
        let mut damage: Vec<String> = sb_note.into_iter().collect();
        if sb.geometry != store.geometry() {
            return Err(Error::Invalid(format!(
                "the store's geometry {:?} differs from the superblock's {:?}",
                store.geometry(),
                sb.geometry
            )));
        }
        // Both checkpoint slots; the newest that loads wins.
        let mut slots = Vec::new();
        let mut slot_errors = Vec::new();
        for s in [MetaSlot::CheckpointA, MetaSlot::CheckpointB] {
            let mut buf = [0u8; 4096];
            store.read_meta(s, &mut buf).map_err(|e| Error::io(format!("reading {s:?}"), e))?;
            match CheckpointSlot::decode(&buf, &format!("checkpoint slot {s:?}")) {
                Ok(Some(c)) if c.uuid == sb.uuid => slots.push(c),
                Ok(_) => {}
                Err(e) => slot_errors.push(e),
            }
        }
        slots.sort_by_key(|c| std::cmp::Reverse(c.number));
        let mut loaded = None;
        for (i, slot) in slots.iter().enumerate() {
            let r = log::read_block(store.as_ref(), slot.body, BlockKind::Checkpoint).and_then(|raw| {
                CheckpointBody::decode(&raw, &format!("checkpoint {} body at {}", slot.number, slot.body))
            });
            match r {
                Ok(b) if b.number == slot.number && b.usage.len() == sb.geometry.segment_count as usize => {
                    loaded = Some((slot.clone(), b, slots.get(i + 1).cloned()));
                    break;
                }
                Ok(_) => slot_errors.push(Error::corrupt(
                    format!("checkpoint {} body at {}", slot.number, slot.body),
                    "does not match its slot",
                )),
                Err(e) => slot_errors.push(e),
            }
        }
        let Some((slot, body, other)) = loaded else {
            return Err(slot_errors
                .into_iter()
                .next()
                .unwrap_or_else(|| Error::corrupt("checkpoint slots", "neither slot holds a checkpoint")));
        };
        let mut runs = Vec::with_capacity(body.runs.len());
        for m in &body.runs {
            let r = match Run::open(store.as_ref(), m.clone()) {
                Ok(r) => r,
                // A damaged index or filter block: rebuilt, or done without.
                Err(e) if e.is_corruption() => {
                    let (r, note) = Run::open_damaged(store.as_ref(), sb.log_id(), m.clone(), e)?;
                    damage.push(note);
                    r
                }
                Err(e) => return Err(e),
            };
            runs.push(Arc::new(r));
        }
        let mut usage = body.usage.clone();
        let body_seg = &mut usage[slot.body.seg as usize];
        body_seg.live += slot.body.len;
        // The body's batch is the one before `after_body`.
        body_seg.last_batch = body_seg.last_batch.max(slot.after_body.batch_seq.saturating_sub(1));

        // Roll forward.
        let mem = Arc::new(Memtable::new());
        let mut max_seq = body.next_seq.saturating_sub(1);
        let mut journal_blocks = Vec::new();
        let mut frees = Vec::new();
        let end = log::scan(store.as_ref(), sb.log_id(), slot.replay, |b| {
            let accounted = b.header.seq >= slot.after_body.batch_seq;
            for (i, e) in b.entries.iter().enumerate() {
                let kind = BlockKind::from_u8(e.kind);
                if accounted && matches!(kind, Some(BlockKind::Journal | BlockKind::Data)) {
                    usage[b.pos.seg as usize].live += e.len;
                }
                if kind != Some(BlockKind::Journal) {
                    continue;
                }
                journal_blocks.push((b.header.seq, b.pos.seg, e.len));
                let addr = b.addr(i);
                let raw = log::decode_block(b.block_bytes(i), addr, BlockKind::Journal)?;
                for (first, wb) in decode_journal(&raw, &format!("journal block at {addr}"))? {
                    let mut seq = first;
                    for op in wb.ops {
                        match op {
                            Op::Put(k, v) => {
                                if seq > body.flushed_seq {
                                    mem.insert(k, seq, Some(v));
                                }
                                seq += 1;
                            }
                            Op::Delete(k) => {
                                if seq > body.flushed_seq {
                                    mem.insert(k, seq, None);
                                }
                                seq += 1;
                            }
                            Op::Free(a) => {
                                if accounted {
                                    frees.push(a);
                                }
                            }
                        }
                    }
                    max_seq = max_seq.max(seq.saturating_sub(1));
                }
            }
            if accounted {
                usage[b.pos.seg as usize].last_batch = b.header.seq;
            }
            Ok(())
        })?;
        for a in frees {
            if let Some(u) = usage.get_mut(a.seg as usize) {
                u.live = u.live.saturating_sub(a.len);
            }
        }
        let mut log = LogWriter::new(store.clone(), sb.log_id(), end, usage, opts.journal_codec);
        log.journal_blocks = journal_blocks;
        log.keep_from_batch =
            other.as_ref().map_or(slot.replay.batch_seq, |o| o.replay.batch_seq.min(slot.replay.batch_seq));
        // What we recovered may sit in a volatile cache only: make it durable
        // before building on it.
        log.sync_store()?;
        let next_seq = max_seq + 1;
        let ckpt = CkptState {
            number: slot.number,
            body: slot.body,
            prev_body: body.prev_body,
            replay: slot.replay,
            prev_replay_batch: other.map_or(slot.replay.batch_seq, |o| o.replay.batch_seq),
            flushed_seq: body.flushed_seq,
            next_run_id: body.next_run_id,
            deferred: body.deferred.clone(),
        };
        let version = Version { active: mem, frozen: Vec::new(), runs };
        let sh = Arc::new(Shared {
            store,
            sb,
            cache: Arc::new(BlockCache::new(opts.cache_bytes)),
            opts,
            core: Mutex::new(Core { log, next_seq, ckpt, pending_frees: Vec::new() }),
            version: RwLock::new(Arc::new(version)),
            sync_lock: Mutex::new(()),
            ckpt_lock: Mutex::new(()),
            visible: AtomicU64::new(next_seq - 1),
            horizon: AtomicU64::new(body.horizon),
            failed: AtomicBool::new(false),
            snapshots: Mutex::new(BTreeMap::new()),
            bg: (Mutex::new(BgState::default()), Condvar::new()),
            damage: Mutex::new(damage),
        });
        if !sh.opts.read_only {
            Self::keep_superblock_copy(&sh)?;
        }
        let worker = if sh.opts.background {
            let s2 = sh.clone();
            Some(
                std::thread::Builder::new()
                    .name("zlogfs-index".into())
                    .spawn(move || background(s2))
                    .map_err(|e| Error::io("starting the index thread", e))?,
            )
        } else {
            None
        };
        Ok(Engine { sh, worker })
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sh.sb
    }

    /// An image made before the superblock had a copy gets one (a
    /// superblock never changes after mkfs, so the copy is written once).
    fn keep_superblock_copy(sh: &Shared) -> Result<()> {
        let mut buf = [0u8; 4096];
        sh.store.read_meta(MetaSlot::SuperCopy, &mut buf).map_err(|e| Error::io("reading SuperCopy", e))?;
        if Superblock::decode(&buf).is_ok_and(|c| c == sh.sb) {
            return Ok(());
        }
        sh.store
            .write_meta(MetaSlot::SuperCopy, &sh.sb.encode())
            .map_err(|e| Error::io("writing SuperCopy", e))?;
        sh.store.sync().map_err(|e| Error::io("syncing the superblock's copy", e))
    }

    /// The blocks of each index run in use: (run id, index block, filter
    /// block, data blocks).
    pub fn run_blocks(&self) -> Vec<(u64, BlockAddr, BlockAddr, Vec<BlockAddr>)> {
        let ver = self.version();
        ver.runs
            .iter()
            .map(|r| {
                let mut data = r.blocks();
                data.truncate(data.len().saturating_sub(2));
                (r.meta.id, r.meta.index, r.meta.filter, data)
            })
            .collect()
    }

    /// Read every data block of every index run, checking its checksum
    /// and that it ends with the key its index entry names: the damaged
    /// ones. The records they held cannot be read.
    pub fn verify_runs(&self) -> Vec<DamagedBlock> {
        let ver = self.version();
        let mut bad = Vec::new();
        for r in &ver.runs {
            for i in 0..r.index.len() {
                if let Err(error) = r.block(self.sh.store.as_ref(), &self.sh.cache, i) {
                    let from = if i == 0 { r.meta.min_key.clone() } else { r.index[i - 1].last_key.clone() };
                    let to = r.index[i].last_key.clone();
                    bad.push(DamagedBlock { run: r.meta.id, addr: r.index[i].addr, from, to, error });
                }
            }
        }
        bad
    }

    /// Damage found at open and worked around: each says what and how.
    pub fn damage(&self) -> Vec<String> {
        lock(&self.sh.damage).clone()
    }

    /// Mend what [`Engine::damage`] lists: the superblock rewritten from
    /// its copy, and every run rewritten (a merge writes new index and
    /// filter blocks). Returns what was mended.
    pub fn repair(&self) -> Result<Vec<String>> {
        self.check_ok()?;
        let found = self.damage();
        if found.is_empty() {
            return Ok(found);
        }
        let (_, sb_note) = read_superblock_noting(self.sh.store.as_ref())?;
        if sb_note.is_some() {
            self.sh
                .store
                .write_meta(MetaSlot::Super, &self.sh.sb.encode())
                .map_err(|e| Error::io("rewriting the superblock", e))?;
            self.sh.store.sync().map_err(|e| Error::io("syncing the superblock", e))?;
        }
        self.merge()?;
        lock(&self.sh.damage).clear();
        Ok(found)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.sh.store
    }

    /// The highest sequence number readers see.
    pub fn seq(&self) -> u64 {
        self.sh.visible.load(AtOrd::Acquire)
    }

    fn check_ok(&self) -> Result<()> {
        if self.sh.failed.load(AtOrd::Acquire) {
            return Err(Error::Failed);
        }
        Ok(())
    }

    /// When free segments run low while dead ones are pinned only by
    /// recovery (their journal batches are newer than the replay start,
    /// which moves only when the memtable is flushed), flush the memtable
    /// and checkpoint twice, so that the replay start passes them and
    /// they are free. Without this, deleted data would stay unusable
    /// until the memtable filled, which small index updates may never do.
    /// `bytes` is the size of the write about to be placed.
    fn relieve(&self, bytes: usize) -> Result<()> {
        let pinned = {
            let core = lock(&self.sh.core);
            let seg = self.sh.sb.geometry.segment_size as usize;
            let need = core.log.low_water() as usize + bytes.div_ceil(seg);
            if core.log.free_segments() as usize >= need {
                return Ok(());
            }
            core.log.pinned_segments()
        };
        if pinned == 0 {
            return Ok(());
        }
        self.flush()?;
        self.checkpoint()
    }

    /// Apply `batch` atomically; returns the sequence number of its last
    /// mutation. Not durable until [`Engine::sync`].
    pub fn write(&self, batch: &WriteBatch) -> Result<u64> {
        self.check_ok()?;
        self.relieve(0)?;
        for op in &batch.ops {
            match op {
                Op::Put(k, v) if k.len() > MAX_KEY || v.len() > MAX_VALUE => {
                    return Err(Error::Invalid(format!(
                        "key of {} bytes or value of {} bytes exceeds the limits ({MAX_KEY}, {MAX_VALUE})",
                        k.len(),
                        v.len()
                    )))
                }
                Op::Delete(k) if k.len() > MAX_KEY => {
                    return Err(Error::Invalid(format!("key of {} bytes exceeds {MAX_KEY}", k.len())))
                }
                _ => {}
            }
        }
        let need_flush;
        let last;
        {
            let mut core = lock(&self.sh.core);
            let first = core.next_seq;
            let mut rec = Vec::new();
            batch.encode(first, &mut rec);
            let r = core.log.add_journal(&rec, first, batch.room);
            self.latch(&core, r)?;
            let batch_seq = core.log.pos().batch_seq;
            let ver = self.version();
            let mut seq = first;
            for op in &batch.ops {
                match op {
                    Op::Put(k, v) => ver.active.insert(k.clone(), seq, Some(v.clone())),
                    Op::Delete(k) => ver.active.insert(k.clone(), seq, None),
                    Op::Free(a) => {
                        core.pending_frees.push((batch_seq, *a));
                        continue;
                    }
                }
                seq += 1;
            }
            core.next_seq = seq;
            last = seq - 1;
            self.sh.visible.store(last, AtOrd::Release);
            need_flush = ver.active.bytes() >= self.sh.opts.memtable_bytes;
            if need_flush {
                self.freeze(&mut core)?;
            }
        }
        if need_flush {
            if self.sh.opts.background && self.version().frozen.len() < 2 {
                self.kick();
            } else {
                self.flush_frozen()?;
                self.maybe_merge()?;
            }
        }
        Ok(last)
    }

    fn latch<T>(&self, core: &Core, r: Result<T>) -> Result<T> {
        if core.log.failed {
            self.sh.failed.store(true, AtOrd::Release);
        }
        r
    }

    fn version(&self) -> Arc<Version> {
        self.sh.version.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_version(&self, v: Version) {
        *self.sh.version.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(v);
    }

    /// Switch to a new memtable; the old one waits to be flushed.
    fn freeze(&self, core: &mut Core) -> Result<()> {
        let ver = self.version();
        if ver.active.is_empty() {
            return Ok(());
        }
        if !core.log.pending_empty() {
            let r = core.log.write_pending(Room::User);
            self.latch(core, r)?;
        }
        let f = Arc::new(Frozen { mem: ver.active.clone(), end: core.log.pos(), max_seq: core.next_seq - 1 });
        let mut frozen = vec![f];
        frozen.extend(ver.frozen.iter().cloned());
        self.set_version(Version { active: Arc::new(Memtable::new()), frozen, runs: ver.runs.clone() });
        Ok(())
    }

    /// Make every write so far durable. Concurrent callers share one device
    /// sync (group commit).
    pub fn sync(&self) -> Result<()> {
        self.check_ok()?;
        let target = {
            let core = lock(&self.sh.core);
            core.log.pos().batch_seq - u64::from(core.log.pending_empty())
        };
        let _leader = lock(&self.sh.sync_lock);
        let upto = {
            let mut core = lock(&self.sh.core);
            if core.log.durable_batch >= target {
                return Ok(());
            }
            if !core.log.pending_empty() {
                let r = core.log.write_pending(Room::User);
                self.latch(&core, r)?;
            }
            core.log.pos().batch_seq - 1
        };
        if let Err(e) = self.sh.store.sync() {
            let mut core = lock(&self.sh.core);
            core.log.failed = true;
            self.sh.failed.store(true, AtOrd::Release);
            return Err(Error::io("syncing the device", e));
        }
        let mut core = lock(&self.sh.core);
        core.log.durable_batch = core.log.durable_batch.max(upto);
        Self::apply_frees(&mut core);
        Ok(())
    }

    fn apply_frees(core: &mut Core) {
        let durable = core.log.durable_batch;
        let mut frees = std::mem::take(&mut core.pending_frees);
        frees.retain(|&(b, a)| {
            if b <= durable {
                core.log.free_block(a);
                false
            } else {
                true
            }
        });
        core.pending_frees = frees;
    }

    /// Hand the pending batch to the device without waiting for it to be
    /// durable (what a page-cache writeback would do).
    pub fn write_out(&self) -> Result<()> {
        self.check_ok()?;
        let mut core = lock(&self.sh.core);
        if core.log.pending_empty() {
            return Ok(());
        }
        let r = core.log.write_pending(Room::User);
        self.latch(&core, r)
    }

    /// [`Engine::write`] then [`Engine::sync`].
    pub fn write_sync(&self, batch: &WriteBatch) -> Result<u64> {
        let s = self.write(batch)?;
        self.sync()?;
        Ok(s)
    }

    /// The current value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_at(key, self.seq())
    }

    /// The value of `key` as of sequence number `seq`.
    pub fn get_at(&self, key: &[u8], seq: u64) -> Result<Option<Vec<u8>>> {
        self.check_horizon(seq)?;
        let ver = self.version();
        if let Some(v) = ver.active.get(key, seq) {
            return Ok(v);
        }
        for f in &ver.frozen {
            if let Some(v) = f.mem.get(key, seq) {
                return Ok(v);
            }
        }
        for r in &ver.runs {
            if let Some(v) = r.get(self.sh.store.as_ref(), &self.sh.cache, key, seq)? {
                return Ok(v);
            }
        }
        Ok(None)
    }

    fn check_horizon(&self, seq: u64) -> Result<()> {
        let h = self.sh.horizon.load(AtOrd::Acquire);
        if seq < h {
            return Err(Error::SnapshotTooOld { requested: seq, horizon: h });
        }
        Ok(())
    }

    /// Keys in `[start, end)` (end `None`: to the last key) with their
    /// values as of the current sequence number, at most `limit` of them.
    pub fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.scan_at(start, end, limit, self.seq())
    }

    /// [`Engine::scan`] as of sequence number `seq`.
    pub fn scan_at(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        seq: u64,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check_horizon(seq)?;
        let ver = self.version();
        let mut sources: Vec<Box<dyn Iterator<Item = Result<Entry>>>> = Vec::new();
        sources.push(Box::new(ver.active.range(start, end, usize::MAX).into_iter().map(Ok)));
        for f in &ver.frozen {
            sources.push(Box::new(f.mem.range(start, end, usize::MAX).into_iter().map(Ok)));
        }
        for r in &ver.runs {
            sources.push(Box::new(r.cursor(self.sh.store.clone(), self.sh.cache.clone(), start)));
        }
        let mut out = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        for e in MergeIter::new(sources)? {
            let e = e?;
            if end.is_some_and(|end| e.key.as_slice() >= end) || out.len() >= limit {
                break;
            }
            if e.seq > seq || last.as_ref() == Some(&e.key) {
                continue;
            }
            last = Some(e.key.clone());
            if let Some(v) = e.value {
                out.push((e.key, v));
            }
        }
        Ok(out)
    }

    /// Pin the current state for reads at its sequence number.
    pub fn snapshot(&self) -> Snapshot {
        // Read the sequence number under the lock a merge takes to choose
        // its horizon: the merge either sees this snapshot or chose a
        // horizon at or below the sequence number read here.
        let mut snaps = lock(&self.sh.snapshots);
        let seq = self.seq();
        *snaps.entry(seq).or_insert(0) += 1;
        Snapshot { sh: self.sh.clone(), seq }
    }

    /// Store data blocks (compressed on all cores); returns their addresses.
    /// They are durable with the next sync; reference them from a
    /// [`WriteBatch`] to keep them.
    pub fn write_blocks(&self, owner: u64, spec: CodecSpec, raws: &[&[u8]]) -> Result<Vec<BlockAddr>> {
        let each: Vec<(u64, CodecSpec, &[u8])> = raws.iter().map(|r| (owner, spec, *r)).collect();
        self.write_blocks_each(&each)
    }

    /// [`Engine::write_blocks`] with an owner and a codec for each block.
    pub fn write_blocks_each(&self, blocks: &[(u64, CodecSpec, &[u8])]) -> Result<Vec<BlockAddr>> {
        self.write_blocks_in(Room::User, blocks)
    }

    /// [`Engine::write_blocks_each`], allowed to use `room` of the reserve
    /// (the cleaner's copies).
    pub fn write_blocks_in(&self, room: Room, blocks: &[(u64, CodecSpec, &[u8])]) -> Result<Vec<BlockAddr>> {
        self.write_blocks_ready(room, blocks, Vec::new())
    }

    /// [`Engine::write_blocks_in`], where `ready[i]`, when there is one and
    /// it is `Some`, is block `i` already encoded ([`Engine::encode_data`]
    /// of the same owner, codec and bytes): only the others are compressed.
    pub fn write_blocks_ready(
        &self,
        room: Room,
        blocks: &[(u64, CodecSpec, &[u8])],
        mut ready: Vec<Option<EncodedBlock>>,
    ) -> Result<Vec<BlockAddr>> {
        self.check_ok()?;
        let max = max_block_raw(self.sh.sb.geometry);
        if let Some((_, _, r)) = blocks.iter().find(|(_, _, r)| r.len() > max) {
            return Err(Error::Invalid(format!("block of {} bytes exceeds {max}", r.len())));
        }
        ready.resize_with(blocks.len(), || None);
        let blocks: Vec<NewBlock> = blocks
            .par_iter()
            .zip(ready.into_par_iter())
            .map(|((owner, spec, r), e)| match e {
                Some(EncodedBlock(b)) => b,
                None => NewBlock::encode(BlockKind::Data, *owner, *spec, r),
            })
            .collect();
        self.relieve(blocks.iter().map(|b| b.bytes().len()).sum())?;
        let mut core = lock(&self.sh.core);
        let r = core.log.add_blocks(blocks, room);
        self.latch(&core, r)
    }

    /// Encode a data block now (compress and checksum it), to be written
    /// later by [`Engine::write_blocks_ready`]: what that would make of
    /// the same owner, codec and bytes.
    pub fn encode_data(owner: u64, spec: CodecSpec, raw: &[u8]) -> EncodedBlock {
        EncodedBlock(NewBlock::encode(BlockKind::Data, owner, spec, raw))
    }

    /// Read and verify a data block.
    pub fn read_block(&self, addr: BlockAddr) -> Result<Vec<u8>> {
        let pending = lock(&self.sh.core).log.read_pending(addr);
        match pending {
            Some(buf) => log::decode_block(&buf, addr, BlockKind::Data),
            None => log::read_block(self.sh.store.as_ref(), addr, BlockKind::Data),
        }
    }

    /// The header of a data block (codec, level, raw reason, lengths), read
    /// without its payload and so without checking its crc: for reports.
    pub fn block_header(&self, addr: BlockAddr) -> Result<BlockHeader> {
        let mut buf = [0u8; BLOCK_HEADER_SIZE];
        let pending = lock(&self.sh.core).log.read_pending(addr);
        match pending {
            Some(b) if b.len() >= BLOCK_HEADER_SIZE => buf.copy_from_slice(&b[..BLOCK_HEADER_SIZE]),
            _ => {
                let g = self.sh.sb.geometry;
                if addr.seg >= g.segment_count
                    || u64::from(addr.offset) + BLOCK_HEADER_SIZE as u64 > u64::from(g.segment_size)
                {
                    return Err(Error::corrupt(
                        format!("reference to block at {addr}"),
                        "outside the device",
                    ));
                }
                self.sh
                    .store
                    .read(addr.seg, addr.offset, &mut buf)
                    .map_err(|e| Error::io(format!("reading block header at {addr}"), e))?;
            }
        }
        BlockHeader::parse(&mut Reader::new(&buf, &format!("block header at {addr}")))
    }

    /// Flush the memtable into a run and write a checkpoint.
    pub fn flush(&self) -> Result<()> {
        self.check_ok()?;
        {
            let mut core = lock(&self.sh.core);
            self.freeze(&mut core)?;
        }
        while self.flush_frozen()? {}
        self.checkpoint()
    }

    /// What a clean close leaves: the memtable flushed into a run, the runs
    /// merged down to `max_runs`, and a checkpoint whose replay start is
    /// the tail, so that the next open replays nothing. Without the flush,
    /// an open after a clean close would scan every batch written since the
    /// last flush, data included (all of a 1.3 GB copy's log, since its
    /// index fit in one memtable).
    pub fn settle(&self) -> Result<()> {
        self.check_ok()?;
        {
            let mut core = lock(&self.sh.core);
            self.freeze(&mut core)?;
        }
        while self.flush_frozen()? {}
        self.maybe_merge()?;
        self.checkpoint()
    }

    /// Merge every run into one.
    pub fn merge(&self) -> Result<()> {
        self.check_ok()?;
        self.merge_runs(true).map(|_| ())
    }

    fn maybe_merge(&self) -> Result<()> {
        while self.version().runs.len() > self.sh.opts.max_runs {
            if !self.merge_runs(false)? {
                break;
            }
        }
        Ok(())
    }

    fn kick(&self) {
        let (m, cv) = &self.sh.bg;
        lock(m).work = true;
        cv.notify_one();
    }

    /// Write the runs built from `entries` (internal order) into the log.
    /// A run's filter and sparse index are single blocks, so a long stream
    /// is cut, between keys, into several runs with disjoint key ranges.
    fn write_runs(&self, entries: impl Iterator<Item = Result<Entry>>) -> Result<Vec<Run>> {
        let max_block = max_block_raw(self.sh.sb.geometry);
        // Bloom filter: 10 bits a key; sparse index: a key and ~22 bytes a
        // data block. Cut at 90% of the block limit.
        let max_keys = max_block * 8 / 10 * 9 / 10;
        let max_index = max_block * 9 / 10;
        let mut out = Vec::new();
        let mut b: Option<RunBuilder> = None;
        for e in entries {
            let e = e?;
            let new_key = b.as_ref().is_none_or(|b| b.keys.last() != Some(&e.key));
            if let Some(cur) = &b {
                if new_key && (cur.keys.len() >= max_keys || cur.index_bytes >= max_index) {
                    out.extend(self.finish_run(b.take().expect("checked above"))?);
                }
            }
            let cur = match &mut b {
                Some(cur) => cur,
                None => b.insert(RunBuilder::new(self.next_run_id())),
            };
            if new_key {
                cur.keys.push(e.key.clone());
            }
            if cur.push(e, self.sh.opts.run_block_bytes) {
                self.flush_run_blocks(cur, false)?;
            }
        }
        if let Some(cur) = b {
            out.extend(self.finish_run(cur)?);
        }
        Ok(out)
    }

    fn next_run_id(&self) -> u64 {
        let mut core = lock(&self.sh.core);
        core.ckpt.next_run_id += 1;
        core.ckpt.next_run_id - 1
    }

    /// Compress the builder's finished data blocks on all cores and place
    /// them in the log (all of them when `all`, else once 32 are ready).
    fn flush_run_blocks(&self, b: &mut RunBuilder, all: bool) -> Result<()> {
        if all && !b.cur.is_empty() {
            b.blocks.push(std::mem::take(&mut b.cur));
            b.cur_bytes = 0;
        }
        if b.blocks.is_empty() || (!all && b.blocks.len() < 32) {
            return Ok(());
        }
        let (id, spec) = (b.meta.id, self.sh.opts.index_codec);
        let enc: Vec<NewBlock> = b
            .blocks
            .par_iter()
            .map(|blk| NewBlock::encode(BlockKind::RunData, id, spec, &encode_data_block(blk)))
            .collect();
        let addrs = {
            let mut core = lock(&self.sh.core);
            let r = core.log.add_blocks(enc, Room::System);
            self.latch(&core, r)?
        };
        for (blk, a) in b.blocks.drain(..).zip(addrs) {
            let l = blk.last().ok_or_else(|| Error::Invalid("empty run block".into()))?;
            b.index_bytes += l.key.len() + 22;
            b.index.push(IndexEntry { last_key: l.key.clone(), last_seq: l.seq, addr: a });
            b.meta.bytes += u64::from(a.len);
        }
        Ok(())
    }

    /// Write the rest of a run's data blocks, its index and its filter.
    fn finish_run(&self, mut b: RunBuilder) -> Result<Option<Run>> {
        self.flush_run_blocks(&mut b, true)?;
        if b.meta.entries == 0 {
            return Ok(None);
        }
        let spec = self.sh.opts.index_codec;
        let filter = Bloom::build(b.keys.len(), b.keys.iter().map(|k| k.as_slice()));
        let ib = NewBlock::encode(BlockKind::RunIndex, b.meta.id, spec, &encode_index_block(&b.index));
        let fb = NewBlock::encode(BlockKind::RunFilter, b.meta.id, spec, &filter.encode());
        let addrs = {
            let mut core = lock(&self.sh.core);
            // Readers go to the device for run blocks: the run's blocks must
            // be written out before the run is installed.
            let r = core.log.add_blocks(vec![ib, fb], Room::System).and_then(|a| {
                core.log.write_pending(Room::System)?;
                Ok(a)
            });
            self.latch(&core, r)?
        };
        b.meta.index = addrs[0];
        b.meta.filter = addrs[1];
        b.meta.bytes += u64::from(addrs[0].len) + u64::from(addrs[1].len);
        Ok(Some(Run::from_parts(b.meta, b.index, filter)))
    }

    /// Flush the oldest frozen memtable; false if there was none.
    fn flush_frozen(&self) -> Result<bool> {
        let _g = lock(&self.sh.ckpt_lock);
        let Some(f) = self.version().frozen.last().cloned() else { return Ok(false) };
        let new_runs = self.write_runs(f.mem.entries().into_iter().map(Ok))?;
        {
            let _core = lock(&self.sh.core);
            let ver = self.version();
            let mut runs = Vec::new();
            runs.extend(new_runs.into_iter().map(Arc::new));
            runs.extend(ver.runs.iter().cloned());
            let frozen = ver.frozen.iter().filter(|x| !Arc::ptr_eq(x, &f)).cloned().collect();
            self.set_version(Version { active: ver.active.clone(), frozen, runs });
        }
        self.checkpoint_locked(Some((f.end, f.max_seq)))?;
        Ok(true)
    }

    /// Merge runs: all of them, or the cheapest window of adjacent runs.
    fn merge_runs(&self, all: bool) -> Result<bool> {
        let _g = lock(&self.sh.ckpt_lock);
        let ver = self.version();
        let n = ver.runs.len();
        if n < 2 && !(all && n == 1) {
            return Ok(false);
        }
        let (lo, hi) = if all {
            (0, n)
        } else {
            let w = n.min(4);
            (0..=n - w)
                .min_by_key(|&i| ver.runs[i..i + w].iter().map(|r| r.meta.bytes).sum::<u64>())
                .map(|i| (i, i + w))
                .unwrap_or((0, n))
        };
        self.merge_window(&ver, lo, hi)?;
        Ok(true)
    }

    /// Merge runs `lo..hi` of `ver` (adjacent, newest first) into new runs
    /// in their place, and checkpoint. The caller holds the ckpt lock.
    fn merge_window(&self, ver: &Version, lo: usize, hi: usize) -> Result<()> {
        let n = ver.runs.len();
        let window: Vec<Arc<Run>> = ver.runs[lo..hi].to_vec();
        let horizon = {
            let snaps = lock(&self.sh.snapshots);
            let oldest = snaps.keys().next().copied().unwrap_or(u64::MAX);
            oldest.min(self.seq()).max(self.sh.horizon.load(AtOrd::Acquire))
        };
        let sources: Vec<_> =
            window.iter().map(|r| r.cursor(self.sh.store.clone(), self.sh.cache.clone(), &[])).collect();
        let merged = retain_versions(MergeIter::new(sources)?, horizon, hi == n);
        let new_runs: Vec<Arc<Run>> = self.write_runs(merged)?.into_iter().map(Arc::new).collect();
        {
            let mut core = lock(&self.sh.core);
            let ver = self.version();
            // Runs may have been added in front meanwhile; the window is
            // found by identity.
            let mut runs = Vec::new();
            let mut placed = false;
            for r in &ver.runs {
                if window.iter().any(|w| Arc::ptr_eq(w, r)) {
                    if !placed {
                        runs.extend(new_runs.iter().cloned());
                        placed = true;
                    }
                } else {
                    runs.push(r.clone());
                }
            }
            let next = core.ckpt.number + 1;
            for r in &window {
                for a in r.blocks() {
                    core.ckpt.deferred.push((next, a));
                }
                self.sh.cache.forget_run(r.meta.id);
            }
            self.sh.horizon.fetch_max(horizon, AtOrd::AcqRel);
            self.set_version(Version { active: ver.active.clone(), frozen: ver.frozen.clone(), runs });
        }
        self.checkpoint_locked(None)
    }

    /// Write a checkpoint: the run list and usage go into a body block, then
    /// a checkpoint slot points at it.
    pub fn checkpoint(&self) -> Result<()> {
        self.check_ok()?;
        let _g = lock(&self.sh.ckpt_lock);
        self.checkpoint_locked(None)
    }

    fn checkpoint_locked(&self, flushed: Option<(LogPos, u64)>) -> Result<()> {
        let _s = lock(&self.sh.sync_lock);
        let mut core = lock(&self.sh.core);
        let r = self.checkpoint_core(&mut core, flushed);
        self.latch(&core, r)
    }

    fn checkpoint_core(&self, core: &mut Core, flushed: Option<(LogPos, u64)>) -> Result<()> {
        // Everything before the body durable, so frees it implies are in.
        core.log.sync()?;
        Self::apply_frees(core);
        let ver = self.version();
        if let Some((end, seq)) = flushed {
            core.ckpt.replay = end;
            core.ckpt.flushed_seq = seq;
        }
        if ver.frozen.is_empty() && ver.active.is_empty() {
            // Nothing unflushed: replay can start at the tail.
            core.ckpt.replay = core.log.pos();
            core.ckpt.flushed_seq = core.next_seq - 1;
        }
        let replay = core.ckpt.replay;
        let number = core.ckpt.number + 1;
        // Journal blocks before the replay start are dead once this
        // checkpoint is durable; segment reuse waits for the older slot too.
        let jb = std::mem::take(&mut core.log.journal_blocks);
        let (dead, keep): (Vec<_>, Vec<_>) = jb.into_iter().partition(|&(b, _, _)| b < replay.batch_seq);
        core.log.journal_blocks = keep;
        for (_, seg, len) in dead {
            core.log.free_block(BlockAddr { seg, offset: 0, len });
        }
        // Usage as it will be once this checkpoint is durable.
        let mut usage = core.log.usage.clone();
        let sub = |usage: &mut Vec<SegUsage>, a: BlockAddr| {
            if let Some(u) = usage.get_mut(a.seg as usize) {
                u.live = u.live.saturating_sub(a.len);
            }
        };
        let (ready, later): (Vec<_>, Vec<_>) = core.ckpt.deferred.iter().partition(|&&(n, _)| n < number);
        for &(_, a) in &ready {
            sub(&mut usage, a);
        }
        if number >= 2 {
            sub(&mut usage, core.ckpt.prev_body);
        }
        let body = CheckpointBody {
            number,
            flushed_seq: core.ckpt.flushed_seq,
            next_seq: core.next_seq,
            horizon: self.sh.horizon.load(AtOrd::Acquire),
            next_run_id: core.ckpt.next_run_id,
            prev_body: core.ckpt.body,
            deferred: later.clone(),
            runs: ver.runs.iter().map(|r| r.meta.clone()).collect(),
            usage,
        };
        let blk = NewBlock::encode(BlockKind::Checkpoint, number, self.sh.opts.index_codec, &body.encode());
        let addr = core.log.add_blocks(vec![blk], Room::System)?[0];
        core.log.write_pending(Room::System)?;
        let after_body = core.log.pos();
        core.log.sync_store()?;
        let slot = CheckpointSlot { number, uuid: self.sh.sb.uuid, body: addr, replay, after_body };
        let which = if number % 2 == 0 { MetaSlot::CheckpointA } else { MetaSlot::CheckpointB };
        if let Err(e) = self.sh.store.write_meta(which, &slot.encode()) {
            core.log.failed = true;
            return Err(Error::io(format!("writing checkpoint slot {which:?}"), e));
        }
        core.log.sync_store()?;
        // Durable: apply what it implies.
        for (_, a) in ready {
            core.log.free_block(a);
        }
        if number >= 2 {
            core.log.free_block(core.ckpt.prev_body);
        }
        core.ckpt.deferred = later;
        core.ckpt.prev_body = core.ckpt.body;
        core.ckpt.body = addr;
        core.ckpt.number = number;
        core.log.keep_from_batch = core.ckpt.prev_replay_batch.min(replay.batch_seq);
        core.ckpt.prev_replay_batch = replay.batch_seq;
        Ok(())
    }

    /// Bytes that user data may still take in the log, uncompressed
    /// accounting: free segments (with those a flush frees) less the
    /// reserve, times the segment size.
    pub fn free_bytes(&self) -> u64 {
        let core = lock(&self.sh.core);
        let free =
            (core.log.free_segments() + core.log.pinned_segments()).saturating_sub(core.log.reserve_segments);
        // Counted as the writer's room check counts a segment.
        u64::from(free) * core.log.usable_per_segment() as u64
    }

    /// Space as if nothing compressed: `(capacity, free)` in bytes, the
    /// segments outside the reserve and that less the bytes of live blocks
    /// (so free counts what cleaning can reclaim). What statfs reports.
    pub fn capacity(&self) -> (u64, u64) {
        let core = lock(&self.sh.core);
        let segs = self.sh.sb.geometry.segment_count.saturating_sub(core.log.reserve_segments);
        let usable = u64::from(segs) * u64::from(self.sh.sb.geometry.segment_size);
        let live: u64 = core.log.usage.iter().map(|u| u64::from(u.live)).sum();
        (usable, usable.saturating_sub(live))
    }

    /// Bytes written to the device since open (cheaper than `stats`).
    pub fn device_bytes_written(&self) -> u64 {
        lock(&self.sh.core).log.device_bytes
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        let core = lock(&self.sh.core);
        let ver = self.version();
        EngineStats {
            segments: self.sh.sb.geometry.segment_count,
            free_segments: core.log.free_segments(),
            pinned_segments: core.log.pinned_segments(),
            reserve_segments: core.log.reserve_segments,
            live_bytes: core.log.usage.iter().map(|u| u64::from(u.live)).sum(),
            device_bytes_written: core.log.device_bytes,
            kind_bytes: core.log.kind_bytes,
            runs: ver.runs.len(),
            run_entries: ver.runs.iter().map(|r| r.meta.entries).sum(),
            run_bytes: ver.runs.iter().map(|r| r.meta.bytes).sum(),
            memtable_entries: ver.active.len() + ver.frozen.iter().map(|f| f.mem.len()).sum::<usize>(),
            checkpoint: core.ckpt.number,
            seq: self.seq(),
        }
    }

    /// Per-segment usage.
    pub fn segment_usage(&self) -> Vec<SegUsage> {
        lock(&self.sh.core).log.usage.clone()
    }

    /// Per segment, the usage count and the bytes of the engine's own live
    /// blocks in it: the blocks of the index runs in use and of those
    /// waiting for a checkpoint to free them, the journal blocks recovery
    /// still reads, and the two checkpoint bodies in use. With the data
    /// blocks the layer above references, they should make the count
    /// exactly (fsck checks it); taken under the locks a flush or merge
    /// holds, so no run is half written. Pending frees and writes are made
    /// durable first.
    pub fn usage_check(&self) -> Result<Vec<(SegUsage, u64)>> {
        self.sync()?;
        let _g = lock(&self.sh.ckpt_lock);
        let ver = self.version();
        let core = lock(&self.sh.core);
        let mut own = vec![0u64; core.log.usage.len()];
        let mut add = |a: BlockAddr| {
            if let Some(n) = own.get_mut(a.seg as usize) {
                *n += u64::from(a.len);
            }
        };
        for r in &ver.runs {
            r.blocks().into_iter().for_each(&mut add);
        }
        core.ckpt.deferred.iter().for_each(|&(_, a)| add(a));
        core.log.journal_blocks.iter().for_each(|&(_, seg, len)| add(BlockAddr { seg, offset: 0, len }));
        add(core.ckpt.body);
        if core.ckpt.number >= 1 {
            add(core.ckpt.prev_body);
        }
        Ok(core.log.usage.iter().copied().zip(own).collect())
    }

    /// Stop the background thread, sync and settle ([`Engine::settle`]).
    pub fn close(mut self) -> Result<()> {
        self.stop_worker();
        self.check_ok()?;
        self.sync()?;
        self.settle()
    }

    fn stop_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            {
                let (m, cv) = &self.sh.bg;
                lock(m).stop = true;
                cv.notify_all();
            }
            let _ = w.join();
        }
    }

    /// The error that stopped the background thread, if any.
    pub fn background_error(&self) -> Option<String> {
        lock(&self.sh.bg.0).error.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

fn background(sh: Arc<Shared>) {
    let e = Engine { sh, worker: None };
    loop {
        {
            let (m, cv) = &e.sh.bg;
            let mut st = lock(m);
            while !st.stop && !st.work {
                st = cv
                    .wait_timeout(st, std::time::Duration::from_secs(1))
                    .map(|r| r.0)
                    .unwrap_or_else(|p| p.into_inner().0);
                if e.version().runs.len() > e.sh.opts.max_runs || !e.version().frozen.is_empty() {
                    break;
                }
            }
            if st.stop {
                break;
            }
            st.work = false;
        }
        if e.sh.failed.load(AtOrd::Acquire) {
            continue;
        }
        let r = (|| -> Result<()> {
            while e.flush_frozen()? {}
            e.maybe_merge()
        })();
        if let Err(err) = r {
            lock(&e.sh.bg.0).error = Some(err.to_string());
            e.sh.failed.store(true, AtOrd::Release);
        }
    }
}
