//! The file system layer against a simple in-memory model: random
//! sequences of namespace, data, xattr, sync, crash and reopen steps. Every
//! operation must succeed or fail (with the same errno) as in the model;
//! the whole tree is compared regularly; after a power cut the recovered
//! tree must equal the model after some accepted operation no older than
//! the last sync (prefix semantics).
//!
//! Replay a failure with the seed it prints: `ZLOGFS_SEED=n cargo test
//! -p zlogfs-fs --test fs_model`.

mod common;
#[path = "fs_model/feed.rs"]
mod feed;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::Rng;
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::store::{CrashMode, FaultConfig, FaultStore, Geometry, Store, TwoStore};
use zlogfs_fs::errno as fuse_errno;
use zlogfs_fs::{self as fs, Fs, FsOptions, Ino, Kind, MkfsOptions, SetAttr, ROOT};
use zlogfs_s3::{S3Options, S3Store, S3Url, SyncMode as BucketSync};

fn mkfs_opts(chunk: u32, history: bool) -> MkfsOptions {
    MkfsOptions {
        chunk_size: chunk,
        pack_bytes: 16 << 10,
        inline_max: 64,
        codec: CodecSpec::new(CodecId::Zstd, 1),
        // Every commit an automatic point.
        history: if history { "all:1h".parse().expect("policy") } else { fs::HistoryPolicy::NONE },
        ..MkfsOptions::default()
    }
}

fn fs_opts() -> FsOptions {
    FsOptions {
        engine: common::small_opts(),
        commit_interval: None,
        dirty_bytes: 1 << 20,
        // Small overwrites as patches (they happen with chunks above 4 KiB).
        patches: true,
        ..FsOptions::default()
    }
}

/// The stores of a run's image: one, or a fast and a bulk one (issue 29),
/// or an image in a bucket (issue 30).
struct Rig {
    /// The only store, or the fast one (unused with a bucket).
    st: Arc<FaultStore>,
    bulk: Option<Arc<FaultStore>>,
    s3: Option<BucketRig>,
}

/// An image in a bucket of a real S3 server (moto on 127.0.0.1): the
/// store of the current process and its cache directory.
struct BucketRig {
    opts: S3Options,
    /// The store mkfs writes through (taken by the first [`Rig::store`]).
    made: Mutex<Option<S3Store>>,
    cur: Mutex<Option<Arc<S3Store>>>,
}

impl BucketRig {
    /// A new image of `geometry` in a bucket of its own.
    fn new(sync: BucketSync, geometry: Geometry) -> BucketRig {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bucket = format!("model-{}-{n}", std::process::id());
        zlogfs_testkit::s3::moto().bucket(&bucket);
        let cache = std::env::temp_dir().join(format!("zlogfs-model-{bucket}"));
        let _ = std::fs::remove_dir_all(&cache);
        let url = S3Url { bucket, prefix: "img".into() };
        let opts = S3Options {
            sync,
            upload_every: std::time::Duration::from_millis(100),
            ..S3Options::new(url, cache)
        };
        let made = S3Store::create(opts.clone(), geometry).expect("an image in the bucket");
        BucketRig { opts, made: Mutex::new(Some(made)), cur: Mutex::new(None) }
    }

    /// The store of the running process: opened (the image claimed) when
    /// the last one was closed or crashed.
    fn store(&self) -> Arc<dyn Store> {
        let mut cur = self.cur.lock().expect("rig");
        if let Some(made) = self.made.lock().expect("rig").take() {
            return cur.insert(Arc::new(made)).clone();
        }
        if cur.as_ref().is_some_and(|s| Arc::strong_count(s) == 1) {
            // Its file system closed: a clean close uploads everything.
            *cur = None;
        }
        cur.get_or_insert_with(|| Arc::new(S3Store::open(self.opts.clone()).expect("opening the image")))
            .clone()
    }

    /// The process is killed: nothing more is uploaded, the cache
    /// directory keeps what reached it. Under sync=remote every other
    /// crash loses the machine and its cache directory as well.
    fn crash(&self, seed: u64) {
        if let Some(s) = self.cur.lock().expect("rig").take() {
            s.abandon();
            assert_eq!(Arc::strong_count(&s), 1, "the crashed file system still holds its store");
        }
        if self.opts.sync == BucketSync::Remote && seed % 2 == 0 {
            std::fs::remove_dir_all(&self.opts.cache_dir).expect("removing the cache directory");
        }
    }
}

impl Drop for BucketRig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.opts.cache_dir);
    }
}

impl Rig {
    fn store(&self) -> Arc<dyn Store> {
        if let Some(b) = &self.s3 {
            return b.store();
        }
        match &self.bulk {
            None => self.st.clone(),
            Some(b) => {
                let names = ("fast".to_string(), "bulk".to_string());
                Arc::new(TwoStore::new(self.st.clone(), b.clone(), names, false).expect("two stores"))
            }
        }
    }

    /// Power cut. On two stores, by `seed`: to both, or to one while the
    /// other keeps every write it had (its cache reached it).
    fn power_cut(&self, mode: CrashMode, seed: u64) {
        if let Some(b) = &self.s3 {
            return b.crash(seed);
        }
        if let Some(b) = &self.bulk {
            let keep = |s: &FaultStore| {
                // Its writes reach it (faults of the run aside).
                s.set_faults(FaultConfig::default());
                s.sync().expect("a store keeps its writes");
            };
            match seed % 3 {
                0 => keep(b),
                1 => keep(&self.st),
                _ => {}
            }
            b.power_cut(mode, seed);
        }
        self.st.power_cut(mode, seed);
    }

    /// The store a fault goes to: on two, either, by `pick`.
    fn faulty(&self, pick: bool) -> &Arc<FaultStore> {
        match &self.bulk {
            Some(b) if pick => b,
            _ => &self.st,
        }
    }
}

