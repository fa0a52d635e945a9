//! Exports: the regular files of the file system, named by their path
//! ("vm/disk.raw", with or without a leading slash); the empty name is
//! the only file when there is exactly one.

use zlogfs_fs::{Error, Fs, Ino, Kind, ROOT};

/// An export being served.
#[derive(Debug, Clone)]
pub struct Export {
    /// Its name, as the client gave it.
    pub name: String,
    /// The file.
    pub ino: Ino,
    /// Its size when the client chose it (volumes do not change size
    /// while served).
    pub size: u64,
}

/// Find the export called `name`: a regular file; None when there is none.
/// A lookup that fails underneath (damage, an I/O error, a latched image)
/// is logged, since the client hears only "no such export"; a refused one
/// (no such name, a name through a file) is the client's to know.
pub fn find(fs: &Fs, name: &str) -> Option<Export> {
    match resolve(fs, name) {
        Ok(x) => x,
        Err(e) => {
            if zlogfs_fs::is_failure(&e) {
                tracing::warn!("nbd: export {name:?}: {e}");
            }
            None
        }
    }
}

fn resolve(fs: &Fs, name: &str) -> Result<Option<Export>, Error> {
    if name.is_empty() {
        let all = list(fs, 2);
        return match all.as_slice() {
            [only] => resolve(fs, only),
            _ => Ok(None),
        };
    }
    let mut ino = ROOT;
    for part in name.split('/').filter(|p| !p.is_empty()) {
        ino = fs.lookup(ino, part.as_bytes())?.ino;
    }
    let a = fs.getattr(ino)?;
    Ok((a.kind == Kind::File).then(|| Export { name: name.to_string(), ino, size: a.size }))
}

/// The paths of the regular files, at most `limit`, depth first, without
/// a leading slash.
pub fn list(fs: &Fs, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = match fs.readdir(dir, after.as_deref(), 1024) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("listing exports: directory {prefix:?}: {e}");
                    break;
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                let path = format!("{prefix}{}", String::from_utf8_lossy(&e.name));
                match e.kind {
                    Kind::File if out.len() < limit => out.push(path),
                    Kind::Dir => stack.push((e.ino, format!("{path}/"))),
                    _ => {}
                }
            }
        }
    }
    out.sort();
    out
}

/// `base:allocation` of `[off, off + len)` of `x`: (length, flags)
/// extents, at most `max` of them, data (0) or holes (HOLE | ZERO).
pub fn allocation(fs: &Fs, x: &Export, off: u64, len: u32, max: usize) -> zlogfs_fs::Result<Vec<(u32, u32)>> {
    use crate::proto::alloc;
    let end = off.saturating_add(u64::from(len)).min(x.size);
    let mut pos = off;
    let mut out = Vec::new();
    while pos < end && out.len() < max {
        // The next hole at or after pos (the end of the file counts as one).
        let hole = seek(fs, x.ino, pos, false, end)?;
        let (next, flags) = if hole > pos {
            (hole, 0)
        } else {
            (seek(fs, x.ino, pos, true, end)?, alloc::HOLE | alloc::ZERO)
        };
        let next = next.max(pos + 1).min(pos + u64::from(u32::MAX));
        out.push(((next - pos) as u32, flags));
        pos = next;
    }
    Ok(out)
}

/// SEEK_DATA or SEEK_HOLE from `pos`, at most `end` (none after: `end`).
fn seek(fs: &Fs, ino: Ino, pos: u64, data: bool, end: u64) -> zlogfs_fs::Result<u64> {
    match fs.lseek(ino, pos, data) {
        Ok(p) => Ok(p.min(end)),
        Err(zlogfs_fs::Error::PastEnd(_)) => Ok(end),
        Err(e) => Err(e),
    }
}
