//! `zlogfs export IMAGE DIR`: write the tree of an image to a directory,
//! keeping modes, owners (when run as root), times, xattrs, hard links,
//! symlinks, special files and holes.
//!
//! The destination is reached through directory descriptors (`mkdirat`,
//! `openat` and friends), so a tree deeper than PATH_MAX exports whole.
//! Damage does not stop it: a chunk that fails its checksum is left as a
//! hole in its file and listed (path, byte range, why), a directory that
//! cannot be listed is listed, and everything else is copied; the caller
//! exits non-zero when anything was damaged.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmodat, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchownat, linkat, symlinkat, Gid, Uid};

use super::walk;
use super::{Error, Result};
use zlogfs_fs::{self as fs, Attr, DirEntry, Fs, Ino, Kind, ROOT};

/// What an export did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Regular files written.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Fifos, sockets and device nodes.
    pub specials: u64,
    /// Extra names of hard-linked files.
    pub hardlinks: u64,
    /// Bytes of file data written (holes excluded).
    pub bytes: u64,
    /// What could not be copied whole.
    pub damaged: Vec<Damage>,
}

/// Something of the image that could not be copied whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Its path in the image.
    pub path: String,
    /// The bytes of a file left as a hole, `[start, end)`; None: the
    /// entry (or a directory's listing) as a whole.
    pub range: Option<(u64, u64)>,
    /// Why.
    pub reason: String,
}

fn nix_err(what: String) -> impl FnOnce(nix::errno::Errno) -> Error {
    move |e| Error::host(what, std::io::Error::from_raw_os_error(e as i32))
}

fn name_of(e: &DirEntry) -> &OsStr {
    OsStr::from_bytes(&e.name)
}

/// Damage of the image (a checksum, a record that does not decode, a
/// read that failed), as opposed to an error of the destination.
fn is_damage(e: &fs::Error) -> bool {
    use zlogfs_engine::Error as E;
    matches!(e, fs::Error::Engine(E::Io { .. } | E::ChecksumMismatch { .. } | E::Corrupt { .. }))
}

struct Export<'a> {
    fs: &'a Fs,
    dst: &'a Path,
    is_root: bool,
    chunk: u64,
    rep: ExportReport,
    total: u64,
    done: u64,
    progress: &'a dyn Fn(u64, u64),
    /// Files with more names still to make: an O_PATH descriptor of the
    /// first copy (linked to through /proc/self/fd), and how many names
    /// are left.
    linked: HashMap<Ino, (File, u32)>,
}

/// Export the tree under `from` (an inode of `fs`, usually the root) to
/// `dst`, which must not exist or be empty. `progress(done, total)` gets
/// file bytes.
pub fn export(fs: &Fs, from: Ino, dst: &Path, progress: &dyn Fn(u64, u64)) -> Result<ExportReport> {
    match std::fs::read_dir(dst) {
        Ok(mut d) => {
            if d.next().is_some() {
                return Err(Error::Invalid(format!("{} is not empty", dst.display())));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dst)
                .map_err(|e| Error::host(format!("creating {}", dst.display()), e))?;
        }
        Err(e) => return Err(Error::host(format!("opening {}", dst.display()), e)),
    }
    let dir = File::open(dst).map_err(|e| Error::host(format!("opening {}", dst.display()), e))?;
    let mut total = 0u64;
    // A damaged listing is met (and reported) again below.
    let _ = walk(fs, from, b"", &mut |_, e| {
        if e.kind == Kind::File {
            total += fs.getattr(e.ino).map(|a| a.size).unwrap_or(0);
        }
        Ok(())
    });
    let mut x = Export {
        fs,
        dst,
        is_root: nix::unistd::geteuid().is_root(),
        chunk: u64::from(fs.config().chunk_size),
        rep: ExportReport::default(),
        total,
        done: 0,
        progress,
        linked: HashMap::new(),
    };
    x.dir(from, &dir, "")?;
    let a = fs.getattr(from)?;
    if from == ROOT {
        x.xattrs_fd(ROOT, &dir, "/")?;
    }
    // The destination's own mode and times (owner too, as root).
    x.apply_fd(&dir, &a, "")?;
    Ok(x.rep)
}

