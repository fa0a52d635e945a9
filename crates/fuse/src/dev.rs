//! The `/dev/fuse` transport: the INIT handshake, and a loop that reads
//! requests with read(2) and answers them with writev(2).
//!
//! With io_uring (see [`super::ring`]) this loop still runs: the kernel
//! sends FORGET and INTERRUPT this way, and any request queued before the
//! rings were ready.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::abi::{self, init, InHeader, InitIn, InitOut, Op};
use crate::serve::{Handler, Reply};

/// What the handshake settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The kernel's protocol minor version.
    pub kernel_minor: u32,
    /// The capabilities both sides use.
    pub flags: u64,
    /// The kernel may leave out OPENDIR and RELEASEDIR when told ENOSYS.
    pub no_opendir: bool,
    /// Requests come through io_uring once its queues are registered.
    pub uring: bool,
    /// Largest WRITE (and READ) payload.
    pub max_write: u32,
    /// The size each io_uring payload buffer must have (the kernel's
    /// `max(8192, max_write, max_pages * page size)`).
    pub payload_size: usize,
}

/// The capabilities we ask for (each only where the kernel offers it).
const WANT: u64 = init::ASYNC_READ
    | init::BIG_WRITES
    | init::MAX_PAGES
    | init::DO_READDIRPLUS
    | init::READDIRPLUS_AUTO
    | init::PARALLEL_DIROPS
    | init::CACHE_SYMLINKS
    // Not ASYNC_DIO: with it the kernel completes asynchronous direct
    // writes (io_uring, libaio) without dropping the pages a buffered
    // reader cached while the write was in flight, and later buffered
    // reads return the old data (generic/451). Without it such a write
    // waits in its submitter and the kernel drops those pages after it.
    // The kernel enforces POSIX ACLs (stored as xattrs) and leaves the
    // umask to us, so that a directory's default ACL can replace it.
    | init::POSIX_ACL
    | init::DONT_MASK
    // The set-ID bits are ours to clear (the kernel's fallback misses
    // set-group-ID without group execute, and fallocate): the kernel says
    // when the caller has no CAP_FSETID, and when an ACL write clears
    // set-group-ID.
    // File handles (open_by_handle_at, an NFS export) outlive the
    // kernel's caches: it looks a node up by id ("." and "..").
    | init::EXPORT_SUPPORT
    | init::HANDLE_KILLPRIV_V2
    | init::SETXATTR_EXT
    | init::INIT_EXT;

/// Read the kernel's INIT from `dev` and answer it, asking for io_uring if
/// `uring` (and the kernel offers it).
pub fn handshake(dev: &File, max_write: u32, uring: bool) -> io::Result<Negotiated> {
    let mut buf = vec![0u8; read_buffer_size(max_write)];
    loop {
        let n = read_request(dev, &mut buf, Duration::ZERO, false)?
            .ok_or_else(|| io::Error::other("unmounted before INIT"))?;
        let (h, arg, _) = abi::split_dev(&buf[..n], 0).map_err(bad)?;
        if h.opcode != abi::op::INIT {
            send(dev, h.unique, -libc::EIO, &[]);
            return Err(io::Error::other(format!("FUSE request {} before INIT", h.opcode)));
        }
        let i = InitIn::parse(arg).map_err(bad)?;
        if i.major > abi::MAJOR {
            // The kernel answers with an INIT in our version.
            send(dev, h.unique, 0, &[&InitOut::version_only()]);
            continue;
        }
        if i.major < abi::MAJOR || i.minor < abi::MIN_KERNEL_MINOR {
            send(dev, h.unique, -libc::EPROTO, &[]);
            return Err(io::Error::other(format!(
                "the kernel speaks FUSE {}.{}; zlogfs needs {}.{} or later (Linux 4.3)",
                i.major,
                i.minor,
                abi::MAJOR,
                abi::MIN_KERNEL_MINOR
            )));
        }
        let want = if uring { WANT | init::OVER_IO_URING } else { WANT };
        let flags = want & i.flags;
        let page = 4096u32;
        let max_write = max_write.max(page);
        let max_pages = max_write.div_ceil(page).min(u16::MAX as u32) as u16;
        let out = InitOut {
            flags,
            max_readahead: i.max_readahead.min(max_write),
            max_background: 16,
            congestion_threshold: 12,
            max_write,
            max_pages,
        };
        send(dev, h.unique, 0, &[&out.encode()]);
        return Ok(Negotiated {
            kernel_minor: i.minor,
            flags,
            no_opendir: i.flags & init::NO_OPENDIR_SUPPORT != 0,
            uring: flags & init::OVER_IO_URING != 0,
            max_write,
            payload_size: 8192.max(max_write as usize).max(max_pages as usize * page as usize),
        });
    }
}

fn bad(e: abi::Bad) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed FUSE request: {}", e.0))
}

/// A read buffer the kernel accepts: room for the largest write.
pub fn read_buffer_size(max_write: u32) -> usize {
    max_write as usize + 8192
}

