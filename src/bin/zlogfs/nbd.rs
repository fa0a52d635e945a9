//! `zlogfs nbd` and `mount -o nbd=`: the regular files of an image served
//! as NBD exports (crates/nbd) on a Unix socket or a TCP address, a
//! thread per client.

use std::collections::HashMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use zlogfs_fs::{Fs, SetAttr, ROOT};

use super::Res;

/// Where to listen.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A Unix socket at this path.
    Unix(PathBuf),
    /// A TCP address (HOST:PORT).
    Tcp(String),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "nbd+unix:///?socket={}", p.display()),
            Listen::Tcp(a) => write!(f, "nbd://{a}/"),
        }
    }
}

/// One accepted connection: its two halves.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn shutdown(&self) {
        let r = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
        };
        if let Err(e) = r {
            tracing::debug!("nbd: hanging up a client: {e}");
        }
    }
}

/// The connected clients by id: a handle of the socket to hang up on,
/// and the thread serving it.
type Clients = Arc<Mutex<HashMap<u64, (Conn, Option<JoinHandle<()>>)>>>;

/// The server while it serves; dropping it hangs up on every client,
/// waits for their threads and stops listening.
pub struct Server {
    at: Listen,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    conns: Clients,
}

impl Server {
    /// Listen at `at` and serve `fs`'s files (`read_only`: refuse changes).
    pub fn start(at: Listen, fs: Arc<Fs>, read_only: bool) -> Result<Server, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Clients::default();
        let (flag, c) = (Arc::clone(&stop), Arc::clone(&conns));
        let accept = match &at {
            // Nonblocking: the accepting thread looks at `stop` between tries.
            Listen::Unix(p) => {
                let l = bind_unix(p)?;
                l.set_nonblocking(true).map_err(|e| format!("{}: {e}", p.display()))?;
                std::thread::spawn(move || {
                    let accept =
                        || l.accept().and_then(|(s, _)| s.set_nonblocking(false).map(|()| Conn::Unix(s)));
                    accept_loop(accept, &flag, &c, &fs, read_only)
                })
            }
            Listen::Tcp(a) => {
                let l = TcpListener::bind(a).map_err(|e| format!("cannot listen on {a}: {e}"))?;
                l.set_nonblocking(true).map_err(|e| format!("{a}: {e}"))?;
                std::thread::spawn(move || {
                    let accept =
                        || l.accept().and_then(|(s, _)| s.set_nonblocking(false).map(|()| Conn::Tcp(s)));
                    accept_loop(accept, &flag, &c, &fs, read_only)
                })
            }
        };
        Ok(Server { at, stop, accept: Some(accept), conns })
    }
}

/// A Unix socket at `p`, mode 0600 (the volumes are the server's user's:
/// chmod the socket to share them); one left by a server that died is
/// replaced.
fn bind_unix(p: &Path) -> Result<UnixListener, String> {
    zlogfs::control::remove_stale_socket(p, "another server already").map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AlreadyExists => e.to_string(),
        _ => format!("removing the stale socket {}: {e}", p.display()),
    })?;
    let l = UnixListener::bind(p).map_err(|e| format!("cannot listen on {}: {e}", p.display()))?;
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("making {} private: {e}", p.display()))?;
    Ok(l)
}

fn accept_loop(
    accept: impl Fn() -> std::io::Result<Conn> + Copy,
    stop: &AtomicBool,
    conns: &Clients,
    fs: &Arc<Fs>,
    ro: bool,
) {
    static IDS: AtomicU64 = AtomicU64::new(0);
    while let Some(conn) = zlogfs::control::accept_or_stop(accept, stop) {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("nbd: accepting a client: {e}");
                continue;
            }
        };
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        let (keep, fs, cs) = (clone_conn(&conn), Arc::clone(fs), Arc::clone(conns));
        let Some(keep) = keep else { continue };
        let t = std::thread::spawn(move || {
            let r = match conn {
                Conn::Unix(s) => s.try_clone().and_then(|w| zlogfs_nbd::serve_client(s, w, &fs, ro)),
                Conn::Tcp(s) => {
                    // Replies go out whole: no delay for the next request.
                    let _ = s.set_nodelay(true);
                    s.try_clone().and_then(|w| zlogfs_nbd::serve_client(s, w, &fs, ro))
                }
            };
            if let Err(e) = r {
                tracing::info!("nbd: a client's connection ended: {e}");
            }
            cs.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        });
        conns.lock().unwrap_or_else(|p| p.into_inner()).insert(id, (keep, Some(t)));
    }
}

