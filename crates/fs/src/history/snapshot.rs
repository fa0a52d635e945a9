//! Named snapshots (issue 28, first step of docs/decisions/2026-11-25-history-design.md):
//! a snapshot is a sequence number the index keeps every record version
//! at (`Engine::set_retained`), and, while any snapshot exists, the blocks
//! a commit stops using are held ([`crate::keys::held_key`]) instead of
//! freed; the cleaner copies held blocks it moves and leaves a forward
//! behind (`crate::history::forward`). `Group::seal` turns the group's frees of blocks
//! a snapshot reads into held records, the one place every free of file
//! data passes. A block is read by the snapshots at or after its born
//! (kept per segment by `Group::placed`) and before its free. Deleting a
//! snapshot frees the held blocks no remaining snapshot reads: those no
//! snapshot lies between their block's born and their free
//! (`release_held`).

use std::collections::BTreeMap;
use std::sync::Arc;

use zlogfs_engine::engine::Engine;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::State;
use crate::time::now;
use crate::Fs;

/// Held frees made per commit group when a snapshot is deleted.
const RELEASE_STEP: usize = 4096;

/// The snapshot called `name` of the image open on `eng`.
pub(crate) fn find(eng: &Engine, name: &str) -> Result<Snapshot> {
    match eng.get(&snapshot_key(name.as_bytes()))? {
        Some(v) => Ok(Snapshot::decode(&v, &format!("snapshot {name:?}"))?),
        None => Err(Error::not_found(format!("no snapshot called {name:?} (zlogfs snapshot list)"))),
    }
}

/// A time as users give it: ISO 8601 (`2026-11-26T10:00:00Z`,
/// `2026-11-26 10:00:00`; a date alone is its midnight UTC), or a
/// duration meaning that long before now (`90min`, `2h`, `3days`).
pub fn parse_time(spec: &str) -> Result<Time> {
    let s = spec.trim();
    let t = if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        t
    } else if let Ok(t) = humantime::parse_rfc3339_weak(&format!("{s} 00:00:00")) {
        t
    } else if let Ok(d) = humantime::parse_duration(s) {
        std::time::SystemTime::now()
            .checked_sub(d)
            .ok_or_else(|| Error::invalid(format!("{spec:?} reaches before 1970")))?
    } else {
        return Err(Error::invalid(format!(
            "{spec:?} is not an ISO 8601 time (2026-11-26T10:00:00Z, 2026-11-26) or a duration (2h, 3days)"
        )));
    };
    Ok(Time::from_system(t))
}

/// The kept point `spec` names, for a read-only open as of then: a clock
/// token of a kept point, or a time (the newest kept point at or before
/// it). Kept points are the named snapshots.
pub(crate) fn find_at(eng: &Engine, spec: &str) -> Result<Snapshot> {
    let kept: Vec<Snapshot> =
        crate::state::group::committed_snapshot_records(eng)?.into_iter().map(|(_, s)| s).collect();
    if spec.starts_with("zlogfs:") {
        let seq = crate::history::feed::parse_clock(eng, spec)?
            .ok_or_else(|| Error::invalid(format!("{spec:?} is a clock token of another image")))?;
        return kept.into_iter().find(|s| s.seq == seq).ok_or_else(|| {
            Error::not_found(format!("point {seq} is not kept: only snapshots are (zlogfs snapshot list)"))
        });
    }
    let t = parse_time(spec)?;
    let oldest = kept.first().copied();
    kept.into_iter().rev().find(|s| s.time <= t).ok_or_else(|| match oldest {
        Some(o) => Error::not_found(format!(
            "no kept point at or before {spec}: the oldest snapshot was taken at {}",
            humantime::format_rfc3339_seconds(o.time.to_system())
        )),
        None => Error::not_found("no kept point: the image has no snapshot (zlogfs snapshot create)"),
    })
}

fn check_name(name: &str) -> Result<()> {
    if name.starts_with(AUTO) {
        return Err(Error::invalid(format!(
            "snapshot name {name:?}: names that start with '@' are the automatic points'"
        )));
    }
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "snapshot name {name:?}: 1 to 255 bytes, no '/', no control characters, not . or .."
        )))
    }
}

