//! `zlogfs import DIR IMAGE`: bulk load a directory tree without a mount.
//!
//! The tree is walked first (metadata only), then loaded in name order,
//! depth first, so that inode numbers, and so the packing of small files,
//! follow the tree. File contents of each batch are read by all cores in
//! parallel; compression runs in parallel at each commit. Modes, owners,
//! times, xattrs, hard links, symlinks, special files and holes are kept.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::io;
use crate::fs::{Fs, Ino, SetAttr, Time, ROOT};
use crate::{Error, Result};

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
}

/// Data ranges of a file: (offset, bytes).
type Ranges = Vec<(u64, Vec<u8>)>;

struct Item {
    path: PathBuf,
    /// Index of the parent directory's item (None: the root).
    parent: Option<usize>,
    name: Vec<u8>,
    meta: std::fs::Metadata,
}

fn list(root: &Path) -> Result<Vec<Item>> {
    let meta = std::fs::symlink_metadata(root).map_err(io(format!("reading {}", root.display())))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!("{} is not a directory", root.display())));
    }
    let mut items = vec![Item { path: root.to_path_buf(), parent: None, name: vec![], meta }];
    visit(&mut items, 0)?;
    Ok(items)
}

/// Depth first, children in name order: each directory's subtree follows it.
fn visit(items: &mut Vec<Item>, d: usize) -> Result<()> {
    let path = items[d].path.clone();
    let mut ents: Vec<(Vec<u8>, PathBuf)> = std::fs::read_dir(&path)
        .map_err(io(format!("listing {}", path.display())))?
        .map(|e| e.map(|e| (e.file_name().as_bytes().to_vec(), e.path())))
        .collect::<std::io::Result<_>>()
        .map_err(io(format!("listing {}", path.display())))?;
    ents.sort();
    for (name, p) in ents {
        let meta = std::fs::symlink_metadata(&p).map_err(io(format!("reading {}", p.display())))?;
        let is_dir = meta.is_dir();
        items.push(Item { path: p, parent: Some(d), name, meta });
        if is_dir {
            visit(items, items.len() - 1)?;
        }
    }
    Ok(())
}

/// The data ranges of a file: (offset, bytes), holes left out.
fn read_data(path: &Path, size: u64) -> Result<Ranges> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = File::open(path).map_err(io(format!("opening {}", path.display())))?;
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match seek(&f, pos, libc::SEEK_DATA) {
            Some(s) => s,
            None => break,
        };
        let end = seek(&f, start, libc::SEEK_HOLE).unwrap_or(size).min(size);
        if end <= start {
            break;
        }
        f.seek(SeekFrom::Start(start)).map_err(io(format!("seeking in {}", path.display())))?;
        let mut buf = vec![0u8; (end - start) as usize];
        f.read_exact(&mut buf).map_err(io(format!("reading {}", path.display())))?;
        out.push((start, buf));
        pos = end;
    }
    Ok(out)
}

/// lseek with SEEK_DATA or SEEK_HOLE; None at ENXIO (no more data).
fn seek(f: &File, off: u64, whence: i32) -> Option<u64> {
    // SAFETY: the descriptor is owned by `f`, open for the whole call, and
    // lseek touches no memory of ours.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
    (r >= 0).then_some(r as u64)
}

fn time(sec: i64, nsec: i64) -> Time {
    Time { sec, nsec: nsec.clamp(0, 999_999_999) as u32 }
}