/// On two stores, files above 4 KiB keep their chunks on the bulk one, so
/// that the model's files use both.
fn fresh(chunk: u32, history: bool, two: bool, bucket: Option<BucketSync>) -> Rig {
    let g = |n: u32| Geometry { segment_size: 512 << 10, segment_count: n };
    let rig = match bucket {
        Some(sync) => {
            Rig { st: Arc::new(FaultStore::new(g(1))), bulk: None, s3: Some(BucketRig::new(sync, g(96))) }
        }
        None if two => Rig {
            st: Arc::new(FaultStore::new(g(32))),
            bulk: Some(Arc::new(FaultStore::new(g(64)))),
            s3: None,
        },
        None => Rig { st: Arc::new(FaultStore::new(g(96))), bulk: None, s3: None },
    };
    // As an object store deletes them: a read of a freed segment fails.
    rig.st.junk_freed(true);
    if let Some(b) = &rig.bulk {
        b.junk_freed(true);
    }
    let o = MkfsOptions {
        small_max: if two { 4096 } else { fs::DEFAULT_SMALL_MAX },
        ..mkfs_opts(chunk, history)
    };
    fs::mkfs(rig.store(), &o).expect("mkfs");
    rig
}

/// The newest automatic point, if it is of the commit just made: (name,
/// its sequence number).
fn point_of_last_commit(f: &Fs) -> Option<String> {
    let newest = f
        .snapshots()
        .expect("list")
        .into_iter()
        .filter(|(n, _)| n.starts_with('@'))
        .max_by_key(|(_, s)| s.seq);
    newest.filter(|(_, s)| s.seq == f.engine().seq()).map(|(n, _)| n)
}

/// Forget the automatic points a power cut lost. A point's name is its
/// time in milliseconds and its sequence number, and a lost commit's
/// sequence numbers are given again after recovery: a test that recovers
/// within the millisecond may see a new point under a lost one's name.
fn forget_lost_points(f: &Fs, points: &mut BTreeMap<String, Model>) {
    let kept: BTreeSet<String> = f.snapshots().expect("list").into_iter().map(|(n, _)| n).collect();
    points.retain(|n, _| kept.contains(n));
}

fn open_snapshot(st: &Rig, name: &str) -> Fs {
    let s = st.store();
    Fs::open(s, FsOptions { read_only: true, snapshot: Some(name.to_string()), ..fs_opts() })
        .expect("open a snapshot")
}

fn open(st: &Rig) -> Fs {
    let s = st.store();
    Fs::open(s, fs_opts()).expect("open")
}

#[derive(Clone, Debug, PartialEq)]
enum MKind {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
    Sym(Vec<u8>),
}

#[derive(Clone, Debug)]
struct MNode {
    kind: MKind,
    perm: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    parent: u64,
    /// Data and metadata changes so far, and whether it ever had a second
    /// link (for the change feed's check).
    dv: u64,
    mv: u64,
    shared: bool,
}

impl MNode {
    fn new(kind: MKind, perm: u32, parent: u64) -> MNode {
        MNode { kind, perm, xattrs: BTreeMap::new(), parent, dv: 0, mv: 0, shared: false }
    }
}

#[derive(Clone, Debug)]
struct Model {
    nodes: BTreeMap<u64, MNode>,
    next: u64,
}

type Res = Result<(), i32>;

/// One entry of a canonical dump: kind, permissions, link count, contents,
/// xattrs, the first path of the same inode (hard links), and its number
/// (the model numbers nodes as the file system does inodes: after a power
/// cut, of two states with the same tree, the one with the same numbers).
type Dump = BTreeMap<Vec<u8>, (char, u32, u32, Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>, Vec<u8>, u64)>;

