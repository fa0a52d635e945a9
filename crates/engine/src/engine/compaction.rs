//! Flushing the memtable into runs and merging runs: the run builder,
//! which cuts a stream of entries into compressed data blocks, an index
//! block and a filter.

use std::sync::atomic::Ordering as AtOrd;
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::index::run::{encode_data_block, encode_index_block, Bloom, IndexEntry, Run, RunMeta};
use crate::index::{retain_versions, Entry, Memtable, MergeIter};
use crate::log::format::*;
use crate::log::{max_block_raw, NewBlock};

use super::checkpoint::Hold;
use super::{lock, Core, Engine, Frozen, Room, Version};

/// The most runs one merge takes (a window of adjacent runs).
const MERGE_WIDTH: usize = 4;

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

    /// Merge while there are more than `max_runs` runs and a merge can
    /// lower their number. Runs are capped in size ([`Engine::run_caps`]):
    /// past `max_runs` full runs, no merge can get back under the limit,
    /// and merging full runs only wrote as many again, for ever (issue 45:
    /// an import stalled at 1.2 million files).
    pub(super) fn maybe_merge(&self) -> Result<()> {
        loop {
            let before = self.version().runs.len();
            if before <= self.sh.opts.max_runs || !self.merge_runs(false)? {
                return Ok(());
            }
            if self.version().runs.len() >= before {
                // Runs came in front meanwhile, or the merge's estimate
                // was off: the next flush tries again.
                return Ok(());
            }
        }
    }

    /// The most keys, and sparse-index bytes, a run holds: its filter and
    /// its sparse index are single blocks (cut at 90% of the block limit;
    /// the filter takes 10 bits a key, the index a key and ~22 bytes a
    /// data block).
    fn run_caps(&self) -> (usize, usize) {
        let max_block = max_block_raw(self.sh.sb.geometry);
        (max_block * 8 / 10 * 9 / 10, max_block * 9 / 10)
    }

    /// How many runs merging runs of `fill` (each run's entries and
    /// sparse-index bytes) writes at most, as if no version were dropped.
    fn runs_out(&self, fill: &[(u64, u64)]) -> u64 {
        let (max_keys, max_index) = self.run_caps();
        let (entries, index) = fill.iter().fold((0, 0), |(e, i), &(re, ri)| (e + re, i + ri));
        entries.div_ceil(max_keys as u64).max(index.div_ceil(max_index as u64)).max(1)
    }

    /// Write the runs built from `entries` (internal order) into the log.
    /// A run's filter and sparse index are single blocks, so a long stream
    /// is cut, between keys, into several runs with disjoint key ranges.
    fn write_runs(&self, entries: impl Iterator<Item = Result<Entry>>) -> Result<Vec<Run>> {
        let (max_keys, max_index) = self.run_caps();
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
    pub(super) fn flush_frozen(&self) -> Result<bool> {
        let _g = lock(&self.sh.ckpt_lock);
        let Some(f) = self.version().frozen.last().cloned() else { return Ok(false) };
        // A frozen memtable does not change: read through a cursor, not
        // copied whole.
        let new_runs = self.write_runs(f.mem.cursor(&[], None).map(Ok))?;
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

    /// Merge runs: all of them, or the window of adjacent runs (two to
    /// [`MERGE_WIDTH`]) that lowers their number at the least cost in
    /// bytes read per run gone. False when no window lowers it (every run
    /// is about full).
    pub(super) fn merge_runs(&self, all: bool) -> Result<bool> {
        let _g = lock(&self.sh.ckpt_lock);
        let ver = self.version();
        let n = ver.runs.len();
        if n < 2 && !(all && n == 1) {
            return Ok(false);
        }
        let (lo, hi) = if all {
            (0, n)
        } else {
            // Each run's entries and sparse-index bytes, summed once.
            let fill: Vec<(u64, u64)> = ver
                .runs
                .iter()
                .map(|r| (r.meta.entries, r.index.iter().map(|e| e.last_key.len() as u64 + 22).sum()))
                .collect();
            let mut best: Option<(f64, usize, usize)> = None;
            for w in 2..=n.min(MERGE_WIDTH) {
                for lo in 0..=n - w {
                    let gone = (w as u64).saturating_sub(self.runs_out(&fill[lo..lo + w]));
                    if gone == 0 {
                        continue;
                    }
                    let bytes: u64 = ver.runs[lo..lo + w].iter().map(|r| r.meta.bytes).sum();
                    let cost = bytes as f64 / gone as f64;
                    if best.is_none_or(|(c, _, _)| cost < c) {
                        best = Some((cost, lo, lo + w));
                    }
                }
            }
            match best {
                Some((_, lo, hi)) => (lo, hi),
                None => return Ok(false),
            }
        };
        self.merge_window(&ver, lo, hi)?;
        Ok(true)
    }

    /// Merge runs `lo..hi` of `ver` (adjacent, newest first) into new runs
    /// in their place, and checkpoint. The caller holds the ckpt lock.
    pub(super) fn merge_window(&self, ver: &Version, lo: usize, hi: usize) -> Result<()> {
        let n = ver.runs.len();
        let window: Vec<Arc<Run>> = ver.runs[lo..hi].to_vec();
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
            window.iter().map(|r| r.cursor(self.sh.store.clone(), self.sh.cache.clone(), &[])).collect();
        let merged = retain_versions(MergeIter::new(sources)?, horizon, &points, hi == n);
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
                    core.ckpt.holds.push((a, Hold::Run(Arc::downgrade(r))));
                }
                self.sh.cache.forget_run(r.meta.id);
            }
            self.sh.horizon.fetch_max(horizon, AtOrd::AcqRel);
            self.set_version(Version { active: ver.active.clone(), frozen: ver.frozen.clone(), runs });
        }
        self.checkpoint_locked(None)
    }
}
