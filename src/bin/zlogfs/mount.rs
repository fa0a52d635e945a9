//! `zlogfs mount`: option parsing, the daemon, signals, and the
//! `mount.fuse.zlogfs` helper that mount(8) and /etc/fstab use.

use std::io::{BufRead, BufReader, Write};
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use zlogfs::control;
use zlogfs_engine::engine::Options;
use zlogfs_fs::{Atime, Fs, FsOptions, Live, SyncMode};
use zlogfs_fuse::{self as fuse, MountOptions, Snapdir, Uring};

use super::logging::{self, Sink};
use super::Res;

/// Set in the environment of the daemon child: it reports on stdout.
const READY_ENV: &str = "ZLOGFS_DAEMON_READY";

/// The commit interval without `-o commit`.
const COMMIT: Duration = Duration::from_secs(5);

/// How often a read-only mount of an image in a bucket looks for a newer
/// state without `-o refresh`.
const REFRESH: Duration = Duration::from_secs(5);
/// The longest `-o refresh`: well inside the minute a writer keeps what a
/// newer state replaced (crates/s3, `keep_replaced`).
const MAX_REFRESH: Duration = Duration::from_secs(30);

/// What `-o` gives, with the file system's own options apart.
pub struct Parsed {
    pub mount: MountOptions,
    pub atime: Atime,
    /// Reading a directory updates its atime (`-o nodiratime`: never).
    pub diratime: bool,
    /// `-o sync` and `-o dirsync`.
    pub sync: SyncMode,
    /// Store small overwrites as patches (the default; `-o nopatches`
    /// turns it off).
    pub patches: bool,
    /// `-o log=LEVEL`: what the daemon logs (as `ZLOGFS_LOG` says).
    pub log: Option<String>,
    /// `-o logfile=PATH`: where the background daemon logs (else the
    /// system log).
    pub logfile: Option<PathBuf>,
    /// `-o commit=SECONDS`: the commit interval.
    pub commit: Duration,
    /// `-o metrics=HOST:PORT`: serve the figures for Prometheus there.
    pub metrics: Option<String>,
    /// `-o nbd=PATH`: serve the image's files as NBD exports on a Unix
    /// socket there.
    pub nbd: Option<PathBuf>,
    /// `-o ro,snapshot=NAME`: mount the named snapshot.
    pub snapshot: Option<String>,
    /// `-o ro,at=TIME`: mount the newest kept point at or before TIME (or
    /// the one a clock token names).
    pub at: Option<String>,
    /// `-o fast=PATH`: the fast device of an image of two.
    pub fast: Option<PathBuf>,
    /// `-o cache=DIR,sync=local|remote,cache_size=SIZE`: of an image in
    /// an object store.
    pub s3: super::S3Flags,
    /// `-o refresh=SECONDS`: how often a read-only mount of an image in a
    /// bucket looks for the writer's newer state (0: never).
    pub refresh: Option<Duration>,
    /// `-o block_cache=SIZE`: the bound of the cache of decompressed
    /// blocks (None: the file system's default, or [`super::nbd`]'s).
    pub block_cache: Option<usize>,
    /// `-o index_cache=SIZE`: the bound of the engine's cache of decoded
    /// index blocks (None: the engine's default, 256 MiB).
    pub index_cache: Option<usize>,
    /// `-o pressure=on|off`: free the caches under memory pressure
    /// (src/bin/zlogfs/pressure.rs; on by default).
    pub pressure: bool,
}

