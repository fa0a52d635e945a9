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
use zlogfs::store::{self, FileStore, Geometry, Store, TwoStore, META_AREA_SIZE};
use zlogfs::tools;
use zlogfs::Role;
use zlogfs::{engine, Options};
use zlogfs::{validate_geometry, DEFAULT_SEGMENT_SIZE};

/// `println!` that ends the program quietly when standard output is a
/// pipe its reader closed (`zlogfs ls IMG / | head -1`), where
/// `println!` panics; any other failure to write is said, exit 1.
macro_rules! outln {
    () => { $crate::out_line(format_args!("")) };
    ($($t:tt)*) => { $crate::out_line(format_args!($($t)*)) };
}

fn out_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("zlogfs: writing to standard output: {e}");
        std::process::exit(1);
    }
}

#[path = "zlogfs/admin.rs"]
mod admin;
#[path = "zlogfs/logging.rs"]
mod logging;
#[path = "zlogfs/metrics_http.rs"]
mod metrics_http;
#[path = "zlogfs/mount.rs"]
mod mount;
#[path = "zlogfs/nbd.rs"]
mod nbd;

#[derive(Parser)]
#[command(
    name = "zlogfs",
    version,
    about = "A log-structured file system with transparent compression",
    after_help = "Each command's options and details: zlogfs COMMAND --help"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The fast device of an image of two devices.
    ///
    /// Made with `mkfs BULK --fast FAST`: metadata and small files live there, large files on the
    /// image given (the bulk device). Default: the path recorded when it
    /// was last opened. With mkfs, the fast device to make.
    #[arg(long, global = true, value_name = "PATH")]
    fast: Option<PathBuf>,
    /// Of an image in an object store: its local cache directory.
    ///
    /// For s3://BUCKET/PREFIX images: the cache directory holds what is not yet uploaded and caches
    /// what was read. Default: ~/.cache/zlogfs/BUCKET/PREFIX. As mount
    /// option: cache=DIR.
    #[arg(long, global = true, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Of an image in an object store: when fsync returns.
    ///
    /// local (the default): when the cache directory holds the data (uploads follow
    /// at each full segment and checkpoint); remote: when the bucket
    /// holds it. As mount option: sync=local|remote.
    #[arg(long, global = true, value_name = "MODE")]
    s3_sync: Option<zlogfs_s3::SyncMode>,
    /// Of an image in an object store: how much its cache keeps.
    ///
    /// Bytes of already uploaded segments the cache directory keeps (default 1G). As mount option:
    /// cache_size=SIZE.
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    cache_size: Option<u64>,
}

/// How to open an image in an object store (the global flags, or the
/// mount options).
#[derive(Debug, Clone, Default)]
pub(crate) struct S3Flags {
    pub cache: Option<PathBuf>,
    pub sync: Option<zlogfs_s3::SyncMode>,
    pub cache_size: Option<u64>,
}

impl S3Flags {
    /// The flags as mount options (for the mount daemon).
    fn as_options(&self) -> Vec<String> {
        let mut o = Vec::new();
        if let Some(c) = &self.cache {
            o.push(format!("cache={}", absolute(c).display()));
        }
        if let Some(s) = self.sync {
            o.push(format!("sync={}", if s == zlogfs_s3::SyncMode::Remote { "remote" } else { "local" }));
        }
        if let Some(n) = self.cache_size {
            o.push(format!("cache_size={n}"));
        }
        o
    }
}

