//! The commit group: the index mutations of the operations accepted since
//! the last commit ([`Pending`]), with the records every group may change
//! (the config record, the owner/mode triples, the lifetime counters), and
//! what the group may use of the log's reserve.
//!
//! A group is written as ONE engine batch ([`Group::seal`]); until then
//! reads see its mutations over the engine's ([`Group::get`]).

use std::collections::HashMap;
use std::mem;

use zlogfs_engine::engine::{Engine, Room, WriteBatch};
use zlogfs_engine::max_block_raw;
use zlogfs_engine::BlockAddr;

use crate::error::{Error, Result};
use crate::event::{Event, Record, RECORD_HEADER_MAX};
use crate::keys::*;
use crate::retention::Policy;
use crate::state::pending::{Pending, FREE_BYTES, HELD_BYTES};
use crate::time::now;

/// The snapshots (named and automatic) whose records are committed, by
/// sequence number: (name, snapshot).
pub(crate) fn committed_snapshot_records(eng: &Engine) -> Result<Vec<(Vec<u8>, Snapshot)>> {
    let (lo, hi) = snapshots_range();
    let mut out = Vec::new();
    for (k, v) in eng.scan(&lo, Some(&hi), usize::MAX)? {
        out.push((k[1..].to_vec(), Snapshot::decode(&v, &describe_key(&k))?));
    }
    out.sort_by_key(|(_, s)| s.seq);
    Ok(out)
}

/// The sequence numbers of the snapshots whose records are committed,
/// ascending.
pub(crate) fn committed_snapshots(eng: &Engine) -> Result<Vec<u64>> {
    Ok(committed_snapshot_records(eng)?.into_iter().map(|(_, s)| s.seq).collect())
}

/// The group and the records it carries.
pub(crate) struct Group {
    pend: Pending,
    cfg: Config,
    /// `cfg` changed since it was last put in a group.
    cfg_dirty: bool,
    /// (uid, gid, mode) triples by value and by id, all of them (a few
    /// hundred on real trees): inodes store the id.
    triples: HashMap<(u32, u32, u32), u32>,
    triple_ids: HashMap<u32, (u32, u32, u32)>,
    /// Lifetime counters, as of the last committed group plus this one.
    counters: Counters,
    /// Counters as last committed.
    saved: Counters,
    /// Engine device bytes when `counters.device_bytes` was last updated.
    dev_seen: u64,
    /// The group holds changes other than removals (new inodes, names,
    /// xattrs, attribute and time changes, atime updates): it may not use
    /// the part of the log's reserve that deletes and the cleaner may use.
    grew: bool,
    /// Commit when the group's estimated journal bytes pass this.
    max_bytes: usize,
    /// The sequence numbers of the named snapshots, ascending: while there
    /// are any, the group's frees are held ([`held_key`]) instead of made.
    snapshots: Vec<u64>,
    /// Held frees let go in this group: made whatever `snapshots` says.
    released: Vec<BlockAddr>,
    /// The image keeps change records (its record of where they start
    /// exists, or is pending).
    recording: bool,
    /// The point the image was opened at: every group since was this
    /// build's, so when records start they cover all from here.
    opened_at: u64,
    /// The retention policy of automatic points.
    policy: Policy,
    /// When the newest automatic point was taken.
    last_point: Option<Time>,
    /// When automatic points were last thinned (seconds).
    thinned_at: Option<i64>,
    /// When each segment in use started to take its blocks
    /// ([`seg_born_key`]): no record naming a block there is older.
    seg_born: HashMap<u32, u64>,
}

