//! The log of the tool and of the mount daemon: `tracing`'s events, by
//! level, filtered by `ZLOGFS_LOG` (tracing's filter syntax: `info`,
//! `debug`, `zlogfs_fs=debug,warn`) or a mount's `-o log=`; warnings and
//! errors by default.
//!
//! A foreground command logs to stderr. The background mount daemon has
//! no terminal: it logs to `-o logfile=PATH` when given, else to the
//! system log (`/dev/log`, journald or syslogd) when there is one.

use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The environment variable of the filter.
pub const ENV: &str = "ZLOGFS_LOG";

/// Where the log goes.
pub enum Sink<'a> {
    Stderr,
    File(&'a Path),
    /// The system log if there is one, else nowhere.
    Syslog,
}

/// An error if `filter` is not a filter tracing understands.
pub fn check_filter(filter: &str) -> Result<(), String> {
    EnvFilter::try_new(filter).map(|_| ()).map_err(|e| e.to_string())
}

/// Start logging to `sink`, filtered by `filter` or else `ZLOGFS_LOG`.
pub fn init(filter: Option<&str>, sink: Sink) -> Result<(), String> {
    let spec =
        filter.map(str::to_string).or_else(|| std::env::var(ENV).ok()).unwrap_or_else(|| "warn".into());
    let env = EnvFilter::try_new(&spec).map_err(|e| format!("{ENV}={spec}: {e}"))?;
    let base = tracing_subscriber::fmt().with_env_filter(env).with_target(true);
    let r = match sink {
        Sink::Stderr => base.with_writer(io::stderr).try_init(),
        Sink::File(p) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("cannot open the log file {}: {e}", p.display()))?;
            base.with_ansi(false).with_writer(Mutex::new(f)).try_init()
        }
        Sink::Syslog => match Syslog::connect() {
            Some(s) => base.with_ansi(false).without_time().with_level(false).with_writer(s).try_init(),
            None => return Ok(()),
        },
    };
    r.map_err(|e| format!("cannot start the log: {e}"))
}

/// The system log's socket: each event one datagram, in the form syslog(3)
/// sends (`<PRI>zlogfs[PID]: message`, facility daemon).
#[derive(Clone)]
struct Syslog(Arc<UnixDatagram>);

impl Syslog {
    fn connect() -> Option<Syslog> {
        let s = UnixDatagram::unbound().ok()?;
        s.connect("/dev/log").ok()?;
        Some(Syslog(Arc::new(s)))
    }
}

/// One event on its way to the system log.
struct SyslogLine {
    sock: Arc<UnixDatagram>,
    severity: u8,
    buf: Vec<u8>,
}

impl Write for SyslogLine {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for SyslogLine {
    fn drop(&mut self) {
        const DAEMON: u8 = 3 << 3;
        let text = String::from_utf8_lossy(&self.buf);
        let msg = format!("<{}>zlogfs[{}]: {}", DAEMON | self.severity, std::process::id(), text.trim_end());
        // Nowhere else to say it: a full or gone system log drops the line.
        let _ = self.sock.send(msg.as_bytes());
    }
}

impl<'a> MakeWriter<'a> for Syslog {
    type Writer = SyslogLine;

    fn make_writer(&'a self) -> SyslogLine {
        SyslogLine { sock: Arc::clone(&self.0), severity: 6, buf: Vec::new() }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> SyslogLine {
        let severity = match *meta.level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            _ => 7,
        };
        SyslogLine { sock: Arc::clone(&self.0), severity, buf: Vec::new() }
    }
}
