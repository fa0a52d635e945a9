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

/// A path of inode `ino`, found when needed (to say which file a damaged
/// block holds): each inode names its directory, whose entries are read
/// until one names it. "inode N" when one step is unknown (an orphan, a
/// file whose directory does not list it). fsck and scrub held a name of
/// every inode of the tree for this (issue 45).
pub(crate) fn path_of(st: &State, ino: Ino) -> String {
    let mut parts = Vec::new();
    let mut cur = ino;
    while cur != ROOT && parts.len() < 4096 {
        match name_in_parent(st, cur) {
            Some((p, n)) => {
                parts.push(name_str(&n));
                cur = p;
            }
            None => return format!("inode {ino}"),
        }
    }
    parts.reverse();
    format!("/{}", parts.join("/"))
}

/// A directory that names `ino`, and its name there: the one `ino` names
/// as its parent, else (a hard-linked file whose first link went names
/// none) any, found by a pass over every entry.
fn name_in_parent(st: &State, ino: Ino) -> Option<(Ino, Vec<u8>)> {
    let i = st.inode(ino).ok()?;
    if i.nlink == 0 {
        return None; // an orphan: no entry names it
    }
    let found = if i.parent == 0 { None } else { entry_naming(st, ino, dirents_range(i.parent)) };
    found.or_else(|| entry_naming(st, ino, all_dirents_range()))
}

/// The first entry of the key range `(lo, hi)` that names `ino`.
fn entry_naming(st: &State, ino: Ino, (lo, hi): (Vec<u8>, Vec<u8>)) -> Option<(Ino, Vec<u8>)> {
    let mut found = None;
    let r = st.for_each(&lo, &hi, |k, v| {
        // An entry that does not decode is fsck's to report, not a stop.
        if found.is_none() && decode_dirent(v).is_ok_and(|(c, _)| c == ino) {
            found = parse_dirent_key(k).map(|(p, n)| (p, n.to_vec()));
        }
        Ok(())
    });
    if let Err(e) = r {
        tracing::warn!("naming inode {ino}: reading directory entries: {e}");
    }
    found
}

/// A block's users as fsck found them: the owning chunk (its length), or
/// the pieces of a shared block (offset and length of each).
type OwnBlocks = HashMap<BlockAddr, (Ino, u64, u32)>;
type SharedUsers = HashMap<BlockAddr, Vec<(Ino, u64, u32, u32)>>;

/// What fsck keeps of an inode for the phases after the inode scan, and
/// what they count for it: about 64 bytes, where the whole inode in a
/// hash map, its name and its counts in four more took about 1 KiB a file
/// (issue 45: 1 GiB at a million files).
#[derive(Debug, Clone, Copy)]
struct Node {
    ino: Ino,
    parent: Ino,
    size: u64,
    alloc: u64,
    /// Bytes of its chunks.
    chunks: u64,
    nlink: u32,
    /// Entries naming it; of a directory, the subdirectories in it.
    entries: u32,
    subdirs: u32,
    /// Its own chunk size (0: the image's).
    chunk: u32,
    kind: Kind,
    flags: u8,
}

/// [`Node::flags`]: its directory (`parent`) has an entry for it.
const PARENT_ENTRY: u8 = 1;
/// Reachable from the root.
const REACHABLE: u8 = 2;
/// Waiting in the orphan list.
const ORPHAN: u8 = 4;

/// fsck's phases over one state, and what each gathers for the next.
struct Checker<'a> {
    st: &'a State,
    /// The image's chunk size (files without their own).
    cs: u64,
    rep: CheckReport,
    /// Every inode, in order of number (the order the scan gives).
    nodes: Vec<Node>,
    /// The subdirectories of each directory (directories only: files are
    /// found reachable by a second pass over the entries).
    subdirs_of: HashMap<Ino, Vec<Ino>>,
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
        c.links()?;
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