/// A held free: its key, the part of a block it holds, its block's born,
/// and when it was freed.
pub(crate) type HeldFree = (Vec<u8>, zlogfs_engine::BlockAddr, u64, u64);

/// The block part, born and died of the held free `k` (value `v`).
fn held_free(k: &[u8], v: &[u8]) -> Result<(zlogfs_engine::BlockAddr, u64, u64)> {
    let Some((a, died, _)) = parse_held_key(k) else {
        return Err(Error::corrupt(describe_key(k), "a malformed held free"));
    };
    Ok((a, held_born(k, v)?, died))
}

/// How long statfs trusts its count of bytes held only for automatic
/// points.
const PURGEABLE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl State {
    /// At open, before anything is placed: every segment with a born
    /// record that holds nothing now forgets it (freed since it took its
    /// blocks, by a cleaner that stopped before it forgot, or as its
    /// blocks were freed), so its next blocks are born anew; every
    /// segment that holds blocks but has no record (an image from before
    /// them, or a record lost with a group a crash cut off while blocks
    /// of a committed group lie there) counts as born 0, which only holds
    /// more, until it is reclaimed.
    pub(crate) fn settle_segment_borns(&mut self) {
        let usage = self.eng.segment_usage();
        for seg in self.group.born_segments() {
            if usage.get(seg as usize).is_none_or(|u| u.live == 0) {
                self.group.forget_segment(seg);
            }
        }
        for (seg, u) in usage.iter().enumerate() {
            if u.live > 0 {
                self.group.assume_born(seg as u32, 0);
            }
        }
    }

    /// Make the held frees that no snapshot can read any more (none left
    /// at or after their block's born and before their free), deleting
    /// their records with them, in groups of [`RELEASE_STEP`]; committed.
    /// Run by a snapshot's delete, and at open, where it finishes a delete
    /// a crash cut short (its record gone in its first group, some held
    /// frees left). Returns the bytes freed.
    pub(crate) fn release_held(&mut self) -> Result<u64> {
        // The held records are walked once, a page at a time: no release
        // may run inside this one (a commit takes automatic points and may
        // thin them, a writer short of room drops them; neither runs while
        // cleaning).
        // Views of the snapshots let go stop trusting their reads before
        // any block goes.
        self.eng.withdraw_except(self.group.snapshots());
        self.held_blocks_move();
        // What statfs counts free changes with what is released.
        self.purgeable_at = None;
        let was = std::mem::replace(&mut self.cleaning, true);
        let r = self.release_held_now();
        self.cleaning = was;
        match r {
            Ok(freed) => {
                self.eng.set_retained(self.group.snapshots().to_vec());
                Ok(freed)
            }
            Err(e) => {
                // The deletes that led here may not be committed: hold for
                // every snapshot whose record is.
                if let Err(e2) = self.reload_snapshots() {
                    self.background_error("reloading the snapshot list", &e2);
                }
                Err(e)
            }
        }
    }

    /// Stored bytes held only for automatic points (no named snapshot
    /// reads them): what dropping every point would free, which a writer
    /// short of room does before it gets ENOSPC.
    pub(crate) fn purgeable(&mut self) -> Result<u64> {
        Ok(self.purgeable_by_segment()?.values().sum())
    }

    /// [`State::purgeable`] per segment (statfs counts what releasing
    /// them gives back segment by segment); read again at most every
    /// [`PURGEABLE_EVERY`].
    pub(crate) fn purgeable_by_segment(&mut self) -> Result<Arc<BTreeMap<u32, u64>>> {
        if self.group.snapshots().is_empty() {
            return Ok(Arc::default());
        }
        if let Some((at, n)) = &self.purgeable_at {
            if at.elapsed() < PURGEABLE_EVERY {
                return Ok(n.clone());
            }
        }
        let (lo, hi) = snapshots_range();
        let mut named = Vec::new();
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            if k.get(1) != Some(&(AUTO as u8)) {
                named.push(Snapshot::decode(&v, &describe_key(&k))?.seq);
            }
        }
        named.sort_unstable();
        // Several held frees of one block are its parts (a shared block
        // loses a part as each user leaves): they add up to at most its
        // length, and each is released on its own.
        let mut by_seg = BTreeMap::new();
        self.for_each_held(|_, a, born, died| {
            let i = named.partition_point(|&s| s < born);
            if named.get(i).is_none_or(|&s| s >= died) {
                *by_seg.entry(a.seg).or_insert(0u64) += u64::from(a.len);
            }
            Ok(())
        })?;
        let n = Arc::new(by_seg);
        self.purgeable_at = Some((std::time::Instant::now(), n.clone()));
        Ok(n)
    }

    /// The snapshot list as committed or pending, whichever holds more (a
    /// delete not committed yet keeps its snapshot, a point taken but not
    /// committed is one), for the group and the engine.
    pub(crate) fn reload_snapshots(&mut self) -> Result<()> {
        let mut seqs = crate::state::group::committed_snapshots(&self.eng)?;
        let (lo, hi) = snapshots_range();
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            seqs.push(Snapshot::decode(&v, &describe_key(&k))?.seq);
        }
        seqs.sort_unstable();
        seqs.dedup();
        self.eng.set_retained(seqs.clone());
        self.group.set_snapshots(seqs);
        Ok(())
    }

    /// Call `f` on every held free, as (key, block part, born, died), a
    /// page at a time (issue 45: a million deletes
    /// kept for history are a million held frees).
    pub(crate) fn for_each_held(
        &self,
        mut f: impl FnMut(&[u8], zlogfs_engine::BlockAddr, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let (lo, hi) = all_held_range();
        self.for_each(&lo, &hi, |k, v| {
            let (a, born, died) = held_free(k, v)?;
            f(k, a, born, died)
        })
    }

    /// Up to `n` held frees from key `from` on, as (key, block part, born,
    /// died).
    fn held_frees_from(&self, from: &[u8], n: usize) -> Result<Vec<HeldFree>> {
        let (_, hi) = all_held_range();
        let mut out = Vec::new();
        for (k, v) in self.scan(from, &hi, n)? {
            let (a, born, died) = held_free(&k, &v)?;
            out.push((k, a, born, died));
        }
        Ok(out)
    }

    fn release_held_now(&mut self) -> Result<u64> {
        let mut freed = 0u64;
        let (mut from, mut n) = (all_held_range().0, 0usize);
        // A page at a time: what is released is deleted and committed on
        // the way, so the next page starts after the last key seen.
        loop {
            let page = self.held_frees_from(&from, 4096)?;
            let Some(last) = page.last() else { break };
            from = key_after(&last.0);
            for (k, a, born, died) in page {
                if !self.group.needed(born, died) {
                    self.group.release(a);
                    self.del(k);
                    freed += u64::from(a.len);
                }
                n += 1;
                if n % RELEASE_STEP == 0 || self.group_full() {
                    self.commit()?;
                }
            }
        }
        self.drop_forwards()?;
        self.commit()?;
        Ok(freed)
    }
}