impl Model {
    fn new() -> Model {
        let root = MNode::new(MKind::Dir(BTreeMap::new()), 0o755, 1);
        Model { nodes: [(1, root)].into(), next: 2 }
    }
    fn children(&self, id: u64) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match &self.nodes[&id].kind {
            MKind::Dir(c) => Some(c),
            _ => None,
        }
    }
    fn children_mut(&mut self, id: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.nodes.get_mut(&id).expect("node").kind {
            MKind::Dir(c) => c,
            _ => panic!("not a dir"),
        }
    }
    /// Resolve the parent directory of `path`; (dir id, last name).
    fn parent<'a>(&self, path: &'a [Vec<u8>]) -> Result<(u64, &'a [u8]), i32> {
        let mut cur = 1;
        for c in &path[..path.len() - 1] {
            let ch = self.children(cur).ok_or(libc::ENOTDIR)?;
            cur = *ch.get(c).ok_or(libc::ENOENT)?;
        }
        self.children(cur).ok_or(libc::ENOTDIR)?;
        Ok((cur, &path[path.len() - 1]))
    }
    fn resolve(&self, path: &[Vec<u8>]) -> Result<u64, i32> {
        let (d, n) = self.parent(path)?;
        self.children(d).expect("dir").get(n).copied().ok_or(libc::ENOENT)
    }
    fn is_dir(&self, id: u64) -> bool {
        matches!(self.nodes[&id].kind, MKind::Dir(_))
    }
    fn links(&self, id: u64) -> usize {
        self.nodes
            .values()
            .filter_map(|n| match &n.kind {
                MKind::Dir(c) => Some(c.values().filter(|&&x| x == id).count()),
                _ => None,
            })
            .sum()
    }
    fn add(&mut self, path: &[Vec<u8>], kind: MKind, perm: u32) -> Res {
        let (d, n) = self.parent(path)?;
        if self.children(d).expect("dir").contains_key(n) {
            return Err(libc::EEXIST);
        }
        let id = self.next;
        self.next += 1;
        self.nodes.insert(id, MNode::new(kind, perm, d));
        self.children_mut(d).insert(n.to_vec(), id);
        Ok(())
    }
    fn gc(&mut self, id: u64) {
        if self.links(id) == 0 {
            self.nodes.remove(&id);
        }
    }
    fn link(&mut self, src: &[Vec<u8>], dst: &[Vec<u8>]) -> Res {
        let s = self.resolve(src)?;
        let (d, n) = self.parent(dst)?;
        if self.is_dir(s) {
            return Err(libc::EPERM);
        }
        if self.children(d).expect("dir").contains_key(n) {
            return Err(libc::EEXIST);
        }
        self.children_mut(d).insert(n.to_vec(), s);
        self.nodes.get_mut(&s).expect("linked").shared = true;
        Ok(())
    }
    /// Count a data (or metadata) change of the node at `path`.
    fn bump(&mut self, path: &[Vec<u8>], meta: bool) {
        let id = self.resolve(path).expect("changed");
        let n = self.nodes.get_mut(&id).expect("node");
        if meta {
            n.mv += 1;
        } else {
            n.dv += 1;
        }
    }
    fn unlink(&mut self, path: &[Vec<u8>]) -> Res {
        let (d, n) = self.parent(path)?;
        let id = *self.children(d).expect("dir").get(n).ok_or(libc::ENOENT)?;
        if self.is_dir(id) {
            return Err(libc::EISDIR);
        }
        self.children_mut(d).remove(n);
        self.gc(id);
        Ok(())
    }
    fn rmdir(&mut self, path: &[Vec<u8>]) -> Res {
        let (d, n) = self.parent(path)?;
        let id = *self.children(d).expect("dir").get(n).ok_or(libc::ENOENT)?;
        match self.children(id) {
            None => return Err(libc::ENOTDIR),
            Some(c) if !c.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.children_mut(d).remove(n);
        self.nodes.remove(&id);
        Ok(())
    }
    fn below(&self, dir: u64, moved: u64) -> bool {
        let mut cur = dir;
        loop {
            if cur == moved {
                return true;
            }
            if cur == 1 {
                return false;
            }
            cur = self.nodes[&cur].parent;
        }
    }
    fn rename(&mut self, src: &[Vec<u8>], dst: &[Vec<u8>], flags: u32) -> Res {
        let (p, n) = self.parent(src)?;
        let (np, nn) = self.parent(dst)?;
        let s = *self.children(p).expect("dir").get(n).ok_or(libc::ENOENT)?;
        let d = self.children(np).expect("dir").get(nn).copied();
        if flags & fs::RENAME_EXCHANGE != 0 && d.is_none() {
            return Err(libc::ENOENT);
        }
        if flags & fs::RENAME_NOREPLACE != 0 && d.is_some() {
            return Err(libc::EEXIST);
        }
        if p == np && n == nn {
            return Ok(());
        }
        if d == Some(s) {
            return Ok(());
        }
        if self.is_dir(s) && p != np && self.below(np, s) {
            return Err(libc::EINVAL);
        }
        if flags & fs::RENAME_EXCHANGE != 0 {
            let d = d.expect("checked");
            if self.is_dir(d) && p != np && self.below(p, d) {
                return Err(libc::EINVAL);
            }
            self.children_mut(p).insert(n.to_vec(), d);
            self.children_mut(np).insert(nn.to_vec(), s);
            if self.is_dir(s) {
                self.nodes.get_mut(&s).expect("s").parent = np;
            }
            if self.is_dir(d) {
                self.nodes.get_mut(&d).expect("d").parent = p;
            }
            return Ok(());
        }
        if let Some(d) = d {
            match (self.is_dir(s), self.is_dir(d)) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                _ => {}
            }
            if self.children(d).is_some_and(|c| !c.is_empty()) {
                return Err(libc::ENOTEMPTY);
            }
        }
        self.children_mut(p).remove(n);
        self.children_mut(np).insert(nn.to_vec(), s);
        if self.is_dir(s) {
            self.nodes.get_mut(&s).expect("s").parent = np;
        }
        if let Some(d) = d {
            if self.is_dir(d) {
                self.nodes.remove(&d);
            } else {
                self.gc(d);
            }
        }
        Ok(())
    }
    fn file(&mut self, path: &[Vec<u8>]) -> Result<&mut Vec<u8>, i32> {
        let id = self.resolve(path)?;
        match &mut self.nodes.get_mut(&id).expect("node").kind {
            MKind::File(d) => Ok(d),
            MKind::Dir(_) => Err(libc::EISDIR),
            MKind::Sym(_) => Err(libc::EINVAL),
        }
    }
    fn dump(&self) -> Dump {
        let mut out = Dump::new();
        let mut first: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        self.walk(1, b"", &mut out, &mut first);
        out
    }
    fn walk(&self, id: u64, path: &[u8], out: &mut Dump, first: &mut BTreeMap<u64, Vec<u8>>) {
        for (name, &c) in self.children(id).expect("dir") {
            let mut p = path.to_vec();
            p.push(b'/');
            p.extend_from_slice(name);
            let node = &self.nodes[&c];
            let f = first.entry(c).or_insert_with(|| p.clone()).clone();
            let (k, nl, data) = match &node.kind {
                MKind::File(d) => ('f', self.links(c) as u32, d.clone()),
                MKind::Sym(t) => ('l', self.links(c) as u32, t.clone()),
                MKind::Dir(ch) => ('d', 2 + ch.values().filter(|&&x| self.is_dir(x)).count() as u32, vec![]),
            };
            out.insert(p.clone(), (k, node.perm, nl, data, node.xattrs.clone(), f, c));
            if k == 'd' {
                self.walk(c, &p, out, first);
            }
        }
    }
}

fn errno<T>(r: fs::Result<T>) -> Result<T, i32> {
    r.map_err(|e| match e {
        // Device errors (injected ones, in the I/O-error run) are EIO;
        // the model never expects EIO, so an unexpected one still fails.
        e @ fs::Error::Engine(zlogfs_engine::Error::Io { .. } | zlogfs_engine::Error::Failed) => {
            assert_eq!(fuse_errno(&e), libc::EIO, "{e}");
            libc::EIO
        }
        fs::Error::Engine(other) => panic!("unexpected error {other}"),
        e => fuse_errno(&e),
    })
}

fn fs_parent<'a>(f: &Fs, path: &'a [Vec<u8>]) -> Result<(Ino, &'a [u8]), i32> {
    let mut cur = ROOT;
    for c in &path[..path.len() - 1] {
        let a = errno(f.lookup(cur, c))?;
        cur = a.ino;
    }
    if errno(f.getattr(cur))?.kind != Kind::Dir {
        return Err(libc::ENOTDIR);
    }
    Ok((cur, &path[path.len() - 1]))
}

fn fs_resolve(f: &Fs, path: &[Vec<u8>]) -> Result<Ino, i32> {
    let (d, n) = fs_parent(f, path)?;
    Ok(errno(f.lookup(d, n))?.ino)
}

