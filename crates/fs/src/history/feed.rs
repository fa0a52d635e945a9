//! The change feed (issue 28; docs/decisions/2026-11-26-change-feed.md):
//! each commit group that changes the namespace, a file's data or an
//! inode's metadata writes one change record ([`change_key`], keyed by
//! the group's first sequence number) listing what its operations did,
//! by inode. "What changed between points S and U" reads the records of
//! the groups after S, never the tree: its cost follows the changes.
//!
//! Paths are found without a walk: the present name of an inode comes from
//! its parent (every inode records the directory of its first link) and
//! one scan of that directory; a name at an earlier point comes from
//! undoing the namespace events recorded since, newest first.

use std::collections::{BTreeMap, HashMap};

use zlogfs_engine::engine::Engine;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::State;
use crate::time::now;
use crate::Fs;

/// Change records are kept this long (then dropped oldest first; a feed
/// asked for an older start says so with `fresh_instance`).
pub const KEEP_CHANGES_SECS: i64 = 31 * 86_400;

/// Records dropped per pass of [`State::prune_changes`].
const PRUNE_STEP: usize = 256;

pub(crate) use crate::event::{Event, Link, Record, What};

/// What happened to one path between two points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangeOp {
    /// It did not exist at the start (no link), and does at the end.
    Created,
    /// It existed at the start, and has no link at the end.
    Deleted,
    /// One of its links moved (or was added or removed, others left).
    Renamed,
    /// Its data or metadata changed, its links did not.
    Changed,
}

impl ChangeOp {
    /// The word used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ChangeOp::Created => "created",
            ChangeOp::Deleted => "deleted",
            ChangeOp::Renamed => "renamed",
            ChangeOp::Changed => "changed",
        }
    }
}

/// One entry of a change feed. Paths are None when unknown: a file made
/// before record version 8, or whose first link was removed while others
/// remain, and that no event of the feed names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// What happened.
    pub op: ChangeOp,
    /// Its inode.
    pub ino: Ino,
    /// Its kind.
    pub kind: Kind,
    /// Where it is at the end (created, renamed, changed) or was at the
    /// start (deleted).
    pub path: Option<Vec<u8>>,
    /// Where it was at the start (renamed).
    pub old_path: Option<Vec<u8>>,
    /// Its data changed.
    pub data: bool,
    /// Its metadata changed (a link added or removed counts).
    pub metadata: bool,
}

/// The changes between two points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeFeed {
    /// The start point.
    pub since: u64,
    /// The end point.
    pub until: u64,
    /// The records needed are gone (or the start is not a point of this
    /// image): nothing is listed, and the caller must rescan.
    pub fresh_instance: bool,
    /// What changed, by path.
    pub changes: Vec<FileChange>,
}