impl Fs {
    /// Take a snapshot called `name` of everything accepted so far; durable
    /// when this returns.
    pub fn snapshot_create(&self, name: &str) -> Result<Snapshot> {
        check_name(name)?;
        let mut st = self.st();
        if st.read_only {
            return Err(Error::read_only("the file system is open read-only: no snapshot can be taken"));
        }
        st.pre_op()?;
        if st.get(&snapshot_key(name.as_bytes()))?.is_some() {
            return Err(Error::exists(format!("a snapshot called {name:?} exists")));
        }
        st.commit()?;
        let snap = Snapshot { seq: st.eng.seq(), time: now() };
        st.put(snapshot_key(name.as_bytes()), snap.encode());
        st.group.start_recording();
        let mut seqs = st.group.snapshots().to_vec();
        seqs.push(snap.seq);
        st.eng.set_retained(seqs.clone());
        st.group.set_snapshots(seqs);
        st.group.mark_version(8);
        st.commit()?;
        drop(st);
        self.sync()?;
        Ok(snap)
    }

    /// The sequence number snapshot `name` reads at; NotFound if there is
    /// no such snapshot.
    pub fn snapshot_seq(&self, name: &str) -> Result<u64> {
        let st = self.st();
        match st.get(&snapshot_key(name.as_bytes()))? {
            Some(v) => Ok(Snapshot::decode(&v, &format!("snapshot {name:?}"))?.seq),
            None => Err(Error::not_found(format!("no snapshot called {name:?} (zlogfs snapshot list)"))),
        }
    }

