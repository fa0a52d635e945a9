//! The reports of the admin commands (`stats`, `du`, `fsck`) as JSON. The
//! same function answers for an image the command opened itself and, over
//! the control channel, for a mounted one in its daemon: the two give the
//! same answer by construction. The command prints the JSON as it is
//! (`--json`) or as text.

use serde_json::{json, Map, Value};

use super::{resolve, Result};
use zlogfs_fs::{CheckReport, Fs, Kind, ScrubReport, TreeUsage, ROOT, XATTR_CHUNK, XATTR_COLD, XATTR_UNIT};

/// What `zlogfs stats` reports: the image's space, tree, codecs, index,
/// lifetime writes, and this process's errors of background work.
pub fn stats(image: &str, fs: &Fs) -> Result<Value> {
    // Before the walk below, which fills the index cache.
    let index_cache_bytes = fs.engine().index_cache_bytes();
    let block_cache_bytes = fs.block_cache_bytes();
    let u = fs.usage()?;
    let e = fs.engine();
    let s = e.stats();
    let g = e.superblock().geometry;
    let files = u.tree.files + u.tree.dirs + u.tree.others;
    let ratio = u.tree.logical as f64 / u.tree.physical.max(1) as f64;
    // Free counts what cleaning can reclaim, as statfs does, but not what
    // only automatic points hold (statfs counts that free too; it is
    // history_purgeable_bytes); how much more logical data fits is
    // estimated at the ratio seen so far.
    let (usable, free_phys) = e.capacity();
    let amp =
        (u.counters.user_bytes > 0).then(|| u.counters.device_bytes as f64 / u.counters.user_bytes as f64);
    let codecs: Map<String, Value> = u
        .codecs
        .iter()
        .map(|(k, c)| (k.clone(), json!({"blocks": c.blocks, "logical": c.raw, "stored": c.stored})))
        .collect();
    let fst = fs.stats();
    let volumes = volumes(fs)?;
    let all = fs.snapshots()?;
    let points = all.iter().filter(|(n, _)| n.starts_with('@')).count();
    let (snapshots, held) = (all.len() - points, fs.held_bytes()?);
    Ok(json!({
        "image": image,
        "format_version": e.superblock().version, "records_version": fs.config().version,
        "segment_size": g.segment_size, "segments": s.segments, "free_segments": s.free_segments,
        "live_bytes": s.live_bytes,
        "files": u.tree.files, "dirs": u.tree.dirs, "other_inodes": u.tree.others, "inodes": u.inodes,
        "logical_bytes": u.tree.logical, "allocated_bytes": u.tree.allocated, "physical_bytes": u.tree.physical,
        "ratio": ratio, "inline_bytes": u.inline_bytes, "codecs": codecs,
        "patched_chunks": u.patched_chunks, "bases_gone": u.bases_gone, "patch_bytes": u.patch_bytes,
        "patch_released_bytes": u.patch_released,
        "inode_bytes_raw": u.inode_bytes_raw, "inode_bytes_compressed": u.inode_bytes_compressed,
        "bytes_per_inode": u.inode_bytes_compressed as f64 / u.inodes.max(1) as f64,
        "index_bytes": s.run_bytes, "metadata_bytes_per_file": s.run_bytes as f64 / files.max(1) as f64,
        "triples": u.triples, "index_runs": s.runs, "index_runs_by_level": s.runs_by_level, "memtable_entries": s.memtable_entries,
        "memtable_bytes": s.memtable_bytes, "index_cache_bytes": index_cache_bytes,
        "block_cache_bytes": block_cache_bytes,
        "index_bytes_written_by_level_since_open": s.index_written_by_level,
        "checkpoint": s.checkpoint, "pinned_segments": s.pinned_segments,
        "user_bytes_written": u.counters.user_bytes, "device_bytes_written": u.counters.device_bytes,
        "device_bytes_per_user_byte": amp,
        "reserve_segments": s.reserve_segments, "usable_bytes": usable, "physical_used_bytes": s.live_bytes,
        "physical_free_bytes": free_phys, "dead_bytes": e.dead_bytes(), "logical_used_bytes": u.tree.logical,
        "estimated_logical_bytes_that_fit": (free_phys as f64 * ratio.max(1.0)) as u64,
        "background_errors": fst.background_errors,
        "last_background_error": fst.last_background_error,
        "engine_background_error": fst.engine_background_error,
        "volumes": volumes,
        "snapshots": snapshots, "automatic_points": points, "history_policy": fs.history_policy().to_string(),
        "points_dropped_for_room": fst.points_dropped, "snapshot_held_bytes": held,
        "history_purgeable_bytes": fs.purgeable_bytes()?,
        "devices": devices(&s, g.segment_size, e.store_names()),
        "object_store": s.remote.as_ref().map(|r| json!({
            "puts": r.puts, "gets": r.gets, "lists": r.lists, "deletes": r.deletes,
            "bytes_up": r.bytes_up, "bytes_down": r.bytes_down,
            "cache_hits": r.cache_hits, "cache_misses": r.cache_misses,
            "upload_backlog_bytes": r.backlog_bytes, "manifest": r.manifest,
            "failed_attempts": r.failed_attempts,
        })),
    }))
}

