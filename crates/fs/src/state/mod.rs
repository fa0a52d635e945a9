//! The state behind the file system's lock, and the records it reads
//! and writes: the parts, each owning its fields ([`Group`], [`Buffers`],
//! [`BlockCache`]), and the policy and counters the operations share. The
//! operations' code lies by job in [`crate::ops::namespace`], [`crate::ops::files`],
//! [`crate::ops::xattr`], [`crate::ops::data`], [`crate::ops::commit`] and
//! [`crate::clean`], each an `impl State` over these parts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use zlogfs_engine::engine::Engine;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::buffers::Buffers;
use crate::state::cache::BlockCache;
use crate::state::group::Group;
use crate::{Atime, Attr, FsStats};

pub(crate) mod buffers;
pub(crate) mod cache;
pub(crate) mod group;
pub(crate) mod handle;
pub(crate) mod pending;

/// Entries a walk of a key range reads from the index at a time.
const SCAN_PAGE: usize = 4096;

/// Entries (of a directory, inodes, chunk records, held frees) an admin
/// walk on a mounted file system reads under the state lock at a time:
/// other requests wait for a page, a few milliseconds, not for the walk.
pub(crate) const WALK_PAGE: usize = 1024;

/// How long an admin walk holds the state lock for a page at most (past
/// the entry that crosses it).
const WALK_HOLD: std::time::Duration = std::time::Duration::from_millis(10);

/// [`State::for_each`] with the state taken by `lock` for one page of
/// `step` entries at a time, `f` called on each entry of it under the
/// lock, and `between` called between pages with the lock let go: on a
/// mounted file system a walk of the whole image holds other requests up
/// for a page, not for the walk (issue 45: `zlogfs stats` on a mount of a
/// million files held every request for 6-7 s). Entries changed between
/// pages are seen as they were or as they became; with `lock` giving a
/// state already held, this is [`State::for_each`].
pub(crate) fn for_each_paged<G: std::ops::Deref<Target = State>>(
    lock: &dyn Fn() -> G,
    lo: &[u8],
    hi: &[u8],
    step: usize,
    between: &mut dyn FnMut(),
    mut f: impl FnMut(&State, &[u8], &[u8]) -> Result<()>,
) -> Result<()> {
    let mut page = Vec::new();
    let mut cur = Some(lo.to_vec());
    while let Some(from) = cur {
        {
            let st = lock();
            let held = std::time::Instant::now();
            cur = st.page(&from, hi, step, &mut page)?;
            let mut rest = page.drain(..);
            for (k, v) in rest.by_ref() {
                f(&st, &k, &v)?;
                // Entries that read cold blocks (a file's chunks, its
                // blocks' headers) take milliseconds each: the page ends
                // early, and the next one starts after this entry.
                if held.elapsed() >= WALK_HOLD {
                    if rest.len() > 0 {
                        cur = Some(key_after(&k));
                    }
                    break;
                }
            }
        }
        if cur.is_some() {
            between();
        }
    }
    Ok(())
}