impl Export<'_> {
    fn host(&self, rel: &str) -> String {
        format!("{}{rel}", self.dst.display())
    }

    fn damaged(&mut self, path: &str, range: Option<(u64, u64)>, e: &fs::Error) {
        self.rep.damaged.push(Damage { path: path.to_string(), range, reason: e.to_string() });
    }

    /// The entries of directory `ino` (image path `rel`), each made in
    /// `dir`, and their subtrees.
    fn dir(&mut self, ino: Ino, dir: &File, rel: &str) -> Result<()> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = match self.fs.readdir(ino, after.as_deref(), 1024) {
                Ok(p) => p,
                Err(e) if is_damage(&e) => {
                    self.damaged(if rel.is_empty() { "/" } else { rel }, None, &e);
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            let Some(last) = page.last() else { return Ok(()) };
            after = Some(last.name.clone());
            for e in &page {
                let path = format!("{rel}/{}", String::from_utf8_lossy(&e.name));
                match self.entry(e, dir, &path) {
                    Err(Error::Image(err)) if is_damage(&err) => self.damaged(&path, None, &err),
                    r => r?,
                }
            }
        }
    }

    /// Make one entry of `dir`.
    fn entry(&mut self, e: &DirEntry, dir: &File, path: &str) -> Result<()> {
        let a = self.fs.getattr(e.ino)?;
        let name = name_of(e);
        let host = self.host(path);
        let made = |what: &str| format!("{what} {host}");
        if a.kind != Kind::Dir && a.nlink > 1 {
            if let Some((first, left)) = self.linked.get_mut(&e.ino) {
                let p = format!("/proc/self/fd/{}", first.as_raw_fd());
                linkat(AT_FDCWD, p.as_str(), dir, name, nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW)
                    .map_err(nix_err(made("linking")))?;
                *left -= 1;
                if *left == 0 {
                    self.linked.remove(&e.ino);
                }
                self.rep.hardlinks += 1;
                return Ok(());
            }
        }
        match a.kind {
            Kind::Dir => {
                mkdirat(dir, name, Mode::from_bits_truncate(0o700)).map_err(nix_err(made("creating")))?;
                let sub = open(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                    .map_err(nix_err(made("opening")))?;
                self.rep.dirs += 1;
                self.xattrs_fd(e.ino, &sub, path)?;
                self.dir(e.ino, &sub, path)?;
                // Its times after its entries, which changed them.
                self.apply_fd(&sub, &a, path)?;
            }
            Kind::File => {
                let f = open(dir, name, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL)
                    .map_err(nix_err(made("creating")))?;
                self.copy_data(e.ino, &a, &f, path)?;
                f.set_len(a.size).map_err(|err| Error::host(made("sizing"), err))?;
                self.rep.files += 1;
                self.done += a.size;
                (self.progress)(self.done, self.total);
                self.xattrs_fd(e.ino, &f, path)?;
                self.apply_fd(&f, &a, path)?;
            }
            Kind::Symlink => {
                let t = self.fs.readlink(e.ino)?;
                symlinkat(OsStr::from_bytes(&t), dir, name).map_err(nix_err(made("creating symlink")))?;
                self.rep.symlinks += 1;
                self.xattrs_path(e.ino, dir, name, path)?;
                self.apply_at(dir, name, &a, path)?;
            }
            Kind::Fifo | Kind::Socket | Kind::Char | Kind::Block => {
                let kind = SFlag::from_bits_truncate(a.mode & libc::S_IFMT);
                mknodat(dir, name, kind, Mode::from_bits_truncate(0o600), a.rdev as libc::dev_t)
                    .map_err(nix_err(made("creating")))?;
                self.rep.specials += 1;
                self.xattrs_path(e.ino, dir, name, path)?;
                self.apply_at(dir, name, &a, path)?;
            }
        }
        if a.kind != Kind::Dir && a.nlink > 1 {
            let first = open(dir, name, OFlag::O_PATH).map_err(nix_err(made("opening")))?;
            self.linked.insert(e.ino, (first, a.nlink - 1));
        }
        Ok(())
    }

    /// Copy a file's data ranges; a piece that cannot be read is left a
    /// hole and listed, chunk by chunk.
    fn copy_data(&mut self, ino: Ino, a: &Attr, f: &File, path: &str) -> Result<()> {
        let mut pos = 0u64;
        while pos < a.size {
            let start = match self.fs.lseek(ino, pos, true) {
                Ok(s) => s,
                Err(fs::Error::PastEnd(_)) => break,
                Err(e) => return Err(e.into()),
            };
            let end = self.fs.lseek(ino, start, false)?.min(a.size);
            let mut at = start;
            while at < end {
                let n = (end - at).min(1 << 20);
                match self.fs.read(ino, at, n as usize) {
                    Ok(buf) if buf.is_empty() => break,
                    Ok(buf) => {
                        f.write_all_at(&buf, at)
                            .map_err(|e| Error::host(format!("writing {}", self.host(path)), e))?;
                        self.rep.bytes += buf.len() as u64;
                        at += buf.len() as u64;
                    }
                    Err(e) if is_damage(&e) => {
                        self.salvage(ino, at, at + n, f, path)?;
                        at += n;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            pos = end.max(start + 1);
        }
        Ok(())
    }

    /// `[from, to)` of a file failed to read: copy it chunk by chunk,
    /// listing the chunks that fail.
    fn salvage(&mut self, ino: Ino, from: u64, to: u64, f: &File, path: &str) -> Result<()> {
        let mut at = from;
        while at < to {
            let next = ((at / self.chunk + 1) * self.chunk).min(to);
            match self.fs.read(ino, at, (next - at) as usize) {
                Ok(buf) => {
                    f.write_all_at(&buf, at)
                        .map_err(|e| Error::host(format!("writing {}", self.host(path)), e))?;
                    self.rep.bytes += buf.len() as u64;
                }
                Err(e) if is_damage(&e) => match self.rep.damaged.last_mut() {
                    // One entry for a run of damaged chunks of a file.
                    Some(d) if d.path == path && d.range.is_some_and(|r| r.1 == at) => {
                        d.range = d.range.map(|r| (r.0, next));
                    }
                    _ => self.damaged(path, Some((at, next)), &e),
                },
                Err(e) => return Err(e.into()),
            }
            at = next;
        }
        Ok(())
    }

    /// Copy xattrs onto an open file or directory.
    fn xattrs_fd(&mut self, ino: Ino, f: &File, path: &str) -> Result<()> {
        use xattr::FileExt as _;
        for name in self.fs.listxattr(ino)? {
            let v = self.fs.getxattr(ino, &name)?;
            let n = OsStr::from_bytes(&name);
            f.set_xattr(n, &v)
                .map_err(|e| Error::host(format!("setting xattr {n:?} on {}", self.host(path)), e))?;
        }
        Ok(())
    }

    /// Copy xattrs onto a symlink or special file, through /proc/self/fd
    /// of an O_PATH descriptor of it (which leads to it, symlink or not).
    fn xattrs_path(&mut self, ino: Ino, dir: &File, name: &OsStr, path: &str) -> Result<()> {
        let names = self.fs.listxattr(ino)?;
        if names.is_empty() {
            return Ok(());
        }
        let f = open(dir, name, OFlag::O_PATH).map_err(nix_err(format!("opening {}", self.host(path))))?;
        let p = format!("/proc/self/fd/{}", f.as_raw_fd());
        for n in names {
            let v = self.fs.getxattr(ino, &n)?;
            let n = OsStr::from_bytes(&n);
            xattr::set_deref(&p, n, &v)
                .map_err(|e| Error::host(format!("setting xattr {n:?} on {}", self.host(path)), e))?;
        }
        Ok(())
    }

    /// Owner, mode and times of an open file or directory.
    fn apply_fd(&self, f: &File, a: &Attr, path: &str) -> Result<()> {
        let what = |w: &str| format!("{w} of {}", self.host(path));
        match nix::unistd::fchown(f.as_fd(), Some(Uid::from_raw(a.uid)), Some(Gid::from_raw(a.gid))) {
            Ok(()) => {}
            Err(nix::errno::Errno::EPERM) if !self.is_root => {}
            Err(e) => return Err(nix_err(what("changing the owner"))(e)),
        }
        nix::sys::stat::fchmod(f.as_fd(), Mode::from_bits_truncate(a.mode & 0o7777))
            .map_err(nix_err(what("changing the mode")))?;
        nix::sys::stat::futimens(f.as_fd(), &ts(a.atime), &ts(a.mtime))
            .map_err(nix_err(what("setting the times")))
    }

    /// Owner, mode and times of a symlink or special file `name` of `dir`,
    /// without following it.
    fn apply_at(&self, dir: &File, name: &OsStr, a: &Attr, path: &str) -> Result<()> {
        let what = |w: &str| format!("{w} of {}", self.host(path));
        let nofollow = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
        match fchownat(dir, name, Some(Uid::from_raw(a.uid)), Some(Gid::from_raw(a.gid)), nofollow) {
            Ok(()) => {}
            Err(nix::errno::Errno::EPERM) if !self.is_root => {}
            Err(e) => return Err(nix_err(what("changing the owner"))(e)),
        }
        if a.kind != Kind::Symlink {
            fchmodat(dir, name, Mode::from_bits_truncate(a.mode & 0o7777), FchmodatFlags::FollowSymlink)
                .map_err(nix_err(what("changing the mode")))?;
        }
        utimensat(dir, name, &ts(a.atime), &ts(a.mtime), UtimensatFlags::NoFollowSymlink)
            .map_err(nix_err(what("setting the times")))
    }
}

fn ts(t: zlogfs_fs::Time) -> TimeSpec {
    TimeSpec::new(t.sec, i64::from(t.nsec))
}

/// Open `name` in `dir` without following a symlink there; files are
/// created with mode 0600 until their own mode is set.
fn open(dir: &File, name: &OsStr, flags: OFlag) -> nix::Result<File> {
    let fd =
        openat(dir, name, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::from_bits_truncate(0o600))?;
    Ok(File::from(fd))
}