/// Read one request; `None` once the file system is unmounted. On a
/// `nonblocking` descriptor, keep trying for `spin` (yielding the CPU
/// between tries), then wait in poll(2).
fn read_request(dev: &File, buf: &mut [u8], spin: Duration, nonblocking: bool) -> io::Result<Option<usize>> {
    let start = Instant::now();
    loop {
        match (&*dev).read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && nonblocking => {
                if start.elapsed() < spin {
                    std::thread::yield_now();
                } else {
                    let mut fds = [PollFd::new(dev.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            // ENOENT: the request was interrupted before we read it.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)) => {}
            // ENODEV: unmounted (ECONNABORTED: aborted through fusectl).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ECONNABORTED)) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Write a reply: header and body parts in one writev.
pub fn send(dev: &File, unique: u64, error: i32, parts: &[&[u8]]) {
    let body: usize = parts.iter().map(|p| p.len()).sum();
    let header = abi::out_header(unique, error, body);
    let mut iov = Vec::with_capacity(parts.len() + 1);
    iov.push(IoSlice::new(&header));
    iov.extend(parts.iter().map(|p| IoSlice::new(p)));
    match (&*dev).write_vectored(&iov) {
        Ok(n) if n == abi::OUT_HEADER + body => {}
        Ok(n) => tracing::warn!("FUSE reply cut short ({n} of {} bytes)", abi::OUT_HEADER + body),
        // ENOENT: the request was interrupted and is gone; ENODEV:
        // unmounted. Neither is ours to report.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => {}
        Err(e) => tracing::warn!("FUSE reply: {e}"),
    }
}

/// The offset that asks [`notify_inval_inode`] to drop attributes only.
pub const ATTRS_ONLY: u64 = u64::MAX;

/// FUSE_NOTIFY_INVAL_INODE: the notification code, sent in a reply
/// header's error field with unique 0.
const NOTIFY_INVAL_INODE: i32 = 2;

/// Tell the kernel to drop its cached pages of `[off, off + len)` of
/// `ino` (and its attributes): the file changed behind its back. An inode
/// the kernel does not hold (ENOENT) has nothing to drop. `off` of
/// [`ATTRS_ONLY`] drops the attributes alone, which takes no lock a
/// request in progress may hold (safe from inside a handler).
pub fn notify_inval_inode(dev: &File, ino: u64, off: u64, len: u64) {
    let mut body = [0u8; 24];
    body[..8].copy_from_slice(&ino.to_le_bytes());
    let off = if off == ATTRS_ONLY { -1 } else { off.min(i64::MAX as u64) as i64 };
    body[8..16].copy_from_slice(&off.to_le_bytes());
    body[16..].copy_from_slice(&(len.min(i64::MAX as u64) as i64).to_le_bytes());
    send(dev, 0, NOTIFY_INVAL_INODE, &[&body]);
}

/// Requests that come this close to each other are a burst: the reader
/// spins for the next.
const BURST: Duration = Duration::from_millis(1);

/// Serve requests read from `dev` until the file system is unmounted.
///
/// While requests come in a burst (the last two within [`BURST`]), the
/// reader looks for the next one for `spin` before it sleeps, yielding the
/// CPU between tries: a request then finds the reader awake, and costs no
/// wakeup of a thread that may sit halted on another CPU. On 2 vCPUs that
/// halve the time of `cp -a` and read-back through `/dev/fuse`
/// (docs/decisions/2026-11-25-spinning-dev-fuse-reader.md). A sparse stream is not spun for.
pub fn serve(dev: Arc<File>, max_write: u32, handler: &dyn Handler, spin: Duration) -> io::Result<()> {
    let mut buf = vec![0u8; read_buffer_size(max_write)];
    if !spin.is_zero() {
        let fl = OFlag::from_bits_truncate(fcntl(&*dev, FcntlArg::F_GETFL)?);
        fcntl(&*dev, FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    }
    let mut last = Instant::now();
    let mut burst = false;
    while let Some(n) =
        read_request(&dev, &mut buf, if burst { spin } else { Duration::ZERO }, !spin.is_zero())?
    {
        let now = Instant::now();
        burst = now.duration_since(last) < BURST;
        last = now;
        let msg = &buf[..n];
        let (h, arg, data) = match abi::split_dev(msg, handler.flags()) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("{}", bad(e));
                if let Ok(h) = InHeader::parse(msg) {
                    send(&dev, h.unique, -libc::EIO, &[]);
                }
                continue;
            }
        };
        match Op::parse(h.opcode, arg, data) {
            // FORGETs: the handler counts them; nothing is sent back.
            Ok(op) if op.no_reply() => crate::serve::dispatch(handler, &h, op, Reply::none(h.unique)),
            Ok(Op::Interrupt) => {
                // ENOSYS to an interrupt: the kernel sends no more of them
                // and waits for the interrupted request's own reply. (An
                // INTERRUPT's unique has the kernel's interrupt bit set.)
                send(&dev, h.unique, -libc::ENOSYS, &[]);
            }
            Ok(op) => crate::serve::dispatch(handler, &h, op, Reply::dev(Arc::clone(&dev), h.unique)),
            Err(e) => {
                tracing::warn!("{} (operation {})", bad(e), h.opcode);
                send(&dev, h.unique, -libc::EIO, &[]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asynchronous_direct_io_is_not_asked_for() {
        // See WANT: with it, buffered reads after an asynchronous direct
        // write may return old data (tests/mount.rs checks the effect).
        assert_eq!(WANT & init::ASYNC_DIO, 0);
    }
}