fn clone_conn(c: &Conn) -> Option<Conn> {
    let r = match c {
        Conn::Unix(s) => s.try_clone().map(Conn::Unix),
        Conn::Tcp(s) => s.try_clone().map(Conn::Tcp),
    };
    r.map_err(|e| tracing::warn!("nbd: a client's socket: {e}")).ok()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let threads: Vec<JoinHandle<()>> = {
            let mut cs = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            cs.values_mut()
                .filter_map(|(c, t)| {
                    c.shutdown();
                    t.take()
                })
                .collect()
        };
        for t in threads {
            let _ = t.join();
        }
        if let Listen::Unix(p) = &self.at {
            // A socket removed behind the server's back is no error.
            let r = std::fs::remove_file(p).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            });
            if let Err(e) = r {
                tracing::warn!("nbd: removing the socket {}: {e}", p.display());
            }
        }
    }
}

/// The chunk size of volumes made by `--create` when `--chunk-size` is not
/// given (the image's when that is smaller): 4 KiB random reads
/// decompress a sixteenth of what 64 KiB chunks make them decompress, and
/// space costs little
/// (docs/decisions/2026-11-25-volume-chunk-size.md).
pub const VOLUME_CHUNK: u32 = 16 << 10;

/// The compression unit of volumes made by `--create` when `--unit` is not
/// given (docs/decisions/2026-11-26-compression-units.md).
pub const VOLUME_UNIT: &str = "64K";

/// The cold form of volumes made by `--create` when `--cold` is not given:
/// how the cleaner stores the chunks it moves
/// (docs/decisions/2026-11-26-cold-form.md).
pub const VOLUME_COLD: &str = "256K zstd:9";

/// How `--create` lays out new volumes (xattr syntax, e.g. "16K").
#[derive(Default)]
pub struct VolumeLayout {
    /// Chunk size; None: [`VOLUME_CHUNK`] or the image's chunk size, the
    /// smaller.
    pub chunk: Option<String>,
    /// Compression unit; None: [`VOLUME_UNIT`].
    pub unit: Option<String>,
    /// Cold form; None: [`VOLUME_COLD`]; "none": none.
    pub cold: Option<String>,
}

