//! The zlogfs command-line tool.

/// The allocator: mimalloc keeps freed memory for reuse where glibc's
/// malloc gave it back to the kernel and faulted it in again (7% of the
/// daemon's CPU in a sequential write); docs/decisions/2026-11-25-mimalloc.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use zlogfs::codec::CodecSpec;
use zlogfs::fs::{self as zfs, Fs, FsOptions, Kind, MkfsOptions};
use zlogfs::store::{FileStore, Geometry, Store, META_AREA_SIZE};
use zlogfs::tools;
use zlogfs::{engine, Options};
use zlogfs::{validate_geometry, DEFAULT_SEGMENT_SIZE};

#[path = "zlogfs/logging.rs"]
mod logging;
#[path = "zlogfs/mount.rs"]
mod mount;

#[derive(Parser)]
#[command(name = "zlogfs", version, about = "A log-structured file system with transparent compression")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create an empty zlogfs file system in a file or on a block device.
    Mkfs {
        /// Image file to create (or block device to format).
        image: PathBuf,
        #[command(flatten)]
        fmt: FormatArgs,
        /// Overwrite an existing image or file.
        #[arg(long, short)]
        force: bool,
    },
    /// Mount an image on a directory through FUSE (in the background
    /// unless -f). Unmount with `fusermount3 -u DIR`, `umount DIR`, or
    /// SIGTERM/SIGINT to the daemon: all of them leave a clean image.
    Mount {
        /// The image (made by zlogfs mkfs or zlogfs import).
        image: PathBuf,
        /// The mount point (an existing directory).
        dir: PathBuf,
        /// Comma-separated options: ro, rw, allow_other, noatime, relatime,
        /// attr_timeout=S, entry_timeout=S, negative_timeout=S (seconds the
        /// kernel caches attributes, names and missing names; defaults 1, 1,
        /// 0), threads=N (threads for the requests that may take long:
        /// fsync and large reads and writes; default 4), nopatches (rewrite a whole chunk on
        /// a small overwrite instead of storing a patch beside it),
        /// uring[=on|off|auto] (take requests through FUSE over io_uring,
        /// one queue per CPU: much cheaper round trips on Linux 6.14+; the
        /// default, auto, uses it when the fuse module's enable_uring is
        /// on; uring turns that on, as root, and fails without it),
        /// spin=US (through /dev/fuse, how long the reader looks for the
        /// next request during a burst before it sleeps; default 200, 0
        /// never: costs CPU, saves wakeups), log=LEVEL (what the daemon
        /// logs: error, warn (default), info, debug, or a filter such as
        /// zlogfs_fs=debug; as ZLOGFS_LOG), logfile=PATH (where the
        /// background daemon logs; default the system log).
        /// Every generic option of mount(8) is taken as well: nosuid,
        /// nodev, noexec, nosymfollow go to the kernel; sync and dirsync
        /// make each change (each directory change) durable when it
        /// returns; noatime, relatime (default), strictatime, nodiratime
        /// set the atime policy (docs/SEMANTICS.md).
        /// Permissions are always checked by the kernel
        /// (default_permissions).
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Stay in the foreground (serve until unmounted or interrupted).
        #[arg(short, long)]
        foreground: bool,
    },
    /// Copy a directory tree into an image without mounting it (creating
    /// the image if it does not exist).
    Import {
        /// The directory to copy.
        dir: PathBuf,
        /// The image (made with the format options below if missing).
        image: PathBuf,
        #[command(flatten)]
        fmt: FormatArgs,
        /// Machine-readable summary.
        #[arg(long)]
        json: bool,
    },
    /// Copy the tree of an image (or a subtree) out to a directory.
    Export {
        /// The image.
        image: PathBuf,
        /// Destination directory (created; must be empty if it exists).
        dir: PathBuf,
        /// Subtree of the image to export.
        #[arg(long, default_value = "/")]
        path: String,
        /// Machine-readable summary.
        #[arg(long)]
        json: bool,
    },
    /// List a directory of an image.
    Ls {
        /// The image.
        image: PathBuf,
        /// Directory inside the image.
        #[arg(default_value = "/")]
        path: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Write a file of an image to standard output.
    Cat {
        /// The image.
        image: PathBuf,
        /// File inside the image.
        path: String,
    },
    /// Show the attributes of a file of an image.
    Stat {
        /// The image.
        image: PathBuf,
        /// Path inside the image.
        path: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Logical and stored bytes of a subtree, and of each entry in it.
    Du {
        /// The image.
        image: PathBuf,
        /// Path inside the image.
        #[arg(default_value = "/")]
        path: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Open an image (recovering it if needed) and report what it holds.
    Stats {
        /// The image.
        image: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Clean: move the live data out of the segments with the most dead
    /// space, repacking small files together, and free those segments.
    /// TARGET is an image, or the mount point of a mounted one (the pass
    /// then runs in the mount's daemon).
    Clean {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Clean at most this many segments (default: all worth cleaning).
        #[arg(long)]
        segments: Option<usize>,
        /// Leave segments alone that are more than this fraction live
        /// (an image only; a mount uses 0.9).
        #[arg(long, default_value = "0.9")]
        max_live: f64,
        /// Machine-readable report.
        #[arg(long)]
        json: bool,
    },
    /// Check every checksum and cross-reference of an image. Exit status 0
    /// when clean, 1 with a report when not.
    Fsck {
        /// The image.
        image: PathBuf,
        /// Mend first what can be mended (a damaged superblock from its
        /// copy, index runs whose index or filter block is damaged), then
        /// check. Writes to the image.
        #[arg(long)]
        repair: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct FormatArgs {
    /// Size of a new image file, e.g. 1G, 512M (ignored for devices).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Segment size, e.g. 4M (128K to 1G, a multiple of 512). Default:
    /// 1M for images under 1 GiB (so that the reserve of two segments
    /// stays small), 4M otherwise.
    #[arg(long, value_parser = parse_size)]
    segment_size: Option<u64>,
    /// Bytes of file data per chunk (power of two, 4K to 1M).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    chunk_size: u64,
    /// Target size of a block of small files packed together.
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    pack_size: u64,
    /// Files up to this size live inline in the index.
    #[arg(long, default_value = "512", value_parser = parse_size)]
    inline_max: u64,
    /// Default codec of file data: zstd:N (1-19), lz4, deflate:N, pred1, pred2, none.
    /// zstd:3 stores about 4% less and writes about a third slower.
    #[arg(long, default_value = "zstd:2")]
    codec: CodecSpec,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let mul = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1u64 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], mul)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (e.g. 1G, 512M, 4096)"))?;
    n.checked_mul(mul).ok_or_else(|| format!("{s:?} is too large"))
}

fn main() -> ExitCode {
    // Run as mount.fuse.zlogfs (a link to this program), mount(8) and
    // /etc/fstab lines of type fuse.zlogfs mount through it.
    let argv: Vec<String> = std::env::args().collect();
    let name = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
    // mount.fuse3 (what mount(8) runs for type fuse.zlogfs when there is no
    // mount.fuse.zlogfs) runs `zlogfs IMAGE DIR -o OPTIONS` from PATH.
    let helper_form = argv.get(1).is_some_and(|a| {
        !a.starts_with('-')
            && a != "help"
            && !<Cli as clap::CommandFactory>::command().get_subcommands().any(|c| c.get_name() == a)
    });
    if name.starts_with("mount.") || (helper_form && argv.len() >= 3) {
        return finish(mount::helper(&argv[1..]));
    }
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Mount { .. }) {
        if let Err(e) = logging::init(None, logging::Sink::Stderr) {
            return finish(Err(e));
        }
    }
    let r = match cli.cmd {
        Cmd::Mount { image, dir, options, foreground } => mount::mount(&image, &dir, &options, foreground),
        Cmd::Mkfs { image, fmt, force } => mkfs(&image, &fmt, force).map(|_| ExitCode::SUCCESS),
        Cmd::Import { dir, image, fmt, json } => import(&dir, &image, &fmt, json),
        Cmd::Export { image, dir, path, json } => export(&image, &dir, &path, json),
        Cmd::Ls { image, path, json } => ls(&image, &path, json),
        Cmd::Cat { image, path } => cat(&image, &path),
        Cmd::Stat { image, path, json } => stat(&image, &path, json),
        Cmd::Du { image, path, json } => du(&image, &path, json),
        Cmd::Stats { image, json } => stats(&image, json),
        Cmd::Fsck { image, repair, json } => fsck(&image, repair, json),
        Cmd::Clean { target, segments, max_live, json } => clean(&target, segments, max_live, json),
    };
    finish(r)
}

fn finish(r: Res) -> ExitCode {
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zlogfs: {e}");
            ExitCode::from(2)
        }
    }
}

