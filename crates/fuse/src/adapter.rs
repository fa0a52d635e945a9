//! The adapter from FUSE requests to [`Fs`] calls ([`ZlogFuse`]): owners
//! and credentials, attributes, directory listings, and each operation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::abi::{self, fopen, DirBuf, FileAttr, InHeader, Op};
use crate::dev;
use crate::dirlist::{self, Listing, Listings};
use crate::options::MountOptions;
use crate::past::{self, Snapdir};
use crate::serve::{Handler, Reply, Workers};
use zlogfs_fs::{errno, is_failure};
use zlogfs_fs::{Attr, Caller, DirEntry, Error, Fs, Ino, Kind, Live, SetAttr, Time, ROOT, XATTR_KILL_SGID};

/// Flags of every opened file: every change passes through this mount, so
/// the kernel's page cache stays valid across opens; and a close needs no
/// FLUSH request (flush has nothing to do here: data is committed by the
/// commit interval, fsync and unmount, and POSIX locks are the kernel's).
const OPEN_FLAGS: u32 = fopen::KEEP_CACHE | fopen::NOFLUSH;

/// Reads and writes of this many bytes or more are served by a worker.
pub(crate) const LARGE_IO: usize = 128 << 10;

/// Directory entries loaded from the index at a time.
const DIR_BATCH: usize = 4096;
/// Bytes of directory listings kept between readdir requests.
const LISTING_BYTES: usize = 32 << 20;

/// The adapter from FUSE requests to an [`Fs`].
pub struct ZlogFuse {
    live: Arc<Live>,
    /// The [`Live::generation`] whose file system the caches below hold.
    seen: AtomicU64,
    pub(crate) opts: MountOptions,
    pub(crate) workers: Workers,
    listings: Listings,
    /// The kernel lets OPENDIR be refused with ENOSYS and then sends no
    /// OPENDIR or RELEASEDIR at all (Linux 5.1 and later).
    pub(crate) no_opendir: bool,
    /// The INIT flags agreed.
    flags: u64,
    /// The kernel's references to directories (their lookup counts, less
    /// what FORGET gave back): a removed directory lives on, stat-able,
    /// while the kernel holds it, as an open descriptor or a working
    /// directory may. (Files are held by their OPENs.)
    held_dirs: Mutex<HashMap<Ino, u64>>,
    /// The `.snapshots` directory and the snapshots opened through it.
    pub(crate) past: past::Past,
}

/// A request's caller as the set-ID rules need it: whether it has
/// CAP_FSETID (`fsetid`, when the kernel said; otherwise its effective
/// capabilities in /proc/PID/status) and its groups (the request's file
/// system group, and the supplementary groups /proc shows). A caller /proc
/// does not show (gone, or in another pid namespace, pid 0) counts as
/// having no CAP_FSETID and no other group: the bits go, the safe side.
fn caller_of(pid: u32, gid: u32, fsetid: Option<bool>) -> Caller {
    let status = if pid == 0 {
        String::new()
    } else {
        std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
    };
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    const CAP_FSETID: u32 = 4;
    let fsetid = fsetid.unwrap_or_else(|| {
        field("CapEff:")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .is_some_and(|c| c >> CAP_FSETID & 1 == 1)
    });
    let mut groups: Vec<u32> = field("Groups:")
        .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    groups.push(gid);
    Caller { fsetid, groups }
}

/// A write, fallocate or copy into `ino` by a caller without CAP_FSETID
/// may have cleared its set-ID bits: the kernel's cached attributes go
/// before the reply, or they show the bits for up to `attr_timeout`
/// (xfstests generic/355, 683-685).
fn setid_cleared(fs: &Fs, ino: Ino) {
    fs.changed_elsewhere(ino, dev::ATTRS_ONLY, 0);
}

/// The errno of a failed request, logging failures that are more than a
/// refused operation.
pub(crate) fn reply_errno(e: Error) -> i32 {
    if is_failure(&e) {
        tracing::error!("{e}");
    } else {
        // What the caller was told, with its reason (ENOSPC: how much
        // room there was), for `log=debug`.
        tracing::debug!("answered {}: {e}", errno(&e));
    }
    errno(&e)
}

/// Reply with bytes, or the error.
fn data(r: Result<Vec<u8>, Error>, reply: Reply) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(reply_errno(e)),
    }
}

/// Reply to a request that returns nothing.
fn empty(r: Result<(), Error>, reply: Reply) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(reply_errno(e)),
    }
}

