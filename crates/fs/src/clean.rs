//! The cleaner, file system half: move the live file data out of the
//! segments the engine picks, repacking it on the way, then let the engine
//! reclaim the segments (the engine half: crates/engine/src/engine/clean.rs).
//!
//! Moving a chunk is loading it into the group's buffers as if it had been
//! written again whole (without touching its times): the commit then
//! stores it the way every chunk is stored, merged with its patches if it
//! had any. Patches move on their own: a patch in a victim block is stored
//! again as a patch, and of a patched chunk's own base in a victim block,
//! what still shows is stored as patches and the base is gone
//! (docs/decisions/2026-11-23-cleaner-dissolves-patched-bases.md). So the
//! chunks of partly dead shared blocks are packed together with other
//! small chunks into full new blocks, a chunk is recompressed with its
//! file's current codec policy, and the old block is freed by the commit
//! that installs the new one.
//! The move is one commit group: a crash leaves either the old places or
//! the new ones, and the tree is the same either way.

use std::collections::{BTreeMap, HashMap, HashSet};

use zlogfs_engine::engine::{Room, SegBlock};
use zlogfs_engine::{BlockAddr, BlockKind, Tier};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::ops::commit::WRITER_MAX_LIVE;
use crate::ops::patch::{shown, shows};
use crate::state::pending::Pending;
use crate::state::State;
use crate::Fs;

/// What [`Fs::clean`] may do.
#[derive(Debug, Clone)]
pub struct CleanOptions {
    /// Clean at most this many segments.
    pub max_segments: usize,
    /// Leave segments alone that are more than this fraction live.
    pub max_live: f64,
    /// Stop once this many segments are free (None: clean `max_segments`).
    pub target_free: Option<u32>,
    /// Of two devices: clean the fast one's segments only, oldest first,
    /// moving the file data in them to the bulk device (cold small files
    /// go down; the index rewritten stays up), until `target_free` of the
    /// fast device's segments are free.
    pub demote: bool,
    /// Only segments last written before this batch (what the pass began
    /// with): set it when a pass moves everything it meets (`demote`
    /// with `max_live` 1), so that it ends.
    pub written_before: Option<u64>,
    /// Store what is moved of files with a cold form (`user.zlogfs.cold`)
    /// in it. Passes that a writer waits for (making room) leave it off:
    /// the cold form's codec is slower than the write path's.
    pub cold: bool,
    /// Take the segments with the most dead bytes first (greedy), not
    /// the best by cost and age (Sprite LFS's cost-benefit): a writer
    /// that waits for room needs the most room per round now. Picked by
    /// age near full, a round moved a segment 92% live, cost more room
    /// than it gave back and ended the writer's cleaning with ENOSPC
    /// while segments 30% dead waited (crates/fs/tests/clean.rs,
    /// patches_made_early_do_not_fill_the_device, one seed in eight).
    pub greedy: bool,
}

impl Default for CleanOptions {
    fn default() -> Self {
        CleanOptions {
            max_segments: usize::MAX,
            max_live: 0.9,
            target_free: None,
            demote: false,
            written_before: None,
            cold: true,
            greedy: false,
        }
    }
}

/// What a cleaning pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Segments examined.
    pub examined: u32,
    /// Segments made free.
    pub freed: u32,
    /// Chunks moved (written whole again).
    pub chunks: u64,
    /// Patches moved on their own (their chunks stay patched).
    pub patches: u64,
    /// Stored bytes of the live blocks moved.
    pub moved_bytes: u64,
    /// Counted bytes that nothing referenced (leaks dropped).
    pub leaked_bytes: u64,
    /// Rounds that reclaimed segments.
    pub rounds: u32,
    /// Of those, rounds that flushed the index and wrote checkpoints
    /// (a victim held journal blocks recovery still reads).
    pub flushes: u32,
    /// Segments left as they were, and why.
    pub skipped: Vec<(u32, String)>,
    /// Why the pass ended before it had cleaned every segment it would
    /// have: the log had no room left to move live data into.
    pub stopped: Option<String>,
}