type Res = Result<ExitCode, String>;

fn mkfs(image: &Path, f: &FormatArgs, force: bool) -> Result<(), String> {
    let is_dev = std::fs::metadata(image)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    if image.is_dir() {
        return Err(format!(
            "{} is a directory: give an image file (it is created) or a block device",
            image.display()
        ));
    }
    if image.exists() && !force {
        return Err(format!("{} already exists; pass --force to overwrite it", image.display()));
    }
    let size = if is_dev {
        FileStore::len_bytes(image).map_err(|e| format!("cannot size {}: {e}", image.display()))?
    } else {
        f.size
    };
    let segment_size = match f.segment_size {
        Some(s) => u32::try_from(s).map_err(|_| "segment size too large".to_string())?,
        None if size < 1 << 30 => 1 << 20,
        None => DEFAULT_SEGMENT_SIZE,
    };
    let segment_count = size.saturating_sub(META_AREA_SIZE) / u64::from(segment_size);
    let geometry = Geometry { segment_size, segment_count: u32::try_from(segment_count).unwrap_or(u32::MAX) };
    validate_geometry(geometry).map_err(|e| format!("cannot make an image of {size} bytes: {e}"))?;
    let small = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} is too large"));
    let o = MkfsOptions {
        chunk_size: small(f.chunk_size, "chunk size")?,
        pack_bytes: small(f.pack_size, "pack size")?,
        inline_max: small(f.inline_max, "inline limit")?,
        codec: f.codec,
        root_uid: nix::unistd::getuid().as_raw(),
        root_gid: nix::unistd::getgid().as_raw(),
    };
    let store =
        FileStore::create(image, geometry).map_err(|e| format!("cannot create {}: {e}", image.display()))?;
    let store: Arc<dyn Store> = Arc::new(store);
    zfs::mkfs(store.clone(), &o).map_err(|e| format!("{}: {e}", image.display()))?;
    let sb = engine::read_superblock(store.as_ref()).map_err(|e| e.to_string())?;
    eprintln!(
        "created {}: {} segments of {} KiB ({} MiB), chunks of {} KiB, codec {}, uuid {}",
        image.display(),
        geometry.segment_count,
        geometry.segment_size / 1024,
        geometry.capacity() >> 20,
        o.chunk_size / 1024,
        o.codec,
        sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    Ok(())
}