impl<'a> Checker<'a> {
    fn new(st: &'a State) -> Self {
        Checker {
            st,
            cs: st.group.chunk_size(),
            rep: CheckReport::default(),
            nodes: Vec::new(),
            subdirs_of: HashMap::new(),
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

    fn node(&self, ino: Ino) -> Option<&Node> {
        self.nodes.binary_search_by_key(&ino, |n| n.ino).ok().map(|i| &self.nodes[i])
    }

    fn node_mut(&mut self, ino: Ino) -> Option<&mut Node> {
        self.nodes.binary_search_by_key(&ino, |n| n.ino).ok().map(|i| &mut self.nodes[i])
    }

    /// Inode records: they decode, lie below the next inode number, and
    /// the root is a directory.
    fn inodes(&mut self) -> Result<()> {
        let st = self.st;
        let (lo, hi) = inodes_range();
        let (base, next) = (st.group.cfg().base_sec, st.group.cfg().next_ino);
        st.for_each(&lo, &hi, |k, v| {
            let Some(ino) = parse_inode_key(k) else {
                self.bad(format!("malformed inode key {k:02x?}"));
                return Ok(());
            };
            match Inode::decode(ino, v, base, |id| st.group.triple(id)) {
                Ok(i) => {
                    if ino >= next {
                        self.bad(format!("inode {ino} is not below the next inode number {next}"));
                    }
                    if i.chunk.is_some_and(|c| c > st.group.cfg().chunk_size) {
                        let image = st.group.cfg().chunk_size;
                        self.bad(format!("inode {ino} has chunks larger than the image's ({image} bytes)"));
                    }
                    self.nodes.push(Node {
                        ino,
                        parent: i.parent,
                        size: i.size,
                        alloc: i.alloc,
                        chunks: 0,
                        nlink: i.nlink,
                        entries: 0,
                        subdirs: 0,
                        chunk: i.chunk.unwrap_or(0),
                        kind: i.kind(),
                        flags: 0,
                    });
                }
                Err(e) => self.bad(format!("inode {ino}: {e}")),
            }
            Ok(())
        })?;
        // Keys order inodes by number; a damaged run could not.
        if !self.nodes.is_sorted_by_key(|n| n.ino) {
            self.nodes.sort_unstable_by_key(|n| n.ino);
        }
        self.nodes.shrink_to_fit();
        self.rep.inodes = self.nodes.len() as u64;
        if !self.node(ROOT).is_some_and(|r| r.kind == Kind::Dir) {
            self.bad("the root directory is missing or not a directory".into());
        }
        Ok(())
    }

    fn orphans(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, orphans_range());
        st.for_each(&lo, &hi, |k, _| {
            if let Some(i) = parse_orphan_key(k) {
                self.rep.orphans += 1;
                if let Some(n) = self.node_mut(i) {
                    n.flags |= ORPHAN;
                }
            }
            Ok(())
        })
    }

    /// Directory entries: valid names in directories, naming inodes of
    /// their kind; a subdirectory names its directory as its parent.
    fn dirents(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, all_dirents_range());
        st.for_each(&lo, &hi, |k, v| {
            self.rep.dirents += 1;
            match parse_dirent_key(k) {
                Some((parent, name)) => self.dirent(parent, name, v),
                None => self.bad(format!("malformed directory entry key {k:02x?}")),
            }
            Ok(())
        })
    }

    fn dirent(&mut self, parent: Ino, name: &[u8], v: &[u8]) {
        let nm = name_str(name);
        if let Err(e) = check_name(name) {
            self.bad(format!("directory {parent}: entry {nm:?}: {e}"));
        }
        if !self.node(parent).is_some_and(|p| p.kind == Kind::Dir) {
            self.bad(format!("entry {nm:?} lies in {parent}, which is not a directory"));
        }
        let (child, kind) = match decode_dirent(v) {
            Ok(x) => x,
            Err(e) => return self.bad(format!("directory {parent}: entry {nm:?}: {e}")),
        };
        match self.node(child).map(|c| (c.kind, c.parent)) {
            None => self.bad(format!("directory {parent}: entry {nm:?} points at missing inode {child}")),
            Some((ck, cparent)) => {
                if ck != kind {
                    self.bad(format!(
                        "directory {parent}: entry {nm:?} says {kind:?}, inode {child} is {ck:?}"
                    ));
                }
                if ck == Kind::Dir {
                    if let Some(p) = self.node_mut(parent) {
                        p.subdirs += 1;
                    }
                    self.subdirs_of.entry(parent).or_default().push(child);
                    if cparent != parent {
                        self.bad(format!(
                            "directory {child} is in {parent} but names {cparent} as its parent"
                        ));
                    }
                }
                let c = self.node_mut(child).expect("looked up above");
                c.entries += 1;
                if c.parent == parent {
                    c.flags |= PARENT_ENTRY;
                }
            }
        }
    }

