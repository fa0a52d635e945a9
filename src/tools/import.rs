//! `zlogfs import DIR IMAGE`: bulk load a directory tree without a mount.
//!
//! The tree is walked once for the bytes it holds (for progress), then
//! walked again and loaded as it is walked, depth first in name order, so
//! that inode numbers, and so the packing of small files, follow the tree.
//! The walk holds the directories of the current path, never the whole
//! tree, so memory does not grow with the tree. File contents of each
//! batch are read by all cores in parallel; compression runs in parallel
//! at each commit. Modes, owners,
//! times, xattrs, hard links, symlinks, special files and holes are kept.
//!
//! The source is reached through directory descriptors (`openat` and
//! friends), never by whole paths, so that a tree deeper than PATH_MAX
//! imports as any other (tar and cp do the same). An entry that cannot be
//! read (gone since it was listed, unreadable) is skipped with a warning
//! and listed in the report, as tar and rsync do; the caller exits non-zero
//! when any was.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};
use nix::unistd::Whence;
use rayon::prelude::*;

use super::{Error, Result};
use zlogfs_fs::{self as fs, Fs, Ino, SetAttr, Time, ROOT};

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Regular files created.
    pub files: u64,
    /// Directories created.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Fifos, sockets and device nodes.
    pub specials: u64,
    /// Extra names of hard-linked files.
    pub hardlinks: u64,
    /// Bytes of file data read (holes excluded).
    pub bytes: u64,
    /// Xattrs copied.
    pub xattrs: u64,
    /// Entries left out, with why: (path in the source, error). A
    /// directory left out takes its subtree with it.
    pub skipped: Vec<(String, String)>,
}

/// Data ranges of a file: (offset, bytes).
type Ranges = Vec<(u64, Vec<u8>)>;

/// What is read of an entry from the source before it is made in the
/// image.
#[derive(Default)]
struct Host {
    /// A regular file, open for reading.
    file: Option<File>,
    /// Its data, when read in parallel with the batch's other files.
    data: Option<Ranges>,
    /// A symlink's target.
    target: Option<Vec<u8>>,
    xattrs: Vec<(OsString, Vec<u8>)>,
    /// Why its data could not be read.
    error: Option<String>,
}