/// Open an image file for writing, taking its lock. A process that has it
/// open gets a few seconds to let go: `fusermount3 -u` returns before the
/// daemon has finished closing the image, and a command run right after
/// it should not fail for that.
fn open_store(image: &Path) -> Result<FileStore, String> {
    wait_for_lock(image, || FileStore::open(image))
}

/// `open` an image, waiting a few seconds for another process to let go of
/// it (see [`open_store`]).
fn wait_for_lock(image: &Path, open: impl Fn() -> std::io::Result<FileStore>) -> Result<FileStore, String> {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    let mut told = false;
    loop {
        match open() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let waited = start.elapsed();
                if waited >= Duration::from_secs(5) {
                    return Err(format!(
                        "{} is in use by another process (mounted, or open in another zlogfs command); \
                         unmount it first",
                        image.display()
                    ));
                }
                if !told && waited >= Duration::from_millis(500) {
                    eprintln!("waiting for the process that has {} open to close it...", image.display());
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            r => {
                return r.map_err(|e| {
                    let hint = match e.raw_os_error() {
                        Some(libc::EACCES | libc::EPERM | libc::EROFS) => {
                            " (it is read-only to you: fsck, ls, cat, stat, du, stats and export still work, \
                             and mount -o ro)"
                        }
                        _ => "",
                    };
                    format!("cannot open {}: {e}{hint}", image.display())
                })
            }
        }
    }
}

