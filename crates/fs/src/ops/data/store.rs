//! Storing a group's buffers at commit, in three steps:
//!
//! 1. load ([`State::load_for_store`]): read each buffer's inode and stored
//!    chunk, plan patches ([`crate::ops::patch::plan`]), and make whole the
//!    partial buffers that will not be patches. Nothing changes; a failure
//!    hands every buffer back.
//! 2. plan ([`plan_store`], pure): all-zero chunks become holes, a small
//!    file's only chunk goes inline, small chunks and patches are packed
//!    together by codec, the rest get blocks of their own.
//! 3. write ([`State::write_store`]): the blocks, compressed in parallel
//!    (or compressed ahead already); a failure hands every buffer back
//!    ([`StorePlan::into_buffers`]). Then install
//!    ([`State::install_store`]): point the files at the blocks. A failure
//!    there leaves blocks no record points at, which the next open's usage
//!    rebuild counts as free; the buffers are gone, the engine usually
//!    latched (the error is the engine's).
//!
//! Placement on two devices: the journal, index runs, checkpoints, small
//! files, packs and patches go `Tier::Fast`, and the own chunks of files
//! above `Config::small_max` go `Tier::Bulk`. Below `demote_marks`' low
//! mark of free fast segments (`State::fast_low`), file data goes
//! `Tier::Bulk` too, so that the journal, runs and checkpoints keep a
//! place on the fast device. The cleaner places what it moves by the same
//! rule; `demote_if_fast_low` (worker.rs) cleans the fast device's oldest
//! segments with `demote` set, storing their file data again on the bulk
//! device.
//!
//! Volumes (files served over NBD): a file's own chunk size
//! (`Inode::chunk`; 16 KiB for `zlogfs nbd --create`) is what every data
//! path asks (`State::cs`). Its compression unit (`Inode::unit`; 64 KiB
//! for `--create`) groups the whole chunks a commit stores, consecutive
//! within one aligned unit, into one shared block (`pack_units`). Reads,
//! overwrites that release a chunk's share, and the cleaner need nothing
//! new for these blocks. Such chunks are not compressed ahead. Its cold
//! form (`Inode::cold`) is the unit and codec the cleaner's moves use when
//! `CleanOptions::cold` is set.

use std::collections::HashMap;

use zlogfs_engine::codec::CodecSpec;
use zlogfs_engine::engine::{BlockWrite, Room};
use zlogfs_engine::{BlockAddr, Tier};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::ops::patch::{self, replaced_share, visible};
use crate::state::buffers::{Buf, Chunks};
use crate::state::State;

/// A chunk (or the patch of one) about to be stored.
struct Piece {
    ino: Ino,
    idx: u64,
    /// The chunk's bytes, or the patch's.
    data: Vec<u8>,
    spec: CodecSpec,
    /// Length of the buffer, as counted in the inode's `alloc`.
    counted: usize,
    /// Logical length of the chunk once stored (for a patch, the chunk's,
    /// not the patch's).
    len: usize,
    /// For a patch: the chunk's runs of patch blocks it replaces.
    patch: Option<Vec<(u32, u32)>>,
    /// For a whole chunk: its buffer's stamp (see
    /// [`crate::state::buffers::Buffers::take_ahead`]).
    stamp: Option<u64>,
    /// The file's chunk size.
    chunk: u32,
    /// The device it goes to, of two.
    tier: Tier,
}

/// A buffer ready to be planned: what step 1 learnt of it.
struct Loaded {
    ino: Ino,
    idx: u64,
    buf: Buf,
    /// The file's size then.
    size: u64,
    spec: CodecSpec,
    /// Its device policy (None: by its size).
    tier: Option<TierPolicy>,
    /// Its compression unit (None: each chunk alone).
    unit: Option<u32>,
    /// The runs to store as patches, or None to store the chunk whole.
    plan: Option<Vec<(u32, u32)>>,
    /// The buffer was partial when loaded (completed since unless it
    /// becomes patches): its bytes are not those of its first stamp.
    was_partial: bool,
}