impl CleanReport {
    /// The report for scripts.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "examined": self.examined, "freed": self.freed, "chunks": self.chunks, "patches": self.patches,
            "moved_bytes": self.moved_bytes, "leaked_bytes": self.leaked_bytes,
            "rounds": self.rounds, "flushes": self.flushes,
            "skipped": self.skipped.iter().map(|(s, why)| serde_json::json!({"segment": s, "why": why})).collect::<Vec<_>>(),
            "stopped": self.stopped,
        })
    }
}

/// Segments' worth of room cleaning makes beyond what it was started for.
///
/// Cleaning in bursts keeps the cleaner's copies together in the log, in
/// segments of their own, instead of a victim's worth at a time between
/// newly written data. Under overwrites the copies are the blocks not
/// written again lately, and likely to be soon (in fio's random order,
/// each block once per pass, they are exactly the blocks the pass has not
/// reached yet): kept together, their segments empty together and are
/// cheap to clean. Mixed with new data, every segment is left half live.
/// In-process, 4 KiB overwrites in fio's order at 72% live, the GiB after
/// 768 MiB of them: write amplification 1.95 cleaning as needed, 1.74-1.76 with
/// bursts of 8 (`LAST=1024 PERM=1` `overwrite_breakdown`, seed 1);
/// `bench/cleansim.py` gives 1.90 and 1.57 for a model without index
/// bytes. Both the writer that must clean (`clean_for`) and the
/// background cleaner (up to this many segments past its trigger) clean in
/// bursts. Through FUSE, after 4 GiB of them, the next GiB: 2.05 without
/// bursts, 1.80 with the writer's, 1.81 with both (docs/BENCHMARKS.md).
pub(super) const CLEAN_BURST: u32 = 8;

/// Of a fast device of `segments`: below how many free segments data moves
/// down, and how many moving it down frees (the mount's worker); small
/// files the cleaner moves go back up only above the second.
pub(crate) fn demote_marks(segments: u32) -> (u32, u32) {
    let target = (segments / 8).max(4).min(segments.saturating_sub(2));
    ((segments / 16).max(2).min(target), target)
}

impl State {
    /// Of two devices: the fast one has fewer free segments than moving
    /// data down would leave (see [`demote_marks`]).
    pub(crate) fn fast_short(&self) -> bool {
        self.eng.fast_free().is_some_and(|(segs, free)| free < demote_marks(segs).1)
    }

    /// Of two devices: the fast one is down to the segments it keeps for
    /// the metadata (below [`demote_marks`]'s low mark, where data starts
    /// to move down): new file data goes to the bulk device, so that the
    /// journal, the index and the checkpoints keep a place on the fast one.
    pub(crate) fn fast_low(&self) -> bool {
        self.eng.fast_free().is_some_and(|(segs, free)| free < demote_marks(segs).0)
    }
}

/// Victims cleaned per round: their data is moved in one group, then the
/// engine reclaims them together (one flush and two checkpoints).
const ROUND: usize = 4;

impl Fs {
    /// Clean: move live data out of the segments with the most dead space
    /// and free them. Holds the file system for one round of a few segments
    /// at a time; what it did is durable when it returns.
    pub fn clean(&self, opts: &CleanOptions, progress: &dyn Fn(&CleanReport)) -> Result<CleanReport> {
        let start = std::time::Instant::now();
        let r = self.clean_pass(opts, progress);
        let moved = r.as_ref().map_or(0, |r| r.moved_bytes);
        crate::stats::op_times().clean.since(start, moved);
        r
    }

    fn clean_pass(&self, opts: &CleanOptions, progress: &dyn Fn(&CleanReport)) -> Result<CleanReport> {
        if self.st().read_only {
            return Err(Error::read_only("the file system is open read-only: nothing to clean"));
        }
        let mut opts = opts.clone();
        if (opts.demote || opts.max_live >= 1.0) && opts.written_before.is_none() {
            // Moving data down, or everything, meets what it writes (its
            // own index runs, the data it moved) again otherwise.
            opts.written_before = Some(self.st().eng.next_batch());
        }
        let opts = &opts;
        self.st().relieve_history()?;
        let mut rep = CleanReport::default();
        let mut tried = HashSet::new();
        loop {
            let r = match self.st().clean_round(opts, &mut rep, &mut tried) {
                // A full log: what was cleaned so far stands, and the
                // report says why the pass ended (the writers' own
                // commits make room for them as they need it).
                Err(Error::NoSpace(why)) => {
                    tracing::info!("cleaning stopped: {why}");
                    rep.stopped = Some(format!("no room left in the log to move live data into: {why}"));
                    false
                }
                r => r?,
            };
            progress(&rep);
            if !r {
                self.sync()?;
                return Ok(rep);
            }
        }
    }
}