/// Open an image for a command that only reads it: read-only, with a
/// shared lock, so that it works on an image the caller may not write (mode
/// 0444, immutable, a read-only medium) and beside other readers.
fn open_fs_ro(image: &Path) -> Result<Fs, String> {
    let f = wait_for_lock(image, || FileStore::open_read_only(image))?;
    let sb = engine::read_superblock(&f).map_err(|e| format!("{}: {e}", image.display()))?;
    let f = f.with_geometry(sb.geometry).map_err(|e| format!("{}: {e}", image.display()))?;
    let opts = FsOptions {
        engine: Options { background: false, ..Options::default() },
        commit_interval: None,
        atime: zfs::Atime::Noatime,
        read_only: true,
        ..FsOptions::default()
    };
    Fs::open(Arc::new(f), opts).map_err(|e: zfs::Error| format!("{}: {e}", image.display()))
}

fn open_fs(image: &Path, atime: zfs::Atime) -> Result<Fs, String> {
    let f = open_store(image)?;
    let sb = engine::read_superblock(&f).map_err(|e| format!("{}: {e}", image.display()))?;
    let f = f.with_geometry(sb.geometry).map_err(|e| format!("{}: {e}", image.display()))?;
    let opts = FsOptions {
        engine: Options { background: false, ..Options::default() },
        commit_interval: None,
        atime,
        ..FsOptions::default()
    };
    Fs::open(Arc::new(f), opts).map_err(|e: zfs::Error| format!("{}: {e}", image.display()))
}

fn close(fs: Fs, image: &Path) -> Result<(), String> {
    fs.close().map_err(|e| format!("closing {}: {e}", image.display()))
}

fn resolve(fs: &Fs, path: &str) -> Result<zfs::Ino, String> {
    tools::resolve(fs, path).map_err(|e| e.to_string())
}

