//! The `.snapshots` directory of a mount (issue 28): under the root, and
//! hidden from its listing unless the mount asks for it, one read-only
//! directory per snapshot (named ones and automatic points) that reads
//! as the tree did then, so that a file can be copied back without a
//! second mount.
//!
//! Each snapshot opened here is a view ([`Fs::view`]) sharing the mount's
//! engine. Node ids tell the trees apart: the live tree's are its inode
//! numbers (below 2^40); a view's are its number (the order this mount
//! opened it in, 1 to [`MAX_VIEWS`]) in the top 24 bits over the inode
//! number; the directory itself is [`SNAPDIR`]. A read through a view is
//! good only if its snapshot was kept all through it (a delete meanwhile
//! gets the request ESTALE) and no block it reads moved under it (the
//! cleaner moving held blocks: the view drops its cache and reads again).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use zlogfs_fs::{Attr, DirEntry, Error, Fs, Ino, Kind, Live, Time, ROOT};

use crate::abi::{self, fopen, DirBuf, InHeader, Op};
use crate::adapter::{file_attr, type_bits};
use crate::dirlist::{self, Listing};
use crate::{Reply, ZlogFuse};

/// The directory's name, in the root.
pub const NAME: &[u8] = b".snapshots";

const SHIFT: u32 = 40;
const LOW: u64 = (1 << SHIFT) - 1;
const TOP: u64 = (1 << (64 - SHIFT)) - 1;

/// The node id of the `.snapshots` directory.
pub const SNAPDIR: u64 = (TOP << SHIFT) | ROOT;

/// Views one mount may open (snapshots taken again under a name count
/// again).
pub const MAX_VIEWS: u64 = TOP - 1;

/// Decompressed blocks each view caches.
const VIEW_CACHE: usize = 4 << 20;

/// Reads again through a view whose blocks moved under it, before
/// giving up with EAGAIN.
const TRIES: usize = 4;

/// Whether and how a mount shows its snapshots (`-o snapdir=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Snapdir {
    /// No `.snapshots` directory.
    Off,
    /// `ROOT/.snapshots` answers lookups but is not listed (as ZFS's
    /// `snapdir=hidden`).
    #[default]
    Hidden,
    /// `ROOT/.snapshots` is listed too.
    Visible,
}

/// One snapshot opened through the directory.
pub struct View {
    /// Its number, the top bits of its node ids.
    k: u64,
    /// The sequence number it reads at.
    seq: u64,
    pub fs: Fs,
    /// The live tree's held generation its cache was filled under.
    gen: AtomicU64,
}

impl View {
    /// The node id of inode `ino` of this view.
    pub fn node(&self, ino: Ino) -> Result<u64, i32> {
        if ino > LOW {
            // Inode numbers are given in order from 2: never this many.
            return Err(libc::EOVERFLOW);
        }
        Ok((self.k << SHIFT) | ino)
    }

    /// Whether node id `node` is one of this view's.
    pub fn owns(&self, node: u64) -> bool {
        node >> SHIFT == self.k
    }

    /// `a` with its inode number made this view's node id.
    pub fn tag(&self, mut a: Attr) -> Result<Attr, i32> {
        a.ino = self.node(a.ino)?;
        Ok(a)
    }
}

/// `op`, a read through view `v` of `live`'s snapshot, done so that what
/// it returns is the snapshot's: ESTALE if the snapshot was let go, read
/// again (the view's cache dropped) if held blocks moved meanwhile.
fn read_view<T>(live: &Fs, v: &View, op: impl Fn() -> Result<T, i32>) -> Result<T, i32> {
    for _ in 0..TRIES {
        let gen = live.held_generation();
        if v.gen.swap(gen, Ordering::SeqCst) != gen {
            v.fs.drop_cache();
        }
        let r = op();
        if !live.engine().retains(v.seq) {
            return Err(libc::ESTALE);
        }
        if live.held_generation() == gen {
            return r;
        }
    }
    Err(libc::EAGAIN)
}

/// What a node id names.
pub enum Node {
    /// An inode of the live tree.
    Live(Ino),
    /// The `.snapshots` directory.
    Dir,
    /// Inode `.1` of a view.
    View(Arc<View>, Ino),
    /// A view whose snapshot is gone, or one this mount never opened.
    Stale,
}

/// The views of a mount.
pub struct Past {
    live: Arc<Live>,
    mode: Snapdir,
    views: RwLock<Views>,
    /// A hash of the snapshot list last seen, and since when.
    seen: Mutex<Option<(u64, Time)>>,
}