/// Each device's share (one entry for an image of one device): its role,
/// path when known, capacity, live and free bytes, its live bytes by
/// class (index runs, which hold directories, inodes and inline files;
/// the journal; checkpoints; file data, with index blocks merged away
/// until the next checkpoint), and the stored bytes of each kind of
/// block written to it since open.
fn devices(s: &zlogfs_engine::engine::EngineStats, seg: u32, names: Option<(String, String)>) -> Vec<Value> {
    let one = |role: &str, path: Option<String>, d: &zlogfs_engine::engine::DeviceStats| {
        let kinds: serde_json::Map<String, Value> = zlogfs_engine::BlockKind::ALL
            .iter()
            .map(|k| (k.name().to_string(), json!(d.kind_bytes[*k as usize])))
            .collect();
        json!({
            "role": role, "path": path, "segments": d.segments, "free_segments": d.free_segments,
            "capacity_bytes": u64::from(d.segments) * u64::from(seg), "live_bytes": d.live_bytes,
            "free_bytes": u64::from(d.free_segments) * u64::from(seg), "written_since_open_by_kind": kinds,
            "live_by_class": {
                "index": d.index_bytes, "journal": d.journal_bytes, "checkpoints": d.checkpoint_bytes,
                "file_data": d.other_bytes(),
            },
        })
    };
    match (&s.bulk, names) {
        (Some(b), n) => {
            let (f, bn) = n.map_or((None, None), |(f, b)| (Some(f), Some(b)));
            vec![one("fast", f, &s.fast), one("bulk", bn, b)]
        }
        (None, _) => vec![one("only", None, &s.fast)],
    }
}

/// The volumes: regular files with a chunk size of their own (what
/// `zlogfs nbd --create` makes, or `user.zlogfs.chunk` set), each with
/// its path, chunk size, compression unit and cold form ("" for none),
/// and logical, allocated and stored bytes.
fn volumes(fs: &Fs) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut stack = vec![(ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.readdir(dir, after.as_deref(), 1024)?;
            let Some(l) = page.last() else { break };
            after = Some(l.name.clone());
            for e in page {
                let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
                match e.kind {
                    Kind::Dir => stack.push((e.ino, path)),
                    Kind::File => {
                        let chunk = match fs.getxattr(e.ino, XATTR_CHUNK) {
                            Ok(c) => String::from_utf8_lossy(&c).into_owned(),
                            Err(zlogfs_fs::Error::NoAttr(_)) => continue,
                            Err(e) => return Err(e.into()),
                        };
                        let mut row = usage_row(&path, &fs.du(e.ino)?);
                        row["chunk"] = Value::from(chunk);
                        row["unit"] = Value::from(setting_or_empty(fs, e.ino, XATTR_UNIT)?);
                        row["cold"] = Value::from(setting_or_empty(fs, e.ino, XATTR_COLD)?);
                        out.push(row);
                    }
                    _ => {}
                }
            }
        }
    }
    out.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    Ok(out)
}

/// The value of zlogfs setting `name` of `ino`, "" when it has none.
fn setting_or_empty(fs: &Fs, ino: u64, name: &[u8]) -> Result<String> {
    match fs.getxattr(ino, name) {
        Ok(u) => Ok(String::from_utf8_lossy(&u).into_owned()),
        Err(zlogfs_fs::Error::NoAttr(_)) => Ok(String::new()),
        Err(e) => Err(e.into()),
    }
}

