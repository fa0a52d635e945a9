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
    /// Passes over the inodes (one per span of inode numbers) and over
    /// the blocks (one per span of segments): more than one each when
    /// the image's tables outgrow the memory fsck was given.
    pub passes: (usize, usize),
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

/// fsck's working memory by default: its table of inodes and its maps of
/// blocks (issue 45 asks 256 MiB in all at ten million files). Past it the
/// checks run in passes, each over a span of inode numbers or of segments.
pub const CHECK_MEMORY: usize = 96 << 20;

/// Bytes a block part takes in fsck's maps of blocks, with the hash maps'
/// spare room: an owned block's entry is 40 bytes in a table at most 7/8
/// full and up to twice the size needed; a shared block's piece is less.
const PART_BYTES: usize = 96;

/// A span of inode numbers (or of segments): from, to (None: to the end).
type Span<T> = (T, Option<T>);

fn in_span<T: PartialOrd + Copy>(x: T, (from, to): Span<T>) -> bool {
    x >= from && to.is_none_or(|t| x < t)
}

/// What fsck keeps of an inode of the span being checked, and what the
/// phases count for it: 64 bytes, where the whole inode in a hash map, its
/// name and its counts in four more took about 1 KiB a file (issue 45: 1
/// GiB at a million files).
#[derive(Debug, Clone, Copy)]
struct Node {
    ino: Ino,
    parent: Ino,
    size: u64,
    alloc: u64,
    /// Bytes of its chunks.
    chunks: u64,
    nlink: u32,
    /// Entries naming it.
    entries: u32,
    /// Of a directory, the subdirectories in it.
    subdirs: u32,
    /// Its own chunk size (0: the image's).
    chunk: u32,
    kind: Kind,
    flags: u8,
}

impl Node {
    fn of(ino: Ino, i: &Inode) -> Node {
        Node {
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
        }
    }
}

/// [`Node::flags`]: its directory (`parent`) has an entry for it.
const PARENT_ENTRY: u8 = 1;
/// Reachable from the root.
const REACHABLE: u8 = 2;
/// Waiting in the orphan list.
const ORPHAN: u8 = 4;

/// fsck's phases over one state, and what each gathers for the next.
/// What it holds for the whole image is the directories; the inodes and
/// the blocks it holds a span at a time: a span of inodes as large as half
/// the memory allows (with the block maps beside it while they fit in the
/// other half: then the whole image in one), a span of segments as large
/// as all of it allows.
struct Checker<'a> {
    st: &'a State,
    /// The image's chunk size (files without their own).
    cs: u64,
    rep: CheckReport,
    /// Bytes the inode table and the block maps may take.
    memory: usize,
    /// Every directory, by number.
    dirs: Vec<Ino>,
    /// Which of `dirs` are reachable from the root.
    reached: Vec<bool>,
    /// The span of inode numbers being checked, and whether it is the
    /// first (which reports the malformed keys that name no inode).
    span: Span<Ino>,
    first: bool,
    /// Its inodes, by number.
    nodes: Vec<Node>,
    /// Bytes reserved by chunks (fallocate), all spans.
    reserved: u64,
    /// Block parts of the chunks by segment: how the block passes split
    /// the segments.
    parts_per_seg: BTreeMap<u32, usize>,
    /// Block parts in the maps below.
    kept: usize,
    /// While true, the chunk passes fill the block maps for every segment
    /// (and no block pass reads the chunks again); false once they outgrow
    /// half the memory.
    gathering: bool,
    /// The blocks of the segments being checked (`segs`), their users.
    segs: Span<u32>,
    own_blocks: OwnBlocks,
    shared_users: SharedUsers,
    /// Bytes of blocks already released from their segments' counts
    /// (patched bases, shared blocks some users left).
    released: HashMap<BlockAddr, u32>,
    /// Blocks owned by two chunks, found while filling the maps: said
    /// when the maps are checked (maps given up are filled again, and
    /// would find them twice).
    conflicts: Vec<String>,
}

impl Fs {
    /// Verify every checksum and cross-reference, in at most
    /// [`CHECK_MEMORY`] of tables. Problems are collected, not raised; an
    /// error means the scan itself could not go on.
    pub fn check(&self, progress: &dyn Fn(u64, u64)) -> Result<CheckReport> {
        self.check_within(CHECK_MEMORY, progress)
    }