/// Small pieces packed into one block.
struct Pack {
    spec: CodecSpec,
    /// The device of two it goes to (its members').
    tier: Tier,
    raw: Vec<u8>,
    /// Indexes into [`StorePlan::pack`].
    members: Vec<usize>,
    /// Whole chunks of one compression unit, not small pieces.
    unit: bool,
}

/// What a commit stores, by how.
#[derive(Default)]
struct StorePlan {
    /// Chunks with a block of their own.
    own: Vec<Piece>,
    /// Small chunks and patches, in the order of `packs`' members.
    pack: Vec<Piece>,
    packs: Vec<Pack>,
    inline: Vec<Piece>,
    holes: Vec<Piece>,
    /// Buffers stored as patches, to hand back if the write fails.
    patched: HashMap<(Ino, u64), Buf>,
}

impl StorePlan {
    /// The buffers again, for a write that failed.
    fn into_buffers(self) -> Chunks {
        let StorePlan { own, pack, inline, holes, mut patched, .. } = self;
        let mut back = Chunks::new();
        for p in own.into_iter().chain(pack).chain(inline).chain(holes) {
            let b = match patched.remove(&(p.ino, p.idx)) {
                Some(b) => b,
                // Another patch of a chunk already put back.
                None if p.patch.is_some() => continue,
                None => Buf::new(p.data, None, false, p.chunk),
            };
            back.entry(p.ino).or_default().insert(p.idx, b);
        }
        back
    }
}

/// Storing failed: the error, and the buffers to put back when nothing
/// was placed yet.
struct StoreFailed {
    error: Error,
    back: Option<Chunks>,
}

/// Sizes the plan needs from the config record.
struct Layout {
    inline_max: u64,
    /// Files larger than this keep their own chunks on the bulk device
    /// of two (the rest of the image's data stays on the fast one).
    small_max: u64,
    /// Everything without a policy to the bulk device (moving data down).
    demote: bool,
    /// Small files without a policy go to the bulk device: the cleaner is
    /// moving data and the fast device is short of room (what it moves
    /// stays down rather than bounce back up to be moved down again), or
    /// the fast device is down to the segments kept for the metadata.
    fast_short: bool,
    pack_bytes: usize,
    /// The largest block (compression units are clipped to it).
    max_block: usize,
}

/// Step 2: sort the loaded buffers into pieces by how they are stored,
/// and pack the small ones.
fn plan_store(loaded: Vec<Loaded>, l: &Layout) -> StorePlan {
    let mut plan = StorePlan::default();
    let mut units = Vec::new();
    for c in loaded {
        let chunk = c.buf.chunk();
        let cs = u64::from(chunk);
        let (mut data, touched, partial, stamp) = c.buf.into_parts();
        let lim = c.size.saturating_sub(c.idx * cs).min(cs) as usize;
        let counted = data.len();
        data.truncate(lim);
        // With two devices, a large file's data goes to the bulk one
        // (its own chunks, packed tails and patches alike); small files'
        // stay on the fast one with the metadata.
        let tier = match c.tier {
            Some(TierPolicy::Fast) => Tier::Fast,
            Some(TierPolicy::Bulk) => Tier::Bulk,
            None if l.demote || c.size > l.small_max => Tier::Bulk,
            None if l.fast_short => Tier::Bulk,
            None => Tier::Fast,
        };
        if let Some(runs) = c.plan {
            plan_patches(&mut plan, (c.ino, c.idx, c.spec, chunk, tier), &data, counted, &runs);
            plan.patched.insert((c.ino, c.idx), Buf::new(data, touched, partial, chunk));
            continue;
        }
        debug_assert!(!partial, "chunk {} of inode {}: a partial buffer stored whole", c.idx, c.ino);
        let len = data.len();
        let stamp = (!c.was_partial).then_some(stamp);
        let zero = data.is_empty() || is_zero(&data);
        let p = Piece {
            ino: c.ino,
            idx: c.idx,
            data,
            spec: c.spec,
            counted,
            len,
            patch: None,
            stamp,
            chunk,
            tier,
        };
        if zero {
            plan.holes.push(p);
        } else if c.idx == 0 && c.size <= l.inline_max {
            plan.inline.push(p);
        } else if (p.data.len() as u64) < cs / 2 {
            plan.pack.push(p);
        } else if let Some(unit) = c.unit.map(|u| (u as usize).min(l.max_block)).filter(|&u| u > p.data.len())
        {
            units.push((p, unit));
        } else {
            plan.own.push(p);
        }
    }
    pack_small(&mut plan, l.pack_bytes);
    pack_units(&mut plan, units);
    plan
}

