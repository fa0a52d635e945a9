//! Mounting: the kernel mount, the handshake, the choice of transport, and
//! the [`Session`] that serves until unmounted.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::adapter::ZlogFuse;
use crate::kmount::{self, Unmounter};
use crate::options::{MountOptions, Uring};
use crate::serve::Handler;
use crate::{dev, ring};
use zlogfs_fs::Live;

/// Largest write the kernel may send in one request.
pub(crate) const MAX_WRITE: u32 = 1 << 20;
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the fuse module lets file systems use io_uring: `None` if this
/// kernel has no FUSE over io_uring at all.
fn uring_enabled() -> Option<bool> {
    std::fs::read_to_string(ENABLE_URING).ok().map(|s| matches!(s.trim(), "Y" | "y" | "1"))
}

/// Whether this kernel has FUSE over io_uring but the fuse module keeps it
/// off (so `-o uring`, as root, would turn it on).
pub fn uring_off_in_kernel() -> bool {
    uring_enabled() == Some(false)
}

/// Decide whether to ask for io_uring, and set up its queues if so.
fn prepare_rings(opt: Uring) -> io::Result<Option<ring::Rings>> {
    match (opt, uring_enabled()) {
        (Uring::Off, _) | (Uring::Auto, None | Some(false)) => return Ok(None),
        (Uring::On, None) => {
            return Err(io::Error::other(
                "this kernel has no FUSE over io_uring (Linux 6.14 or later, built with \
                 CONFIG_FUSE_IO_URING): mount without -o uring",
            ))
        }
        (Uring::On, Some(false)) => {
            if !kmount::is_root() {
                return Err(io::Error::other(format!(
                    "FUSE over io_uring is off in this kernel: as root, echo Y > {ENABLE_URING} \
                     (or mount without -o uring)"
                )));
            }
            std::fs::write(ENABLE_URING, "Y")
                .map_err(|e| io::Error::new(e.kind(), format!("cannot turn on {ENABLE_URING}: {e}")))?;
        }
        (Uring::On | Uring::Auto, Some(true)) => {}
    }
    match ring::Rings::prepare() {
        Ok(r) => Ok(Some(r)),
        Err(e) if opt == Uring::On => Err(io::Error::new(e.kind(), format!("cannot set up io_uring: {e}"))),
        Err(_) => Ok(None),
    }
}

/// A mounted file system, ready to be served.
pub struct Session {
    dev: Arc<File>,
    handler: Arc<ZlogFuse>,
    max_write: u32,
    queues: Vec<JoinHandle<()>>,
}

impl Session {
    /// How requests reach the file system, for messages.
    pub fn transport(&self) -> String {
        if self.queues.is_empty() {
            "/dev/fuse".into()
        } else {
            format!("io_uring, {} queues", self.queues.len())
        }
    }

    /// Serve until the file system is unmounted; then finish the
    /// requests in progress and sync.
    pub fn run(self) -> io::Result<()> {
        // Through io_uring, /dev/fuse carries only FORGETs and the like:
        // no spinning for them.
        let spin = if self.queues.is_empty() { self.handler.opts.spin } else { Duration::ZERO };
        let served = dev::serve(Arc::clone(&self.dev), self.max_write, &*self.handler, spin);
        for q in self.queues {
            if q.join().is_err() {
                tracing::error!("an io_uring queue's thread ended in a panic (logged where it happened)");
            }
        }
        self.handler.workers.stop();
        self.handler.fs().set_invalidator(None);
        if let Err(e) = self.handler.fs().sync() {
            tracing::error!("sync at unmount: {e}");
        }
        served
    }
}

/// Mount `fs` on `dir`: the kernel mount is in place when this returns;
/// [`Session::run`] serves it until it is unmounted (by `fusermount3 -u`,
/// `umount`, or the [`Unmounter`]).
pub fn mount(live: Arc<Live>, dir: &Path, opts: &MountOptions) -> io::Result<(Session, Unmounter)> {
    let rings = prepare_rings(opts.uring)?;
    let (dev, mut unmounter) = kmount::mount(dir, opts)?;
    let dev = Arc::new(dev);
    let negotiated = match dev::handshake(&dev, MAX_WRITE, rings.is_some()) {
        Ok(n) if opts.uring == Uring::On && !n.uring => {
            Err(io::Error::other("the kernel did not take FUSE over io_uring"))
        }
        r => r,
    };
    let n = match negotiated {
        Ok(n) => n,
        Err(e) => {
            if let Some(r) = rings {
                r.stop();
            }
            let _ = unmounter.unmount();
            return Err(e);
        }
    };
    // Writes by other front ends (NBD) drop the kernel's cached pages.
    let notify = Arc::clone(&dev);
    live.get().set_invalidator(Some(Arc::new(move |ino, off, len| {
        dev::notify_inval_inode(&notify, ino, off, len)
    })));
    let handler = Arc::new(ZlogFuse::new(live, opts.clone(), &n));
    let queues = match rings {
        Some(r) if n.uring => {
            let h: Arc<dyn Handler> = handler.clone();
            r.start(&dev, n.payload_size, &h)
        }
        Some(r) => {
            r.stop();
            Vec::new()
        }
        None => Vec::new(),
    };
    Ok((Session { dev, handler, max_write: n.max_write, queues }, unmounter))
}
