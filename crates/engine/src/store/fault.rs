//! A fault-injecting in-memory store for crash and error tests.
//!
//! [`FaultStore`] keeps two images: the *durable* one (the state as of the
//! last successful [`Store::sync`]) and the *current* one (durable plus every
//! write since, in order), together with the list of *pending* writes that
//! separate them. Reads see the current image. [`FaultStore::power_cut`]
//! throws the volatile state away the way a device losing power might, and
//! [`FaultConfig`] makes chosen operations fail.
//!
//! Segments are held as `Arc`ed buffers shared copy-on-write between the
//! two images and between forks, so [`FaultStore::fork`] costs a few pointer
//! copies per segment plus the 12 KiB of metadata slots.
//!
//! [`Store::discard`] is a no-op here (beyond a bounds check): a reused
//! segment keeps its old bytes past what is rewritten, as on a real disk.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    check_range, Geometry, MetaSlot, Store, META_AREA_SIZE, META_SLOTS, META_SLOT_SIZE, SECTOR_SIZE,
};

/// How [`FaultStore::power_cut`] treats writes not yet made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every write since the last sync is lost.
    DropUnsynced,
    /// Every write since the last sync survives except the last one, of
    /// which only a prefix ending at a 512-byte device boundary survives
    /// (possibly nothing).
    TearLast,
    /// Each write since the last sync independently survives with
    /// probability 1/2; a survivor is torn at a random 512-byte device
    /// boundary half of the time.
    Reorder,
}

/// A class of operations, for [`FaultConfig::fail_kinds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Segment and metadata reads.
    Read,
    /// Segment and metadata writes.
    Write,
    /// Syncs.
    Sync,
}

/// What to break. The default breaks nothing.
///
/// Counted operations are `read`, `write`, `read_meta`, `write_meta` and
/// `sync` calls that pass their bounds check; `discard` and `geometry` are
/// not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// The Nth counted operation (1-based) fails with `ErrorKind::Other`
    /// "injected I/O error". A failed write is not applied at all.
    pub fail_at: Option<u64>,
    /// Count (for `fail_at`) and fail only operations of this kind.
    pub fail_kinds: Option<OpKind>,
    /// With `fail_at`: every matching operation from the Nth on fails.
    pub persistent: bool,
    /// The device loses power after N operations of any kind: operations
    /// 1..=N succeed, and operation N+1 and every later one fail with EIO
    /// and have no effect, until [`FaultStore::power_cut`].
    pub dead_after: Option<u64>,
    /// `(n, seed)`: the nth read (segment or metadata, 1-based) returns its
    /// data with one bit flipped, chosen from `seed`; the stored data is not
    /// changed.
    pub flip_on_read: Option<(u64, u64)>,
}

/// Names a region of the store, for the inspection helpers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A segment.
    Segment(u32),
    /// A metadata slot.
    Meta(MetaSlot),
}

#[derive(Clone)]
struct Image {
    segments: Vec<Option<Arc<Vec<u8>>>>,
    meta: Box<[[u8; META_SLOT_SIZE]; META_SLOTS]>,
}

impl Image {
    fn new(g: Geometry) -> Image {
        Image {
            segments: vec![None; g.segment_count as usize],
            meta: Box::new([[0; META_SLOT_SIZE]; META_SLOTS]),
        }
    }

    /// The bytes of `target`, allocating a zeroed segment if needed.
    fn bytes_mut(&mut self, target: Target, segment_size: u32) -> &mut [u8] {
        match target {
            Target::Segment(s) => {
                let seg =
                    self.segments[s as usize].get_or_insert_with(|| Arc::new(vec![0; segment_size as usize]));
                Arc::make_mut(seg).as_mut_slice()
            }
            Target::Meta(slot) => &mut self.meta[slot.index() as usize],
        }
    }

    fn apply(&mut self, target: Target, offset: u32, data: &[u8], segment_size: u32) {
        let start = offset as usize;
        self.bytes_mut(target, segment_size)[start..start + data.len()].copy_from_slice(data);
    }

