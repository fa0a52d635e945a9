//! fsck and usage accounting: whole-image scans of the records.

use std::collections::{BTreeMap, HashMap, HashSet};

use zlogfs_engine::codec::{encode, raw_reason, CodecId, CodecSpec};
use zlogfs_engine::log::format::BlockAddr;

use crate::error::Result;
use crate::keys::*;
use crate::namespace::{check_name, name_str};
use crate::Fs;

/// What [`Fs::check`] found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Every inconsistency, one line each (empty: clean).
    pub problems: Vec<String>,
    /// Inodes.
    pub inodes: u64,
    /// Directory entries.
    pub dirents: u64,
    /// Stored chunks.
    pub extents: u64,
    /// Data blocks read and verified.
    pub blocks: u64,
    /// Stored bytes of those blocks.
    pub block_bytes: u64,
    /// Xattrs.
    pub xattrs: u64,
    /// Inodes waiting in the orphan list.
    pub orphans: u64,
    /// Segments whose usage counts more than their live blocks hold, and
    /// by how many bytes: space a crash or a failed operation left counted
    /// (FORMAT.md §7), which the cleaner gives back when it cleans the
    /// segment. Not a problem for the file system's data; without a crash
    /// or a failed write, drift.
    pub leaked: Vec<(u32, u64)>,
}

impl CheckReport {
    /// Bytes of [`CheckReport::leaked`].
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked.iter().map(|l| l.1).sum()
    }
}

/// Logical and stored bytes of a tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeUsage {
    /// Regular files.
    pub files: u64,
    /// Directories (the top one included).
    pub dirs: u64,
    /// Other inodes.
    pub others: u64,
    /// Sum of file sizes.
    pub logical: u64,
    /// Logical bytes not in holes.
    pub allocated: u64,
    /// Stored bytes of the data (shared blocks split by share).
    pub physical: u64,
}

/// Codec use: blocks, logical bytes and stored bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodecUse {
    /// Data blocks.
    pub blocks: u64,
    /// Decompressed bytes.
    pub raw: u64,
    /// Stored bytes (with headers).
    pub stored: u64,
}

/// Whole-image usage for `zlogfs stats`.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// The tree from the root.
    pub tree: TreeUsage,
    /// Inodes in the index.
    pub inodes: u64,
    /// Data blocks by codec name ("zstd:3", "raw:no-gain", ...).
    pub codecs: BTreeMap<String, CodecUse>,
    /// Bytes of file data inline in the index.
    pub inline_bytes: u64,
    /// Chunks stored with patches (small overwrites kept beside them).
    pub patched_chunks: u64,
    /// Of those, chunks whose patches replace all of them: their bases
    /// are gone (the cleaner stored what showed of them as patches).
    pub bases_gone: u64,
    /// Stored bytes of those patches.
    pub patch_bytes: u64,
    /// Stored bytes of patched chunks' bases that their patches replace,
    /// released from the segments' live counts (dead to the cleaner).
    pub patch_released: u64,
    /// Inode records (keys and values) before compression.
    pub inode_bytes_raw: u64,
    /// Inode records compressed as the index stores them (16 KiB blocks,
    /// the index codec).
    pub inode_bytes_compressed: u64,
    /// (uid, gid, mode) triples.
    pub triples: u64,
    /// Lifetime bytes written by users and to the device.
    pub counters: Counters,
}

/// A path of inode `ino` from the names fsck gathered ("inode N" when it
/// has none, an orphan).
fn path_of(names: &HashMap<Ino, (Ino, Vec<u8>)>, ino: Ino) -> String {
    let mut parts = Vec::new();
    let mut cur = ino;
    while cur != ROOT && parts.len() < 4096 {
        match names.get(&cur) {
            Some((p, n)) => {
                parts.push(name_str(n));
                cur = *p;
            }
            None => return format!("inode {ino}"),
        }
    }
    parts.reverse();
    format!("/{}", parts.join("/"))
}