/// The image's identity in clock tokens: the first 8 bytes of its uuid.
fn image_id(eng: &Engine) -> String {
    eng.superblock().uuid[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The point clock token `token` names: None when it is another image's.
pub(crate) fn parse_clock(eng: &Engine, token: &str) -> Result<Option<u64>> {
    let bad = || Error::invalid(format!("{token:?} is not a clock token (zlogfs:<16 hex digits>:<number>)"));
    let rest = token.strip_prefix("zlogfs:").ok_or_else(bad)?;
    let (id, seq) = rest.split_once(':').ok_or_else(bad)?;
    let seq: u64 = seq.parse().map_err(|_| bad())?;
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    Ok((id.eq_ignore_ascii_case(&image_id(eng))).then_some(seq))
}

/// Where the change records start: (point, its time). None: the image
/// has none (an image made before record version 8 that nothing changed
/// since).
pub(crate) fn records_from(st: &State) -> Result<Option<Snapshot>> {
    match st.get(&changes_from_key())? {
        Some(v) => Ok(Some(Snapshot::decode(&v, "the record of where change records start")?)),
        None => Ok(None),
    }
}

impl State {
    /// The current point: everything accepted so far committed.
    fn point_now(&mut self) -> Result<u64> {
        if !self.read_only {
            self.commit()?;
        }
        Ok(self.eng.seq())
    }

    /// Note what an operation did, for the group's change record.
    pub(crate) fn note(&mut self, ino: Ino, kind: Kind, what: What) {
        self.group.note(Event { ino, kind, what });
    }

    /// Drop change records older than [`KEEP_CHANGES_SECS`], at most
    /// [`PRUNE_STEP`] of them, in the pending group; move their start
    /// past them.
    pub(crate) fn prune_changes(&mut self) -> Result<()> {
        let Some(from) = records_from(self)? else { return Ok(()) };
        let limit = now().sec - KEEP_CHANGES_SECS;
        let (lo, hi) = changes_range();
        let recs = self.scan(&lo, &hi, PRUNE_STEP + 1)?;
        let (mut start, mut until) = (from.seq, from.time);
        let mut dropped = 0;
        for (k, v) in &recs {
            let seq =
                parse_change_key(k).ok_or_else(|| Error::corrupt(describe_key(k), "a malformed key"))?;
            let rec = Record::decode(v, &describe_key(k))?;
            if rec.time.sec >= limit || dropped == PRUNE_STEP {
                break;
            }
            self.del(k.clone());
            dropped += 1;
            start = start.max(seq);
            until = until.max(rec.time);
        }
        if dropped > 0 {
            // Groups after the next record's point, or after now when none
            // is left, all have records; the last dropped was sealed at
            // `until`, so a time from then on is still answered.
            let next = recs.get(dropped).and_then(|(k, _)| parse_change_key(k)).map(|s| s - 1);
            let seq = next.unwrap_or_else(|| self.eng.seq()).max(start);
            self.put(changes_from_key(), Snapshot { seq, time: until }.encode());
        }
        Ok(())
    }
}

/// The links of an inode as replayed: how many it has, and those known.
#[derive(Debug, Clone, Default)]
struct Links {
    count: i64,
    known: Vec<Link>,
}

impl Links {
    /// The links before `what` happened, given those after.
    fn undo(&mut self, what: &What) {
        match what {
            What::Made => *self = Links::default(),
            What::Linked(l) => {
                self.count -= 1;
                self.known.retain(|k| k != l);
            }
            What::Unlinked(l) => {
                self.count += 1;
                if !self.known.contains(l) {
                    self.known.push(l.clone());
                }
            }
            What::Moved(from, to) => {
                self.known.retain(|k| k != to);
                if !self.known.contains(from) {
                    self.known.push(from.clone());
                }
            }
            What::Data | What::Meta => {}
        }
    }
}

/// Present names, from inodes' parents and scans of those directories
/// (each scanned once), and the links the feed's events name, looked up.
struct Present<'a> {
    st: &'a State,
    dirs: HashMap<Ino, HashMap<Ino, Vec<Vec<u8>>>>,
    named: HashMap<Ino, Vec<Link>>,
}

impl Present<'_> {
    fn links(&mut self, ino: Ino) -> Result<Links> {
        let mut l = self.parent_links(ino)?;
        let named = self.named.get(&ino).cloned().unwrap_or_default();
        for c in &named {
            let here = self.st.lookup_entry(c.0, &c.1)?.is_some_and(|(i, _)| i == ino);
            if here && !l.known.contains(c) {
                l.known.push(c.clone());
            }
        }
        if l.known.is_empty() && l.count > 0 && ino != ROOT {
            // Its parent is not known (the name in it that made it so was
            // removed, a hard link's): its names are in the directories
            // the events name, if anywhere.
            let mut dirs: Vec<Ino> = named.iter().map(|c| c.0).collect();
            dirs.sort_unstable();
            dirs.dedup();
            for d in dirs {
                for n in self.dir_names(d)?.get(&ino).cloned().unwrap_or_default() {
                    l.known.push((d, n));
                }
            }
        }
        Ok(l)
    }

    /// The names in directory `dir`, by inode (scanned once).
    fn dir_names(&mut self, dir: Ino) -> Result<&HashMap<Ino, Vec<Vec<u8>>>> {
        if !self.dirs.contains_key(&dir) {
            let mut names: HashMap<Ino, Vec<Vec<u8>>> = HashMap::new();
            let (lo, hi) = dirents_range(dir);
            for (k, v) in self.st.scan(&lo, &hi, usize::MAX)? {
                if let (Some((_, n)), Ok((child, _))) = (parse_dirent_key(&k), decode_dirent(&v)) {
                    names.entry(child).or_default().push(n.to_vec());
                }
            }
            self.dirs.insert(dir, names);
        }
        Ok(&self.dirs[&dir])
    }

    fn parent_links(&mut self, ino: Ino) -> Result<Links> {
        let i = match self.st.inode(ino) {
            Ok(i) => i,
            Err(Error::NotFound(_)) => return Ok(Links::default()),
            Err(e) => return Err(e),
        };
        if i.nlink == 0 {
            return Ok(Links::default());
        }
        let count = if i.kind() == Kind::Dir { 1 } else { i64::from(i.nlink) };
        if ino == ROOT || i.parent == 0 {
            return Ok(Links { count, known: Vec::new() });
        }
        let names = self.dir_names(i.parent)?.get(&ino).cloned().unwrap_or_default();
        Ok(Links { count, known: names.into_iter().map(|n| (i.parent, n)).collect() })
    }
}