    /// Mark what is reachable from the root: the directories through
    /// their subdirectories, then, in a second pass over the entries,
    /// everything a reachable directory names.
    fn reach(&mut self) -> Result<()> {
        let mut queue = vec![ROOT];
        if let Some(r) = self.node_mut(ROOT) {
            r.flags |= REACHABLE;
        }
        while let Some(d) = queue.pop() {
            for c in self.subdirs_of.remove(&d).unwrap_or_default() {
                if let Some(n) = self.node_mut(c).filter(|n| n.flags & REACHABLE == 0) {
                    n.flags |= REACHABLE;
                    queue.push(c);
                }
            }
        }
        let (st, (lo, hi)) = (self.st, all_dirents_range());
        st.for_each(&lo, &hi, |k, v| {
            let (Some((parent, _)), Ok((child, _))) = (parse_dirent_key(k), decode_dirent(v)) else {
                return Ok(()); // said by the first pass
            };
            if self.node(parent).is_some_and(|p| p.kind == Kind::Dir && p.flags & REACHABLE != 0) {
                if let Some(c) = self.node_mut(child) {
                    c.flags |= REACHABLE;
                }
            }
            Ok(())
        })
    }

    /// Link counts match the entries, directories have one name, files
    /// are listed by the directory they name, and every inode not waiting
    /// as an orphan is reachable from the root.
    fn links(&mut self) -> Result<()> {
        self.reach()?;
        for i in 0..self.nodes.len() {
            let Node { ino, kind, nlink, entries: n, subdirs, parent, flags, .. } = self.nodes[i];
            let orphan = flags & ORPHAN != 0;
            if kind == Kind::Dir {
                let want = 2 + subdirs;
                if nlink != want && !(orphan && nlink == 0) {
                    self.bad(format!("directory {ino} has link count {nlink}, its entries make {want}"));
                }
                if ino != ROOT && n > 1 {
                    self.bad(format!("directory {ino} has {n} names"));
                }
            } else if nlink != n {
                self.bad(format!("inode {ino} has link count {nlink}, but {n} entries name it"));
            }
            // A file's parent, when known, holds a link to it (the change
            // feed names files by it).
            if kind != Kind::Dir && parent != 0 && !orphan && flags & PARENT_ENTRY == 0 {
                self.bad(format!(
                    "inode {ino} names directory {parent} as its parent, which has no entry for it"
                ));
            }
            if flags & REACHABLE == 0 && !orphan {
                self.bad(format!("inode {ino} ({kind:?}) is not reachable from the root"));
            }
        }
        Ok(())
    }

    /// Change records decode, and the record of where they start is
    /// there when any is.
    fn change_records(&mut self) -> Result<()> {
        let (lo, hi) = changes_range();
        let from = match crate::changes::records_from(self.st) {
            Ok(f) => f,
            Err(e) => {
                self.bad(format!("{e}"));
                return Ok(());
            }
        };
        let st = self.st;
        st.for_each(&lo, &hi, |k, v| {
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
            Ok(())
        })
    }