    /// [`Fs::check`] with `memory` bytes of tables: less means more passes
    /// over the directory entries and the chunks.
    pub fn check_within(&self, memory: usize, progress: &dyn Fn(u64, u64)) -> Result<CheckReport> {
        let mut st = self.st();
        st.commit()?;
        let mut c = Checker::new(&st, memory);
        if c.damage() {
            return Ok(c.rep);
        }
        let spans = c.survey()?;
        c.reach()?;
        let one = spans.len() == 1;
        c.rep.passes.0 = spans.len();
        for (i, &(span, count)) in spans.iter().enumerate() {
            c.inode_span(span, count, i == 0, one)?;
        }
        c.check_reserved();
        let mut per_seg = HashMap::new();
        let total = c.block_bytes_estimate()?;
        if c.gathering {
            c.segs = (0, None);
            c.rep.passes.1 = 1;
            let total = c.block_bytes();
            c.block_span(&mut per_seg, progress, total)?;
        } else {
            let spans = c.seg_spans();
            c.rep.passes.1 = spans.len();
            for segs in spans {
                c.segs = segs;
                c.gather()?;
                c.block_span(&mut per_seg, progress, total)?;
            }
        }
        // The estimate of several spans is not exact: say the end.
        progress(c.rep.block_bytes, c.rep.block_bytes);
        c.held(&mut per_seg)?;
        c.segment_usage(&per_seg)?;
        c.change_records()?;
        Ok(c.rep)
    }
}

