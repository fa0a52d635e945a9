//! `zlogfs import DIR IMAGE`: bulk load a directory tree without a mount.
//!
//! The tree is walked first (metadata only), then loaded in name order,
//! depth first, so that inode numbers, and so the packing of small files,
//! follow the tree. File contents of each batch are read by all cores in
//! parallel; compression runs in parallel at each commit. Modes, owners,
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
use std::path::Path;

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::Whence;
use rayon::prelude::*;

use super::{Error, Result};
use crate::fs::{self, Fs, Ino, SetAttr, Time, ROOT};

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

/// An entry of the source tree, as listed.
struct Item {
    /// Index of the parent directory's item (None: the root).
    parent: Option<usize>,
    name: Vec<u8>,
    meta: Metadata,
}

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

/// The path of item `k` in the source, for messages (it may be longer
/// than PATH_MAX: it is never opened).
fn path_of(root: &Path, items: &[Item], k: usize) -> String {
    let mut names = Vec::new();
    let mut cur = Some(k);
    while let Some(i) = cur {
        if items[i].parent.is_some() {
            names.push(String::from_utf8_lossy(&items[i].name).into_owned());
        }
        cur = items[i].parent;
    }
    names.reverse();
    let mut p = root.display().to_string();
    for n in names {
        p.push('/');
        p.push_str(&n);
    }
    p
}

/// List the tree under `root` (depth first, children in name order: each
/// directory's subtree follows it). Entries that cannot be looked at are
/// skipped into `rep`.
fn list(root: &Path, rep: &mut ImportReport) -> Result<(Vec<Item>, File)> {
    let dir = File::open(root).map_err(|e| Error::host(format!("opening {}", root.display()), e))?;
    let meta = dir.metadata().map_err(|e| Error::host(format!("reading {}", root.display()), e))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!("{} is not a directory", root.display())));
    }
    let mut items = vec![Item { parent: None, name: vec![], meta }];
    let first = dir.try_clone().map_err(|e| Error::host(format!("opening {}", root.display()), e))?;
    visit(root, &mut items, 0, first, rep)?;
    Ok((items, dir))
}