fn usage_row(path: &str, u: &TreeUsage) -> Value {
    json!({"path": path, "files": u.files, "dirs": u.dirs, "logical": u.logical, "allocated": u.allocated,
        "physical": u.physical, "ratio": u.logical as f64 / u.physical.max(1) as f64})
}

/// What `zlogfs du` reports: the logical and stored bytes of `path` and,
/// for a directory, of each entry in it.
pub fn du(fs: &Fs, path: &str) -> Result<Value> {
    let ino = resolve(fs, path)?;
    let mut entries = Vec::new();
    if fs.getattr(ino)?.kind == Kind::Dir {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.readdir(ino, after.as_deref(), 1024)?;
            let Some(l) = page.last() else { break };
            after = Some(l.name.clone());
            for e in page {
                entries.push(usage_row(&String::from_utf8_lossy(&e.name), &fs.du(e.ino)?));
            }
        }
    }
    Ok(json!({"total": usage_row(path, &fs.du(ino)?), "entries": entries}))
}

/// What `zlogfs snapshot ACTION` answers: `create` and `delete` the
/// snapshot `name`, or `list` them (oldest first, with when they were
/// taken and what deleting each alone frees now).
pub fn snapshot(fs: &Fs, action: &str, name: Option<&str>) -> Result<Value> {
    let named = || name.ok_or_else(|| zlogfs_fs::Error::Invalid(format!("snapshot {action} needs a name")));
    let time = |t: zlogfs_fs::Time| humantime::format_rfc3339_seconds(t.to_system()).to_string();
    Ok(match action {
        "create" => {
            let s = fs.snapshot_create(named()?)?;
            json!({"created": named()?, "seq": s.seq, "time": time(s.time)})
        }
        "delete" => {
            let freed = fs.snapshot_delete(named()?)?;
            json!({"deleted": named()?, "freed_bytes": freed})
        }
        "policy" => {
            if let Some(spec) = name {
                fs.set_history_policy(spec.parse()?)?;
            }
            json!({"policy": fs.history_policy().to_string()})
        }
        "list" => {
            let rows: Vec<Value> = fs
                .snapshot_usage()?
                .into_iter()
                .map(|(n, s, frees)| {
                    json!({"name": n, "seq": s.seq, "time": time(s.time), "frees_bytes": frees,
                        "automatic": n.starts_with('@')})
                })
                .collect();
            json!({"snapshots": rows})
        }
        a => {
            return Err(zlogfs_fs::Error::Invalid(format!(
                "unknown snapshot action {a:?} (create, list, delete, policy)"
            ))
            .into())
        }
    })
}

/// A point of `fs` named by `spec`: a clock token, a snapshot's name, an
/// ISO 8601 time, or a duration meaning that long ago. None: the change
/// records kept do not reach it, or the token is another image's.
fn point(fs: &Fs, spec: &str) -> Result<Option<u64>> {
    if spec.starts_with("zlogfs:") {
        return Ok(fs.parse_clock(spec)?);
    }
    if let Some((_, s)) = fs.snapshots()?.into_iter().find(|(n, _)| n == spec) {
        return Ok(Some(s.seq));
    }
    let t = zlogfs_fs::parse_time(spec).map_err(|_| {
        zlogfs_fs::Error::Invalid(format!(
            "{spec:?} is not a clock token, a snapshot, an ISO 8601 time (2026-11-26T10:00:00Z, 2026-11-26) \
             or a duration (2h, 3days)"
        ))
    })?;
    Ok(fs.point_at(t)?)
}

/// The time a point names, when it is given as a time (not a clock token
/// or a snapshot's name).
fn time_of(fs: &Fs, spec: &str) -> Result<Option<std::time::SystemTime>> {
    if spec.starts_with("zlogfs:") || fs.snapshots()?.iter().any(|(n, _)| n == spec) {
        return Ok(None);
    }
    Ok(zlogfs_fs::parse_time(spec).ok().map(|t| t.to_system()))
}