/// The feed's replay: links of every inode the events name, at the end
/// and start points.
struct Replay<'a> {
    present: Present<'a>,
    now: HashMap<Ino, Links>,
}

impl Replay<'_> {
    /// Links at a point, given those undone back to it (`at`).
    fn links(&mut self, at: &HashMap<Ino, Links>, ino: Ino) -> Result<Links> {
        if let Some(l) = at.get(&ino) {
            return Ok(l.clone());
        }
        if let Some(l) = self.now.get(&ino) {
            return Ok(l.clone());
        }
        let l = self.present.links(ino)?;
        self.now.insert(ino, l.clone());
        Ok(l)
    }

    /// The path of `link` at a point (`at`: links undone back to it).
    fn path(&mut self, at: &HashMap<Ino, Links>, link: &Link) -> Result<Option<Vec<u8>>> {
        let mut parts = vec![link.1.clone()];
        let mut dir = link.0;
        while dir != ROOT {
            if parts.len() > 4096 {
                return Err(Error::corrupt(format!("directory {dir}"), "its parents form a cycle"));
            }
            match self.links(at, dir)?.known.first() {
                Some((p, n)) => {
                    parts.push(n.clone());
                    dir = *p;
                }
                None => return Ok(None),
            }
        }
        let mut out = Vec::new();
        for p in parts.iter().rev() {
            out.push(b'/');
            out.extend_from_slice(p);
        }
        Ok(Some(out))
    }
}

impl Replay<'_> {
    /// The feed's entries for inode `ino` (`t`: what the window's events
    /// did to it; `at`: links undone back to the start and to the end):
    /// each link only at the start paired with one only at the end is a
    /// rename, the others are deleted or created paths; an inode whose
    /// links did not change but whose data or metadata did is changed.
    fn entries(
        &mut self,
        ino: Ino,
        t: &Touched,
        at: (&HashMap<Ino, Links>, &HashMap<Ino, Links>),
        out: &mut Vec<FileChange>,
    ) -> Result<()> {
        let (s, u) = (self.links(at.0, ino)?, self.links(at.1, ino)?);
        let kind = t.kind.unwrap_or(Kind::File);
        let (s_on, u_on) = (s.count > 0, u.count > 0);
        let gone: Vec<&Link> = s.known.iter().filter(|l| !u_on || !u.known.contains(l)).collect();
        let new: Vec<&Link> = u.known.iter().filter(|l| !s_on || !s.known.contains(l)).collect();
        let (data, metadata) = (s_on && u_on && t.data, s_on && u_on && t.meta);
        let entry = |op, path, old_path| {
            let flags = matches!(op, ChangeOp::Renamed | ChangeOp::Changed);
            FileChange { op, ino, kind, path, old_path, data: flags && data, metadata: flags && metadata }
        };
        for i in 0..gone.len().max(new.len()) {
            let old = match gone.get(i) {
                Some(l) => self.path(at.0, l)?,
                None => None,
            };
            let path = match new.get(i) {
                Some(l) => self.path(at.1, l)?,
                None => None,
            };
            out.push(match (gone.get(i).is_some(), new.get(i).is_some()) {
                (true, true) => entry(ChangeOp::Renamed, path, old),
                (true, false) => entry(ChangeOp::Deleted, old, None),
                _ => entry(ChangeOp::Created, path, None),
            });
        }
        if gone.is_empty() && new.is_empty() && s_on != u_on {
            // Its links are not known (a file made before record version
            // 8): said without a path.
            out.push(entry(if u_on { ChangeOp::Created } else { ChangeOp::Deleted }, None, None));
        } else if data || metadata {
            // Under a name it kept, if it has one (the root has no name:
            // its path is "/").
            let kept = u.known.iter().find(|l| s.known.contains(l));
            let path = match kept {
                Some(l) => self.path(at.1, l)?,
                None if ino == ROOT => Some(b"/".to_vec()),
                None => None,
            };
            if kept.is_some() || (gone.is_empty() && new.is_empty()) {
                out.push(entry(ChangeOp::Changed, path, None));
            }
        }
        Ok(())
    }
}