#[derive(Default)]
struct Views {
    /// Views by number less one; None once their snapshot is gone.
    list: Vec<Option<Arc<View>>>,
    by_name: HashMap<String, u64>,
}

impl Past {
    pub fn new(live: Arc<Live>, mode: Snapdir) -> Past {
        Past { live, mode, views: RwLock::new(Views::default()), seen: Mutex::new(None) }
    }

    /// The live file system was replaced by a newer state (a mount that
    /// follows its writer): each open view is opened again on it, under
    /// the same node ids, while its snapshot is still there (a snapshot
    /// never changes); the others go (their node ids answer ESTALE).
    pub fn reopen_views(&self) {
        let live = self.live.get();
        let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
        let open: Vec<(String, u64)> = views.by_name.iter().map(|(n, &k)| (n.clone(), k)).collect();
        for (name, k) in open {
            let i = (k - 1) as usize;
            let Some(old) = views.list[i].clone() else { continue };
            match live.view(&name, VIEW_CACHE) {
                Ok((fs, seq)) if seq == old.seq => {
                    let gen = AtomicU64::new(live.held_generation());
                    views.list[i] = Some(Arc::new(View { k, seq, fs, gen }));
                }
                _ => {
                    views.list[i] = None;
                    views.by_name.remove(&name);
                }
            }
        }
    }

    pub fn mode(&self) -> Snapdir {
        self.mode
    }

    /// What node id `id` names. A view whose snapshot is gone is let go
    /// here (its node ids stay stale: numbers are never given again).
    pub fn node(&self, id: u64) -> Node {
        if self.mode == Snapdir::Off || id <= LOW {
            return Node::Live(id);
        }
        if id == SNAPDIR {
            return Node::Dir;
        }
        let i = ((id >> SHIFT) - 1) as usize;
        let v = {
            let views = self.views.read().unwrap_or_else(|p| p.into_inner());
            match views.list.get(i) {
                Some(Some(v)) => v.clone(),
                _ => return Node::Stale,
            }
        };
        if !self.live.get().engine().retains(v.seq) {
            let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
            views.list[i] = None;
            views.by_name.retain(|_, &mut k| k != v.k);
            return Node::Stale;
        }
        Node::View(v, id & LOW)
    }

    /// Whether `name` in directory `parent` of the live tree is the
    /// `.snapshots` directory.
    pub fn is_snapdir(&self, parent: Ino, name: &[u8]) -> bool {
        self.mode != Snapdir::Off && parent == ROOT && name == NAME
    }

    /// The snapshots by name, and when this mount first saw the list as
    /// it is: the directory's modification time, so that the kernel
    /// drops a listing it cached when the list changes.
    fn observe(&self) -> Result<(Vec<String>, Time), Error> {
        let list = self.live.get().snapshots()?;
        let mut hash = std::hash::DefaultHasher::new();
        for (name, snap) in &list {
            std::hash::Hash::hash(&(name, snap.seq), &mut hash);
        }
        let hash = std::hash::Hasher::finish(&hash);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let t = match *seen {
            Some((h, t)) if h == hash => t,
            _ => {
                let t = if seen.is_none() { self.live.get().getattr(ROOT)?.mtime } else { zlogfs_fs::now() };
                *seen = Some((hash, t));
                t
            }
        };
        Ok((list.into_iter().map(|(n, _)| n).collect(), t))
    }

    /// The attributes of the `.snapshots` directory: the root's owner,
    /// read and search for all, nothing to write.
    pub fn dir_attr(&self) -> Result<Attr, Error> {
        let root = self.live.get().getattr(ROOT)?;
        let (_, t) = self.observe()?;
        Ok(Attr {
            ino: SNAPDIR,
            mode: libc::S_IFDIR | 0o555,
            nlink: 2,
            size: 0,
            blocks: 0,
            mtime: t,
            ctime: t,
            ..root
        })
    }