/// `--create PATH:SIZE`: make a volume (its directories too) of SIZE
/// bytes, laid out as `layout` says, unless PATH exists.
pub fn create_volume(fs: &Fs, spec: &str, layout: &VolumeLayout) -> Result<(), String> {
    let (path, size) = spec
        .rsplit_once(':')
        .ok_or_else(|| format!("--create {spec}: give PATH:SIZE, e.g. vm/disk.raw:10G"))?;
    let size = super::parse_size(size).map_err(|e| format!("--create {spec}: {e}"))?;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some((name, dirs)) = parts.split_last() else {
        return Err(format!("--create {spec}: the volume needs a name"));
    };
    let mut dir = ROOT;
    for d in dirs {
        dir = match fs.lookup(dir, d.as_bytes()) {
            Ok(a) => a.ino,
            Err(_) => {
                fs.mkdir(dir, d.as_bytes(), 0o755, 0, 0)
                    .map_err(|e| format!("--create {spec}: {d}: {e}"))?
                    .ino
            }
        };
    }
    if fs.lookup(dir, name.as_bytes()).is_ok() {
        return Ok(());
    }
    let f = fs.create(dir, name.as_bytes(), 0o600, 0, 0).map_err(|e| format!("--create {spec}: {e}"))?;
    let chunk = match &layout.chunk {
        Some(c) => c.to_string(),
        None => format!("{}K", VOLUME_CHUNK.min(fs.config().chunk_size) >> 10),
    };
    let unit = layout.unit.as_deref().unwrap_or(VOLUME_UNIT);
    let cold = layout.cold.as_deref().unwrap_or(VOLUME_COLD);
    for (name_, opt, value) in [
        (zlogfs_fs::XATTR_CHUNK, "--chunk-size", chunk.as_str()),
        (zlogfs_fs::XATTR_UNIT, "--unit", unit),
        (zlogfs_fs::XATTR_COLD, "--cold", cold),
    ] {
        if name_ == zlogfs_fs::XATTR_COLD && value == "none" {
            continue;
        }
        if let Err(e) = fs.setxattr(f.ino, name_, value.as_bytes(), 0) {
            if let Err(u) = fs.unlink(dir, name.as_bytes()) {
                tracing::warn!("--create {spec}: removing the volume again: {u}");
            }
            return Err(format!("--create {spec}: {opt} {value}: {e}"));
        }
    }
    fs.setattr(f.ino, &SetAttr { size: Some(size), ..SetAttr::default() })
        .map_err(|e| format!("--create {spec}: setting the size: {e}"))?;
    fs.sync().map_err(|e| format!("--create {spec}: {e}"))
}

/// The cache of decompressed blocks of `zlogfs nbd` unless `-o
/// block_cache` says otherwise: an eighth of the memory the process may
/// use (the machine's, or its cgroup's limit when lower), from 128 MiB to
/// 4 GiB. Clients of a block device read through no page cache of the
/// server's kernel, as a mount's do, so this cache is the server's page
/// cache (nbdkit on btrfs gets the kernel's, all of free memory). None
/// when the memory is unknown (the file system's default).
fn nbd_block_cache() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let mut bytes = total.trim().trim_end_matches("kB").trim().parse::<u64>().ok()?.saturating_mul(1024);
    // cgroup v2, then v1 ("max" or a huge number when unlimited).
    for limit in ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"] {
        if let Some(n) = std::fs::read_to_string(limit).ok().and_then(|v| v.trim().parse::<u64>().ok()) {
            bytes = bytes.min(n);
        }
    }
    let want = (bytes / 8).clamp(128 << 20, 4 << 30);
    Some(usize::try_from(want).unwrap_or(usize::MAX / 4))
}

/// `zlogfs nbd IMAGE`: serve until SIGTERM, SIGINT or SIGHUP, then close
/// the image cleanly.
pub fn nbd(
    image: &Path,
    parts: &super::Parts,
    at: Listen,
    create: &[String],
    layout: &VolumeLayout,
    opts: &[String],
) -> Res {
    let mut parsed = super::mount::parse_options(opts, image)?;
    super::mount::with_flags(&mut parsed, parts);
    parsed.block_cache = parsed.block_cache.or_else(nbd_block_cache);
    let fs = Arc::new(super::mount::open_for_mount(image, &parsed)?);
    for c in create {
        create_volume(&fs, c, layout)?;
    }
    let ro = parsed.mount.read_only;
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let server = Server::start(at.clone(), Arc::clone(&fs), ro)?;
    // The admin commands reach the image through it while it is served.
    let live = Arc::new(zlogfs_fs::Live::fixed(Arc::clone(&fs)));
    let control = super::mount::start_control(&live, image, image)?;
    let pressure = parsed.pressure.then(|| crate::pressure::Watch::start(Arc::clone(&live))).flatten();
    eprintln!(
        "zlogfs: serving the files of {} at {at}{}; stop with Ctrl-C or SIGTERM",
        image.display(),
        if ro { " read-only" } else { "" }
    );
    signals.forever().next();
    drop(server);
    drop(pressure);
    drop(control);
    drop(fs);
    super::mount::close_when_free(live, image)?;
    eprintln!("zlogfs: {} closed cleanly", image.display());
    Ok(ExitCode::SUCCESS)
}