impl Group {
    /// The group of a file system opened on `eng`: its config record,
    /// triples and counters read, nothing pending.
    pub(crate) fn open(eng: &Engine) -> Result<Group> {
        let cfg = match eng.get(&config_key())? {
            Some(v) => Config::decode(&v)?,
            None => {
                return Err(Error::Engine(zlogfs_engine::Error::NotAnImage(
                    "the image has a zlogfs engine but no file system in it (run zlogfs mkfs)".into(),
                )))
            }
        };
        let mut triples = HashMap::new();
        let mut triple_ids = HashMap::new();
        for (k, v) in eng.scan(&triple_key(0), Some(&triples_end()), usize::MAX)? {
            let id = triple_id(&k).ok_or_else(|| Error::corrupt("triple key", format!("{k:02x?}")))?;
            let t = decode_triple(&v)?;
            triples.insert(t, id);
            triple_ids.insert(id, t);
        }
        let counters = match eng.get(&counters_key())? {
            Some(v) => Counters::decode(&v)?,
            None => Counters::default(),
        };
        let records = committed_snapshot_records(eng)?;
        let snapshots: Vec<u64> = records.iter().map(|(_, s)| s.seq).collect();
        let last_point =
            records.iter().filter(|(n, _)| n.first() == Some(&(AUTO as u8))).map(|(_, s)| s.time).max();
        let policy = match eng.get(&policy_key())? {
            Some(v) => std::str::from_utf8(&v)
                .map_err(|_| Error::corrupt("the retention policy record", "not UTF-8"))?
                .parse()
                .map_err(|e| Error::corrupt("the retention policy record", format!("{e}")))?,
            None => Policy::NONE,
        };
        let recording = eng.get(&changes_from_key())?.is_some();
        let mut seg_born = HashMap::new();
        let (lo, hi) = seg_borns_range();
        for (k, v) in eng.scan(&lo, Some(&hi), usize::MAX)? {
            let seg =
                parse_seg_born_key(&k).ok_or_else(|| Error::corrupt(describe_key(&k), "a malformed key"))?;
            seg_born.insert(seg, decode_born(&v, &describe_key(&k))?);
        }
        Ok(Group {
            pend: Pending::default(),
            cfg,
            cfg_dirty: false,
            triples,
            triple_ids,
            counters,
            saved: counters,
            dev_seen: eng.device_bytes_written(),
            grew: false,
            max_bytes: max_block_raw(eng.superblock().geometry) / 2,
            snapshots,
            released: Vec::new(),
            recording,
            opened_at: eng.seq(),
            seg_born,
            policy,
            last_point,
            thinned_at: None,
        })
    }

    /// The sequence numbers of the named snapshots, ascending.
    pub(crate) fn snapshots(&self) -> &[u64] {
        &self.snapshots
    }

    /// The named snapshots changed (their records are in this group).
    pub(crate) fn set_snapshots(&mut self, mut seqs: Vec<u64>) {
        seqs.sort_unstable();
        self.snapshots = seqs;
    }

    /// The retention policy of automatic points.
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    /// A new policy (its record is in the group).
    pub(crate) fn set_policy(&mut self, p: Policy) {
        self.policy = p;
    }

    /// When the newest automatic point was taken.
    pub(crate) fn last_point(&self) -> Option<Time> {
        self.last_point
    }

    pub(crate) fn set_last_point(&mut self, t: Time) {
        self.last_point = Some(t);
    }

    /// When automatic points were last thinned.
    pub(crate) fn thinned_at(&self) -> Option<i64> {
        self.thinned_at
    }

    pub(crate) fn set_thinned_at(&mut self, t: i64) {
        self.thinned_at = Some(t);
    }

    /// Blocks were placed at `addrs`, to be named by records from sequence
    /// number `first` on: a segment taking its first blocks records it.
    pub(crate) fn placed(&mut self, addrs: &[BlockAddr], first: u64) {
        for a in addrs {
            if let std::collections::hash_map::Entry::Vacant(e) = self.seg_born.entry(a.seg) {
                e.insert(first);
                self.pend.put(seg_born_key(a.seg), encode_born(first));
            }
        }
    }

    /// A sequence number no record naming block `a` is older than (0 when
    /// its segment has no record: an image from before them).
    pub(crate) fn born(&self, a: BlockAddr) -> u64 {
        self.seg_born.get(&a.seg).copied().unwrap_or(0)
    }

    /// Segment `seg` holds nothing any more (reclaimed): its next blocks
    /// are born anew.
    pub(crate) fn forget_segment(&mut self, seg: u32) {
        if self.seg_born.remove(&seg).is_some() {
            self.del(seg_born_key(seg));
        }
    }