/// Parse a `-o` list (several `-o` are joined). Every generic option of
/// mount(8) is accepted: those that are flags of mount(2) go to the kernel
/// ([`fuse::MountFlags`]), and the file system applies those that mean
/// something to it (the atime options, nodiratime, sync, dirsync); the
/// options only mount(8) and fstab read, and those that mean nothing for
/// a FUSE file system (mand, iversion), are accepted and ignored, as other
/// FUSE file systems do.
pub fn parse_options(lists: &[String], image: &Path) -> Result<Parsed, String> {
    let mut p = Parsed {
        mount: MountOptions { fsname: image.display().to_string(), ..MountOptions::default() },
        atime: Atime::Relatime,
        diratime: true,
        sync: SyncMode::Lazy,
        patches: true,
        log: None,
        logfile: None,
        commit: COMMIT,
        metrics: None,
        nbd: None,
        fast: None,
        s3: super::S3Flags::default(),
        snapshot: None,
        at: None,
        refresh: None,
        block_cache: None,
        index_cache: None,
        pressure: true,
    };
    for opt in lists.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|o| !o.is_empty()) {
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        if v.is_none() && p.mount.flags.apply(k) {
            p.generic(k);
        } else if !p.own(k, v)? && !ignored(k) {
            return Err(format!(
                "unknown mount option {opt:?} (known: the generic options of mount(8), and allow_other, \
                 default_permissions, patches, nopatches, uring[=on|off|auto], spin=US, attr_timeout=S, \
                 entry_timeout=S, negative_timeout=S, threads=N, commit=SECONDS, metrics=HOST:PORT, nbd=PATH, snapshot=NAME, at=TIME, snapdir=hidden|visible|off, log=LEVEL, logfile=PATH, fast=PATH, cache=DIR, sync=local|remote, cache_size=SIZE, refresh=SECONDS, block_cache=SIZE, index_cache=SIZE, pressure=on|off)"
            ));
        }
    }
    if p.snapshot.is_some() && !p.mount.read_only {
        return Err("a snapshot mounts read-only: give -o ro,snapshot=NAME".into());
    }
    if p.at.is_some() && !p.mount.read_only {
        return Err("the past mounts read-only: give -o ro,at=TIME".into());
    }
    if p.snapshot.is_some() || p.at.is_some() {
        // A mount of the past has no past of its own to show.
        p.mount.snapdir = Snapdir::Off;
    }
    Ok(p)
}

impl Parsed {
    /// What a generic option of mount(8), a flag of mount(2), means to
    /// the file system too.
    fn generic(&mut self, k: &str) {
        match k {
            "noatime" => self.atime = Atime::Noatime,
            "atime" | "relatime" | "norelatime" | "nostrictatime" => self.atime = Atime::Relatime,
            "strictatime" => self.atime = Atime::Strict,
            "nodiratime" => self.diratime = false,
            "diratime" => self.diratime = true,
            "sync" => self.sync = SyncMode::All,
            "async" => self.sync = SyncMode::Lazy,
            "dirsync" if self.sync == SyncMode::Lazy => self.sync = SyncMode::Dirs,
            _ => {}
        }
    }