    fn read(&self, target: Target, offset: u32, buf: &mut [u8]) {
        let start = offset as usize;
        match target {
            Target::Segment(s) => match &self.segments[s as usize] {
                Some(d) => buf.copy_from_slice(&d[start..start + buf.len()]),
                None => buf.fill(0),
            },
            Target::Meta(slot) => {
                buf.copy_from_slice(&self.meta[slot.index() as usize][start..start + buf.len()])
            }
        }
    }
}

#[derive(Clone)]
struct Pending {
    target: Target,
    offset: u32,
    data: Arc<[u8]>,
}

#[derive(Clone)]
struct State {
    geometry: Geometry,
    durable: Image,
    current: Image,
    pending: Vec<Pending>,
    cfg: FaultConfig,
    /// Counted operations since `set_faults`.
    ops: u64,
    /// Operations matching `cfg.fail_kinds` since `set_faults`.
    kind_ops: u64,
    /// Successful reads since `set_faults`.
    reads: u64,
    dead: bool,
    sync_count: u64,
    bytes_written: u64,
    /// Per segment, the highest end offset ever written.
    written_end: Vec<Option<u32>>,
    /// Turn freed segments to junk ([`FaultStore::junk_freed`]).
    junk_freed: bool,
}

impl State {
    fn clear_faults(&mut self) {
        self.cfg = FaultConfig::default();
        self.ops = 0;
        self.kind_ops = 0;
        self.reads = 0;
        self.dead = false;
    }

    /// Count one operation of `kind` and decide whether it fails.
    fn begin(&mut self, kind: OpKind) -> io::Result<()> {
        self.ops += 1;
        if let Some(n) = self.cfg.dead_after {
            if self.ops > n {
                self.dead = true;
            }
        }
        if self.dead {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let matches = match self.cfg.fail_kinds {
            None => true,
            Some(k) => k == kind,
        };
        if matches {
            self.kind_ops += 1;
            if let Some(n) = self.cfg.fail_at {
                if self.kind_ops == n || (self.cfg.persistent && self.kind_ops > n) {
                    return Err(io::Error::other("injected I/O error"));
                }
            }
        }
        Ok(())
    }

    fn after_read(&mut self, buf: &mut [u8]) {
        self.reads += 1;
        if let Some((n, seed)) = self.cfg.flip_on_read {
            if self.reads == n && !buf.is_empty() {
                let bit = StdRng::seed_from_u64(seed).gen_range(0..buf.len() * 8);
                buf[bit / 8] ^= 1 << (bit % 8);
            }
        }
    }

    fn segment_size(&self) -> u32 {
        self.geometry.segment_size
    }
}

/// The device address of byte `offset` of `target` (see the file layout).
fn device_addr(target: Target, offset: u32, segment_size: u32) -> u64 {
    match target {
        Target::Segment(s) => META_AREA_SIZE + u64::from(s) * u64::from(segment_size) + u64::from(offset),
        Target::Meta(slot) => slot.index() * META_SLOT_SIZE as u64 + u64::from(offset),
    }
}

/// For a write of `len` bytes at device address `addr`: the smallest prefix
/// length `k > 0` ending on a sector boundary, and how many such lengths
/// below `len` exist (they are `first + i * SECTOR_SIZE`).
fn tear_points(addr: u64, len: usize) -> (usize, usize) {
    let sector = SECTOR_SIZE as u64;
    let first = (sector - addr % sector) as usize;
    let count = if first < len { (len - 1 - first) / SECTOR_SIZE + 1 } else { 0 };
    (first, count)
}

/// An in-memory store that loses unsynced writes on demand and fails chosen
/// operations. See the module documentation.
pub struct FaultStore {
    inner: Mutex<State>,
}

impl FaultStore {
    /// An empty store (every byte reads as zero) with no faults set.
    pub fn new(geometry: Geometry) -> FaultStore {
        let image = Image::new(geometry);
        FaultStore {
            inner: Mutex::new(State {
                geometry,
                durable: image.clone(),
                current: image,
                pending: Vec::new(),
                cfg: FaultConfig::default(),
                ops: 0,
                kind_ops: 0,
                reads: 0,
                dead: false,
                sync_count: 0,
                bytes_written: 0,
                written_end: vec![None; geometry.segment_count as usize],
                junk_freed: false,
            }),
        }
    }

