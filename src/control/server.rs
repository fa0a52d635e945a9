//! The daemon's side: a listening socket, a thread per connection, the
//! peer's credentials checked before anything is read.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use serde_json::{json, Map, Value};

use super::{MAX_REQUEST, VERSION};

/// What answers a request: its fields, a sink for progress objects; the
/// result or an error message.
pub type Handler =
    Arc<dyn Fn(&Map<String, Value>, &mut dyn FnMut(Value)) -> Result<Value, String> + Send + Sync>;

/// A control socket being served; dropping it stops serving and removes
/// the socket.
pub struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    conns: Conns,
}

/// The open connections, to hang up on when the server stops.
#[derive(Clone, Default)]
struct Conns(Arc<Mutex<HashMap<u64, UnixStream>>>, Arc<AtomicU64>);

impl Conns {
    fn add(&self, s: &UnixStream) -> io::Result<u64> {
        let id = self.1.fetch_add(1, Ordering::Relaxed);
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(id, s.try_clone()?);
        Ok(id)
    }

    fn remove(&self, id: u64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    fn hang_up(&self) {
        for (_, s) in self.0.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            if let Err(e) = s.shutdown(Shutdown::Both) {
                tracing::debug!("hanging up a control connection: {e}");
            }
        }
    }
}

/// Make way for a socket at `path`: remove a socket there that nobody
/// answers on (left by a server that died). Anything else stays: a socket
/// that answers is `served_by`'s (AddrInUse), and a file of any other
/// kind is the user's (AlreadyExists), never removed.
pub fn remove_stale_socket(path: &Path, served_by: &str) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket: give another path, or remove it yourself",
                path.display()
            ),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is served by {served_by}", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

/// How long a connection may sit idle between requests.
const IDLE: Duration = Duration::from_secs(300);

impl Server {
    /// Serve `handler` on a socket at `path` for `owner` (and root).
    pub fn start(path: PathBuf, owner: u32, handler: Handler) -> io::Result<Server> {
        let dir = path.parent().ok_or_else(|| io::Error::other("a control socket needs a directory"))?;
        private_dir(dir, owner)?;
        remove_stale_socket(&path, "another daemon (is this mount point mounted twice?)")?;
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let conns = Conns::default();
        let c = conns.clone();
        let accept = std::thread::Builder::new()
            .name("zlogfs-control".into())
            .spawn(move || accept_loop(listener, &flag, owner, handler, &c))?;
        Ok(Server { path, stop, accept: Some(accept), conns })
    }

    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            if t.join().is_err() {
                tracing::error!("the control socket's thread ended in a panic");
            }
        }
        // Idle connections end now; one in the middle of a request ends
        // when it has answered.
        self.conns.hang_up();
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!("removing the control socket {}: {e}", self.path.display());
        }
    }
}

/// Make `dir` (mode 0700, owned by `owner`) if it is missing; refuse one
/// that another user owns or that others may enter.
fn private_dir(dir: &Path, owner: u32) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot make {}: {e}", dir.display()))),
    }
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != owner || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a directory of uid {owner} that only it may enter (mode 0700); remove it",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// How often a listener looks at its stop flag between connections.
const STOP_POLL: Duration = Duration::from_millis(100);

/// The next connection from a nonblocking listener (`accept`), looking at
/// `stop` between tries; None once it is set. A listener is stopped this
/// way rather than by connecting to it, which would hang if its socket
/// file were removed behind its back.
pub fn accept_or_stop<T>(accept: impl Fn() -> io::Result<T>, stop: &AtomicBool) -> Option<io::Result<T>> {
    loop {
        if stop.load(Ordering::Acquire) {
            return None;
        }
        match accept() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(STOP_POLL),
            r => return Some(r),
        }
    }
}