/// Compress whole chunks of files with a compression unit together: the
/// chunks of one unit of the file (`unit` bytes from a multiple of it)
/// stored in this commit one after another, of one codec and device,
/// share a block. A chunk alone gets a block of its own.
fn pack_units(plan: &mut StorePlan, mut units: Vec<(Piece, usize)>) {
    units.sort_by_key(|(p, _)| (p.ino, p.idx));
    let mut run: Vec<Piece> = Vec::new();
    for (p, unit) in units {
        let per = (unit as u64 / u64::from(p.chunk)).max(1);
        let joins = run.last().is_some_and(|l| {
            l.ino == p.ino && l.idx + 1 == p.idx && p.idx % per != 0 && l.spec == p.spec && l.tier == p.tier
        });
        if !joins {
            store_unit(plan, std::mem::take(&mut run));
        }
        run.push(p);
    }
    store_unit(plan, run);
}

/// One compression unit's chunks (consecutive, of one file) into a
/// shared block; one chunk into a block of its own.
fn store_unit(plan: &mut StorePlan, run: Vec<Piece>) {
    if run.len() < 2 {
        plan.own.extend(run);
        return;
    }
    let start = plan.pack.len();
    let mut raw = Vec::with_capacity(run.iter().map(|p| p.data.len()).sum());
    for p in &run {
        raw.extend_from_slice(&p.data);
    }
    plan.packs.push(Pack {
        spec: run[0].spec,
        tier: run[0].tier,
        raw,
        members: (start..start + run.len()).collect(),
        unit: true,
    });
    plan.pack.extend(run);
}

/// A patch per patch block of `runs`: a later write of a block hides a
/// whole patch, which is dropped and released, so no patch keeps bytes
/// that no longer show (they would count as live).
fn plan_patches(
    plan: &mut StorePlan,
    chunk: (Ino, u64, CodecSpec, u32, Tier),
    data: &[u8],
    counted: usize,
    runs: &[(u32, u32)],
) {
    let (ino, idx, spec, cs, tier) = chunk;
    let len = data.len();
    let mut counted = counted;
    for &(s, n) in runs {
        for b in s..s + n {
            let one = vec![(b, 1)];
            let Some((lo, hi)) = spans(&one, len as u64).next() else { continue };
            let bytes = data[lo as usize..hi as usize].to_vec();
            plan.pack.push(Piece {
                ino,
                idx,
                data: bytes,
                spec,
                counted,
                len,
                patch: Some(one),
                stamp: None,
                chunk: cs,
                tier,
            });
            // The chunk's count is settled once.
            counted = len;
        }
    }
}

/// Pack small chunks, by device and codec, in inode order (files created
/// together sit together), into blocks of up to `pack_bytes`.
fn pack_small(plan: &mut StorePlan, pack_bytes: usize) {
    plan.pack.sort_by_key(|p| (p.tier == Tier::Bulk, p.spec.id as u8, p.spec.level, p.ino, p.idx));
    for (n, p) in plan.pack.iter().enumerate() {
        let fits = plan.packs.last().is_some_and(|k| {
            k.spec == p.spec && k.tier == p.tier && k.raw.len() + p.data.len() <= pack_bytes
        });
        if !fits {
            plan.packs.push(Pack {
                spec: p.spec,
                tier: p.tier,
                raw: Vec::new(),
                members: Vec::new(),
                unit: false,
            });
        }
        if let Some(k) = plan.packs.last_mut() {
            k.raw.extend_from_slice(&p.data);
            k.members.push(n);
        }
    }
}