/// Whether moving chunk `idx` of `ino`, stored as `e`, would change a
/// record that `held` (the writers' operations set aside during a round)
/// changes too: the chunk's own record, its inode's, or the reference list
/// of a shared block that any part of it lies in (a patched chunk's base
/// and patches may lie in blocks other than the victim's). The writers'
/// version of such a record is put back over the cleaner's after the
/// round, so the move would be half undone: a reference list naming a
/// chunk that no longer uses the block, and counts released twice (usage
/// below what the segment holds). Such chunks wait for a later round.
fn held_back(held: &Pending, ino: Ino, idx: u64, e: Option<&Extent>) -> bool {
    let shared_held =
        |p: &Extent| matches!(p, Extent::Shared { addr, .. } if held.get(&shared_key(*addr)).is_some());
    held.get(&extent_key(ino, idx)).is_some()
        || held.get(&inode_key(ino)).is_some()
        || e.is_some_and(|e| e.parts().iter().any(|p| shared_held(p)))
}

/// The blocks of a patched chunk `e`'s patches in block `addr` that still
/// show (newer patches hide the rest), as runs; None when no patch of it
/// lies there (or it has no patches, or its base lies there).
fn patches_in(e: &Extent, addr: BlockAddr) -> Option<Vec<(u32, u32)>> {
    let Extent::Patched { base, patches, .. } = e else { return None };
    if base.addr() == Some(addr) {
        return None;
    }
    let mut runs = Vec::new();
    for (i, p) in patches.iter().enumerate() {
        if p.piece.addr() == Some(addr) {
            let s = shows(patches, i);
            runs.extend(if s.is_empty() { p.runs.clone() } else { s });
        }
    }
    (!runs.is_empty()).then_some(runs)
}

/// For a chunk `e` with blocks of its own among `addrs`: when it is
/// patched, the blocks of it stored there that still show (of its base,
/// what no patch replaces), to store again as patches; empty, the chunk
/// is moved whole.
fn showing_here(e: &Extent, addrs: &HashSet<BlockAddr>) -> Vec<(u32, u32)> {
    let Extent::Patched { base, patches, .. } = e else { return Vec::new() };
    let here = |p: &Extent| matches!(*p, Extent::Own(a, _) if addrs.contains(&a));
    let blocks = e.len().div_ceil(u64::from(PATCH_BLOCK)) as u32;
    let mut runs = Vec::new();
    if here(base) {
        let over: Vec<(u32, u32)> = patches.iter().flat_map(|p| p.runs.iter().copied()).collect();
        runs = shown(&[(0, blocks)], &over);
    }
    for (i, _) in patches.iter().enumerate().filter(|(_, p)| here(&p.piece)) {
        runs.extend(shows(patches, i));
    }
    runs
}

impl State {
    /// One round: up to [`ROUND`] victims. False when there is nothing
    /// (more) to do.
    ///
    /// Data the writers buffered is set aside meanwhile and put back after:
    /// the cleaner's commits carry only what it moves, and so fit in the
    /// part of the reserve it may use. The index changes of the writers'
    /// operations are set aside with it (when there is buffered data):
    /// committed without their data, a crash would keep a file's new size
    /// or counts without the bytes written. So the cleaner works on the
    /// committed tree, and leaves alone the chunks whose records those
    /// operations changed (they are moved by a later round).
    pub(crate) fn clean_round(
        &mut self,
        opts: &CleanOptions,
        rep: &mut CleanReport,
        tried: &mut HashSet<u32>,
    ) -> Result<bool> {
        self.aside(|st, held| {
            let start = std::time::Instant::now();
            let moved = rep.moved_bytes;
            st.demoting = opts.demote;
            st.moving_cold = opts.cold;
            let r = st.clean_round_inner(opts, rep, tried, held);
            st.demoting = false;
            st.moving_cold = false;
            crate::stats::op_times().clean_round.since(start, rep.moved_bytes.saturating_sub(moved));
            r
        })
    }