fn nix_io(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// Open `name` in directory `dir`, not following a symlink there.
fn open_in(dir: impl AsFd, name: &[u8], flags: OFlag) -> std::io::Result<File> {
    let fd: OwnedFd =
        openat(dir, OsStr::from_bytes(name), flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(nix_io)?;
    Ok(File::from(fd))
}

/// A directory of the source, while its subtree is loaded: where it is
/// and, once made, its inode in the image.
struct Dir {
    /// Its path under the source root ("" for the root), for messages.
    path: Vec<u8>,
    /// Its inode in the image; unset while it is not made, and forever
    /// if it could not be (its entries are then left out with it).
    ino: OnceLock<Ino>,
}

impl Dir {
    /// The path of `name` in this directory, under `root`.
    fn path_of(&self, root: &Path, name: &[u8]) -> String {
        let mut p = root.display().to_string();
        for part in [&self.path[..], name] {
            if !part.is_empty() {
                p.push('/');
                p.push_str(&String::from_utf8_lossy(part));
            }
        }
        p
    }
}

/// A step of the walk, in load order.
enum Step {
    /// An entry in directory `dir`, with what was read of it from the
    /// source; for a directory, `own` is the Dir its entries will name.
    Entry { dir: Arc<Dir>, name: Vec<u8>, meta: Metadata, own: Option<Arc<Dir>>, host: Host },
    /// Every entry of `dir` has been walked: its times (from `meta`) can
    /// be set once the steps before this one are loaded.
    Leave { dir: Arc<Dir>, meta: Metadata },
}

/// A directory being walked: its names still to visit.
struct Frame {
    dir: Arc<Dir>,
    file: File,
    meta: Metadata,
    names: std::vec::IntoIter<Vec<u8>>,
}

/// The walk of the source tree, depth first, each directory's names in
/// order, so that inode numbers (and so the packing of small files)
/// follow the tree. It holds the names of the directories on the current
/// path only, never the whole tree. Entries that cannot be looked at are
/// skipped into the report.
struct Walk {
    root: PathBuf,
    frames: Vec<Frame>,
}

impl Walk {
    /// A walk of `root` (already checked to be a directory, opened as
    /// `file`); the root's Dir is made already, as ROOT.
    fn new(root: &Path, file: File, meta: Metadata, rep: &mut ImportReport) -> Walk {
        let dir = Arc::new(Dir { path: Vec::new(), ino: OnceLock::from(ROOT) });
        let names = names_or_skip(&file, &dir, root, rep);
        Walk { root: root.to_path_buf(), frames: vec![Frame { dir, file, meta, names }] }
    }

    /// The next step (None at the end). An entry that cannot be read is
    /// reported and not returned; a directory that cannot be opened is
    /// left out with its subtree.
    fn next(&mut self, rep: &mut ImportReport) -> Option<Step> {
        loop {
            let top = self.frames.last_mut()?;
            let Some(name) = top.names.next() else {
                let f = self.frames.pop().expect("a frame is on top");
                return Some(Step::Leave { dir: f.dir, meta: f.meta });
            };
            let dir = top.dir.clone();
            match read_host(&top.file, &name) {
                Ok((meta, host, sub)) => {
                    let own = sub.map(|file| {
                        let mut path = dir.path.clone();
                        if !path.is_empty() {
                            path.push(b'/');
                        }
                        path.extend_from_slice(&name);
                        let own = Arc::new(Dir { path, ino: OnceLock::new() });
                        let names = names_or_skip(&file, &own, &self.root, rep);
                        self.frames.push(Frame { dir: own.clone(), file, meta: meta.clone(), names });
                        own
                    });
                    return Some(Step::Entry { dir, name, meta, own, host });
                }
                Err(e) => rep.skipped.push((dir.path_of(&self.root, &name), e.to_string())),
            }
        }
    }
}

/// The names of directory `file` (at `dir`), sorted; none, reported, when
/// it cannot be listed.
fn names_or_skip(file: &File, dir: &Dir, root: &Path, rep: &mut ImportReport) -> std::vec::IntoIter<Vec<u8>> {
    match read_names(file) {
        Ok(n) => n.into_iter(),
        Err(e) => {
            rep.skipped.push((dir.path_of(root, b""), format!("listing: {e}")));
            Vec::new().into_iter()
        }
    }
}

/// The bytes of regular files under `dir`, for the progress bar: a walk
/// of metadata only, ahead of the load. What cannot be read is left out
/// here and reported by the load's walk.
fn file_bytes(dir: &File) -> u64 {
    let Ok(names) = read_names(dir) else { return 0 };
    let mut total = 0;
    for name in names {
        let Ok(st) = fstatat(dir, OsStr::from_bytes(&name), AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => total += st.st_size as u64,
            libc::S_IFDIR => {
                if let Ok(sub) = open_in(dir, &name, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
                    total += file_bytes(&sub);
                }
            }
            _ => {}
        }
    }
    total
}

/// The names in directory `dir`, sorted, without "." and "..".
fn read_names(dir: &File) -> std::io::Result<Vec<Vec<u8>>> {
    let fd = dir.try_clone()?;
    let mut d = nix::dir::Dir::from_fd(OwnedFd::from(fd)).map_err(nix_io)?;
    let mut names = Vec::new();
    for e in d.iter() {
        let e = e.map_err(nix_io)?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    names.sort();
    Ok(names)
}

/// The data ranges of a file: (offset, bytes), holes left out.
fn read_data(f: &File, size: u64) -> std::io::Result<Ranges> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match seek(f, pos, Whence::SeekData) {
            Some(s) => s,
            None => break,
        };
        let end = seek(f, start, Whence::SeekHole).unwrap_or(size).min(size);
        if end <= start {
            break;
        }
        let mut buf = vec![0u8; (end - start) as usize];
        f.read_exact_at(&mut buf, start)?;
        out.push((start, buf));
        pos = end;
    }
    Ok(out)
}

/// lseek with SEEK_DATA or SEEK_HOLE; None at ENXIO (no more data).
fn seek(f: &File, off: u64, whence: Whence) -> Option<u64> {
    let off = i64::try_from(off).ok()?;
    nix::unistd::lseek(f, off, whence).ok().map(|r| r as u64)
}

fn time(sec: i64, nsec: i64) -> Time {
    Time { sec, nsec: nsec.clamp(0, 999_999_999) as u32 }
}

/// The xattrs of an open file or directory.
fn xattrs_of_file(f: &File) -> std::io::Result<Vec<(OsString, Vec<u8>)>> {
    use xattr::FileExt as _;
    let names = match f.list_xattr() {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for n in names {
        if let Some(v) = f.get_xattr(&n)? {
            out.push((n, v));
        }
    }
    Ok(out)
}

/// The xattrs of something that cannot be opened for reading (a symlink,
/// a device node), through /proc/self/fd of an O_PATH descriptor of it:
/// that path leads to the entry itself, symlink or not.
fn xattrs_of_path(dir: &File, name: &[u8]) -> std::io::Result<Vec<(OsString, Vec<u8>)>> {
    let f = open_in(dir, name, OFlag::O_PATH)?;
    let p = format!("/proc/self/fd/{}", f.as_raw_fd());
    let names = match xattr::list_deref(&p) {
        Ok(n) => n,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for n in names {
        if let Some(v) = xattr::get_deref(&p, &n)? {
            out.push((n, v));
        }
    }
    Ok(out)
}

/// Read what the image needs of entry `name` of directory `dir` in the
/// source: its metadata, a file opened, a symlink's target, xattrs; for a
/// directory, the directory opened for the walk.
fn read_host(dir: &File, name: &[u8]) -> std::io::Result<(Metadata, Host, Option<File>)> {
    let meta = open_in(dir, name, OFlag::O_PATH)?.metadata()?;
    let ft = meta.file_type();
    let mut h = Host::default();
    let mut sub = None;
    if ft.is_dir() {
        let d = open_in(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        h.xattrs = xattrs_of_file(&d)?;
        sub = Some(d);
    } else if ft.is_file() {
        let f = open_in(dir, name, OFlag::O_RDONLY)?;
        h.xattrs = xattrs_of_file(&f)?;
        h.file = Some(f);
    } else {
        if ft.is_symlink() {
            let t = nix::fcntl::readlinkat(dir, OsStr::from_bytes(name)).map_err(nix_io)?;
            h.target = Some(t.as_bytes().to_vec());
        }
        h.xattrs = xattrs_of_path(dir, name)?;
    }
    Ok((meta, h, sub))
}

/// Import the tree under `src` into the root of `fs`. `progress` is told
/// the bytes of files loaded so far and in all.
pub fn import(fs: &Fs, src: &Path, progress: &dyn Fn(u64, u64)) -> Result<ImportReport> {
    raise_open_file_limit();
    let mut rep = ImportReport::default();
    let root = File::open(src).map_err(|e| Error::host(format!("opening {}", src.display()), e))?;
    let meta = root.metadata().map_err(|e| Error::host(format!("reading {}", src.display()), e))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!("{} is not a directory", src.display())));
    }
    let total = file_bytes(&root);
    let root_xattrs =
        xattrs_of_file(&root).map_err(|e| Error::host(format!("reading {}", src.display()), e))?;
    let mut walk = Walk::new(src, root, meta, &mut rep);
    let mut links: HashMap<(u64, u64), Ino> = HashMap::new();
    let mut done = 0u64;
    loop {
        // A batch: up to 512 steps (each file is held open until it is
        // loaded) or 64 MiB of file data.
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        while batch.len() < 512 && bytes < 64 << 20 {
            let Some(step) = walk.next(&mut rep) else { break };
            if let Step::Entry { meta, .. } = &step {
                if meta.is_file() {
                    bytes += meta.len();
                }
            }
            batch.push(step);
        }
        if batch.is_empty() {
            break;
        }
        // File contents, on all cores.
        batch.par_iter_mut().for_each(|step| {
            let Step::Entry { meta, host, .. } = step else { return };
            if let (Some(f), true) = (&host.file, meta.len() <= 16 << 20) {
                match read_data(f, meta.len()) {
                    Ok(d) => host.data = Some(d),
                    Err(e) => host.error = Some(format!("reading: {e}")),
                }
            }
        });
        for step in batch {
            let (dir, name, meta, own, host) = match step {
                Step::Leave { dir, meta } => {
                    rep.xattrs += leave(fs, &dir, &meta, &root_xattrs, src)?;
                    continue;
                }
                Step::Entry { dir, name, meta, own, host } => (dir, name, meta, own, host),
            };
            // Its directory could not be made: reported there.
            let Some(&parent) = dir.ino.get() else { continue };
            match load(fs, &name, &meta, parent, host, &mut links, &mut rep) {
                Ok(ino) => {
                    if let Some(own) = own {
                        // Set once: each directory is loaded once.
                        let _ = own.ino.set(ino);
                    }
                }
                Err(Skip(why)) => rep.skipped.push((dir.path_of(src, &name), why)),
                Err(Fatal(e)) => {
                    return Err(in_image(e, &dir.path_of(Path::new(""), &name), &dir.path_of(src, &name)))
                }
            }
            if meta.is_file() {
                done += meta.len();
                progress(done, total);
            }
        }
    }
    Ok(rep)
}

/// Every entry of `dir` is loaded: set its times (adding entries changed
/// them), and for the root its owner, mode and xattrs too; the xattrs set.
fn leave(
    fs: &Fs,
    dir: &Dir,
    meta: &Metadata,
    root_xattrs: &[(OsString, Vec<u8>)],
    src: &Path,
) -> Result<u64> {
    let Some(&ino) = dir.ino.get() else { return Ok(0) };
    let mut xattrs = 0;
    if ino == ROOT {
        let attr = SetAttr {
            mode: Some(meta.mode()),
            uid: Some(meta.uid()),
            gid: Some(meta.gid()),
            ..SetAttr::default()
        };
        fs.setattr(ROOT, &attr)?;
        xattrs =
            set_xattrs(fs, ROOT, root_xattrs).map_err(|e| in_image(e, "/", &src.display().to_string()))?;
    }
    set_times(fs, ino, meta)?;
    Ok(xattrs)
}

/// An error of an entry's load: one that leaves the entry out, or one that
/// stops the import (the image said no: full, damaged).
enum LoadError {
    Skip(String),
    Fatal(Error),
}
use LoadError::{Fatal, Skip};

impl From<Error> for LoadError {
    fn from(e: Error) -> LoadError {
        Fatal(e)
    }
}

impl From<fs::Error> for LoadError {
    fn from(e: fs::Error) -> LoadError {
        Fatal(e.into())
    }
}

/// Make entry `name` (of metadata `m`) in directory `parent` of the image
/// from what was read of it; its inode (for an extra name of a file loaded
/// already, that file's).
fn load(
    fs: &Fs,
    name: &[u8],
    m: &Metadata,
    parent: Ino,
    h: Host,
    links: &mut HashMap<(u64, u64), Ino>,
    rep: &mut ImportReport,
) -> std::result::Result<Ino, LoadError> {
    let ft = m.file_type();
    if let Some(e) = h.error {
        return Err(Skip(e));
    }
    if !ft.is_dir() && m.nlink() > 1 {
        if let Some(&target) = links.get(&(m.dev(), m.ino())) {
            fs.link(target, parent, name)?;
            rep.hardlinks += 1;
            return Ok(target);
        }
    }
    let attr = if ft.is_dir() {
        rep.dirs += 1;
        fs.mkdir(parent, name, m.mode(), m.uid(), m.gid())?
    } else if ft.is_symlink() {
        rep.symlinks += 1;
        let t = h.target.unwrap_or_default();
        fs.symlink(parent, name, &t, m.uid(), m.gid())?
    } else if ft.is_file() {
        rep.files += 1;
        fs.mknod(parent, name, m.mode(), m.uid(), m.gid(), 0)?
    } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
        rep.specials += 1;
        fs.mknod(parent, name, m.mode(), m.uid(), m.gid(), m.rdev())?
    } else {
        return Err(Skip("unknown file type".into()));
    };
    let ino = attr.ino;
    if ft.is_file() {
        match (h.data, &h.file) {
            (Some(ranges), _) => {
                for (off, buf) in ranges {
                    fs.write(ino, off, &buf)?;
                    rep.bytes += buf.len() as u64;
                }
            }
            (None, Some(f)) => {
                if let Err(e) = stream(fs, ino, f, m.len(), rep) {
                    // Half a file is no copy of it: leave it out.
                    fs.unlink(parent, name)?;
                    rep.files -= 1;
                    return match e {
                        StreamError::Source(e) => Err(Skip(format!("reading: {e}"))),
                        StreamError::Image(e) => Err(Fatal(e.into())),
                    };
                }
            }
            (None, None) => {}
        }
        if m.len() > 0 {
            fs.setattr(ino, &SetAttr { size: Some(m.len()), ..SetAttr::default() })?;
        }
    }
    rep.xattrs += set_xattrs(fs, ino, &h.xattrs)?;
    if !ft.is_dir() {
        set_times(fs, ino, m)?;
    }
    if !ft.is_dir() && m.nlink() > 1 {
        links.insert((m.dev(), m.ino()), ino);
    }
    Ok(ino)
}