/// An image's other parts, from the global flags (or a mount's options):
/// its fast device, and how to open an image in an object store. Each
/// command that opens an image is handed one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Parts {
    /// The fast device (--fast, fast=); else the path the image recorded.
    pub fast: Option<PathBuf>,
    /// Of an image in a bucket: --cache, --s3-sync, --cache-size.
    pub s3: S3Flags,
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
    /// Mount an image on a directory through FUSE.
    ///
    /// In the background unless -f. Unmount with `fusermount3 -u DIR`, `umount DIR`, or
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
        /// background daemon logs; default the system log),
        /// ro,snapshot=NAME (the named snapshot as it was), ro,at=TIME (the
        /// newest snapshot at or before TIME: ISO 8601, a date, a duration
        /// ago such as 2h, or a clock token of `zlogfs changes`),
        /// snapdir=hidden|visible|off (DIR/.snapshots/NAME/ reads each
        /// snapshot read-only; hidden, the default, leaves it out of the
        /// root's listing), cache=DIR, sync=local|remote, cache_size=SIZE
        /// (of an image in a bucket, as --cache, --s3-sync, --cache-size),
        /// ro,refresh=SECONDS (a read-only mount of an image in a bucket
        /// moves to the writer's newest uploaded state this often;
        /// default 5, 0 never), block_cache=SIZE (decompressed blocks the
        /// daemon keeps; default 128M, for `zlogfs nbd` an eighth of
        /// memory), index_cache=SIZE (decoded index blocks the daemon
        /// keeps; default 256M).
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
    /// Copy a directory tree into an image without mounting it.
    ///
    /// The image is made (with the format options below) if it does not
    /// exist.
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
    ///
    /// TARGET is an image or the mount point of a mounted one.
    Du {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Path inside the image.
        #[arg(default_value = "/")]
        path: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Report what an image holds: space, tree, codecs, index, writes.
    ///
    /// TARGET is an image (opened read-only, recovered in memory
    /// if needed) or the mount point of a mounted one (its daemon answers).
    Stats {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// What each operation costs since the mount: count and latency
        /// percentiles per operation (each FUSE request kind, commit,
        /// fsync, cleaning), time in compression, decompression and device
        /// I/O, bytes and cache hits. Needs a mount point.
        #[arg(long)]
        latency: bool,
        /// Print the latency figures of each interval, like `iostat 1`,
        /// until interrupted (or --count intervals). Needs a mount point.
        #[arg(long)]
        watch: bool,
        /// Seconds between --watch reports.
        #[arg(long, default_value = "1", value_name = "SECONDS")]
        interval: f64,
        /// Stop --watch after this many reports.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// Machine-readable output (with --watch, one JSON object per line).
        #[arg(long)]
        json: bool,
    },
    /// Free the segments with the most dead space by moving their data.
    ///
    /// The live data moves out of the segments with the most dead space,
    /// small files repacked together, and those segments are freed.
    /// TARGET is an image, or the mount point of a mounted one (the pass
    /// then runs in the mount's daemon, which reports its progress).
    Clean {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Clean at most this many segments (default: all worth cleaning).
        #[arg(long)]
        segments: Option<usize>,
        /// Leave segments alone that are more than this fraction live; 1
        /// moves everything written before the pass began (and stores
        /// files with a cold form, `user.zlogfs.cold`, in it; automatic
        /// points of history keep the old blocks: room for both is needed).
        #[arg(long, default_value = "0.9")]
        max_live: f64,
        /// Of an image of two devices: move the file data of the fast
        /// device's oldest segments down to the bulk device (the mount
        /// does it by itself when the fast device runs short).
        #[arg(long)]
        demote: bool,
        /// Machine-readable report.
        #[arg(long)]
        json: bool,
    },
    /// Check every checksum and cross-reference of an image.
    ///
    /// Exit status 0
    /// when clean, 1 with a report when not. TARGET is an image or the
    /// mount point of a mounted one (checked live, read-only).
    Fsck {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Mend first what can be mended (a damaged superblock from its
        /// copy, index runs whose index or filter block is damaged), then
        /// check. Writes to the image: not on a mounted one.
        #[arg(long)]
        repair: bool,
        /// Memory for the tables of inodes and blocks, in bytes (K, M, G
        /// suffixes). An image whose tables need more is checked in several
        /// passes, each over a span of inode numbers or of segments: slower,
        /// in the same memory. The caches add about 48 MiB.
        #[arg(long, value_parser = parse_size, default_value_t = zfs::CHECK_MEMORY as u64)]
        memory: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Read every stored block and verify its checksum, at a rate limit.
    ///
    /// Reads every stored block of file data (and the index) at a rate
    /// limit so that a mount goes on serving; reports
    /// damaged blocks with the files and byte ranges they hold. Exit
    /// status 0 when clean, 1 with a report. TARGET is an image or the
    /// mount point of a mounted one (its daemon reads).
    Scrub {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Read at most this many bytes per second (K, M, G suffixes; 0:
        /// unlimited). Default: 100M on a mount, unlimited on an image.
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
        /// Machine-readable report.
        #[arg(long)]
        json: bool,
    },
    /// Serve the image's regular files as NBD block devices.
    ///
    /// Exports are named by their path: nbd+unix:///vm/disk.raw?socket=PATH), until SIGTERM
    /// or Ctrl-C. A mounted image serves them from its daemon instead
    /// (mount -o nbd=PATH).
    #[command(group(clap::ArgGroup::new("at").required(true).args(["socket", "listen"])))]
    Nbd {
        /// The image.
        image: PathBuf,
        /// Listen on a Unix socket at this path.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Listen on TCP at HOST:PORT (no TLS, no authentication: a trusted
        /// network only).
        #[arg(long, value_name = "HOST:PORT")]
        listen: Option<String>,
        /// Make a volume first, unless PATH exists: PATH:SIZE, e.g.
        /// vm/disk.raw:10G (directories made as needed). May be repeated.
        #[arg(long, value_name = "PATH:SIZE")]
        create: Vec<String>,
        /// Chunk size of the volumes --create makes (the unit a 4 KiB read
        /// decompresses): 4K to the image's chunk size [default: 16K, or
        /// the image's when smaller; see docs/decisions/ on volume chunks]
        #[arg(long, value_name = "SIZE")]
        chunk_size: Option<String>,
        /// Compression unit of the volumes --create makes: whole chunks
        /// written together are compressed together in blocks of up to this
        /// size (4K to 1M; the chunk size or less: each chunk alone)
        /// [default: 64K; see docs/decisions/ on compression units]
        #[arg(long, value_name = "SIZE")]
        unit: Option<String>,
        /// Cold form of the volumes --create makes: how the cleaner stores
        /// the chunks it moves (data that stayed put), "UNIT CODEC", or
        /// "none" to store them as writes do; `zlogfs clean --max-live 1`
        /// moves everything now [default: "256K zstd:9"; see
        /// docs/decisions/ on the cold form]
        #[arg(long, value_name = "\"UNIT CODEC\"")]
        cold: Option<String>,
        /// Options as for mount: ro (serve read-only), commit=S, log=LEVEL, ...
        #[arg(short = 'o', value_name = "OPTS")]
        options: Vec<String>,
    },
    /// Make everything written so far durable.
    ///
    /// On a mount point this is
    /// what sync(1) does for other file systems (it does not reach a FUSE
    /// daemon); on an image, recovery's result is written and checkpointed.
    Sync {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Create, list and delete named snapshots; set the history policy.
    ///
    /// `create` one of everything written so far, `list` them, `delete`
    /// one. A snapshot mounts read-only with
    /// `zlogfs mount IMAGE DIR -o ro,snapshot=NAME` (or `-o ro,at=TIME`),
    /// and is served over NBD with `zlogfs nbd IMAGE -o ro,snapshot=NAME`.
    /// While any exists,
    /// the blocks it reads stay allocated (the cleaner moves them).
    Snapshot {
        /// create, list or delete.
        #[arg(value_parser = ["create", "list", "delete", "policy"])]
        action: String,
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// The snapshot's name (create and delete), or the retention
        /// policy of automatic points to set (policy; without it, shows
        /// the policy): "none" or e.g. "all:1h,hourly:2d,daily:31d".
        name: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List the paths that changed since a point.
    ///
    /// Paths created, deleted, renamed (old and new) and changed (data or
    /// metadata), read from the change
    /// records, not from a walk of the tree. Ends with a clock token to
    /// pass as --since next time. When the records needed are gone (kept
    /// 31 days), says so ("fresh instance": rescan) instead of guessing.
    Changes {
        /// The image, or a zlogfs mount point.
        target: PathBuf,
        /// Start: a clock token from an earlier call, a snapshot's name,
        /// an ISO 8601 time (2026-11-26T10:00:00Z), or a duration (2h).
        #[arg(long)]
        since: String,
        /// End, named the same ways (default: now).
        #[arg(long)]
        until: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct FormatArgs {
    /// Size of a new image file, e.g. 1G, 512M (ignored for devices);
    /// default 1G. Of an image in a bucket: the most it may hold (nothing
    /// is allocated); default 1T.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
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
    /// Automatic points of history to keep: ages such as the default
    /// "all:1h,hourly:2d,daily:31d" (every commit for an hour, then one
    /// an hour for two days, then one a day for 31 days), or "none".
    /// What only they hold counts as free space: a writer short of room
    /// drops the oldest before it gets ENOSPC. Change it later with
    /// `zlogfs snapshot policy TARGET SPEC`.
    #[arg(long, default_value = "all:1h,hourly:2d,daily:31d")]
    history: zfs::HistoryPolicy,
    /// With --fast: size of a new fast device file (ignored for a block
    /// device). Default: an eighth of --size.
    #[arg(long, value_parser = parse_size)]
    fast_size: Option<u64>,
    /// With --fast: files larger than this keep their data on the bulk
    /// device; smaller ones, directories and metadata stay on the fast one.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    small_file_max: u64,
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
    // Arguments need not be UTF-8 (file names need not be): clap reads
    // them as OS strings; here only the helper form needs text.
    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let name = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
    // mount.fuse3 (what mount(8) runs for type fuse.zlogfs when there is no
    // mount.fuse.zlogfs) runs `zlogfs IMAGE DIR -o OPTIONS` from PATH.
    let helper_form = argv.get(1).is_some_and(|a| {
        !a.starts_with('-')
            && a != "help"
            && !<Cli as clap::CommandFactory>::command().get_subcommands().any(|c| c.get_name() == a)
    });
    if name.starts_with("mount.") || (helper_form && argv.len() >= 3) {
        if let Some(bad) = std::env::args_os().skip(1).find(|a| a.to_str().is_none()) {
            return finish(Err(format!(
                "{}: mount(8)'s form takes UTF-8 paths and options; use `zlogfs mount IMAGE DIR`",
                bad.to_string_lossy()
            )));
        }
        return finish(mount::helper(&argv[1..]));
    }
    let cli = Cli::parse();
    let parts = Parts {
        fast: cli.fast.as_deref().map(absolute),
        s3: S3Flags { cache: cli.cache.clone(), sync: cli.s3_sync, cache_size: cli.cache_size },
    };
    if !matches!(cli.cmd, Cmd::Mount { .. }) {
        if let Err(e) = logging::init(None, logging::Sink::Stderr) {
            return finish(Err(e));
        }
    }
    let r = match cli.cmd {
        Cmd::Mount { image, dir, mut options, foreground } => {
            // The global flags reach the daemon as mount options
            // (--fast was once dropped here, so a two-device image
            // mounted with the recorded path instead).
            options.extend(parts.s3.as_options());
            if let Some(f) = &parts.fast {
                options.push(format!("fast={}", f.display()));
            }
            mount::mount(&image, &dir, &options, foreground)
        }
        Cmd::Mkfs { image, fmt, force } => mkfs(&image, &fmt, force, &parts).map(|_| ExitCode::SUCCESS),
        Cmd::Import { dir, image, fmt, json } => import(&dir, &image, &fmt, json, &parts),
        Cmd::Export { image, dir, path, json } => export(&image, &dir, &path, json, &parts),
        Cmd::Ls { image, path, json } => ls(&image, &path, json, &parts),
        Cmd::Cat { image, path } => cat(&image, &path, &parts),
        Cmd::Stat { image, path, json } => stat(&image, &path, json, &parts),
        Cmd::Du { target, path, json } => admin::du(&target, &parts, &path, json),
        Cmd::Stats { target, latency: false, watch: false, json, .. } => admin::stats(&target, &parts, json),
        Cmd::Stats { target, watch: false, json, .. } => admin::latency(&target, json),
        Cmd::Stats { target, interval, count, json, .. } => admin::watch(&target, interval, count, json),
        Cmd::Fsck { target, repair, memory, json } => admin::fsck(&target, &parts, repair, memory, json),
        Cmd::Clean { target, segments, max_live, demote, json } => {
            admin::clean(&target, &parts, segments, max_live, demote, json)
        }
        Cmd::Sync { target, json } => admin::sync(&target, &parts, json),
        Cmd::Snapshot { action, target, name, json } => {
            admin::snapshot(&target, &parts, &action, name.as_deref(), json)
        }
        Cmd::Changes { target, since, until, json } => {
            admin::changes(&target, &parts, &since, until.as_deref(), json)
        }
        Cmd::Nbd { image, socket, listen, create, chunk_size, unit, cold, options } => {
            let at = match (socket, listen) {
                (Some(p), _) => nbd::Listen::Unix(p),
                (None, Some(a)) => nbd::Listen::Tcp(a),
                (None, None) => return finish(Err("give --socket PATH or --listen HOST:PORT".into())),
            };
            let layout = nbd::VolumeLayout { chunk: chunk_size, unit, cold };
            nbd::nbd(&image, &parts, at, &create, &layout, &options)
        }
        Cmd::Scrub { target, rate, json } => admin::scrub(&target, &parts, rate, json),
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

/// The size of the image mkfs makes at `path`: a block device's own, else
/// `size`; refused when `path` is a directory, or exists without `force`.
fn target_size(path: &Path, size: u64, force: bool) -> Result<u64, String> {
    let is_dev = std::fs::metadata(path)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    if path.is_dir() {
        return Err(format!(
            "{} is a directory: give an image file (it is created) or a block device",
            path.display()
        ));
    }
    if path.exists() && !force {
        return Err(format!("{} already exists; pass --force to overwrite it", path.display()));
    }
    if is_dev {
        FileStore::len_bytes(path).map_err(|e| format!("cannot size {}: {e}", path.display()))
    } else {
        Ok(size)
    }
}

fn mkfs(image: &Path, f: &FormatArgs, force: bool, parts: &Parts) -> Result<(), String> {
    let s3 = s3_url(image)?;
    let size = match &s3 {
        Some(_) if force => {
            return Err(format!(
                "{}: --force cannot empty a bucket: delete the prefix's objects first",
                image.display()
            ))
        }
        Some(_) => f.size.unwrap_or(1 << 40),
        None => target_size(image, f.size.unwrap_or(1 << 30), force)?,
    };
    let fast = parts.fast.as_ref();
    let fast_size = match fast {
        Some(p) => Some(target_size(p, f.fast_size.unwrap_or(size / 8), force)?),
        None if f.fast_size.is_some() => {
            return Err("--fast-size is the size of the --fast PATH device".into())
        }
        None => None,
    };
    let segment_size = match f.segment_size {
        Some(s) => u32::try_from(s).map_err(|_| "segment size too large".to_string())?,
        None if size < 1 << 30 => 1 << 20,
        None => DEFAULT_SEGMENT_SIZE,
    };
    let segments = |bytes: u64| {
        let n = bytes.saturating_sub(META_AREA_SIZE) / u64::from(segment_size);
        Geometry { segment_size, segment_count: u32::try_from(n).unwrap_or(u32::MAX) }
    };
    let geometry = segments(size);
    validate_geometry(geometry).map_err(|e| format!("cannot make an image of {size} bytes: {e}"))?;
    let small = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} is too large"));
    let o = MkfsOptions {
        chunk_size: small(f.chunk_size, "chunk size")?,
        pack_bytes: small(f.pack_size, "pack size")?,
        inline_max: small(f.inline_max, "inline limit")?,
        codec: f.codec,
        root_uid: nix::unistd::getuid().as_raw(),
        root_gid: nix::unistd::getgid().as_raw(),
        history: f.history,
        small_max: f.small_file_max,
    };
    let create = |p: &Path, g: Geometry| {
        FileStore::create(p, g).map_err(|e| format!("cannot create {}: {e}", p.display()))
    };
    let store: Arc<dyn Store> = match (fast, fast_size) {
        (Some(fp), Some(fsize)) => {
            if absolute(fp) == absolute(image) {
                return Err(format!(
                    "--fast {} is the image itself: the fast device must be another file or device",
                    fp.display()
                ));
            }
            let fg = segments(fsize);
            if fg.segment_count < 4 {
                return Err(format!(
                    "the fast device of {fsize} bytes holds {} segments of {segment_size} bytes; it needs \
                     at least 4 (--fast-size {})",
                    fg.segment_count,
                    META_AREA_SIZE + 4 * u64::from(segment_size)
                ));
            }
            let (bulk, fst) = (create(image, geometry)?, create(fp, fg)?);
            let names = (absolute(fp).display().to_string(), absolute(image).display().to_string());
            let two =
                TwoStore::new(Arc::new(fst), Arc::new(bulk), names, false).map_err(|e| e.to_string())?;
            eprintln!(
                "fast device {}: {} segments ({} MiB): metadata, small files (up to {} KiB), packs",
                fp.display(),
                fg.segment_count,
                fg.capacity() >> 20,
                o.small_max >> 10
            );
            Arc::new(two)
        }
        _ if s3.is_some() => {
            let opts = s3_options(s3.clone().ok_or("no address")?, false, &parts.s3);
            let store = zlogfs_s3::S3Store::create(opts, geometry).map_err(|e| e.to_string())?;
            Arc::new(store)
        }
        _ => Arc::new(create(image, geometry)?),
    };
    zfs::mkfs(store.clone(), &o).map_err(|e| format!("{}: {e}", image.display()))?;
    // An image in a bucket is there once uploaded.
    store.close().map_err(|e| format!("{}: {e}", image.display()))?;
    let sb = engine::read_superblock(store.as_ref()).map_err(|e| e.to_string())?;
    let g = store.geometry();
    eprintln!(
        "created {}: {} segments of {} KiB ({} MiB), chunks of {} KiB, codec {}, history {}, uuid {}",
        image.display(),
        g.segment_count,
        g.segment_size / 1024,
        g.capacity() >> 20,
        o.chunk_size / 1024,
        o.codec,
        o.history,
        sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    Ok(())
}

/// `p` made absolute (a daemon works from `/`; a superblock records it).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The store of `image`, its file locked (shared when `read_only`; a
/// process that has it open gets a few seconds to let go: `fusermount3
/// -u` returns before the daemon has finished closing the image, and a
/// command run right after it should not fail for that): its file, or,
/// when its superblock says it is the bulk device of two, joined with its
/// fast device (`parts.fast`, else the path its superblock recorded).
pub(crate) fn open_image(image: &Path, read_only: bool, parts: &Parts) -> Result<Arc<dyn Store>, String> {
    if let Some(url) = s3_url(image)? {
        return open_s3(url, read_only, parts);
    }
    let open = |p: &Path| {
        if read_only {
            wait_for_lock(p, || FileStore::open_read_only(p))
        } else {
            wait_for_lock(p, || FileStore::open(p))
        }
    };
    let at = |e: String| format!("{}: {e}", image.display());
    let f = open(image)?;
    let sb = engine::read_superblock(&f).map_err(|e| at(e.to_string()))?;
    let fast = parts.fast.as_deref();
    match sb.role {
        Role::Single => {
            if let Some(p) = fast {
                return Err(at(format!(
                    "a one-device image: --fast {} is for images made with `zlogfs mkfs --fast`",
                    p.display()
                )));
            }
            Ok(Arc::new(f.with_geometry(sb.geometry).map_err(|e| at(e.to_string()))?))
        }
        Role::Fast => Err(at(format!(
            "this is the fast device of a two-device image: give its bulk device{} instead, with --fast {}",
            if sb.partner.is_empty() { String::new() } else { format!(" ({})", sb.partner) },
            image.display()
        ))),
        Role::Bulk => {
            let path = match fast {
                Some(p) => p.to_path_buf(),
                None if !sb.partner.is_empty() => PathBuf::from(&sb.partner),
                None => {
                    return Err(at("the bulk device of two: give its fast device with --fast PATH".into()))
                }
            };
            let ff = open(&path).map_err(|e| at(format!("its fast device: {e}")))?;
            let names = (absolute(&path).display().to_string(), absolute(image).display().to_string());
            store::check_pair(&ff, &f, &names).map_err(|e| at(e.to_string()))?;
            let recorded = store::check_not_a_copy(&ff, &names).map_err(|e| at(e.to_string()))?;
            let g = |n: u32| Geometry { segment_size: sb.geometry.segment_size, segment_count: n };
            let fast_segs = sb.fast_segments;
            let ff = ff.with_geometry(g(fast_segs)).map_err(|e| format!("{}: {e}", path.display()))?;
            let f =
                f.with_geometry(g(sb.geometry.segment_count - fast_segs)).map_err(|e| at(e.to_string()))?;
            let moved = sb.partner != names.0 || recorded != names.1;
            let two = TwoStore::new(Arc::new(ff), Arc::new(f), names, true).map_err(|e| at(e.to_string()))?;
            if !read_only {
                if moved {
                    two.record_names().map_err(|e| at(format!("recording the devices' new paths: {e}")))?;
                }
                // Any copy of either device taken before now is older
                // than the pair from here on.
                two.advance_generation().map_err(|e| at(e.to_string()))?;
            }
            Ok(Arc::new(two))
        }
    }
}

/// The address of an image in an object store, when `image` is one.
pub(crate) fn s3_url(image: &Path) -> Result<Option<zlogfs_s3::S3Url>, String> {
    match image.to_str().and_then(zlogfs_s3::S3Url::parse) {
        None => Ok(None),
        Some(r) => r.map(Some),
    }
}

/// The cache directory of `url` when none is given:
/// $XDG_CACHE_HOME (else ~/.cache) /zlogfs/BUCKET/PREFIX.
fn default_cache(url: &zlogfs_s3::S3Url) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    let prefix = if url.prefix.is_empty() { "_".to_string() } else { url.prefix.replace('/', "%") };
    base.join("zlogfs").join(&url.bucket).join(prefix)
}

fn s3_options(url: zlogfs_s3::S3Url, read_only: bool, f: &S3Flags) -> zlogfs_s3::S3Options {
    let cache = f.cache.as_deref().map(absolute).unwrap_or_else(|| default_cache(&url));
    let mut o = zlogfs_s3::S3Options::new(url, cache);
    o.sync = f.sync.unwrap_or_default();
    o.read_only = read_only;
    o.cache_bytes = f.cache_size.unwrap_or(o.cache_bytes);
    o
}

/// Open an image in an object store, waiting a few seconds for another
/// process to let go of its cache directory (as [`wait_for_lock`]).
fn open_s3(url: zlogfs_s3::S3Url, read_only: bool, parts: &Parts) -> Result<Arc<dyn Store>, String> {
    if let Some(f) = &parts.fast {
        return Err(format!(
            "{url}: --fast {} is for images of two devices; an image in a bucket keeps its fast part in \
             its cache directory (--cache)",
            f.display()
        ));
    }
    let opts = s3_options(url, read_only, &parts.s3);
    let start = std::time::Instant::now();
    loop {
        match zlogfs_s3::S3Store::open(opts.clone()) {
            Ok(s) => return Ok(Arc::new(s)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && start.elapsed().as_secs() < 5 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// `open` an image, waiting a few seconds for another process to let go of
/// it (see [`open_image`]).
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

/// Decoded index blocks a command that reads an image caches (a mount
/// caches 256 MiB). fsck, stats, du and scrub read most blocks once: at
/// a mount's size the cache was most of their peak memory (issue 45).
const TOOL_INDEX_CACHE: usize = 32 << 20;
/// Decoded file data the same commands cache (a mount: 128 MiB); export
/// and cat still read a pack of small files once for all its files.
const TOOL_DATA_CACHE: usize = 16 << 20;

/// Open an image for a command that only reads it: read-only, with a
/// shared lock, so that it works on an image the caller may not write (mode
/// 0444, immutable, a read-only medium) and beside other readers.
fn open_fs_ro(image: &Path, parts: &Parts) -> Result<Fs, String> {
    let f = open_image(image, true, parts)?;
    let opts = FsOptions {
        engine: Options { background: false, cache_bytes: TOOL_INDEX_CACHE, ..Options::default() },
        cache_bytes: TOOL_DATA_CACHE,
        commit_interval: None,
        atime: zfs::Atime::Noatime,
        read_only: true,
        ..FsOptions::default()
    };
    Fs::open(f, opts).map_err(|e: zfs::Error| format!("{}: {e}", image.display()))
}

/// Open an image for a command that writes it (import, clean, repair):
/// the index is flushed and merged on a thread of its own, beside the
/// command's work, as on a mount (issue 45: inline, the merges of a
/// ten-million-file import slowed its last tenth by half).
fn open_fs(image: &Path, parts: &Parts, atime: zfs::Atime) -> Result<Fs, String> {
    let f = open_image(image, false, parts)?;
    let opts = FsOptions { engine: Options::default(), commit_interval: None, atime, ..FsOptions::default() };
    Fs::open(f, opts).map_err(|e: zfs::Error| format!("{}: {e}", image.display()))
}

fn close(fs: Fs, image: &Path) -> Result<(), String> {
    fs.close().map_err(|e| format!("closing {}: {e}", image.display()))
}

fn resolve(fs: &Fs, path: &str) -> Result<zfs::Ino, String> {
    tools::resolve(fs, path).map_err(|e| e.to_string())
}

fn import(dir: &Path, image: &Path, f: &FormatArgs, json: bool, parts: &Parts) -> Res {
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

fn export(image: &Path, dir: &Path, path: &str, json: bool, parts: &Parts) -> Res {
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

fn ls(image: &Path, path: &str, json: bool, parts: &Parts) -> Res {
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

fn cat(image: &Path, path: &str, parts: &Parts) -> Res {
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

fn stat(image: &Path, path: &str, json: bool, parts: &Parts) -> Res {
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
