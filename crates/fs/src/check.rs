//! fsck and usage accounting: whole-image scans of the records.

use std::collections::{BTreeMap, HashMap, HashSet};

use zlogfs_engine::codec::{encode, raw_reason, CodecId, CodecSpec};
use zlogfs_engine::BlockAddr;

use crate::error::Result;
use crate::keys::*;
use crate::namespace::{check_name, name_str};
use crate::state::State;
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

/// A block's users as fsck found them: the owning chunk (its length), or
/// the pieces of a shared block (offset and length of each).
type OwnBlocks = HashMap<BlockAddr, (Ino, u64, u32)>;
type SharedUsers = HashMap<BlockAddr, Vec<(Ino, u64, u32, u32)>>;

/// fsck's phases over one state, and what each gathers for the next.
struct Checker<'a> {
    st: &'a State,
    /// The image's chunk size (files without their own).
    cs: u64,
    rep: CheckReport,
    inodes: HashMap<Ino, Inode>,
    orphans: HashSet<Ino>,
    /// Names of each inode, subdirectories of each directory.
    links: HashMap<Ino, u32>,
    subdirs: HashMap<Ino, u32>,
    children: HashMap<Ino, Vec<Ino>>,
    /// A name of each inode, to say which file a damaged block holds.
    names: HashMap<Ino, (Ino, Vec<u8>)>,
    /// Bytes of each inode's chunks.
    alloc: HashMap<Ino, u64>,
    own_blocks: OwnBlocks,
    shared_users: SharedUsers,
    /// Bytes of blocks already released from their segments' counts
    /// (patched bases, shared blocks some users left).
    released: HashMap<BlockAddr, u32>,
}

impl Fs {
    /// Verify every checksum and cross-reference. Problems are collected,
    /// not raised; an error means the scan itself could not go on.
    pub fn check(&self, progress: &dyn Fn(u64, u64)) -> Result<CheckReport> {
        let mut st = self.st();
        st.commit()?;
        let mut c = Checker::new(&st);
        if c.damage() {
            return Ok(c.rep);
        }
        c.inodes()?;
        c.orphans()?;
        c.dirents()?;
        c.links();
        c.chunks()?;
        c.shared_lists()?;
        let mut per_seg = c.blocks(progress);
        c.held(&mut per_seg)?;
        c.segment_usage(&per_seg)?;
        c.xattrs()?;
        c.change_records()?;
        Ok(c.rep)
    }
}

/// A name of every inode, from a scan of every directory, to say which
/// files something concerns.
pub(crate) struct Names(HashMap<Ino, (Ino, Vec<u8>)>);

impl Names {
    /// Scan the tree.
    pub(crate) fn scan(st: &State) -> Result<Names> {
        let mut c = Checker::new(st);
        c.inodes()?;
        c.dirents()?;
        Ok(Names(c.names))
    }

    /// A path of `ino` ("inode N" when it had no name).
    pub(crate) fn path(&self, ino: Ino) -> String {
        path_of(&self.0, ino)
    }
}

impl<'a> Checker<'a> {
    fn new(st: &'a State) -> Self {
        Checker {
            st,
            cs: st.group.chunk_size(),
            rep: CheckReport::default(),
            inodes: HashMap::new(),
            orphans: HashSet::new(),
            links: HashMap::new(),
            subdirs: HashMap::new(),
            children: HashMap::new(),
            names: HashMap::new(),
            alloc: HashMap::new(),
            own_blocks: HashMap::new(),
            shared_users: HashMap::new(),
            released: HashMap::new(),
        }
    }

    fn bad(&mut self, s: String) {
        if self.rep.problems.len() < 10_000 {
            self.rep.problems.push(s);
        }
    }

    /// What the engine worked around at open, and damaged index blocks:
    /// the records in them cannot be read, and the phases after this,
    /// which read every record, would stop at the first. True when there
    /// are any (they are named, and nothing more is checked).
    fn damage(&mut self) -> bool {
        for d in self.st.eng.damage() {
            self.rep.problems.push(format!("worked around at open: {d} (zlogfs fsck --repair mends it)"));
        }
        let damaged = self.st.eng.verify_runs();
        if damaged.is_empty() {
            return false;
        }
        for d in damaged {
            self.rep.problems.push(format!(
                "index run {}, block {}, holding the records from {} to {}: {}",
                d.run,
                d.addr,
                describe_key(&d.from),
                describe_key(&d.to),
                d.error
            ));
        }
        self.rep.problems.push(
            "the records in damaged index blocks cannot be read: the other checks are skipped \
             (zlogfs export copies out what can be read)"
                .into(),
        );
        true
    }