    /// Run `f` with the writers' buffered data set aside, and their
    /// pending index changes with it when there is any (committed without
    /// their data, a crash would keep a file's new size or counts without
    /// the bytes written), and `cleaning` set, so that no commit inside
    /// cleans or takes points; `f` sees the changes set aside. Then what
    /// `f` buffered and did not store is dropped: nothing was committed
    /// for it (kept, a cleaner's unstored moves joined the writers' group:
    /// on a full image, 425 moved chunks counted 27 MB against a group
    /// that then could not be stored, and every later change failed with
    /// it). The writers' changes are put back, newer than anything `f`
    /// loaded.
    pub(crate) fn aside<R>(&mut self, f: impl FnOnce(&mut State, &Pending) -> Result<R>) -> Result<R> {
        let stash = self.bufs.take_all();
        let held = if stash.is_empty() { Pending::default() } else { self.group.take_pending() };
        let was = std::mem::replace(&mut self.cleaning, true);
        let r = f(self, &held);
        self.cleaning = was;
        self.bufs.clear();
        self.group.absorb(held);
        self.bufs.restore(stash);
        r
    }

    /// Clean until `need` bytes are free in the log, or nothing more can
    /// be cleaned; then, from segments at most 60% live, up to a burst of
    /// [`CLEAN_BURST`] segments more.
    ///
    /// When a pass could not make the room, the next one waits until
    /// something was committed since (a delete or an overwrite may have
    /// made dead space): a full file system answers ENOSPC at once instead
    /// of copying the same data around for every write it refuses.
    pub(crate) fn clean_for(&mut self, need: u64) -> Result<()> {
        if self.futile_at == Some(self.stats.commits) {
            return Ok(());
        }
        let fit =
            CleanOptions { max_live: WRITER_MAX_LIVE, cold: false, greedy: true, ..CleanOptions::default() };
        let (mut rep, mut tried) = (CleanReport::default(), HashSet::new());
        while need > self.space_hint && self.gaining_round(&fit, &mut rep, &mut tried)? {}
        if need <= self.space_hint {
            // A burst more (CLEAN_BURST), only from segments that give back
            // more than they cost, and only while each round gains room.
            let seg = u64::from(self.eng.superblock().geometry.segment_size);
            let more = need + u64::from(CLEAN_BURST) * seg;
            let burst = CleanOptions { max_live: 0.6, cold: false, greedy: true, ..CleanOptions::default() };
            while more > self.space_hint {
                let before = self.space_hint;
                if !self.clean_round(&burst, &mut rep, &mut tried)? || self.space_hint <= before {
                    break;
                }
            }
            // A burst's last round may have cost room after all: the write
            // it was cleaning for must still fit.
            while need > self.space_hint && self.gaining_round(&fit, &mut rep, &mut tried)? {}
        }
        self.futile_at = (need > self.space_hint).then_some(self.stats.commits);
        Ok(())
    }

    /// A round of a writer's cleaning, true when it left the cleaner
    /// more room than it found. Near full, a round's cost (moving what
    /// is live, the records of the move, the index flush that lets its
    /// victims go) can pass what it gives back: rounds that went on
    /// regardless took the reserve, and the cleaner, the deletes and the
    /// create after them had no room left (crates/fs/tests/full.rs). Room counts
    /// the segments a flush frees too: a round whose victims go free at
    /// the next checkpoint gained.
    fn gaining_round(
        &mut self,
        opts: &CleanOptions,
        rep: &mut CleanReport,
        tried: &mut HashSet<u32>,
    ) -> Result<bool> {
        let room = |st: &State| (st.eng.room_bytes(Room::Clean), st.eng.free_bytes());
        let gained = |before: (u64, u64), after: (u64, u64)| after.0 > before.0 || after.1 > before.1;
        let before = room(self);
        if !self.clean_round(opts, rep, tried)? {
            return Ok(false);
        }
        let after = room(self);
        Ok(gained(before, after))
    }