/// Import the tree under `src` into the root of `fs`. `progress` is told
/// the bytes of each file loaded.
pub fn import(fs: &Fs, src: &Path, progress: &dyn Fn(u64, u64)) -> Result<ImportReport> {
    let items = list(src)?;
    let total: u64 = items.iter().filter(|i| i.meta.is_file()).map(|i| i.meta.len()).sum();
    let mut rep = ImportReport::default();
    let mut inos: Vec<Ino> = vec![0; items.len()];
    inos[0] = ROOT;
    let mut links: HashMap<(u64, u64), Ino> = HashMap::new();
    let mut done = 0u64;
    let mut i = 1;
    while i < items.len() {
        // A batch: up to 1024 entries or 64 MiB of file data.
        let mut j = i;
        let mut bytes = 0u64;
        while j < items.len() && j - i < 1024 && bytes < 64 << 20 {
            if items[j].meta.is_file() {
                bytes += items[j].meta.len();
            }
            j += 1;
        }
        let contents: Vec<Option<Ranges>> = items[i..j]
            .par_iter()
            .map(|it| {
                if it.meta.is_file() && it.meta.len() <= 16 << 20 {
                    read_data(&it.path, it.meta.len()).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_>>()?;
        for (k, data) in (i..j).zip(contents) {
            let it = &items[k];
            let parent = inos[it.parent.expect("only the root has none")];
            let m = &it.meta;
            let ft = m.file_type();
            let ctx = |e: Error| match e {
                Error::Posix { errno, msg } => Error::posix(errno, format!("{}: {msg}", it.path.display())),
                e => e,
            };
            if !ft.is_dir() && m.nlink() > 1 {
                if let Some(&target) = links.get(&(m.dev(), m.ino())) {
                    fs.link(target, parent, &it.name).map_err(ctx)?;
                    inos[k] = target;
                    rep.hardlinks += 1;
                    continue;
                }
            }
            let attr = if ft.is_dir() {
                rep.dirs += 1;
                fs.mkdir(parent, &it.name, m.mode(), m.uid(), m.gid())
            } else if ft.is_symlink() {
                rep.symlinks += 1;
                let t = std::fs::read_link(&it.path)
                    .map_err(io(format!("reading link {}", it.path.display())))?;
                fs.symlink(parent, &it.name, t.as_os_str().as_bytes(), m.uid(), m.gid())
            } else if ft.is_file() {
                rep.files += 1;
                fs.mknod(parent, &it.name, m.mode(), m.uid(), m.gid(), 0)
            } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
                rep.specials += 1;
                fs.mknod(parent, &it.name, m.mode(), m.uid(), m.gid(), m.rdev())
            } else {
                return Err(Error::Invalid(format!("{}: unknown file type", it.path.display())));
            }
            .map_err(ctx)?;
            let ino = attr.ino;
            inos[k] = ino;
            if !ft.is_dir() && m.nlink() > 1 {
                links.insert((m.dev(), m.ino()), ino);
            }
            if ft.is_file() {
                let ranges = match data {
                    Some(r) => r,
                    None => read_data(&it.path, m.len())?,
                };
                for (off, buf) in ranges {
                    fs.write(ino, off, &buf).map_err(ctx)?;
                    rep.bytes += buf.len() as u64;
                }
                if m.len() > 0 {
                    fs.setattr(ino, &SetAttr { size: Some(m.len()), ..SetAttr::default() }).map_err(ctx)?;
                }
                done += m.len();
                progress(done, total);
            }
            rep.xattrs += copy_xattrs(fs, ino, &it.path)?;
            if !ft.is_dir() {
                set_times(fs, ino, m).map_err(ctx)?;
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
    rep.xattrs += copy_xattrs(fs, ROOT, &items[0].path)?;
    for k in (0..items.len()).rev() {
        if items[k].meta.is_dir() {
            set_times(fs, inos[k], &items[k].meta)?;
        }
    }
    Ok(rep)
}

fn set_times(fs: &Fs, ino: Ino, m: &std::fs::Metadata) -> Result<()> {
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

fn copy_xattrs(fs: &Fs, ino: Ino, path: &Path) -> Result<u64> {
    let names = match xattr::list(path) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(0),
        Err(e) => return Err(Error::io(format!("listing xattrs of {}", path.display()), e)),
    };
    let mut n = 0;
    for name in names {
        let nb = name.as_bytes();
        if nb == crate::fs::XATTR_PHYSICAL {
            continue;
        }
        let v = match xattr::get(path, &name) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(e) => return Err(Error::io(format!("reading xattr {:?} of {}", name, path.display()), e)),
        };
        fs.setxattr(ino, nb, &v, 0).map_err(|e| match e {
            Error::Posix { errno, msg } => Error::posix(errno, format!("{}: {msg}", path.display())),
            e => e,
        })?;
        n += 1;
    }
    Ok(n)
}