/// What the events of the window did to one inode.
#[derive(Default)]
struct Touched {
    kind: Option<Kind>,
    data: bool,
    meta: bool,
}

impl Fs {
    /// The current point: every operation accepted so far committed.
    pub fn point_now(&self) -> Result<u64> {
        let mut st = self.st();
        st.point_now()
    }

    /// The point at the end of the last group committed at or before `t`
    /// (from the change records' times); None when the change records
    /// kept do not reach back to `t`.
    pub fn point_at(&self, t: Time) -> Result<Option<u64>> {
        let mut st = self.st();
        let now_seq = st.point_now()?;
        match records_from(&st)? {
            Some(f) if f.time <= t => {}
            _ => return Ok(None),
        }
        let (lo, hi) = changes_range();
        let mut cur = lo;
        loop {
            let batch = st.scan(&cur, &hi, 1024)?;
            for (k, v) in &batch {
                let rec = Record::decode(v, &describe_key(k))?;
                if rec.time > t {
                    let seq =
                        parse_change_key(k).ok_or_else(|| Error::corrupt(describe_key(k), "bad key"))?;
                    return Ok(Some(seq - 1));
                }
            }
            match batch.last() {
                Some((k, _)) if batch.len() == 1024 => {
                    cur = k.clone();
                    cur.push(0);
                }
                _ => return Ok(Some(now_seq)),
            }
        }
    }

    /// What changed between points `since` and `until` (None: now), by
    /// inode: created, deleted, renamed (a link moved), or changed (data,
    /// metadata). Inodes made and gone again in between are left out.
    pub fn changes(&self, since: u64, until: Option<u64>) -> Result<ChangeFeed> {
        // One hold of the lock: the present the replay starts from is the
        // point the records reach (nothing accepted in between).
        let mut st = self.st();
        let now_seq = st.point_now()?;
        let until = until.unwrap_or(now_seq);
        if since > now_seq {
            // A point this image never reached (a copy of it from before
            // the start was put back): nothing can be said.
            return Ok(ChangeFeed { since, until, fresh_instance: true, changes: Vec::new() });
        }
        if until > now_seq || since > until {
            return Err(Error::invalid(format!(
                "no changes from point {since} to point {until}: the image is at point {now_seq}"
            )));
        }
        let gone = records_from(&st)?.is_none_or(|f| f.seq > since) && since < now_seq;
        if gone {
            return Ok(ChangeFeed { since, until, fresh_instance: true, changes: Vec::new() });
        }
        let (_, hi) = changes_range();
        let mut groups = Vec::new();
        for (k, v) in st.scan(&change_key(since + 1), &hi, usize::MAX)? {
            let seq = parse_change_key(&k).ok_or_else(|| Error::corrupt(describe_key(&k), "bad key"))?;
            groups.push((seq, Record::decode(&v, &describe_key(&k))?.events));
        }
        feed(&st, since, until, &groups)
    }