    /// Segment `seg` counts as born at `born` unless it has a record (in
    /// memory only: the next open decides again).
    pub(crate) fn assume_born(&mut self, seg: u32, born: u64) {
        self.seg_born.entry(seg).or_insert(born);
    }

    /// The segments with a born record.
    pub(crate) fn born_segments(&self) -> Vec<u32> {
        self.seg_born.keys().copied().collect()
    }

    /// Whether a snapshot reads a block born at `born` and freed by the
    /// group from `died` on: one at or after `born` and before `died`.
    pub(crate) fn needed(&self, born: u64, died: u64) -> bool {
        let i = self.snapshots.partition_point(|&s| s < born);
        self.snapshots.get(i).is_some_and(|&s| s < died)
    }

    /// Make a held free (its record deleted in this group too).
    pub(crate) fn release(&mut self, a: BlockAddr) {
        self.released.push(a);
    }

    /// The pending value of `key`: None when untouched, Some(None) when
    /// deleted.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.pend.get(key)
    }

    pub(crate) fn put(&mut self, key: Vec<u8>, val: Vec<u8>) {
        self.pend.put(key, val);
    }

    pub(crate) fn del(&mut self, key: Vec<u8>) {
        self.pend.del(key);
    }

    /// Note what an operation did, for the group's change record.
    pub(crate) fn note(&mut self, e: Event) {
        self.pend.note(e);
    }

    /// Release (part of) a data block when the group commits.
    pub(crate) fn free(&mut self, a: BlockAddr) {
        self.pend.free(a);
    }

    /// The mutations, for scans that merge them over the engine's.
    pub(crate) fn pending(&self) -> &Pending {
        &self.pend
    }

    /// Set the mutations aside (a cleaning round works on the committed
    /// tree); [`Group::absorb`] puts them back.
    pub(crate) fn take_pending(&mut self) -> Pending {
        std::mem::take(&mut self.pend)
    }

    /// Add `later`'s mutations, which win over those pending.
    pub(crate) fn absorb(&mut self, later: Pending) {
        self.pend.absorb(later);
    }

    /// Estimated journal bytes of the group: its mutations, and the frees
    /// its released blocks become. With snapshots, a pending free may
    /// become a held free's record at the seal instead: counted as one.
    pub(crate) fn bytes(&self) -> usize {
        let held =
            if self.snapshots.is_empty() { 0 } else { self.pend.frees.len() * (HELD_BYTES - FREE_BYTES) };
        self.pend.bytes + self.released.len() * FREE_BYTES + held
    }

    /// The change record cannot take one more operation's events: the
    /// group must commit before it accepts another (its record is one
    /// engine value, [`crate::event::RECORD_MAX`]).
    pub(crate) fn changes_full(&self) -> bool {
        use crate::event::{OP_EVENTS_MAX, RECORD_HEADER_MAX, RECORD_MAX};
        self.pend.event_bytes + RECORD_HEADER_MAX + OP_EVENTS_MAX > RECORD_MAX
    }

    /// Nothing to commit: no mutation, no config change.
    pub(crate) fn is_empty(&self) -> bool {
        self.pend.is_empty() && !self.cfg_dirty
    }

    /// Estimated journal bytes past which the group is committed.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub(crate) fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// Bytes of file data per chunk.
    pub(crate) fn chunk_size(&self) -> u64 {
        u64::from(self.cfg.chunk_size)
    }

    /// The triple of id `id`.
    pub(crate) fn triple(&self, id: u32) -> Option<(u32, u32, u32)> {
        self.triple_ids.get(&id).copied()
    }

    /// Triples known.
    pub(crate) fn triple_count(&self) -> usize {
        self.triple_ids.len()
    }

    /// The id of triple `t`, a new one (its record in the group) if it has
    /// none.
    pub(crate) fn triple_id(&mut self, t: (u32, u32, u32)) -> u32 {
        if let Some(&id) = self.triples.get(&t) {
            return id;
        }
        let id = self.cfg.next_triple;
        self.cfg.next_triple += 1;
        self.cfg_dirty = true;
        self.triples.insert(t, id);
        self.triple_ids.insert(id, t);
        self.put(triple_key(id), encode_triple(t));
        id
    }

    /// A new inode number.
    pub(crate) fn alloc_ino(&mut self) -> Ino {
        self.grew = true;
        let i = self.cfg.next_ino;
        self.cfg.next_ino += 1;
        self.cfg_dirty = true;
        i
    }

    /// Record that the image holds records of fs version `v` (older
    /// builds then refuse it instead of misreading them).
    pub(crate) fn mark_version(&mut self, v: u8) {
        if self.cfg.version < v {
            self.cfg.version = v;
            self.cfg_dirty = true;
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The counters as of now (`dev_written`: the engine's device bytes
    /// now): what is pending plus the device bytes written since the
    /// group last counted them, which the next group will record.
    pub(crate) fn counters_now(&self, dev_written: u64) -> Counters {
        let mut c = self.counters;
        c.device_bytes += dev_written.saturating_sub(self.dev_seen);
        c
    }

    /// Count the device bytes written since the last group into the
    /// counters record, as a change of its own (at close, so that the
    /// last group's bytes are recorded too); whether there were any.
    pub(crate) fn count_device_bytes(&mut self, dev_written: u64) -> bool {
        let any = self.take_device_bytes(dev_written);
        if any {
            self.put(counters_key(), self.counters.encode());
        }
        any
    }

    /// Add the device bytes written since the last count to the counters;
    /// whether there were any.
    fn take_device_bytes(&mut self, dev_written: u64) -> bool {
        let new = dev_written.saturating_sub(self.dev_seen);
        self.counters.device_bytes += new;
        self.dev_seen = self.dev_seen.max(dev_written);
        new > 0
    }

    pub(crate) fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    /// The group holds changes other than removals.
    pub(crate) fn grew(&self) -> bool {
        self.grew
    }

    /// Note a change other than a removal.
    pub(crate) fn set_grew(&mut self) {
        self.grew = true;
    }

    /// The group as one engine batch allowed `room` of the reserve, with
    /// the config record and counters if they changed (`dev_written`: the
    /// engine's device bytes now); None when nothing is pending.
    pub(crate) fn seal(&mut self, dev_written: u64, room: Room, next_seq: u64) -> Option<WriteBatch> {
        if !self.snapshots.is_empty() && !self.pend.frees.is_empty() {
            // Blocks a snapshot may read (born before it): their bytes
            // stay counted until no such snapshot is left.
            let mut n = 0;
            for a in mem::take(&mut self.pend.frees) {
                let born = self.born(a);
                if self.needed(born, next_seq) {
                    self.pend.put(held_key(a, next_seq, n), encode_born(born));
                    n += 1;
                } else {
                    self.pend.frees.push(a);
                }
            }
            if n > 0 {
                self.mark_version(8);
            }
        }
        if !self.pend.events.is_empty() {
            self.put_change_record(next_seq);
        }
        if self.cfg_dirty {
            let v = self.cfg.encode();
            self.put(config_key(), v);
            self.cfg_dirty = false;
        }
        if self.pend.is_empty() && self.released.is_empty() {
            return None;
        }
        self.take_device_bytes(dev_written);
        if self.counters != self.saved {
            self.put(counters_key(), self.counters.encode());
        }
        let mut b = WriteBatch::new();
        b.room = room;
        for (k, v) in &self.pend.map {
            match v {
                Some(v) => b.put(k.clone(), v.clone()),
                None => b.delete(k.clone()),
            };
        }
        for a in self.pend.frees.iter().chain(&self.released) {
            b.free(*a);
        }
        Some(b)
    }

    /// The group's change record, keyed by its first sequence number
    /// (`first`); with the first one, the record of where they start.
    fn put_change_record(&mut self, first: u64) {
        self.start_recording();
        // A record an earlier seal of these events put (its write failed,
        // or the group was set aside by the cleaner since) goes: the same
        // events must not be recorded twice. Only seals put change
        // records; the deletes of old ones stay.
        let (lo, hi) = changes_range();
        let stale: Vec<Vec<u8>> =
            self.pend.map.range(lo..hi).filter(|(_, v)| v.is_some()).map(|(k, _)| k.clone()).collect();
        for k in stale {
            self.pend.map.remove(&k);
        }
        let rec = Record { time: now(), events: self.pend.events.clone() };
        let v = rec.encode();
        debug_assert!(
            v.len() <= RECORD_HEADER_MAX + self.pend.event_bytes,
            "a change record of {} bytes passes its estimate of {}",
            v.len(),
            RECORD_HEADER_MAX + self.pend.event_bytes
        );
        self.put(change_key(first), v);
        self.mark_version(8);
    }

    /// Keep change records from the point the image was opened at, if
    /// they are not kept yet (a snapshot does, so that what changed since
    /// it can be said).
    pub(crate) fn start_recording(&mut self) {
        if !self.recording {
            self.put(changes_from_key(), Snapshot { seq: self.opened_at, time: now() }.encode());
            self.recording = true;
            self.mark_version(8);
        }
    }

    /// The sealed batch was written: a new, empty group.
    pub(crate) fn committed(&mut self) {
        self.pend = Pending::default();
        self.released.clear();
        self.grew = false;
        self.saved = self.counters;
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, MemStore, MetaSlot, Store, META_SLOT_SIZE};

    use crate::{mkfs, CleanOptions, Fs, FsOptions, MkfsOptions, ROOT};

    /// A store that counts the bytes written to its segments.
    struct Counting(MemStore, AtomicU64);

    impl Store for Counting {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
            self.0.read_meta(slot, buf)
        }
        fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
            self.0.write_meta(slot, buf)
        }
        fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
            self.0.read(seg, offset, buf)
        }
        fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
            self.1.fetch_add(data.len() as u64, Ordering::Relaxed);
            self.0.write(seg, offset, data)
        }
        fn sync(&self) -> io::Result<()> {
            self.0.sync()
        }
        fn discard(&self, seg: u32) -> io::Result<()> {
            self.0.discard(seg)
        }
    }

    /// The lifetime device-bytes counter counts every byte written to the
    /// log while open (it missed a group's own writes until the next
    /// group, so an import in one group counted 0), and close records
    /// all but what recording them writes.
    #[test]
    fn device_bytes_count_every_byte_written() {
        let store = Arc::new(Counting(
            MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 32 }),
            0.into(),
        ));
        let written = || store.1.load(Ordering::Relaxed);
        mkfs(store.clone(), &MkfsOptions::default()).unwrap();
        let opts = FsOptions { commit_interval: None, ..FsOptions::default() };
        let fs = Fs::open(store.clone(), opts.clone()).unwrap();
        let counted0 = fs.usage().unwrap().counters.device_bytes;
        let base = written();
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8 ^ (i >> 13) as u8).collect();
        for n in 0..4u8 {
            let f = fs.create(ROOT, &[b'f', b'0' + n], 0o644, 0, 0).unwrap();
            fs.write(f.ino, 0, &data[..(n as usize + 1) << 19]).unwrap();
        }
        // Cleaning writes too.
        fs.sync().unwrap();
        fs.unlink(ROOT, b"f1").unwrap();
        fs.unlink(ROOT, b"f3").unwrap();
        let opts_clean = CleanOptions { max_live: 0.95, ..CleanOptions::default() };
        let cleaned = fs.clean(&opts_clean, &|_| {}).unwrap();
        assert!(cleaned.moved_bytes > 0, "{cleaned:?}");
        fs.sync().unwrap();
        let u = fs.usage().unwrap();
        assert!(written() - base > 1 << 20, "the data reached the device");
        assert_eq!(u.counters.device_bytes - counted0, written() - base, "counted while open");
        assert_eq!(u.counters.user_bytes, 10 << 19, "user bytes");
        let before_close = written();
        fs.close().unwrap();
        let fs = Fs::open(store.clone(), opts).unwrap();
        let kept = fs.usage().unwrap().counters.device_bytes - counted0;
        let total = written() - base;
        assert!(
            kept >= before_close - base,
            "close records what the last group wrote: {kept} < {}",
            before_close - base
        );
        assert!(kept <= total && total - kept <= 64 << 10, "{kept} recorded of {total} written");
    }
}