fn visit(root: &Path, items: &mut Vec<Item>, d: usize, dir: File, rep: &mut ImportReport) -> Result<()> {
    let names = match read_names(&dir) {
        Ok(n) => n,
        Err(e) => {
            rep.skipped.push((path_of(root, items, d), format!("listing: {e}")));
            return Ok(());
        }
    };
    for name in names {
        let meta = match open_in(&dir, &name, OFlag::O_PATH).and_then(|f| f.metadata()) {
            Ok(m) => m,
            Err(e) => {
                let p = format!("{}/{}", path_of(root, items, d), String::from_utf8_lossy(&name));
                rep.skipped.push((p, e.to_string()));
                continue;
            }
        };
        if meta.is_dir() {
            match open_in(&dir, &name, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
                Ok(sub) => {
                    items.push(Item { parent: Some(d), name, meta });
                    visit(root, items, items.len() - 1, sub, rep)?;
                }
                Err(e) => {
                    let p = format!("{}/{}", path_of(root, items, d), String::from_utf8_lossy(&name));
                    rep.skipped.push((p, e.to_string()));
                }
            }
        } else {
            items.push(Item { parent: Some(d), name, meta });
        }
    }
    Ok(())
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

/// Read what the image needs of item `k` from the source: a file opened,
/// a symlink's target, xattrs. `stack` holds the open directories of the
/// current path (the order of the items keeps it a path); a directory is
/// opened and pushed.
fn read_host(items: &[Item], k: usize, stack: &mut Vec<(usize, File)>) -> std::io::Result<Host> {
    let it = &items[k];
    let parent = it.parent.expect("only the root has none");
    while stack.last().is_some_and(|(d, _)| *d != parent) {
        stack.pop();
    }
    let Some((_, dir)) = stack.last() else {
        return Err(std::io::Error::other("its directory is not open"));
    };
    let ft = it.meta.file_type();
    let mut h = Host::default();
    if ft.is_dir() {
        let sub = open_in(dir, &it.name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        h.xattrs = xattrs_of_file(&sub)?;
        stack.push((k, sub));
    } else if ft.is_file() {
        let f = open_in(dir, &it.name, OFlag::O_RDONLY)?;
        h.xattrs = xattrs_of_file(&f)?;
        h.file = Some(f);
    } else {
        if ft.is_symlink() {
            let t = nix::fcntl::readlinkat(dir, OsStr::from_bytes(&it.name)).map_err(nix_io)?;
            h.target = Some(t.as_bytes().to_vec());
        }
        h.xattrs = xattrs_of_path(dir, &it.name)?;
    }
    Ok(h)
}

/// Import the tree under `src` into the root of `fs`. `progress` is told
/// the bytes of each file loaded.
pub fn import(fs: &Fs, src: &Path, progress: &dyn Fn(u64, u64)) -> Result<ImportReport> {
    raise_open_file_limit();
    let mut rep = ImportReport::default();
    let (items, root_dir) = list(src, &mut rep)?;
    let total: u64 = items.iter().filter(|i| i.meta.is_file()).map(|i| i.meta.len()).sum();
    let mut inos: Vec<Option<Ino>> = vec![None; items.len()];
    inos[0] = Some(ROOT);
    // Items left out, and so their subtrees.
    let mut gone = vec![false; items.len()];
    let mut links: HashMap<(u64, u64), Ino> = HashMap::new();
    let mut stack: Vec<(usize, File)> = Vec::new();
    let root_xattrs =
        xattrs_of_file(&root_dir).map_err(|e| Error::host(format!("reading {}", src.display()), e))?;
    stack.push((0, root_dir));
    let mut done = 0u64;
    let mut i = 1;
    while i < items.len() {
        // A batch: up to 512 entries (each file is held open until it is
        // loaded) or 64 MiB of file data.
        let mut j = i;
        let mut bytes = 0u64;
        while j < items.len() && j - i < 512 && bytes < 64 << 20 {
            if items[j].meta.is_file() {
                bytes += items[j].meta.len();
            }
            j += 1;
        }
        let mut host: Vec<Option<Host>> = Vec::with_capacity(j - i);
        for k in i..j {
            // Under a directory left out: left out with it (reported once).
            if gone[items[k].parent.expect("only the root has none")] {
                gone[k] = true;
                host.push(None);
                continue;
            }
            match read_host(&items, k, &mut stack) {
                Ok(h) => host.push(Some(h)),
                Err(e) => {
                    rep.skipped.push((path_of(src, &items, k), e.to_string()));
                    gone[k] = true;
                    host.push(None);
                }
            }
        }
        // File contents, on all cores.
        host.par_iter_mut().zip(&items[i..j]).for_each(|(h, it)| {
            let Some(h) = h.as_mut() else { return };
            if let (Some(f), true) = (&h.file, it.meta.len() <= 16 << 20) {
                match read_data(f, it.meta.len()) {
                    Ok(d) => h.data = Some(d),
                    Err(e) => h.error = Some(format!("reading: {e}")),
                }
            }
        });
        for (k, h) in (i..j).zip(host) {
            let Some(h) = h else { continue };
            let Some(parent) = inos[items[k].parent.expect("only the root has none")] else {
                // Its directory could not be made: reported there.
                continue;
            };
            match load(fs, &items, k, parent, h, &mut links, &mut rep) {
                Ok(Some(ino)) => inos[k] = Some(ino),
                Ok(None) => {}
                Err(Skip(why)) => rep.skipped.push((path_of(src, &items, k), why)),
                Err(Fatal(e)) => return Err(in_image(e, &image_path(&items, k), &path_of(src, &items, k))),
            }
            if items[k].meta.is_file() {
                done += items[k].meta.len();
                progress(done, total);
            }
        }
        i = j;
    }
    // Directories last, deepest first: adding entries changed their times.
    let root_meta = &items[0].meta;
    fs.setattr(
        ROOT,
        &SetAttr {
            mode: Some(root_meta.mode()),
            uid: Some(root_meta.uid()),
            gid: Some(root_meta.gid()),
            ..SetAttr::default()
        },
    )?;
    rep.xattrs +=
        set_xattrs(fs, ROOT, &root_xattrs).map_err(|e| in_image(e, "/", &src.display().to_string()))?;
    for k in (0..items.len()).rev() {
        if let (true, Some(ino)) = (items[k].meta.is_dir(), inos[k]) {
            set_times(fs, ino, &items[k].meta)?;
        }
    }
    Ok(rep)
}

/// The path of item `k` in the image.
fn image_path(items: &[Item], k: usize) -> String {
    path_of(Path::new(""), items, k)
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

/// Make item `k` in directory `parent` of the image from what was read of
/// it; its inode (None: an extra name of a file loaded already).
fn load(
    fs: &Fs,
    items: &[Item],
    k: usize,
    parent: Ino,
    h: Host,
    links: &mut HashMap<(u64, u64), Ino>,
    rep: &mut ImportReport,
) -> std::result::Result<Option<Ino>, LoadError> {
    let it = &items[k];
    let m = &it.meta;
    let ft = m.file_type();
    if let Some(e) = h.error {
        return Err(Skip(e));
    }
    if !ft.is_dir() && m.nlink() > 1 {
        if let Some(&target) = links.get(&(m.dev(), m.ino())) {
            fs.link(target, parent, &it.name)?;
            rep.hardlinks += 1;
            return Ok(Some(target));
        }
    }
    let attr = if ft.is_dir() {
        rep.dirs += 1;
        fs.mkdir(parent, &it.name, m.mode(), m.uid(), m.gid())?
    } else if ft.is_symlink() {
        rep.symlinks += 1;
        let t = h.target.unwrap_or_default();
        fs.symlink(parent, &it.name, &t, m.uid(), m.gid())?
    } else if ft.is_file() {
        rep.files += 1;
        fs.mknod(parent, &it.name, m.mode(), m.uid(), m.gid(), 0)?
    } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
        rep.specials += 1;
        fs.mknod(parent, &it.name, m.mode(), m.uid(), m.gid(), m.rdev())?
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
                    fs.unlink(parent, &it.name)?;
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
    Ok(Some(ino))
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
        if nb == crate::fs::XATTR_PHYSICAL {
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
