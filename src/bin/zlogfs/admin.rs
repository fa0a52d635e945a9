//! The admin commands (`stats`, `du`, `fsck`, `scrub`, `clean`, `sync`) on an image
//! or a mount point. An image is opened here; a mounted image is locked
//! by its daemon, which answers through its control channel
//! (docs/CONTROL.md) with the same reports (`zlogfs::tools::report`).
//! Either way the command prints the same JSON, or text made from it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Map, Value};
use zlogfs::control;
use zlogfs::tools::{self, report};
use zlogfs_engine::Options;
use zlogfs_fs::{self as zfs, Fs};

use super::{close, open_fs, open_fs_ro, Parts, Res};

/// What an admin command works on.
pub enum Target {
    /// An image (file or device) to open.
    Image(PathBuf),
    /// A mounted image, through its daemon.
    Mount {
        /// The mount point, canonical.
        dir: PathBuf,
        /// Its control socket.
        socket: PathBuf,
    },
}

impl Target {
    /// `p` as the mount point of a zlogfs mount, or as an image. The mount
    /// is found without looking into it: a user's FUSE mount refuses
    /// everyone else, root included.
    pub fn of(p: &Path) -> Result<Target, String> {
        let abs = match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
                parent.canonicalize().map(|d| d.join(name))
            }
            _ => p.canonicalize(),
        };
        if let Ok(dir) = abs {
            if let Some(uid) = zlogfs_mount_owner(&dir) {
                return Ok(Target::Mount { socket: control::find_socket(&dir, uid), dir });
            }
        }
        if let Some(t) = Target::served(p) {
            return Ok(t);
        }
        if p.is_dir() {
            return Err(format!(
                "{} is a directory but not a zlogfs mount point (give the image, or where it is mounted)",
                p.display()
            ));
        }
        Ok(Target::Image(p.to_path_buf()))
    }

    /// Image `p` as served by a running `zlogfs nbd` of this user: its
    /// control socket (named after the image's canonical path) answers.
    fn served(p: &Path) -> Option<Target> {
        let image = p.canonicalize().ok().filter(|c| !c.is_dir())?;
        let socket = control::find_socket(&image, nix::unistd::geteuid().as_raw());
        // A socket left by a server that was killed refuses connections:
        // the image is then opened as any other.
        std::os::unix::net::UnixStream::connect(&socket).ok()?;
        Some(Target::Mount { dir: image, socket })
    }

    fn name(&self) -> String {
        match self {
            Target::Image(p) | Target::Mount { dir: p, .. } => p.display().to_string(),
        }
    }
}

/// Ask the daemon behind `socket` for `op` with `args`.
fn ask(socket: &Path, op: &str, args: Value, progress: &mut dyn FnMut(&Value)) -> Result<Value, String> {
    let mut req = match args {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    req.insert("op".into(), Value::from(op));
    control::request(socket, req, progress)
}

/// The uid that owns the zlogfs mount on `dir` (FUSE's `user_id=` in
/// /proc/self/mountinfo), or None when `dir` is not one.
fn zlogfs_mount_owner(dir: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (a, b) = l.split_once(" - ")?;
        let mut fields = b.split(' ');
        let is_zlogfs = fields.next() == Some("fuse.zlogfs");
        let at = a.split(' ').nth(4).map(unescape)?;
        if !is_zlogfs || Path::new(&at) != dir {
            return None;
        }
        let opts = fields.nth(1).unwrap_or("");
        Some(opts.split(',').find_map(|o| o.strip_prefix("user_id=")?.parse().ok()).unwrap_or(0))
    })
}

/// A field of mountinfo, its `\ooo` escapes (space, tab, newline and
/// backslash) undone.
fn unescape(f: &str) -> String {
    let b = f.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok());
        match (b[i], oct) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn show(v: &Value, json: bool, text: impl FnOnce(&Value)) {
    if json {
        outln!("{v:#}");
    } else {
        text(v);
    }
}

