//! `-o metrics=HOST:PORT`: the daemon's figures for Prometheus, at
//! `http://HOST:PORT/metrics` (text format 0.0.4). The HTTP side is
//! tiny_http's: one thread, GET only.

use std::sync::Arc;
use std::thread::JoinHandle;

use zlogfs::tools::metrics::prometheus;
use zlogfs_fs::{Fs, Live};

/// The endpoint while it serves; dropping it stops it.
pub struct Endpoint {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

/// Serve the figures of `fs` (and the process's) on `addr`.
pub fn serve(addr: &str, live: Arc<Live>) -> Result<Endpoint, String> {
    let server = tiny_http::Server::http(addr).map_err(|e| {
        format!("cannot serve metrics on {addr}: {e} (give a free HOST:PORT, e.g. metrics=127.0.0.1:9184)")
    })?;
    let server = Arc::new(server);
    let s = Arc::clone(&server);
    let thread = std::thread::Builder::new()
        .name("zlogfs-metrics".into())
        .spawn(move || {
            for req in s.incoming_requests() {
                answer(req, &live.get());
            }
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    tracing::info!("metrics for Prometheus on http://{addr}/metrics");
    Ok(Endpoint { server, thread: Some(thread) })
}

fn answer(req: tiny_http::Request, fs: &Fs) {
    let found = *req.method() == tiny_http::Method::Get && req.url().split('?').next() == Some("/metrics");
    let r = if found {
        let header = tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4")
            .expect("a constant header is valid");
        req.respond(tiny_http::Response::from_string(prometheus(&gauges(fs))).with_header(header))
    } else {
        req.respond(tiny_http::Response::from_string("zlogfs serves /metrics only\n").with_status_code(404))
    };
    if let Err(e) = r {
        tracing::debug!("answering a metrics request: {e}");
    }
}

/// The image's space, from what the engine keeps counted (nothing walks
/// the tree: a scrape every few seconds costs next to nothing).
fn gauges(fs: &Fs) -> Vec<(&'static str, &'static str, f64)> {
    let e = fs.engine();
    let s = e.stats();
    let (usable, free) = e.capacity();
    let fst = fs.stats();
    vec![
        ("segments", "Segments of the image.", s.segments as f64),
        ("free_segments", "Segments free now.", s.free_segments as f64),
        ("usable_bytes", "Bytes the file system may use (the reserve left out).", usable as f64),
        ("free_bytes", "Bytes free, counting what cleaning reclaims.", free as f64),
        ("live_bytes", "Bytes the live blocks take.", s.live_bytes as f64),
        ("dead_bytes", "Bytes of dead blocks, reclaimed by the cleaner.", e.dead_bytes() as f64),
        ("index_runs", "Runs of the index.", s.runs as f64),
        ("background_errors", "Errors of background work since the mount.", fst.background_errors as f64),
    ]
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the metrics thread ended in a panic");
            }
        }
    }
}
