//! Opening an image: its file (or block device) locked, joined with its
//! fast device, or in a bucket; the file system on it, for a command.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zlogfs_engine::store::{self, FileStore, Geometry, Store, TwoStore};
use zlogfs_engine::Role;
use zlogfs_engine::{engine, Options};
use zlogfs_fs::{self as zfs, Fs, FsOptions};

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
    pub(crate) fn as_options(&self) -> Vec<String> {
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

/// `p` made absolute (a daemon works from `/`; a superblock records it).
pub(crate) fn absolute(p: &Path) -> PathBuf {
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
pub(crate) fn default_cache(url: &zlogfs_s3::S3Url) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    let prefix = if url.prefix.is_empty() { "_".to_string() } else { url.prefix.replace('/', "%") };
    base.join("zlogfs").join(&url.bucket).join(prefix)
}

pub(crate) fn s3_options(url: zlogfs_s3::S3Url, read_only: bool, f: &S3Flags) -> zlogfs_s3::S3Options {
    let cache = f.cache.as_deref().map(absolute).unwrap_or_else(|| default_cache(&url));
    let mut o = zlogfs_s3::S3Options::new(url, cache);
    o.sync = f.sync.unwrap_or_default();
    o.read_only = read_only;
    o.cache_bytes = f.cache_size.unwrap_or(o.cache_bytes);
    o
}

/// Open an image in an object store, waiting a few seconds for another
/// process to let go of its cache directory (as [`wait_for_lock`]).
pub(crate) fn open_s3(
    url: zlogfs_s3::S3Url,
    read_only: bool,
    parts: &Parts,
) -> Result<Arc<dyn Store>, String> {
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
pub(crate) fn wait_for_lock(
    image: &Path,
    open: impl Fn() -> std::io::Result<FileStore>,
) -> Result<FileStore, String> {
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
pub(crate) const TOOL_INDEX_CACHE: usize = 32 << 20;
/// Decoded file data the same commands cache (a mount: 128 MiB); export
/// and cat still read a pack of small files once for all its files.
pub(crate) const TOOL_DATA_CACHE: usize = 16 << 20;

/// Open an image for a command that only reads it: read-only, with a
/// shared lock, so that it works on an image the caller may not write (mode
/// 0444, immutable, a read-only medium) and beside other readers.
pub(crate) fn open_fs_ro(image: &Path, parts: &Parts) -> Result<Fs, String> {
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
pub(crate) fn open_fs(image: &Path, parts: &Parts, atime: zfs::Atime) -> Result<Fs, String> {
    let f = open_image(image, false, parts)?;
    let opts = FsOptions { engine: Options::default(), commit_interval: None, atime, ..FsOptions::default() };
    Fs::open(f, opts).map_err(|e: zfs::Error| format!("{}: {e}", image.display()))
}

pub(crate) fn close(fs: Fs, image: &Path) -> Result<(), String> {
    fs.close().map_err(|e| format!("closing {}: {e}", image.display()))
}