fn accept_loop(listener: UnixListener, stop: &AtomicBool, owner: u32, handler: Handler, conns: &Conns) {
    let accept = || listener.accept().and_then(|(s, _)| s.set_nonblocking(false).map(|()| s));
    while let Some(conn) = accept_or_stop(accept, stop) {
        match conn {
            Ok(s) => {
                let h = Arc::clone(&handler);
                let id = match conns.add(&s) {
                    Ok(id) => id,
                    Err(e) => {
                        tracing::warn!("cannot serve a control connection: {e}");
                        continue;
                    }
                };
                let c = conns.clone();
                let spawned =
                    std::thread::Builder::new().name("zlogfs-control-conn".into()).spawn(move || {
                        if let Err(e) = serve_conn(s, owner, &h) {
                            tracing::debug!("a control connection ended: {e}");
                        }
                        c.remove(id);
                    });
                if let Err(e) = spawned {
                    tracing::warn!("cannot serve a control connection: {e}");
                    conns.remove(id);
                }
            }
            Err(e) => tracing::warn!("accepting on the control socket: {e}"),
        }
    }
}

fn send(w: &mut impl Write, v: Value) -> io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    w.write_all(line.as_bytes())
}

fn error(w: &mut impl Write, msg: impl Into<String>) -> io::Result<()> {
    send(w, json!({"v": VERSION, "ok": false, "error": msg.into()}))
}

/// Answer the requests of one connection until it closes.
fn serve_conn(stream: UnixStream, owner: u32, handler: &Handler) -> io::Result<()> {
    let mut out = stream.try_clone()?;
    let uid = getsockopt(&stream, PeerCredentials)?.uid();
    if uid != 0 && uid != owner {
        return error(&mut out, format!("permission denied: this mount is uid {owner}'s, you are uid {uid}"));
    }
    stream.set_read_timeout(Some(IDLE))?;
    let mut input = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        let n = (&mut input).take(MAX_REQUEST as u64).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if !line.ends_with(b"\n") && n == MAX_REQUEST {
            return error(&mut out, format!("a request is at most {MAX_REQUEST} bytes; hanging up"));
        }
        match parse(&line) {
            Ok(req) => answer(&mut out, &req, handler)?,
            Err(msg) => error(&mut out, msg)?,
        }
    }
}

/// A request's fields, or why it is not one.
fn parse(line: &[u8]) -> Result<Map<String, Value>, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("the request is not JSON: {e}"))?;
    let Value::Object(m) = v else { return Err("a request is a JSON object".into()) };
    match m.get("v").and_then(Value::as_u64) {
        Some(VERSION) => Ok(m),
        Some(v) => Err(format!("protocol version {v} is not spoken here (this daemon speaks {VERSION})")),
        None => Err(format!("the request has no protocol version (\"v\": {VERSION})")),
    }
}

fn answer(out: &mut UnixStream, req: &Map<String, Value>, handler: &Handler) -> io::Result<()> {
    let mut failed: io::Result<()> = Ok(());
    let mut progress = |p: Value| {
        if failed.is_ok() {
            failed = send(out, json!({"v": VERSION, "progress": p}));
        }
    };
    let r = handler(req, &mut progress);
    failed?;
    match r {
        Ok(v) => send(out, json!({"v": VERSION, "ok": true, "result": v})),
        Err(e) => error(out, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server makes way only for a socket nobody answers on (issue 44,
    /// item 13: `zlogfs nbd --socket FILE` once deleted a regular file
    /// there as a "stale socket").
    #[test]
    fn only_a_dead_socket_is_removed() {
        let dir = std::env::temp_dir().join(format!("zlogfs-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("notes.txt");
        std::fs::write(&file, b"mine").unwrap();
        let e = remove_stale_socket(&file, "x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"mine", "the user's file stays");
        let sub = dir.join("d");
        std::fs::create_dir(&sub).unwrap();
        assert!(remove_stale_socket(&sub, "x").is_err());
        assert!(sub.is_dir());

        let live = dir.join("live.sock");
        let l = UnixListener::bind(&live).unwrap();
        let e = remove_stale_socket(&live, "another server").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(e.to_string().contains("another server"), "{e}");
        drop(l);
        // The listener is gone, its socket file stays: nobody answers.
        assert!(live.exists());
        remove_stale_socket(&live, "x").unwrap();
        assert!(!live.exists(), "a dead socket is removed");
        remove_stale_socket(&live, "x").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