    /// The clock token of point `seq`: the image's identity and the point,
    /// `zlogfs:<16 hex digits>:<seq>`.
    pub fn clock(&self, seq: u64) -> String {
        format!("zlogfs:{}:{seq}", image_id(self.engine()))
    }

    /// The point a clock token names: None when it is another image's.
    pub fn parse_clock(&self, token: &str) -> Result<Option<u64>> {
        parse_clock(self.engine(), token)
    }
}

/// The feed from the groups after `since` up to now (`groups`, in order).
fn feed(st: &State, since: u64, until: u64, groups: &[(u64, Vec<Event>)]) -> Result<ChangeFeed> {
    let mut named: HashMap<Ino, Vec<Link>> = HashMap::new();
    for e in groups.iter().flat_map(|(_, es)| es) {
        match &e.what {
            What::Linked(l) | What::Unlinked(l) => named.entry(e.ino).or_default().push(l.clone()),
            What::Moved(a, b) => named.entry(e.ino).or_default().extend([a.clone(), b.clone()]),
            What::Made | What::Data | What::Meta => {}
        }
    }
    let present = Present { st, dirs: HashMap::new(), named };
    let mut rp = Replay { present, now: HashMap::new() };
    let mut at: HashMap<Ino, Links> = HashMap::new();
    let mut at_until = None;
    let mut touched: BTreeMap<Ino, Touched> = BTreeMap::new();
    for (seq, events) in groups.iter().rev() {
        if *seq <= until && at_until.is_none() {
            at_until = Some(at.clone());
        }
        for e in events.iter().rev() {
            if *seq <= until {
                let t = touched.entry(e.ino).or_default();
                t.kind = Some(e.kind);
                match e.what {
                    What::Data => t.data = true,
                    What::Meta | What::Linked(_) | What::Unlinked(_) => t.meta = true,
                    _ => {}
                }
            }
            let mut l = rp.links(&at, e.ino)?;
            l.undo(&e.what);
            at.insert(e.ino, l);
        }
    }
    let at_until = at_until.unwrap_or_else(|| at.clone());
    let mut changes = Vec::new();
    for (ino, t) in touched {
        rp.entries(ino, &t, (&at, &at_until), &mut changes)?;
    }
    changes.sort_by(|a, b| (a.path.is_none(), &a.path, a.op).cmp(&(b.path.is_none(), &b.path, b.op)));
    Ok(ChangeFeed { since, until, fresh_instance: false, changes })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, Store};

    use super::*;
    use crate::event::RECORD_MAX;
    use crate::{FsOptions, SetAttr};

    fn open(store: &Arc<dyn Store>) -> Fs {
        crate::testing::open(store, crate::testing::quiet(FsOptions::default()))
    }

    /// (op, path, old path, data, metadata) of a feed, as text.
    fn rows(f: &ChangeFeed) -> Vec<(String, String, String, bool, bool)> {
        let s = |p: &Option<Vec<u8>>| p.as_deref().map(|p| String::from_utf8_lossy(p).into_owned());
        f.changes
            .iter()
            .map(|c| {
                (
                    c.op.name().into(),
                    s(&c.path).unwrap_or_default(),
                    s(&c.old_path).unwrap_or_default(),
                    c.data,
                    c.metadata,
                )
            })
            .collect()
    }

    fn row(op: &str, path: &str, old: &str, data: bool, meta: bool) -> (String, String, String, bool, bool) {
        (op.into(), path.into(), old.into(), data, meta)
    }

    /// A group whose change record would pass one value's limit closes
    /// before the operation that would pass it (issue 44, item 1: 400
    /// unlinks of 250-byte names in one interval made a 102 KB record,
    /// the commit failed, every later change got EINVAL and the unlinks
    /// were undone). Every group commits, and the feed lists every
    /// delete; renames of long names to long names likewise.
    #[test]
    fn a_group_closes_before_its_change_record_outgrows_a_value() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 4 << 20, segment_count: 32 });
        let name = |i: usize, c: u8| {
            let mut n = format!("{i:05}").into_bytes();
            n.resize(250, c);
            n
        };
        for i in 0..400 {
            fs.create(ROOT, &name(i, b'a'), 0o644, 0, 0).unwrap();
        }
        fs.sync().unwrap();
        let s0 = fs.point_now().unwrap();
        for i in 0..400 {
            fs.rename(ROOT, &name(i, b'a'), ROOT, &name(i, b'b'), 0).unwrap();
        }
        for i in 0..400 {
            fs.unlink(ROOT, &name(i, b'b')).unwrap();
        }
        fs.commit().expect("the last group commits");
        fs.mkdir(ROOT, b"after", 0o755, 0, 0).expect("changes go on");
        fs.sync().unwrap();
        {
            let st = fs.st();
            let (lo, hi) = changes_range();
            let recs = st.scan(&lo, &hi, usize::MAX).unwrap();
            assert!(recs.len() >= 5, "the renames and deletes took several groups: {}", recs.len());
            assert!(recs.iter().all(|(_, v)| v.len() <= RECORD_MAX));
        }
        let feed = fs.changes(s0, None).unwrap();
        let deleted = feed.changes.iter().filter(|c| c.op == ChangeOp::Deleted).count();
        assert_eq!(deleted, 400, "every delete is in the feed");
        fs.close().unwrap();
        let fs = open(&store);
        assert_eq!(fs.readdir(ROOT, None, 1000).unwrap().len(), 1, "the deletes stayed");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }

    /// A data change of a file is listed when one of its hard links goes
    /// in the same window (issue 44, item 7: only `deleted /b2` was), and
    /// the root directory is listed as "/".
    #[test]
    fn a_removed_hard_link_does_not_hide_a_data_change() {
        let (_, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let b = fs.create(ROOT, b"b", 0o644, 0, 0).unwrap().ino;
        fs.write(b, 0, &vec![7u8; 200_000]).unwrap();
        fs.link(b, ROOT, b"b2").unwrap();
        fs.sync().unwrap();
        let s1 = fs.point_now().unwrap();
        for same_group in [false, true] {
            let s = fs.point_now().unwrap();
            fs.write(b, 100_000, b"X").unwrap();
            if !same_group {
                fs.commit().unwrap();
            }
            let gone: &[u8] = if same_group { b"b3" } else { b"b2" };
            if same_group {
                fs.link(b, ROOT, b"b3").unwrap();
                fs.commit().unwrap();
                let s2 = fs.point_now().unwrap();
                fs.write(b, 100_000, b"Y").unwrap();
                fs.unlink(ROOT, gone).unwrap();
                let got = rows(&fs.changes(s2, None).unwrap());
                assert!(got.contains(&row("changed", "/b", "", true, true)), "{got:?}");
                assert!(got.contains(&row("deleted", "/b3", "", false, false)), "{got:?}");
                continue;
            }
            fs.unlink(ROOT, gone).unwrap();
            let got = rows(&fs.changes(s, None).unwrap());
            assert!(got.contains(&row("changed", "/b", "", true, true)), "{got:?}");
            assert!(got.contains(&row("deleted", "/b2", "", false, false)), "{got:?}");
            assert!(got.iter().all(|r| !r.1.is_empty() || r.0 == "deleted"), "every path known: {got:?}");
        }
        fs.setattr(ROOT, &SetAttr { mode: Some(0o700), ..SetAttr::default() }).unwrap();
        let got = rows(&fs.changes(s1, None).unwrap());
        assert!(got.contains(&row("changed", "/", "", false, true)), "the root is \"/\": {got:?}");
    }

    /// Each kind of change between two points, with paths at each end
    /// (a directory renamed after the end point does not change them),
    /// across a reopen; a start before the records is a fresh instance.
    #[test]
    fn the_feed_lists_what_changed_between_two_points() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let mk = |p, n: &[u8]| fs.create(p, n, 0o644, 0, 0).unwrap().ino;
        let a = mk(ROOT, b"a");
        let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
        let x = mk(d, b"x");
        fs.write(x, 0, b"x").unwrap();
        mk(ROOT, b"old");
        mk(ROOT, b"m");
        let s0 = fs.point_now().unwrap();
        assert!(fs.changes(0, None).unwrap().fresh_instance, "before the first record");
        fs.close().unwrap();
        let fs = open(&store);
        let mk = |p, n: &[u8]| fs.create(p, n, 0o644, 0, 0).unwrap().ino;
        fs.write(a, 0, b"new").unwrap();
        fs.setattr(x, &SetAttr { mode: Some(0o600), ..SetAttr::default() }).unwrap();
        fs.rename(ROOT, b"d", ROOT, b"e", 0).unwrap();
        mk(d, b"y");
        mk(ROOT, b"t");
        fs.unlink(ROOT, b"t").unwrap();
        fs.unlink(ROOT, b"old").unwrap();
        fs.rename(ROOT, b"m", d, b"m2", 0).unwrap();
        fs.link(a, d, b"a2").unwrap();
        let s1 = fs.point_now().unwrap();
        fs.rename(ROOT, b"e", ROOT, b"f", 0).unwrap();
        fs.write(x, 0, b"later").unwrap();
        let want = vec![
            row("changed", "/a", "", true, true),
            row("created", "/e/a2", "", false, false),
            row("renamed", "/e", "/d", false, false),
            row("changed", "/e/x", "", false, true),
            row("created", "/e/y", "", false, false),
            row("renamed", "/e/m2", "/m", false, false),
            row("deleted", "/old", "", false, false),
        ];
        let mut got = rows(&fs.changes(s0, Some(s1)).unwrap());
        let mut w = want.clone();
        got.sort();
        w.sort();
        assert_eq!(got, w, "from {s0} to {s1}");
        let now = fs.changes(s0, None).unwrap();
        let paths: Vec<_> = rows(&now).into_iter().map(|r| r.1).collect();
        assert!(paths.contains(&"/f/x".to_string()) && paths.contains(&"/f".to_string()), "{paths:?}");
        let later = rows(&fs.changes(s1, None).unwrap());
        assert_eq!(
            later,
            vec![row("renamed", "/f", "/e", false, false), row("changed", "/f/x", "", true, false)]
        );
        assert!(fs.changes(s1, Some(s1)).unwrap().changes.is_empty());
        assert!(fs.changes(s1, Some(s0)).is_err(), "an end before the start");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }

    /// Old records are dropped, and where they start moves past them with
    /// the time of the last one dropped: a time after it is still a point
    /// (not a fresh instance).
    #[test]
    fn pruning_keeps_later_times_answerable() {
        let (_, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        fs.sync().unwrap();
        let old = Time { sec: now().sec - KEEP_CHANGES_SECS - 86_400, nsec: 0 };
        {
            // Age the records written so far, and where they start.
            let mut st = fs.st();
            let (lo, hi) = changes_range();
            for (k, v) in st.scan(&lo, &hi, usize::MAX).unwrap() {
                let mut r = Record::decode(&v, "r").unwrap();
                r.time = old;
                st.put(k, r.encode());
            }
            let f = records_from(&st).unwrap().unwrap();
            st.put(
                changes_from_key(),
                Snapshot { seq: f.seq, time: Time { sec: old.sec - 1, nsec: 0 } }.encode(),
            );
            st.commit().unwrap();
        }
        fs.create(ROOT, b"b", 0o644, 0, 0).unwrap();
        fs.sync().unwrap();
        {
            let mut st = fs.st();
            st.prune_changes().unwrap();
            st.commit().unwrap();
            let f = records_from(&st).unwrap().unwrap();
            assert_eq!(f.time, old, "the time of the last record dropped");
        }
        let later = Time { sec: old.sec + 1, nsec: 0 };
        let p = fs.point_at(later).unwrap().expect("a time after the dropped records is a point");
        let feed = fs.changes(p, None).unwrap();
        assert!(!feed.fresh_instance);
        let names: Vec<_> = feed.changes.iter().filter_map(|c| c.path.clone()).collect();
        assert_eq!(names, vec![b"/b".to_vec()], "what came after");
        assert!(fs.point_at(Time { sec: old.sec - 10, nsec: 0 }).unwrap().is_none(), "before them: gone");
    }
}
