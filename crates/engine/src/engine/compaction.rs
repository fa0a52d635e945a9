//! Flushing the memtable into runs and merging runs: the run builder,
//! which cuts a stream of entries into compressed data blocks, an index
//! block and a filter.

use std::sync::atomic::Ordering as AtOrd;
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::index::run::{encode_data_block, encode_index_block, key_hash, Bloom, IndexEntry, Run, RunMeta};
use crate::index::{retain_versions, Entry, Memtable, MergeIter};
use crate::log::format::*;
use crate::log::{max_block_raw, NewBlock};

use super::checkpoint::Hold;
use super::levels::{self, Plan};
use super::{lock, Core, Engine, Frozen, Room, Version};

/// Merges one call of [`Engine::maybe_merge`] makes at most: each is
/// bounded and bytes only move down, so the series ends well before
/// (a guard, logged if ever reached).
const MAX_MERGES_A_CALL: usize = 10_000;

/// A run being written.
struct RunBuilder {
    meta: RunMeta,
    index: Vec<IndexEntry>,
    /// The filter hashes of its distinct keys (8 bytes a key, where the
    /// keys took 50-70: issue 45, a merge's memory).
    hashes: Vec<u64>,
    /// Finished data blocks not yet placed in the log.
    blocks: Vec<Vec<Entry>>,
    /// The data block being filled.
    cur: Vec<Entry>,
    cur_bytes: usize,
    /// Bytes the sparse index will take.
    index_bytes: usize,
}