    /// Short of room for history, or with free segments about gone, automatic
    /// points go (an eighth at a time, oldest first) until neither holds
    /// or none is left: before cleaning, which would copy the blocks they
    /// hold into the room that is short.
    pub(crate) fn relieve_history(&mut self) -> Result<()> {
        let seg = u64::from(self.eng.superblock().geometry.segment_size);
        let tight = |st: &State| st.free_now() < (st.eng.capacity().0 / 32).max(4 * seg);
        while (self.short_of_history_room() || tight(self)) && self.drop_oldest_points(0)? > 0 {
            // Their frees count once durable.
            self.eng.sync()?;
            self.space_hint = self.free_now();
            self.futile_at = None;
        }
        Ok(())
    }

    /// While cleaning alone (segments at most [`WRITER_MAX_LIVE`] live)
    /// cannot make `need` bytes of room, drop the oldest automatic points
    /// before cleaning. Dropped after, the blocks they held were copied
    /// first and died in their new place, room that no cleaning of the
    /// same pass gets back: a fallocate of what df said was free (which
    /// counts those blocks free) got ENOSPC after 1.4 MB of such copies
    /// (xfstests generic/103 on a used scratch image).
    fn drop_points_cleaning_needs(&mut self, need: u64) -> Result<()> {
        let reserved = self.group.counters().reserved;
        let can = |st: &State| st.eng.writable_bytes(WRITER_MAX_LIVE).saturating_sub(reserved);
        while need > can(self) && self.drop_oldest_points(0)? > 0 {
            // Their frees count once durable.
            self.eng.sync()?;
            self.space_hint = self.free_now();
            self.futile_at = None;
        }
        Ok(())
    }

