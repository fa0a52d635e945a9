//! The storage engine: one log holding journal records, index runs, data
//! blocks and checkpoints; an LSM index over it; recovery from the newest
//! valid checkpoint by rolling the log forward.
//!
//! One job a file: this one holds the engine's state and its read and
//! write API; [`journal`] the journal's records, [`checkpoint`] the
//! checkpoint body and writing one, [`recovery`] mkfs and opening an image,
//! [`compaction`] flushing the memtable and merging runs, [`background`]
//! the thread that does both, [`blocks`] data blocks, [`damage`] checks and
//! repair of damaged index blocks, [`clean`] the cleaner's half.
//!
//! Locks, always taken in this order: `merge` (one merge at a time, and
//! whatever else takes runs out of the list), `ckpt` (one flush,
//! checkpoint or merge's install at a time), `sync` (the group-commit
//! leader), `core` (log writer, sequence numbers, memtable switch),
//! `version` (what readers see), `snapshots` (the live read points: taken
//! under `core` where frees are applied and pins made, under `merge` by
//! merges, alone by snapshots). A merge writes its outputs holding only
//! `merge`, so that flushes, and the writers that wait for them, go on
//! meanwhile.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtOrd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

use crate::codec::{CodecId, CodecSpec};
use crate::error::{Error, Result};
use crate::index::run::{BlockCache, Run};
use crate::index::{Entry, Memtable, MergeIter, MAX_KEY, MAX_VALUE};
use crate::log::format::*;
use crate::log::{LogWriter, SegUsage, Tier};
use crate::store::Store;

mod background;
mod blocks;
mod checkpoint;
mod clean;
mod compaction;
mod damage;
mod journal;
mod levels;
mod pins;
mod recovery;

pub use crate::log::Room;
use background::BgState;
pub use blocks::{BlockWrite, EncodedBlock};
pub use checkpoint::{max_checkpoint_parts, CheckpointBody, CheckpointHead};
use checkpoint::{CkptState, Hold};
pub use clean::{Reclaimed, SegBlock, Victim};
pub use damage::DamagedBlock;
pub use journal::{decode_journal, Op, WriteBatch};
use pins::{oldest_holding, Pins};
pub use pins::{ReadPin, Snapshot};
pub use recovery::{mkfs, read_superblock, read_superblock_noting};

/// Tunables of an open engine (none of them is part of the format).
#[derive(Debug, Clone)]
pub struct Options {
    /// Freeze and flush the memtable past this many bytes.
    pub memtable_bytes: usize,
    /// Level-0 runs (flushed, overlapping) past which all of level 0 is
    /// merged into level 1 (docs/decisions/2026-12-02-merges-by-level.md).
    pub level0_runs: usize,
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
    /// The layer above keeps points of history ([`Engine::set_retained`]):
    /// until it says which, merges keep every version.
    pub keep_history: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            memtable_bytes: 32 << 20,
            level0_runs: 4,
            run_block_bytes: 16 << 10,
            index_codec: CodecSpec::new(CodecId::Zstd, 3),
            journal_codec: CodecSpec::new(CodecId::Zstd, 1),
            background: true,
            cache_bytes: 256 << 20,
            read_only: false,
            keep_history: false,
        }
    }
}

/// The least memtable a short log flushes ([`Engine::flush_at`]): on
/// images of small segments a quarter segment would flush at about every
/// commit.
const FLUSH_FLOOR: usize = 256 << 10;

/// What cleaning a segment of `seg` bytes, `usable` of them for blocks,
/// gives a writer short of room, when it holds `live` bytes now and
/// `after` once the caller's frees are done: its usable bytes less what
/// moving the live ones takes, if at most `max_live` of it is live; of a
/// fuller one nothing (the cleaner's victims are picked so), nor of one
/// holding nothing live (free, or freed by the next flush: counted in
/// [`Engine::free_bytes`]).
fn reclaimable(usable: u64, seg: u32, live: u64, after: u64, max_live: f64) -> u64 {
    if live > 0 && within_live(after, seg, max_live) {
        usable.saturating_sub(after)
    } else {
        0
    }
}

/// Whether a segment of `seg` bytes holding `live` live bytes is at most
/// `max_live` live: a cleaner's victim, and room statfs counts. One
/// comparison for both, so that they agree to the byte.
pub(crate) fn within_live(live: u64, seg: u32, max_live: f64) -> bool {
    live as f64 / f64::from(seg) <= max_live
}