    /// The entries of the `.snapshots` directory, each with an inode
    /// number of its own (a view's root if it is open, else one above
    /// every view's).
    pub fn entries(&self) -> Result<Vec<DirEntry>, Error> {
        let (names, _) = self.observe()?;
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            let ino = match views.by_name.get(&name) {
                Some(k) => (k << SHIFT) | ROOT,
                None => SNAPDIR + 1 + i as u64,
            };
            out.push(DirEntry { name: name.into_bytes(), ino, kind: Kind::Dir });
        }
        Ok(out)
    }

    /// The view of the snapshot called `name`, opened on first use (and
    /// again when a snapshot of that name was taken again since).
    pub fn view(&self, name: &[u8]) -> Result<Arc<View>, Error> {
        let name = std::str::from_utf8(name)
            .map_err(|_| Error::NotFound(format!("no snapshot called {}", String::from_utf8_lossy(name))))?;
        let seq = self.live.get().snapshot_seq(name)?;
        {
            let views = self.views.read().unwrap_or_else(|p| p.into_inner());
            let open = views.by_name.get(name).and_then(|&k| views.list[(k - 1) as usize].as_ref());
            if let Some(v) = open.filter(|v| v.seq == seq) {
                return Ok(v.clone());
            }
        }
        let (fs, seq) = self.live.get().view(name, VIEW_CACHE)?;
        let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
        let k = views.list.len() as u64 + 1;
        if k > MAX_VIEWS {
            return Err(Error::NoSpace(format!(
                "this mount opened {MAX_VIEWS} snapshots through .snapshots; mount again for more"
            )));
        }
        let v = Arc::new(View { k, seq, fs, gen: AtomicU64::new(self.live.get().held_generation()) });
        views.list.push(Some(v.clone()));
        views.by_name.insert(name.to_string(), k);
        Ok(v)
    }

    /// `op`, a read through `v` (see [`read_view`]).
    pub fn read<T>(&self, v: &View, op: impl Fn() -> Result<T, i32>) -> Result<T, i32> {
        read_view(&self.live.get(), v, op)
    }
}

/// An fs error as an errno.
fn e(err: Error) -> i32 {
    crate::adapter::reply_errno(err)
}

/// Requests that meet the `.snapshots` directory or a view.
impl ZlogFuse {
    /// Serve `op` if it concerns the `.snapshots` directory or a view
    /// (handing `reply` back if not).
    pub(crate) fn serve_past(&self, h: &InHeader, op: &Op<'_>, reply: Reply) -> Option<Reply> {
        if self.past.mode() == Snapdir::Off {
            return Some(reply);
        }
        match self.past.node(h.nodeid) {
            Node::Live(ino) => match self.live_meets_past(ino, op) {
                Some(Ok(a)) => self.virtual_entry(Ok(a), reply),
                Some(Err(e)) => reply.error(e),
                None => return Some(reply),
            },
            Node::Dir => self.serve_snapdir(op, reply),
            Node::View(v, ino) => self.serve_view(&v, ino, op, reply),
            Node::Stale => reply.error(libc::ESTALE),
        }
        None
    }

    /// What a request on live inode `ino` gets when it names the
    /// `.snapshots` directory or a view's node: its entry (a lookup), an
    /// error, or None (a request for the live tree alone).
    fn live_meets_past(&self, ino: Ino, op: &Op<'_>) -> Option<Result<Attr, i32>> {
        let named = |name: &[u8]| self.past.is_snapdir(ino, name);
        let is_past = |node: u64| !matches!(self.past.node(node), Node::Live(_));
        match *op {
            Op::Lookup { name } if named(name) => {
                Some(self.past.dir_attr().map_err(crate::adapter::reply_errno))
            }
            Op::Mknod { name, .. }
            | Op::Mkdir { name, .. }
            | Op::Symlink { name, .. }
            | Op::Create { name, .. }
                if named(name) =>
            {
                Some(Err(libc::EEXIST))
            }
            Op::Unlink { name } | Op::Rmdir { name } if named(name) => Some(Err(libc::EROFS)),
            Op::Link { ino: target, .. } if is_past(target) => Some(Err(libc::EXDEV)),
            Op::Link { newname, .. } if named(newname) => Some(Err(libc::EEXIST)),
            Op::Rename { newdir, .. } if is_past(newdir) => Some(Err(libc::EXDEV)),
            Op::Rename { name, newdir, newname, .. }
                if named(name) || self.past.is_snapdir(newdir, newname) =>
            {
                Some(Err(libc::EROFS))
            }
            Op::CopyFileRange { ino_out, .. } if is_past(ino_out) => Some(Err(libc::EXDEV)),
            _ => None,
        }
    }