    /// [`State::clean_for`], and while that cannot make the room (or
    /// cleaning itself finds none to move into), drop the oldest automatic
    /// points of history and try again: they go before a writer gets
    /// ENOSPC. Named snapshots never do. Short of room, points go
    /// first ([`State::relieve_history`]).
    pub(crate) fn make_room(&mut self, need: u64) -> Result<()> {
        if need > self.space_hint {
            self.relieve_history()?;
            self.drop_points_cleaning_needs(need)?;
        }
        loop {
            let r = self.clean_for(need);
            match r {
                Ok(()) if need <= self.space_hint => return Ok(()),
                Ok(()) | Err(Error::NoSpace(_)) => {
                    if self.drop_oldest_points(0)? == 0 {
                        return r;
                    }
                    // Its frees count once durable.
                    self.eng.sync()?;
                    self.space_hint = self.free_now();
                    self.futile_at = None;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Up to `n` segments to clean, best first, as `opts` picks them.
    fn candidates(&self, opts: &CleanOptions, n: usize) -> Vec<zlogfs_engine::engine::Victim> {
        let on = opts.demote.then_some(Tier::Fast);
        if !opts.greedy {
            return self.eng.pick_victims_on(n, opts.max_live, on, opts.written_before);
        }
        let mut all = self.eng.pick_victims_on(usize::MAX, opts.max_live, on, opts.written_before);
        all.sort_by_key(|v| (v.live, v.seg));
        all.truncate(n);
        all
    }

    /// What a round's moves may take of the log: the room of the
    /// cleaner's class, less an eighth for live data that grows a little
    /// when repacked.
    fn clean_room(&self) -> u64 {
        self.eng.room_bytes(Room::Clean) * 7 / 8
    }

    fn clean_round_inner(
        &mut self,
        opts: &CleanOptions,
        rep: &mut CleanReport,
        tried: &mut HashSet<u32>,
        held: &Pending,
    ) -> Result<bool> {
        let left = opts.max_segments.saturating_sub(rep.examined as usize);
        let free = |s: &zlogfs_engine::engine::EngineStats| {
            if opts.demote {
                s.fast.free_segments
            } else {
                s.free_segments
            }
        };
        let enough = opts.target_free.is_some_and(|t| free(&self.eng.stats()) >= t);
        if left == 0 || enough {
            return Ok(false);
        }
        // As many victims as the room the cleaner may use can take (their
        // live data may grow a little when repacked); one that does not
        // fit is passed over (moving it would fail half way).
        let budget = self.clean_room();
        let mut victims = Vec::new();
        let mut take = 0u64;
        for v in self.candidates(opts, left.min(ROUND) + tried.len()) {
            if tried.contains(&v.seg) || victims.len() == left.min(ROUND) {
                continue;
            }
            if take + u64::from(v.live) > budget {
                continue;
            }
            take += u64::from(v.live);
            victims.push(v);
        }
        if victims.is_empty() {
            return Ok(false);
        }
        // What is stored again may be more than what counted: a chunk
        // recompressed, or blocks stored as patches compress worse than
        // their base did. So past the first victim, what was really moved
        // decides whether the next one still fits, at twice its count,
        // and so does the room really left (the index and the journal
        // take some of it as the round commits; what is buffered will).
        // (Patched own bases, which count only what their patches do not
        // replace, are not moved whole but stored as patches: what shows.)
        let worst = 2;
        let start = rep.moved_bytes;
        // A victim freed meanwhile (moving another's files released its
        // last blocks) may be taken again by the log and written: what is
        // in it then is not the victim's. Its last batch tells.
        let chosen: HashMap<u32, (u64, u32)> = victims
            .iter()
            .filter_map(|v| Some((v.seg, (self.eng.segment_last_batch(v.seg)?, v.live))))
            .collect();
        let mut ok = Vec::new();
        for (n, v) in victims.iter().enumerate() {
            let left = self.clean_room().saturating_sub(self.bufs.bytes() as u64);
            let need = u64::from(v.live) * worst;
            if n > 0 && (rep.moved_bytes - start + need > budget || need > left) {
                break;
            }
            let seg = v.seg;
            tried.insert(seg);
            if !self.still_victim(seg, &chosen) {
                // Freed meanwhile: moving another victim's files released
                // the last blocks here (a pack shared by both).
                self.freed_mid_round(rep, seg, &chosen);
                continue;
            }
            rep.examined += 1;
            let blocks = match self.eng.segment_blocks(seg) {
                Ok(b) => b,
                Err(e) => {
                    rep.skipped.push((seg, e.to_string()));
                    continue;
                }
            };
            match self.move_out(&blocks, rep, held) {
                Ok(true) => ok.push(seg),
                Ok(false) => {
                    rep.skipped.push((seg, "it holds chunks changed by operations not yet committed".into()))
                }
                Err(e) if e.is_corruption() => {
                    // Leave the segment (and whatever is readable in it) as
                    // it is: fsck reports the damage.
                    rep.skipped.push((seg, e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        self.commit_as(Room::Clean)?;
        // Whatever the snapshot list says (a delete that failed part way
        // leaves held blocks): no victim holding one is reclaimed.
        ok = self.move_held_out(ok, rep, &chosen)?;
        if ok.is_empty() {
            return Ok(true);
        }
        self.cache.moved();
        let r = self.eng.reclaim(&ok)?;
        // Every block moved out was released, and its cached copy with it;
        // a leaked one was not. Its address will hold another block.
        self.cache.forget_segments(&ok);
        rep.freed += r.freed;
        rep.rounds += 1;
        rep.flushes += u32::from(r.flushed);
        self.stats.clean_freed += u64::from(r.freed);
        self.stats.clean_live +=
            victims.iter().filter(|v| ok.contains(&v.seg)).map(|v| u64::from(v.live)).sum::<u64>();
        rep.leaked_bytes += r.leaked;
        for &seg in ok.iter().filter(|s| !r.busy.iter().any(|(b, _)| b == *s)) {
            self.group.forget_segment(seg);
        }
        rep.skipped.extend(r.busy);
        self.space_hint = self.free_now();
        Ok(true)
    }

    /// The victims' blocks kept for snapshots (held, some by this round's
    /// moves) are copied as they are stored, with forward records for
    /// reads at the snapshots; committed. Returns the victims left with no
    /// held block (only those may be reclaimed).
    fn move_held_out(
        &mut self,
        victims: Vec<u32>,
        rep: &mut CleanReport,
        chosen: &HashMap<u32, (u64, u32)>,
    ) -> Result<Vec<u32>> {
        let mut moved = Vec::new();
        let mut any = false;
        for seg in victims {
            if !self.still_victim(seg, chosen) {
                // Emptied by the moves and commits since (nothing held
                // kept it), and perhaps taken again: what is there now
                // (copies of other victims' blocks) stays.
                self.freed_mid_round(rep, seg, chosen);
                continue;
            }
            match self.move_held(seg) {
                Ok(bytes) => {
                    rep.moved_bytes += bytes;
                    any |= bytes > 0;
                    moved.push(seg);
                }
                Err(e) if e.is_corruption() => rep.skipped.push((seg, e.to_string())),
                Err(e) => return Err(e),
            }
        }
        if any {
            self.commit_as(Room::Clean)?;
        }
        let mut ok = Vec::new();
        for seg in moved {
            if !self.still_victim(seg, chosen) {
                // Emptied by the commits above (the group commits as it
                // grows), and perhaps taken again for the copies of later
                // victims: free already, and what is there now stays. (The
                // engine's reclaim would take a victim written again for
                // one whose blocks had all been moved, and count the new
                // ones as leaked.)
                self.freed_mid_round(rep, seg, chosen);
                continue;
            }
            let (lo, hi) = held_range_in(seg);
            if self.scan(&lo, &hi, 1)?.is_empty() {
                ok.push(seg);
            } else {
                rep.skipped.push((seg, "blocks kept for snapshots are left in it".into()));
            }
        }
        Ok(ok)
    }

    /// Victim `seg` was emptied during the round (and may have been taken
    /// again): it counts as freed. Its born record stays until the next
    /// open: the log may already have placed blocks there that records
    /// name from this round on, and an older born only keeps frees there
    /// held for more snapshots than need them, never fewer.
    fn freed_mid_round(&mut self, rep: &mut CleanReport, seg: u32, chosen: &HashMap<u32, (u64, u32)>) {
        rep.freed += 1;
        self.stats.clean_freed += 1;
        // What it held live then was moved (with the files that emptied
        // it), as a reclaimed victim's was.
        self.stats.clean_live += chosen.get(&seg).map_or(0, |c| u64::from(c.1));
    }

    /// Whether `seg` still holds what it held when it was chosen as a
    /// victim (`chosen`: its last batch then, and its live bytes): in use,
    /// and not written since.
    fn still_victim(&self, seg: u32, chosen: &HashMap<u32, (u64, u32)>) -> bool {
        self.eng.segment_in_use(seg) && self.eng.segment_last_batch(seg) == chosen.get(&seg).map(|c| c.0)
    }

    /// Load every live chunk stored in `blocks` into the group's buffers,
    /// committing along the way when the buffers fill. False when some are
    /// left because `held` (the writers' changes set aside) changes their
    /// records.
    fn move_out(&mut self, blocks: &[SegBlock], rep: &mut CleanReport, held: &Pending) -> Result<bool> {
        let mut all = true;
        let mut own: BTreeMap<Ino, HashSet<BlockAddr>> = BTreeMap::new();
        for b in blocks.iter().filter(|b| b.kind == BlockKind::Data) {
            if b.owner == 0 {
                all &= self.move_shared(b.addr, rep, held)?;
            } else {
                own.entry(b.owner).or_default().insert(b.addr);
            }
        }
        for (ino, addrs) in own {
            all &= self.move_owned(ino, &addrs, rep, held)?;
        }
        Ok(all)
    }

    /// Move what shared block `addr` holds: the chunks its reference list
    /// names, or their patches. False when they are held back.
    fn move_shared(&mut self, addr: BlockAddr, rep: &mut CleanReport, held: &Pending) -> Result<bool> {
        let key = shared_key(addr);
        if held.get(&key).is_some() {
            return Ok(false);
        }
        let Some(v) = self.get(&key)? else { return Ok(true) };
        let (mut refs, _) = decode_refs(&v)?;
        let mut back = false;
        for &(ino, idx) in &refs {
            back |= held_back(held, ino, idx, self.stored_extent(ino, idx)?.as_ref());
        }
        if back {
            return Ok(false);
        }
        rep.moved_bytes += u64::from(addr.len);
        // A chunk is listed once for each of its pieces here.
        refs.sort_unstable();
        refs.dedup();
        for (ino, idx) in refs {
            self.move_from_shared(addr, ino, idx, rep)?;
        }
        Ok(true)
    }

    /// Move chunk `idx` of `ino` out of shared block `addr`: its patches
    /// there, if that is what lies there, or the chunk.
    fn move_from_shared(&mut self, addr: BlockAddr, ino: Ino, idx: u64, rep: &mut CleanReport) -> Result<()> {
        let e = self.stored_extent(ino, idx)?;
        let uses =
            |e: &Extent| e.parts().iter().any(|p| matches!(p, Extent::Shared { addr: a, .. } if *a == addr));
        match (e.as_ref().and_then(|e| patches_in(e, addr)), e) {
            // Patches lie here: move them, not the chunk (which may be many
            // times their size).
            (Some(runs), _) => {
                let cs = self.chunk_of(ino)?;
                self.move_patch(ino, idx, cs, &runs)?;
                rep.patches += 1;
                self.relocated()
            }
            (None, Some(e)) if uses(&e) => self.relocate(ino, idx, rep),
            _ => Err(Error::corrupt(
                format!("block {addr}"),
                format!("its reference list names chunk {idx} of inode {ino}, which is not in it"),
            )),
        }
    }

    /// Move the chunks of `ino` with blocks of their own among `addrs`.
    /// False when some are held back.
    fn move_owned(
        &mut self,
        ino: Ino,
        addrs: &HashSet<BlockAddr>,
        rep: &mut CleanReport,
        held: &Pending,
    ) -> Result<bool> {
        let (lo, hi) = extents_from(ino, 0);
        let mut found = Vec::new();
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            let e = Extent::decode(&v, &format!("chunk of inode {ino}"))?;
            let bytes: u32 = e
                .parts()
                .iter()
                .filter_map(|p| match **p {
                    Extent::Own(a, _) if addrs.contains(&a) => Some(a.len),
                    _ => None,
                })
                .sum();
            if bytes > 0 {
                let (_, idx) =
                    parse_extent_key(&k).ok_or_else(|| Error::corrupt("chunk key", format!("{k:02x?}")))?;
                found.push((idx, bytes, showing_here(&e, addrs), held_back(held, ino, idx, Some(&e))));
            }
        }
        let mut all = true;
        for (idx, bytes, rest, back) in found {
            if back {
                all = false;
                continue;
            }
            rep.moved_bytes += u64::from(bytes);
            if rest.is_empty() {
                self.relocate(ino, idx, rep)?;
            } else {
                // A patched chunk's base: store what of it still shows as
                // more patches, and the base is gone (the chunk is its
                // patches from then on), instead of writing the whole chunk
                // again.
                let cs = self.chunk_of(ino)?;
                self.move_patch(ino, idx, cs, &rest)?;
                rep.patches += 1;
                self.relocated()?;
            }
        }
        Ok(all)
    }

    fn relocate(&mut self, ino: Ino, idx: u64, rep: &mut CleanReport) -> Result<()> {
        // A chunk in a block: never a reservation, so its count holds.
        let mut i = self.inode(ino)?;
        self.dirty_mut(&mut i, idx)?;
        rep.chunks += 1;
        self.relocated()
    }

    /// The chunk size of file `ino`.
    fn chunk_of(&self, ino: Ino) -> Result<u32> {
        Ok(self.cs(&self.inode(ino)?) as u32)
    }

    /// After buffering a moved chunk: commit when the buffers are full.
    fn relocated(&mut self) -> Result<()> {
        if self.bufs.bytes() >= (64 << 20).min(self.bufs.limit()) || self.group_full() {
            self.commit_as(Room::Clean)?;
        }
        Ok(())
    }
}