#[cfg(test)]
mod room_tests {
    use super::*;

    /// The file system's writer cleans segments at most 95% live
    /// (`WRITER_MAX_LIVE`): at 4 MiB, 3,984,588 live bytes are within,
    /// one more is not, and statfs counts the room by the same test.
    #[test]
    fn a_segment_is_reclaimable_up_to_max_live_and_not_a_byte_past() {
        let (seg, usable) = (4u32 << 20, 3_932_160u64);
        let edge = 3_984_588u64;
        assert!(within_live(edge, seg, 0.95) && !within_live(edge + 1, seg, 0.95));
        assert_eq!(reclaimable(usable, seg, edge, edge, 0.95), 0, "fuller than usable: nothing to gain");
        assert_eq!(reclaimable(usable, seg, edge + 1, edge + 1, 0.95), 0);
        // Frees the caller will do first bring a full segment within.
        assert_eq!(reclaimable(usable, seg, edge + 1, 1 << 20, 0.95), usable - (1 << 20));
        // At 60% (the burst), the same edge.
        let sixty = (0.6 * f64::from(seg)) as u64;
        assert_eq!(reclaimable(usable, seg, sixty, sixty, 0.6), usable - sixty);
        assert_eq!(reclaimable(usable, seg, sixty + 1, sixty + 1, 0.6), 0);
        // Nothing live: free already (counted elsewhere), not here.
        assert_eq!(reclaimable(usable, seg, 0, 0, 0.95), 0);
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

struct Core {
    log: LogWriter,
    next_seq: u64,
    ckpt: CkptState,
    /// Frees waiting for their journal batch to become durable: the
    /// batch's number, its first sequence number and the block.
    pending_frees: Vec<(u64, u64, BlockAddr)>,
    /// Blocks of runs written but not installed yet (the run's id and the
    /// block): counted live, so the cleaner leaves their segments alone,
    /// but left out of a checkpoint's usage, since a restart drops them.
    unplaced: Vec<(u64, BlockAddr)>,
    /// Stored bytes of the runs written since open, by the level they were
    /// written to (level 0: flushes): the index's write amplification.
    index_written: Vec<u64>,
}

struct Shared {
    store: Arc<dyn Store>,
    sb: Superblock,
    opts: Options,
    core: Mutex<Core>,
    version: RwLock<Arc<Version>>,
    sync_lock: Mutex<()>,
    merge_lock: Mutex<()>,
    ckpt_lock: Mutex<()>,
    cache: Arc<BlockCache>,
    visible: AtomicU64,
    horizon: AtomicU64,
    failed: AtomicBool,
    /// Live snapshots by sequence number: merges keep the versions they
    /// see; [`Snapshot`]s also hold the blocks freed after them.
    snapshots: Mutex<BTreeMap<u64, Pins>>,
    /// Kept points of history: sequence numbers below the horizon that
    /// reads may still ask for (ascending); None until the layer above
    /// says, when it keeps history (every version is kept meanwhile).
    retained: Mutex<Option<Vec<u64>>>,
    /// Kept points being let go ([`Engine::withdraw_except`]): merges
    /// still keep them, readers may no longer trust reads at them.
    withdrawn: Mutex<Vec<u64>>,
    bg: (Mutex<BgState>, Condvar),
    /// Damage found at open and worked around (a superblock read from its
    /// copy, a run whose index was rebuilt or that has no filter), until
    /// [`Engine::repair`] mends it.
    damage: Mutex<Vec<String>>,
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
    /// by the kind byte of FORMAT.md §2.9: 1 journal ... 6 data, 7 and 8
    /// checkpoint head and part).
    pub kind_bytes: [u64; 16],
    /// Number of index runs.
    pub runs: usize,
    /// Runs by level, level 0 first, to the deepest holding any.
    pub runs_by_level: Vec<usize>,
    /// Entries in all runs.
    pub run_entries: u64,
    /// Bytes of all runs' blocks on disk.
    pub run_bytes: u64,
    /// Stored bytes of the runs written since open, by the level written
    /// to: level 0 by flushes, the others by merges; the cleaner's
    /// rewrites count at the run's own level (level 0 too). Their sum over
    /// what level 0 got is the index's write amplification. In memory
    /// only: a mount's since its start, none for a read-only open.
    pub index_written_by_level: Vec<u64>,
    /// Versions in memtables.
    pub memtable_entries: usize,
    /// Bytes of the memtables as their budget counts them (keys, values
    /// and a fixed overhead an entry; [`Options::memtable_bytes`]).
    pub memtable_bytes: usize,
    /// Bytes of decoded run blocks cached ([`Options::cache_bytes`]).
    pub index_cache_bytes: usize,
    /// Last checkpoint number.
    pub checkpoint: u64,
    /// Highest visible sequence number.
    pub seq: u64,
    /// Of two devices, the fast one's share ([`DeviceStats`]); with one
    /// device, all of it.
    pub fast: DeviceStats,
    /// Of two devices, the bulk one's share; None with one device.
    pub bulk: Option<DeviceStats>,
    /// Of an image in an object store: requests, traffic and cache.
    pub remote: Option<crate::store::RemoteStats>,
}

/// One device's part of the segment space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Segments on it.
    pub segments: u32,
    /// Of those, free for reuse.
    pub free_segments: u32,
    /// Live bytes of blocks on it.
    pub live_bytes: u64,
    /// Stored bytes of blocks written to it since open, by block kind.
    pub kind_bytes: [u64; 16],
    /// Of the live bytes, those of the index runs' blocks (data, sparse
    /// index and filter of every current run).
    pub index_bytes: u64,
    /// Of the live bytes, those of journal blocks recovery still reads.
    pub journal_bytes: u64,
    /// Of the live bytes, those of the last two checkpoint bodies.
    pub checkpoint_bytes: u64,
}

impl DeviceStats {
    /// The live bytes that are no index run, journal or checkpoint: the
    /// file data above, and index blocks merged away and freed at the next
    /// checkpoint.
    pub fn other_bytes(&self) -> u64 {
        self.live_bytes.saturating_sub(self.index_bytes + self.journal_bytes + self.checkpoint_bytes)
    }
}

/// An open image.
pub struct Engine {
    sh: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl Engine {
    /// Of two devices, the paths of the fast and the bulk one.
    pub fn store_names(&self) -> Option<(String, String)> {
        self.sh.store.names()
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sh.sb
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.sh.store
    }

    /// The highest sequence number readers see.
    pub fn seq(&self) -> u64 {
        self.sh.visible.load(AtOrd::Acquire)
    }

    /// Latched: a write or sync failed, and nothing more is written until
    /// the image is reopened ([`Error::Failed`]). Layers above refuse
    /// changes at once while this holds, rather than accept what can
    /// never be stored.
    pub fn failed(&self) -> bool {
        self.sh.failed.load(AtOrd::Acquire)
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
                        core.pending_frees.push((batch_seq, first, *a));
                        continue;
                    }
                }
                seq += 1;
            }
            core.next_seq = seq;
            last = seq - 1;
            self.sh.visible.store(last, AtOrd::Release);
            need_flush = ver.active.bytes() >= self.flush_at(&core);
        }
        if need_flush {
            // The batch is applied: what its flush meets is the write's
            // error only once the engine latched (then nothing is taken
            // again). Returned otherwise, a caller that retried (a commit
            // meeting ENOSPC tries the deletes' part of the reserve) would
            // apply the batch twice, its frees too.
            match self.flush_after_write() {
                Err(e) if self.failed() => return Err(e),
                Err(e) => {
                    tracing::warn!("flushing the index after a write failed; the next write retries: {e}")
                }
                Ok(()) => {}
            }
        }
        Ok(last)
    }

    /// Freeze the memtable and flush it (or have the background thread
    /// do it), merging where due.
    fn flush_after_write(&self) -> Result<()> {
        self.freeze(&mut lock(&self.sh.core))?;
        if self.sh.opts.background && self.version().frozen.len() < 2 {
            self.kick();
        } else if self.sh.opts.background {
            // Two memtables wait: the writer flushes one (a merge under
            // way does not hold it up), and merges only once level 0
            // is past its stop ([`levels::LEVEL0_STOP`]): then it waits
            // for the merge under way and does at most one more.
            self.flush_frozen()?;
            if self.level0_stopped() {
                self.merge_step()?;
            }
            self.kick();
        } else {
            // No background thread: the writer does the merges due, a
            // series that ends (bytes only move down).
            self.flush_frozen()?;
            self.maybe_merge()?;
        }
        Ok(())
    }

    /// Memtable bytes at which a write freezes the memtable for a flush:
    /// [`Options::memtable_bytes`], or less on a log short of room. A
    /// flush is needed to make room (it lets the segments the cleaner
    /// emptied go), and it writes first: its run, at most about its
    /// memtable's bytes, may take half the free segments outside the
    /// reserve, and at least a quarter segment ([`FLUSH_FLOOR`] at the
    /// least). (Flushed whole at 32 MiB on a full 64 MiB image, a run
    /// took the reserve the cleaner needs, and the image stopped taking
    /// deletes and the create after them.)
    fn flush_at(&self, core: &Core) -> usize {
        let usable = core.log.usable_per_segment();
        let spare = core.log.free_segments().saturating_sub(core.log.reserve_segments) as usize;
        self.sh.opts.memtable_bytes.min((spare * usable / 2).max(usable / 4).max(FLUSH_FLOOR))
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

    /// Make every write so far durable. Concurrent callers share one device
    /// sync (group commit).
    pub fn sync(&self) -> Result<()> {
        self.check_ok()?;
        let target = {
            let core = lock(&self.sh.core);
            // A batch that failed to be written is gone: no sync may say
            // yes after it, whichever path failed it.
            if core.log.failed {
                self.sh.failed.store(true, AtOrd::Release);
                return Err(Error::Failed);
            }
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
        self.apply_frees(&mut core);
        Ok(())
    }

    /// Free the blocks of batches now durable; those a live snapshot older
    /// than their batch may still read wait among the checkpoint's
    /// deferred frees ([`Hold::Snapshot`]) instead.
    fn apply_frees(&self, core: &mut Core) {
        if core.pending_frees.is_empty() {
            return;
        }
        let durable = core.log.durable_batch;
        let oldest = oldest_holding(&lock(&self.sh.snapshots));
        let after = core.ckpt.number + 1;
        let mut frees = std::mem::take(&mut core.pending_frees);
        frees.retain(|&(b, first, a)| {
            if b > durable {
                return true;
            }
            let hold = Hold::Snapshot(first);
            if hold.stands(oldest) {
                core.ckpt.deferred.push((after, a));
                core.ckpt.holds.push((a, hold));
            } else {
                core.log.free_block(a);
            }
            false
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
        let kept = || lock(&self.sh.retained).as_ref().is_none_or(|p| p.binary_search(&seq).is_ok());
        if seq < h && !kept() {
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
        sources.push(Box::new(ver.active.cursor(start, end).map(Ok)));
        for f in &ver.frozen {
            sources.push(Box::new(f.mem.cursor(start, end).map(Ok)));
        }
        // Runs whose keys all lie outside the range give nothing: their
        // cursors would still read a block each (issue 45: a small file's
        // delete scans two ranges, through every piece of level 1).
        let outside = |r: &Run| {
            r.meta.max_key.as_slice() < start || end.is_some_and(|end| r.meta.min_key.as_slice() >= end)
        };
        for r in ver.runs.iter().filter(|r| !outside(r)) {
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

    /// The kept points of history: merges keep, per key, the newest
    /// version at or below each of `points` (sequence numbers the layer
    /// above chose, e.g. the ends of commit groups), and reads at them
    /// stay possible below the horizon. Replaces the previous list;
    /// points left out may be merged away from the next merge on.
    pub fn set_retained(&self, mut points: Vec<u64>) {
        points.sort_unstable();
        points.dedup();
        lock(&self.sh.withdrawn).retain(|s| points.binary_search(s).is_err());
        *lock(&self.sh.retained) = Some(points);
    }

    /// The kept points not in `keep` are being let go (the layer above
    /// deletes what they read before it calls [`Engine::set_retained`]
    /// without them): from now on [`Engine::retains`] says no for them,
    /// while merges keep them until then.
    pub fn withdraw_except(&self, keep: &[u64]) {
        let keep: std::collections::HashSet<u64> = keep.iter().copied().collect();
        let retained = lock(&self.sh.retained);
        let mut w = lock(&self.sh.withdrawn);
        w.extend(retained.iter().flatten().filter(|s| !keep.contains(s)));
        w.sort_unstable();
        w.dedup();
    }

    /// Whether reads at `seq` may be trusted: it is a kept point (or the
    /// kept points are not known yet, and merges keep every version) not
    /// withdrawn. A reader at a kept point that finds it still kept after
    /// a read knows the read saw that point's index whole.
    pub fn retains(&self, seq: u64) -> bool {
        let kept = lock(&self.sh.retained).as_ref().is_none_or(|r| r.binary_search(&seq).is_ok());
        kept && lock(&self.sh.withdrawn).binary_search(&seq).is_err()
    }

    /// Bytes that user data may still take in the log, uncompressed
    /// accounting: what the writer's room check grants ordinary writes
    /// ([`LogWriter::room_for`]: the free segments outside the reserve and
    /// the current one's rest, nothing while the reserve is not whole),
    /// counting the segments a flush frees as free, less what that flush
    /// writes (at most what they count).
    pub fn free_bytes(&self) -> u64 {
        let (room, pinned) = self.room_and_pinned();
        // The flush that frees the pinned segments writes first: its run
        // is counted against them. Against the rest of the room it is
        // not: a run written then goes to the reserve, which the cleaner
        // gives back (counted always, an image 96% full of patched chunks
        // got ENOSPC that the cleaner could have made room for).
        room.saturating_sub((self.unflushed_run_bytes() as u64).min(pinned))
    }

    /// The room [`Engine::free_bytes`] counts before the flush, and the
    /// bytes of the pinned segments in it.
    fn room_and_pinned(&self) -> (u64, u64) {
        let core = lock(&self.sh.core);
        let log = &core.log;
        let pinned = log.pinned_segments();
        let room = if log.reserve_segments >= crate::log::RESERVE_SEGMENTS {
            log.room_counting(Room::User, pinned, true) as u64
        } else {
            // Logs of few segments (a reserve of 2) count as before
            // 2026-12-03: whole free segments only. The current segment's
            // rest is an eighth of a log of 8 segments: counted, such a
            // full image accepted a chunk its close could not store
            // (fuzz_nbd).
            let free = (log.free_segments() + pinned).saturating_sub(log.reserve_segments);
            u64::from(free) * log.usable_per_segment() as u64
        };
        (room, u64::from(pinned) * log.usable_per_segment() as u64)
    }

    /// At most the bytes the runs of the memtables not yet flushed take
    /// in the log.
    fn unflushed_run_bytes(&self) -> usize {
        let ver = self.version();
        ver.active.run_bytes_bound() + ver.frozen.iter().map(|f| f.mem.run_bytes_bound()).sum::<usize>()
    }

    /// Space as if nothing compressed: `(capacity, free)` in bytes, the
    /// segments outside the reserve and that less the bytes of live blocks
    /// (so free counts what cleaning can reclaim). What statfs reports.
    /// A segment counts what the writer's room check counts it to hold
    /// (less its batch headers and summaries, a sixteenth): counted whole,
    /// a full image showed 6% free while every write got ENOSPC.
    pub fn capacity(&self) -> (u64, u64) {
        let core = lock(&self.sh.core);
        let segs = self.sh.sb.geometry.segment_count.saturating_sub(core.log.reserve_segments);
        let usable = u64::from(segs) * core.log.usable_per_segment() as u64;
        let live: u64 = core.log.usage.iter().map(|u| u64::from(u.live)).sum();
        (usable, usable.saturating_sub(live))
    }

    /// Bytes a writer can count on, uncompressed accounting: what
    /// [`Engine::free_bytes`] counts (less all of the index not yet
    /// flushed), and the dead bytes of the segments a writer short of
    /// room cleans (at most `max_live` of them live, as the cleaner's
    /// victims are picked), net of moving what is live. The dead bytes
    /// of fuller segments do not count: counted, a full image showed
    /// free space while every write got ENOSPC. What statfs reports.
    pub fn writable_bytes(&self, max_live: f64) -> u64 {
        self.writable_bytes_freeing(max_live, &BTreeMap::new())
    }

    /// [`Engine::writable_bytes`] as if the live bytes `freed` counts per
    /// segment were dead (blocks the caller can release before cleaning,
    /// such as those only automatic points of history hold). Counted per
    /// segment, not added to the total: a freed block in a segment too
    /// full to clean, or beside a segment's headers, gives back less than
    /// its length (added up, a used image showed 3 MB more free than a
    /// fallocate could take).
    pub fn writable_bytes_freeing(&self, max_live: f64, freed: &BTreeMap<u32, u64>) -> u64 {
        // Cleaning, like releasing pinned segments, needs the index
        // flushed first: its run is counted whole here (not counted, df
        // after deleting 3 GB, which points of history held, showed 0.35
        // MB more than a fallocate could take: xfstests generic/103).
        let (room, _) = self.room_and_pinned();
        let free = room.saturating_sub(self.unflushed_run_bytes() as u64);
        let core = lock(&self.sh.core);
        let g = self.sh.sb.geometry;
        let usable = core.log.usable_per_segment() as u64;
        let dead: u64 = (0..g.segment_count)
            .filter(|&s| !core.log.is_head(s) && !core.log.is_free(s))
            .map(|s| {
                let live = u64::from(core.log.usage[s as usize].live);
                let after = live.saturating_sub(freed.get(&s).copied().unwrap_or(0));
                reclaimable(usable, g.segment_size, live, after, max_live)
            })
            .sum();
        free + dead
    }

    /// Of two devices, the fast one's `(segments, free segments)`; None
    /// with one device. Cheaper than `stats` (no walk of the index).
    pub fn fast_free(&self) -> Option<(u32, u32)> {
        let core = lock(&self.sh.core);
        let fast = core.log.fast_segments();
        if fast >= self.sh.sb.geometry.segment_count {
            return None;
        }
        Some((fast, (0..fast).filter(|&s| core.log.is_free(s)).count() as u32))
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
            runs_by_level: {
                let deepest = ver.runs.iter().map(|r| usize::from(r.meta.level)).max().map_or(0, |l| l + 1);
                (0..deepest)
                    .map(|l| ver.runs.iter().filter(|r| usize::from(r.meta.level) == l).count())
                    .collect()
            },
            run_entries: ver.runs.iter().map(|r| r.meta.entries).sum(),
            run_bytes: ver.runs.iter().map(|r| r.meta.bytes).sum(),
            index_written_by_level: core.index_written.clone(),
            memtable_entries: ver.active.len() + ver.frozen.iter().map(|f| f.mem.len()).sum::<usize>(),
            memtable_bytes: ver.active.bytes() + ver.frozen.iter().map(|f| f.mem.bytes()).sum::<usize>(),
            index_cache_bytes: self.index_cache_bytes(),
            checkpoint: core.ckpt.number,
            seq: self.seq(),
            fast: device_stats(&core, &ver, Tier::Fast),
            bulk: (core.log.fast_segments() < self.sh.sb.geometry.segment_count)
                .then(|| device_stats(&core, &ver, Tier::Bulk)),
            remote: self.sh.store.remote_stats(),
        }
    }

    /// Bytes of decoded run blocks cached now.
    pub fn index_cache_bytes(&self) -> usize {
        self.sh.cache.bytes()
    }

    /// Drop the decoded run blocks cached (they are read again as
    /// needed); returns the bytes dropped.
    pub fn drop_index_cache(&self) -> usize {
        self.sh.cache.clear()
    }

    /// Per-segment usage.
    pub fn segment_usage(&self) -> Vec<SegUsage> {
        lock(&self.sh.core).log.usage.clone()
    }

    /// Stop the background thread, sync and settle ([`Engine::settle`]).
    pub fn close(mut self) -> Result<()> {
        self.stop_worker();
        self.check_ok()?;
        self.sync()?;
        self.settle()?;
        self.sh.store.close().map_err(|e| Error::io("closing the store", e))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

/// What the log, the runs and the checkpoints say of the device of `tier`.
fn device_stats(core: &Core, ver: &Version, tier: Tier) -> DeviceStats {
    let log = &core.log;
    let segs: Vec<u32> = (0..log.usage.len() as u32).filter(|&s| log.tier_of(s) == tier).collect();
    let on = |seg: u32| log.tier_of(seg) == tier;
    let bytes = |a: &BlockAddr| if on(a.seg) { u64::from(a.len) } else { 0 };
    DeviceStats {
        segments: segs.len() as u32,
        free_segments: segs.iter().filter(|&&s| log.is_free(s)).count() as u32,
        live_bytes: segs.iter().map(|&s| u64::from(log.usage[s as usize].live)).sum(),
        kind_bytes: log.device_kind_bytes[usize::from(tier == Tier::Bulk)],
        index_bytes: ver.runs.iter().flat_map(|r| r.blocks()).map(|a| bytes(&a)).sum(),
        journal_bytes: log.journal_blocks.iter().filter(|b| on(b.1)).map(|b| u64::from(b.2)).sum(),
        checkpoint_bytes: core.ckpt.body.iter().chain(&core.ckpt.prev_body).map(bytes).sum::<u64>(),
    }
}