fn import(dir: &Path, image: &Path, f: &FormatArgs, json: bool) -> Res {
    // Before an image is made for it.
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a directory", dir.display())),
        Err(e) => return Err(format!("cannot import {}: {e}", dir.display())),
    }
    if !image.exists() {
        mkfs(image, f, false)?;
    }
    let fs = open_fs(image, zfs::Atime::Noatime)?;
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
    fs.engine().flush().map_err(|e| e.to_string())?;
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
            "skipped": rep.skipped.iter().map(|(p, e)| serde_json::json!({"path": p, "error": e})).collect::<Vec<_>>(),
        });
        println!("{v:#}");
    } else {
        println!(
            "imported {} files, {} directories, {} symlinks, {} special files, {} extra hard links, {} xattrs",
            rep.files, rep.dirs, rep.symlinks, rep.specials, rep.hardlinks, rep.xattrs
        );
        println!(
            "{} bytes of data stored in {} bytes (ratio {:.2}) in {:.1} s ({:.0} entries/s, {:.1} MB/s)",
            u.logical,
            u.physical,
            u.logical as f64 / (u.physical.max(1)) as f64,
            secs,
            entries as f64 / secs.max(1e-9),
            rep.bytes as f64 / secs.max(1e-9) / 1e6
        );
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

fn export(image: &Path, dir: &Path, path: &str, json: bool) -> Res {
    let fs = open_fs_ro(image)?;
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
        println!("{v:#}");
    } else {
        println!(
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

fn kind_char(k: Kind) -> char {
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

fn mode_string(a: &zfs::Attr) -> String {
    let mut s = String::new();
    s.push(kind_char(a.kind));
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if a.mode & (0o400 >> i) != 0 { c } else { '-' });
    }
    s
}

fn ls(image: &Path, path: &str, json: bool) -> Res {
    let fs = open_fs_ro(image)?;
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
        println!("{:#}", serde_json::Value::Array(v));
    } else {
        for (n, a, p) in rows {
            println!(
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

fn cat(image: &Path, path: &str) -> Res {
    use std::io::Write;
    let fs = open_fs_ro(image)?;
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

fn stat(image: &Path, path: &str, json: bool) -> Res {
    let fs = open_fs_ro(image)?;
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
        println!("{v:#}");
    } else {
        println!(
            "  path: {path}\n inode: {}  kind: {:?}  mode: {:o} ({})",
            a.ino,
            a.kind,
            a.mode & 0o7777,
            mode_string(&a)
        );
        println!(" links: {}  uid: {}  gid: {}  rdev: {:#x}", a.nlink, a.uid, a.gid, a.rdev);
        println!(
            "  size: {}  blocks: {} (512 B)  stored: {} bytes  codec policy: {}",
            a.size,
            a.blocks,
            phys,
            codec.as_deref().unwrap_or("(file system default)")
        );
        println!(
            " atime: {}\n mtime: {}\n ctime: {}\n btime: {}",
            t(a.atime),
            t(a.mtime),
            t(a.ctime),
            t(a.btime)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn du(image: &Path, path: &str, json: bool) -> Res {
    let fs = open_fs_ro(image)?;
    let ino = resolve(&fs, path)?;
    let mut rows = Vec::new();
    if fs.getattr(ino).map_err(|e| e.to_string())?.kind == Kind::Dir {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.readdir(ino, after.as_deref(), 1024).map_err(|e| e.to_string())?;
            let Some(l) = page.last() else { break };
            after = Some(l.name.clone());
            for e in page {
                let u = fs.du(e.ino).map_err(|e| e.to_string())?;
                rows.push((String::from_utf8_lossy(&e.name).into_owned(), u));
            }
        }
    }
    let total = fs.du(ino).map_err(|e| e.to_string())?;
    let ratio = |u: &zfs::TreeUsage| u.logical as f64 / u.physical.max(1) as f64;
    if json {
        let row = |n: &str, u: &zfs::TreeUsage| {
            serde_json::json!({"path": n, "files": u.files, "dirs": u.dirs,
            "logical": u.logical, "allocated": u.allocated, "physical": u.physical, "ratio": ratio(u)})
        };
        let v = serde_json::json!({"total": row(path, &total), "entries": rows.iter().map(|(n, u)| row(n, u)).collect::<Vec<_>>()});
        println!("{v:#}");
    } else {
        println!("{:>14} {:>14} {:>7} {:>8}  path", "logical", "physical", "ratio", "files");
        for (n, u) in rows.iter().chain(std::iter::once(&(path.to_string(), total.clone()))) {
            println!("{:>14} {:>14} {:>7.2} {:>8}  {n}", u.logical, u.physical, ratio(u), u.files);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Figures `zlogfs stats` derives from the image's usage and the engine.
struct Derived {
    ratio: f64,
    per_inode: f64,
    amp: Option<f64>,
    meta_per_file: f64,
    usable: u64,
    free_phys: u64,
    dead: u64,
    fits_more: u64,
}

impl Derived {
    fn of(u: &zfs::Usage, e: &engine::Engine) -> Derived {
        let s = e.stats();
        let files = u.tree.files + u.tree.dirs + u.tree.others;
        let ratio = u.tree.logical as f64 / u.tree.physical.max(1) as f64;
        // Space: physical bytes in use and free (free counts what cleaning
        // can reclaim, as statfs does), dead bytes awaiting the cleaner, and
        // how much more logical data fits at the ratio seen so far.
        let (usable, free_phys) = e.capacity();
        Derived {
            ratio,
            per_inode: u.inode_bytes_compressed as f64 / u.inodes.max(1) as f64,
            amp: (u.counters.user_bytes > 0)
                .then(|| u.counters.device_bytes as f64 / u.counters.user_bytes as f64),
            meta_per_file: s.run_bytes as f64 / files.max(1) as f64,
            usable,
            free_phys,
            dead: e.dead_bytes(),
            fits_more: (free_phys as f64 * ratio.max(1.0)) as u64,
        }
    }
}

fn stats(image: &Path, json: bool) -> Res {
    let fs = open_fs_ro(image)?;
    let u = fs.usage().map_err(|e| e.to_string())?;
    let d = Derived::of(&u, fs.engine());
    if json {
        println!("{:#}", stats_json(image, &fs, &u, &d));
    } else {
        print_stats(image, &fs, &u, &d);
    }
    Ok(ExitCode::SUCCESS)
}

fn stats_json(image: &Path, fs: &Fs, u: &zfs::Usage, d: &Derived) -> serde_json::Value {
    let e = fs.engine();
    let s = e.stats();
    let g = e.superblock().geometry;
    let Derived { ratio, per_inode, amp, meta_per_file, usable, free_phys, dead, fits_more, .. } = *d;
    let codecs: serde_json::Map<String, serde_json::Value> = u
        .codecs
        .iter()
        .map(|(k, c)| {
            (k.clone(), serde_json::json!({"blocks": c.blocks, "logical": c.raw, "stored": c.stored}))
        })
        .collect();
    serde_json::json!({
        "image": image.display().to_string(),
        "format_version": e.superblock().version, "records_version": fs.config().version,
        "segment_size": g.segment_size, "segments": s.segments, "free_segments": s.free_segments,
        "live_bytes": s.live_bytes,
        "files": u.tree.files, "dirs": u.tree.dirs, "other_inodes": u.tree.others, "inodes": u.inodes,
        "logical_bytes": u.tree.logical, "allocated_bytes": u.tree.allocated, "physical_bytes": u.tree.physical,
        "ratio": ratio, "inline_bytes": u.inline_bytes, "codecs": codecs,
        "patched_chunks": u.patched_chunks, "bases_gone": u.bases_gone, "patch_bytes": u.patch_bytes, "patch_released_bytes": u.patch_released,
        "inode_bytes_raw": u.inode_bytes_raw, "inode_bytes_compressed": u.inode_bytes_compressed,
        "bytes_per_inode": per_inode, "index_bytes": s.run_bytes, "metadata_bytes_per_file": meta_per_file,
        "triples": u.triples, "index_runs": s.runs, "memtable_entries": s.memtable_entries,
        "checkpoint": s.checkpoint, "pinned_segments": s.pinned_segments,
        "user_bytes_written": u.counters.user_bytes, "device_bytes_written": u.counters.device_bytes,
        "device_bytes_per_user_byte": amp,
        "reserve_segments": s.reserve_segments, "usable_bytes": usable, "physical_used_bytes": s.live_bytes,
        "physical_free_bytes": free_phys, "dead_bytes": dead, "logical_used_bytes": u.tree.logical,
        "estimated_logical_bytes_that_fit": fits_more,
    })
}

fn print_stats(image: &Path, fs: &Fs, u: &zfs::Usage, d: &Derived) {
    let e = fs.engine();
    let s = e.stats();
    let g = e.superblock().geometry;
    let Derived { ratio, per_inode, amp, meta_per_file, usable, free_phys, dead, fits_more, .. } = *d;
    println!(
        "image:            {} (format version {}, file system records version {})",
        image.display(),
        e.superblock().version,
        fs.config().version
    );
    println!(
        "segments:         {} of {} KiB, {} free, {} free at the next index flush; {} live bytes",
        s.segments,
        g.segment_size / 1024,
        s.free_segments,
        s.pinned_segments,
        s.live_bytes
    );
    println!(
        "space:            {} usable ({} reserved segments); {} used, {} free of which {} dead \
         (reclaimed by the cleaner); about {} more logical bytes fit at ratio {ratio:.2}",
        usable, s.reserve_segments, s.live_bytes, free_phys, dead, fits_more
    );
    println!(
        "tree:             {} files, {} directories, {} others",
        u.tree.files, u.tree.dirs, u.tree.others
    );
    println!(
        "file data:        {} logical, {} allocated, {} stored (ratio {ratio:.2}); {} inline in the index",
        u.tree.logical, u.tree.allocated, u.tree.physical, u.inline_bytes
    );
    if u.patched_chunks > 0 {
        println!(
            "patched chunks:   {} ({} stored in patches, replacing {} stored bytes of their bases; \
             {} without a base, all patches)",
            u.patched_chunks, u.patch_bytes, u.patch_released, u.bases_gone
        );
    }
    for (k, c) in &u.codecs {
        println!(
            "  {k:<24} {:>8} blocks {:>14} -> {:>14} ({:.2})",
            c.blocks,
            c.raw,
            c.stored,
            c.raw as f64 / c.stored.max(1) as f64
        );
    }
    println!("inodes:           {} records, {} bytes raw, {} compressed: {per_inode:.1} bytes per inode; {} (uid, gid, mode) triples", u.inodes, u.inode_bytes_raw, u.inode_bytes_compressed, u.triples);
    println!("index:            {} runs, {} bytes ({meta_per_file:.1} bytes per file, inline data included); {} entries in memtables", s.runs, s.run_bytes, s.memtable_entries);
    println!(
        "writes:           {} bytes by users, {} bytes to the device ({}) over the image's life",
        u.counters.user_bytes,
        u.counters.device_bytes,
        amp.map_or("no user bytes yet".to_string(), |a| format!("{a:.2} device bytes per user byte"))
    );
    println!("checkpoint:       {}", s.checkpoint);
}

fn clean(target: &Path, segments: Option<usize>, max_live: f64, json: bool) -> Res {
    if !(0.0..=1.0).contains(&max_live) {
        return Err(format!("--max-live {max_live} is not a fraction between 0 and 1"));
    }
    let rep = if target.is_dir() {
        // A mount point: the daemon cleans when the root's clean xattr is
        // set, and gives its report back through the same xattr.
        if !is_zlogfs_mount(target) {
            return Err(format!(
                "{} is a directory but not a zlogfs mount point (give the image, or where it is mounted)",
                target.display()
            ));
        }
        let v = segments.map_or("all".to_string(), |n| n.to_string());
        xattr::set(target, "user.zlogfs.clean", v.as_bytes()).map_err(|e| {
            format!(
                "{}: cannot start cleaning ({e}); is it a zlogfs mount, and are you root?",
                target.display()
            )
        })?;
        let out = xattr::get(target, "user.zlogfs.clean")
            .map_err(|e| format!("{}: reading the report: {e}", target.display()))?
            .unwrap_or_default();
        serde_json::from_slice::<serde_json::Value>(&out)
            .map_err(|e| format!("{}: the report is not JSON: {e}", target.display()))?
    } else {
        let fs = open_fs(target, zfs::Atime::Noatime)?;
        let pb = tools::progress(0, "cleaning", json);
        let opts =
            zfs::CleanOptions { max_segments: segments.unwrap_or(usize::MAX), max_live, target_free: None };
        let rep = fs
            .clean(&opts, &|r| {
                pb.set_message(format!(
                    "cleaning: {} segments freed, {} bytes moved",
                    r.freed, r.moved_bytes
                ));
                pb.tick();
            })
            .map_err(|e| format!("{}: cleaning stopped: {e}", target.display()))?;
        pb.finish_and_clear();
        close(fs, target)?;
        rep.to_json()
    };
    if json {
        println!("{rep:#}");
    } else {
        println!(
            "{}: {} segments examined, {} freed; {} chunks and {} patches ({} stored bytes) moved; {} leaked bytes reclaimed",
            target.display(),
            rep["examined"],
            rep["freed"],
            rep["chunks"],
            rep["patches"],
            rep["moved_bytes"],
            rep["leaked_bytes"]
        );
        for s in rep["skipped"].as_array().into_iter().flatten() {
            println!("skipped segment {}: {}", s["segment"], s["why"].as_str().unwrap_or(""));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// True when `dir` is the mount point of a zlogfs mount (type fuse.zlogfs
/// in /proc/self/mountinfo).
fn is_zlogfs_mount(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let unescape = |f: &str| -> String {
        let b = f.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let oct =
                b.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok());
            match (b[i], oct) {
                (b'\\', Some(c)) => {
                    out.push(c);
                    i += 4;
                }
                (c, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    info.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (Some(a), Some(b)) = (halves.next(), halves.next()) else { return false };
        a.split(' ').nth(4).is_some_and(|m| Path::new(&unescape(m)) == dir)
            && b.split(' ').next() == Some("fuse.zlogfs")
    })
}

/// When the file system does not open: what the engine underneath can
/// still say of damaged index blocks (the records they held), or None.
fn fsck_engine(image: &Path) -> Option<Vec<String>> {
    let f = FileStore::open_read_only(image).ok()?;
    let sb = engine::read_superblock(&f).ok()?;
    let f = f.with_geometry(sb.geometry).ok()?;
    let opts = Options { background: false, read_only: true, ..Options::default() };
    let eng = zlogfs::Engine::open(Arc::new(f), opts).ok()?;
    let bad = eng.verify_runs();
    (!bad.is_empty()).then(|| {
        bad.into_iter()
            .map(|d| {
                format!(
                    "index run {}, block {}, holding the records from {} to {}: {}",
                    d.run,
                    d.addr,
                    zfs::keys::describe_key(&d.from),
                    zfs::keys::describe_key(&d.to),
                    d.error
                )
            })
            .collect()
    })
}

fn fsck(image: &Path, repair: bool, json: bool) -> Res {
    let opened = if repair { open_fs(image, zfs::Atime::Noatime) } else { open_fs_ro(image) };
    let fs = match opened {
        Ok(fs) => fs,
        Err(e) => match fsck_engine(image) {
            Some(problems) => {
                if json {
                    println!(
                        "{:#}",
                        serde_json::json!({"clean": false, "problems": problems, "opened": false})
                    );
                } else {
                    for p in &problems {
                        println!("problem: {p}");
                    }
                    println!("{e}");
                    println!("the file system does not open: its records in damaged index blocks are lost");
                }
                return Ok(ExitCode::from(1));
            }
            None => return Err(e),
        },
    };
    let mended =
        if repair { fs.repair().map_err(|e| format!("{}: repair: {e}", image.display()))? } else { vec![] };
    if !json {
        for m in &mended {
            println!("repaired: {m}");
        }
    }
    let pb = tools::progress(0, "checking blocks", json);
    let rep = fs
        .check(&|done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })
        .map_err(|e| format!("{}: check stopped: {e}", image.display()))?;
    pb.finish_and_clear();
    if json {
        let v = serde_json::json!({"clean": rep.problems.is_empty(), "problems": rep.problems, "inodes": rep.inodes,
            "dirents": rep.dirents, "extents": rep.extents, "blocks": rep.blocks, "block_bytes": rep.block_bytes,
            "xattrs": rep.xattrs, "orphans": rep.orphans, "leaked_bytes": rep.leaked_bytes(), "repaired": mended,
            "leaked": rep.leaked.iter().map(|(s, b)| serde_json::json!({"segment": s, "bytes": b})).collect::<Vec<_>>()});
        println!("{v:#}");
    } else {
        for p in &rep.problems {
            println!("problem: {p}");
        }
        if !rep.leaked.is_empty() {
            println!(
                "note: {} bytes in {} segments are counted in use but held by nothing (left by a crash or a \
                 failed write; the cleaner gives them back when it cleans those segments)",
                rep.leaked_bytes(),
                rep.leaked.len()
            );
        }
        println!(
            "{}: {} inodes, {} entries, {} chunks, {} blocks ({} bytes) verified, {} xattrs: {}",
            image.display(),
            rep.inodes,
            rep.dirents,
            rep.extents,
            rep.blocks,
            rep.block_bytes,
            rep.xattrs,
            if rep.problems.is_empty() {
                "clean".to_string()
            } else {
                format!("{} problems", rep.problems.len())
            }
        );
    }
    if repair {
        close(fs, image)?;
    }
    Ok(if rep.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
