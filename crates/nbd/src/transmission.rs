//! The transmission phase: requests read in order on the connection's
//! thread, served concurrently by workers (compression and decompression
//! on every core), each reply written whole under the writer's lock.

use std::io::{self, Read, Write};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Instant;

use zlogfs_engine::metrics::{self, Histogram};
use zlogfs_fs::{Error, Fs, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};

use crate::export;
use crate::handshake::{Session, MAX_PAYLOAD};
use crate::proto::*;

/// The most extents one BLOCK_STATUS reply describes.
const MAX_EXTENTS: usize = 4096;

/// A request and its payload.
type Job = (Request, Vec<u8>);

/// What a request comes to: data to send (READ), extents (BLOCK_STATUS),
/// nothing, or an error and why.
enum Outcome {
    Done,
    Data(Vec<u8>),
    Extents(Vec<(u32, u32)>),
    Failed(u32, String),
}

/// Workers per connection: 16, as nbdkit's threads. Random reads wait
/// on the device more than they use a core, so more requests in flight
/// than cores pay: fio's nbd engine, 4 KiB random reads at QD32 from a
/// cold volume, 46,400 IOPS with 2 workers and 71,600 with 16 on 2 cores;
/// 1 MiB sequential reads 1,069 and 1,932 MiB/s; writes unchanged
/// (docs/decisions/2026-11-25-volume-chunk-size.md).
pub fn default_workers() -> usize {
    16
}

/// Serve requests read from `r` until DISC or hang-up, replies to `w`,
/// by `workers` threads (0: each request on this thread, in order).
pub fn serve<R: Read, W: Write + Send>(
    mut r: R,
    w: W,
    fs: &Arc<Fs>,
    sess: &Session,
    workers: usize,
) -> io::Result<()> {
    let w = Mutex::new(w);
    if workers == 0 {
        let (tx, rx) = mpsc::sync_channel::<Job>(1);
        return read_requests(&mut r, &tx, &w, sess, &mut || {
            while let Ok((req, data)) = rx.try_recv() {
                serve_one(fs, sess, &w, req, data);
            }
        });
    }
    let (tx, rx) = mpsc::sync_channel::<Job>(workers * 2);
    let rx = Mutex::new(rx);
    std::thread::scope(|sc| {
        let (rx, w) = (&rx, &w);
        for _ in 0..workers {
            sc.spawn(move || loop {
                let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((req, data)) = job else { return };
                serve_one(fs, sess, w, req, data);
            });
        }
        let r = read_requests(&mut r, &tx, w, sess, &mut || {});
        drop(tx);
        r
    })
}

/// Serve one request and answer it, timed.
fn serve_one<W: Write>(fs: &Fs, sess: &Session, w: &Mutex<W>, req: Request, data: Vec<u8>) {
    let start = Instant::now();
    let out = handle(fs, sess, &req, data);
    if let Err(e) = reply(w, sess, &req, out) {
        tracing::debug!("nbd: replying to {}: {e}", sess.export.name);
    }
    if let Some(h) = histogram(req.kind) {
        h.since(start, u64::from(req.length));
    }
}

/// Read requests and hand them to the workers (`after` runs after each
/// is handed on); Ok at DISC or hang-up.
fn read_requests<R: Read, W: Write>(
    r: &mut R,
    tx: &mpsc::SyncSender<Job>,
    w: &Mutex<W>,
    sess: &Session,
    after: &mut dyn FnMut(),
) -> io::Result<()> {
    loop {
        let mut h = [0u8; REQUEST_SIZE];
        match r.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        // A bad magic leaves no way to find the next request.
        let req = parse_request(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut data = Vec::new();
        if req.kind == cmd::WRITE {
            if req.length > MAX_PAYLOAD {
                let msg = format!("a write of {} bytes is more than the {MAX_PAYLOAD} taken", req.length);
                reply(w, sess, &req, Outcome::Failed(err::EINVAL, msg.clone()))?;
                return Err(io::Error::new(io::ErrorKind::InvalidData, msg));
            }
            data = vec![0u8; req.length as usize];
            r.read_exact(&mut data)?;
        }
        if req.kind == cmd::DISC {
            return Ok(());
        }
        if tx.send((req, data)).is_err() {
            return Ok(());
        }
        after();
    }
}

/// The histogram of NBD command `kind` in the process's metrics.
fn histogram(kind: u16) -> Option<&'static Arc<Histogram>> {
    static T: OnceLock<Vec<Option<Arc<Histogram>>>> = OnceLock::new();
    let names = ["read", "write", "disc", "flush", "trim", "cache", "write_zeroes", "block_status"];
    let t = T.get_or_init(|| metrics::global().op_table("nbd", names.map(Some)));
    t.get(usize::from(kind)).and_then(Option::as_ref)
}

