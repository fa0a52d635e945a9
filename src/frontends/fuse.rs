//! The FUSE mount: a thin adapter from kernel requests to [`Fs`] calls.
//!
//! Binding: `fuser` (pure Rust, no libfuse to link; mounts through
//! `mount(2)` as root and through `fusermount3` otherwise).
//! docs/ARCHITECTURE.md says why this binding.
//!
//! Threads: one thread reads the requests and serves the quick ones
//! itself; the ones that may take long (fsync, reads and writes of
//! [`LARGE_IO`] bytes or more, fallocate, copy_file_range) go to
//! [`Workers`]. A request and its reply each wake a thread, and a lone
//! reader is the one the kernel wakes every time: it stays hot on its CPU,
//! where several readers would be woken in turn, each the one that waited
//! longest (docs/BENCHMARKS.md measured both).
//!
//! What the adapter decides, and nothing else:
//! - permission checks are the kernel's (`default_permissions` is always
//!   on): the file system layer keeps modes and owners, the kernel's VFS
//!   enforces them, including the sticky bit and the suid/sgid clearing on
//!   chown and write;
//! - owners of new entries come from the request's credentials, with the
//!   group of a set-group-ID directory inherited (and its S_ISGID bit by
//!   subdirectories), as ext4 does;
//! - directory offsets: a hash of the entry's name, directories listed in
//!   hash order ([`super::dirlist`]), so that no state is kept per open
//!   directory and the kernel need not send OPENDIR and RELEASEDIR;
//! - errors: every [`Error`] carries its errno; anything that is not a plain
//!   POSIX error (I/O failure, damage) is also written to stderr.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Config, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, Session, SessionACL, TimeOrNow, WriteFlags,
};

use super::dirlist::{self, Listing, Listings};
use crate::error::Error;
use crate::fs::{Attr, DirEntry, Fs, Ino, Kind, SetAttr, Time};

/// Options of a mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Mount read-only (the kernel refuses every change with EROFS).
    pub read_only: bool,
    /// Let users other than the mounter use the mount.
    pub allow_other: bool,
    /// How long the kernel may cache attributes.
    pub attr_timeout: Duration,
    /// How long the kernel may cache names.
    pub entry_timeout: Duration,
    /// How long the kernel may cache "no such name" (0: not at all).
    pub negative_timeout: Duration,
    /// Threads serving the requests that may take long (the quick ones
    /// are served by the one thread that reads them).
    pub threads: usize,
    /// The source shown in /proc/mounts (the image path).
    pub fsname: String,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            allow_other: false,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            threads: 4,
            fsname: "zlogfs".into(),
        }
    }
}

/// Flags of every opened file: every change passes through this mount, so
/// the kernel's page cache stays valid across opens; and a close needs no
/// FLUSH request (flush has nothing to do here: data is committed by the
/// commit interval, fsync and unmount, and POSIX locks are the kernel's).
const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// Largest write the kernel may send in one request.
const MAX_WRITE: u32 = 1 << 20;
/// Reads and writes of this many bytes or more are served by a worker.
const LARGE_IO: usize = 128 << 10;

type Job = Box<dyn FnOnce() + Send>;

/// Threads that serve the requests that may take long, so that the thread
/// reading requests stays free for the others.
struct Workers {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    fn new(n: usize) -> Workers {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n.max(1))
            .filter_map(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("zlogfs-worker-{i}"))
                    .spawn(move || loop {
                        // The lock is held only while waiting for a job.
                        let job = match rx.lock() {
                            Ok(q) => q.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    })
                    .ok()
            })
            .collect();
        Workers { queue: Mutex::new(Some(tx)), threads: Mutex::new(threads) }
    }

    /// Run `job` on a worker; on the calling thread if there is none (no
    /// thread could be started, or the workers were stopped).
    fn run(&self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(job);
        let job = match self.queue.lock() {
            Ok(q) => match q.as_ref() {
                Some(tx) => match tx.send(job) {
                    Ok(()) => return,
                    Err(mpsc::SendError(job)) => job,
                },
                None => job,
            },
            Err(_) => job,
        };
        job();
    }

    /// Let the queued jobs finish and end the threads.
    fn stop(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let threads = self.threads.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Directory entries loaded from the index at a time.
const DIR_BATCH: usize = 4096;
/// Bytes of directory listings kept between readdir requests.
const LISTING_BYTES: usize = 32 << 20;

/// The [`fuser::Filesystem`] over an [`Fs`].
pub struct ZlogFuse {
    fs: Arc<Fs>,
    opts: MountOptions,
    workers: Workers,
    listings: Listings,
    /// The kernel lets OPENDIR be refused with ENOSYS and then sends no
    /// OPENDIR or RELEASEDIR at all (Linux 5.1 and later).
    no_opendir: bool,
}

fn errno(e: Error) -> Errno {
    if !matches!(e, Error::Posix { .. }) {
        eprintln!("zlogfs: {e}");
    }
    Errno::from_i32(e.errno())
}

/// Reply to a request that returns nothing.
fn empty(r: Result<(), Error>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.to_system(),
        mtime: a.mtime.to_system(),
        ctime: a.ctime.to_system(),
        crtime: a.btime.to_system(),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's 32-bit device encoding (major 12 bits, minor 20):
        // the low half of glibc's 64-bit dev_t for such numbers.
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

fn time_or_now(t: Option<TimeOrNow>) -> Option<Option<Time>> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(s) => Some(Time::from_system(s)),
        TimeOrNow::Now => None,
    })
}