enum StreamError {
    Source(std::io::Error),
    Image(fs::Error),
}

/// Copy a large file's data ranges into `ino` a MiB at a time.
fn stream(
    fs: &Fs,
    ino: Ino,
    f: &File,
    size: u64,
    rep: &mut ImportReport,
) -> std::result::Result<(), StreamError> {
    let mut pos = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while pos < size {
        let Some(start) = seek(f, pos, Whence::SeekData) else { break };
        let end = seek(f, start, Whence::SeekHole).unwrap_or(size).min(size);
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            f.read_exact_at(&mut buf[..n], at).map_err(StreamError::Source)?;
            fs.write(ino, at, &buf[..n]).map_err(StreamError::Image)?;
            rep.bytes += n as u64;
            at += n as u64;
        }
        pos = end.max(start + 1);
    }
    Ok(())
}

/// An error of the image while loading `image_path` (from `host_path`),
/// said with both paths; a name that exists already is said plainly.
fn in_image(e: Error, image_path: &str, host_path: &str) -> Error {
    match e {
        Error::Image(fs::Error::Exists(_)) => Error::Image(fs::Error::Exists(format!(
            "{host_path}: {image_path} exists in the image already (import into an empty image)"
        ))),
        Error::Image(e) => Error::Image(e.map_msg(|msg| format!("{host_path} (to {image_path}): {msg}"))),
        e => e,
    }
}

fn set_times(fs: &Fs, ino: Ino, m: &Metadata) -> Result<()> {
    let btime = m.created().ok().map(Time::from_system);
    fs.setattr(
        ino,
        &SetAttr {
            mode: Some(m.mode()),
            atime: Some(Some(time(m.atime(), m.atime_nsec()))),
            mtime: Some(Some(time(m.mtime(), m.mtime_nsec()))),
            btime,
            ..SetAttr::default()
        },
    )?;
    Ok(())
}

fn set_xattrs(fs: &Fs, ino: Ino, xattrs: &[(OsString, Vec<u8>)]) -> Result<u64> {
    let mut n = 0;
    for (name, v) in xattrs {
        let nb = name.as_bytes();
        if nb == zlogfs_fs::XATTR_PHYSICAL {
            continue;
        }
        fs.setxattr(ino, nb, v, 0)?;
        n += 1;
    }
    Ok(n)
}

/// Each file of a batch is held open until it is loaded, and each
/// directory of the current path: raise the soft limit on open files to
/// the hard one, as far as 65536.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let want = hard.min(65536);
        if soft < want {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, want, hard);
        }
    }
}
