//! The command line: the commands, their arguments and their help.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use zlogfs_engine::codec::CodecSpec;
use zlogfs_fs::{self as zfs};

use super::*;

#[derive(Parser)]
#[command(
    name = "zlogfs",
    version,
    about = "A log-structured file system with transparent compression",
    after_help = "Each command's options and details: zlogfs COMMAND --help"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
    /// The fast device of an image of two devices.
    ///
    /// Made with `mkfs BULK --fast FAST`: metadata and small files live there, large files on the
    /// image given (the bulk device). Default: the path recorded when it
    /// was last opened. With mkfs, the fast device to make.
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) fast: Option<PathBuf>,
    /// Of an image in an object store: its local cache directory.
    ///
    /// For s3://BUCKET/PREFIX images: the cache directory holds what is not yet uploaded and caches
    /// what was read. Default: ~/.cache/zlogfs/BUCKET/PREFIX. As mount
    /// option: cache=DIR.
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) cache: Option<PathBuf>,
    /// Of an image in an object store: when fsync returns.
    ///
    /// local (the default): when the cache directory holds the data (uploads follow
    /// at each full segment and checkpoint); remote: when the bucket
    /// holds it. As mount option: sync=local|remote.
    #[arg(long, global = true, value_name = "MODE")]
    pub(crate) s3_sync: Option<zlogfs_s3::SyncMode>,
    /// Of an image in an object store: how much its cache keeps.
    ///
    /// Bytes of already uploaded segments the cache directory keeps (default 1G). As mount option:
    /// cache_size=SIZE.
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) cache_size: Option<u64>,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
        /// keeps; default 256M), pressure=on|off (empty both caches when
        /// the kernel reports memory pressure; default on).
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
    /// Exports are named by their path (nbd+unix:///vm/disk.raw?socket=PATH);
    /// served until SIGTERM or Ctrl-C. A mounted image serves them from
    /// its daemon instead (mount -o nbd=PATH).
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
    /// Empty a mount's caches (decompressed blocks, decoded index blocks).
    ///
    /// What `echo 3 > /proc/sys/vm/drop_caches` does for the kernel's
    /// caches, for the daemon's: they fill again as requests read. For a
    /// cold measurement, and to give memory back at once; the daemon
    /// does it by itself under memory pressure. On a mount point, or the
    /// image of a running `zlogfs nbd`.
    DropCaches {
        /// A zlogfs mount point, or the image of a running `zlogfs nbd`.
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
pub(crate) struct FormatArgs {
    /// Size of a new image file, e.g. 1G, 512M (ignored for devices);
    /// default 1G. Of an image in a bucket: the most it may hold (nothing
    /// is allocated); default 1T.
    #[arg(long, value_parser = parse_size)]
    pub(crate) size: Option<u64>,
    /// Segment size, e.g. 4M (128K to 1G, a multiple of 512). Default:
    /// 1M for images under 1 GiB (so that the reserve of two segments
    /// stays small), 4M otherwise.
    #[arg(long, value_parser = parse_size)]
    pub(crate) segment_size: Option<u64>,
    /// Bytes of file data per chunk (power of two, 4K to 1M).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub(crate) chunk_size: u64,
    /// Target size of a block of small files packed together.
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    pub(crate) pack_size: u64,
    /// Files up to this size live inline in the index.
    #[arg(long, default_value = "512", value_parser = parse_size)]
    pub(crate) inline_max: u64,
    /// Default codec of file data: zstd:N (1-19), lz4, deflate:N, pred1, pred2, none.
    /// zstd:3 stores about 4% less and writes about a third slower.
    #[arg(long, default_value = "zstd:2")]
    pub(crate) codec: CodecSpec,
    /// Automatic points of history to keep: ages such as the default
    /// "all:1h,hourly:2d,daily:31d" (every commit for an hour, then one
    /// an hour for two days, then one a day for 31 days), or "none".
    /// What only they hold counts as free space: a writer short of room
    /// drops the oldest before it gets ENOSPC. Change it later with
    /// `zlogfs snapshot policy TARGET SPEC`.
    #[arg(long, default_value = "all:1h,hourly:2d,daily:31d")]
    pub(crate) history: zfs::HistoryPolicy,
    /// With --fast: size of a new fast device file (ignored for a block
    /// device). Default: an eighth of --size.
    #[arg(long, value_parser = parse_size)]
    pub(crate) fast_size: Option<u64>,
    /// With --fast: files larger than this keep their data on the bulk
    /// device; smaller ones, directories and metadata stay on the fast one.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub(crate) small_file_max: u64,
}