/// `zlogfs stats`.
pub fn stats(target: &Path, parts: &Parts, json: bool) -> Res {
    let t = Target::of(target)?;
    let v = match &t {
        Target::Image(image) => {
            let fs = open_fs_ro(image, parts)?;
            report::stats(&image.display().to_string(), &fs).map_err(|e| e.to_string())?
        }
        Target::Mount { socket, .. } => ask(socket, "stats", json!({}), &mut |_| {})?,
    };
    show(&v, json, print_stats);
    Ok(ExitCode::SUCCESS)
}

fn print_stats(v: &Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let ratio = f("ratio");
    outln!(
        "image:            {} (format version {}, file system records version {})",
        v["image"].as_str().unwrap_or(""),
        n("format_version"),
        n("records_version")
    );
    outln!(
        "segments:         {} of {} KiB, {} free, {} free at the next index flush; {} live bytes",
        n("segments"),
        n("segment_size") / 1024,
        n("free_segments"),
        n("pinned_segments"),
        n("live_bytes")
    );
    outln!(
        "space:            {} usable ({} reserved segments); {} used, {} free of which {} dead \
         (reclaimed by the cleaner); about {} more logical bytes fit at ratio {ratio:.2}",
        n("usable_bytes"),
        n("reserve_segments"),
        n("live_bytes"),
        n("physical_free_bytes"),
        n("dead_bytes"),
        n("estimated_logical_bytes_that_fit")
    );
    for d in v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|_| v["devices"].as_array().is_some_and(|a| a.len() > 1))
    {
        let kinds = d["written_since_open_by_kind"].as_object().map(|m| {
            m.iter()
                .filter(|(_, b)| b.as_u64() != Some(0))
                .map(|(k, b)| format!("{k} {b}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        // (A mount of an older build sends no classes.)
        let c = &d["live_by_class"];
        let classes = if c.is_object() {
            format!(
                ": index {}, journal {}, checkpoints {}, file data {}",
                c["index"], c["journal"], c["checkpoints"], c["file_data"]
            )
        } else {
            String::new()
        };
        outln!(
            "{:<18}{} segments, {} free; {} of {} bytes live{}{classes}{}",
            format!("{} device:", d["role"].as_str().unwrap_or("")),
            d["segments"],
            d["free_segments"],
            d["live_bytes"],
            d["capacity_bytes"],
            d["path"].as_str().map(|p| format!(" ({p})")).unwrap_or_default(),
            kinds.filter(|k| !k.is_empty()).map(|k| format!("; written since open: {k}")).unwrap_or_default()
        );
    }
    let o = &v["object_store"];
    if o.is_object() {
        let m = |k: &str| o[k].as_u64().unwrap_or(0);
        outln!(
            "object store:     {} PUT, {} GET, {} LIST, {} DELETE since open ({} failed attempts \
             retried); {} bytes up, {} down; cache {} hits, {} misses; {} bytes not yet uploaded; \
             manifest {}",
            m("puts"),
            m("gets"),
            m("lists"),
            m("deletes"),
            m("failed_attempts"),
            m("bytes_up"),
            m("bytes_down"),
            m("cache_hits"),
            m("cache_misses"),
            m("upload_backlog_bytes"),
            m("manifest")
        );
    }
    outln!("tree:             {} files, {} directories, {} others", n("files"), n("dirs"), n("other_inodes"));
    outln!(
        "file data:        {} logical, {} allocated, {} stored (ratio {ratio:.2}); {} inline in the index",
        n("logical_bytes"),
        n("allocated_bytes"),
        n("physical_bytes"),
        n("inline_bytes")
    );
    if n("patched_chunks") > 0 {
        outln!(
            "patched chunks:   {} ({} stored in patches, replacing {} stored bytes of their bases; \
             {} without a base, all patches)",
            n("patched_chunks"),
            n("patch_bytes"),
            n("patch_released_bytes"),
            n("bases_gone")
        );
    }
    for (k, c) in v["codecs"].as_object().into_iter().flatten() {
        let (raw, stored) = (c["logical"].as_u64().unwrap_or(0), c["stored"].as_u64().unwrap_or(0));
        outln!(
            "  {k:<24} {:>8} blocks {raw:>14} -> {stored:>14} ({:.2})",
            c["blocks"].as_u64().unwrap_or(0),
            raw as f64 / stored.max(1) as f64
        );
    }
    outln!(
        "inodes:           {} records, {} bytes raw, {} compressed: {:.1} bytes per inode; {} (uid, gid, mode) triples",
        n("inodes"),
        n("inode_bytes_raw"),
        n("inode_bytes_compressed"),
        f("bytes_per_inode"),
        n("triples")
    );
    let levels: Vec<String> =
        v["index_runs_by_level"].as_array().into_iter().flatten().map(|n| n.to_string()).collect();
    outln!(
        "index:            {} runs (by level: {}), {} bytes ({:.1} bytes per file, inline data included); {} entries in memtables",
        n("index_runs"),
        if levels.is_empty() { "none".to_string() } else { levels.join(" ") },
        n("index_bytes"),
        f("metadata_bytes_per_file"),
        n("memtable_entries")
    );
    outln!(
        "index memory:     {} bytes of memtables (as their budget counts them), {} bytes of cached run blocks",
        n("memtable_bytes"),
        n("index_cache_bytes")
    );
    outln!("block cache:      {} bytes of decompressed blocks", n("block_cache_bytes"));
    let written: Vec<u64> = v["index_bytes_written_by_level_since_open"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_u64())
        .collect();
    if written.iter().any(|&n| n > 0) {
        outln!("index writes:     {}", index_writes(&written));
    }
    let amp = v["device_bytes_per_user_byte"]
        .as_f64()
        .map_or("no user bytes yet".to_string(), |a| format!("{a:.2} device bytes per user byte"));
    outln!(
        "writes:           {} bytes by users, {} bytes to the device ({amp}) over the image's life",
        n("user_bytes_written"),
        n("device_bytes_written")
    );
    outln!("checkpoint:       {}", n("checkpoint"));
    if n("background_errors") > 0 {
        outln!(
            "background errors: {} (the last: {})",
            n("background_errors"),
            v["last_background_error"].as_str().unwrap_or("")
        );
    }
    if let Some(e) = v["engine_background_error"].as_str() {
        outln!("engine stopped:   {e} (unmount and mount again)");
    }
    if n("snapshots") > 0 || n("automatic_points") > 0 {
        outln!(
            "history:          {} snapshots, {} automatic points (policy {}), holding {} stored bytes the \
             present no longer uses, {} of them only for automatic points (counted free: dropped before \
             a writer runs out of room)",
            n("snapshots"),
            n("automatic_points"),
            v["history_policy"].as_str().unwrap_or("none"),
            n("snapshot_held_bytes"),
            n("history_purgeable_bytes")
        );
    }
    print_volumes(&v["volumes"]);
}

/// The volumes of `stats` (files with a chunk size of their own).
fn print_volumes(v: &Value) {
    let Some(vols) = v.as_array().filter(|a| !a.is_empty()) else { return };
    outln!("volumes:          {} (files with a chunk size of their own)", vols.len());
    // The ratio of a volume is of its allocated bytes: most of a new
    // volume is holes.
    let head = ("chunk", "unit", "cold", "logical", "allocated", "stored", "alloc/stored");
    outln!(
        "  {:>6} {:>6} {:>12} {:>14} {:>14} {:>14} {:>12}  path",
        head.0,
        head.1,
        head.2,
        head.3,
        head.4,
        head.5,
        head.6
    );
    for r in vols {
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        outln!(
            "  {:>6} {:>6} {:>12} {:>14} {:>14} {:>14} {:>12.2}  {}",
            r["chunk"].as_str().unwrap_or(""),
            r["unit"].as_str().filter(|u| !u.is_empty()).unwrap_or("-"),
            r["cold"].as_str().filter(|u| !u.is_empty()).unwrap_or("-"),
            n("logical"),
            n("allocated"),
            n("physical"),
            n("allocated") as f64 / n("physical").max(1) as f64,
            r["path"].as_str().unwrap_or("")
        );
    }
}

/// `zlogfs du`.
pub fn du(target: &Path, parts: &Parts, path: &str, json: bool) -> Res {
    let v = match Target::of(target)? {
        Target::Image(image) => report::du(&open_fs_ro(&image, parts)?, path).map_err(|e| e.to_string())?,
        Target::Mount { socket, .. } => ask(&socket, "du", json!({"path": path}), &mut |_| {})?,
    };
    show(&v, json, |v| {
        outln!("{:>14} {:>14} {:>7} {:>8}  path", "logical", "physical", "ratio", "files");
        for r in v["entries"].as_array().into_iter().flatten().chain(std::iter::once(&v["total"])) {
            outln!(
                "{:>14} {:>14} {:>7.2} {:>8}  {}",
                r["logical"].as_u64().unwrap_or(0),
                r["physical"].as_u64().unwrap_or(0),
                r["ratio"].as_f64().unwrap_or(0.0),
                r["files"].as_u64().unwrap_or(0),
                r["path"].as_str().unwrap_or("")
            );
        }
    });
    Ok(ExitCode::SUCCESS)
}

/// `zlogfs sync`: make everything accepted so far durable.
pub fn sync(target: &Path, parts: &Parts, json: bool) -> Res {
    let t = Target::of(target)?;
    match &t {
        // Recovery's result made durable, and a checkpoint.
        Target::Image(image) => close(open_fs(image, parts, zfs::Atime::Noatime)?, image)?,
        Target::Mount { socket, .. } => {
            ask(socket, "sync", json!({}), &mut |_| {})?;
        }
    }
    show(&json!({"target": t.name(), "synced": true}), json, |_| outln!("{}: synced", t.name()));
    Ok(ExitCode::SUCCESS)
}

/// `zlogfs drop-caches`: empty a mount's caches.
pub fn drop_caches(target: &Path, json: bool) -> Res {
    let t = Target::of(target)?;
    let v = match &t {
        Target::Image(image) => {
            return Err(format!(
                "{} is an image no process serves: only a mount (or a running zlogfs nbd) holds caches; \
                 give its mount point",
                image.display()
            ))
        }
        Target::Mount { socket, .. } => ask(socket, "drop_caches", json!({}), &mut |_| {})?,
    };
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    show(
        &json!({"target": t.name(), "block_cache_bytes": n("block_cache_bytes"),
        "index_cache_bytes": n("index_cache_bytes")}),
        json,
        |_| {
            outln!(
                "{}: dropped {} bytes of decompressed blocks and {} bytes of index blocks",
                t.name(),
                n("block_cache_bytes"),
                n("index_cache_bytes")
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// `zlogfs snapshot ACTION TARGET [NAME]`.
pub fn snapshot(target: &Path, parts: &Parts, action: &str, name: Option<&str>, json: bool) -> Res {
    if action != "list" && action != "policy" && name.is_none() {
        return Err(format!("zlogfs snapshot {action} needs a NAME"));
    }
    let t = Target::of(target)?;
    let v = match &t {
        Target::Image(image) if action == "list" || (action == "policy" && name.is_none()) => {
            report::snapshot(&open_fs_ro(image, parts)?, action, name).map_err(|e| e.to_string())?
        }
        Target::Image(image) => {
            let fs = open_fs(image, parts, zfs::Atime::Noatime)?;
            let v = report::snapshot(&fs, action, name).map_err(|e| e.to_string())?;
            close(fs, image)?;
            v
        }
        Target::Mount { socket, .. } => {
            ask(socket, "snapshot", json!({"action": action, "name": name}), &mut |_| {})?
        }
    };
    show(&v, json, |v| match action {
        "create" => outln!("{}: snapshot {} taken", t.name(), v["created"].as_str().unwrap_or("")),
        "policy" => outln!("{}: automatic points: {}", t.name(), v["policy"].as_str().unwrap_or("")),
        "delete" => outln!(
            "{}: snapshot {} deleted, {} bytes freed",
            t.name(),
            v["deleted"].as_str().unwrap_or(""),
            v["freed_bytes"].as_u64().unwrap_or(0)
        ),
        _ => {
            outln!("{:<24} {:<22} {:>14}", "name", "taken", "delete frees");
            for s in v["snapshots"].as_array().into_iter().flatten() {
                outln!(
                    "{:<24} {:<22} {:>14}",
                    s["name"].as_str().unwrap_or(""),
                    s["time"].as_str().unwrap_or(""),
                    s["frees_bytes"].as_u64().unwrap_or(0)
                );
            }
        }
    });
    Ok(ExitCode::SUCCESS)
}

/// `zlogfs changes TARGET --since POINT [--until POINT]`.
pub fn changes(target: &Path, parts: &Parts, since: &str, until: Option<&str>, json: bool) -> Res {
    let t = Target::of(target)?;
    let v = match &t {
        Target::Image(image) => {
            report::changes(&open_fs_ro(image, parts)?, since, until).map_err(|e| e.to_string())?
        }
        Target::Mount { socket, .. } => {
            ask(socket, "changes", json!({"since": since, "until": until}), &mut |_| {})?
        }
    };
    show(&v, json, |v| {
        if v["fresh_instance"].as_bool() == Some(true) {
            eprintln!(
                "{}: the changes since {since} are not kept (older than the change records, or not a point \
                 of this image): rescan, then pass the clock below as --since",
                t.name()
            );
        }
        for c in v["changes"].as_array().into_iter().flatten() {
            let path = |k: &str| c[k].as_str().unwrap_or("(path unknown)").to_string();
            let what: Vec<&str> = [("data", "data"), ("metadata", "metadata")]
                .into_iter()
                .filter(|(k, _)| c[*k].as_bool() == Some(true))
                .map(|(_, w)| w)
                .collect();
            let line = match c["op"].as_str() {
                Some("renamed") => format!("{} -> {}", path("old_path"), path("path")),
                _ => path("path"),
            };
            let tail = if what.is_empty() { String::new() } else { format!("  ({})", what.join(", ")) };
            outln!("{:<8} {line}{tail}", c["op"].as_str().unwrap_or(""));
        }
        outln!("clock: {}", v["clock"].as_str().unwrap_or(""));
    });
    Ok(ExitCode::SUCCESS)
}

/// `zlogfs clean`.
pub fn clean(
    target: &Path,
    parts: &Parts,
    segments: Option<usize>,
    max_live: f64,
    demote: bool,
    json: bool,
) -> Res {
    if !(0.0..=1.0).contains(&max_live) {
        return Err(format!("--max-live {max_live} is not a fraction between 0 and 1"));
    }
    let pb = tools::progress(0, "cleaning", json);
    let tick = |r: &Value| {
        pb.set_message(format!("cleaning: {} segments freed, {} bytes moved", r["freed"], r["moved_bytes"]));
        pb.tick();
    };
    let rep = match Target::of(target)? {
        Target::Image(image) => {
            let fs = open_fs(&image, parts, zfs::Atime::Noatime)?;
            let opts = zfs::CleanOptions {
                max_segments: segments.unwrap_or(usize::MAX),
                max_live,
                demote,
                ..zfs::CleanOptions::default()
            };
            let rep = fs
                .clean(&opts, &|r| tick(&r.to_json()))
                .map_err(|e| format!("{}: cleaning stopped: {e}", image.display()))?;
            close(fs, &image)?;
            rep.to_json()
        }
        Target::Mount { socket, .. } => {
            let req = json!({"segments": segments, "max_live": max_live, "demote": demote});
            ask(&socket, "clean", req, &mut |p| tick(p))?
        }
    };
    pb.finish_and_clear();
    show(&rep, json, |rep| {
        outln!(
            "{}: {} segments examined, {} freed; {} chunks and {} patches ({} stored bytes) moved; {} leaked bytes reclaimed",
            target.display(),
            rep["examined"],
            rep["freed"],
            rep["chunks"],
            rep["patches"],
            rep["moved_bytes"],
            rep["leaked_bytes"]
        );
        for s in rep["skipped"].as_array().into_iter().flatten() {
            outln!("skipped segment {}: {}", s["segment"], s["why"].as_str().unwrap_or(""));
        }
        if let Some(why) = rep["stopped"].as_str() {
            outln!("cleaning stopped early: {why}; delete files or snapshots to make room");
        }
    });
    Ok(ExitCode::SUCCESS)
}

/// When the file system does not open: what the engine underneath can
/// still say of damaged index blocks (the records they held), or None.
fn fsck_engine(image: &Path, parts: &Parts) -> Option<Vec<String>> {
    let f = super::open_image(image, true, parts).ok()?;
    let opts = Options { background: false, read_only: true, ..Options::default() };
    let eng = zlogfs_engine::Engine::open(f, opts).ok()?;
    let bad = eng.verify_runs();
    (!bad.is_empty()).then(|| {
        bad.into_iter()
            .map(|d| {
                format!(
                    "index run {}, block {}, holding the records from {} to {}: {}",
                    d.run,
                    d.addr,
                    zfs::describe_key(&d.from),
                    zfs::describe_key(&d.to),
                    d.error
                )
            })
            .collect()
    })
}

/// `zlogfs fsck`: exit status 0 when clean, 1 with a report when not.
pub fn fsck(target: &Path, parts: &Parts, repair: bool, memory: u64, json: bool) -> Res {
    let pb = tools::progress(0, "checking blocks", json);
    let step = |done: u64, total: u64| {
        pb.set_length(total);
        pb.set_position(done);
    };
    let v = match Target::of(target)? {
        Target::Image(image) => fsck_image(&image, parts, repair, memory, &step)?,
        Target::Mount { dir, socket } => {
            if repair {
                return Err(format!(
                    "{}: --repair writes to the image: unmount it first, then zlogfs fsck --repair IMAGE",
                    dir.display()
                ));
            }
            let mut p = |p: &Value| step(p["done"].as_u64().unwrap_or(0), p["total"].as_u64().unwrap_or(0));
            ask(&socket, "fsck", json!({"memory": memory}), &mut p)?
        }
    };
    pb.finish_and_clear();
    show(&v, json, print_fsck);
    Ok(if v["clean"].as_bool() == Some(true) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// fsck of an image: its report; when the file system does not even
/// open, what the engine finds of damaged index blocks ("opened": false).
fn fsck_image(
    image: &Path,
    parts: &Parts,
    repair: bool,
    memory: u64,
    step: &dyn Fn(u64, u64),
) -> Result<Value, String> {
    let opened = if repair { open_fs(image, parts, zfs::Atime::Noatime) } else { open_fs_ro(image, parts) };
    let fs: Fs = match opened {
        Ok(fs) => fs,
        Err(e) => {
            let Some(problems) = fsck_engine(image, parts) else { return Err(e) };
            return Ok(json!({"image": image.display().to_string(), "clean": false, "problems": problems,
                "opened": false, "error": e}));
        }
    };
    let mended =
        if repair { fs.repair().map_err(|e| format!("{}: repair: {e}", image.display()))? } else { vec![] };
    let v = report::fsck(&image.display().to_string(), &fs, &mended, memory, step)
        .map_err(|e| format!("{}: check stopped: {e}", image.display()))?;
    if repair {
        close(fs, image)?;
    }
    Ok(v)
}

fn print_fsck(v: &Value) {
    for m in v["repaired"].as_array().into_iter().flatten() {
        outln!("repaired: {}", m.as_str().unwrap_or(""));
    }
    for p in v["problems"].as_array().into_iter().flatten() {
        outln!("problem: {}", p.as_str().unwrap_or(""));
    }
    if v["opened"].as_bool() != Some(true) {
        outln!("{}", v["error"].as_str().unwrap_or(""));
        outln!("the file system does not open: its records in damaged index blocks are lost");
        return;
    }
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let leaked = v["leaked"].as_array().map_or(0, Vec::len);
    if leaked > 0 {
        outln!(
            "note: {} bytes in {leaked} segments are counted in use but held by nothing (left by a crash or a \
             failed write; the cleaner gives them back when it cleans those segments)",
            n("leaked_bytes")
        );
    }
    if n("inode_passes") > 1 || n("block_passes") > 1 {
        outln!(
            "note: the tables outgrew --memory: {} passes over the inodes, {} over the blocks",
            n("inode_passes"),
            n("block_passes")
        );
    }
    let problems = v["problems"].as_array().map_or(0, Vec::len);
    outln!(
        "{}: {} inodes, {} entries, {} chunks, {} blocks ({} bytes) verified, {} xattrs: {}",
        v["image"].as_str().unwrap_or(""),
        n("inodes"),
        n("dirents"),
        n("extents"),
        n("blocks"),
        n("block_bytes"),
        n("xattrs"),
        if problems == 0 { "clean".to_string() } else { format!("{problems} problems") }
    );
}

/// The daemon's figures (`metrics`) of the mount at `target`.
fn mount_metrics(target: &Path, what: &str) -> Result<(PathBuf, PathBuf), String> {
    match Target::of(target)? {
        Target::Mount { dir, socket } => Ok((dir, socket)),
        Target::Image(p) => Err(format!(
            "{}: {what} reports what a mount's daemon measured since it mounted; give the mount point of a mounted image",
            p.display()
        )),
    }
}

/// What changed from `before` to `now` (two `metrics` answers; `before`
/// Null for everything since the mount), over `secs` seconds: per
/// operation and per part of the split, the count, rate, mean,
/// percentiles and bytes; and the counters' growth.
fn interval_view(before: &Value, now: &Value, secs: f64) -> Value {
    let secs = secs.max(1e-9);
    let one = |b: &Value, n: &Value| {
        let h = tools::metrics::histogram_from_json(n).minus(&tools::metrics::histogram_from_json(b));
        let mut m = tools::metrics::summary(&h);
        m.insert("per_s".into(), (h.count as f64 / secs).into());
        Value::Object(m)
    };
    let group = |k: &str| -> Map<String, Value> {
        now[k]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, n)| (name.clone(), one(&before[k][name], n)))
            .filter(|(_, v)| v["count"].as_u64() != Some(0))
            .collect()
    };
    let counters: Map<String, Value> = now["counters"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, n)| {
            (k.clone(), (n.as_u64().unwrap_or(0) - before["counters"][k].as_u64().unwrap_or(0)).into())
        })
        .collect();
    json!({"seconds": secs, "ops": group("ops"), "split": group("split"), "counters": counters})
}

/// A duration for people: 850ns, 35.2µs, 1.23ms, 2.10s.
fn dur(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns}ns"),
        1_000..=999_999 => format!("{:.1}µs", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

/// Bytes for people: 4.0 KiB, 12.3 MiB.
fn size(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn print_view(v: &Value, title: &str) {
    let row = |name: &str, h: &Value| {
        let n = |k: &str| h[k].as_u64().unwrap_or(0);
        outln!(
            "  {name:<22} {:>9} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
            n("count"),
            h["per_s"].as_f64().unwrap_or(0.0),
            dur(n("mean_ns")),
            dur(n("p50_ns")),
            dur(n("p90_ns")),
            dur(n("p99_ns")),
            dur(n("p999_ns")),
            size(n("bytes"))
        );
    };
    outln!("{title}");
    let head = |what: &str| {
        outln!(
            "  {what:<22} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
            "count",
            "per s",
            "mean",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "bytes"
        )
    };
    head("operation");
    for (k, h) in v["ops"].as_object().into_iter().flatten() {
        row(k, h);
    }
    head("time below them");
    for (k, h) in v["split"].as_object().into_iter().flatten() {
        row(k, h);
    }
    let c = &v["counters"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    let (hits, misses) = (n("cache_hits"), n("cache_misses"));
    let dev = |k: &str| v["split"][k]["bytes"].as_u64().unwrap_or(0);
    outln!(
        "  user bytes written {}, read {}; device bytes written {}, read {}; block cache {hits} hits, {misses} misses{}",
        size(n("user_bytes_written")),
        size(n("user_bytes_read")),
        size(dev("device_write")),
        size(dev("device_read")),
        if hits + misses > 0 { format!(" ({:.1}% hits)", 100.0 * hits as f64 / (hits + misses) as f64) } else { String::new() }
    );
}

/// `zlogfs stats --latency`: what each operation cost since the mount.
pub fn latency(target: &Path, json: bool) -> Res {
    let (dir, socket) = mount_metrics(target, "--latency")?;
    let now = ask(&socket, "metrics", json!({}), &mut |_| {})?;
    let up = now["uptime_s"].as_f64().unwrap_or(0.0);
    let v = interval_view(&Value::Null, &now, up);
    show(&v, json, |v| print_view(v, &format!("{}: since the mount, {up:.1} s ago", dir.display())));
    Ok(ExitCode::SUCCESS)
}

/// `zlogfs stats --watch`: the figures of each interval, until
/// interrupted or `count` reports.
pub fn watch(target: &Path, interval: f64, count: Option<u64>, json: bool) -> Res {
    if !(interval.is_finite() && interval >= 0.01) {
        return Err(format!("--interval {interval} is not a number of seconds of at least 0.01"));
    }
    let (dir, socket) = mount_metrics(target, "--watch")?;
    let mut before = ask(&socket, "metrics", json!({}), &mut |_| {})?;
    let mut at = std::time::Instant::now();
    let mut shown = 0;
    while count.is_none_or(|c| shown < c) {
        std::thread::sleep(std::time::Duration::from_secs_f64(interval));
        let now = ask(&socket, "metrics", json!({}), &mut |_| {})?;
        let v = interval_view(&before, &now, at.elapsed().as_secs_f64());
        at = std::time::Instant::now();
        if json {
            outln!("{v}");
        } else {
            let t = chrono_now();
            print_view(
                &v,
                &format!("{}: {t}, the last {:.1} s", dir.display(), v["seconds"].as_f64().unwrap_or(0.0)),
            );
            outln!();
        }
        before = now;
        shown += 1;
    }
    Ok(ExitCode::SUCCESS)
}

/// The time of day, HH:MM:SS UTC.
fn chrono_now() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
        % 86_400;
    format!("{:02}:{:02}:{:02} UTC", t / 3600, t / 60 % 60, t % 60)
}

/// The scrub rate on a mount when none is given: the device's bandwidth
/// is shared with the mount's users.
const MOUNT_SCRUB_RATE: u64 = 100 << 20;

/// `zlogfs scrub`: exit status 0 when clean, 1 with a report.
pub fn scrub(target: &Path, parts: &Parts, rate: Option<u64>, json: bool) -> Res {
    let pb = tools::progress(0, "verifying blocks", json);
    let step = |p: &Value| {
        pb.set_length(p["total"].as_u64().unwrap_or(0));
        pb.set_position(p["done"].as_u64().unwrap_or(0));
    };
    let v = match Target::of(target)? {
        Target::Image(image) => {
            let fs = open_fs_ro(&image, parts)?;
            let start = std::time::Instant::now();
            let opts = zfs::ScrubOptions { rate: rate.filter(|&r| r > 0) };
            let rep = fs
                .scrub(&opts, &|r| step(&report::scrub_progress(r)))
                .map_err(|e| format!("{}: scrub stopped: {e}", image.display()))?;
            report::scrub(&image.display().to_string(), &rep, start.elapsed().as_secs_f64())
        }
        Target::Mount { socket, .. } => {
            ask(&socket, "scrub", json!({"rate": rate.unwrap_or(MOUNT_SCRUB_RATE)}), &mut |p| step(p))?
        }
    };
    pb.finish_and_clear();
    show(&v, json, |v| {
        for d in v["damaged"].as_array().into_iter().flatten() {
            outln!("damaged: {}", d.as_str().unwrap_or(""));
        }
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        let secs = v["seconds"].as_f64().unwrap_or(0.0);
        let damaged = v["damaged"].as_array().map_or(0, Vec::len);
        outln!(
            "{}: {} blocks ({}) verified in {secs:.1} s ({}/s){}: {}",
            v["target"].as_str().unwrap_or(""),
            n("blocks"),
            size(n("bytes")),
            size((n("bytes") as f64 / secs.max(1e-3)) as u64),
            if n("moved") > 0 { format!(", {} moved while it ran", n("moved")) } else { String::new() },
            if damaged == 0 { "clean".to_string() } else { format!("{damaged} damaged") }
        );
    });
    Ok(if v["clean"].as_bool() == Some(true) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The bytes of index runs written at each level (level 0: flushes, and
/// the cleaner's rewrites of level-0 runs), and their sum per byte of
/// level 0: the index's write amplification. Shown by `stats` on a mount
/// (an image opened read-only wrote none) and by `import`.
pub fn index_writes(by_level: &[u64]) -> String {
    let total: u64 = by_level.iter().sum();
    let flushed = by_level.first().copied().unwrap_or(0);
    let levels: Vec<String> = by_level.iter().map(|n| n.to_string()).collect();
    let amp = if flushed > 0 {
        format!("{:.1} times what flushes wrote", total as f64 / flushed as f64)
    } else {
        "no flush".to_string()
    };
    format!("{total} bytes of runs since open (by level: {}): {amp}", levels.join(" "))
}