/// Asserts two dumps are equal, and when they are not, says which paths
/// differ and how, briefly (a file's bytes would fill the screen).
fn assert_same(got: &Dump, want: &Dump, ctx: &str) {
    if got == want {
        return;
    }
    let mut lines = Vec::new();
    for p in got.keys().chain(want.keys()).collect::<BTreeSet<_>>() {
        let path = String::from_utf8_lossy(p);
        match (got.get(p), want.get(p)) {
            (Some(g), Some(w)) if g == w => {}
            (Some(g), Some(w)) => {
                let at = g.3.iter().zip(&w.3).position(|(a, b)| a != b);
                lines.push(format!(
                    "  {path}: got ({}, mode {:o}, nlink {}, {} bytes, ino {}), want ({}, mode {:o}, nlink {}, {} bytes, ino {}); bytes first differ at {at:?}; xattrs equal: {}",
                    g.0, g.1, g.2, g.3.len(), g.6, w.0, w.1, w.2, w.3.len(), w.6, g.4 == w.4
                ));
            }
            (Some(_), None) => lines.push(format!("  {path}: only in the file system")),
            (None, _) => lines.push(format!("  {path}: only in the model")),
        }
    }
    panic!("{ctx}\n{}", lines.join("\n"));
}

fn fs_dump(f: &Fs) -> Dump {
    let mut out = Dump::new();
    let mut first = BTreeMap::new();
    fs_walk(f, ROOT, b"", &mut out, &mut first);
    out
}

fn fs_walk(f: &Fs, dir: Ino, path: &[u8], out: &mut Dump, first: &mut BTreeMap<Ino, Vec<u8>>) {
    let mut after: Option<Vec<u8>> = None;
    loop {
        // Small pages exercise resuming after a name.
        let page = f.readdir(dir, after.as_deref(), 3).expect("readdir");
        if page.is_empty() {
            break;
        }
        after = Some(page.last().expect("entry").name.clone());
        for e in page {
            let mut p = path.to_vec();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            let a = f.getattr(e.ino).expect("getattr");
            assert_eq!(a.kind, e.kind, "{p:?}: entry type differs from inode");
            let fp = first.entry(e.ino).or_insert_with(|| p.clone()).clone();
            let (k, data) = match a.kind {
                Kind::File => {
                    let d = f.read(e.ino, 0, a.size as usize + 10).expect("read");
                    assert_eq!(d.len() as u64, a.size, "{p:?}: short read");
                    ('f', d)
                }
                Kind::Symlink => ('l', f.readlink(e.ino).expect("readlink")),
                Kind::Dir => ('d', vec![]),
                k => panic!("unexpected kind {k:?}"),
            };
            let mut x = BTreeMap::new();
            for n in f.listxattr(e.ino).expect("listxattr") {
                x.insert(n.clone(), f.getxattr(e.ino, &n).expect("getxattr"));
            }
            out.insert(p.clone(), (k, a.mode & 0o7777, a.nlink, data, x, fp, e.ino));
            if k == 'd' {
                fs_walk(f, e.ino, &p, out, first);
            }
        }
    }
}

/// A path of one to three names from a small set, so that operations
/// meet each other's entries; one name in eight is 255 bytes, the limit,
/// so that groups carry many long names in their change records and
/// journal (issue 44: a group of long names once could not be written).
fn path(r: &mut StdRng) -> Vec<Vec<u8>> {
    let depth = r.gen_range(1..=3);
    (0..depth)
        .map(|_| {
            let c = b"abcde"[r.gen_range(0..5)];
            vec![c; if r.gen_range(0..8) == 0 { 255 } else { 1 }]
        })
        .collect()
}

fn data(r: &mut StdRng, len: usize) -> Vec<u8> {
    match r.gen_range(0..4) {
        0 => vec![0; len],
        1 => (0..len).map(|_| r.gen()).collect(),
        _ => {
            let words: [&[u8]; 4] = [b"zlogfs ", b"chunk ", b"log ", b"\n"];
            let mut v = Vec::with_capacity(len);
            while v.len() < len {
                v.extend_from_slice(words[r.gen_range(0..4)]);
            }
            v.truncate(len);
            v
        }
    }
}

/// Power cut, then recovery: the tree must match a state since the last
/// sync (`history`), and fsck must be clean. Returns the reopened file
/// system and the model state it matched.
fn recover(st: &Rig, f: Fs, history: &[Model], mode: CrashMode, seed: u64, ctx: &str) -> (Fs, Model) {
    drop(f);
    recover_closed(st, history, mode, seed, ctx)
}

fn recover_closed(st: &Rig, history: &[Model], mode: CrashMode, seed: u64, ctx: &str) -> (Fs, Model) {
    st.power_cut(mode, seed);
    let f = open(st);
    let got = fs_dump(&f);
    // Of equal trees, the one that made as many inodes (its later nodes
    // get the same numbers).
    let next = f.config().next_ino;
    let at = history.iter().rposition(|h| h.dump() == got && h.next == next).unwrap_or_else(|| {
        let last = history.last().expect("history").dump();
        let diff: Vec<_> = last
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .chain(got.keys().filter(|k| !last.contains_key(*k)).map(|k| format!("+{}", String::from_utf8_lossy(k))))
            .collect();
        panic!("{ctx}: after a power cut ({mode:?}) the tree matches no state since the last sync; vs latest: {diff:?}")
    });
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "{ctx}: fsck after a power cut: {:?}", rep.problems);
    (f, history[at].clone())
}

/// How a run is set up.
#[derive(Clone, Copy)]
struct Setup {
    /// Inject I/O errors.
    io_errors: bool,
    /// Chunk size of the image: above 4096, small overwrites of stored
    /// chunks are kept as patches beside them.
    chunk: u32,
    /// Run the cleaner now and then (it moves patches, or merges them into
    /// their chunks when it moves a base).
    clean: bool,
    /// Keep every commit as an automatic point of history.
    history: bool,
    /// An image of two stores, power cut each or both.
    two: bool,
    /// An image in a bucket, with this sync mode (crashes kill the
    /// process; io_errors must be off).
    bucket: Option<BucketSync>,
}

/// On images of chunks above 4 KiB, a third of new files and directories
/// get a smaller chunk size of their own (a directory's is inherited), so
/// that files of several chunk sizes share buffers, packs and cleaning;
/// and a compression unit of four such chunks, so that whole chunks share
/// blocks too, and a cold form of sixteen at zstd:6, so that what the
/// cleaner moves is regrouped in other units.
fn own_chunk(r: &mut StdRng, image: u32) -> Option<u32> {
    let c = [4096, 8192, 16384][r.gen_range(0..3)];
    (r.gen_range(0..3) == 0 && c < image).then_some(c)
}