/// Reply to a write or a copy with the count of bytes.
fn written(r: Result<usize, Error>, reply: Reply) {
    match r {
        Ok(n) => reply.data(&abi::write_out(n as u32)),
        Err(e) => reply.error(reply_errno(e)),
    }
}

/// Every entry of directory `ino` of `fs`, in batches.
fn read_dir(fs: &Fs, ino: Ino) -> Result<Vec<DirEntry>, Error> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map(|e: &DirEntry| e.name.clone());
        let batch = fs.readdir(ino, after.as_deref(), DIR_BATCH)?;
        let done = batch.len() < DIR_BATCH;
        all.extend(batch);
        if done {
            return Ok(all);
        }
    }
}

pub(crate) fn type_bits(k: Kind) -> u32 {
    match k {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::Char => libc::S_IFCHR,
        Kind::Block => libc::S_IFBLK,
    }
}

fn time(t: Time) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// The generation of an entry: the low bits of its birth time in
/// milliseconds, so that an inode number given again (after a crash lost
/// the allocation of the first) is not taken for the old file by a
/// file handle. Inode numbers are otherwise never reused. The root's is 0,
/// as the kernel's root inode has.
fn generation(a: &Attr) -> u64 {
    if a.ino == ROOT {
        return 0;
    }
    let ms = (a.btime.sec as u64).wrapping_mul(1000).wrapping_add(u64::from(a.btime.nsec / 1_000_000));
    // The kernel keeps 32 bits of it in a file handle; never 0.
    u64::from((ms as u32).max(1))
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        generation: generation(a),
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        mode: type_bits(a.kind) | (a.mode & 0o7777),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's 32-bit device encoding (major 12 bits, minor 20):
        // the low half of glibc's 64-bit dev_t for such numbers.
        rdev: a.rdev as u32,
        blksize: a.blksize,
    }
}

fn set_time(t: Option<Option<(i64, u32)>>) -> Option<Option<Time>> {
    t.map(|t| t.map(|(sec, nsec)| Time { sec, nsec }))
}

impl ZlogFuse {
    /// An adapter serving `fs`.
    pub(crate) fn new(live: Arc<Live>, opts: MountOptions, n: &dev::Negotiated) -> ZlogFuse {
        let workers = Workers::new(opts.threads);
        let listings = Listings::new(LISTING_BYTES);
        let held_dirs = Mutex::new(HashMap::new());
        let past = past::Past::new(Arc::clone(&live), opts.snapdir);
        let seen = AtomicU64::new(live.generation());
        ZlogFuse {
            live,
            seen,
            opts,
            workers,
            listings,
            no_opendir: n.no_opendir,
            flags: n.flags,
            held_dirs,
            past,
        }
    }

    /// The file system a request is served by (taken once per request).
    pub(crate) fn fs(&self) -> Arc<Fs> {
        self.live.get()
    }

    /// After the live file system was replaced by a newer state, the
    /// listings of the old one go, and the snapshot views open again on
    /// the new one.
    fn catch_up(&self) {
        let g = self.live.generation();
        if self.seen.swap(g, Ordering::AcqRel) != g {
            self.listings.clear();
            self.past.reopen_views();
        }
    }

    /// Flags of an opened file: a mount that follows a writer elsewhere
    /// lets the kernel keep no pages across opens.
    fn open_flags(&self) -> u32 {
        if self.live.follows() {
            fopen::NOFLUSH
        } else {
            OPEN_FLAGS
        }
    }

    /// Whether `ino` has a set-ID bit (only then does a change's caller
    /// matter).
    fn has_setid(&self, ino: Ino) -> bool {
        self.fs().getattr(ino).is_ok_and(|a| a.mode & (libc::S_ISUID | libc::S_ISGID) != 0)
    }

    /// Who sent `h`, for the set-ID rules, when the kernel leaves those to
    /// us (`FUSE_HANDLE_KILLPRIV_V2`).
    fn caller(&self, h: &InHeader, fsetid: Option<bool>) -> Caller {
        caller_of(h.pid, h.gid, fsetid)
    }

    pub(crate) fn entry_bytes(&self, a: &Attr) -> Vec<u8> {
        let mut b = Vec::with_capacity(abi::ENTRY_OUT + 16);
        abi::put_entry(&mut b, &file_attr(a), self.opts.entry_timeout, self.opts.attr_timeout);
        b
    }