impl<'a> Checker<'a> {
    fn new(st: &'a State, memory: usize) -> Self {
        Checker {
            st,
            cs: st.group.chunk_size(),
            rep: CheckReport::default(),
            memory,
            dirs: Vec::new(),
            reached: Vec::new(),
            span: (0, None),
            first: true,
            nodes: Vec::new(),
            reserved: 0,
            parts_per_seg: BTreeMap::new(),
            kept: 0,
            gathering: true,
            segs: (0, None),
            own_blocks: HashMap::new(),
            shared_users: HashMap::new(),
            released: HashMap::new(),
            conflicts: Vec::new(),
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

    fn is_dir(&self, ino: Ino) -> bool {
        self.dirs.binary_search(&ino).is_ok()
    }

    fn reachable_dir(&self, ino: Ino) -> bool {
        self.dirs.binary_search(&ino).is_ok_and(|i| self.reached[i])
    }

    /// Inodes in a span's table.
    fn span_cap(&self) -> usize {
        (self.memory / 2 / std::mem::size_of::<Node>()).max(1)
    }

    /// The first pass over the inode records: they decode, lie below the
    /// next inode number, and the root is a directory. Gathers the
    /// directories and splits the inode numbers into spans of at most
    /// [`Checker::span_cap`] inodes (with each span's count); when one
    /// span holds them all, its table is kept.
    fn survey(&mut self) -> Result<Vec<(Span<Ino>, usize)>> {
        let st = self.st;
        let (base, next) = (st.group.cfg().base_sec, st.group.cfg().next_ino);
        let cap = self.span_cap();
        // Reserved, not touched: pages are used as the table fills.
        self.nodes = Vec::with_capacity(cap.min(usize::try_from(next).unwrap_or(usize::MAX)));
        let mut spans = Vec::new();
        let (mut from, mut count) = (0, 0usize);
        let (lo, hi) = inodes_range();
        st.for_each(&lo, &hi, |k, v| {
            let Some(ino) = parse_inode_key(k) else {
                self.bad(format!("malformed inode key {k:02x?}"));
                return Ok(());
            };
            let i = match Inode::decode(ino, v, base, |id| st.group.triple(id)) {
                Ok(i) => i,
                Err(e) => {
                    self.bad(format!("inode {ino}: {e}"));
                    return Ok(());
                }
            };
            if ino >= next {
                self.bad(format!("inode {ino} is not below the next inode number {next}"));
            }
            if i.chunk.is_some_and(|c| c > st.group.cfg().chunk_size) {
                let image = st.group.cfg().chunk_size;
                self.bad(format!("inode {ino} has chunks larger than the image's ({image} bytes)"));
            }
            if i.kind() == Kind::Dir {
                self.dirs.push(ino);
            }
            if count == cap {
                spans.push(((from, Some(ino)), count));
                (from, count) = (ino, 0);
                self.nodes = Vec::new();
            }
            if spans.is_empty() {
                self.nodes.push(Node::of(ino, &i));
            }
            count += 1;
            self.rep.inodes += 1;
            Ok(())
        })?;
        spans.push(((from, None), count));
        // Keys order inodes by number; a damaged run could not.
        if !self.dirs.is_sorted() {
            self.dirs.sort_unstable();
        }
        if !self.nodes.is_sorted_by_key(|n| n.ino) {
            self.nodes.sort_unstable_by_key(|n| n.ino);
        }
        if !self.is_dir(ROOT) {
            self.bad("the root directory is missing or not a directory".into());
        }
        Ok(spans)
    }

    /// Which directories are reachable from the root, through the entries
    /// that name directories.
    fn reach(&mut self) -> Result<()> {
        let mut edges: Vec<(Ino, Ino)> = Vec::new();
        let (st, (lo, hi)) = (self.st, all_dirents_range());
        st.for_each(&lo, &hi, |k, v| {
            if let (Some((parent, _)), Ok((child, _))) = (parse_dirent_key(k), decode_dirent(v)) {
                if self.is_dir(child) {
                    edges.push((parent, child));
                }
            }
            Ok(()) // the rest is said by the span passes
        })?;
        edges.sort_unstable();
        self.reached = vec![false; self.dirs.len()];
        // From the root's entries even when its inode is damaged (said by
        // the survey), as the single pass did.
        let mut queue = vec![ROOT];
        if let Ok(r) = self.dirs.binary_search(&ROOT) {
            self.reached[r] = true;
        }
        while let Some(d) = queue.pop() {
            let start = edges.partition_point(|e| e.0 < d);
            for &(_, c) in edges[start..].iter().take_while(|e| e.0 == d) {
                let i = self.dirs.binary_search(&c).expect("edges name directories");
                if !self.reached[i] {
                    self.reached[i] = true;
                    queue.push(c);
                }
            }
        }
        Ok(())
    }

    /// Every check of the inodes in `span` (`count` of them): their
    /// entries, links, chunks and xattrs. `kept`: the survey's table is
    /// this span's.
    fn inode_span(&mut self, span: Span<Ino>, count: usize, first: bool, kept: bool) -> Result<()> {
        (self.span, self.first) = (span, first);
        if !kept {
            self.load_nodes(count)?;
        }
        if let Some(r) = self.node_mut(ROOT) {
            r.flags |= REACHABLE;
        }
        self.orphans()?;
        self.dirents()?;
        self.links();
        self.chunks()?;
        self.xattrs()?;
        self.nodes = Vec::new();
        Ok(())
    }

    /// The table of the span's inodes (the survey said what is wrong with
    /// them).
    fn load_nodes(&mut self, count: usize) -> Result<()> {
        let st = self.st;
        let base = st.group.cfg().base_sec;
        self.nodes = Vec::with_capacity(count);
        let (lo, hi) = ino_span(ByIno::Inodes, self.span.0, self.span.1);
        st.for_each(&lo, &hi, |k, v| {
            if let Some(ino) = parse_inode_key(k) {
                if let Ok(i) = Inode::decode(ino, v, base, |id| st.group.triple(id)) {
                    self.nodes.push(Node::of(ino, &i));
                }
            }
            Ok(())
        })?;
        if !self.nodes.is_sorted_by_key(|n| n.ino) {
            self.nodes.sort_unstable_by_key(|n| n.ino);
        }
        Ok(())
    }

    fn orphans(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, ino_span(ByIno::Orphans, self.span.0, self.span.1));
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
    /// their kind; a subdirectory names its directory as its parent. Each
    /// pass reads every entry: those in the span's directories and those
    /// naming the span's inodes count.
    fn dirents(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, all_dirents_range());
        st.for_each(&lo, &hi, |k, v| {
            match parse_dirent_key(k) {
                Some((parent, name)) => self.dirent(parent, name, v),
                None if self.first => {
                    self.rep.dirents += 1;
                    self.bad(format!("malformed directory entry key {k:02x?}"));
                }
                None => {}
            }
            Ok(())
        })
    }

    fn dirent(&mut self, parent: Ino, name: &[u8], v: &[u8]) {
        let mine = in_span(parent, self.span);
        let nm = || name_str(name);
        if mine {
            self.rep.dirents += 1;
            if let Err(e) = check_name(name) {
                self.bad(format!("directory {parent}: entry {:?}: {e}", nm()));
            }
            if !self.node(parent).is_some_and(|p| p.kind == Kind::Dir) {
                self.bad(format!("entry {:?} lies in {parent}, which is not a directory", nm()));
            }
        }
        let (child, kind) = match decode_dirent(v) {
            Ok(x) => x,
            Err(e) if mine => return self.bad(format!("directory {parent}: entry {:?}: {e}", nm())),
            Err(_) => return,
        };
        if mine && self.is_dir(child) {
            if let Some(p) = self.node_mut(parent) {
                p.subdirs += 1;
            }
        }
        if !in_span(child, self.span) {
            return;
        }
        let reached = self.reachable_dir(parent);
        match self.node(child).map(|c| (c.kind, c.parent)) {
            None => self.bad(format!("directory {parent}: entry {:?} points at missing inode {child}", nm())),
            Some((ck, cparent)) => {
                if ck != kind {
                    self.bad(format!(
                        "directory {parent}: entry {:?} says {kind:?}, inode {child} is {ck:?}",
                        nm()
                    ));
                }
                if ck == Kind::Dir && cparent != parent {
                    self.bad(format!("directory {child} is in {parent} but names {cparent} as its parent"));
                }
                let c = self.node_mut(child).expect("looked up above");
                c.entries += 1;
                if c.parent == parent {
                    c.flags |= PARENT_ENTRY;
                }
                if reached {
                    c.flags |= REACHABLE;
                }
            }
        }
    }

    /// Link counts match the entries, directories have one name, files
    /// are listed by the directory they name, and every inode not waiting
    /// as an orphan is reachable from the root.
    fn links(&mut self) {
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
            if let Err(e) = crate::event::Record::decode(v, &what) {
                self.bad(format!("{e}"));
            }
            Ok(())
        })
    }

    /// Chunk records of the span's files: they decode, lie within their
    /// file and add up to its `alloc`; their reservations are summed for
    /// [`Checker::check_reserved`], their blocks counted by segment (and
    /// kept while the maps fit).
    fn chunks(&mut self) -> Result<()> {
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
    fn check_reserved(&mut self) {
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
    fn cs_of(&self, ino: Ino) -> u64 {
        let own = match self.node(ino) {
            Some(n) => (n.chunk != 0).then_some(n.chunk),
            None => self.st.inode(ino).ok().and_then(|i| i.chunk),
        };
        own.map_or(self.cs, u64::from)
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
    fn chunk_parts(&mut self, ino: Ino, idx: u64, parts: &[&Extent]) {
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
    fn keep_parts(&mut self, ino: Ino, idx: u64, e: &Extent, parts: &[&Extent]) {
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

    fn forget_blocks(&mut self) {
        self.own_blocks = HashMap::new();
        self.shared_users = HashMap::new();
        self.released = HashMap::new();
        self.conflicts = Vec::new();
        self.kept = 0;
    }

    /// Spans of segments whose block parts fit the memory.
    fn seg_spans(&self) -> Vec<Span<u32>> {
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
    fn gather(&mut self) -> Result<()> {
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
    fn block_bytes(&self) -> u64 {
        let own = self.own_blocks.keys();
        own.chain(self.shared_users.keys()).map(|a| u64::from(a.len)).sum()
    }

    /// The bytes of data blocks the segments count live, for progress
    /// while the blocks of several spans are read.
    fn block_bytes_estimate(&self) -> Result<u64> {
        let usage = self.st.eng.usage_check()?;
        Ok(usage.iter().map(|(u, own)| u64::from(u.live).saturating_sub(*own)).sum())
    }

    /// The checks of the blocks in the maps: their reference lists and
    /// their contents; their live bytes added to `per_seg`.
    fn block_span(
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
    fn shared_lists(&mut self) -> Result<()> {
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

    /// Read every data block in the maps: checksums and lengths; a
    /// damaged one is said with the files it holds data of. Adds the live
    /// bytes found to `per_seg`; `total`: the bytes of all spans, for
    /// progress.
    fn blocks(&mut self, per_seg: &mut HashMap<u32, u64>, progress: &dyn Fn(u64, u64), total: u64) {
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

    /// Frees held for snapshots: their bytes stay counted in their
    /// segments (`per_seg`), their blocks read back with a good checksum;
    /// they and forward records exist only while a snapshot does.
    fn held(&mut self, per_seg: &mut HashMap<u32, u64>) -> Result<()> {
        let none = self.st.group.snapshots().is_empty();
        let (st, (lo, hi)) = (self.st, all_held_range());
        let (mut count, mut last) = (0u64, None);
        st.for_each(&lo, &hi, |k, v| {
            count += 1;
            if let Err(e) = decode_born(v, &describe_key(k)) {
                self.bad(format!("{e}"));
            }
            let Some((a, _, _)) = parse_held_key(k) else {
                self.bad(format!("malformed held free {k:02x?}"));
                return Ok(());
            };
            *per_seg.entry(a.seg).or_default() += u64::from(a.len);
            // Keys order the frees by block: each block is read once.
            if last != Some((a.seg, a.offset)) {
                last = Some((a.seg, a.offset));
                if let Err(e) = st.eng.block_at(a.seg, a.offset).and_then(|b| st.eng.read_block(b)) {
                    self.bad(format!("a block kept for snapshots at {}:{}: {e}", a.seg, a.offset));
                }
            }
            Ok(())
        })?;
        if count > 0 && none {
            self.bad(format!("{count} frees are held for snapshots, but there is none"));
        }
        let (lo, hi) = seg_borns_range();
        st.for_each(&lo, &hi, |k, v| {
            if parse_seg_born_key(k).is_none() {
                self.bad(format!("malformed segment born key {k:02x?}"));
            } else if let Err(e) = decode_born(v, &describe_key(k)) {
                self.bad(format!("{e}"));
            }
            Ok(())
        })?;
        let (lo, hi) = all_forward_range();
        let mut forwards = 0u64;
        st.for_each(&lo, &hi, |k, v| {
            forwards += 1;
            if parse_forward_key(k).is_none() {
                self.bad(format!("malformed forward record key {k:02x?}"));
            } else if let Err(e) = decode_addr(v, &describe_key(k)) {
                self.bad(format!("{e}"));
            }
            Ok(())
        })?;
        if forwards > 0 && none {
            self.bad(format!("{forwards} forward records, but no snapshot"));
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

    /// Every xattr of the span belongs to an inode.
    fn xattrs(&mut self) -> Result<()> {
        let (st, (lo, hi)) = (self.st, ino_span(ByIno::Xattrs, self.span.0, self.span.1));
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, MemStore, Store};

    use super::*;
    use crate::{mkfs, FsOptions, MkfsOptions};

    /// Bytes of no pattern a codec finds much in (each file its own).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 7) as u8 + b'a'
            })
            .collect()
    }

    /// A tree of directories, small files (packed: shared blocks), large
    /// files (owned blocks over several segments), empty files, hard links
    /// and xattrs.
    fn tree() -> Fs {
        let store: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 256 << 10, segment_count: 64 }));
        mkfs(
            store.clone(),
            &MkfsOptions { pack_bytes: 32 << 10, chunk_size: 32 << 10, ..MkfsOptions::default() },
        )
        .unwrap();
        let fs = Fs::open(store, FsOptions { commit_interval: None, ..FsOptions::default() }).unwrap();
        for d in 0..4u64 {
            let dir = fs.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
            let sub = fs.mkdir(dir, b"sub", 0o755, 0, 0).unwrap().ino;
            for f in 0..8u64 {
                let a = fs.create(dir, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                let n = if f == 0 { 300_000 } else { 1_000 + 500 * f as usize };
                fs.write(a, 0, &bytes(n, d * 100 + f)).unwrap();
                if f == 1 {
                    fs.link(a, sub, b"linked").unwrap();
                    fs.setxattr(a, b"user.note", b"x", 0).unwrap();
                }
            }
            for e in 0..30 {
                fs.create(sub, format!("empty{e}").as_bytes(), 0o644, 0, 0).unwrap();
            }
        }
        fs.commit().unwrap();
        fs
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    /// What two reports must agree on: every count and every problem.
    fn summary(r: &CheckReport) -> String {
        format!(
            "{} inodes, {} entries, {} chunks, {} blocks of {} bytes, {} xattrs, {} orphans, leaked {:?}, \
             problems {:#?}",
            r.inodes,
            r.dirents,
            r.extents,
            r.blocks,
            r.block_bytes,
            r.xattrs,
            r.orphans,
            r.leaked,
            sorted(r.problems.clone())
        )
    }

    /// Memory sizes for many spans of everything (384), block maps given
    /// up part way through the first inode span (3,840), and block maps
    /// kept across two inode spans (16,384); and the spans each made.
    const SIZES: [(usize, (usize, usize)); 3] = [(384, (54, 3)), (3_840, (6, 3)), (16_384, (2, 1))];

    /// Damage of each kind fsck knows, found alike in one pass and in
    /// many: each memory size of [`SIZES`] gives the report of one pass.
    #[test]
    fn many_passes_find_what_one_pass_finds() {
        let fs = tree();
        let one = fs.check(&|_, _| {}).unwrap();
        assert!(one.problems.is_empty(), "{:?}", one.problems);
        assert_eq!(one.passes, (1, 1));
        let mut made = Vec::new();
        for (memory, _) in SIZES {
            let many = fs.check_within(memory, &|_, _| {}).unwrap();
            assert_eq!(summary(&many), summary(&one), "clean, in {memory} bytes");
            made.push((memory, many.passes));
        }
        assert_eq!(made, SIZES, "the spans each memory size makes");
        let d0 = fs.lookup(ROOT, b"d0").unwrap().ino;
        let d1 = fs.lookup(ROOT, b"d1").unwrap().ino;
        let d2 = fs.lookup(ROOT, b"d2").unwrap().ino;
        let f3 = fs.lookup(d1, b"f3").unwrap().ino;
        let first_big = fs.lookup(d0, b"f0").unwrap().ino;
        let last = fs.lookup(fs.lookup(d2, b"sub").unwrap().ino, b"empty29").unwrap().ino;
        {
            let mut st = fs.st();
            // An extra name: a link count one short.
            st.put(dirent_key(d2, b"extra"), encode_dirent(f3, Kind::File));
            // An entry naming no inode, and an xattr of no inode.
            st.put(dirent_key(d2, b"ghost"), encode_dirent(999_999, Kind::File));
            st.put(xattr_key(999_998, b"user.x"), b"v".to_vec());
            // A directory whose entry goes: it and its files unreachable.
            st.del(dirent_key(ROOT, b"d3"));
            // A block owned twice, early in the chunks (before the block
            // maps are given up at 3,840 bytes).
            let first = st.get(&extent_key(first_big, 0)).unwrap().unwrap();
            st.put(extent_key(first_big, 1_000), first);
            // A shared block without its reference list.
            let (lo, hi) = all_shared_range();
            let shared = st.scan(&lo, &hi, usize::MAX).unwrap();
            st.del(shared[0].0.clone());
            // Malformed keys that sort into later spans: a chunk key of a
            // late inode cut short, an xattr key of seven bytes of inode
            // number, a directory entry key likewise, and the last shared
            // block's key cut short.
            let mut k = extent_key(last, 0);
            k.truncate(12);
            st.put(k, b"x".to_vec());
            let mut k = xattr_key(0x0100, b"");
            k.truncate(8);
            st.put(k, b"x".to_vec());
            let mut k = dirent_key(0x0100, b"");
            k.truncate(8);
            st.put(k, encode_dirent(f3, Kind::File));
            let mut k = shared.last().unwrap().0.clone();
            k.truncate(11);
            st.put(k, b"x".to_vec());
            // An orphan.
            st.put(orphan_key(last), vec![0]);
            st.commit().unwrap();
        }
        let one = fs.check(&|_, _| {}).unwrap();
        let want = [
            "has link count 1, but 2 entries name it",
            "points at missing inode 999999",
            "belongs to missing inode 999998",
            "is not reachable from the root",
            "is owned by chunk",
            "lies past its size",
            "but has no reference list",
            "directory 1 has link count 6, its entries make 5",
            "malformed chunk key",
            "malformed xattr key",
            "malformed directory entry key",
            "malformed shared-block key",
        ];
        for w in want {
            assert!(one.problems.iter().any(|p| p.contains(w)), "{w:?} not in {:?}", one.problems);
        }
        assert_eq!(one.orphans, 1);
        for (memory, _) in SIZES {
            let many = fs.check_within(memory, &|_, _| {}).unwrap();
            assert_eq!(summary(&many), summary(&one), "damaged, in {memory} bytes");
        }
    }
}
