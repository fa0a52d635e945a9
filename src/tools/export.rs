//! `zlogfs export IMAGE DIR`: write the tree of an image to a directory,
//! keeping modes, owners (when run as root), times, xattrs, hard links,
//! symlinks, special files and holes.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use filetime::FileTime;

use super::io;
use super::walk;
use crate::fs::{Attr, Fs, Ino, Kind, ROOT};
use crate::{Error, Result};

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
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("{} contains NUL", p.display())))
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
            std::fs::create_dir_all(dst).map_err(io(format!("creating {}", dst.display())))?;
        }
        Err(e) => return Err(Error::io(format!("opening {}", dst.display()), e)),
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let is_root = unsafe { libc::geteuid() == 0 };
    let mut total = 0u64;
    walk(fs, from, b"", &mut |_, e| {
        if e.kind == Kind::File {
            total += fs.getattr(e.ino)?.size;
        }
        Ok(())
    })?;
    let mut rep = ExportReport::default();
    let mut linked: HashMap<Ino, PathBuf> = HashMap::new();
    let mut dirs: Vec<(PathBuf, Attr)> = vec![(dst.to_path_buf(), fs.getattr(from)?)];
    let mut done = 0u64;
    walk(fs, from, b"", &mut |rel, e| {
        let path = dst.join(std::ffi::OsStr::from_bytes(rel));
        let a = fs.getattr(e.ino)?;
        if a.kind != Kind::Dir && a.nlink > 1 {
            if let Some(first) = linked.get(&e.ino) {
                std::fs::hard_link(first, &path).map_err(io(format!("linking {}", path.display())))?;
                rep.hardlinks += 1;
                return Ok(());
            }
            linked.insert(e.ino, path.clone());
        }
        match a.kind {
            Kind::Dir => {
                std::fs::create_dir(&path).map_err(io(format!("creating {}", path.display())))?;
                rep.dirs += 1;
            }
            Kind::File => {
                let f = std::fs::File::create(&path).map_err(io(format!("creating {}", path.display())))?;
                let mut pos = 0u64;
                while pos < a.size {
                    let start = match fs.lseek(e.ino, pos, true) {
                        Ok(s) => s,
                        Err(Error::Posix { errno: libc::ENXIO, .. }) => break,
                        Err(e) => return Err(e),
                    };
                    let end = fs.lseek(e.ino, start, false)?.min(a.size);
                    let mut at = start;
                    while at < end {
                        let n = ((end - at) as usize).min(1 << 20);
                        let buf = fs.read(e.ino, at, n)?;
                        if buf.is_empty() {
                            break;
                        }
                        f.write_all_at(&buf, at).map_err(io(format!("writing {}", path.display())))?;
                        at += buf.len() as u64;
                        rep.bytes += buf.len() as u64;
                    }
                    pos = end.max(start + 1);
                }
                f.set_len(a.size).map_err(io(format!("sizing {}", path.display())))?;
                rep.files += 1;
                done += a.size;
                progress(done, total);
            }
            Kind::Symlink => {
                let t = fs.readlink(e.ino)?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), &path)
                    .map_err(io(format!("creating symlink {}", path.display())))?;
                rep.symlinks += 1;
            }
            Kind::Fifo | Kind::Socket | Kind::Char | Kind::Block => {
                let c = cpath(&path)?;
                // SAFETY: `c` is a valid NUL-terminated path for the call.
                let r = unsafe { libc::mknod(c.as_ptr(), a.mode as libc::mode_t, a.rdev as libc::dev_t) };
                if r != 0 {
                    return Err(Error::io(
                        format!("creating {}", path.display()),
                        std::io::Error::last_os_error(),
                    ));
                }
                rep.specials += 1;
            }
        }
        copy_xattrs(fs, e.ino, &path)?;
        if a.kind != Kind::Dir {
            apply(&path, &a, is_root)?;
        } else {
            dirs.push((path, a));
        }
        Ok(())
    })?;
    if from == ROOT {
        copy_xattrs(fs, ROOT, dst)?;
    }
    // Directories last, deepest first: their times changed as they filled.
    for (p, a) in dirs.iter().rev() {
        apply(p, a, is_root)?;
    }
    Ok(rep)
}

fn copy_xattrs(fs: &Fs, ino: Ino, path: &Path) -> Result<()> {
    for name in fs.listxattr(ino)? {
        let v = fs.getxattr(ino, &name)?;
        let n = std::ffi::OsStr::from_bytes(&name);
        xattr::set(path, n, &v).map_err(io(format!("setting xattr {n:?} on {}", path.display())))?;
    }
    Ok(())
}

/// Owner, mode and times, without following symlinks.
fn apply(path: &Path, a: &Attr, is_root: bool) -> Result<()> {
    match std::os::unix::fs::lchown(path, Some(a.uid), Some(a.gid)) {
        Ok(()) => {}
        Err(e) if !is_root && e.raw_os_error() == Some(libc::EPERM) => {}
        Err(e) => return Err(Error::io(format!("changing the owner of {}", path.display()), e)),
    }
    if a.kind != Kind::Symlink {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(a.mode & 0o7777))
            .map_err(io(format!("changing the mode of {}", path.display())))?;
    }
    let t = |x: crate::fs::Time| FileTime::from_unix_time(x.sec, x.nsec);
    filetime::set_symlink_file_times(path, t(a.atime), t(a.mtime))
        .map_err(io(format!("setting the times of {}", path.display())))
}