    /// An entry reply for a node of the past (the kernel's references to
    /// them need no count: nothing there is ever removed while held).
    fn virtual_entry(&self, r: Result<Attr, i32>, reply: Reply) {
        match r {
            Ok(a) => reply.data(&self.entry_bytes(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn serve_snapdir(&self, op: &Op<'_>, reply: Reply) {
        match *op {
            Op::Lookup { name: b"." } => self.virtual_entry(self.past.dir_attr().map_err(e), reply),
            Op::Lookup { name: b".." } => self.virtual_entry(self.fs().getattr(ROOT).map_err(e), reply),
            Op::Lookup { name } => {
                let r = self.past.view(name).map_err(e).and_then(|v| {
                    self.past.read(&v, || v.fs.getattr(ROOT).map_err(e)).and_then(|a| v.tag(a))
                });
                self.virtual_entry(r, reply)
            }
            Op::Getattr => self.attr(self.past.dir_attr(), reply),
            // No caching of the listing: snapshots come and go.
            Op::Opendir if self.no_opendir => reply.error(libc::ENOSYS),
            Op::Opendir => {
                let mut b = Vec::with_capacity(16);
                abi::put_open(&mut b, 0);
                reply.data(&b)
            }
            Op::Readdir { offset, size, plus } => self.list_snapdir(offset, size, plus, reply),
            Op::Access | Op::Releasedir | Op::Flush | Op::Fsyncdir { .. } | Op::Interrupt => reply.ok(),
            Op::Forget { .. } | Op::BatchForget { .. } | Op::Destroy => reply.ok(),
            Op::Statfs => self.statfs(reply),
            Op::Getxattr { .. } => reply.error(libc::ENODATA),
            Op::Listxattr { size } => Self::xattr(&[], size, reply),
            Op::Unsupported(_) => reply.error(libc::ENOSYS),
            _ => reply.error(libc::EROFS),
        }
    }

    /// The listing of `.snapshots`: its entries name snapshots without
    /// opening them (a READDIRPLUS entry with node id 0 tells the kernel
    /// to look the name up when it is used).
    fn list_snapdir(&self, offset: u64, size: u32, plus: bool, reply: Reply) {
        let entries = match self.past.entries() {
            Ok(x) => x,
            Err(err) => return reply.error(e(err)),
        };
        let listing = Listing::new(entries);
        let mut buf = DirBuf::new(size);
        let dots = [(SNAPDIR, dirlist::DOT, &b"."[..]), (ROOT, dirlist::DOTDOT, &b".."[..])];
        let named = listing.after(offset).iter().map(|x| (x.ino, x.off, &x.name[..]));
        for (ino, off, name) in dots.into_iter().filter(|d| d.1 > offset).chain(named) {
            let mode = libc::S_IFDIR;
            let added = if plus {
                buf.add_plus_unlooked(ino, off, mode, name)
            } else {
                buf.add(ino, off, mode, name)
            };
            if !added {
                break;
            }
        }
        reply.data(&buf.into_bytes())
    }

    fn serve_view(&self, v: &Arc<View>, ino: Ino, op: &Op<'_>, reply: Reply) {
        let attr =
            |r: &dyn Fn() -> Result<Attr, Error>| self.past.read(v, || r().map_err(e)).and_then(|a| v.tag(a));
        match *op {
            Op::Lookup { name } if ino == ROOT && name == b".." => {
                self.virtual_entry(self.past.dir_attr().map_err(e), reply)
            }
            Op::Lookup { name } => self.virtual_entry(attr(&|| v.fs.lookup(ino, name)), reply),
            Op::Getattr => match attr(&|| v.fs.getattr(ino)) {
                Ok(a) => reply.data(&abi::attr_out(&file_attr(&a), self.opts.attr_timeout)),
                Err(err) => reply.error(err),
            },
            Op::Readlink => self.view_data(self.past.read(v, || v.fs.readlink(ino).map_err(e)), reply),
            // Nothing opens the past to write (a shared writable mapping
            // would change pages the kernel keeps).
            Op::Open { flags } if flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32 => {
                reply.error(libc::EROFS)
            }
            Op::Open { flags } if flags & libc::O_TRUNC as u32 != 0 => reply.error(libc::EROFS),
            Op::Open { .. } => match self.past.read(v, || v.fs.getattr(ino).map_err(e)) {
                Ok(_) => match v.fs.open_file(ino) {
                    Ok(_) => {
                        let mut b = Vec::with_capacity(16);
                        abi::put_open(&mut b, fopen::KEEP_CACHE);
                        reply.data(&b)
                    }
                    Err(err) => reply.error(e(err)),
                },
                Err(err) => reply.error(err),
            },
            Op::Release => match v.fs.release_file(ino) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            },
            Op::Read { offset, size, .. } => {
                let (live, v) = (self.fs(), Arc::clone(v));
                self.workers.run(move || {
                    let r = read_view(&live, &v, || v.fs.read(ino, offset, size as usize).map_err(e));
                    match r {
                        Ok(d) => reply.data(&d),
                        Err(err) => reply.error(err),
                    }
                });
            }
            Op::Opendir if self.no_opendir => reply.error(libc::ENOSYS),
            Op::Opendir => match attr(&|| v.fs.getattr(ino)) {
                Ok(a) if a.kind == Kind::Dir => {
                    let mut b = Vec::with_capacity(16);
                    abi::put_open(&mut b, fopen::KEEP_CACHE | fopen::CACHE_DIR);
                    reply.data(&b)
                }
                Ok(_) => reply.error(libc::ENOTDIR),
                Err(err) => reply.error(err),
            },
            Op::Readdir { offset, size, plus } => {
                let r = self.past.read(v, || self.list_view(v, ino, offset, size, plus));
                self.view_data(r, reply)
            }
            Op::Access => {
                self.view_data(self.past.read(v, || v.fs.getattr(ino).map(|_| Vec::new()).map_err(e)), reply)
            }
            Op::Getxattr { name, size } => match self.past.read(v, || v.fs.getxattr(ino, name).map_err(e)) {
                Ok(x) => Self::xattr(&x, size, reply),
                Err(err) => reply.error(err),
            },
            Op::Listxattr { size } => match self.past.read(v, || v.fs.listxattr(ino).map_err(e)) {
                Ok(names) => {
                    let list: Vec<u8> = names.iter().flat_map(|n| n.iter().chain([&0])).copied().collect();
                    Self::xattr(&list, size, reply)
                }
                Err(err) => reply.error(err),
            },
            Op::Lseek { offset, whence } => {
                let data = match whence as i32 {
                    libc::SEEK_DATA => true,
                    libc::SEEK_HOLE => false,
                    _ => return reply.error(libc::EINVAL),
                };
                match self.past.read(v, || v.fs.lseek(ino, offset, data).map_err(e)) {
                    Ok(o) => reply.data(&abi::lseek_out(o)),
                    Err(err) => reply.error(err),
                }
            }
            Op::Statfs => self.statfs(reply),
            Op::Releasedir | Op::Flush | Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::Syncfs => reply.ok(),
            Op::Forget { .. } | Op::BatchForget { .. } | Op::Interrupt | Op::Destroy => reply.ok(),
            // Copies and moves out of the past go by read and write.
            Op::CopyFileRange { .. } => reply.error(libc::EXDEV),
            Op::Rename { newdir, .. } if !v.owns(newdir) => reply.error(libc::EXDEV),
            Op::Unsupported(_) => reply.error(libc::ENOSYS),
            _ => reply.error(libc::EROFS),
        }
    }

    /// A data reply for a read through a view.
    fn view_data(&self, r: Result<Vec<u8>, i32>, reply: Reply) {
        match r {
            Ok(d) => reply.data(&d),
            Err(err) => reply.error(err),
        }
    }

    /// The READDIR(PLUS) reply of directory `ino` of view `v` after
    /// offset `offset`.
    fn list_view(&self, v: &View, ino: Ino, offset: u64, size: u32, plus: bool) -> Result<Vec<u8>, i32> {
        let node = v.node(ino)?;
        let parent = if ino == ROOT { SNAPDIR } else { v.node(v.fs.lookup(ino, b"..").map_err(e)?.ino)? };
        let listing = self.listing_of(&v.fs, node, ino).map_err(e)?;
        let (et, at) = (self.opts.entry_timeout, self.opts.attr_timeout);
        let mut buf = DirBuf::new(size);
        let dots = [(node, dirlist::DOT, &b"."[..]), (parent, dirlist::DOTDOT, &b".."[..])];
        let dots =
            dots.into_iter().filter(|d| d.1 > offset).map(|(n, off, name)| (n, off, Kind::Dir, name, true));
        let named = listing.after(offset).iter().map(|x| (x.ino, x.off, x.kind, &x.name[..], false));
        for (child, off, kind, name, dot) in dots.chain(named) {
            // (A READDIRPLUS reply has every entry in its form; the
            // kernel looks nothing up for "." and "..".)
            let added = if dot && plus {
                buf.add_plus_unlooked(child, off, libc::S_IFDIR, name)
            } else if !plus {
                buf.add(if dot { child } else { v.node(child)? }, off, type_bits(kind), name)
            } else {
                // An entry the view cannot stat is left out.
                match v.fs.getattr(child).map_err(e).and_then(|a| v.tag(a)) {
                    Ok(a) => buf.add_plus(&file_attr(&a), off, name, et, at),
                    Err(_) => true,
                }
            };
            if !added {
                break;
            }
        }
        Ok(buf.into_bytes())
    }
}
