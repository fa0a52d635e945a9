//! The requests a mount's daemon answers (docs/CONTROL.md): each is the
//! same code the command runs on an unmounted image (`tools::report`,
//! `Fs::clean`, `Fs::sync`).

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::{Handler, VERSION};
use crate::tools::report;
use zlogfs_fs::{CleanOptions, Fs, Live, ScrubOptions, CHECK_MEMORY};

/// What the daemon serves.
#[derive(Debug, Clone)]
pub struct Info {
    /// The image.
    pub image: PathBuf,
    /// Where it is mounted (canonical).
    pub mountpoint: PathBuf,
}

/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// The requests of a daemon serving `fs`.
pub fn handler(live: Arc<Live>, info: Info) -> Handler {
    Arc::new(move |req: &Map<String, Value>, progress: &mut dyn FnMut(Value)| {
        // The whole request on one state (a mount that follows its
        // writer does not move on under a check).
        let _hold = live.hold();
        let fs = live.get();
        let image = info.image.display().to_string();
        match req.get("op").and_then(Value::as_str) {
            Some("hello") => Ok(json!({
                "mountpoint": info.mountpoint.display().to_string(), "image": image,
                "pid": std::process::id(), "version": env!("CARGO_PKG_VERSION"), "protocol": VERSION,
            })),
            Some("stats") => report::stats(&image, &fs).map_err(|e| e.to_string()),
            Some("du") => {
                let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
                report::du(&fs, path).map_err(|e| e.to_string())
            }
            Some("fsck") => {
                let memory = req.get("memory").and_then(Value::as_u64).unwrap_or(CHECK_MEMORY as u64);
                fsck(&fs, &image, memory, progress)
            }
            Some("clean") => clean(&fs, req, progress),
            Some("scrub") => scrub(&fs, &info, req, progress),
            Some("metrics") => Ok(crate::tools::metrics::metrics()),
            Some("sync") => fs.sync().map(|()| json!({"synced": true})).map_err(|e| e.to_string()),
            Some("drop_caches") => {
                let d = fs.drop_caches();
                crate::give_back_memory();
                Ok(json!({"block_cache_bytes": d.blocks, "index_cache_bytes": d.index}))
            }
            Some("snapshot") => {
                let action = req.get("action").and_then(Value::as_str).unwrap_or("list");
                let name = req.get("name").and_then(Value::as_str);
                report::snapshot(&fs, action, name).map_err(|e| e.to_string())
            }
            Some("changes") => {
                let since = req.get("since").and_then(Value::as_str).ok_or("\"since\" is missing")?;
                let until = req.get("until").and_then(Value::as_str);
                report::changes(&fs, since, until).map_err(|e| e.to_string())
            }
            Some(op) => Err(format!(
                "unknown operation {op:?} (known: hello, stats, metrics, du, fsck, scrub, clean, sync, drop_caches, \
                 snapshot, changes)"
            )),
            None => Err("the request names no operation (\"op\")".into()),
        }
    })
}

/// fsck of the live file system: read-only (nothing is repaired on a
/// mount), with the blocks checked so far as progress.
fn fsck(fs: &Fs, image: &str, memory: u64, progress: &mut dyn FnMut(Value)) -> Result<Value, String> {
    let sink = RefCell::new((progress, Instant::now()));
    let r = report::fsck(image, fs, &[], memory, &|done, total| {
        let mut s = sink.borrow_mut();
        if s.1.elapsed() >= PROGRESS_EVERY || done == total {
            s.1 = Instant::now();
            (s.0)(json!({"done": done, "total": total}));
        }
    });
    r.map_err(|e| e.to_string())
}

/// A cleaning pass: `segments` (default all worth it), `max_live`
/// (default 0.9); each round's report as progress.
fn clean(fs: &Fs, req: &Map<String, Value>, progress: &mut dyn FnMut(Value)) -> Result<Value, String> {
    let max_segments = match req.get("segments") {
        None | Some(Value::Null) => usize::MAX,
        Some(v) => v.as_u64().ok_or("\"segments\" is a whole number")? as usize,
    };
    let max_live = match req.get("max_live") {
        None | Some(Value::Null) => 0.9,
        Some(v) => {
            v.as_f64().filter(|f| (0.0..=1.0).contains(f)).ok_or("\"max_live\" is a fraction from 0 to 1")?
        }
    };
    let demote = req.get("demote").and_then(Value::as_bool).unwrap_or(false);
    let opts = CleanOptions { max_segments, max_live, demote, ..CleanOptions::default() };
    let sink = RefCell::new(progress);
    let rep = fs.clean(&opts, &|r| (sink.borrow_mut())(r.to_json())).map_err(|e| e.to_string())?;
    Ok(rep.to_json())
}

/// A scrub at `rate` bytes per second (absent or 0: unlimited), its
/// progress at most every 200 ms.
fn scrub(
    fs: &Fs,
    info: &Info,
    req: &Map<String, Value>,
    progress: &mut dyn FnMut(Value),
) -> Result<Value, String> {
    let rate = match req.get("rate") {
        None | Some(Value::Null) => None,
        Some(v) => {
            Some(v.as_u64().ok_or("\"rate\" is a whole number of bytes per second")?).filter(|&r| r > 0)
        }
    };
    let start = Instant::now();
    let sink = RefCell::new((progress, Instant::now()));
    let rep = fs
        .scrub(&ScrubOptions { rate }, &|r| {
            let mut s = sink.borrow_mut();
            if s.1.elapsed() >= PROGRESS_EVERY {
                s.1 = Instant::now();
                (s.0)(report::scrub_progress(r));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(report::scrub(&info.mountpoint.display().to_string(), &rep, start.elapsed().as_secs_f64()))
}