impl RunBuilder {
    fn new(id: u64, level: u8) -> RunBuilder {
        RunBuilder {
            meta: RunMeta {
                id,
                level,
                entries: 0,
                tombstones: 0,
                min_seq: u64::MAX,
                max_seq: 0,
                min_key: Vec::new(),
                max_key: Vec::new(),
                index: BlockAddr::default(),
                filter: BlockAddr::default(),
                bytes: 0,
            },
            index: Vec::new(),
            hashes: Vec::new(),
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
        self.meta.tombstones += u64::from(e.value.is_none());
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

impl Engine {
    /// Switch to a new memtable; the old one waits to be flushed.
    pub(super) fn freeze(&self, core: &mut Core) -> Result<()> {
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

    /// What a clean close leaves: the memtable flushed into a run, the
    /// merges due done, and a checkpoint whose replay start is
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

    /// Merge every run into one sorted run (runs flushed meanwhile stay
    /// above it, at level 0).
    pub fn merge(&self) -> Result<()> {
        self.check_ok()?;
        self.merge_all().map(|_| ())
    }

    /// Write `runs` again, each alone, at its level and place (the
    /// cleaner's rewrite of runs with blocks in its victims), then install
    /// them and checkpoint once. The caller holds the merge lock; the ckpt
    /// lock is taken only to install, so flushes go on meanwhile.
    pub(super) fn rewrite_runs(&self, runs: &[Arc<Run>]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let mut built: Vec<Merged> = Vec::new();
        for r in runs {
            match self.build_merge(vec![r.clone()], r.meta.level, false) {
                Ok(m) => built.push(m),
                Err(e) => {
                    let ids: Vec<u64> =
                        built.iter().flat_map(|m| m.outputs.iter().map(|o| o.meta.id)).collect();
                    self.discard_unplaced(&ids);
                    return Err(e);
                }
            }
        }
        let _g = lock(&self.sh.ckpt_lock);
        for m in built {
            self.install(m)?;
        }
        self.checkpoint_locked(None)
    }

    /// Merge while a merge is due ([`levels::plan`]), flushing a waiting
    /// memtable first between merges. Each merge is bounded, and bytes
    /// only move down a level, so the series ends.
    pub(super) fn maybe_merge(&self) -> Result<()> {
        for _ in 0..MAX_MERGES_A_CALL {
            while self.flush_frozen()? {}
            if !self.merge_step()? {
                return Ok(());
            }
        }
        tracing::warn!("{MAX_MERGES_A_CALL} index merges in one go: the rest waits for the next flush");
        Ok(())
    }

    /// The most keys, and sparse-index bytes, a run holds: its filter and
    /// its sparse index are single blocks (cut at 90% of the block limit;
    /// the filter takes 10 bits a key, the index a key and ~22 bytes a
    /// data block).
    fn run_caps(&self) -> (usize, usize) {
        let max_block = max_block_raw(self.sh.sb.geometry);
        (max_block * 8 / 10 * 9 / 10, max_block * 9 / 10)
    }

    /// Bytes level 1 holds before it pushes a piece down: about as many
    /// flushes as level 0 holds (a flushed run is stored in about half its
    /// memtable's bytes).
    fn level1_bytes(&self) -> u64 {
        (self.sh.opts.level0_runs.max(1) * self.sh.opts.memtable_bytes / 2) as u64
    }

    /// The merge due in `ver`, if any, and if the log has room for it.
    fn plan(&self, ver: &Version) -> Option<Plan> {
        let metas: Vec<&RunMeta> = ver.runs.iter().map(|r| &r.meta).collect();
        let p = levels::plan(&metas, self.sh.opts.level0_runs, self.level1_bytes())?;
        let bytes: u64 = p.inputs.iter().map(|&i| metas[i].bytes).sum();
        self.merge_fits(bytes).then_some(p)
    }

    /// Whether a merge writing about `bytes` of runs leaves the log's
    /// reserve whole. A merge is not needed to make room (it frees its
    /// inputs only as dead bytes among live ones, for the cleaner), but
    /// its output takes free segments first: run on a full log, merges
    /// took the reserve the cleaner needs, and a full image stopped
    /// taking deletes and the create after them (crates/fs/tests/full.rs). So a
    /// merge waits while the free segments outside the reserve cannot
    /// hold its output; level 0 grows meanwhile (reads look at more
    /// runs), and the merge runs once cleaning or deletes made room.
    fn merge_fits(&self, bytes: u64) -> bool {
        let core = lock(&self.sh.core);
        let usable = core.log.usable_per_segment().max(1) as u64;
        let need = bytes.div_ceil(usable) + 1;
        let spare = u64::from(core.log.free_segments().saturating_sub(core.log.reserve_segments));
        spare >= need
    }

    /// Whether a merge is due (the background thread's wake-up test).
    pub(super) fn merge_due(&self) -> bool {
        self.plan(&self.version()).is_some()
    }

    /// Whether level 0 is past its stop ([`levels::LEVEL0_STOP`]).
    pub(super) fn level0_stopped(&self) -> bool {
        let ver = self.version();
        let metas: Vec<&RunMeta> = ver.runs.iter().map(|r| &r.meta).collect();
        levels::level0_stopped(&metas, self.sh.opts.level0_runs)
    }

    /// Do the merge due, if one is: true when it did. The outputs are
    /// written holding only the merge lock (flushes go on meanwhile, and
    /// only add level-0 runs, above every input), then installed and
    /// checkpointed under the ckpt lock.
    pub(super) fn merge_step(&self) -> Result<bool> {
        let _m = lock(&self.sh.merge_lock);
        let ver = self.version();
        let Some(p) = self.plan(&ver) else { return Ok(false) };
        let window = p.inputs.iter().map(|&i| ver.runs[i].clone()).collect();
        self.merge_window(window, p.out_level, p.bottom)?;
        Ok(true)
    }

    /// Build a merge of `window`, then install it and checkpoint under the
    /// ckpt lock. The caller holds the merge lock.
    fn merge_window(&self, window: Vec<Arc<Run>>, level: u8, bottom: bool) -> Result<()> {
        let merged = self.build_merge(window, level, bottom)?;
        let _g = lock(&self.sh.ckpt_lock);
        self.install(merged)?;
        self.checkpoint_locked(None)
    }

    /// Write the runs built from `entries` (internal order) into the log.
    /// A run's filter and sparse index are single blocks, so a long stream
    /// is cut, between keys, into several runs with disjoint key ranges.
    /// On an error, the blocks written so far are freed.
    fn write_runs(&self, entries: impl Iterator<Item = Result<Entry>>, level: u8) -> Result<Vec<Run>> {
        let mut ids = Vec::new();
        let r = self.write_runs_noting(entries, level, &mut ids);
        if r.is_err() {
            self.discard_unplaced(&ids);
        }
        r
    }

    /// [`Engine::write_runs`], noting the ids of the runs begun in `ids`.
    fn write_runs_noting(
        &self,
        entries: impl Iterator<Item = Result<Entry>>,
        level: u8,
        ids: &mut Vec<u64>,
    ) -> Result<Vec<Run>> {
        let (max_keys, max_index) = self.run_caps();
        let mut out = Vec::new();
        let mut b: Option<RunBuilder> = None;
        for e in entries {
            let e = e?;
            // Entries come in key order: a key is new unless it is the
            // last one pushed.
            let new_key = b.as_ref().is_none_or(|b| b.meta.entries == 0 || b.meta.max_key != e.key);
            if let Some(cur) = &b {
                if new_key && (cur.hashes.len() >= max_keys || cur.index_bytes >= max_index) {
                    out.extend(self.finish_run(b.take().expect("checked above"))?);
                }
            }
            let cur = match &mut b {
                Some(cur) => cur,
                None => {
                    ids.push(self.next_run_id());
                    b.insert(RunBuilder::new(ids[ids.len() - 1], level))
                }
            };
            if new_key {
                cur.hashes.push(key_hash(&e.key));
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

    /// Free the blocks written for the runs `ids` that will never be
    /// installed (their writing failed).
    fn discard_unplaced(&self, ids: &[u64]) {
        let mut core = lock(&self.sh.core);
        let mut gone = Vec::new();
        core.unplaced.retain(|&(id, a)| {
            let keep = !ids.contains(&id);
            if !keep {
                gone.push(a);
            }
            keep
        });
        let r = core.log.free_placed(&gone, Room::System);
        if let Err(e) = self.latch(&core, r) {
            // Latched (the waiting batch could not be written): the blocks
            // stay counted until a restart, and every later write and sync
            // says the engine failed.
            tracing::error!("freeing {} blocks of index runs never installed: {e}", gone.len());
        }
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
            let addrs = self.latch(&core, r)?;
            core.unplaced.extend(addrs.iter().map(|&a| (id, a)));
            addrs
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
        let filter = Bloom::from_hashes(b.hashes.len(), b.hashes.iter().copied());
        let ib = NewBlock::encode(BlockKind::RunIndex, b.meta.id, spec, &encode_index_block(&b.index));
        let fb = NewBlock::encode(BlockKind::RunFilter, b.meta.id, spec, &filter.encode());
        let addrs = {
            let mut core = lock(&self.sh.core);
            // Readers go to the device for run blocks: the run's blocks must
            // be written out before the run is installed.
            let r = core.log.add_blocks(vec![ib, fb], Room::System);
            let addrs = self.latch(&core, r)?;
            core.unplaced.extend(addrs.iter().map(|&a| (b.meta.id, a)));
            let level = usize::from(b.meta.level);
            if core.index_written.len() <= level {
                core.index_written.resize(level + 1, 0);
            }
            core.index_written[level] += b.meta.bytes + addrs.iter().map(|a| u64::from(a.len)).sum::<u64>();
            let r = core.log.write_pending(Room::System);
            self.latch(&core, r)?;
            addrs
        };
        b.meta.index = addrs[0];
        b.meta.filter = addrs[1];
        b.meta.bytes += u64::from(addrs[0].len) + u64::from(addrs[1].len);
        Ok(Some(Run::from_parts(b.meta, b.index, filter)))
    }

    /// Flush the oldest frozen memtable; false if there was none.
    pub(super) fn flush_frozen(&self) -> Result<bool> {
        let _g = lock(&self.sh.ckpt_lock);
        let Some(f) = self.version().frozen.last().cloned() else { return Ok(false) };
        // A frozen memtable does not change: read through a cursor, not
        // copied whole.
        let new_runs = self.write_runs(f.mem.cursor(&[], None).map(Ok), 0)?;
        {
            let mut core = lock(&self.sh.core);
            let ver = self.version();
            let new_runs: Vec<Arc<Run>> = new_runs.into_iter().map(Arc::new).collect();
            placed(&mut core, &new_runs);
            let mut runs = new_runs;
            runs.extend(ver.runs.iter().cloned());
            let frozen = ver.frozen.iter().filter(|x| !Arc::ptr_eq(x, &f)).cloned().collect();
            self.set_version(Version { active: ver.active.clone(), frozen, runs });
        }
        self.checkpoint_locked(Some((f.end, f.max_seq)))?;
        Ok(true)
    }

    /// Merge every run into one sorted run, at the first level whose
    /// target holds it, dropping what no reader needs. False when there is
    /// no run. Runs flushed while it runs (by a writer or the background
    /// thread) stay above it, at level 0.
    pub(super) fn merge_all(&self) -> Result<bool> {
        let _m = lock(&self.sh.merge_lock);
        let ver = self.version();
        if ver.runs.is_empty() {
            return Ok(false);
        }
        let bytes = ver.runs.iter().map(|r| r.meta.bytes).sum();
        let level = levels::level_for(bytes, self.level1_bytes());
        self.merge_window(ver.runs.clone(), level, true)?;
        Ok(true)
    }

    /// Merge `window` (runs of the current list) into new runs of level
    /// `level`, written but not installed; `bottom` when no run outside
    /// the window holds older versions of its keys, so tombstones may go.
    /// The caller holds the merge lock, so the window stays in the list.
    fn build_merge(&self, window: Vec<Arc<Run>>, level: u8, bottom: bool) -> Result<Merged> {
        let horizon = {
            let snaps = lock(&self.sh.snapshots);
            let oldest = snaps.keys().next().copied().unwrap_or(u64::MAX);
            oldest.min(self.seq()).max(self.sh.horizon.load(AtOrd::Acquire))
        };
        // Until the layer above that keeps history names its points, every
        // version stays (as below a horizon of 0).
        let (horizon, points) = match lock(&self.sh.retained).clone() {
            Some(p) => (horizon, p),
            None => (0, Vec::new()),
        };
        let sources: Vec<_> =
            window.iter().map(|r| r.merge_cursor(self.sh.store.clone(), self.sh.cache.clone())).collect();
        let merged = retain_versions(MergeIter::new(sources)?, horizon, &points, bottom);
        let outputs = self.write_runs(merged, level)?.into_iter().map(Arc::new).collect();
        Ok(Merged { window, outputs, level, horizon })
    }

    /// Put a merge's outputs in its window's place. The caller holds the
    /// merge lock (so the window is still in the list) and the ckpt lock
    /// (so no flush changes the list meanwhile); runs flushed since the
    /// merge began are level 0, above every input, and stay first.
    fn install(&self, m: Merged) -> Result<()> {
        let mut core = lock(&self.sh.core);
        let ver = self.version();
        let mut runs = Vec::new();
        let mut placed_at = false;
        let mut found = 0;
        for r in &ver.runs {
            if m.window.iter().any(|w| Arc::ptr_eq(w, r)) {
                found += 1;
                if !placed_at {
                    runs.extend(m.outputs.iter().cloned());
                    placed_at = true;
                }
            } else {
                runs.push(r.clone());
            }
        }
        // Where the first of the window was: a rewritten level-0 run
        // keeps its place among the newer and older ones.
        levels::sort(&mut runs);
        let metas: Vec<&RunMeta> = runs.iter().map(|r| &r.meta).collect();
        let wrong = if found != m.window.len() {
            Some(format!(
                "{} of its {} inputs left the run list while it ran",
                m.window.len() - found,
                m.window.len()
            ))
        } else {
            levels::check_order(&metas).err().map(|why| format!("it would leave runs out of order: {why}"))
        };
        if let Some(why) = wrong {
            // Not installed: reads would take a wrong version. The
            // outputs' blocks stay counted until a restart.
            core.log.failed = true;
            return Err(Error::Invalid(format!("a merge into level {}: {why}", m.level)));
        }
        placed(&mut core, &m.outputs);
        let next = core.ckpt.number + 1;
        for r in &m.window {
            for a in r.blocks() {
                core.ckpt.deferred.push((next, a));
                core.ckpt.holds.push((a, Hold::Run(Arc::downgrade(r))));
            }
            self.sh.cache.forget_run(r.meta.id);
        }
        self.sh.horizon.fetch_max(m.horizon, AtOrd::AcqRel);
        self.set_version(Version { active: ver.active.clone(), frozen: ver.frozen.clone(), runs });
        Ok(())
    }
}

/// A merge's outputs, written but not yet in the run list.
struct Merged {
    /// The runs it replaces.
    window: Vec<Arc<Run>>,
    outputs: Vec<Arc<Run>>,
    level: u8,
    /// The horizon it dropped versions below.
    horizon: u64,
}

/// `runs` are in the run list now: their blocks are no longer unplaced.
fn placed(core: &mut Core, runs: &[Arc<Run>]) {
    if core.unplaced.is_empty() {
        return;
    }
    let ids: std::collections::HashSet<u64> = runs.iter().map(|r| r.meta.id).collect();
    core.unplaced.retain(|(id, _)| !ids.contains(id));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::sync::{Condvar, Mutex};

    use super::*;
    use crate::engine::mkfs;
    use crate::store::{Geometry, MemStore, MetaSlot, Store, META_SLOT_SIZE};
    use crate::{Options, WriteBatch};

    fn opts() -> Options {
        Options {
            background: false,
            memtable_bytes: 64 << 10,
            run_block_bytes: 2048,
            level0_runs: 3,
            ..Options::default()
        }
    }

    fn engine() -> Engine {
        let store: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 128 << 10, segment_count: 1024 }));
        mkfs(store.clone()).unwrap();
        Engine::open(store, opts()).unwrap()
    }

    fn key(i: u32) -> Vec<u8> {
        (i.wrapping_mul(2_654_435_761) % 1_000_003).to_be_bytes().to_vec()
    }

    fn put_all(e: &Engine, n: u32) {
        for c in (0..n).collect::<Vec<_>>().chunks(200) {
            let mut b = WriteBatch::new();
            for &i in c {
                b.put(key(i), vec![i as u8; 40]);
            }
            e.write(&b).unwrap();
        }
    }

    /// After many flushes, a key is in at most one run a level below level
    /// 0: a get probes level 0's runs and one piece a level.
    #[test]
    fn a_get_probes_one_piece_a_level() {
        let e = engine();
        put_all(&e, 80_000);
        e.settle().unwrap();
        let ver = e.version();
        let levels = e.stats().runs_by_level;
        assert!(levels.len() >= 3 && levels[1..].iter().any(|&n| n > 1), "levels {levels:?}");
        for i in (0..80_000).step_by(97) {
            let k = key(i);
            let covering: Vec<u8> = ver
                .runs
                .iter()
                .filter(|r| r.meta.min_key <= k && k <= r.meta.max_key)
                .map(|r| r.meta.level)
                .collect();
            let deep: Vec<u8> = covering.iter().copied().filter(|&l| l > 0).collect();
            let mut distinct = deep.clone();
            distinct.dedup();
            assert_eq!(deep, distinct, "key {i}: levels of the runs covering it {covering:?}");
            assert!(covering.len() <= opts().level0_runs + levels.len(), "key {i}: {covering:?}");
        }
    }

    /// A merge reads its inputs without adding their blocks to the cache
    /// (issue 45: an import's merges filled it to its bound with blocks
    /// no reader asked for), and its outputs' filters, built from key
    /// hashes, still let every key through; reads do fill the cache.
    #[test]
    fn a_merge_leaves_the_block_cache_as_it_found_it() {
        let store: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 128 << 10, segment_count: 1024 }));
        mkfs(store.clone()).unwrap();
        let e = Engine::open(store, opts()).unwrap();
        level_0_merge_due(&e);
        assert_eq!(e.stats().index_cache_bytes, 0, "flushes read no run");
        // Readers cached a few of the inputs' blocks: the merge uses them
        // and adds none. Looked at before the install, which forgets the
        // inputs' blocks.
        assert!((0..50).all(|i| value(&e, i * 40) == Some(vec![1; 40])));
        let read = e.stats().index_cache_bytes;
        assert!(read > 0, "reads fill the cache");
        let m = lock(&e.sh.merge_lock);
        let ver = e.version();
        let p = e.plan(&ver).expect("a level-0 merge due");
        let window = p.inputs.iter().map(|&i| ver.runs[i].clone()).collect();
        let merged = e.build_merge(window, p.out_level, p.bottom).unwrap();
        assert_eq!(e.stats().index_cache_bytes, read, "the merge cached its inputs");
        {
            let _g = lock(&e.sh.ckpt_lock);
            e.install(merged).unwrap();
            e.checkpoint_locked(None).unwrap();
        }
        drop(m);
        assert_eq!(e.stats().runs_by_level, vec![0, 1], "one merged run");
        let n = (opts().level0_runs as u32 + 1) * 500;
        assert!((0..n).all(|i| value(&e, i) == Some(vec![1; 40])), "a key the merged run's filter misses");
        assert_eq!(e.stats().memtable_bytes, 0, "all flushed");
        let mut b = WriteBatch::new();
        b.put(key(1), vec![2; 40]);
        e.write(&b).unwrap();
        assert!(e.stats().memtable_bytes >= key(1).len() + 40, "{:?}", e.stats());
    }

    /// Flush one run more than level 0 holds, of keys 0..2,000 set to 1:
    /// a level-0 merge is due.
    fn level_0_merge_due(e: &Engine) {
        for round in 0..=opts().level0_runs as u32 {
            let mut b = WriteBatch::new();
            (round * 500..round * 500 + 500).for_each(|i| {
                b.put(key(i), vec![1; 40]);
            });
            e.write(&b).unwrap();
            e.flush().unwrap();
        }
    }

    fn value(e: &Engine, i: u32) -> Option<Vec<u8>> {
        e.get(&key(i)).unwrap()
    }

    /// Every segment's usage count is the engine's own live blocks (the
    /// engine alone stores no data blocks).
    fn assert_counts_exact(e: &Engine, when: &str) {
        for (seg, (u, own)) in e.usage_check().unwrap().into_iter().enumerate() {
            assert_eq!(u64::from(u.live), own, "{when}: segment {seg} counts {} bytes, holds {own}", u.live);
        }
    }

    /// A merge writes its outputs without the ckpt lock (issue 45: writers
    /// waited for whole merges). A flush and its checkpoint land while
    /// they are written; the merge installs after, below the new level-0
    /// run; and a restart at the checkpoint in between counts none of the
    /// outputs it drops.
    #[test]
    fn a_flush_lands_while_a_merge_writes_its_outputs() {
        let store: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 128 << 10, segment_count: 1024 }));
        mkfs(store.clone()).unwrap();
        let e = Engine::open(store.clone(), opts()).unwrap();
        put_all(&e, 30_000);
        e.settle().unwrap();
        level_0_merge_due(&e);
        let m = lock(&e.sh.merge_lock);
        let ver = e.version();
        let p = e.plan(&ver).expect("a level-0 merge due");
        assert_eq!(p.out_level, 1);
        let window = p.inputs.iter().map(|&i| ver.runs[i].clone()).collect();
        let merged = e.build_merge(window, p.out_level, p.bottom).unwrap();
        assert!(!lock(&e.sh.core).unplaced.is_empty(), "the outputs wait, unplaced");
        // Meanwhile newer versions of merged keys, flushed and checkpointed.
        let mut b = WriteBatch::new();
        (0..300).for_each(|i| {
            b.put(key(i), vec![2; 40]);
        });
        e.write(&b).unwrap();
        e.flush().unwrap();
        // A restart at that checkpoint: the outputs are gone and uncounted.
        let again = Engine::open(store.clone(), opts()).unwrap();
        assert_counts_exact(&again, "reopened at the checkpoint taken mid-merge");
        assert_eq!(value(&again, 5), Some(vec![2; 40]));
        assert_eq!(value(&again, 1_000), Some(vec![1; 40]));
        assert_eq!(value(&again, 29_999), Some(vec![29_999u32 as u8; 40]));
        drop(again);
        // The merge installs below the run flushed while it ran.
        {
            let _g = lock(&e.sh.ckpt_lock);
            e.install(merged).unwrap();
            e.checkpoint_locked(None).unwrap();
        }
        drop(m);
        let levels = e.stats().runs_by_level;
        assert_eq!(levels[0], 1, "the run flushed mid-merge stays at level 0: {levels:?}");
        assert!(lock(&e.sh.core).unplaced.is_empty());
        assert_counts_exact(&e, "after the install");
        for (i, want) in [(5, 2), (299, 2), (300, 1), (1_000, 1)] {
            assert_eq!(value(&e, i), Some(vec![want; 40]), "key {i}");
        }
        assert_eq!(value(&e, 29_999), Some(vec![29_999u32 as u8; 40]));
    }

    /// A store whose reads wait while its gate is shut, saying when one
    /// does.
    struct Gate {
        inner: Arc<dyn Store>,
        shut: std::sync::Mutex<bool>,
        opened: std::sync::Condvar,
        waiting: std::sync::mpsc::SyncSender<()>,
    }

    impl Store for Gate {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> std::io::Result<()> {
            self.inner.read_meta(slot, buf)
        }
        fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> std::io::Result<()> {
            self.inner.write_meta(slot, buf)
        }
        fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> std::io::Result<()> {
            let mut shut = self.shut.lock().unwrap();
            if *shut {
                let _ = self.waiting.try_send(());
            }
            while *shut {
                shut = self.opened.wait(shut).unwrap();
            }
            drop(shut);
            self.inner.read(seg, offset, buf)
        }
        fn write(&self, seg: u32, offset: u32, data: &[u8]) -> std::io::Result<()> {
            self.inner.write(seg, offset, data)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.inner.sync()
        }
        fn discard(&self, seg: u32) -> std::io::Result<()> {
            self.inner.discard(seg)
        }
    }

    /// A merge under way (`merge_step`, held up reading its inputs) does
    /// not hold up a flush and its checkpoint: before, it held the ckpt
    /// lock throughout, and a writer whose flush came meanwhile waited for
    /// all of it (issue 45). The merge then installs below the new run.
    #[test]
    fn a_merge_under_way_does_not_hold_up_a_flush() {
        let mem: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 128 << 10, segment_count: 1024 }));
        mkfs(mem.clone()).unwrap();
        let (waiting, reading) = std::sync::mpsc::sync_channel(1);
        let gate = Arc::new(Gate { inner: mem, shut: Mutex::new(false), opened: Condvar::new(), waiting });
        // No block cache: the merge reads its inputs from the store.
        let e = Arc::new(Engine::open(gate.clone(), Options { cache_bytes: 0, ..opts() }).unwrap());
        put_all(&e, 20_000);
        e.settle().unwrap();
        level_0_merge_due(&e);
        *gate.shut.lock().unwrap() = true;
        let m = e.clone();
        let merging = std::thread::spawn(move || m.merge_step());
        reading.recv_timeout(std::time::Duration::from_secs(60)).expect("the merge reads its inputs");
        let w = e.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut b = WriteBatch::new();
            (0..300).for_each(|i| {
                b.put(key(i), vec![2; 40]);
            });
            let _ = tx.send(w.write(&b).and_then(|_| w.flush()));
        });
        let flushed = rx.recv_timeout(std::time::Duration::from_secs(60));
        *gate.shut.lock().unwrap() = false;
        gate.opened.notify_all();
        assert!(matches!(flushed, Ok(Ok(()))), "the flush waited for the merge: {flushed:?}");
        assert!(merging.join().unwrap().unwrap(), "a merge was due");
        assert_eq!(e.stats().runs_by_level[0], 1, "the run flushed mid-merge stays at level 0");
        assert_counts_exact(&e, "after the merge");
        for (i, want) in [(5, 2), (299, 2), (300, 1), (1_999, 1)] {
            assert_eq!(value(&e, i), Some(vec![want; 40]), "key {i}");
        }
        assert_eq!(value(&e, 19_999), Some(vec![19_999u32 as u8; 40]));
    }

    /// A writer that flushes does not wait for a merge under way (here the
    /// merge lock, held by the test) until level 0 is past its stop.
    #[test]
    fn writers_flush_beside_a_merge_under_way() {
        let store: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 128 << 10, segment_count: 1024 }));
        mkfs(store.clone()).unwrap();
        let e = Arc::new(Engine::open(store, Options { background: true, ..opts() }).unwrap());
        let held = lock(&e.sh.merge_lock);
        let w = e.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Some memtables' worth: level 0 grows past its trigger (3),
            // not past its stop (9).
            let r = (0..30).try_for_each(|round| {
                let mut b = WriteBatch::new();
                (0..200).for_each(|i| {
                    b.put(key(round * 200 + i), vec![3; 40]);
                });
                w.write(&b).map(|_| ())
            });
            let _ = tx.send(r.and_then(|()| w.flush()));
        });
        let done = rx.recv_timeout(std::time::Duration::from_secs(120));
        assert!(matches!(done, Ok(Ok(()))), "the writer waited for the merge lock: {done:?}");
        let level0 = e.stats().runs_by_level[0];
        assert!(level0 > opts().level0_runs, "level 0 past its trigger while merges wait: {level0}");
        assert!(!e.level0_stopped());
        drop(held);
        e.flush().unwrap();
        e.settle().unwrap();
        assert!(e.stats().runs_by_level[0] <= opts().level0_runs);
        assert_eq!(value(&e, 5_999), Some(vec![3; 40]));
    }

    /// Scans skip runs whose keys lie outside their range, and only those:
    /// a run whose last key is the start, or whose first key is just
    /// before the (exclusive) end, still gives it.
    #[test]
    fn scans_take_runs_touching_their_bounds() {
        let e = engine();
        for keys in [[b"b".to_vec(), b"d".to_vec()], [b"f".to_vec(), b"h".to_vec()]] {
            let mut b = WriteBatch::new();
            keys.iter().for_each(|k| {
                b.put(k.clone(), k.clone());
            });
            e.write(&b).unwrap();
            e.flush().unwrap();
        }
        assert_eq!(e.stats().runs, 2);
        let keys = |start: &[u8], end: Option<&[u8]>| -> Vec<Vec<u8>> {
            e.scan(start, end, usize::MAX).unwrap().into_iter().map(|(k, _)| k).collect()
        };
        assert_eq!(keys(b"d", Some(b"f")), vec![b"d".to_vec()], "the first run's last key is the start");
        assert_eq!(keys(b"d", Some(b"f\0")), vec![b"d".to_vec(), b"f".to_vec()], "the second's first key");
        assert_eq!(keys(b"e", Some(b"f")), Vec::<Vec<u8>>::new(), "between the runs");
        assert_eq!(keys(b"h", None), vec![b"h".to_vec()]);
        assert_eq!(keys(b"i", None), Vec::<Vec<u8>>::new());
        assert_eq!(keys(b"g", Some(b"c")), Vec::<Vec<u8>>::new(), "start past end");
        assert_eq!(keys(b"", Some(b"b\0")), vec![b"b".to_vec()]);
    }

    /// Issue 45: deleting every key left 38 runs full of tombstones that no
    /// automatic merge dropped. Now the tombstones go down to the keys they
    /// hide and both go: the index ends nearly empty.
    #[test]
    fn deleting_everything_empties_the_index() {
        let e = engine();
        let n = 60_000;
        put_all(&e, n);
        e.settle().unwrap();
        let full = e.stats();
        for c in (0..n).collect::<Vec<_>>().chunks(200) {
            let mut b = WriteBatch::new();
            for &i in c {
                b.delete(key(i));
            }
            e.write(&b).unwrap();
        }
        e.settle().unwrap();
        let after = e.stats();
        assert!(e.scan(&[], None, usize::MAX).unwrap().is_empty());
        assert!(
            after.run_entries < u64::from(n) / 10 && after.runs < full.runs,
            "before the deletes {} runs, {} entries ({:?}); after {} runs, {} entries ({:?})",
            full.runs,
            full.run_entries,
            full.runs_by_level,
            after.runs,
            after.run_entries,
            after.runs_by_level
        );
    }
}