impl State {
    /// Compress and store the buffered chunks of the group, and point the
    /// files at them. On failure the buffers are kept (unless the blocks
    /// were written: see the module's docs).
    pub(crate) fn store_dirty(&mut self, room: Room) -> Result<()> {
        self.cache.moved();
        let chunks = self.bufs.take_all();
        let r = self.store_chunks(chunks, room);
        if !self.cleaning {
            // Every buffer was stored or put back with a new stamp; the
            // cleaner's rounds set writers' buffers aside, and leave their
            // blocks for when they are stored.
            self.bufs.clear_ahead();
        }
        r.map_err(|StoreFailed { error, back }| {
            if let Some(back) = back {
                self.bufs.restore(back);
            }
            error
        })
    }

    fn store_chunks(&mut self, chunks: Chunks, room: Room) -> std::result::Result<(), StoreFailed> {
        let loaded = self.load_for_store(chunks)?;
        let cfg = self.group.cfg();
        let layout = Layout {
            inline_max: u64::from(cfg.inline_max),
            small_max: cfg.small_max,
            // A round moving data down: all of it goes to the bulk device.
            demote: self.demoting,
            fast_short: if self.cleaning { self.fast_short() } else { self.fast_low() },
            pack_bytes: cfg.pack_bytes as usize,
            max_block: zlogfs_engine::max_block_raw(self.eng.superblock().geometry),
        };
        let plan = plan_store(loaded, &layout);
        let addrs = match self.write_store(&plan, room) {
            Ok(a) => a,
            Err(error) => return Err(StoreFailed { error, back: Some(plan.into_buffers()) }),
        };
        self.count_stored(&plan, &addrs);
        #[cfg(debug_assertions)]
        let inos: std::collections::BTreeSet<Ino> =
            plan.own.iter().chain(&plan.pack).chain(&plan.inline).chain(&plan.holes).map(|p| p.ino).collect();
        self.install_store(plan, &addrs).map_err(|error| StoreFailed { error, back: None })?;
        #[cfg(debug_assertions)]
        for ino in inos {
            if let Ok(i) = self.inode(ino) {
                self.debug_check_file(&i);
            }
        }
        Ok(())
    }

    /// Step 1, for every buffer, in inode order. The buffers of an inode
    /// deleted since they were written are dropped.
    fn load_for_store(&mut self, mut chunks: Chunks) -> std::result::Result<Vec<Loaded>, StoreFailed> {
        let mut inos: Vec<Ino> = chunks.keys().copied().collect();
        inos.sort_unstable();
        let mut out: Vec<Loaded> = Vec::new();
        for ino in inos {
            let i = match self.inode(ino) {
                Ok(i) => i,
                Err(Error::NotFound(_)) => {
                    chunks.remove(&ino);
                    continue;
                }
                Err(e) => return Err(hand_back(e, chunks, out)),
            };
            let Some(m) = chunks.remove(&ino) else { continue };
            // The cleaner moving a file stores it in its cold form.
            let (spec, unit) = match i.cold {
                Some(c) if self.moving_cold => (c.spec, Some(c.unit)),
                _ => (i.policy.unwrap_or(self.group.cfg().codec), i.unit),
            };
            let mut rest = m.into_iter();
            while let Some((idx, buf)) = rest.next() {
                let was_partial = buf.partial;
                let mut c =
                    Loaded { ino, idx, buf, size: i.size, spec, tier: i.tier, unit, plan: None, was_partial };
                let r = self.load_one(&mut c);
                out.push(c);
                if let Err(e) = r {
                    chunks.insert(ino, rest.collect());
                    return Err(hand_back(e, chunks, out));
                }
            }
        }
        Ok(out)
    }