    /// Chunk records: they decode, lie within their file, add up to its
    /// `alloc`, and their reservations to the counters'; gather the
    /// blocks they use.
    fn chunks(&mut self) -> Result<()> {
        let mut reserved = 0u64;
        let (st, (lo, hi)) = (self.st, all_extents_range());
        st.for_each(&lo, &hi, |k, v| {
            self.rep.extents += 1;
            let Some((ino, idx)) = parse_extent_key(k) else {
                self.bad(format!("malformed chunk key {k:02x?}"));
                return Ok(());
            };
            match Extent::decode(v, &format!("chunk {idx} of inode {ino}")) {
                Ok(e) => {
                    if let Extent::Reserved(n) = e {
                        reserved += u64::from(n);
                    }
                    self.chunk(ino, idx, &e);
                }
                Err(e) => self.bad(e.to_string()),
            }
            Ok(())
        })?;
        let counted = self.st.group.counters().reserved;
        if reserved != counted {
            self.bad(format!(
                "chunks reserve {reserved} bytes, the counters {counted} (free space is off by the difference)"
            ));
        }
        for i in 0..self.nodes.len() {
            let Node { ino, alloc, chunks: a, .. } = self.nodes[i];
            if alloc != a {
                self.bad(format!("inode {ino} counts {alloc} allocated bytes, its chunks hold {a}"));
            }
        }
        Ok(())
    }

    /// The chunk size of file `ino`.
    fn cs_of(&self, ino: Ino) -> u64 {
        self.node(ino).filter(|n| n.chunk != 0).map_or(self.cs, |n| u64::from(n.chunk))
    }

    fn chunk(&mut self, ino: Ino, idx: u64, e: &Extent) {
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
                            format!("{} (bytes {}..{})", path_of(self.st, i), c * cs, (c + 1) * cs)
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
        let st = self.st;
        st.for_each(&lo, &hi, |k, _| {
            self.rep.xattrs += 1;
            match parse_xattr_key(k) {
                Some((ino, _)) if self.node(ino).is_some() => {}
                Some((ino, n)) => self.bad(format!("xattr {:?} belongs to missing inode {ino}", name_str(n))),
                None => self.bad(format!("malformed xattr key {k:02x?}")),
            }
            Ok(())
        })
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
        st.for_each(&lo, &hi, |k, v| {
            u.inodes += 1;
            u.inode_bytes_raw += (k.len() + v.len()) as u64;
            block.extend_from_slice(k);
            block.extend_from_slice(v);
            if block.len() >= 16 << 10 {
                u.inode_bytes_compressed += encode(spec, &block).data.len() as u64;
                block.clear();
            }
            Ok(())
        })?;
        if !block.is_empty() {
            u.inode_bytes_compressed += encode(spec, &block).data.len() as u64;
        }
        let mut blocks: HashSet<BlockAddr> = HashSet::new();
        let (lo, hi) = all_extents_range();
        st.for_each(&lo, &hi, |k, v| {
            let e = Extent::decode(v, &format!("chunk {k:02x?}"))?;
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
            Ok(())
        })?;
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
    /// each once (hard links and all). Holds the directories, and the
    /// files of more than one link, not every inode of the tree: a
    /// directory's entries are read a page at a time, its files handled
    /// as they come (issue 45).
    fn walk(&self, ino: Ino, f: &mut dyn FnMut(&Inode) -> Result<()>) -> Result<()> {
        let (mut linked, mut seen) = (HashSet::new(), HashSet::new());
        let mut dirs = vec![ino];
        while let Some(d) = dirs.pop() {
            if !seen.insert(d) {
                continue; // a damaged image's loop
            }
            let node = self.inode(d)?;
            if node.kind() != Kind::Dir {
                // An entry said directory; the inode says otherwise.
                if node.nlink <= 1 || linked.insert(d) {
                    f(&node)?;
                }
                continue;
            }
            let (lo, hi) = dirents_range(d);
            self.for_each(&lo, &hi, |_, v| {
                let (child, kind) = decode_dirent(v)?;
                if kind == Kind::Dir {
                    dirs.push(child); // its inode's kind decides, when popped
                    return Ok(());
                }
                let node = self.inode(child)?;
                if node.kind() == Kind::Dir {
                    dirs.push(child);
                } else if node.nlink <= 1 || linked.insert(child) {
                    f(&node)?;
                }
                Ok(())
            })?;
            f(&node)?;
        }
        Ok(())
    }
}