/// A window of times the records can never answer is an error, not an
/// empty list: a start or an end in the future, or an end before the
/// start (docs/SEMANTICS.md, the change feed).
fn check_window(fs: &Fs, since: &str, until: Option<&str>) -> Result<()> {
    let now = std::time::SystemTime::now();
    let s = time_of(fs, since)?;
    if s.is_some_and(|t| t > now) {
        return Err(zlogfs_fs::Error::Invalid(format!("--since {since:?} is in the future")).into());
    }
    let Some(until) = until else { return Ok(()) };
    let u = time_of(fs, until)?;
    if u.is_some_and(|t| t > now) {
        return Err(zlogfs_fs::Error::Invalid(format!("--until {until:?} is in the future")).into());
    }
    if let (Some(s), Some(u)) = (s, u) {
        if u < s {
            return Err(
                zlogfs_fs::Error::Invalid(format!("--until {until:?} is before --since {since:?}")).into()
            );
        }
    }
    Ok(())
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "dir",
        Kind::Symlink => "symlink",
        Kind::Fifo => "fifo",
        Kind::Socket => "socket",
        Kind::Char => "char",
        Kind::Block => "block",
    }
}

/// What `zlogfs changes` reports: the changes from `since` to `until`
/// (None: now), and the clock token to pass as `--since` next time.
pub fn changes(fs: &Fs, since: &str, until: Option<&str>) -> Result<Value> {
    check_window(fs, since, until)?;
    let until_seq = match until {
        None => Some(fs.point_now()?),
        Some(u) => point(fs, u)?,
    };
    let (Some(s), Some(u)) = (point(fs, since)?, until_seq) else {
        let u = until_seq.unwrap_or(fs.point_now()?);
        return Ok(json!({"fresh_instance": true, "clock": fs.clock(u), "until": u, "changes": []}));
    };
    let feed = fs.changes(s, Some(u))?;
    let path = |p: &Option<Vec<u8>>| p.as_deref().map(|p| String::from_utf8_lossy(p).into_owned());
    let rows: Vec<Value> = feed
        .changes
        .iter()
        .map(|c| {
            let mut v = json!({"op": c.op.name(), "path": path(&c.path), "kind": kind_name(c.kind), "ino": c.ino,
                "data": c.data, "metadata": c.metadata});
            if c.old_path.is_some() {
                v["old_path"] = json!(path(&c.old_path));
            }
            v
        })
        .collect();
    Ok(json!({"fresh_instance": feed.fresh_instance, "since": feed.since, "until": feed.until,
        "clock": fs.clock(feed.until), "changes": rows}))
}

/// What `zlogfs fsck` reports: every problem found, the counts checked,
/// what was repaired first.
pub fn fsck(
    image: &str,
    fs: &Fs,
    repaired: &[String],
    memory: u64,
    progress: &dyn Fn(u64, u64),
) -> Result<Value> {
    let memory = usize::try_from(memory).unwrap_or(usize::MAX);
    let rep: CheckReport = fs.check_within(memory, progress)?;
    Ok(json!({"image": image, "clean": rep.problems.is_empty(), "opened": true, "problems": rep.problems,
        "inodes": rep.inodes, "dirents": rep.dirents, "extents": rep.extents, "blocks": rep.blocks,
        "block_bytes": rep.block_bytes, "xattrs": rep.xattrs, "orphans": rep.orphans,
        "leaked_bytes": rep.leaked_bytes(), "repaired": repaired,
        "inode_passes": rep.passes.0, "block_passes": rep.passes.1,
        "leaked": rep.leaked.iter().map(|(s, b)| json!({"segment": s, "bytes": b})).collect::<Vec<_>>()}))
}

/// What `zlogfs scrub` reports.
pub fn scrub(target: &str, rep: &ScrubReport, seconds: f64) -> Value {
    json!({"target": target, "clean": rep.damaged.is_empty(), "blocks": rep.blocks, "bytes": rep.bytes,
        "moved": rep.moved, "damaged": rep.damaged, "seconds": seconds})
}

/// A scrub's progress line.
pub fn scrub_progress(rep: &ScrubReport) -> Value {
    json!({"done": rep.bytes, "total": rep.total.max(rep.bytes), "blocks": rep.blocks, "damaged": rep.damaged.len()})
}
