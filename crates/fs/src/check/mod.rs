//! fsck: a whole-image scan of the records ([`Fs::check`]), one
//! [`Checker`] whose methods are split by what they check: the tree
//! ([`tree`]), file data and blocks ([`blocks`]), history ([`history`]).

use std::collections::{BTreeMap, HashMap};

use zlogfs_engine::{BlockAddr, ReadPin, SegUsage};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::ops::namespace::name_str;
use crate::state::group::Group;
use crate::state::State;
use crate::{Fs, FsOptions};

mod blocks;
mod history;
pub(crate) mod scrub;
mod tree;

#[cfg(test)]
mod tests;

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
    /// Each segment's usage and the engine's own bytes in it, counted
    /// when `st` was pinned.
    usage: &'a [(SegUsage, u64)],
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
    ///
    /// It reads the file system as it was when it started, without its
    /// lock: requests go on meanwhile (at ten million files a check takes
    /// minutes). A writer that needs the segments it reads breaks it off:
    /// then [`Error::Again`], and nothing is reported.
    pub fn check_within(&self, memory: usize, progress: &dyn Fn(u64, u64)) -> Result<CheckReport> {
        let pinned = Pinned::take(self)?;
        let rep = pinned.check(memory, progress);
        // Broken, what it found may come from rewritten segments.
        pinned.going()?;
        rep
    }
}

/// The file system as it was at one commit, for reading without its
/// lock: the index pinned there, the segments that held live blocks then
/// kept from reuse, and their usage counted then.
struct Pinned {
    /// A read-only state reading at the pinned sequence number.
    st: State,
    usage: Vec<(SegUsage, u64)>,
    pin: ReadPin,
}

impl Pinned {
    /// Under the file system's lock, after a commit: the usage counted
    /// once the group is written (`usage_check` syncs, so every block the
    /// index names is counted), the pin, the group as committed.
    fn take(fs: &Fs) -> Result<Pinned> {
        let mut live = fs.st();
        live.commit()?;
        let eng = live.eng.clone();
        let usage = eng.usage_check()?;
        let pin = eng.read_pin();
        let group = Group::open(&eng)?;
        drop(live);
        // The checker reads blocks from the engine, not through a cache.
        let opts = FsOptions { read_only: true, cache_bytes: 0, dirty_bytes: 0, ..FsOptions::default() };
        Ok(Pinned { st: State::new(eng, group, &opts, Some(pin.seq())), usage, pin })
    }

    /// [`Error::Again`] once a writer broke the pin.
    fn going(&self) -> Result<()> {
        if self.pin.broken() {
            return Err(Error::Again(
                "the check gave way to writers that needed the log's last free segments: \
                 run it again when the file system has more room (or unmounted)"
                    .into(),
            ));
        }
        Ok(())
    }

    fn check(&self, memory: usize, progress: &dyn Fn(u64, u64)) -> Result<CheckReport> {
        let mut c = Checker::new(&self.st, &self.usage, memory);
        if c.damage() {
            return Ok(c.rep);
        }
        let spans = c.survey()?;
        c.reach()?;
        let one = spans.len() == 1;
        c.rep.passes.0 = spans.len();
        for (i, &(span, count)) in spans.iter().enumerate() {
            self.going()?;
            c.inode_span(span, count, i == 0, one)?;
        }
        c.check_reserved();
        let mut per_seg = HashMap::new();
        let total = c.block_bytes_estimate();
        if c.gathering {
            c.segs = (0, None);
            c.rep.passes.1 = 1;
            let total = c.block_bytes();
            c.block_span(&mut per_seg, progress, total)?;
        } else {
            let spans = c.seg_spans();
            c.rep.passes.1 = spans.len();
            for segs in spans {
                self.going()?;
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
    fn new(st: &'a State, usage: &'a [(SegUsage, u64)], memory: usize) -> Self {
        Checker {
            st,
            usage,
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
}