impl ZlogFuse {
    /// An adapter serving `fs`.
    pub fn new(fs: Arc<Fs>, opts: MountOptions) -> ZlogFuse {
        let workers = Workers::new(opts.threads);
        ZlogFuse { fs, opts, workers, listings: Listings::new(LISTING_BYTES), no_opendir: false }
    }

    fn entry(&self, r: Result<Attr, Error>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&self.opts.entry_timeout, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn attr(&self, r: Result<Attr, Error>, reply: ReplyAttr) {
        match r {
            Ok(a) => reply.attr(&self.opts.attr_timeout, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Owner, group and mode of a new entry of `parent` made by `req`.
    fn owner(&self, req: &Request, parent: Ino, mode: u32) -> Result<(u32, u32, u32), Error> {
        let p = self.fs.getattr(parent)?;
        if p.mode & libc::S_ISGID != 0 {
            let dir = mode & libc::S_IFMT == libc::S_IFDIR;
            Ok((req.uid(), p.gid, if dir { mode | libc::S_ISGID } else { mode }))
        } else {
            Ok((req.uid(), req.gid(), mode))
        }
    }

    fn make(
        &self,
        req: &Request,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u64,
    ) -> Result<Attr, Error> {
        let (uid, gid, mode) = self.owner(req, parent, mode)?;
        self.fs.mknod_umask(parent, name.as_bytes(), mode, umask, (uid, gid), rdev)
    }

    /// The listing of directory `ino`, and its parent.
    fn listing(&self, ino: Ino) -> Result<Arc<Listing>, Error> {
        self.listings.get(ino, || {
            let mut all = Vec::new();
            loop {
                let after = all.last().map(|e: &DirEntry| e.name.clone());
                let batch = self.fs.readdir(ino, after.as_deref(), DIR_BATCH)?;
                let done = batch.len() < DIR_BATCH;
                all.extend(batch);
                if done {
                    return Ok(all);
                }
            }
        })
    }

    /// Entries of directory `ino` after readdir offset `off`, each with its
    /// offset, "." and ".." first; `f` takes them until it returns true
    /// (the reply is full).
    fn list(
        &self,
        ino: Ino,
        off: u64,
        mut f: impl FnMut(Ino, u64, Kind, &[u8]) -> bool,
    ) -> Result<(), Error> {
        let l = self.listing(ino)?;
        if off < dirlist::DOT && f(ino, dirlist::DOT, Kind::Dir, b".") {
            return Ok(());
        }
        if off < dirlist::DOTDOT {
            let parent = self.fs.lookup(ino, b"..")?.ino;
            if f(parent, dirlist::DOTDOT, Kind::Dir, b"..") {
                return Ok(());
            }
        }
        for e in l.after(off) {
            if f(e.ino, e.off, e.kind, &e.name) {
                break;
            }
        }
        Ok(())
    }

    /// The entries of `dirs` changed: forget their listings.
    fn changed(&self, dirs: &[INodeNo]) {
        for d in dirs {
            self.listings.changed(d.0);
        }
    }
}

impl Filesystem for ZlogFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each capability is best effort: an older kernel lacks some.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_ASYNC_DIO,
            // The kernel enforces POSIX ACLs (stored as xattrs) and leaves
            // the umask to us, so that a directory's default ACL can
            // replace it (the fs layer does both).
            InitFlags::FUSE_POSIX_ACL,
            InitFlags::FUSE_DONT_MASK,
        ] {
            let _ = config.add_capabilities(cap);
        }
        self.no_opendir = config.capabilities().contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        Ok(())
    }

    fn destroy(&mut self) {
        self.workers.stop();
        if let Err(e) = self.fs.sync() {
            eprintln!("zlogfs: sync at unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name.as_bytes()) {
            Err(e) if e.errno() == libc::ENOENT && !self.opts.negative_timeout.is_zero() => {
                // A node id of 0 is a negative entry the kernel may cache.
                let mut a = file_attr(&Attr {
                    ino: 0,
                    kind: Kind::File,
                    mode: 0,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    size: 0,
                    blocks: 0,
                    atime: Time::default(),
                    mtime: Time::default(),
                    ctime: Time::default(),
                    btime: Time::default(),
                    blksize: 4096,
                });
                a.ino = INodeNo(0);
                reply.entry(&self.opts.negative_timeout, &a, Generation(0));
            }
            r => self.entry(r, reply),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(self.fs.getattr(ino.0), reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_or_now(atime),
            mtime: time_or_now(mtime),
            ctime: None,
            btime: None,
        };
        self.attr(self.fs.setattr(ino.0, &a), reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.make(req, parent.0, name, mode, umask, u64::from(rdev));
        self.changed(&[parent]);
        self.entry(r, reply);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let r = self.make(req, parent.0, name, libc::S_IFDIR | (mode & 0o7777), umask, 0);
        self.changed(&[parent]);
        self.entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.fs.unlink(parent.0, name.as_bytes());
        self.changed(&[parent]);
        empty(r, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.fs.rmdir(parent.0, name.as_bytes());
        self.changed(&[parent]);
        empty(r, reply);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let r = self.owner(req, parent.0, libc::S_IFLNK).and_then(|(uid, gid, _)| {
            self.fs.symlink(parent.0, link_name.as_bytes(), target.as_os_str().as_bytes(), uid, gid)
        });
        self.changed(&[parent]);
        self.entry(r, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.fs.rename(parent.0, name.as_bytes(), newparent.0, newname.as_bytes(), flags.bits());
        self.changed(&[parent, newparent]);
        empty(r, reply);
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let r = self.fs.link(ino.0, newparent.0, newname.as_bytes());
        self.changed(&[newparent]);
        self.entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Every change passes through this mount, so the kernel's page
        // cache stays valid across opens.
        match self.fs.open_file(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), OPEN_FLAGS),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = Arc::clone(&self.fs);
        let serve = move || match fs.read(ino.0, offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        };
        if size as usize >= LARGE_IO {
            self.workers.run(serve);
        } else {
            serve();
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if data.len() >= LARGE_IO {
            // The request's buffer is the reader's: a worker needs a copy.
            let fs = Arc::clone(&self.fs);
            let data = data.to_vec();
            self.workers.run(move || match fs.write(ino.0, offset, &data) {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(errno(e)),
            });
            return;
        }
        match self.fs.write(ino.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.fs.release_file(ino.0), reply);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let fs = Arc::clone(&self.fs);
        self.workers.run(move || empty(fs.fsync(ino.0, datasync), reply));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Offsets need no per-handle state (see dirlist): where the kernel
        // allows, it is told so once and then opens directories itself,
        // caching their listings (FOPEN_CACHE_DIR is its default then).
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.getattr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR)
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let r = self.list(ino.0, offset, |child, off, kind, name| {
            reply.add(INodeNo(child), off, file_type(kind), OsStr::from_bytes(name))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.opts.entry_timeout;
        let r = self.list(ino.0, offset, |child, off, _, name| {
            // An entry removed since it was listed is left out.
            let Ok(a) = self.fs.getattr(child) else { return false };
            reply.add(INodeNo(child), off, OsStr::from_bytes(name), &ttl, &file_attr(&a), Generation(0))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let fs = Arc::clone(&self.fs);
        self.workers.run(move || empty(fs.fsync(ino.0, datasync), reply));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        empty(self.fs.setxattr(ino.0, name.as_bytes(), value, flags as u32), reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.getxattr(ino.0, name.as_bytes()) {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut v = Vec::new();
                for n in names {
                    v.extend_from_slice(&n);
                    v.push(0);
                }
                xattr_reply(&v, size, reply);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.fs.removexattr(ino.0, name.as_bytes()), reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions (default_permissions); this only
        // says whether the inode exists.
        empty(self.fs.getattr(ino.0).map(|_| ()), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self
            .make(req, parent.0, name, libc::S_IFREG | (mode & 0o7777), umask, 0)
            .and_then(|a| self.fs.open_file(a.ino));
        self.changed(&[parent]);
        match r {
            Ok(a) => reply.created(
                &self.opts.entry_timeout,
                &file_attr(&a),
                Generation(0),
                FileHandle(0),
                OPEN_FLAGS,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let fs = Arc::clone(&self.fs);
        self.workers.run(move || empty(fs.fallocate(ino.0, mode as u32, offset, length), reply));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else { return reply.error(Errno::ENXIO) };
        match self.fs.lseek(ino.0, off, data) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The reply counts bytes in 32 bits: copy at most 1 GiB per call
        // (callers loop on short copies).
        let len = len.min(1 << 30);
        let fs = Arc::clone(&self.fs);
        self.workers.run(move || match fs.copy_file_range(ino_in.0, offset_in, ino_out.0, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        });
    }
}

fn xattr_reply(v: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(v);
    }
}

/// Ends a mount from another thread (a signal handler's).
pub enum Unmounter {
    /// Mounted by this process with mount(2): umount2 with MNT_DETACH.
    Direct(std::ffi::CString),
    /// Mounted through fusermount3.
    Fusermount(fuser::SessionUnmounter),
}

impl Unmounter {
    /// Unmount; the session's loop then ends.
    pub fn unmount(&mut self) -> io::Result<()> {
        match self {
            Unmounter::Direct(dir) => {
                // A plain unmount; when files are still open, a lazy one
                // (the session ends when the last of them is closed).
                for flags in [0, libc::MNT_DETACH] {
                    // SAFETY: `dir` is a valid NUL-terminated path that
                    // outlives the call; umount2 reads nothing else of ours.
                    if unsafe { libc::umount2(dir.as_ptr(), flags) } == 0 {
                        return Ok(());
                    }
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EBUSY) {
                        return Err(e);
                    }
                }
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            }
            Unmounter::Fusermount(u) => u.unmount(),
        }
    }
}

fn cstring(what: &str, b: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(b)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} contains NUL")))
}

/// Mount `fs` on `dir`: the kernel mount is in place when this returns;
/// [`Session::run`] serves it until it is unmounted (by `fusermount3 -u`,
/// `umount`, or the [`Unmounter`]).
///
/// As root the mount is made here with mount(2), as type `fuse.zlogfs` with
/// the image as its source, so that /proc/mounts names both and
/// `mount -o remount,ro` works; other users mount through fusermount3.
pub fn mount(fs: Arc<Fs>, dir: &Path, opts: &MountOptions) -> io::Result<(Session<ZlogFuse>, Unmounter)> {
    let mut cfg = Config::default();
    cfg.acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    // One thread reads every request (see the module's doc).
    cfg.n_threads = Some(1);
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        cfg.mount_options = vec![
            MountOption::FSName(opts.fsname.clone()),
            MountOption::Subtype("zlogfs".into()),
            MountOption::DefaultPermissions,
            if opts.read_only { MountOption::RO } else { MountOption::RW },
        ];
        let mut s = Session::new(ZlogFuse::new(fs, opts.clone()), dir, &cfg)?;
        let u = Unmounter::Fusermount(s.unmount_callable());
        return Ok((s, u));
    }
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions",
        std::os::fd::AsRawFd::as_raw_fd(&dev)
    );
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let source = cstring("image path", opts.fsname.as_bytes())?;
    let target = cstring("mount point", dir.as_os_str().as_bytes())?;
    let data = cstring("options", data.as_bytes())?;
    // No MS_NOSUID or MS_NODEV: root mounts behave as a disk file system.
    // atime is the file system's own policy (-o noatime, relatime).
    let mut flags: libc::c_ulong = 0;
    if opts.read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call; the kernel copies them and keeps none.
    let rc = unsafe {
        libc::mount(source.as_ptr(), target.as_ptr(), c"fuse.zlogfs".as_ptr(), flags, data.as_ptr().cast())
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let session = Session::from_fd(ZlogFuse::new(fs, opts.clone()), dev.into(), cfg.acl, cfg);
    match session {
        Ok(s) => Ok((s, Unmounter::Direct(target))),
        Err(e) => {
            // SAFETY: as for umount2 above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;

    #[test]
    fn workers_run_jobs_beside_the_caller_and_stop_after_the_queued_ones() {
        let w = Workers::new(2);
        let caller = std::thread::current().id();
        // A job that blocks does not hold up the next one (two workers).
        let (release_tx, release_rx) = channel::<()>();
        let (done_tx, done_rx) = channel();
        let d = done_tx.clone();
        w.run(move || {
            release_rx.recv().unwrap();
            d.send("blocked").unwrap();
        });
        let d = done_tx.clone();
        w.run(move || {
            d.send(if std::thread::current().id() == caller { "inline" } else { "worker" }).unwrap()
        });
        assert_eq!(done_rx.recv().unwrap(), "worker");
        release_tx.send(()).unwrap();
        assert_eq!(done_rx.recv().unwrap(), "blocked");

        // stop() waits for every queued job.
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            let c = Arc::clone(&count);
            w.run(move || {
                std::thread::sleep(Duration::from_micros(100));
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
        w.stop();
        assert_eq!(count.load(Ordering::SeqCst), 100);

        // After stop, a job runs on the caller's thread.
        w.run(move || {
            done_tx.send(if std::thread::current().id() == caller { "inline" } else { "worker" }).unwrap()
        });
        assert_eq!(done_rx.recv().unwrap(), "inline");
    }
}