    /// Plan one buffer's patches; complete a partial one that will not be
    /// patches.
    fn load_one(&mut self, c: &mut Loaded) -> Result<()> {
        let cs = u64::from(c.buf.chunk());
        let lim = c.size.saturating_sub(c.idx * cs).min(cs) as usize;
        let data = &c.buf.data()[..c.buf.data().len().min(lim)];
        // A partial buffer's zeros outside its blocks are not the chunk's:
        // it is never a hole.
        let zero = !c.buf.partial && is_zero(data);
        let len = data.len();
        c.plan = match &c.buf.touched {
            Some(t) if !zero => {
                // An unreadable record: store the chunk whole (its install
                // meets the error, as any chunk's would).
                let stored = self.stored_extent(c.ino, c.idx).ok().flatten();
                patch::plan(stored.as_ref(), len, t, cs, self.cleaning)
            }
            _ => None,
        };
        if c.buf.partial && c.plan.is_none() {
            self.complete_buf(c.ino, c.idx, &mut c.buf)?;
        }
        Ok(())
    }

    /// Step 3: write the blocks (own chunks, then packs); their addresses
    /// in that order.
    fn write_store(&mut self, plan: &StorePlan, room: Room) -> Result<Vec<BlockAddr>> {
        let ready: Vec<_> = plan
            .own
            .iter()
            .map(|p| p.stamp.and_then(|st| self.bufs.take_ahead(p.ino, p.idx, st, p.spec, p.data.len())))
            .collect();
        self.stats.ahead_used += ready.iter().filter(|r| r.is_some()).count() as u64;
        let mut reqs: Vec<BlockWrite> = plan
            .own
            .iter()
            .zip(ready)
            .map(|(p, ready)| BlockWrite {
                owner: p.ino,
                spec: p.spec,
                raw: &p.data[..],
                ready,
                tier: p.tier,
            })
            .collect();
        reqs.extend(plan.packs.iter().map(|k| BlockWrite::new(0, k.spec, &k.raw[..]).on(k.tier)));
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let addrs = self.eng.write_blocks(room, reqs)?;
        self.group.placed(&addrs, self.eng.seq() + 1);
        debug_assert_eq!(addrs.len(), plan.own.len() + plan.packs.len(), "an address per block");
        Ok(addrs)
    }

    fn count_stored(&mut self, plan: &StorePlan, addrs: &[BlockAddr]) {
        for (n, a) in addrs.iter().enumerate() {
            let b = u64::from(a.len);
            // Own chunks and units' blocks are whole chunks.
            let whole = match n.checked_sub(plan.own.len()) {
                None => true,
                Some(k) => plan.packs.get(k).is_some_and(|k| k.unit),
            };
            match (self.cleaning, whole) {
                (true, _) => self.stats.clean_stored += b,
                (false, true) => self.stats.whole_stored += b,
                (false, false) => self.stats.pack_stored += b,
            }
        }
    }

    /// Step 3, continued: point the files at the blocks at `addrs`.
    fn install_store(&mut self, plan: StorePlan, addrs: &[BlockAddr]) -> Result<()> {
        for p in plan.own.iter().chain(&plan.pack).chain(&plan.inline) {
            if p.counted > p.len {
                self.uncount(p.ino, (p.counted - p.len) as u64)?;
            }
        }
        let (own_addrs, pack_addrs) = addrs.split_at(plan.own.len().min(addrs.len()));
        for (p, a) in plan.own.iter().zip(own_addrs) {
            self.install(p.ino, p.idx, Extent::Own(*a, p.data.len() as u32))?;
            self.stats.chunk_bytes += p.data.len() as u64;
        }
        for (k, a) in plan.packs.iter().zip(pack_addrs) {
            self.install_pack(k, &plan.pack, *a)?;
        }
        for p in plan.inline {
            self.stats.chunk_bytes += p.data.len() as u64;
            self.stats.inline_chunks += 1;
            self.install(p.ino, p.idx, Extent::Inline(p.data))?;
        }
        for p in plan.holes {
            if let Some(e) = self.stored_extent(p.ino, p.idx)? {
                self.release(p.ino, p.idx, &e)?;
                self.del(extent_key(p.ino, p.idx));
            }
            self.stats.zero_chunks += 1;
            self.uncount(p.ino, p.counted as u64)?;
        }
        Ok(())
    }