    /// Inode records: they decode, lie below the next inode number, and
    /// the root is a directory.
    fn inodes(&mut self) -> Result<()> {
        let st = self.st;
        let (lo, hi) = inodes_range();
        let (base, next) = (st.group.cfg().base_sec, st.group.cfg().next_ino);
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            let Some(ino) = parse_inode_key(&k) else {
                self.bad(format!("malformed inode key {k:02x?}"));
                continue;
            };
            match Inode::decode(ino, &v, base, |id| st.group.triple(id)) {
                Ok(i) => {
                    if ino >= next {
                        self.bad(format!("inode {ino} is not below the next inode number {next}"));
                    }
                    if i.chunk.is_some_and(|c| c > st.group.cfg().chunk_size) {
                        let image = st.group.cfg().chunk_size;
                        self.bad(format!("inode {ino} has chunks larger than the image's ({image} bytes)"));
                    }
                    self.inodes.insert(ino, i);
                }
                Err(e) => self.bad(format!("inode {ino}: {e}")),
            }
        }
        self.rep.inodes = self.inodes.len() as u64;
        if !self.inodes.get(&ROOT).is_some_and(|r| r.kind() == Kind::Dir) {
            self.bad("the root directory is missing or not a directory".into());
        }
        Ok(())
    }

    fn orphans(&mut self) -> Result<()> {
        let (lo, hi) = orphans_range();
        for (k, _) in self.st.scan(&lo, &hi, usize::MAX)? {
            if let Some(i) = parse_orphan_key(&k) {
                self.orphans.insert(i);
            }
        }
        self.rep.orphans = self.orphans.len() as u64;
        Ok(())
    }

    /// Directory entries: valid names in directories, naming inodes of
    /// their kind; a subdirectory names its directory as its parent.
    fn dirents(&mut self) -> Result<()> {
        let (lo, hi) = all_dirents_range();
        for (k, v) in self.st.scan(&lo, &hi, usize::MAX)? {
            self.rep.dirents += 1;
            match parse_dirent_key(&k) {
                Some((parent, name)) => self.dirent(parent, name, &v),
                None => self.bad(format!("malformed directory entry key {k:02x?}")),
            }
        }
        Ok(())
    }

    fn dirent(&mut self, parent: Ino, name: &[u8], v: &[u8]) {
        let nm = name_str(name);
        if let Err(e) = check_name(name) {
            self.bad(format!("directory {parent}: entry {nm:?}: {e}"));
        }
        if !self.inodes.get(&parent).is_some_and(|p| p.kind() == Kind::Dir) {
            self.bad(format!("entry {nm:?} lies in {parent}, which is not a directory"));
        }
        let (child, kind) = match decode_dirent(v) {
            Ok(x) => x,
            Err(e) => return self.bad(format!("directory {parent}: entry {nm:?}: {e}")),
        };
        match self.inodes.get(&child).map(|c| (c.kind(), c.parent)) {
            None => self.bad(format!("directory {parent}: entry {nm:?} points at missing inode {child}")),
            Some((ck, cparent)) => {
                if ck != kind {
                    self.bad(format!(
                        "directory {parent}: entry {nm:?} says {kind:?}, inode {child} is {ck:?}"
                    ));
                }
                if ck == Kind::Dir {
                    *self.subdirs.entry(parent).or_default() += 1;
                    if cparent != parent {
                        self.bad(format!(
                            "directory {child} is in {parent} but names {cparent} as its parent"
                        ));
                    }
                }
            }
        }
        *self.links.entry(child).or_default() += 1;
        self.children.entry(parent).or_default().push(child);
        self.names.entry(child).or_insert_with(|| (parent, name.to_vec()));
    }

    /// Each inode's number, kind, link count and `alloc`, in order of
    /// number.
    fn sorted_inodes(&self) -> Vec<(Ino, Kind, u32, u64)> {
        let mut sorted: Vec<_> = self.inodes.values().map(|i| (i.ino, i.kind(), i.nlink, i.alloc)).collect();
        sorted.sort_unstable_by_key(|i| i.0);
        sorted
    }

    /// Link counts match the entries, directories have one name, and
    /// every inode not waiting as an orphan is reachable from the root.
    fn links(&mut self) {
        let mut seen = HashSet::from([ROOT]);
        let mut queue = vec![ROOT];
        while let Some(d) = queue.pop() {
            for &c in self.children.get(&d).map(|v| v.as_slice()).unwrap_or(&[]) {
                if seen.insert(c) && self.inodes.get(&c).is_some_and(|i| i.kind() == Kind::Dir) {
                    queue.push(c);
                }
            }
        }
        for (ino, kind, nlink, _) in self.sorted_inodes() {
            let n = self.links.get(&ino).copied().unwrap_or(0);
            let orphan = self.orphans.contains(&ino);
            if kind == Kind::Dir {
                let want = 2 + self.subdirs.get(&ino).copied().unwrap_or(0);
                if nlink != want && !(orphan && nlink == 0) {
                    self.bad(format!("directory {ino} has link count {nlink}, its entries make {want}"));
                }
                if ino != ROOT && n > 1 {
                    self.bad(format!("directory {ino} has {n} names"));
                }
            } else if nlink != n {
                self.bad(format!("inode {ino} has link count {nlink}, but {n} entries name it"));
            }
            self.file_parent(ino, kind);
            if !seen.contains(&ino) && !orphan {
                self.bad(format!("inode {ino} ({kind:?}) is not reachable from the root"));
            }
        }
    }

    /// A file's parent, when known, holds a link to it (the change feed
    /// names files by it).
    fn file_parent(&mut self, ino: Ino, kind: Kind) {
        let parent = self.inodes.get(&ino).map_or(0, |i| i.parent);
        if kind == Kind::Dir || parent == 0 || self.orphans.contains(&ino) {
            return;
        }
        if !self.children.get(&parent).is_some_and(|c| c.contains(&ino)) {
            self.bad(format!(
                "inode {ino} names directory {parent} as its parent, which has no entry for it"
            ));
        }
    }

    /// Change records decode, and the record of where they start is
    /// there when any is.
    fn change_records(&mut self) -> Result<()> {
        let (lo, hi) = changes_range();
        let recs = self.st.scan(&lo, &hi, usize::MAX)?;
        let from = match crate::changes::records_from(self.st) {
            Ok(f) => f,
            Err(e) => {
                self.bad(format!("{e}"));
                return Ok(());
            }
        };
        for (k, v) in &recs {
            let what = describe_key(k);
            match parse_change_key(k) {
                None => self.bad(format!("malformed change record key {k:02x?}")),
                Some(s) if from.is_none_or(|f| s <= f.seq) => {
                    self.bad(format!("{what} lies before where change records start"))
                }
                Some(_) => {}
            }
            if let Err(e) = crate::changes::Record::decode(v, &what) {
                self.bad(format!("{e}"));
            }
        }
        Ok(())
    }

    /// Chunk records: they decode, lie within their file, add up to its
    /// `alloc`, and their reservations to the counters'; gather the
    /// blocks they use.
    fn chunks(&mut self) -> Result<()> {
        let mut reserved = 0u64;
        let (lo, hi) = all_extents_range();
        for (k, v) in self.st.scan(&lo, &hi, usize::MAX)? {
            self.rep.extents += 1;
            let Some((ino, idx)) = parse_extent_key(&k) else {
                self.bad(format!("malformed chunk key {k:02x?}"));
                continue;
            };
            match Extent::decode(&v, &format!("chunk {idx} of inode {ino}")) {
                Ok(e) => {
                    if let Extent::Reserved(n) = e {
                        reserved += u64::from(n);
                    }
                    self.chunk(ino, idx, &e);
                }
                Err(e) => self.bad(e.to_string()),
            }
        }
        let counted = self.st.group.counters().reserved;
        if reserved != counted {
            self.bad(format!(
                "chunks reserve {reserved} bytes, the counters {counted} (free space is off by the difference)"
            ));
        }
        for (ino, _, _, alloc) in self.sorted_inodes() {
            let a = self.alloc.get(&ino).copied().unwrap_or(0);
            if alloc != a {
                self.bad(format!("inode {ino} counts {alloc} allocated bytes, its chunks hold {a}"));
            }
        }
        Ok(())
    }

    /// The chunk size of file `ino`.
    fn cs_of(&self, ino: Ino) -> u64 {
        self.inodes.get(&ino).and_then(|i| i.chunk).map_or(self.cs, u64::from)
    }

    fn chunk(&mut self, ino: Ino, idx: u64, e: &Extent) {
        let cs = self.cs_of(ino);
        match self.inodes.get(&ino).map(|i| (i.kind(), i.size)) {
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
        *self.alloc.entry(ino).or_default() += e.len();
        if let Extent::Patched { base, freed, .. } = e {
            if let (Extent::Own(a, _), 1..) = (&**base, *freed) {
                self.released.insert(*a, *freed);
            }
        }
        self.chunk_parts(ino, idx, e.parts());
    }

    /// The blocks a chunk's parts lie in. Patches of several blocks of a
    /// chunk may share a block, but not with the chunk's base or at the
    /// same place.
    fn chunk_parts(&mut self, ino: Ino, idx: u64, parts: Vec<&Extent>) {
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
        for p in parts {
            match *p {
                Extent::Own(a, len) => {
                    if let Some((pi, pc, _)) = self.own_blocks.insert(a, (ino, idx, len)) {
                        self.bad(format!(
                            "block {a} is owned by chunk {idx} of {ino} and chunk {pc} of {pi}"
                        ));
                    }
                }
                Extent::Shared { addr, off, len, .. } => {
                    self.shared_users.entry(addr).or_default().push((ino, idx, off, len));
                }
                _ => {}
            }
        }
    }

    /// Each shared block's reference list names exactly the chunks that
    /// use it, and released no more than it holds.
    fn shared_lists(&mut self) -> Result<()> {
        let mut listed: HashSet<BlockAddr> = HashSet::new();
        let (lo, hi) = all_shared_range();
        for (k, v) in self.st.scan(&lo, &hi, usize::MAX)? {
            let Some(a) = parse_shared_key(&k) else {
                self.bad(format!("malformed shared-block key {k:02x?}"));
                continue;
            };
            listed.insert(a);
            match decode_refs(&v) {
                Ok((refs, rel)) => self.shared_list(a, refs, rel),
                Err(e) => self.bad(format!("block {a}: {e}")),
            }
        }
        let unlisted: Vec<BlockAddr> =
            self.shared_users.keys().filter(|a| !listed.contains(a)).copied().collect();
        for a in unlisted {
            self.bad(format!("block {a} is shared by chunks but has no reference list"));
        }
        Ok(())
    }

    fn shared_list(&mut self, a: BlockAddr, mut refs: Vec<(Ino, u64)>, rel: u32) {
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
    fn users(&self, a: BlockAddr, own: bool) -> Vec<(Ino, u64)> {
        if own {
            self.own_blocks.get(&a).map(|&(i, c, _)| vec![(i, c)]).unwrap_or_default()
        } else {
            self.shared_users.get(&a).map(|u| u.iter().map(|x| (x.0, x.1)).collect()).unwrap_or_default()
        }
    }

    /// Read every data block: checksums and lengths; a damaged one is
    /// said with the files it holds data of. The live bytes found per
    /// segment.
    fn blocks(&mut self, progress: &dyn Fn(u64, u64)) -> HashMap<u32, u64> {
        let mut blocks: Vec<(BlockAddr, bool, u32)> = self.own_blocks.keys().map(|a| (*a, true, 0)).collect();
        blocks.extend(
            self.shared_users
                .iter()
                .map(|(a, u)| (*a, false, u.iter().map(|x| x.2 + x.3).max().unwrap_or(0))),
        );
        blocks.sort_by_key(|b| (b.0.seg, b.0.offset));
        let total: u64 = blocks.iter().map(|b| u64::from(b.0.len)).sum();
        let mut per_seg: HashMap<u32, u64> = HashMap::new();
        for (a, own, need) in blocks {
            self.rep.blocks += 1;
            self.rep.block_bytes += u64::from(a.len);
            let released = self.released.get(&a).copied().unwrap_or(0);
            *per_seg.entry(a.seg).or_default() += u64::from(a.len - released);
            progress(self.rep.block_bytes, total);
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
                            format!("{} (bytes {}..{})", path_of(&self.names, i), c * cs, (c + 1) * cs)
                        })
                        .collect();
                    self.bad(format!("block {a}: {e}; it holds data of {}", files.join(", ")))
                }
            }
        }
        per_seg
    }

    /// Frees held for snapshots: their bytes stay counted in their
    /// segments (`per_seg`), their blocks read back with a good checksum;
    /// they and forward records exist only while a snapshot does.
    fn held(&mut self, per_seg: &mut HashMap<u32, u64>) -> Result<()> {
        let (lo, hi) = all_held_range();
        let held = self.st.scan(&lo, &hi, usize::MAX)?;
        let none = self.st.group.snapshots().is_empty();
        if !held.is_empty() && none {
            self.bad(format!("{} frees are held for snapshots, but there is none", held.len()));
        }
        let mut blocks = HashSet::new();
        for (k, v) in held {
            if let Err(e) = decode_born(&v, &describe_key(&k)) {
                self.bad(format!("{e}"));
            }
            match parse_held_key(&k) {
                Some((a, _, _)) => {
                    *per_seg.entry(a.seg).or_default() += u64::from(a.len);
                    blocks.insert((a.seg, a.offset));
                }
                None => self.bad(format!("malformed held free {k:02x?}")),
            }
        }
        for (seg, offset) in blocks {
            if let Err(e) = self.st.eng.block_at(seg, offset).and_then(|a| self.st.eng.read_block(a)) {
                self.bad(format!("a block kept for snapshots at {seg}:{offset}: {e}"));
            }
        }
        let (lo, hi) = seg_borns_range();
        for (k, v) in self.st.scan(&lo, &hi, usize::MAX)? {
            if parse_seg_born_key(&k).is_none() {
                self.bad(format!("malformed segment born key {k:02x?}"));
            } else if let Err(e) = decode_born(&v, &describe_key(&k)) {
                self.bad(format!("{e}"));
            }
        }
        let (lo, hi) = all_forward_range();
        let forwards = self.st.scan(&lo, &hi, usize::MAX)?;
        if !forwards.is_empty() && none {
            self.bad(format!("{} forward records, but no snapshot", forwards.len()));
        }
        for (k, v) in forwards {
            if parse_forward_key(&k).is_none() {
                self.bad(format!("malformed forward record key {k:02x?}"));
            } else if let Err(e) = decode_addr(&v, &describe_key(&k)) {
                self.bad(format!("{e}"));
            }
        }
        Ok(())
    }

    /// Segment usage must be exactly the live data blocks (`per_seg`) and
    /// the engine's own live blocks. Below, the cleaner could free a
    /// segment still in use; above, space is counted that nothing holds:
    /// a leak, which a crash or a failed operation may leave (FORMAT.md
    /// §7) and the cleaner drops, but which nothing else should.
    fn segment_usage(&mut self, per_seg: &HashMap<u32, u64>) -> Result<()> {
        for (seg, (u, own)) in self.st.eng.usage_check()?.into_iter().enumerate() {
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

    /// Every xattr belongs to an inode.
    fn xattrs(&mut self) -> Result<()> {
        let (lo, hi) = all_xattrs_range();
        for (k, _) in self.st.scan(&lo, &hi, usize::MAX)? {
            self.rep.xattrs += 1;
            match parse_xattr_key(&k) {
                Some((ino, _)) if self.inodes.contains_key(&ino) => {}
                Some((ino, n)) => self.bad(format!("xattr {:?} belongs to missing inode {ino}", name_str(n))),
                None => self.bad(format!("malformed xattr key {k:02x?}")),
            }
        }
        Ok(())
    }
}

impl Fs {
    /// Logical and stored bytes of the tree under `ino`.
    pub fn du(&self, ino: Ino) -> Result<TreeUsage> {
        let st = self.st();
        let mut u = TreeUsage::default();
        st.walk(ino, &mut |node| {
            match node.kind() {
                Kind::Dir => u.dirs += 1,
                k => {
                    if k == Kind::File {
                        u.files += 1;
                        u.logical += node.size;
                    } else {
                        u.others += 1;
                    }
                    u.allocated += node.alloc;
                    u.physical += st.physical(node.ino)?;
                }
            }
            Ok(())
        })?;
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
            counters: st.group.counters_now(st.eng.device_bytes_written()),
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

impl State {
    /// The stored bytes of the subtree at directory `ino`, with data not
    /// committed yet counted as [`State::physical_now`] does; and whether
    /// any was. A walk of the subtree: a scan of each directory's entries
    /// and of each file's chunk records, as `du` does.
    pub(crate) fn subtree_physical(&self, ino: Ino) -> Result<(u64, bool)> {
        let (mut total, mut estimated) = (0, false);
        self.walk(ino, &mut |node| {
            if node.kind() != Kind::Dir {
                let (n, e) = self.physical_now(node.ino)?;
                total += n;
                estimated |= e;
            }
            Ok(())
        })?;
        Ok((total, estimated))
    }

    /// Call `f` on every inode of the subtree at `ino` (itself included),
    /// each once (hard links and all).
    fn walk(&self, ino: Ino, f: &mut dyn FnMut(&Inode) -> Result<()>) -> Result<()> {
        let mut seen = HashSet::new();
        let mut stack = vec![ino];
        while let Some(i) = stack.pop() {
            if !seen.insert(i) {
                continue;
            }
            let node = self.inode(i)?;
            if node.kind() == Kind::Dir {
                let (lo, hi) = dirents_range(i);
                for (_, v) in self.scan(&lo, &hi, usize::MAX)? {
                    stack.push(decode_dirent(&v)?.0);
                }
            }
            f(&node)?;
        }
        Ok(())
    }
}
