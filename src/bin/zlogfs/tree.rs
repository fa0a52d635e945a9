//! The commands over an image's tree: import, export, ls, cat, stat.

use std::path::Path;
use std::process::ExitCode;

use zlogfs::tools;
use zlogfs_fs::{self as zfs, Fs, Kind};

use super::*;

pub(crate) fn resolve(fs: &Fs, path: &str) -> Result<zfs::Ino, String> {
    tools::resolve(fs, path).map_err(|e| e.to_string())
}

pub(crate) fn import(dir: &Path, image: &Path, f: &FormatArgs, json: bool, parts: &Parts) -> Res {
    // Before an image is made for it.
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a directory", dir.display())),
        Err(e) => return Err(format!("cannot import {}: {e}", dir.display())),
    }
    let exists = match s3_url(image)? {
        Some(url) => zlogfs_s3::image_exists(&url).map_err(|e| e.to_string())?,
        None => image.exists(),
    };
    if !exists {
        mkfs(image, f, false, parts)?;
    }
    let fs = open_fs(image, parts, zfs::Atime::Noatime)?;
    let start = std::time::Instant::now();
    let pb = tools::progress(0, "importing", json);
    let rep = tools::import::import(&fs, dir, &|done, total| {
        pb.set_length(total);
        pb.set_position(done);
    });
    let rep = match rep {
        Ok(r) => r,
        Err(e) => {
            // What was imported stays: close the image cleanly.
            if let Err(c) = fs.close() {
                eprintln!("zlogfs: closing {}: {c}", image.display());
            }
            return Err(format!("importing {}: {e}", dir.display()));
        }
    };
    fs.sync().map_err(|e| e.to_string())?;
    // Flush and the merges due: the summary's time and index writes
    // count them (the close then has nothing left to merge).
    fs.engine().settle().map_err(|e| e.to_string())?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let u = fs.du(zfs::ROOT).map_err(|e| e.to_string())?;
    let entries = rep.files + rep.dirs + rep.symlinks + rep.specials + rep.hardlinks;
    if json {
        let v = serde_json::json!({
            "files": rep.files, "dirs": rep.dirs, "symlinks": rep.symlinks, "specials": rep.specials,
            "hardlinks": rep.hardlinks, "xattrs": rep.xattrs, "bytes": rep.bytes,
            "logical_bytes": u.logical, "physical_bytes": u.physical, "seconds": secs,
            "entries_per_second": entries as f64 / secs.max(1e-9),
            "index_bytes_written_by_level_since_open": fs.engine().stats().index_written_by_level,
            "skipped": rep.skipped.iter().map(|(p, e)| serde_json::json!({"path": p, "error": e})).collect::<Vec<_>>(),
        });
        outln!("{v:#}");
    } else {
        outln!(
            "imported {} files, {} directories, {} symlinks, {} special files, {} extra hard links, {} xattrs",
            rep.files, rep.dirs, rep.symlinks, rep.specials, rep.hardlinks, rep.xattrs
        );
        outln!(
            "{} bytes of data stored in {} bytes (ratio {:.2}) in {:.1} s ({:.0} entries/s, {:.1} MB/s)",
            u.logical,
            u.physical,
            u.logical as f64 / (u.physical.max(1)) as f64,
            secs,
            entries as f64 / secs.max(1e-9),
            rep.bytes as f64 / secs.max(1e-9) / 1e6
        );
        outln!("index: {}", admin::index_writes(&fs.engine().stats().index_written_by_level));
    }
    close(fs, image)?;
    if rep.skipped.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    // As tar and rsync: say what was left out, and exit non-zero.
    for (p, e) in &rep.skipped {
        eprintln!("zlogfs: skipped {p}: {e}");
    }
    eprintln!("zlogfs: {} entries could not be imported; the rest was", rep.skipped.len());
    Ok(ExitCode::from(1))
}

pub(crate) fn export(image: &Path, dir: &Path, path: &str, json: bool, parts: &Parts) -> Res {
    let fs = open_fs_ro(image, parts)?;
    let from = resolve(&fs, path)?;
    if fs.getattr(from).map_err(|e| e.to_string())?.kind != Kind::Dir {
        return Err(format!("{path} is not a directory in {}", image.display()));
    }
    let start = std::time::Instant::now();
    let pb = tools::progress(0, "exporting", json);
    let rep = tools::export::export(&fs, from, dir, &|done, total| {
        pb.set_length(total);
        pb.set_position(done);
    })
    .map_err(|e| format!("exporting to {}: {e}", dir.display()))?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let range =
        |r: Option<(u64, u64)>| r.map(|(a, b)| format!("bytes {a}..{b}")).unwrap_or_else(|| "whole".into());
    if json {
        let v = serde_json::json!({
            "files": rep.files, "dirs": rep.dirs, "symlinks": rep.symlinks, "specials": rep.specials,
            "hardlinks": rep.hardlinks, "bytes": rep.bytes, "seconds": secs,
            "damaged": rep.damaged.iter().map(|d| serde_json::json!({
                "path": d.path, "start": d.range.map(|r| r.0), "end": d.range.map(|r| r.1), "reason": d.reason,
            })).collect::<Vec<_>>(),
        });
        outln!("{v:#}");
    } else {
        outln!(
            "exported {} files, {} directories, {} symlinks, {} special files, {} extra hard links: {} bytes in {:.1} s",
            rep.files, rep.dirs, rep.symlinks, rep.specials, rep.hardlinks, rep.bytes, secs
        );
    }
    close(fs, image)?;
    if rep.damaged.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for d in &rep.damaged {
        eprintln!("zlogfs: not copied whole: {} ({}): {}", d.path, range(d.range), d.reason);
    }
    eprintln!(
        "zlogfs: {} entries of {} were damaged and are not copied whole (damaged bytes are holes); \
         everything else was",
        rep.damaged.len(),
        image.display()
    );
    Ok(ExitCode::from(1))
}