    /// Point the members of pack `k`, written at `a`, at their pieces of
    /// it, and list them as the block's users.
    fn install_pack(&mut self, k: &Pack, pieces: &[Piece], a: BlockAddr) -> Result<()> {
        let refs: Vec<(Ino, u64)> = k.members.iter().map(|&n| (pieces[n].ino, pieces[n].idx)).collect();
        self.put(shared_key(a), encode_refs(&refs, 0));
        let mut off = 0u32;
        for &n in &k.members {
            let p = &pieces[n];
            let len = p.data.len() as u32;
            let phys = (u64::from(a.len) * u64::from(len)).div_ceil(k.raw.len().max(1) as u64) as u32;
            let piece = Extent::Shared { addr: a, off, len, phys };
            match &p.patch {
                Some(runs) => self.add_patch(p.ino, p.idx, runs.clone(), piece)?,
                None => self.install(p.ino, p.idx, piece)?,
            }
            off += len;
            self.stats.chunk_bytes += u64::from(len);
        }
        debug_assert_eq!(off as usize, k.raw.len(), "a pack's pieces fill it");
        self.stats.pack_blocks += u64::from(!k.unit);
        Ok(())
    }

    fn add_patch(&mut self, ino: Ino, idx: u64, runs: Vec<(u32, u32)>, piece: Extent) -> Result<()> {
        let (mut base, mut patches, mut freed) = match self.stored_extent(ino, idx)? {
            Some(Extent::Patched { base, patches, freed }) => (base, patches, freed),
            Some(e @ (Extent::Own(..) | Extent::Shared { .. })) => (Box::new(e), Vec::new(), 0),
            other => {
                return Err(Error::corrupt(
                    format!("chunk {idx} of inode {ino}"),
                    format!("a patch was made for it as stored, but it is now {other:?}"),
                ))
            }
        };
        patches.push(Patch { runs, piece });
        // Patches that newer ones hide entirely are dropped.
        let keep: Vec<Patch> = visible(&patches, &[]).into_iter().cloned().collect();
        for p in &patches {
            if !keep.contains(p) {
                self.release(ino, idx, &p.piece)?;
            }
        }
        patches = keep;
        let len = base.len();
        if covers_all(&patches, len.div_ceil(u64::from(PATCH_BLOCK)) as u32) {
            // Nothing of the base shows: release it (the rest of it, for an
            // own base) and keep the chunk as its patches.
            self.release_base(ino, idx, &base, freed)?;
            base = Box::new(Extent::Gone(len as u32));
            freed = 0;
        } else if let Extent::Own(a, len) = *base {
            let dead = replaced_share(&patches, a.len, len);
            if dead > freed {
                self.group.free(BlockAddr { len: dead - freed, ..a });
                freed = dead;
            }
        }
        self.group.mark_version(4);
        self.stats.patches += 1;
        self.put(extent_key(ino, idx), Extent::Patched { base, patches, freed }.encode());
        Ok(())
    }

    /// Take `n` bytes off an inode's allocated count.
    fn uncount(&mut self, ino: Ino, n: u64) -> Result<()> {
        let mut i = self.inode(ino)?;
        i.alloc = i.alloc.saturating_sub(n);
        self.save(&i);
        Ok(())
    }

    fn install(&mut self, ino: Ino, idx: u64, e: Extent) -> Result<()> {
        if let Some(old) = self.stored_extent(ino, idx)? {
            self.release(ino, idx, &old)?;
        }
        self.put(extent_key(ino, idx), e.encode());
        Ok(())
    }
}

/// `e`, with every buffer of `chunks` and `loaded` to hand back.
fn hand_back(error: Error, mut chunks: Chunks, loaded: Vec<Loaded>) -> StoreFailed {
    for c in loaded {
        chunks.entry(c.ino).or_default().insert(c.idx, c.buf);
    }
    StoreFailed { error, back: Some(chunks) }
}

/// True when every byte of `b` is zero.
pub(crate) fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    words.all(|w| u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) == 0)
        && words.remainder().iter().all(|&x| x == 0)
}