    /// The snapshots, by name.
    pub fn snapshots(&self) -> Result<Vec<(String, Snapshot)>> {
        let st = self.st();
        let (lo, hi) = snapshots_range();
        let mut out = Vec::new();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            let name = String::from_utf8_lossy(&k[1..]).into_owned();
            out.push((name.clone(), Snapshot::decode(&v, &format!("snapshot {name:?}"))?));
        }
        Ok(out)
    }

    /// Stored bytes held only for automatic points: what statfs counts
    /// free (counted at most every two seconds).
    pub fn purgeable_bytes(&self) -> Result<u64> {
        self.st().purgeable()
    }

    /// Stored bytes held for snapshots: blocks the present no longer uses.
    pub fn held_bytes(&self) -> Result<u64> {
        // Counted from the keys alone, a damaged one left out: stats must
        // answer on a damaged image (fsck names the damage).
        // A page at a time on a mount, as `du` is.
        let mut held = 0;
        let (lo, hi) = all_held_range();
        crate::state::for_each_paged(
            &|| self.st_after_requests(),
            &lo,
            &hi,
            crate::state::WALK_PAGE,
            &mut || {},
            |_, k, _| {
                held += parse_held_key(k).map_or(0, |(a, _, _)| u64::from(a.len));
                Ok(())
            },
        )?;
        Ok(held)
    }

    /// The snapshots, oldest first, each with the bytes deleting it
    /// alone would free now: the held blocks it is the only snapshot to
    /// read (the only one at or after their born and before their free).
    pub fn snapshot_usage(&self) -> Result<Vec<(String, Snapshot, u64)>> {
        let mut snaps = self.snapshots()?;
        snaps.sort_by_key(|(_, s)| s.seq);
        let seqs: Vec<u64> = snaps.iter().map(|(_, s)| s.seq).collect();
        let mut only = vec![0u64; seqs.len()];
        self.st().for_each_held(|_, a, born, died| {
            let (from, to) = (seqs.partition_point(|&s| s < born), seqs.partition_point(|&s| s < died));
            if to == from + 1 {
                only[from] += u64::from(a.len);
            }
            Ok(())
        })?;
        Ok(snaps.into_iter().zip(only).map(|((n, s), b)| (n, s, b)).collect())
    }

    /// Delete the snapshot called `name`, and free the blocks only it
    /// held; durable when this returns. Returns the bytes freed.
    pub fn snapshot_delete(&self, name: &str) -> Result<u64> {
        let mut st = self.st();
        if st.read_only {
            return Err(Error::read_only("the file system is open read-only: no snapshot can be deleted"));
        }
        st.pre_relieve()?;
        let key = snapshot_key(name.as_bytes());
        let Some(v) = st.get(&key)? else {
            return Err(Error::not_found(format!("no snapshot called {name:?} (zlogfs snapshot list)")));
        };
        let gone = Snapshot::decode(&v, &format!("snapshot {name:?}"))?;
        st.del(key);
        let mut seqs = st.group.snapshots().to_vec();
        if let Some(i) = seqs.iter().position(|&s| s == gone.seq) {
            seqs.remove(i);
        }
        st.group.set_snapshots(seqs);
        // Versions only the deleted snapshot kept may be merged away once
        // its record is gone for good (release_held tells the engine).
        let freed = st.release_held()?;
        drop(st);
        self.sync()?;
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, Store};

    use crate::keys::{all_held_range, parse_held_key, seg_borns_range, snapshot_key};
    use crate::{Fs, FsOptions, ROOT};

    fn open(store: &Arc<dyn Store>) -> Fs {
        crate::testing::open(store, crate::testing::quiet(FsOptions::default()))
    }

    /// A segment that holds blocks but has no born record (an image from
    /// before them, an upgrade with a snapshot) counts as born 0 after an
    /// open: an old block overwritten then is held for the snapshot, not
    /// freed, and the snapshot reads it.
    #[test]
    fn segments_without_a_born_record_hold_for_every_snapshot() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        let old: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        fs.write(a.ino, 0, &old).unwrap();
        fs.snapshot_create("s").unwrap();
        {
            // As an image from before born records, with a snapshot.
            let mut st = fs.st();
            let (lo, hi) = seg_borns_range();
            for (k, _) in st.scan(&lo, &hi, usize::MAX).unwrap() {
                st.del(k);
            }
            st.commit().unwrap();
        }
        fs.close().unwrap();
        let fs = open(&store);
        fs.write(a.ino, 0, &vec![1u8; 100_000]).unwrap();
        fs.sync().unwrap();
        assert!(fs.held_bytes().unwrap() > 50_000, "the old block is held");
        fs.clean(&crate::CleanOptions { max_live: 0.999, ..Default::default() }, &|_| {}).unwrap();
        fs.close().unwrap();
        let view = Fs::open(
            store.clone(),
            FsOptions {
                read_only: true,
                snapshot: Some("s".into()),
                commit_interval: None,
                ..FsOptions::default()
            },
        )
        .unwrap();
        assert!(view.read(a.ino, 0, 100_000).unwrap() == old, "the snapshot reads the old data");
    }

    /// Scrub reads the blocks kept for snapshots too, and says which one
    /// is damaged.
    #[test]
    fn scrub_verifies_the_blocks_snapshots_read() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        let noise: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        fs.write(a.ino, 0, &noise).unwrap();
        fs.snapshot_create("s").unwrap();
        fs.write(a.ino, 0, &vec![1u8; 200_000]).unwrap();
        fs.sync().unwrap();
        let clean = fs.scrub(&crate::ScrubOptions::default(), &|_| {}).unwrap();
        assert!(clean.damaged.is_empty(), "{:?}", clean.damaged);
        let (lo, hi) = all_held_range();
        let held = fs.st().scan(&lo, &hi, usize::MAX).unwrap();
        let (b, _, _) = parse_held_key(&held[0].0).unwrap();
        let mut byte = [0u8; 1];
        store.read(b.seg, b.offset + 40, &mut byte).unwrap();
        store.write(b.seg, b.offset + 40, &[byte[0] ^ 0xff]).unwrap();
        let rep = fs.scrub(&crate::ScrubOptions::default(), &|_| {}).unwrap();
        assert_eq!(rep.blocks, clean.blocks, "{rep:?}");
        assert!(
            rep.damaged
                .iter()
                .any(|d| d.contains("kept for snapshots") && d.contains(&format!("{}:{}", b.seg, b.offset))),
            "{:?}",
            rep.damaged
        );
    }

    /// A delete cut short after its first group (the snapshot's record
    /// gone, held frees left) is finished by the next open.
    #[test]
    fn the_next_open_finishes_an_interrupted_delete() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        fs.write(a.ino, 0, &vec![7u8; 200_000]).unwrap();
        fs.snapshot_create("s").unwrap();
        fs.write(a.ino, 0, &vec![8u8; 200_000]).unwrap();
        fs.sync().unwrap();
        let (lo, hi) = all_held_range();
        {
            let mut st = fs.st();
            assert!(!st.scan(&lo, &hi, usize::MAX).unwrap().is_empty(), "frees are held");
            // The first group of the delete, and no more.
            st.del(snapshot_key(b"s"));
            st.group.set_snapshots(Vec::new());
            st.commit().unwrap();
        }
        fs.sync().unwrap();
        let live = fs.engine().stats().live_bytes;
        drop(fs);
        let fs = open(&store);
        assert!(fs.st().scan(&lo, &hi, usize::MAX).unwrap().is_empty(), "the held frees were made");
        assert!(fs.engine().stats().live_bytes < live, "and their bytes freed");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }
}
