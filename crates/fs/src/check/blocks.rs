//! File data: chunks, the blocks they use, shared blocks' reference
//! lists, and each segment's usage.

use std::collections::{HashMap, HashSet};

use zlogfs_engine::BlockAddr;

use super::*;
use crate::error::Result;

impl<'a> Checker<'a> {
    /// Chunk records of the span's files: they decode, lie within their
    /// file and add up to its `alloc`; their reservations are summed for
    /// [`Checker::check_reserved`], their blocks counted by segment (and
    /// kept while the maps fit).
    pub(super) fn chunks(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, ino_span(ByIno::Extents, self.span.0, self.span.1));
        st.for_each(&lo, &hi, |k, v| {
            self.rep.extents += 1;
            let Some((ino, idx)) = parse_extent_key(k) else {
                self.bad(format!("malformed chunk key {k:02x?}"));
                return Ok(());
            };
            match Extent::decode(v, &format!("chunk {idx} of inode {ino}")) {
                Ok(e) => {
                    if let Extent::Reserved(n) = e {
                        self.reserved += u64::from(n);
                    }
                    self.chunk(ino, idx, &e);
                }
                Err(e) => self.bad(e.to_string()),
            }
            Ok(())
        })?;
        for i in 0..self.nodes.len() {
            let Node { ino, alloc, chunks: a, .. } = self.nodes[i];
            if alloc != a {
                self.bad(format!("inode {ino} counts {alloc} allocated bytes, its chunks hold {a}"));
            }
        }
        Ok(())
    }

    /// The chunks' reservations add up to the counters'.
    pub(super) fn check_reserved(&mut self) {
        let counted = self.st.group.counters().reserved;
        if self.reserved != counted {
            self.bad(format!(
                "chunks reserve {} bytes, the counters {counted} (free space is off by the difference)",
                self.reserved
            ));
        }
    }

    /// The chunk size of file `ino` (read from the index when its span's
    /// table is not held).
    pub(super) fn cs_of(&self, ino: Ino) -> u64 {
        let own = match self.node(ino) {
            Some(n) => (n.chunk != 0).then_some(n.chunk),
            None => self.st.inode(ino).ok().and_then(|i| i.chunk),
        };
        own.map_or(self.cs, u64::from)
    }

    pub(super) fn chunk(&mut self, ino: Ino, idx: u64, e: &Extent) {
        let cs = self.cs_of(ino);
        match self.node(ino).map(|n| (n.kind, n.size)) {
            // A reservation may lie past the size (fallocate's KEEP_SIZE).
            Some((Kind::File, _)) if matches!(e, Extent::Reserved(_)) => {
                if e.len() > cs {
                    self.bad(format!("chunk {idx} of inode {ino} reserves {} bytes", e.len()));
                }
            }
            Some((Kind::File | Kind::Symlink, size)) => {
                let start = idx.saturating_mul(cs);
                if start >= size || e.len() > cs || e.len() > size - start {
                    self.bad(format!(
                        "chunk {idx} of inode {ino} ({} bytes) lies past its size {size}",
                        e.len()
                    ));
                }
            }
            _ => self.bad(format!("chunk {idx} belongs to inode {ino}, which is not a file")),
        }
        if let Some(n) = self.node_mut(ino) {
            n.chunks += e.len();
        }
        let parts = e.parts();
        self.chunk_parts(ino, idx, &parts);
        for p in &parts {
            if let Some(a) = p.addr() {
                *self.parts_per_seg.entry(a.seg).or_default() += 1;
            }
        }
        if self.gathering {
            self.keep_parts(ino, idx, e, &parts);
            if self.kept > self.memory / 2 / PART_BYTES {
                // Past half the memory: the block passes gather by span.
                self.gathering = false;
                self.forget_blocks();
            }
        }
    }

    /// Patches of several blocks of a chunk may share a block, but not
    /// with the chunk's base or at the same place.
    pub(super) fn chunk_parts(&mut self, ino: Ino, idx: u64, parts: &[&Extent]) {
        let mut places: Vec<(BlockAddr, u32)> = parts
            .iter()
            .filter_map(|p| match p {
                Extent::Own(a, _) => Some((*a, 0)),
                Extent::Shared { addr, off, .. } => Some((*addr, *off)),
                _ => None,
            })
            .collect();
        places.sort_by_key(|(a, o)| (a.seg, a.offset, *o));
        let base_addr = parts.first().and_then(|b| b.addr());
        if places.windows(2).any(|w| w[0] == w[1])
            || base_addr.is_some_and(|b| parts[1..].iter().any(|p| p.addr() == Some(b)))
        {
            self.bad(format!("chunk {idx} of inode {ino} has two parts in one place"));
        }
    }

    /// Put the parts of a chunk that lie in the segments being checked in
    /// the block maps: who owns or shares each block, what is released.
    pub(super) fn keep_parts(&mut self, ino: Ino, idx: u64, e: &Extent, parts: &[&Extent]) {
        if let Extent::Patched { base, freed, .. } = e {
            if let (Extent::Own(a, _), 1..) = (&**base, *freed) {
                if in_span(a.seg, self.segs) {
                    self.released.insert(*a, *freed);
                }
            }
        }
        for p in parts {
            match **p {
                Extent::Own(a, len) if in_span(a.seg, self.segs) => {
                    self.kept += 1;
                    if let Some((pi, pc, _)) = self.own_blocks.insert(a, (ino, idx, len)) {
                        self.conflicts.push(format!(
                            "block {a} is owned by chunk {idx} of {ino} and chunk {pc} of {pi}"
                        ));
                    }
                }
                Extent::Shared { addr, off, len, .. } if in_span(addr.seg, self.segs) => {
                    self.kept += 1;
                    self.shared_users.entry(addr).or_default().push((ino, idx, off, len));
                }
                _ => {}
            }
        }
    }

    pub(super) fn forget_blocks(&mut self) {
        self.own_blocks = HashMap::new();
        self.shared_users = HashMap::new();
        self.released = HashMap::new();
        self.conflicts = Vec::new();
        self.kept = 0;
    }

    /// Spans of segments whose block parts fit the memory.
    pub(super) fn seg_spans(&self) -> Vec<Span<u32>> {
        let cap = (self.memory / PART_BYTES).max(1);
        let mut spans = Vec::new();
        let (mut from, mut n) = (0, 0);
        for (&seg, &parts) in &self.parts_per_seg {
            if n > 0 && n + parts > cap {
                spans.push((from, Some(seg)));
                (from, n) = (seg, 0);
            }
            n += parts;
        }
        spans.push((from, None));
        spans
    }

    /// Fill the block maps for the segments being checked: a pass over
    /// every chunk record (the span passes said what is wrong with them).
    pub(super) fn gather(&mut self) -> Result<()> {
        self.forget_blocks();
        let (st, (lo, hi)) = (self.st, all_extents_range());
        st.for_each(&lo, &hi, |k, v| {
            let Some((ino, idx)) = parse_extent_key(k) else { return Ok(()) };
            if let Ok(e) = Extent::decode(v, "") {
                self.keep_parts(ino, idx, &e, &e.parts());
            }
            Ok(())
        })
    }

    /// The bytes of the blocks in the maps.
    pub(super) fn block_bytes(&self) -> u64 {
        let own = self.own_blocks.keys();
        own.chain(self.shared_users.keys()).map(|a| u64::from(a.len)).sum()
    }

    /// The bytes of data blocks the segments count live, for progress
    /// while the blocks of several spans are read.
    pub(super) fn block_bytes_estimate(&self) -> u64 {
        self.usage.iter().map(|(u, own)| u64::from(u.live).saturating_sub(*own)).sum()
    }

    /// The checks of the blocks in the maps: their reference lists and
    /// their contents; their live bytes added to `per_seg`.
    pub(super) fn block_span(
        &mut self,
        per_seg: &mut HashMap<u32, u64>,
        progress: &dyn Fn(u64, u64),
        total: u64,
    ) -> Result<()> {
        for c in std::mem::take(&mut self.conflicts) {
            self.bad(c);
        }
        self.shared_lists()?;
        self.blocks(per_seg, progress, total);
        self.forget_blocks();
        Ok(())
    }

    /// Each shared block's reference list names exactly the chunks that
    /// use it, and released no more than it holds.
    pub(super) fn shared_lists(&mut self) -> Result<()> {
        let mut listed: HashSet<BlockAddr> = HashSet::new();
        let (st, (lo, hi)) = (self.st, shared_span(self.segs.0, self.segs.1));
        st.for_each(&lo, &hi, |k, v| {
            let Some(a) = parse_shared_key(k) else {
                // Spans split the keys with no overlap: each is seen once.
                self.bad(format!("malformed shared-block key {k:02x?}"));
                return Ok(());
            };
            listed.insert(a);
            match decode_refs(v) {
                Ok((refs, rel)) => self.shared_list(a, refs, rel),
                Err(e) => self.bad(format!("block {a}: {e}")),
            }
            Ok(())
        })?;
        let unlisted: Vec<BlockAddr> =
            self.shared_users.keys().filter(|a| !listed.contains(a)).copied().collect();
        for a in unlisted {
            self.bad(format!("block {a} is shared by chunks but has no reference list"));
        }
        Ok(())
    }

    pub(super) fn shared_list(&mut self, a: BlockAddr, mut refs: Vec<(Ino, u64)>, rel: u32) {
        if rel >= a.len {
            self.bad(format!("block {a}: {rel} of its {} bytes released while chunks use it", a.len));
        } else if rel > 0 {
            self.released.insert(a, rel);
        }
        let mut users = self.users(a, false);
        refs.sort_unstable();
        users.sort_unstable();
        if refs != users {
            self.bad(format!(
                "block {a}: its reference list {refs:?} differs from the chunks using it {users:?}"
            ));
        }
        if self.own_blocks.contains_key(&a) {
            self.bad(format!("block {a} is both shared and owned by one chunk"));
        }
    }

    /// The chunks that use block `a` (`own`: as their own block).
    pub(super) fn users(&self, a: BlockAddr, own: bool) -> Vec<(Ino, u64)> {
        if own {
            self.own_blocks.get(&a).map(|&(i, c, _)| vec![(i, c)]).unwrap_or_default()
        } else {
            self.shared_users.get(&a).map(|u| u.iter().map(|x| (x.0, x.1)).collect()).unwrap_or_default()
        }
    }

    /// Read every data block in the maps: checksums and lengths; a
    /// damaged one is said with the files it holds data of. Adds the live
    /// bytes found to `per_seg`; `total`: the bytes of all spans, for
    /// progress.
    pub(super) fn blocks(
        &mut self,
        per_seg: &mut HashMap<u32, u64>,
        progress: &dyn Fn(u64, u64),
        total: u64,
    ) {
        let mut blocks: Vec<(BlockAddr, bool, u32)> = self.own_blocks.keys().map(|a| (*a, true, 0)).collect();
        blocks.extend(
            self.shared_users
                .iter()
                .map(|(a, u)| (*a, false, u.iter().map(|x| x.2 + x.3).max().unwrap_or(0))),
        );
        blocks.sort_by_key(|b| (b.0.seg, b.0.offset));
        for (a, own, need) in blocks {
            self.rep.blocks += 1;
            self.rep.block_bytes += u64::from(a.len);
            let released = self.released.get(&a).copied().unwrap_or(0);
            *per_seg.entry(a.seg).or_default() += u64::from(a.len - released);
            progress(self.rep.block_bytes, total.max(self.rep.block_bytes));
            match self.st.eng.read_block(a) {
                Ok(raw) if own => {
                    let (ino, idx, want) = self.own_blocks[&a];
                    if raw.len() as u64 != u64::from(want) {
                        let n = raw.len();
                        self.bad(format!(
                            "block {a} holds {n} bytes, chunk {idx} of inode {ino} says {want}"
                        ));
                    }
                }
                Ok(raw) if (raw.len() as u64) < u64::from(need) => {
                    self.bad(format!("block {a} holds {} bytes, its pieces need {need}", raw.len()))
                }
                Ok(_) => {}
                Err(e) => {
                    let files: Vec<String> = self
                        .users(a, own)
                        .iter()
                        .map(|&(i, c)| {
                            let cs = self.cs_of(i);
                            format!("{} (bytes {}..{})", path_of(self.st, i), c * cs, (c + 1) * cs)
                        })
                        .collect();
                    self.bad(format!("block {a}: {e}; it holds data of {}", files.join(", ")))
                }
            }
        }
    }

    /// Segment usage must be exactly the live data blocks (`per_seg`) and
    /// the engine's own live blocks. Below, the cleaner could free a
    /// segment still in use; above, space is counted that nothing holds:
    /// a leak, which a crash or a failed operation may leave (FORMAT.md
    /// §7) and the cleaner drops, but which nothing else should.
    pub(super) fn segment_usage(&mut self, per_seg: &HashMap<u32, u64>) -> Result<()> {
        for (seg, &(u, own)) in self.usage.iter().enumerate() {
            let data = per_seg.get(&(seg as u32)).copied().unwrap_or(0);
            let (live, want) = (u64::from(u.live), data + own);
            if live < want {
                self.bad(format!(
                    "segment {seg} accounts {live} live bytes but holds {data} bytes of live data \
                     blocks and {own} of the engine's"
                ));
            } else if live > want {
                self.rep.leaked.push((seg as u32, live - want));
            }
        }
        Ok(())
    }
}