impl Fs {
    /// Verify every checksum and cross-reference. Problems are collected,
    /// not raised; an error means the scan itself could not go on.
    pub fn check(&self, progress: &dyn Fn(u64, u64)) -> Result<CheckReport> {
        let mut st = self.st();
        st.commit()?;
        let mut rep = CheckReport::default();
        let cs = st.cs();
        for d in st.eng.damage() {
            rep.problems.push(format!("worked around at open: {d} (zlogfs fsck --repair mends it)"));
        }
        // Damaged index blocks first: the records in them cannot be read,
        // and the checks below, which read every record, would stop at
        // the first. Name what they hold, and check nothing more.
        let damaged = st.eng.verify_runs();
        if !damaged.is_empty() {
            for d in damaged {
                rep.problems.push(format!(
                    "index run {}, block {}, holding the records from {} to {}: {}",
                    d.run,
                    d.addr,
                    describe_key(&d.from),
                    describe_key(&d.to),
                    d.error
                ));
            }
            rep.problems.push(
                "the records in damaged index blocks cannot be read: the other checks are skipped \
                 (zlogfs export copies out what can be read)"
                    .into(),
            );
            return Ok(rep);
        }
        let bad = |rep: &mut CheckReport, s: String| {
            if rep.problems.len() < 10_000 {
                rep.problems.push(s);
            }
        };
        // Inodes.
        let mut inodes: HashMap<Ino, Inode> = HashMap::new();
        let (lo, hi) = inodes_range();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            let Some(ino) = parse_inode_key(&k) else {
                bad(&mut rep, format!("malformed inode key {k:02x?}"));
                continue;
            };
            match Inode::decode(ino, &v, st.group.cfg().base_sec, |id| st.group.triple(id)) {
                Ok(i) => {
                    if ino >= st.group.cfg().next_ino {
                        bad(
                            &mut rep,
                            format!(
                                "inode {ino} is not below the next inode number {}",
                                st.group.cfg().next_ino
                            ),
                        );
                    }
                    inodes.insert(ino, i);
                }
                Err(e) => bad(&mut rep, format!("inode {ino}: {e}")),
            }
        }
        rep.inodes = inodes.len() as u64;
        if !inodes.get(&ROOT).is_some_and(|r| r.kind() == Kind::Dir) {
            bad(&mut rep, "the root directory is missing or not a directory".into());
        }
        // Orphans.
        let mut orphans = HashSet::new();
        let (lo, hi) = orphans_range();
        for (k, _) in st.scan(&lo, &hi, usize::MAX)? {
            if let Some(i) = parse_orphan_key(&k) {
                orphans.insert(i);
            }
        }
        rep.orphans = orphans.len() as u64;
        // Directory entries.
        let mut links: HashMap<Ino, u32> = HashMap::new();
        let mut subdirs: HashMap<Ino, u32> = HashMap::new();
        let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
        // A name of each inode, to say which file a damaged block holds.
        let mut names: HashMap<Ino, (Ino, Vec<u8>)> = HashMap::new();
        let (lo, hi) = all_dirents_range();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            rep.dirents += 1;
            let Some((parent, name)) = parse_dirent_key(&k) else {
                bad(&mut rep, format!("malformed directory entry key {k:02x?}"));
                continue;
            };
            let nm = name_str(name);
            if let Err(e) = check_name(name) {
                bad(&mut rep, format!("directory {parent}: entry {nm:?}: {e}"));
            }
            match inodes.get(&parent) {
                Some(p) if p.kind() == Kind::Dir => {}
                _ => bad(&mut rep, format!("entry {nm:?} lies in {parent}, which is not a directory")),
            }
            let (child, kind) = match decode_dirent(&v) {
                Ok(x) => x,
                Err(e) => {
                    bad(&mut rep, format!("directory {parent}: entry {nm:?}: {e}"));
                    continue;
                }
            };
            match inodes.get(&child) {
                None => {
                    bad(&mut rep, format!("directory {parent}: entry {nm:?} points at missing inode {child}"))
                }
                Some(c) => {
                    if c.kind() != kind {
                        bad(
                            &mut rep,
                            format!(
                                "directory {parent}: entry {nm:?} says {kind:?}, inode {child} is {:?}",
                                c.kind()
                            ),
                        );
                    }
                    if c.kind() == Kind::Dir {
                        *subdirs.entry(parent).or_default() += 1;
                        if c.parent != parent {
                            bad(
                                &mut rep,
                                format!(
                                    "directory {child} is in {parent} but names {} as its parent",
                                    c.parent
                                ),
                            );
                        }
                    }
                }
            }
            *links.entry(child).or_default() += 1;
            children.entry(parent).or_default().push(child);
            names.entry(child).or_insert_with(|| (parent, name.to_vec()));
        }
        // Link counts and reachability.
        let mut seen = HashSet::from([ROOT]);
        let mut queue = vec![ROOT];
        while let Some(d) = queue.pop() {
            for &c in children.get(&d).map(|v| v.as_slice()).unwrap_or(&[]) {
                if seen.insert(c) && inodes.get(&c).is_some_and(|i| i.kind() == Kind::Dir) {
                    queue.push(c);
                }
            }
        }
        let mut sorted: Vec<&Inode> = inodes.values().collect();
        sorted.sort_by_key(|i| i.ino);
        for i in &sorted {
            let n = links.get(&i.ino).copied().unwrap_or(0);
            if i.kind() == Kind::Dir {
                let want = 2 + subdirs.get(&i.ino).copied().unwrap_or(0);
                if i.nlink != want && !(orphans.contains(&i.ino) && i.nlink == 0) {
                    bad(
                        &mut rep,
                        format!("directory {} has link count {}, its entries make {want}", i.ino, i.nlink),
                    );
                }
                if i.ino != ROOT && n > 1 {
                    bad(&mut rep, format!("directory {} has {n} names", i.ino));
                }
            } else if i.nlink != n {
                bad(&mut rep, format!("inode {} has link count {}, but {n} entries name it", i.ino, i.nlink));
            }
            if !seen.contains(&i.ino) && !orphans.contains(&i.ino) {
                bad(&mut rep, format!("inode {} ({:?}) is not reachable from the root", i.ino, i.kind()));
            }
        }
        // Chunks and blocks.
        let mut alloc: HashMap<Ino, u64> = HashMap::new();
        let mut own_blocks: HashMap<BlockAddr, (Ino, u64, u32)> = HashMap::new();
        // Bytes of patched bases already released from their segments' counts.
        let mut released: HashMap<BlockAddr, u32> = HashMap::new();
        let mut shared_users: HashMap<BlockAddr, Vec<(Ino, u64, u32, u32)>> = HashMap::new();
        let mut reserved = 0u64;
        let (lo, hi) = all_extents_range();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            rep.extents += 1;
            let Some((ino, idx)) = parse_extent_key(&k) else {
                bad(&mut rep, format!("malformed chunk key {k:02x?}"));
                continue;
            };
            let e = match Extent::decode(&v, &format!("chunk {idx} of inode {ino}")) {
                Ok(e) => e,
                Err(e) => {
                    bad(&mut rep, e.to_string());
                    continue;
                }
            };
            if let Extent::Reserved(n) = e {
                reserved += u64::from(n);
            }
            match inodes.get(&ino) {
                // A reservation may lie past the size (fallocate's KEEP_SIZE).
                Some(i) if matches!(i.kind(), Kind::File) && matches!(e, Extent::Reserved(_)) => {
                    if e.len() > cs {
                        bad(&mut rep, format!("chunk {idx} of inode {ino} reserves {} bytes", e.len()));
                    }
                }
                Some(i) if matches!(i.kind(), Kind::File | Kind::Symlink) => {
                    let start = idx.saturating_mul(cs);
                    if start >= i.size || e.len() > cs || e.len() > i.size - start {
                        bad(
                            &mut rep,
                            format!(
                                "chunk {idx} of inode {ino} ({} bytes) lies past its size {}",
                                e.len(),
                                i.size
                            ),
                        );
                    }
                }
                _ => bad(&mut rep, format!("chunk {idx} belongs to inode {ino}, which is not a file")),
            }
            *alloc.entry(ino).or_default() += e.len();
            if let Extent::Patched { base, freed, .. } = &e {
                if let (Extent::Own(a, _), 1..) = (&**base, *freed) {
                    released.insert(*a, *freed);
                }
            }
            let parts = e.parts();
            // Patches of several blocks of a chunk may share a block, but
            // not with the chunk's base or at the same place.
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
                bad(&mut rep, format!("chunk {idx} of inode {ino} has two parts in one place"));
            }
            for p in parts {
                match *p {
                    Extent::Own(a, len) => {
                        if let Some((pi, pc, _)) = own_blocks.insert(a, (ino, idx, len)) {
                            bad(
                                &mut rep,
                                format!("block {a} is owned by chunk {idx} of {ino} and chunk {pc} of {pi}"),
                            );
                        }
                    }
                    Extent::Shared { addr, off, len, .. } => {
                        shared_users.entry(addr).or_default().push((ino, idx, off, len));
                    }
                    _ => {}
                }
            }
        }
        if reserved != st.group.counters().reserved {
            bad(
                &mut rep,
                format!(
                    "chunks reserve {reserved} bytes, the counters {} (free space is off by the difference)",
                    st.group.counters().reserved
                ),
            );
        }
        for i in &sorted {
            let a = alloc.get(&i.ino).copied().unwrap_or(0);
            if i.alloc != a {
                bad(
                    &mut rep,
                    format!("inode {} counts {} allocated bytes, its chunks hold {a}", i.ino, i.alloc),
                );
            }
        }
        // Shared-block reference lists.
        let mut listed: HashSet<BlockAddr> = HashSet::new();
        let (lo, hi) = all_shared_range();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            let Some(a) = parse_shared_key(&k) else {
                bad(&mut rep, format!("malformed shared-block key {k:02x?}"));
                continue;
            };
            listed.insert(a);
            let (mut refs, rel) = match decode_refs(&v) {
                Ok(r) => r,
                Err(e) => {
                    bad(&mut rep, format!("block {a}: {e}"));
                    continue;
                }
            };
            if rel >= a.len {
                bad(
                    &mut rep,
                    format!("block {a}: {rel} of its {} bytes released while chunks use it", a.len),
                );
            } else if rel > 0 {
                released.insert(a, rel);
            }
            let mut users: Vec<(Ino, u64)> =
                shared_users.get(&a).map(|u| u.iter().map(|x| (x.0, x.1)).collect()).unwrap_or_default();
            refs.sort_unstable();
            users.sort_unstable();
            if refs != users {
                bad(
                    &mut rep,
                    format!(
                        "block {a}: its reference list {refs:?} differs from the chunks using it {users:?}"
                    ),
                );
            }
            if own_blocks.contains_key(&a) {
                bad(&mut rep, format!("block {a} is both shared and owned by one chunk"));
            }
        }
        for a in shared_users.keys() {
            if !listed.contains(a) {
                bad(&mut rep, format!("block {a} is shared by chunks but has no reference list"));
            }
        }
        // Read every block: checksums and lengths.
        let mut blocks: Vec<(BlockAddr, bool, u32)> = own_blocks.keys().map(|a| (*a, true, 0)).collect();
        blocks.extend(
            shared_users.iter().map(|(a, u)| (*a, false, u.iter().map(|x| x.2 + x.3).max().unwrap_or(0))),
        );
        blocks.sort_by_key(|b| (b.0.seg, b.0.offset));
        let total: u64 = blocks.iter().map(|b| u64::from(b.0.len)).sum();
        let mut per_seg: HashMap<u32, u64> = HashMap::new();
        for (a, own, need) in &blocks {
            rep.blocks += 1;
            rep.block_bytes += u64::from(a.len);
            *per_seg.entry(a.seg).or_default() += u64::from(a.len - released.get(a).copied().unwrap_or(0));
            progress(rep.block_bytes, total);
            match st.eng.read_block(*a) {
                Ok(raw) => {
                    if *own {
                        let (ino, idx, want) = own_blocks[a];
                        if raw.len() as u64 != u64::from(want) {
                            bad(
                                &mut rep,
                                format!(
                                    "block {a} holds {} bytes, chunk {idx} of inode {ino} says {want}",
                                    raw.len()
                                ),
                            );
                        }
                    } else if (raw.len() as u64) < u64::from(*need) {
                        bad(&mut rep, format!("block {a} holds {} bytes, its pieces need {need}", raw.len()));
                    }
                }
                Err(e) => {
                    let users: Vec<(Ino, u64)> = if *own {
                        own_blocks.get(a).map(|&(i, c, _)| vec![(i, c)]).unwrap_or_default()
                    } else {
                        shared_users
                            .get(a)
                            .map(|u| u.iter().map(|x| (x.0, x.1)).collect())
                            .unwrap_or_default()
                    };
                    let files: Vec<String> = users
                        .iter()
                        .map(|&(i, c)| {
                            let at = c * cs;
                            format!("{} (bytes {at}..{})", path_of(&names, i), at + cs)
                        })
                        .collect();
                    bad(&mut rep, format!("block {a}: {e}; it holds data of {}", files.join(", ")))
                }
            }
        }
        // Segment usage must be exactly the live data blocks and the
        // engine's own live blocks. Below, the cleaner could free a
        // segment still in use; above, space is counted that nothing
        // holds: a leak, which a crash or a failed operation may leave
        // (FORMAT.md §7) and the cleaner drops, but which nothing else
        // should.
        for (seg, (u, own)) in st.eng.usage_check()?.into_iter().enumerate() {
            let data = per_seg.get(&(seg as u32)).copied().unwrap_or(0);
            let (live, want) = (u64::from(u.live), data + own);
            if live < want {
                bad(
                    &mut rep,
                    format!(
                        "segment {seg} accounts {live} live bytes but holds {data} bytes of live data \
                         blocks and {own} of the engine's"
                    ),
                );
            } else if live > want {
                rep.leaked.push((seg as u32, live - want));
            }
        }
        // Xattrs.
        let (lo, hi) = (vec![0x40], vec![0x41]);
        for (k, _) in st.scan(&lo, &hi, usize::MAX)? {
            rep.xattrs += 1;
            match parse_xattr_key(&k) {
                Some((ino, _)) if inodes.contains_key(&ino) => {}
                Some((ino, n)) => {
                    bad(&mut rep, format!("xattr {:?} belongs to missing inode {ino}", name_str(n)))
                }
                None => bad(&mut rep, format!("malformed xattr key {k:02x?}")),
            }
        }
        Ok(rep)
    }

    /// Logical and stored bytes of the tree under `ino`.
    pub fn du(&self, ino: Ino) -> Result<TreeUsage> {
        let st = self.st();
        let mut u = TreeUsage::default();
        let mut seen = HashSet::new();
        let mut stack = vec![ino];
        while let Some(i) = stack.pop() {
            if !seen.insert(i) {
                continue;
            }
            let node = st.inode(i)?;
            match node.kind() {
                Kind::Dir => {
                    u.dirs += 1;
                    let (lo, hi) = dirents_range(i);
                    for (_, v) in st.scan(&lo, &hi, usize::MAX)? {
                        stack.push(decode_dirent(&v)?.0);
                    }
                }
                k => {
                    if k == Kind::File {
                        u.files += 1;
                        u.logical += node.size;
                    } else {
                        u.others += 1;
                    }
                    u.allocated += node.alloc;
                    u.physical += st.physical(i)?;
                }
            }
        }
        Ok(u)
    }

    /// Whole-image usage (reads every data block's header).
    pub fn usage(&self) -> Result<Usage> {
        let tree = self.du(ROOT)?;
        let mut st = self.st();
        st.commit()?;
        let mut u = Usage {
            tree,
            triples: st.group.triple_count() as u64,
            counters: *st.group.counters(),
            ..Usage::default()
        };
        let (lo, hi) = inodes_range();
        let mut block = Vec::new();
        let spec = CodecSpec::new(CodecId::Zstd, 3);
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            u.inodes += 1;
            u.inode_bytes_raw += (k.len() + v.len()) as u64;
            block.extend_from_slice(&k);
            block.extend_from_slice(&v);
            if block.len() >= 16 << 10 {
                u.inode_bytes_compressed += encode(spec, &block).data.len() as u64;
                block.clear();
            }
        }
        if !block.is_empty() {
            u.inode_bytes_compressed += encode(spec, &block).data.len() as u64;
        }
        let mut blocks: HashSet<BlockAddr> = HashSet::new();
        let (lo, hi) = all_extents_range();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            let e = Extent::decode(&v, &format!("chunk {k:02x?}"))?;
            if let Extent::Patched { base, patches, freed } = &e {
                u.patched_chunks += 1;
                u.bases_gone += u64::from(matches!(**base, Extent::Gone(_)));
                u.patch_released += u64::from(*freed);
                u.patch_bytes += patches.iter().map(|p| p.piece.phys()).sum::<u64>();
            }
            for p in e.parts() {
                match p {
                    Extent::Inline(b) => u.inline_bytes += b.len() as u64,
                    p => blocks.extend(p.addr()),
                }
            }
        }
        let mut sorted: Vec<BlockAddr> = blocks.into_iter().collect();
        sorted.sort_by_key(|a| (a.seg, a.offset));
        for a in sorted {
            let h = st.eng.block_header(a)?;
            let name = match CodecId::from_u8(h.codec) {
                Some(CodecId::None) if h.raw_reason & raw_reason::PROBE != 0 => {
                    "raw (looked incompressible)".into()
                }
                Some(CodecId::None) if h.raw_reason & raw_reason::NO_GAIN != 0 => "raw (no gain)".into(),
                Some(CodecId::None) => "none".into(),
                Some(c) => CodecSpec::new(c, h.level).to_string(),
                None => format!("unknown codec {}", h.codec),
            };
            let e = u.codecs.entry(name).or_default();
            e.blocks += 1;
            e.raw += u64::from(h.raw_len);
            e.stored += u64::from(a.len);
        }
        Ok(u)
    }
}