fn set_chunk(f: &Fs, ino: Ino, chunk: Option<u32>) -> Res {
    match chunk {
        Some(c) => errno(f.setxattr(ino, fs::XATTR_CHUNK, format!("{}K", c >> 10).as_bytes(), 0))
            .and_then(|_| errno(f.setxattr(ino, fs::XATTR_UNIT, format!("{}K", c >> 8).as_bytes(), 0)))
            .and_then(|_| {
                errno(f.setxattr(ino, fs::XATTR_COLD, format!("{}K zstd:6", c >> 6).as_bytes(), 0))
            }),
        None => Ok(()),
    }
}

/// One seeded run; the number of patches its commits wrote.
fn run(seed: u64, steps: usize, setup: Setup) -> u64 {
    let Setup { io_errors, chunk, clean, history: keep_points, two, bucket } = setup;
    let mut r = common::rng(seed);
    let st = fresh(chunk, keep_points, two, bucket);
    let mut f = open(&st);
    let mut m = Model::new();
    // Models after each accepted operation since the last sync.
    let mut history: Vec<Model> = vec![m.clone()];
    let mut crashes = 0;
    let mut io_faults = 0;
    // Patches written by commits of single small writes.
    let mut patches = 0;
    let mut armed = false;
    // Named snapshots taken, with the model they must read as and their
    // point.
    let mut snaps: Vec<(String, Model, u64)> = Vec::new();
    let mut snapshot_steps = 0;
    // Segments cleaned while snapshots existed.
    let mut cleaned_with_snapshots = 0;
    // Automatic points taken by the explicit commits, with the model they
    // must read as, and how many were read back.
    let mut points: BTreeMap<String, Model> = BTreeMap::new();
    let mut point_reads = 0;
    // Half the runs have phases of 250 steps with no sync or commit of
    // their own: groups of hundreds of operations, closed only by their
    // bounds.
    let long_groups = r.gen_bool(0.5);
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        let op = r.gen_range(0..100);
        if long_groups && (step / 250) % 2 == 1 && (84..=92).contains(&op) {
            continue;
        }
        let (fr, mr): (Res, Res) = match op {
            0..=11 => {
                let p = path(&mut r);
                let perm = 0o644;
                let own = own_chunk(&mut r, chunk);
                let fr = fs_parent(&f, &p)
                    .and_then(|(d, n)| errno(f.create(d, n, perm, 0, 0)))
                    .and_then(|a| set_chunk(&f, a.ino, own));
                (fr, m.add(&p, MKind::File(vec![]), perm))
            }
            12..=19 => {
                let p = path(&mut r);
                let own = own_chunk(&mut r, chunk);
                let fr = fs_parent(&f, &p)
                    .and_then(|(d, n)| errno(f.mkdir(d, n, 0o755, 0, 0)))
                    .and_then(|a| set_chunk(&f, a.ino, own));
                (fr, m.add(&p, MKind::Dir(BTreeMap::new()), 0o755))
            }
            20..=22 => {
                let p = path(&mut r);
                let n = r.gen_range(1..200);
                let t = data(&mut r, n).into_iter().map(|b| b.max(1)).collect::<Vec<u8>>();
                let fr = fs_parent(&f, &p).and_then(|(d, n)| errno(f.symlink(d, n, &t, 0, 0)).map(|_| ()));
                (fr, m.add(&p, MKind::Sym(t), 0o777))
            }
            23..=26 => {
                let (a, b) = (path(&mut r), path(&mut r));
                let fr = fs_resolve(&f, &a).and_then(|s| {
                    let (d, n) = fs_parent(&f, &b)?;
                    errno(f.link(s, d, n)).map(|_| ())
                });
                (fr, m.link(&a, &b))
            }
            27..=32 => {
                let p = path(&mut r);
                let fr = fs_parent(&f, &p).and_then(|(d, n)| errno(f.unlink(d, n)));
                (fr, m.unlink(&p))
            }
            33..=36 => {
                let p = path(&mut r);
                let fr = fs_parent(&f, &p).and_then(|(d, n)| errno(f.rmdir(d, n)));
                (fr, m.rmdir(&p))
            }
            37..=44 => {
                let (a, b) = (path(&mut r), path(&mut r));
                let flags = [0, 0, fs::RENAME_NOREPLACE, fs::RENAME_EXCHANGE][r.gen_range(0..4)];
                let fr = fs_parent(&f, &a).and_then(|(p, n)| {
                    let (np, nn) = fs_parent(&f, &b)?;
                    errno(f.rename(p, n, np, nn, flags))
                });
                (fr, m.rename(&a, &b, flags))
            }
            45..=64 => {
                let p = path(&mut r);
                let off = match r.gen_range(0..3) {
                    0 => 0,
                    1 => (r.gen_range(0..3) * chunk as u64 + r.gen_range(0..3)).saturating_sub(1),
                    _ => r.gen_range(0..40_000),
                };
                // In large chunks, small overwrites inside a file, each
                // committed on its own so that it becomes a patch.
                let size = m.file(&p).map(|v| v.len()).unwrap_or(0);
                let inside = chunk > 4096 && size > 4096 && r.gen_bool(0.5);
                let (off, len) = match r.gen_range(0..4) {
                    _ if inside => {
                        let len = [1, 100, 4096, 8192][r.gen_range(0..4)].min(size);
                        let off = r.gen_range(0..=size - len) as u64;
                        (if len >= 4096 { off / 4096 * 4096 } else { off }, len)
                    }
                    0 => (off, r.gen_range(0..100)),
                    1 => (off, chunk as usize + r.gen_range(0..3usize) - 1),
                    // One or two aligned blocks (a patch, in large chunks).
                    2 => (off / 4096 * 4096, 4096 * r.gen_range(1..3)),
                    _ => (off, r.gen_range(0..20_000)),
                };
                let d = data(&mut r, len);
                let fr = fs_resolve(&f, &p).and_then(|i| errno(f.write(i, off, &d)).map(|_| ()));
                if inside && fr.is_ok() {
                    let before = f.stats().patches;
                    f.commit().expect("commit");
                    patches += f.stats().patches - before;
                }
                let mr = m.file(&p).map(|v| {
                    let end = off as usize + d.len();
                    if v.len() < end && !d.is_empty() {
                        v.resize(end, 0);
                    }
                    if !d.is_empty() {
                        v[off as usize..end].copy_from_slice(&d);
                    }
                });
                if mr.is_ok() {
                    m.bump(&p, false);
                }
                (fr, mr)
            }
            65..=70 => {
                let p = path(&mut r);
                let size = match r.gen_range(0..3) {
                    0 => 0,
                    1 => (r.gen_range(0..4) * chunk as u64 + r.gen_range(0..3)).saturating_sub(1),
                    _ => r.gen_range(0..40_000),
                };
                let fr = fs_resolve(&f, &p).and_then(|i| {
                    if errno(f.getattr(i))?.kind == Kind::Symlink {
                        return Err(libc::EINVAL);
                    }
                    errno(f.setattr(i, &SetAttr { size: Some(size), ..SetAttr::default() })).map(|_| ())
                });
                let mr = m.file(&p).map(|v| {
                    let changed = v.len() != size as usize;
                    v.resize(size as usize, 0);
                    changed
                });
                if mr == Ok(true) {
                    m.bump(&p, false);
                }
                (fr, mr.map(|_| ()))
            }
            71..=74 => {
                let p = path(&mut r);
                let off = r.gen_range(0..30_000u64);
                let len = r.gen_range(1..20_000u64);
                // Every mode the mount accepts: a hole, a reservation (that
                // grows the size, or is kept past it), a zeroed range (that
                // grows the size, or not).
                use fs::{
                    FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH, FALLOC_FL_ZERO_RANGE as ZERO,
                };
                let mode = [PUNCH | KEEP, 0, KEEP, ZERO, ZERO | KEEP][r.gen_range(0..5)];
                let fr = fs_resolve(&f, &p).and_then(|i| {
                    if errno(f.getattr(i))?.kind == Kind::Symlink {
                        return Err(libc::EINVAL);
                    }
                    errno(f.fallocate(i, mode, off, len))
                });
                let mr = m.file(&p).map(|v| {
                    let end = (off + len) as usize;
                    if mode & KEEP == 0 && v.len() < end {
                        v.resize(end, 0);
                    }
                    if mode & (PUNCH | ZERO) != 0 {
                        let end = end.min(v.len());
                        if (off as usize) < end {
                            v[off as usize..end].fill(0);
                        }
                    }
                });
                if mr.is_ok() {
                    m.bump(&p, false);
                }
                (fr, mr)
            }
            75..=79 => {
                let p = path(&mut r);
                let name = format!("user.{}", ["a", "bb", "c"][r.gen_range(0..3)]).into_bytes();
                let remove = r.gen_ratio(1, 3);
                let n = r.gen_range(0..300);
                let val = data(&mut r, n);
                let fr = fs_resolve(&f, &p).and_then(|i| {
                    if remove {
                        errno(f.removexattr(i, &name))
                    } else {
                        errno(f.setxattr(i, &name, &val, 0))
                    }
                });
                let mr = m.resolve(&p).and_then(|id| {
                    let x = &mut m.nodes.get_mut(&id).expect("node").xattrs;
                    if remove {
                        x.remove(&name).map(|_| ()).ok_or(libc::ENODATA)
                    } else {
                        x.insert(name.clone(), val.clone());
                        Ok(())
                    }
                });
                if mr.is_ok() {
                    m.bump(&p, true);
                }
                (fr, mr)
            }
            80..=83 => {
                let p = path(&mut r);
                let perm = r.gen_range(0..0o7777u32);
                let fr = fs_resolve(&f, &p).and_then(|i| {
                    errno(f.setattr(i, &SetAttr { mode: Some(perm), ..SetAttr::default() })).map(|_| ())
                });
                let mr = m.resolve(&p).map(|id| m.nodes.get_mut(&id).expect("node").perm = perm);
                if mr.is_ok() {
                    m.bump(&p, true);
                }
                (fr, mr)
            }
            84..=88 => {
                match f.sync() {
                    Ok(()) => history = vec![m.clone()],
                    Err(e) if armed => {
                        assert_eq!(fuse_errno(&e), libc::EIO, "{ctx}: sync failed with {e}");
                        (f, m) = recover(&st, f, &history, CrashMode::DropUnsynced, r.gen(), &ctx);
                        forget_lost_points(&f, &mut points);
                        (armed, history) = (false, vec![m.clone()]);
                        io_faults += 1;
                    }
                    Err(e) => panic!("{ctx}: sync: {e}"),
                }
                continue;
            }
            89..=92 => {
                let mut res = f.commit();
                if res.is_ok() && r.gen_bool(0.5) {
                    res = f.engine().write_out().map_err(fs::Error::from);
                }
                match res {
                    Ok(()) => {
                        if let Some(name) = point_of_last_commit(&f).filter(|_| keep_points) {
                            points.insert(name, m.clone());
                        }
                    }
                    Err(e) if armed => {
                        assert_eq!(fuse_errno(&e), libc::EIO, "{ctx}: commit failed with {e}");
                        (f, m) = recover(&st, f, &history, CrashMode::TearLast, r.gen(), &ctx);
                        forget_lost_points(&f, &mut points);
                        (armed, history) = (false, vec![m.clone()]);
                        io_faults += 1;
                    }
                    Err(e) => panic!("{ctx}: commit: {e}"),
                }
                continue;
            }
            93..=96 => {
                // Power cut, then recovery: a prefix no older than the sync.
                let mode =
                    [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder][r.gen_range(0..3)];
                (f, m) = recover(&st, f, &history, mode, r.gen(), &ctx);
                forget_lost_points(&f, &mut points);
                m = feed::settle(&f, &history, m, &snaps);
                armed = false;
                crashes += 1;
                history = vec![m.clone()];
                continue;
            }
            97 if io_errors && !armed => {
                // An I/O error a few device operations from now, once or
                // for good: it must surface as EIO from whatever meets it
                // (never a panic), and a power cut after it must recover a
                // prefix, as after any crash.
                let faulty = st.faulty(r.gen());
                let at = faulty.op_count() + r.gen_range(1..60);
                let persistent = r.gen_bool(0.5);
                faulty.set_faults(FaultConfig { fail_at: Some(at), persistent, ..FaultConfig::default() });
                armed = true;
                continue;
            }
            97 | 98 if !io_errors && !armed && (!clean || op == 97) => {
                // Snapshots: take one, read one back (the file system
                // closed, the snapshot opened read-only), or delete one.
                // Each is durable when it returns.
                snapshot_steps += 1;
                match r.gen_range(0..3) {
                    0 if snaps.len() < 3 => {
                        let name = format!("s{step}");
                        let s = f.snapshot_create(&name).unwrap_or_else(|e| panic!("{ctx}: snapshot: {e}"));
                        snaps.push((name, m.clone(), s.seq));
                    }
                    1 if !points.is_empty() && r.gen_bool(0.5) => {
                        // An automatic point that still exists (one whose
                        // record a power cut lost is gone) reads as the
                        // model did when its commit was made.
                        let names: Vec<String> = points.keys().cloned().collect();
                        let name = &names[r.gen_range(0..names.len())];
                        let kept = f.snapshots().expect("list").into_iter().any(|(n, _)| &n == name);
                        if kept {
                            f.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
                            let view = open_snapshot(&st, name);
                            assert_same(
                                &fs_dump(&view),
                                &points[name].dump(),
                                &format!("{ctx}: point {name} reads otherwise"),
                            );
                            drop(view);
                            f = open(&st);
                            point_reads += 1;
                        } else {
                            // Nothing read, nothing made durable: the
                            // operations since the last sync stay unsynced.
                            points.remove(name);
                            continue;
                        }
                    }
                    1 if !snaps.is_empty() => {
                        let (name, want, seq) = &snaps[r.gen_range(0..snaps.len())];
                        // What changed since, and between it and another.
                        let feed = f.changes(*seq, None).unwrap_or_else(|e| panic!("{ctx}: changes: {e}"));
                        feed::check(&feed, want, &m, &m, &format!("{ctx}: changes since {name}"));
                        let (other, later, until) = &snaps[r.gen_range(0..snaps.len())];
                        if until >= seq {
                            let feed = f.changes(*seq, Some(*until)).expect("changes");
                            feed::check(
                                &feed,
                                want,
                                later,
                                &m,
                                &format!("{ctx}: changes from {name} to {other}"),
                            );
                        }
                        f.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
                        let view = open_snapshot(&st, name);
                        assert_same(
                            &fs_dump(&view),
                            &want.dump(),
                            &format!("{ctx}: snapshot {name} reads otherwise"),
                        );
                        drop(view);
                        f = open(&st);
                    }
                    _ if !snaps.is_empty() => {
                        let (name, ..) = snaps.remove(r.gen_range(0..snaps.len()));
                        f.snapshot_delete(&name).unwrap_or_else(|e| panic!("{ctx}: delete {name}: {e}"));
                    }
                    // Nothing to read or delete: nothing was synced.
                    _ => continue,
                }
                history = vec![m.clone()];
                continue;
            }
            98 if clean => {
                // Now and then every segment not wholly live (those that
                // hold what snapshots read among them).
                let max_live = if r.gen_bool(0.5) { 0.9 } else { 0.999 };
                let opts = fs::CleanOptions { max_live, ..fs::CleanOptions::default() };
                let rep = f.clean(&opts, &|_| {}).expect("clean");
                // Only segments still in use by the engine, or holding
                // chunks that operations not yet committed changed, may be
                // left.
                assert!(
                    rep.skipped
                        .iter()
                        .all(|(_, why)| why.contains(" block at ") || why.contains("not yet committed")),
                    "{ctx}: clean: {rep:?}"
                );
                if !snaps.is_empty() {
                    cleaned_with_snapshots += rep.freed;
                }
                continue;
            }
            _ => {
                match f.close() {
                    Ok(()) if armed => {
                        // The fault is still ahead: it may meet the reopen,
                        // which must then fail with EIO, not panic.
                        let s = st.store();
                        history = vec![m.clone()];
                        match Fs::open(s, fs_opts()) {
                            Ok(g) => f = g,
                            Err(e) => {
                                assert_eq!(fuse_errno(&e), libc::EIO, "{ctx}: open failed with {e}");
                                (f, m) =
                                    recover_closed(&st, &history, CrashMode::DropUnsynced, r.gen(), &ctx);
                                (armed, history) = (false, vec![m.clone()]);
                                io_faults += 1;
                            }
                        }
                    }
                    Ok(()) => {
                        f = open(&st);
                        history = vec![m.clone()];
                    }
                    Err(e) if armed => {
                        assert_eq!(fuse_errno(&e), libc::EIO, "{ctx}: close failed with {e}");
                        (f, m) = recover_closed(&st, &history, CrashMode::Reorder, r.gen(), &ctx);
                        (armed, history) = (false, vec![m.clone()]);
                        io_faults += 1;
                    }
                    Err(e) => panic!("{ctx}: close: {e}"),
                }
                continue;
            }
        };
        if armed && fr == Err(libc::EIO) {
            // The injected error met this operation. Whether the operation
            // took effect is unknown: both states are candidates.
            if mr.is_ok() {
                history.push(m.clone());
            }
            (f, m) = recover(&st, f, &history, CrashMode::DropUnsynced, r.gen(), &ctx);
            forget_lost_points(&f, &mut points);
            (armed, history) = (false, vec![m.clone()]);
            io_faults += 1;
            continue;
        }
        assert_eq!(fr, mr, "{ctx}: op {op}: file system and model disagree");
        // Both number new inodes alike (the change feed's check relies on it).
        assert_eq!(f.config().next_ino, m.next, "{ctx}: op {op}: inode numbers part");
        if fr.is_ok() {
            history.push(m.clone());
        }
        if step % 25 == 0 && !armed {
            assert_same(&fs_dump(&f), &m.dump(), &format!("{ctx}: trees differ"));
        }
    }
    if armed {
        let ctx = format!("seed {seed} at the end");
        (f, m) = recover(&st, f, &history, CrashMode::DropUnsynced, r.gen(), &ctx);
    }
    assert_same(&fs_dump(&f), &m.dump(), &format!("seed {seed}: trees differ at the end"));
    f.close().expect("close");
    let mut f = open(&st);
    assert_same(&fs_dump(&f), &m.dump(), &format!("seed {seed}: trees differ after a clean reopen"));
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "seed {seed}: fsck: {:?}", rep.problems);
    assert!(rep.inodes > 1, "seed {seed}: the final tree is empty");
    for (name, want, seq) in &snaps {
        let feed = f.changes(*seq, None).expect("changes");
        feed::check(&feed, want, &m, &m, &format!("seed {seed}: changes since {name} at the end"));
    }
    if !snaps.is_empty() {
        f.close().expect("close");
        for (name, want, _) in &snaps {
            let view = open_snapshot(&st, name);
            assert_same(&fs_dump(&view), &want.dump(), &format!("seed {seed}: snapshot {name} at the end"));
        }
        f = open(&st);
    }
    let gone = f.usage().expect("usage").bases_gone;
    if let Some(b) = &st.bulk {
        let bytes: u64 = b.written_segments().iter().map(|&(_, n)| u64::from(n)).sum();
        assert!(bytes > 0, "seed {seed}: nothing was written to the bulk store");
        eprintln!("seed {seed}: {bytes} bytes in the bulk store's segments");
    }
    eprintln!(
        "seed {seed}: {steps} steps, {crashes} power cuts, {io_faults} I/O errors met, {patches} patches, \
         {gone} chunks left without a base, {snapshot_steps} snapshot steps ({} snapshots left, \
         {cleaned_with_snapshots} segments cleaned while some existed), {point_reads} automatic points read",
        snaps.len()
    );
    patches
}