/// Check a request against the export: flags known, range inside, not a
/// change to a read-only export.
fn check(sess: &Session, req: &Request) -> Result<(), Outcome> {
    let bad = |e: u32, m: String| Err(Outcome::Failed(e, m));
    if req.flags & !cf::KNOWN != 0 {
        return bad(err::EINVAL, format!("unknown command flags {:#x}", req.flags & !cf::KNOWN));
    }
    let changes = matches!(req.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    if changes && sess.flags & tf::READ_ONLY != 0 {
        return bad(err::EPERM, "the export is read-only".into());
    }
    let end = req.offset.checked_add(u64::from(req.length));
    if end.is_none_or(|e| e > sess.export.size) {
        let e = if changes { err::ENOSPC } else { err::EINVAL };
        return bad(
            e,
            format!("{}+{} is past the export's {} bytes", req.offset, req.length, sess.export.size),
        );
    }
    if req.kind == cmd::READ && req.length > MAX_PAYLOAD {
        return bad(err::EINVAL, format!("a read of {} bytes is more than {MAX_PAYLOAD}", req.length));
    }
    Ok(())
}

/// Serve one request.
fn handle(fs: &Fs, sess: &Session, req: &Request, data: Vec<u8>) -> Outcome {
    if let Err(o) = check(sess, req) {
        return o;
    }
    let ino = sess.export.ino;
    let (off, len) = (req.offset, u64::from(req.length));
    let fua = |r: zlogfs_fs::Result<()>| {
        r.and_then(|()| if req.flags & cf::FUA != 0 { fs.fsync(ino, true) } else { Ok(()) })
    };
    let r = match req.kind {
        cmd::READ => {
            return match fs.read(ino, off, req.length as usize) {
                Ok(mut d) => {
                    d.resize(req.length as usize, 0);
                    Outcome::Data(d)
                }
                Err(e) => failed(&e, "read", req),
            }
        }
        cmd::WRITE => fua(fs.write(ino, off, &data).map(|_| ())),
        cmd::FLUSH => fs.sync(),
        cmd::CACHE => Ok(()),
        cmd::TRIM if len > 0 => fua(fs.fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len)),
        cmd::TRIM => Ok(()),
        cmd::WRITE_ZEROES if len == 0 => Ok(()),
        // Both are cheap here (no data is written), so FAST_ZERO holds.
        cmd::WRITE_ZEROES if req.flags & cf::NO_HOLE != 0 => {
            fua(fs.fallocate(ino, FALLOC_FL_ZERO_RANGE, off, len))
        }
        cmd::WRITE_ZEROES => fua(fs.fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len)),
        cmd::BLOCK_STATUS => return block_status(fs, sess, req),
        k => return Outcome::Failed(err::EINVAL, format!("unknown command {k}")),
    };
    match r {
        Ok(()) => {
            if len > 0 && matches!(req.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES) {
                // A mount of the same image drops its cached pages of it.
                fs.changed_elsewhere(ino, off, len);
            }
            Outcome::Done
        }
        Err(e) => failed(&e, "serving", req),
    }
}

fn block_status(fs: &Fs, sess: &Session, req: &Request) -> Outcome {
    if !sess.allocation {
        return Outcome::Failed(err::EINVAL, "no metadata context was selected (base:allocation)".into());
    }
    if req.length == 0 {
        return Outcome::Failed(err::EINVAL, "BLOCK_STATUS of 0 bytes".into());
    }
    let max = if req.flags & cf::REQ_ONE != 0 { 1 } else { MAX_EXTENTS };
    match export::allocation(fs, &sess.export, req.offset, req.length, max) {
        Ok(x) => Outcome::Extents(x),
        Err(e) => failed(&e, "block status", req),
    }
}

/// An error of the file system as an NBD error, logged: a refused
/// operation's errno (the one the FUSE mount answers, `zlogfs_fs::errno`)
/// narrowed to the protocol's codes, a failure underneath (I/O, damage, a
/// latched engine) EIO; the message is kept in the structured reply.
fn failed(e: &Error, what: &str, req: &Request) -> Outcome {
    tracing::warn!("nbd: {what} {}+{}: {e}", req.offset, req.length);
    let code = if zlogfs_fs::is_failure(e) { err::EIO } else { nbd_error(zlogfs_fs::errno(e)) };
    Outcome::Failed(code, format!("{what}: {e}"))
}