    fn entry(&self, r: Result<Attr, Error>, reply: Reply) {
        match r {
            Ok(a) => {
                self.looked_up(&a);
                reply.data(&self.entry_bytes(&a))
            }
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    /// An entry reply for `a` makes one more kernel reference to it.
    fn looked_up(&self, a: &Attr) {
        if a.kind != Kind::Dir || a.ino == ROOT {
            return;
        }
        let mut held = self.held_dirs.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(a.ino).or_insert(0);
        if *n == 0 {
            if let Err(e) = self.fs().open_file(a.ino) {
                reply_errno(e);
            }
        }
        *n += 1;
    }

    /// The kernel gave back `n` references to `ino`.
    fn forget(&self, ino: Ino, n: u64) {
        let mut held = self.held_dirs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = held.get_mut(&ino) else { return };
        *c = c.saturating_sub(n);
        if *c == 0 {
            held.remove(&ino);
            // Deletes it if it was removed meanwhile.
            if let Err(e) = self.fs().release_file(ino) {
                reply_errno(e);
            }
        }
    }

    pub(crate) fn attr(&self, r: Result<Attr, Error>, reply: Reply) {
        match r {
            Ok(a) => reply.data(&abi::attr_out(&file_attr(&a), self.opts.attr_timeout)),
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    /// Owner, group and mode of a new entry of `parent` made by `h`'s
    /// caller.
    fn owner(&self, h: &InHeader, parent: Ino, mode: u32) -> Result<(u32, u32, u32), Error> {
        let p = self.fs().getattr(parent)?;
        if p.mode & libc::S_ISGID != 0 {
            let dir = mode & libc::S_IFMT == libc::S_IFDIR;
            Ok((h.uid, p.gid, if dir { mode | libc::S_ISGID } else { mode }))
        } else {
            Ok((h.uid, h.gid, mode))
        }
    }

    fn make(&self, h: &InHeader, name: &[u8], mode: u32, umask: u32, rdev: u64) -> Result<Attr, Error> {
        let parent = h.nodeid;
        let (uid, gid, mode) = self.owner(h, parent, mode)?;
        let r = self.fs().mknod_umask(parent, name, mode, umask, (uid, gid), rdev);
        self.changed(&[parent]);
        r
    }

    /// The listing of directory `ino` (with `.snapshots` in the root if
    /// the mount shows it).
    fn listing(&self, ino: Ino) -> Result<Arc<Listing>, Error> {
        self.listings.get(ino, || {
            let mut all = read_dir(&self.fs(), ino)?;
            if ino == ROOT && self.past.mode() != Snapdir::Off {
                // A real entry of that name is out of reach (snapdir=off
                // reaches it).
                all.retain(|e| e.name != past::NAME);
                if self.past.mode() == Snapdir::Visible {
                    all.push(DirEntry { name: past::NAME.to_vec(), ino: past::SNAPDIR, kind: Kind::Dir });
                }
            }
            Ok(all)
        })
    }

    /// The listing of directory `ino` of `fs`, cached under node id
    /// `node`.
    pub(crate) fn listing_of(&self, fs: &Fs, node: u64, ino: Ino) -> Result<Arc<Listing>, Error> {
        self.listings.get(node, || read_dir(fs, ino))
    }

    /// Entries of directory `ino` after readdir offset `off`, each with its
    /// offset, "." and ".." first; `f` takes them until it returns false
    /// (the reply is full).
    fn list(
        &self,
        ino: Ino,
        off: u64,
        mut f: impl FnMut(Ino, u64, Kind, &[u8]) -> bool,
    ) -> Result<(), Error> {
        let l = self.listing(ino)?;
        if off < dirlist::DOT && !f(ino, dirlist::DOT, Kind::Dir, b".") {
            return Ok(());
        }
        if off < dirlist::DOTDOT {
            let parent = self.fs().lookup(ino, b"..")?.ino;
            if !f(parent, dirlist::DOTDOT, Kind::Dir, b"..") {
                return Ok(());
            }
        }
        for e in l.after(off) {
            if !f(e.ino, e.off, e.kind, &e.name) {
                break;
            }
        }
        Ok(())
    }

    /// The entries of `dirs` changed: forget their listings.
    fn changed(&self, dirs: &[Ino]) {
        for &d in dirs {
            self.listings.changed(d);
        }
    }

    fn readdir(&self, ino: Ino, offset: u64, size: u32, plus: bool, reply: Reply) {
        let mut buf = DirBuf::new(size);
        let (et, at) = (self.opts.entry_timeout, self.opts.attr_timeout);
        let mut failed = None;
        let r = self.list(ino, offset, |child, off, kind, name| {
            if !plus {
                return buf.add(child, off, type_bits(kind), name);
            }
            if child == past::SNAPDIR {
                // Listed, but not looked up: its attributes come by LOOKUP.
                return buf.add_plus_unlooked(child, off, libc::S_IFDIR, name);
            }
            // An entry removed since it was listed is left out; any other
            // failure (a damaged index block) fails the listing rather
            // than shorten it silently.
            match self.fs().getattr(child) {
                Ok(a) => {
                    let added = buf.add_plus(&file_attr(&a), off, name, et, at);
                    // The kernel counts a lookup of each entry but "." and "..".
                    if added && name != b"." && name != b".." {
                        self.looked_up(&a);
                    }
                    added
                }
                Err(Error::NotFound(_)) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        });
        match r.and_then(|()| failed.map_or(Ok(()), Err)) {
            Ok(()) => reply.data(&buf.into_bytes()),
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    fn lookup(&self, parent: Ino, name: &[u8], reply: Reply) {
        match self.fs().lookup(parent, name) {
            Err(e) if matches!(e, Error::NotFound(_)) && !self.opts.negative_timeout.is_zero() => {
                // A node id of 0 is a negative entry the kernel may cache.
                let mut b = Vec::with_capacity(abi::ENTRY_OUT);
                let a = FileAttr { blksize: 4096, ..FileAttr::default() };
                abi::put_entry(&mut b, &a, self.opts.negative_timeout, Duration::ZERO);
                reply.data(&b);
            }
            r => self.entry(r, reply),
        }
    }

    pub(crate) fn xattr(v: &[u8], size: u32, reply: Reply) {
        if size == 0 {
            reply.data(&abi::xattr_size(v.len() as u32));
        } else if v.len() > size as usize {
            reply.error(libc::ERANGE);
        } else {
            reply.data(v);
        }
    }
}

impl Handler for ZlogFuse {
    fn flags(&self) -> u64 {
        self.flags
    }

    /// One request: a call per operation, so that each reads on its own.
    fn serve(&self, h: &InHeader, op: Op<'_>, reply: Reply) {
        self.catch_up();
        let Some(reply) = self.serve_past(h, &op, reply) else { return };
        let ino = h.nodeid;
        match op {
            Op::Lookup { name } => self.lookup(ino, name, reply),
            Op::Getattr => self.attr(self.fs().getattr(ino), reply),
            Op::Setattr(s) => self.setattr(h, &s, reply),
            Op::Readlink => data(self.fs().readlink(ino), reply),
            Op::Mknod { name, mode, rdev, umask } => {
                self.entry(self.make(h, name, mode, umask, u64::from(rdev)), reply)
            }
            Op::Mkdir { name, mode, umask } => {
                self.entry(self.make(h, name, libc::S_IFDIR | (mode & 0o7777), umask, 0), reply)
            }
            Op::Symlink { name, target } => self.symlink(h, name, target, reply),
            Op::Unlink { name } => self.in_dirs(&[ino], self.fs().unlink(ino, name), reply),
            Op::Rmdir { name } => self.in_dirs(&[ino], self.fs().rmdir(ino, name), reply),
            Op::Rename { name, newdir, newname, flags } => {
                self.in_dirs(&[ino, newdir], self.fs().rename(ino, name, newdir, newname, flags), reply)
            }
            Op::Link { ino: target, newname } => {
                let r = self.fs().link(target, ino, newname);
                self.changed(&[ino]);
                self.entry(r, reply)
            }
            Op::Open { flags } => self.open(ino, flags, reply),
            Op::Read { offset, size, flags } => self.read(ino, offset, size, flags, reply),
            Op::Write { offset, data, kill_setid } => self.write(h, offset, data, kill_setid, reply),
            Op::Statfs => self.statfs(reply),
            Op::Release => empty(self.fs().release_file(ino), reply),
            Op::Flush | Op::Releasedir | Op::Destroy => reply.ok(),
            Op::Fsync { datasync } | Op::Fsyncdir { datasync } => {
                let fs = self.fs();
                self.workers.run(move || empty(fs.fsync(ino, datasync), reply));
            }
            Op::Syncfs => {
                let fs = self.fs();
                self.workers.run(move || empty(fs.sync(), reply));
            }
            Op::Setxattr { name, value, flags, kill_sgid } => {
                let flags = if kill_sgid { flags | XATTR_KILL_SGID } else { flags & !XATTR_KILL_SGID };
                empty(self.fs().setxattr(ino, name, value, flags), reply)
            }
            Op::Getxattr { name, size } => match self.fs().getxattr(ino, name) {
                Ok(v) => Self::xattr(&v, size, reply),
                Err(e) => reply.error(reply_errno(e)),
            },
            Op::Listxattr { size } => self.listxattr(ino, size, reply),
            Op::Removexattr { name } => empty(self.fs().removexattr(ino, name), reply),
            Op::Opendir => self.opendir(ino, reply),
            Op::Readdir { offset, size, plus } => self.readdir(ino, offset, size, plus, reply),
            // The kernel checks permissions (default_permissions); this
            // only says whether the inode exists.
            Op::Access => empty(self.fs().getattr(ino).map(|_| ()), reply),
            Op::Create { name, mode, umask } => self.create(h, name, mode, umask, reply),
            Op::Fallocate { offset, length, mode } => self.fallocate(h, offset, length, mode, reply),
            Op::Lseek { offset, whence } => self.lseek(ino, offset, whence, reply),
            Op::CopyFileRange { off_in, ino_out, off_out, len } => {
                self.copy_file_range(h, off_in, ino_out, off_out, len, reply)
            }
            Op::Forget { nlookup } => {
                self.forget(ino, nlookup);
                reply.ok()
            }
            Op::BatchForget { items } => {
                for (node, n) in Op::batch_forgets(items) {
                    self.forget(node, n);
                }
                reply.ok()
            }
            // Answered by the transports themselves.
            Op::Interrupt => reply.ok(),
            Op::Unsupported(_) => reply.error(libc::ENOSYS),
        }
    }
}

/// The operations whose replies take more than a line.
impl ZlogFuse {
    fn setattr(&self, h: &InHeader, s: &abi::Setattr, reply: Reply) {
        let ino = h.nodeid;
        // A truncate says KILL_SUIDGID only when its caller has no
        // CAP_FSETID; a chown always, and we look.
        let chown = s.uid.is_some() || s.gid.is_some();
        let by = (s.kill_setid && self.has_setid(ino))
            .then(|| self.caller(h, if chown { None } else { Some(false) }));
        let a = SetAttr {
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            atime: set_time(s.atime),
            mtime: set_time(s.mtime),
            ctime: None,
            btime: None,
            by,
        };
        self.attr(self.fs().setattr(ino, &a), reply)
    }

    fn symlink(&self, h: &InHeader, name: &[u8], target: &[u8], reply: Reply) {
        let dir = h.nodeid;
        let r = self
            .owner(h, dir, libc::S_IFLNK)
            .and_then(|(uid, gid, _)| self.fs().symlink(dir, name, target, uid, gid));
        self.changed(&[dir]);
        self.entry(r, reply)
    }

    /// The reply to an operation that changed the entries of `dirs`.
    fn in_dirs(&self, dirs: &[Ino], r: Result<(), Error>, reply: Reply) {
        self.changed(dirs);
        empty(r, reply)
    }

    /// An open keeps the kernel's cached pages; one for reading may move
    /// the atime (see [`Fs::open_to_read`]), and then the kernel's cached
    /// attributes go before the reply.
    fn open(&self, ino: Ino, flags: u32, reply: Reply) {
        let fs = self.fs();
        // O_NOATIME (backup tools): the kernel checked the caller may.
        let no_atime = flags & libc::O_NOATIME as u32 != 0;
        let r = if no_atime || flags & libc::O_ACCMODE as u32 == libc::O_WRONLY as u32 {
            fs.open_file(ino).map(|_| false)
        } else {
            fs.open_to_read(ino)
        };
        match r {
            Ok(moved) => {
                if moved {
                    fs.changed_elsewhere(ino, dev::ATTRS_ONLY, 0);
                }
                let mut b = Vec::with_capacity(16);
                abi::put_open(&mut b, self.open_flags());
                reply.data(&b)
            }
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    /// A read, large ones on a worker; one through an `O_NOATIME`
    /// descriptor leaves the atime alone.
    fn read(&self, ino: Ino, offset: u64, size: u32, flags: u32, reply: Reply) {
        let fs = self.fs();
        let no_atime = flags & libc::O_NOATIME as u32 != 0;
        let serve = move || {
            let r = if no_atime {
                fs.read_noatime(ino, offset, size as usize)
            } else {
                fs.read(ino, offset, size as usize)
            };
            data(r, reply)
        };
        if size as usize >= LARGE_IO {
            self.workers.run(serve);
        } else {
            serve();
        }
    }

    /// A write, large ones on a worker.
    fn write(&self, h: &InHeader, offset: u64, data: &[u8], kill_setid: bool, reply: Reply) {
        let ino = h.nodeid;
        // The writer has no CAP_FSETID: the set-ID bits may go.
        let by = (kill_setid && self.has_setid(ino)).then(|| self.caller(h, Some(false)));
        let write = move |fs: &Fs, data: &[u8]| match &by {
            Some(c) => fs.write_by(ino, offset, data, c).inspect(|_| setid_cleared(fs, ino)),
            None => fs.write(ino, offset, data),
        };
        if data.len() >= LARGE_IO {
            // The request's buffer is the transport's: a worker needs a
            // copy.
            let fs = self.fs();
            let data = data.to_vec();
            self.workers.run(move || written(write(&fs, &data), reply));
            return;
        }
        written(write(&self.fs(), data), reply)
    }

    pub(crate) fn statfs(&self, reply: Reply) {
        match self.fs().statfs() {
            Ok(s) => reply.data(&abi::statfs_out(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            )),
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    fn listxattr(&self, ino: Ino, size: u32, reply: Reply) {
        match self.fs().listxattr(ino) {
            Ok(names) => {
                let mut v = Vec::new();
                for n in names {
                    v.extend_from_slice(&n);
                    v.push(0);
                }
                Self::xattr(&v, size, reply)
            }
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    fn opendir(&self, ino: Ino, reply: Reply) {
        // Offsets need no per-handle state (see dirlist): where the kernel
        // allows, it is told so once and then opens directories itself,
        // caching their listings (FOPEN_CACHE_DIR is its default then).
        if self.no_opendir {
            return reply.error(libc::ENOSYS);
        }
        match self.fs().getattr(ino) {
            Ok(a) if a.kind == Kind::Dir => {
                let mut b = Vec::with_capacity(16);
                let keep = if self.live.follows() { 0 } else { fopen::KEEP_CACHE | fopen::CACHE_DIR };
                abi::put_open(&mut b, keep);
                reply.data(&b)
            }
            Ok(_) => reply.error(libc::ENOTDIR),
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    fn create(&self, h: &InHeader, name: &[u8], mode: u32, umask: u32, reply: Reply) {
        let r = self
            .make(h, name, libc::S_IFREG | (mode & 0o7777), umask, 0)
            .and_then(|a| self.fs().open_file(a.ino));
        match r {
            Ok(a) => {
                let mut b = self.entry_bytes(&a);
                abi::put_open(&mut b, self.open_flags());
                reply.data(&b)
            }
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    fn fallocate(&self, h: &InHeader, offset: u64, length: u64, mode: u32, reply: Reply) {
        let ino = h.nodeid;
        // The kernel leaves the set-ID bits to us and says nothing of the
        // caller's CAP_FSETID: we look.
        let by = self.has_setid(ino).then(|| self.caller(h, None));
        let fs = self.fs();
        self.workers.run(move || {
            let r = match &by {
                Some(c) => {
                    fs.fallocate_by(ino, mode, offset, length, c).inspect(|()| setid_cleared(&fs, ino))
                }
                None => fs.fallocate(ino, mode, offset, length),
            };
            empty(r, reply)
        });
    }

    fn lseek(&self, ino: Ino, offset: u64, whence: u32, reply: Reply) {
        let data = match whence as i32 {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(libc::EINVAL),
        };
        if (offset as i64) < 0 {
            return reply.error(libc::ENXIO);
        }
        match self.fs().lseek(ino, offset, data) {
            Ok(o) => reply.data(&abi::lseek_out(o)),
            Err(e) => reply.error(reply_errno(e)),
        }
    }

    fn copy_file_range(&self, h: &InHeader, off_in: u64, ino_out: Ino, off_out: u64, len: u64, reply: Reply) {
        let ino = h.nodeid;
        // The reply counts bytes in 32 bits: copy at most 1 GiB per call
        // (callers loop on short copies).
        let len = len.min(1 << 30);
        let by = self.has_setid(ino_out).then(|| self.caller(h, None));
        let fs = self.fs();
        self.workers.run(move || {
            let r = fs.copy_file_range_by(ino, off_in, ino_out, off_out, len, by.as_ref());
            if by.is_some() && r.is_ok() {
                setid_cleared(&fs, ino_out);
            }
            written(r.map(|n| n as usize), reply)
        });
    }
}