/// Runs of a test: `default`, one with ZLOGFS_SEED (a replay), or
/// ZLOGFS_MODEL_RUNS (the long version, bench/model-soak.sh).
fn runs(default: u64) -> u64 {
    if zlogfs_testkit::replaying() {
        return 1;
    }
    std::env::var("ZLOGFS_MODEL_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn fs_matches_model_through_crashes() {
    let base = common::seed("fs_matches_model_through_crashes");
    let runs = runs(8);
    for k in 0..runs {
        run(
            base.wrapping_add(k),
            1500,
            Setup { io_errors: false, chunk: 4096, clean: false, history: false, two: false, bucket: None },
        );
    }
}

/// The crash run with every commit kept as an automatic point, each read
/// back now and then against the model of its commit.
#[test]
fn fs_matches_model_keeping_every_commit() {
    let base = common::seed("fs_matches_model_keeping_every_commit");
    let runs = runs(8);
    for k in 0..runs {
        run(
            base.wrapping_add(k),
            1500,
            Setup { io_errors: false, chunk: 4096, clean: false, history: true, two: false, bucket: None },
        );
    }
}

/// The model test on an image of 32 KiB chunks, where small overwrites of
/// stored chunks become patches, with the cleaner (which moves patches, or
/// merges them into their chunks) run now and then, while operations are
/// buffered.
#[test]
fn fs_matches_model_with_patches() {
    let base = common::seed("fs_matches_model_with_patches");
    let runs = runs(6);
    let mut patches = 0;
    for k in 0..runs {
        patches += run(
            base.wrapping_add(k),
            4000,
            // Every other run keeps every commit as a point: the cleaner
            // then moves blocks only points read.
            Setup {
                io_errors: false,
                chunk: 32 << 10,
                clean: true,
                history: base.wrapping_add(k) % 2 == 1,
                two: false,
                bucket: None,
            },
        );
    }
    // A single run may write none (seed 8033832667062325679 writes none);
    // six runs without one mean patches went untested.
    assert!(patches > 0 || runs == 1, "seed {base}: no run wrote a patch");
}

/// The same model test with I/O errors injected (once or persistent) a
/// few device operations after random points: every error surfaces as
/// EIO, and a power cut after it recovers a prefix with fsck clean.
#[test]
fn fs_matches_model_through_io_errors() {
    let base = common::seed("fs_matches_model_through_io_errors");
    let runs = runs(6);
    for k in 0..runs {
        run(
            base.wrapping_add(k),
            1500,
            Setup { io_errors: true, chunk: 4096, clean: false, history: false, two: false, bucket: None },
        );
    }
}

/// The model test on an image of two stores (issue 29): files above
/// 4 KiB keep their chunks on the bulk store, the rest and the journal and
/// index on the fast one. Power cuts go to both stores or to one while the
/// other keeps every write; runs alternate the cleaner with patches and
/// history kept, and I/O errors on either store.
#[test]
fn fs_matches_model_on_two_devices() {
    let base = common::seed("fs_matches_model_on_two_devices");
    let runs = runs(6);
    for k in 0..runs {
        // By the seed, so that a replay runs the same setup.
        let setup = match base.wrapping_add(k) % 3 {
            0 => {
                Setup { io_errors: false, chunk: 4096, clean: false, history: false, two: true, bucket: None }
            }
            1 => Setup {
                io_errors: false,
                chunk: 32 << 10,
                clean: true,
                history: true,
                two: true,
                bucket: None,
            },
            _ => {
                Setup { io_errors: true, chunk: 4096, clean: false, history: false, two: true, bucket: None }
            }
        };
        run(base.wrapping_add(k), 1500, setup);
    }
}

/// The model test on an image in a bucket of a real S3 server (issue 30;
/// moto on 127.0.0.1): crashes kill the process (nothing more uploaded,
/// the cache directory keeps what reached it), and under sync=remote
/// every other crash loses the cache directory too, so the bucket alone
/// must hold everything synced. Runs alternate sync=local on 4 KiB chunks
/// with sync=remote on 32 KiB chunks with patches, the cleaner and every
/// commit kept.
#[test]
fn fs_matches_model_in_a_bucket() {
    let base = common::seed("fs_matches_model_in_a_bucket");
    let runs = runs(4);
    for k in 0..runs {
        let s = base.wrapping_add(k);
        let setup = if s % 2 == 0 {
            let bucket = Some(BucketSync::Local);
            Setup { io_errors: false, chunk: 4096, clean: false, history: false, two: false, bucket }
        } else {
            let bucket = Some(BucketSync::Remote);
            Setup { io_errors: false, chunk: 32 << 10, clean: true, history: true, two: false, bucket }
        };
        run(s, 1000, setup);
    }
}