/// The NBD error code of an errno (doc/proto.md has EPERM, EIO, ENOMEM,
/// EINVAL, ENOSPC, EOVERFLOW, ENOTSUP and ESHUTDOWN).
fn nbd_error(errno: i32) -> u32 {
    match errno {
        libc::ENOSPC => err::ENOSPC,
        libc::EPERM | libc::EROFS => err::EPERM,
        libc::EINVAL | libc::ERANGE | libc::ENXIO => err::EINVAL,
        libc::EFBIG | libc::EOVERFLOW => err::EOVERFLOW,
        libc::EOPNOTSUPP => err::ENOTSUP,
        _ => err::EIO,
    }
}

/// Send the reply to `req`: simple, or structured chunks.
fn reply<W: Write>(w: &Mutex<W>, sess: &Session, req: &Request, out: Outcome) -> io::Result<()> {
    let c = req.cookie;
    let mut buf = Vec::new();
    match (out, sess.structured) {
        (Outcome::Failed(e, _), false) => buf.extend_from_slice(&simple_reply(c, e)),
        (Outcome::Data(d), false) => {
            buf.extend_from_slice(&simple_reply(c, 0));
            buf.extend_from_slice(&d);
        }
        (_, false) => buf.extend_from_slice(&simple_reply(c, 0)),
        (Outcome::Failed(e, msg), true) => {
            let p = error_payload(e, &msg);
            buf.extend_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::ERROR, c, p.len() as u32));
            buf.extend_from_slice(&p);
        }
        (Outcome::Data(d), true) => {
            buf.extend_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::OFFSET_DATA, c, 8 + d.len() as u32));
            buf.extend_from_slice(&req.offset.to_be_bytes());
            buf.extend_from_slice(&d);
        }
        (Outcome::Extents(x), true) => {
            let len = 4 + 8 * x.len() as u32;
            buf.extend_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::BLOCK_STATUS, c, len));
            buf.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
            for (l, f) in x {
                buf.extend_from_slice(&l.to_be_bytes());
                buf.extend_from_slice(&f.to_be_bytes());
            }
        }
        (Outcome::Done, true) => buf.extend_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::NONE, c, 0)),
    }
    let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
    w.write_all(&buf)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of the file system's errors gets the NBD code the table
    /// before the errno was decided in one place gave it: the refused ones
    /// by their errno, a failure underneath as EIO (even one whose device
    /// errno is ENOSPC or EROFS).
    #[test]
    fn errors_narrow_to_the_protocols_codes() {
        use zlogfs_engine::error::Error as EngineError;
        let req = Request { flags: 0, kind: cmd::READ, cookie: 1, offset: 0, length: 1 };
        let code = |e: &Error| match failed(e, "t", &req) {
            Outcome::Failed(c, _) => c,
            _ => unreachable!("failed always fails"),
        };
        let old_table = |e: &Error| match e {
            Error::NoSpace(_) => err::ENOSPC,
            Error::ReadOnly(_) | Error::NotPermitted(_) => err::EPERM,
            Error::Invalid(_) | Error::OutOfRange(_) | Error::PastEnd(_) => err::EINVAL,
            Error::FileTooBig(_) => err::EOVERFLOW,
            Error::NotSupported(_) => err::ENOTSUP,
            _ => err::EIO,
        };
        let m = String::new;
        let io = |n| EngineError::io("writing", std::io::Error::from_raw_os_error(n));
        let all = [
            Error::NotFound(m()),
            Error::Exists(m()),
            Error::NotEmpty(m()),
            Error::NotDir(m()),
            Error::IsDir(m()),
            Error::NameTooLong(m()),
            Error::Invalid(m()),
            Error::FileTooBig(m()),
            Error::TooManyLinks(m()),
            Error::NoAttr(m()),
            Error::OutOfRange(m()),
            Error::ValueTooBig(m()),
            Error::PastEnd(m()),
            Error::NotSupported(m()),
            Error::NotPermitted(m()),
            Error::ReadOnly(m()),
            Error::NoSpace(m()),
            Error::Again(m()),
            Error::Engine(io(libc::ENOSPC)),
            Error::Engine(io(libc::EROFS)),
            Error::Engine(EngineError::Failed),
            Error::Engine(EngineError::corrupt("a block", "bad")),
        ];
        for e in &all {
            assert_eq!(code(e), old_table(e), "{e:?}");
        }
        assert_eq!(code(&Error::NoSpace(m())), err::ENOSPC);
        assert_eq!(code(&Error::Engine(io(libc::ENOSPC))), err::EIO);
    }
}