/// Mutable state, behind one lock.
pub(crate) struct State {
    pub(crate) eng: Arc<Engine>,
    /// The operations accepted since the last commit.
    pub(crate) group: Group,
    /// File data written since the last commit.
    pub(crate) bufs: Buffers,
    /// Decompressed blocks.
    pub(crate) cache: BlockCache,
    /// Open handles per inode: an inode unlinked while open lives until
    /// its last handle is released.
    pub(crate) open: HashMap<Ino, u32>,
    pub(crate) atime: Atime,
    pub(crate) diratime: bool,
    /// Small overwrites may be stored as patches ([`crate::FsOptions::patches`]).
    pub(crate) patches: bool,
    /// Nothing may be written ([`crate::FsOptions::read_only`]).
    pub(crate) read_only: bool,
    pub(crate) stats: FsStats,
    /// Free log bytes as of the last commit: buffered data past this is
    /// committed before a write is accepted, so that a full log gives the
    /// writer ENOSPC instead of failing a later commit.
    pub(crate) space_hint: u64,
    /// A cleaning round is running (its commits do not clean).
    pub(crate) cleaning: bool,
    /// The round running moves file data to the bulk device of two.
    pub(crate) demoting: bool,
    /// The cleaning round running stores the files it moves in their cold
    /// form (only its own moves are buffered then: the writers' buffers
    /// are set aside, see [`State::aside`]).
    pub(crate) moving_cold: bool,
    /// Commits so far when moving data down last missed its target.
    pub(crate) demote_futile_at: Option<u64>,
    /// Commits so far when cleaning last failed to make the room a writer
    /// needed (see `clean_for`).
    pub(crate) futile_at: Option<u64>,
    /// Reads see the index at this sequence number (a snapshot opened
    /// read-only); None: the present.
    pub(crate) at: Option<u64>,
    /// Moves on before held blocks are moved or released: shared with
    /// the views of this file system's snapshots ([`crate::Fs::view`]),
    /// whose reads and cached blocks are good only while it stays.
    pub(crate) held_gen: Arc<AtomicU64>,
    /// Bytes held only for automatic points, per segment, and when
    /// counted ([`State::purgeable_by_segment`]).
    pub(crate) purgeable_at: Option<(std::time::Instant, Arc<std::collections::BTreeMap<u32, u64>>)>,
}

impl State {
    /// The state of a file system just opened on `eng`, reading at `at`
    /// (None: the present).
    pub(crate) fn new(eng: Arc<Engine>, group: Group, opts: &crate::FsOptions, at: Option<u64>) -> State {
        let space_hint = eng.free_bytes().saturating_sub(group.counters().reserved);
        State {
            eng,
            bufs: Buffers::new(opts.dirty_bytes),
            group,
            cache: BlockCache::new(opts.cache_bytes),
            open: HashMap::new(),
            atime: if opts.read_only { Atime::Noatime } else { opts.atime },
            diratime: opts.diratime,
            read_only: opts.read_only,
            patches: opts.patches,
            stats: FsStats::default(),
            space_hint,
            cleaning: false,
            demoting: false,
            moving_cold: false,
            demote_futile_at: None,
            futile_at: None,
            at,
            held_gen: Arc::new(AtomicU64::new(0)),
            purgeable_at: None,
        }
    }

    /// Held blocks are about to move or be released: views must read
    /// again what they read meanwhile.
    pub(crate) fn held_blocks_move(&self) {
        self.held_gen.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.group.get(key) {
            Some(v) => Ok(v.map(|v| v.to_vec())),
            None => Ok(match self.at {
                Some(seq) => self.eng.get_at(key, seq)?,
                None => self.eng.get(key)?,
            }),
        }
    }

    pub(crate) fn put(&mut self, key: Vec<u8>, val: Vec<u8>) {
        self.group.put(key, val);
    }

    pub(crate) fn del(&mut self, key: Vec<u8>) {
        self.group.del(key);
    }