pub(crate) fn kind_char(k: Kind) -> char {
    match k {
        Kind::File => '-',
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
        Kind::Fifo => 'p',
        Kind::Socket => 's',
        Kind::Char => 'c',
        Kind::Block => 'b',
    }
}

pub(crate) fn mode_string(a: &zfs::Attr) -> String {
    let mut s = String::new();
    s.push(kind_char(a.kind));
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if a.mode & (0o400 >> i) != 0 { c } else { '-' });
    }
    s
}

pub(crate) fn ls(image: &Path, path: &str, json: bool, parts: &Parts) -> Res {
    let fs = open_fs_ro(image, parts)?;
    let ino = resolve(&fs, path)?;
    let mut rows = Vec::new();
    let a = fs.getattr(ino).map_err(|e| e.to_string())?;
    let entries = if a.kind == Kind::Dir {
        let mut v = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.readdir(ino, after.as_deref(), 1024).map_err(|e| e.to_string())?;
            let Some(l) = page.last() else { break };
            after = Some(l.name.clone());
            v.extend(page);
        }
        v
    } else {
        vec![zfs::DirEntry {
            name: path.rsplit('/').next().unwrap_or(path).as_bytes().to_vec(),
            ino,
            kind: a.kind,
        }]
    };
    for e in entries {
        let a = fs.getattr(e.ino).map_err(|e| e.to_string())?;
        let phys =
            if a.kind == Kind::File { fs.physical_bytes(e.ino).map_err(|e| e.to_string())? } else { 0 };
        rows.push((String::from_utf8_lossy(&e.name).into_owned(), a, phys));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, a, p)| {
                serde_json::json!({"name": n, "ino": a.ino, "mode": a.mode, "nlink": a.nlink,
                "uid": a.uid, "gid": a.gid, "size": a.size, "physical": p, "mtime": a.mtime.sec})
            })
            .collect();
        outln!("{:#}", serde_json::Value::Array(v));
    } else {
        for (n, a, p) in rows {
            outln!(
                "{} {:>3} {:>5} {:>5} {:>12} {:>12} {}",
                mode_string(&a),
                a.nlink,
                a.uid,
                a.gid,
                a.size,
                p,
                n
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn cat(image: &Path, path: &str, parts: &Parts) -> Res {
    use std::io::Write;
    let fs = open_fs_ro(image, parts)?;
    let ino = resolve(&fs, path)?;
    let a = fs.getattr(ino).map_err(|e| e.to_string())?;
    match a.kind {
        Kind::File => {}
        Kind::Dir => return Err(format!("{path}: is a directory (list it with zlogfs ls)")),
        Kind::Symlink => {
            let t = fs.readlink(ino).map_err(|e| e.to_string())?;
            return Err(format!("{path}: is a symbolic link to {}", String::from_utf8_lossy(&t)));
        }
        k => return Err(format!("{path}: is not a regular file ({k:?})")),
    }
    let mut out = std::io::stdout().lock();
    let mut off = 0u64;
    while off < a.size {
        let buf = fs.read(ino, off, 1 << 20).map_err(|e| format!("{path}: {e}"))?;
        if buf.is_empty() {
            break;
        }
        out.write_all(&buf).map_err(|e| format!("writing to standard output: {e}"))?;
        off += buf.len() as u64;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn stat(image: &Path, path: &str, json: bool, parts: &Parts) -> Res {
    let fs = open_fs_ro(image, parts)?;
    let ino = resolve(&fs, path)?;
    let a = fs.getattr(ino).map_err(|e| e.to_string())?;
    let phys = fs.physical_bytes(ino).map_err(|e| e.to_string())?;
    let codec = fs.getxattr(ino, zfs::XATTR_CODEC).ok().map(|v| String::from_utf8_lossy(&v).into_owned());
    let t = |t: zfs::Time| format!("{}.{:09}", t.sec, t.nsec);
    if json {
        let v = serde_json::json!({"path": path, "ino": a.ino, "kind": format!("{:?}", a.kind), "mode": a.mode,
            "nlink": a.nlink, "uid": a.uid, "gid": a.gid, "rdev": a.rdev, "size": a.size, "blocks": a.blocks,
            "physical": phys, "codec": codec, "atime": t(a.atime), "mtime": t(a.mtime), "ctime": t(a.ctime),
            "btime": t(a.btime)});
        outln!("{v:#}");
    } else {
        outln!(
            "  path: {path}\n inode: {}  kind: {:?}  mode: {:o} ({})",
            a.ino,
            a.kind,
            a.mode & 0o7777,
            mode_string(&a)
        );
        outln!(" links: {}  uid: {}  gid: {}  rdev: {:#x}", a.nlink, a.uid, a.gid, a.rdev);
        outln!(
            "  size: {}  blocks: {} (512 B)  stored: {} bytes  codec policy: {}",
            a.size,
            a.blocks,
            phys,
            codec.as_deref().unwrap_or("(file system default)")
        );
        outln!(
            " atime: {}\n mtime: {}\n ctime: {}\n btime: {}",
            t(a.atime),
            t(a.mtime),
            t(a.ctime),
            t(a.btime)
        );
    }
    Ok(ExitCode::SUCCESS)
}