    /// Apply option `k` (`=v`) if it is one of FUSE's or zlogfs's own;
    /// false if it is not.
    fn own(&mut self, k: &str, v: Option<&str>) -> Result<bool, String> {
        match k {
            "ro" => self.mount.read_only = true,
            "rw" => self.mount.read_only = false,
            "allow_other" | "allow_root" => self.mount.allow_other = true,
            "attr_timeout" => self.mount.attr_timeout = secs(k, v)?,
            "entry_timeout" => self.mount.entry_timeout = secs(k, v)?,
            "negative_timeout" => self.mount.negative_timeout = secs(k, v)?,
            "uring" => {
                self.mount.uring = match v {
                    None | Some("on") => Uring::On,
                    Some("off") => Uring::Off,
                    Some("auto") => Uring::Auto,
                    Some(v) => return Err(format!("option uring={v}: give on, off or auto")),
                }
            }
            "nouring" => self.mount.uring = Uring::Off,
            "spin" => {
                let us = number(k, v, 0..=100_000, "microseconds, e.g. spin=200 (0: never)")?;
                self.mount.spin = Duration::from_micros(us);
            }
            "patches" => self.patches = true,
            "nopatches" => self.patches = false,
            "threads" => self.mount.threads = number(k, v, 1..=64, "threads, e.g. threads=4")? as usize,
            "log" => {
                let v = v.ok_or("option log needs a level, e.g. log=debug")?;
                crate::logging::check_filter(v).map_err(|e| format!("option log={v}: {e}"))?;
                self.log = Some(v.to_string());
            }
            "logfile" => self.logfile = Some(PathBuf::from(v.ok_or("option logfile needs a path")?)),
            "commit" => {
                // As ext4's: 0 means the default.
                let s = number(k, v, 0..=86_400, "seconds, e.g. commit=5 (0: the default, 5)")?;
                self.commit = if s == 0 { COMMIT } else { Duration::from_secs(s) };
            }
            "nbd" => self.nbd = Some(PathBuf::from(v.ok_or("option nbd needs the path of a Unix socket")?)),
            "refresh" => self.refresh = Some(secs(k, v)?),
            "block_cache" => self.block_cache = Some(cache_size(k, v)?),
            "index_cache" => self.index_cache = Some(cache_size(k, v)?),
            "pressure" => {
                self.pressure = match v {
                    Some("on") => true,
                    Some("off") => false,
                    _ => {
                        return Err(
                            "option pressure needs on or off (free the caches under memory pressure)".into()
                        )
                    }
                }
            }
            "sync" => {
                let v = v.ok_or("option sync=MODE needs local or remote")?;
                self.s3.sync = Some(v.parse().map_err(|e| format!("option sync: {e}"))?);
            }
            "cache" => {
                let p = v.ok_or("option cache needs the path of a cache directory")?;
                self.s3.cache = Some(super::absolute(Path::new(p)));
            }
            "cache_size" => {
                let v = v.ok_or("option cache_size needs a size, e.g. cache_size=4G")?;
                self.s3.cache_size =
                    Some(super::parse_size(v).map_err(|e| format!("option cache_size: {e}"))?);
            }
            "fast" => {
                let p = v.ok_or("option fast needs the path of the image's fast device")?;
                self.fast = Some(super::absolute(Path::new(p)));
            }
            "snapdir" => {
                self.mount.snapdir = match v {
                    Some("hidden") => Snapdir::Hidden,
                    Some("visible") => Snapdir::Visible,
                    Some("off") => Snapdir::Off,
                    _ => return Err("option snapdir: give hidden, visible or off".into()),
                }
            }
            "snapshot" => {
                self.snapshot = Some(v.ok_or("option snapshot needs a name (zlogfs snapshot list)")?.into())
            }
            "at" => {
                let t = v.ok_or("option at needs a time (2026-11-26T10:00:00Z, 2h) or a clock token")?;
                if !t.starts_with("zlogfs:") {
                    zlogfs_fs::parse_time(t).map_err(|e| format!("option at: {e}"))?;
                }
                self.at = Some(t.into());
            }
            "metrics" => {
                let a = v.ok_or("option metrics needs HOST:PORT, e.g. metrics=127.0.0.1:9184")?;
                a.to_socket_addrs().map_err(|e| format!("option metrics={a}: {e} (give HOST:PORT)"))?;
                self.metrics = Some(a.to_string());
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Options accepted and ignored, as other FUSE file systems do.
fn ignored(k: &str) -> bool {
    matches!(
        k,
        // Always on: the kernel checks permissions.
        "default_permissions"
        // Read by mount(8) and fstab only.
        | "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner" | "group" | "nofail"
        | "_netdev" | "x-systemd.automount"
        // Nothing for a FUSE file system: mandatory locks are gone from
        // Linux (5.15), and i_version is the kernel's own.
        | "mand" | "nomand" | "iversion" | "noiversion"
        // SELinux labels: a FUSE mount takes none.
        | "context" | "fscontext" | "defcontext" | "rootcontext"
    ) || k.starts_with("x-")
        || k.starts_with("comment")
}

/// The value of option `k` in seconds, 0 to a day.
fn secs(k: &str, v: Option<&str>) -> Result<Duration, String> {
    let v = v.ok_or_else(|| format!("option {k} needs a value in seconds, e.g. {k}=1"))?;
    let s: f64 = v.parse().map_err(|_| format!("option {k}={v}: not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&s) {
        return Err(format!("option {k}={v}: give 0 to 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// The value of option `k`, a whole number in `range` of `what`.
fn number(k: &str, v: Option<&str>, range: std::ops::RangeInclusive<u64>, what: &str) -> Result<u64, String> {
    let v = v.ok_or_else(|| format!("option {k} needs a number of {what}"))?;
    v.parse().ok().filter(|n| range.contains(n)).ok_or_else(|| {
        format!(
            "option {k}={v}: give {} to {} {}",
            range.start(),
            range.end(),
            what.split(',').next().unwrap_or(what)
        )
    })
}

fn preflight(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("mount point {} is not a directory", dir.display())),
        Err(e) => return Err(format!("mount point {}: {e} (create it with mkdir -p)", dir.display())),
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing: load the module (modprobe fuse) and install fuse3 \
                    (apt-get install fuse3)"
            .into());
    }
    let root = nix::unistd::geteuid().is_root();
    let have_fusermount = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").exists()));
    if !root && !have_fusermount {
        return Err("fusermount3 is not installed: apt-get install fuse3 (or mount as root)".into());
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Err(format!(
            "cannot open /dev/fuse: {e}{}",
            if root {
                ""
            } else {
                " (a standard install makes it mode 0666; ask root to chmod 0666 /dev/fuse, or mount as root)"
            }
        ));
    }
    Ok(())
}

/// The global flags (--fast, --cache, --s3-sync, --cache-size) over the
/// `-o` options: a flag given wins, as `zlogfs mount` passes the flags to
/// its daemon after the user's options (the last of an option wins).
pub fn with_flags(p: &mut Parsed, parts: &super::Parts) {
    if let Some(f) = &parts.fast {
        p.fast = Some(f.clone());
    }
    if let Some(c) = &parts.s3.cache {
        p.s3.cache = Some(super::absolute(c));
    }
    p.s3.sync = parts.s3.sync.or(p.s3.sync);
    p.s3.cache_size = parts.s3.cache_size.or(p.s3.cache_size);
}

pub fn open_for_mount(image: &Path, p: &Parsed) -> Result<Fs, String> {
    // Read-only, the image is opened so (with a shared lock): it may be
    // read-only to the caller, and other read-only users may share it.
    let parts = super::Parts { fast: p.fast.clone(), s3: p.s3.clone() };
    let f = super::open_image(image, p.mount.read_only, &parts)?;
    Fs::open(f, fs_options(p)).map_err(|e: zlogfs_fs::Error| format!("{}: {e}", image.display()))
}

/// The file system's options a mount's `-o` list gives.
fn fs_options(p: &Parsed) -> FsOptions {
    FsOptions {
        engine: Options {
            cache_bytes: p.index_cache.unwrap_or(Options::default().cache_bytes),
            ..Options::default()
        },
        atime: p.atime,
        read_only: p.mount.read_only,
        diratime: p.diratime,
        sync: p.sync,
        patches: p.patches,
        commit_interval: Some(p.commit),
        snapshot: p.snapshot.clone(),
        at: p.at.clone(),
        cache_bytes: p.block_cache.unwrap_or(FsOptions::default().cache_bytes),
        ..FsOptions::default()
    }
}

/// The size option `k=v` of a cache, in bytes.
fn cache_size(k: &str, v: Option<&str>) -> Result<usize, String> {
    let v = v.ok_or_else(|| format!("option {k} needs a size, e.g. {k}=1G"))?;
    let n = super::parse_size(v).map_err(|e| format!("option {k}: {e}"))?;
    usize::try_from(n).map_err(|_| format!("option {k}={v}: too large"))
}

/// How often a mount of `image` looks for a newer state: a read-only
/// mount of an image in a bucket follows its writer (every 5 seconds
/// unless `-o refresh` says otherwise; not with `-o nbd`, whose exports
/// stay on the state they opened).
fn refresh_interval(image: &Path, p: &Parsed) -> Result<Option<Duration>, String> {
    let bucket = super::s3_url(image)?.is_some();
    match p.refresh {
        Some(_) if !bucket || !p.mount.read_only => {
            Err("option refresh is for read-only mounts of an image in a bucket (-o ro,refresh=SECONDS)"
                .into())
        }
        Some(_) if p.nbd.is_some() => {
            Err("option refresh: a mount that serves NBD (-o nbd) does not follow \
                                          its writer; give one of them"
                .into())
        }
        Some(d) if d.is_zero() => Ok(None),
        Some(d) if d > MAX_REFRESH => Err(format!(
            "option refresh: at most {} seconds (the writer keeps what a newer state replaced for a \
             minute; a reader that refreshes less often may find it gone)",
            MAX_REFRESH.as_secs()
        )),
        Some(d) => Ok(Some(d)),
        None if bucket && p.mount.read_only && p.nbd.is_none() => Ok(Some(REFRESH)),
        None => Ok(None),
    }
}

/// The thread of a mount that follows its writer: it looks for a newer
/// state every interval, until dropped.
struct Follower {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Follower {
    fn start(live: Arc<Live>, every: Duration) -> Result<Follower, String> {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("zlogfs-follow".into())
            .spawn(move || loop {
                {
                    let stopped = s.0.lock().unwrap_or_else(|p| p.into_inner());
                    let stopped = match s.1.wait_timeout_while(stopped, every, |stop| !*stop) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                    if *stopped {
                        return;
                    }
                }
                match live.refresh() {
                    Ok(true) => tracing::info!("following the writer: now at the image's newest state"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("looking for the writer's newer state: {e}"),
                }
            })
            .map_err(|e| format!("cannot start the refresh thread: {e}"))?;
        Ok(Follower { stop, thread: Some(thread) })
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the refresh thread panicked");
            }
        }
    }
}

/// `zlogfs mount IMAGE DIR [-o OPTS] [-f]`.
pub fn mount(image: &Path, dir: &Path, opts: &[String], foreground: bool) -> Res {
    let parsed = parse_options(opts, image)?;
    preflight(dir)?;
    let daemon_child = std::env::var_os(READY_ENV).is_some();
    let sink = match (&parsed.logfile, daemon_child) {
        (Some(p), _) => Sink::File(p),
        (None, true) => Sink::Syslog,
        (None, false) => Sink::Stderr,
    };
    logging::init(parsed.log.as_deref(), sink).map_err(|e| ready_fail(daemon_child, e))?;
    if !daemon_child && parsed.mount.uring == Uring::Auto && fuse::uring_off_in_kernel() {
        eprintln!(
            "zlogfs: note: serving through /dev/fuse; FUSE over io_uring makes each request several \
             times cheaper: mount with -o uring as root (it sets /sys/module/fuse/parameters/enable_uring)"
        );
    }
    if !foreground && !daemon_child {
        return spawn_daemon(image, dir, opts);
    }
    // The figures of `stats --latency` count from here.
    zlogfs_engine::metrics::global();
    let refresh = refresh_interval(image, &parsed).map_err(|e| ready_fail(daemon_child, e))?;
    let fs = Arc::new(open_for_mount(image, &parsed).map_err(|e| ready_fail(daemon_child, e))?);
    let live = Arc::new(match refresh {
        Some(_) => Live::following(Arc::clone(&fs), fs_options(&parsed)),
        None => Live::fixed(Arc::clone(&fs)),
    });
    drop(fs);
    let control = start_control(&live, image, dir).map_err(|e| ready_fail(daemon_child, e))?;
    let nbd = match &parsed.nbd {
        Some(p) => Some(
            crate::nbd::Server::start(
                crate::nbd::Listen::Unix(p.clone()),
                live.get(),
                parsed.mount.read_only,
            )
            .map_err(|e| ready_fail(daemon_child, e))?,
        ),
        None => None,
    };
    let endpoint = match &parsed.metrics {
        Some(a) => {
            Some(crate::metrics_http::serve(a, Arc::clone(&live)).map_err(|e| ready_fail(daemon_child, e))?)
        }
        None => None,
    };
    let (session, mut unmounter) = fuse::mount(Arc::clone(&live), dir, &parsed.mount)
        .map_err(|e| ready_fail(daemon_child, format!("cannot mount on {}: {e}", dir.display())))?;
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let mp = dir.to_path_buf();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            if let Err(e) = unmounter.unmount() {
                report(&format!("unmounting {} on a signal: {e}", mp.display()));
            }
        }
    });
    if daemon_child {
        // The parent reads this line and exits; nothing is written to
        // stdout afterwards.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    } else {
        eprintln!(
            "zlogfs: {} mounted on {} ({}); unmount with fusermount3 -u or Ctrl-C",
            image.display(),
            dir.display(),
            session.transport()
        );
    }
    let pressure = parsed.pressure.then(|| crate::pressure::Watch::start(Arc::clone(&live))).flatten();
    let follower = match refresh {
        Some(every) => {
            Some(Follower::start(Arc::clone(&live), every).map_err(|e| ready_fail(daemon_child, e))?)
        }
        None => None,
    };
    let served = session.run();
    drop(follower);
    drop(pressure);
    drop(control);
    drop(endpoint);
    drop(nbd);
    let closed = close_when_free(live, image);
    served.map_err(|e| format!("serving {}: {e}", dir.display()))?;
    closed?;
    if !daemon_child {
        eprintln!("zlogfs: {} unmounted, image closed cleanly", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Serve the control channel of the mount on `dir` (docs/CONTROL.md), for
/// this process's user and root. `zlogfs nbd` serves its image's with the
/// image as `dir`.
pub fn start_control(live: &Arc<Live>, image: &Path, dir: &Path) -> Result<control::Server, String> {
    // Before the mount: once mounted, resolving the path would ask this
    // process, which does not serve yet.
    let mountpoint = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
    let image = image.canonicalize().unwrap_or_else(|_| image.to_path_buf());
    let owner = nix::unistd::geteuid().as_raw();
    let path = control::socket_path(&mountpoint, owner);
    let handler = control::handler(Arc::clone(live), control::Info { image, mountpoint });
    control::Server::start(path.clone(), owner, handler)
        .map_err(|e| format!("cannot serve the control socket {}: {e}", path.display()))
}

/// Close the file system once the session and the control channel let go
/// of it (a control request still running is waited for, up to a minute):
/// close writes a checkpoint so that the next open has nothing to replay.
/// The session synced as it ended (`Session::run`).
pub fn close_when_free(live: Arc<Live>, image: &Path) -> Result<(), String> {
    let (mut live, mut fs) = (Some(live), None);
    for _ in 0..600 {
        if let Some(l) = live.take() {
            match Arc::try_unwrap(l) {
                Ok(l) => fs = Some(l.into_inner()),
                Err(l) => live = Some(l),
            }
        }
        if let Some(f) = fs.take() {
            match Arc::try_unwrap(f) {
                Ok(f) => return f.close().map_err(|e| format!("closing {}: {e}", image.display())),
                Err(f) => fs = Some(f),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("the file system is still in use a minute after the unmount: closed without a checkpoint".to_string())
}

/// In the daemon child, an error before the mount is ready goes to the
/// parent (stdout), which prints it.
fn ready_fail(daemon_child: bool, e: String) -> String {
    if daemon_child {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "error: {e}");
        let _ = out.flush();
    }
    e
}

/// stderr of a daemon is /dev/null; of a foreground mount, the terminal.
fn report(msg: &str) {
    let _ = writeln!(std::io::stderr(), "zlogfs: {msg}");
}

/// Start this program again in the background (its own process group, so
/// a terminal's Ctrl-C does not reach it) and wait until it has mounted.
fn spawn_daemon(image: &Path, dir: &Path, opts: &[String]) -> Res {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(abs(image)).arg(abs(dir));
    for o in opts {
        cmd.arg("-o").arg(o);
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .env(READY_ENV, "1")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the mount daemon: {e}"))?;
    let out = child.stdout.take().ok_or("no pipe from the mount daemon")?;
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    match line.trim_end() {
        "ready" => Ok(ExitCode::SUCCESS),
        l => {
            let status = child.wait().map_err(|e| e.to_string())?;
            Err(l.strip_prefix("error: ").map_or_else(
                || format!("the mount daemon exited ({status}) before mounting"),
                str::to_string,
            ))
        }
    }
}

/// Run as `mount.fuse.zlogfs`: mount, or pass a remount back to mount(8)
/// (`-i`: without helpers), which changes the kernel's flags itself.
pub fn helper(args: &[String]) -> Res {
    let (image, dir, opts, foreground) = helper_args(args)?;
    if opts.iter().flat_map(|o| o.split(',')).any(|o| o == "remount") {
        let st = Command::new("mount")
            .arg("-i")
            .arg("-o")
            .arg(opts.join(","))
            .arg(&dir)
            .status()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        return if st.success() {
            Ok(ExitCode::SUCCESS)
        } else {
            Err(format!("remount of {} failed", dir.display()))
        };
    }
    mount(&image, &dir, &opts, foreground)
}

/// The arguments of the `mount.fuse.zlogfs` helper: mount(8) runs it as
/// `mount.fuse.zlogfs IMAGE DIR [-sfnv] [-o OPTS]`.
pub fn helper_args(args: &[String]) -> Result<(PathBuf, PathBuf, Vec<String>, bool), String> {
    let mut pos = Vec::new();
    let mut opts = Vec::new();
    let mut foreground = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => opts.push(it.next().ok_or("-o needs a value")?.clone()),
            "-f" => foreground = true,
            "-t" => {
                it.next();
            }
            s if s.starts_with("-o") => opts.push(s[2..].to_string()),
            s if s.starts_with('-') => {} // -s, -n, -v: nothing to do
            s => pos.push(s.to_string()),
        }
    }
    let remount = opts.iter().flat_map(|o| o.split(',')).any(|o| o == "remount");
    match pos.as_slice() {
        [img, dir] => Ok((PathBuf::from(img), PathBuf::from(dir), opts, foreground)),
        [dir] if remount => Ok((PathBuf::new(), PathBuf::from(dir), opts, foreground)),
        _ => Err("usage: mount.fuse.zlogfs IMAGE DIR [-o OPTIONS]".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A global flag wins over its -o option; an option without a flag
    /// stays (zlogfs nbd, as zlogfs mount).
    #[test]
    fn flags_win_over_options_they_name() {
        let opts = ["cache=/o/cache,cache_size=5M,fast=/o/fast".to_string()];
        let mut p = parse_options(&opts, Path::new("i")).unwrap();
        with_flags(&mut p, &super::super::Parts::default());
        assert_eq!(p.s3.cache.as_deref(), Some(Path::new("/o/cache")));
        assert_eq!(p.s3.cache_size, Some(5 << 20));
        assert_eq!(p.fast.as_deref(), Some(Path::new("/o/fast")));
        let flags = super::super::Parts {
            fast: Some("/f/fast".into()),
            s3: super::super::S3Flags { cache: Some("/f/cache".into()), cache_size: Some(7), sync: None },
        };
        with_flags(&mut p, &flags);
        assert_eq!(p.s3.cache.as_deref(), Some(Path::new("/f/cache")));
        assert_eq!(p.s3.cache_size, Some(7));
        assert_eq!(p.fast.as_deref(), Some(Path::new("/f/fast")));
    }

    #[test]
    fn options_parse_and_reject() {
        let p = parse_options(
            &["ro,allow_other,attr_timeout=0".into(), "noatime,defaults".into()],
            Path::new("i"),
        )
        .unwrap();
        assert!(p.mount.read_only && p.mount.allow_other);
        assert_eq!(p.mount.attr_timeout, Duration::ZERO);
        assert_eq!(p.atime, Atime::Noatime);
        // Patches are on unless turned off.
        assert!(p.patches);
        assert!(!parse_options(&["nopatches".into()], Path::new("i")).unwrap().patches);
        assert!(parse_options(&["nopatches,patches".into()], Path::new("i")).unwrap().patches);
        assert!(parse_options(&["bogus".into()], Path::new("i")).is_err());
        assert!(parse_options(&["attr_timeout=x".into()], Path::new("i")).is_err());
        assert!(parse_options(&["threads=0".into()], Path::new("i")).is_err());
        // io_uring: auto unless asked.
        let uring = |o: &str| parse_options(&[o.into()], Path::new("i")).map(|p| p.mount.uring);
        assert_eq!(uring("ro"), Ok(Uring::Auto));
        assert_eq!(uring("uring"), Ok(Uring::On));
        assert_eq!(uring("uring=off"), Ok(Uring::Off));
        assert_eq!(uring("nouring"), Ok(Uring::Off));
        assert_eq!(uring("uring=auto"), Ok(Uring::Auto));
        assert!(uring("uring=maybe").is_err());
        let spin = |o: &str| parse_options(&[o.into()], Path::new("i")).map(|p| p.mount.spin);
        assert_eq!(spin("ro"), Ok(Duration::from_micros(200)));
        assert_eq!(spin("spin=0"), Ok(Duration::ZERO));
        assert!(spin("spin").is_err() && spin("spin=-1").is_err() && spin("spin=1000000").is_err());
        let commit = |o: &str| parse_options(&[o.into()], Path::new("i")).map(|p| p.commit);
        assert_eq!(commit("commit=30"), Ok(Duration::from_secs(30)));
        assert_eq!(commit("commit=0"), Ok(COMMIT), "0 is the default, as on ext4");
        assert_eq!(commit("rw"), Ok(COMMIT));
        assert!(commit("commit").is_err() && commit("commit=x").is_err() && commit("commit=100000").is_err());
        let caches =
            |o: &str| parse_options(&[o.into()], Path::new("i")).map(|p| (p.block_cache, p.index_cache));
        assert_eq!(caches("block_cache=64M,index_cache=32M"), Ok((Some(64 << 20), Some(32 << 20))));
        assert_eq!(caches("rw"), Ok((None, None)));
        assert!(caches("index_cache").is_err() && caches("index_cache=lots").is_err());
        let pressure = |o: &str| parse_options(&[o.into()], Path::new("i")).map(|p| p.pressure);
        assert_eq!(
            (pressure("rw"), pressure("pressure=off"), pressure("pressure=on")),
            (Ok(true), Ok(false), Ok(true))
        );
        assert!(pressure("pressure").is_err() && pressure("pressure=no").is_err());
        let metrics = |o: &str| parse_options(&[o.into()], Path::new("i")).map(|p| p.metrics);
        assert_eq!(metrics("metrics=127.0.0.1:9184"), Ok(Some("127.0.0.1:9184".into())));
        assert!(metrics("metrics").is_err() && metrics("metrics=nowhere").is_err());
        let (i, d, o, f) =
            helper_args(&["img".into(), "/mnt".into(), "-o".into(), "rw,noatime".into(), "-n".into()])
                .unwrap();
        assert_eq!(
            (i, d, o, f),
            (PathBuf::from("img"), PathBuf::from("/mnt"), vec!["rw,noatime".to_string()], false)
        );
        assert!(helper_args(&["img".into()]).is_err());
        // Every generic option of mount(8) is taken; the flags reach the
        // kernel, and the file system applies what means something to it.
        let p = parse_options(
            &["nodiratime,lazytime,iversion,nosymfollow,mand,dirsync,silent,nosuid,nodev,noexec".into()],
            Path::new("i"),
        )
        .unwrap();
        let f = p.mount.flags;
        for flag in [libc::MS_NOSYMFOLLOW, libc::MS_DIRSYNC, libc::MS_NOSUID, libc::MS_NODEV, libc::MS_NOEXEC]
        {
            assert!(f.has(flag), "{flag:#x}");
        }
        assert!(!p.diratime);
        assert_eq!(p.sync, SyncMode::Dirs);
        let p = parse_options(&["sync,dirsync,strictatime".into()], Path::new("i")).unwrap();
        assert_eq!((p.sync, p.atime), (SyncMode::All, Atime::Strict));
        assert!(p.mount.flags.has(libc::MS_SYNCHRONOUS));
        let p = parse_options(&["nosuid,suid".into()], Path::new("i")).unwrap();
        assert!(!p.mount.flags.has(libc::MS_NOSUID), "a later option wins");
    }
}