    /// Entries of `[lo, hi)`, pending mutations applied, at most `limit`.
    pub(crate) fn scan(&self, lo: &[u8], hi: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut cur = Some(lo.to_vec());
        while let Some(from) = cur {
            cur = self.page(&from, hi, limit.clamp(64, 4096), &mut out)?;
            if out.len() >= limit {
                break;
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Call `f` on each entry of `[lo, hi)` in key order, pending
    /// mutations applied, a page at a time: what a walk of the whole
    /// index holds is a page, not the range (issue 45: whole-image tools
    /// held every record of a million files).
    pub(crate) fn for_each(
        &self,
        lo: &[u8],
        hi: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut page = Vec::new();
        let mut cur = Some(lo.to_vec());
        while let Some(from) = cur {
            cur = self.page(&from, hi, SCAN_PAGE, &mut page)?;
            for (k, v) in page.drain(..) {
                f(&k, &v)?;
            }
        }
        Ok(())
    }

    /// Append up to `step` stored entries from `from` (and the pending
    /// ones among them) to `out`; where the next page starts, or None at
    /// the end of the range.
    pub(crate) fn page(
        &self,
        from: &[u8],
        hi: &[u8],
        step: usize,
        out: &mut Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Option<Vec<u8>>> {
        let stored = match self.at {
            Some(seq) => self.eng.scan_at(from, Some(hi), step, seq)?,
            None => self.eng.scan(from, Some(hi), step)?,
        };
        let next = match stored.last() {
            Some((k, _)) if stored.len() >= step => Some(key_after(k)),
            _ => None,
        };
        pending::merge_scan(stored, self.group.pending(), from, Some(next.as_deref().unwrap_or(hi)), out);
        Ok(next)
    }

    pub(crate) fn inode(&self, ino: Ino) -> Result<Inode> {
        match self.get(&inode_key(ino))? {
            Some(v) => {
                let base = self.group.cfg().base_sec;
                Ok(Inode::decode(ino, &v, base, |id| self.group.triple(id))?)
            }
            None => Err(Error::not_found(format!("inode {ino} does not exist"))),
        }
    }

    pub(crate) fn save(&mut self, i: &Inode) {
        let id = self.group.triple_id(i.triple());
        let v = i.encode(id, self.group.cfg().base_sec);
        if i.chunk.is_some() {
            self.group.mark_version(6);
        }
        if i.tier.is_some() {
            self.group.mark_version(9);
        }
        if i.unit.is_some() {
            self.group.mark_version(10);
        }
        if i.cold.is_some() {
            self.group.mark_version(11);
        }
        self.put(inode_key(i.ino), v);
    }

    pub(crate) fn lookup_entry(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, Kind)>> {
        match self.get(&dirent_key(parent, name))? {
            Some(v) => Ok(Some(decode_dirent(&v)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn dir(&self, ino: Ino) -> Result<Inode> {
        let i = self.inode(ino)?;
        if i.kind() != Kind::Dir {
            return Err(Error::not_dir(format!("inode {ino} is not a directory")));
        }
        Ok(i)
    }

    /// A directory that can take new entries: not removed (a removed
    /// directory may still be open, but POSIX gives it no new names).
    pub(crate) fn live_dir(&self, ino: Ino) -> Result<Inode> {
        let i = self.dir(ino)?;
        if i.nlink == 0 {
            return Err(Error::not_found(format!("directory {ino} was removed")));
        }
        Ok(i)
    }

    pub(crate) fn attr(&self, i: &Inode) -> Attr {
        Attr {
            ino: i.ino,
            kind: i.kind(),
            mode: i.mode,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            size: i.size,
            blocks: i.alloc.div_ceil(512),
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            btime: i.btime,
            blksize: self.cs(i) as u32,
        }
    }

    /// Log and count an error of background work (`what`): nobody waits
    /// for its result. The first of a kind is a warning; the same error
    /// again is only counted (and logged at debug level), so that a full
    /// image cleaned at every interval does not fill the log.
    pub(crate) fn background_error(&mut self, what: &str, e: &Error) {
        let text = format!("{what} failed: {e}");
        if self.stats.last_background_error.as_deref() == Some(text.as_str()) {
            tracing::debug!("{text} (again)");
        } else {
            tracing::warn!("{text}");
        }
        self.stats.background_errors += 1;
        self.stats.last_background_error = Some(text);
    }

    /// Delete what an orphan record says is left to delete.
    pub(crate) fn finish_orphans(&mut self) -> Result<()> {
        let (lo, hi) = orphans_range();
        loop {
            let batch = self.scan(&lo, &hi, 64)?;
            if batch.is_empty() {
                return Ok(());
            }
            for (k, v) in batch {
                let ino =
                    parse_orphan_key(&k).ok_or_else(|| Error::corrupt("orphan key", format!("{k:02x?}")))?;
                let from = zlogfs_engine::bytes::Reader::new(&v, "orphan record").var()?;
                self.trim_all(ino, from)?;
            }
        }
    }
}