    /// From now on, act as a store that deletes what the engine frees (an
    /// object store does): a segment's bytes become junk the moment
    /// [`Store::freed`] names it, durably too, so that a test in which the
    /// engine reads a segment it said it no longer needs fails its
    /// checksums. Settings of [`FaultStore::set_faults`] leave it as is.
    pub fn junk_freed(&self, on: bool) {
        self.lock().junk_freed = on;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain data updated without intermediate invariants
        // that a panic could break, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replace the fault settings and reset the operation counters to 0
    /// (also clears the "dead" state of an earlier `dead_after`).
    pub fn set_faults(&self, cfg: FaultConfig) {
        let mut st = self.lock();
        st.clear_faults();
        st.cfg = cfg;
    }

    /// Simulate power loss and reboot: the durable image becomes what
    /// `mode` lets survive of the pending writes (randomness from `seed`),
    /// pending writes are gone, faults and the dead state are cleared, and
    /// the store is usable again.
    pub fn power_cut(&self, mode: CrashMode, seed: u64) {
        let mut st = self.lock();
        let mut rng = StdRng::seed_from_u64(seed);
        let seg_size = st.segment_size();
        let pending = std::mem::take(&mut st.pending);
        let last = pending.len().wrapping_sub(1);
        for (i, p) in pending.iter().enumerate() {
            let (first, count) = tear_points(device_addr(p.target, p.offset, seg_size), p.data.len());
            let keep = match mode {
                CrashMode::DropUnsynced => 0,
                CrashMode::TearLast if i < last => p.data.len(),
                CrashMode::TearLast => match rng.gen_range(0..=count) {
                    0 => 0,
                    j => first + (j - 1) * SECTOR_SIZE,
                },
                CrashMode::Reorder => {
                    if !rng.gen_bool(0.5) {
                        0
                    } else if count > 0 && rng.gen_bool(0.5) {
                        first + rng.gen_range(0..count) * SECTOR_SIZE
                    } else {
                        p.data.len()
                    }
                }
            };
            if keep > 0 {
                st.durable.apply(p.target, p.offset, &p.data[..keep], seg_size);
            }
        }
        st.current = st.durable.clone();
        st.clear_faults();
    }

    /// A deep copy of the whole state (durable image, pending writes and
    /// counters) with faults cleared. Cheap: segment buffers are shared
    /// copy-on-write.
    pub fn fork(&self) -> FaultStore {
        let mut st = self.lock().clone();
        st.clear_faults();
        FaultStore { inner: Mutex::new(st) }
    }

    /// Counted operations since the last [`FaultStore::set_faults`] (or
    /// power cut or creation), including ones that failed.
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// Successful syncs since creation.
    pub fn sync_count(&self) -> u64 {
        self.lock().sync_count
    }

    /// Bytes passed to successful `write` and `write_meta` calls since
    /// creation.
    pub fn bytes_written(&self) -> u64 {
        self.lock().bytes_written
    }

    /// Writes not yet made durable.
    pub fn pending_writes(&self) -> usize {
        self.lock().pending.len()
    }

    /// True once a `dead_after` limit has been hit (until a power cut or
    /// `set_faults`).
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Flip bit `bit` (0..8) of byte `offset` of `target` in the durable
    /// image, permanently; reads see it too unless a pending write covers
    /// the byte.
    ///
    /// # Panics
    /// If `target`, `offset` or `bit` is out of range.
    pub fn corrupt_durable(&self, target: Target, offset: u64, bit: u8) {
        assert!(bit < 8, "bit {bit} out of range");
        let mut st = self.lock();
        let seg_size = st.segment_size();
        check_target(st.geometry, target, offset, 1);
        st.durable.bytes_mut(target, seg_size)[offset as usize] ^= 1 << bit;
        // Rebuild the current image: durable plus pending, in order.
        let mut current = st.durable.clone();
        for p in &st.pending {
            current.apply(p.target, p.offset, &p.data, seg_size);
        }
        st.current = current;
    }

    /// `len` raw bytes of `target` at `offset` in the durable image.
    ///
    /// # Panics
    /// If the range is outside `target`.
    pub fn read_durable(&self, target: Target, offset: u64, len: usize) -> Vec<u8> {
        let st = self.lock();
        check_target(st.geometry, target, offset, len);
        let mut buf = vec![0; len];
        st.durable.read(target, offset as u32, &mut buf);
        buf
    }

    /// For each segment ever written (in segment order), the highest end
    /// offset any successful write reached, whether or not it survived.
    pub fn written_segments(&self) -> Vec<(u32, u32)> {
        let st = self.lock();
        st.written_end.iter().enumerate().filter_map(|(s, end)| end.map(|e| (s as u32, e))).collect()
    }

    fn do_read(&self, target: Target, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        let mut st = self.lock();
        st.begin(OpKind::Read)?;
        st.current.read(target, offset, buf);
        st.after_read(buf);
        Ok(())
    }

    fn do_write(&self, target: Target, offset: u32, data: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        st.begin(OpKind::Write)?;
        let seg_size = st.segment_size();
        st.current.apply(target, offset, data, seg_size);
        st.pending.push(Pending { target, offset, data: Arc::from(data) });
        st.bytes_written += data.len() as u64;
        if let Target::Segment(s) = target {
            let end = offset + data.len() as u32;
            let slot = &mut st.written_end[s as usize];
            *slot = Some(slot.map_or(end, |e| e.max(end)));
        }
        Ok(())
    }
}

/// Panic unless `len` bytes at `offset` lie inside `target`.
fn check_target(g: Geometry, target: Target, offset: u64, len: usize) {
    let size = match target {
        Target::Segment(s) => {
            assert!(s < g.segment_count, "segment {s} out of range");
            u64::from(g.segment_size)
        }
        Target::Meta(_) => META_SLOT_SIZE as u64,
    };
    assert!(offset + len as u64 <= size, "{target:?}: offset {offset} length {len} outside its {size} bytes");
}

impl Store for FaultStore {
    fn geometry(&self) -> Geometry {
        self.lock().geometry
    }

    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.do_read(Target::Meta(slot), 0, buf)
    }

    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.do_write(Target::Meta(slot), 0, buf)
    }

    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.geometry(), seg, offset, buf.len())?;
        self.do_read(Target::Segment(seg), offset, buf)
    }

    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        check_range(self.geometry(), seg, offset, data.len())?;
        self.do_write(Target::Segment(seg), offset, data)
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.lock();
        st.begin(OpKind::Sync)?;
        st.durable = st.current.clone();
        st.pending.clear();
        st.sync_count += 1;
        Ok(())
    }

    fn discard(&self, seg: u32) -> io::Result<()> {
        check_range(self.geometry(), seg, 0, 0)?;
        if self.lock().dead {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    /// See [`FaultStore::junk_freed`]; otherwise nothing.
    fn freed(&self, seg: u32) {
        let mut st = self.lock();
        if !st.junk_freed {
            return;
        }
        let Some(i) = (seg < st.geometry.segment_count).then_some(seg as usize) else { return };
        let junk = Arc::new(vec![0xa5u8; st.geometry.segment_size as usize]);
        st.current.segments[i] = Some(Arc::clone(&junk));
        st.durable.segments[i] = Some(junk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u32 = 64 * 1024;

    fn geo() -> Geometry {
        Geometry { segment_size: SEG, segment_count: 64 }
    }

    fn pattern(tag: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| tag ^ (i as u8).wrapping_mul(31) | 1).collect()
    }

    fn read(s: &FaultStore, seg: u32, off: u32, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        s.read(seg, off, &mut buf).unwrap();
        buf
    }

    #[test]
    fn reads_see_pending_and_sync_makes_durable() {
        let s = FaultStore::new(geo());
        let a = pattern(1, 4096);
        s.write(0, 0, &a).unwrap();
        assert_eq!(read(&s, 0, 0, 4096), a);
        assert_eq!(s.read_durable(Target::Segment(0), 0, 4096), vec![0; 4096]);
        assert_eq!(s.pending_writes(), 1);
        s.sync().unwrap();
        assert_eq!(s.read_durable(Target::Segment(0), 0, 4096), a);
        assert_eq!(s.pending_writes(), 0);
        assert_eq!(s.sync_count(), 1);
        assert_eq!(s.bytes_written(), 4096);
    }

    #[test]
    fn drop_unsynced() {
        let s = FaultStore::new(geo());
        let a = pattern(1, 4096);
        let b = pattern(2, 4096);
        s.write(0, 0, &a).unwrap();
        s.write_meta(MetaSlot::CheckpointA, &[1; META_SLOT_SIZE]).unwrap();
        s.sync().unwrap();
        s.write(0, 4096, &b).unwrap();
        s.write(5, 0, &b).unwrap();
        s.write_meta(MetaSlot::CheckpointA, &[2; META_SLOT_SIZE]).unwrap();
        s.power_cut(CrashMode::DropUnsynced, 0);
        assert_eq!(s.pending_writes(), 0);
        assert_eq!(read(&s, 0, 0, 8192), [a.clone(), vec![0; 4096]].concat());
        assert_eq!(read(&s, 5, 0, 4096), vec![0; 4096]);
        let mut m = [0; META_SLOT_SIZE];
        s.read_meta(MetaSlot::CheckpointA, &mut m).unwrap();
        assert_eq!(m, [1; META_SLOT_SIZE]);
        assert_eq!(s.read_durable(Target::Segment(0), 0, 4096), a);
        // Still usable after the reboot.
        s.write(0, 4096, &b).unwrap();
        s.sync().unwrap();
        assert_eq!(s.read_durable(Target::Segment(0), 4096, 4096), b);
    }

    /// Length of the longest prefix of `got` equal to `want`, requiring the
    /// rest of `got` to be zero.
    fn kept_prefix(got: &[u8], want: &[u8]) -> usize {
        let k = got.iter().zip(want).take_while(|(g, w)| g == w).count();
        assert!(got[k..].iter().all(|&b| b == 0), "garbage after kept prefix {k}");
        k
    }

    #[test]
    fn tear_last_keeps_sector_prefix_of_last_write() {
        let seed = zlogfs_testkit::seed("fault store");
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..64u64 {
            let s = FaultStore::new(geo());
            let a = pattern(1, 1000);
            s.write(1, 0, &a).unwrap();
            s.sync().unwrap();
            let b = pattern(2, 2048);
            let c = pattern(3, 3000); // not a multiple of 512
            s.write(1, 1024, &b).unwrap();
            s.write(1, 3072, &c).unwrap();
            s.power_cut(CrashMode::TearLast, seed.wrapping_add(i));
            assert_eq!(s.read_durable(Target::Segment(1), 0, 1000), a);
            assert_eq!(s.read_durable(Target::Segment(1), 1024, 2048), b);
            let got = s.read_durable(Target::Segment(1), 3072, 3000);
            let k = kept_prefix(&got, &c);
            assert_eq!(k % SECTOR_SIZE, 0, "kept {k}");
            assert!(k < 3000);
            assert_eq!(read(&s, 1, 3072, 3000), got);
            seen.insert(k);
        }
        // 0, 512, ..., 2560: with 64 tries we should see several.
        assert!(seen.len() >= 3, "{seen:?}");
    }

    #[test]
    fn tear_last_drops_short_write_and_respects_device_boundaries() {
        let seed = zlogfs_testkit::seed("fault store");
        let s = FaultStore::new(geo());
        s.write(2, 0, &pattern(1, 300)).unwrap();
        s.power_cut(CrashMode::TearLast, seed);
        assert_eq!(s.read_durable(Target::Segment(2), 0, 512), vec![0; 512]);

        // An unaligned write: any tear ends on a device sector boundary.
        for i in 0..32u64 {
            let s = FaultStore::new(geo());
            let c = pattern(4, 2000);
            s.write(3, 100, &c).unwrap();
            s.power_cut(CrashMode::TearLast, seed.wrapping_add(i));
            let got = s.read_durable(Target::Segment(3), 100, 2000);
            let k = kept_prefix(&got, &c);
            assert!(k < 2000);
            let addr = device_addr(Target::Segment(3), 100, SEG) + k as u64;
            assert!(k == 0 || addr % SECTOR_SIZE as u64 == 0, "kept {k}");
        }
    }

    #[test]
    fn tear_last_of_meta_write() {
        let seed = zlogfs_testkit::seed("fault store");
        let s = FaultStore::new(geo());
        s.write(0, 0, &[5; 512]).unwrap();
        s.write_meta(MetaSlot::CheckpointB, &[7; META_SLOT_SIZE]).unwrap();
        s.power_cut(CrashMode::TearLast, seed);
        assert_eq!(s.read_durable(Target::Segment(0), 0, 512), vec![5; 512]);
        let m = s.read_durable(Target::Meta(MetaSlot::CheckpointB), 0, META_SLOT_SIZE);
        let k = kept_prefix(&m, &[7; META_SLOT_SIZE]);
        assert_eq!(k % SECTOR_SIZE, 0);
        assert!(k < META_SLOT_SIZE);
    }

    #[test]
    fn reorder_keeps_subsets_and_sector_prefixes() {
        let seed = zlogfs_testkit::seed("fault store");
        let (mut dropped, mut whole, mut torn) = (0, 0, 0);
        for i in 0..16u64 {
            let s = FaultStore::new(geo());
            let base = pattern(9, 512);
            s.write(0, 0, &base).unwrap();
            s.sync().unwrap();
            let writes: Vec<(u32, Vec<u8>)> =
                (0..16u32).map(|j| (1 + j, pattern(j as u8, 512 * (1 + j as usize % 5)))).collect();
            for (seg, d) in &writes {
                s.write(*seg, 0, d).unwrap();
            }
            s.power_cut(CrashMode::Reorder, seed.wrapping_add(i));
            assert_eq!(s.read_durable(Target::Segment(0), 0, 512), base);
            for (seg, d) in &writes {
                let got = s.read_durable(Target::Segment(*seg), 0, d.len());
                let k = kept_prefix(&got, d);
                assert_eq!(k % SECTOR_SIZE, 0);
                match k {
                    0 => dropped += 1,
                    k if k == d.len() => whole += 1,
                    _ => torn += 1,
                }
            }
        }
        assert!(dropped > 0 && whole > 0 && torn > 0, "{dropped} {whole} {torn}");
    }

    #[test]
    fn power_cut_is_deterministic_per_seed() {
        let seed = zlogfs_testkit::seed("fault store");
        let s = FaultStore::new(geo());
        for j in 0..20u32 {
            s.write(j, 0, &pattern(j as u8, 4096)).unwrap();
        }
        let a = s.fork();
        let b = s.fork();
        a.power_cut(CrashMode::Reorder, seed);
        b.power_cut(CrashMode::Reorder, seed);
        for j in 0..20u32 {
            assert_eq!(
                a.read_durable(Target::Segment(j), 0, 4096),
                b.read_durable(Target::Segment(j), 0, 4096)
            );
        }
    }

    #[test]
    fn fail_at_once() {
        let s = FaultStore::new(geo());
        s.set_faults(FaultConfig { fail_at: Some(3), ..Default::default() });
        s.write(0, 0, &[1; 512]).unwrap(); // 1
        read(&s, 0, 0, 512); // 2
        let e = s.write(0, 512, &[2; 512]).unwrap_err(); // 3
        assert_eq!(e.kind(), io::ErrorKind::Other);
        assert_eq!(e.to_string(), "injected I/O error");
        assert_eq!(read(&s, 0, 512, 512), vec![0; 512]); // 4: not applied
        s.write(0, 512, &[3; 512]).unwrap(); // 5
        s.sync().unwrap(); // 6
        assert_eq!(s.op_count(), 6);
        assert_eq!(s.pending_writes(), 0);
        assert_eq!(s.read_durable(Target::Segment(0), 512, 512), vec![3; 512]);
        assert_eq!(s.bytes_written(), 1024);
    }

    #[test]
    fn fail_at_persistent_by_kind() {
        let s = FaultStore::new(geo());
        s.set_faults(FaultConfig {
            fail_at: Some(2),
            fail_kinds: Some(OpKind::Sync),
            persistent: true,
            ..Default::default()
        });
        s.write(0, 0, &[1; 512]).unwrap();
        s.sync().unwrap();
        s.write(0, 512, &[2; 512]).unwrap();
        read(&s, 0, 0, 1024);
        assert!(s.sync().is_err());
        s.write(0, 1024, &[3; 512]).unwrap();
        assert!(s.sync().is_err());
        assert!(s.sync().is_err());
        assert_eq!(s.sync_count(), 1);
        assert_eq!(s.op_count(), 8);
        // Reset: works again.
        s.set_faults(FaultConfig::default());
        s.sync().unwrap();
        assert_eq!(s.read_durable(Target::Segment(0), 1024, 512), vec![3; 512]);
    }

    #[test]
    fn fail_kinds_counts_meta_as_read_and_write() {
        let s = FaultStore::new(geo());
        s.set_faults(FaultConfig { fail_at: Some(2), fail_kinds: Some(OpKind::Write), ..Default::default() });
        s.write(0, 0, &[1; 512]).unwrap();
        s.sync().unwrap();
        let mut m = [0; META_SLOT_SIZE];
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert!(s.write_meta(MetaSlot::Super, &[4; META_SLOT_SIZE]).is_err());
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert_eq!(m, [0; META_SLOT_SIZE], "failed meta write must not apply");
        s.write_meta(MetaSlot::Super, &[4; META_SLOT_SIZE]).unwrap();

        s.set_faults(FaultConfig { fail_at: Some(1), fail_kinds: Some(OpKind::Read), ..Default::default() });
        s.write(0, 0, &[1; 512]).unwrap();
        assert!(s.read_meta(MetaSlot::Super, &mut m).is_err());
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert_eq!(m, [4; META_SLOT_SIZE]);
    }

    #[test]
    fn dead_after() {
        let s = FaultStore::new(geo());
        s.write(0, 0, &[1; 512]).unwrap();
        s.sync().unwrap();
        s.set_faults(FaultConfig { dead_after: Some(2), ..Default::default() });
        s.write(0, 512, &[2; 512]).unwrap();
        s.write(0, 1024, &[3; 512]).unwrap();
        assert!(!s.is_dead());
        let e = s.write(0, 1536, &[4; 512]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(s.is_dead());
        let mut buf = [0; 512];
        assert!(s.read(0, 0, &mut buf).is_err());
        assert!(s.sync().is_err());
        assert!(s.write_meta(MetaSlot::Super, &[1; META_SLOT_SIZE]).is_err());
        assert!(s.discard(0).is_err());
        assert_eq!(s.pending_writes(), 2);
        assert_eq!(s.sync_count(), 1);

        s.power_cut(CrashMode::TearLast, 1);
        assert!(!s.is_dead());
        // The first pending write survives TearLast whole; the dead write
        // was never applied.
        assert_eq!(s.read_durable(Target::Segment(0), 512, 512), vec![2; 512]);
        assert_eq!(s.read_durable(Target::Segment(0), 1536, 512), vec![0; 512]);
        s.write(0, 1536, &[5; 512]).unwrap();
        s.sync().unwrap();
    }

    #[test]
    fn dead_after_zero_fails_everything() {
        let s = FaultStore::new(geo());
        s.set_faults(FaultConfig { dead_after: Some(0), ..Default::default() });
        let mut buf = [0; 16];
        assert!(s.read(0, 0, &mut buf).is_err());
        s.power_cut(CrashMode::DropUnsynced, 0);
        s.read(0, 0, &mut buf).unwrap();
    }

    #[test]
    fn flip_on_read() {
        let seed = zlogfs_testkit::seed("fault store");
        let s = FaultStore::new(geo());
        let d = pattern(6, 4096);
        s.write(4, 0, &d).unwrap();
        s.sync().unwrap();
        s.set_faults(FaultConfig { flip_on_read: Some((2, seed)), ..Default::default() });
        assert_eq!(read(&s, 4, 0, 4096), d);
        let bad = read(&s, 4, 0, 4096);
        let flipped: u32 = bad.iter().zip(&d).map(|(a, b)| (a ^ b).count_ones()).sum();
        assert_eq!(flipped, 1);
        assert_eq!(read(&s, 4, 0, 4096), d);
        assert_eq!(s.read_durable(Target::Segment(4), 0, 4096), d);

        // Meta reads count too.
        s.set_faults(FaultConfig { flip_on_read: Some((1, seed)), ..Default::default() });
        let mut m = [0; META_SLOT_SIZE];
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert_eq!(m.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
    }

    #[test]
    fn fork_is_independent() {
        let s = FaultStore::new(geo());
        s.write(0, 0, &[1; 512]).unwrap();
        s.sync().unwrap();
        s.write(0, 512, &[2; 512]).unwrap();
        s.set_faults(FaultConfig { fail_at: Some(1), ..Default::default() });
        let f = s.fork();
        // Faults are cleared in the fork, still set in the original.
        assert_eq!(read(&f, 0, 512, 512), vec![2; 512]);
        assert!(s.read(0, 0, &mut [0; 1]).is_err());
        s.power_cut(CrashMode::DropUnsynced, 0);
        assert_eq!(read(&s, 0, 512, 512), vec![0; 512]);
        assert_eq!(read(&f, 0, 512, 512), vec![2; 512]);
        f.write(0, 1024, &[3; 512]).unwrap();
        f.sync().unwrap();
        assert_eq!(f.read_durable(Target::Segment(0), 0, 1536), [[1; 512], [2; 512], [3; 512]].concat());
        assert_eq!(s.read_durable(Target::Segment(0), 1024, 512), vec![0; 512]);
        s.write(0, 0, &[9; 512]).unwrap();
        assert_eq!(read(&f, 0, 0, 512), vec![1; 512]);
    }

    #[test]
    fn corrupt_durable_flips_one_bit() {
        let s = FaultStore::new(geo());
        s.write(2, 0, &[0; 1024]).unwrap();
        s.write_meta(MetaSlot::Super, &[0; META_SLOT_SIZE]).unwrap();
        s.sync().unwrap();
        s.corrupt_durable(Target::Segment(2), 700, 3);
        assert_eq!(s.read_durable(Target::Segment(2), 700, 1), vec![8]);
        assert_eq!(read(&s, 2, 700, 1), vec![8]);
        s.corrupt_durable(Target::Meta(MetaSlot::Super), 4095, 7);
        let mut m = [0; META_SLOT_SIZE];
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert_eq!(m[4095], 0x80);
        // Survives a power cut.
        s.power_cut(CrashMode::DropUnsynced, 0);
        assert_eq!(read(&s, 2, 700, 1), vec![8]);
    }

    #[test]
    fn written_segments_and_bounds() {
        let s = FaultStore::new(geo());
        s.write(3, 0, &[1; 1000]).unwrap();
        s.write(3, 4096, &[1; 10]).unwrap();
        s.write(1, 512, &[1; 512]).unwrap();
        s.power_cut(CrashMode::DropUnsynced, 0);
        assert_eq!(s.written_segments(), vec![(1, 1024), (3, 4106)]);
        let e = s.write(64, 0, &[1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = s.read(0, SEG - 1, &mut [0; 2]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(s.op_count(), 0, "bounds errors are not counted");
        s.discard(63).unwrap();
        assert!(s.discard(64).is_err());
    }

    /// Forks share segments copy-on-write (the crash tests make thousands):
    /// a write to one fork must not show in its siblings or its parent.
    /// (How cheap forking is, is not asserted here: tests check behaviour.)
    #[test]
    fn many_forks_copy_on_write() {
        let s = FaultStore::new(geo());
        for j in 0..64u32 {
            s.write(j, 0, &vec![j as u8; SEG as usize]).unwrap();
        }
        s.sync().unwrap();
        let forks: Vec<FaultStore> = (0..200).map(|_| s.fork()).collect();
        forks[7].write(5, 0, &[0xee; 512]).unwrap();
        assert_eq!(read(&forks[199], 63, 0, 4), vec![63; 4]);
        assert_eq!(read(&forks[7], 5, 0, 4), vec![0xee; 4]);
        assert_eq!(read(&forks[8], 5, 0, 4), vec![5; 4]);
        assert_eq!(read(&s, 5, 0, 4), vec![5; 4]);
    }
}
