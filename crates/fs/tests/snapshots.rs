//! Named snapshots (issue 28): a snapshot reads as the tree was when it
//! was taken, through later overwrites, deletes, reopens, cleaning (which
//! copies the blocks it reads and leaves forward records) and power cuts;
//! the blocks it reads stay held until it is deleted, which frees them;
//! fsck is clean throughout.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use zlogfs_engine::store::{CrashMode, FaultConfig, FaultStore, Geometry, Store};
use zlogfs_fs::{self as fs, CleanOptions, Fs, FsOptions, Kind, MkfsOptions, SetAttr, ROOT};

type Tree = BTreeMap<String, Vec<u8>>;

fn fresh() -> Arc<FaultStore> {
    fresh_with("none")
}

/// A fresh image whose automatic points follow `history`.
fn fresh_with(history: &str) -> Arc<FaultStore> {
    let st = Arc::new(FaultStore::new(Geometry { segment_size: 256 << 10, segment_count: 64 }));
    let s: Arc<dyn Store> = st.clone();
    let history = history.parse().expect("policy");
    let o = MkfsOptions { chunk_size: 16 << 10, pack_bytes: 32 << 10, history, ..MkfsOptions::default() };
    fs::mkfs(s, &o).expect("mkfs");
    st
}

fn open(st: &Arc<FaultStore>, snapshot: Option<&str>) -> fs::Result<Fs> {
    let s: Arc<dyn Store> = st.clone();
    let opts = FsOptions {
        commit_interval: None,
        read_only: snapshot.is_some(),
        snapshot: snapshot.map(str::to_string),
        ..FsOptions::default()
    };
    Fs::open(s, opts)
}

/// Every path with its contents (directories: "/").
fn dump(f: &Fs) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for e in f.readdir(dir, None, usize::MAX).expect("readdir") {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            if e.kind == Kind::Dir {
                out.insert(path.clone(), b"/".to_vec());
                stack.push((e.ino, path));
            } else {
                out.insert(path, f.read(e.ino, 0, 1 << 24).expect("read"));
            }
        }
    }
    out
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8 ^ seed).collect()
}

fn fsck_clean(f: &Fs, ctx: &str) {
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "{ctx}: fsck: {:?}", rep.problems);
}

/// The tree the snapshot is taken of.
fn setup(f: &Fs) {
    let d = f.mkdir(ROOT, b"d", 0o755, 0, 0).expect("mkdir");
    for (parent, name, n, seed) in
        [(ROOT, &b"a"[..], 100_000, 1u8), (ROOT, b"b", 3000, 2), (d.ino, b"c", 40_000, 3)]
    {
        let x = f.create(parent, name, 0o644, 0, 0).expect("create");
        f.write(x.ino, 0, &data(n, seed)).expect("write");
    }
    f.sync().expect("sync");
}

/// Changes after the snapshot: an overwrite, a delete, a new file, a
/// truncation.
fn change(f: &Fs) -> fs::Result<()> {
    let a = f.lookup(ROOT, b"a")?;
    f.write(a.ino, 0, &data(100_000, 9))?;
    f.unlink(ROOT, b"b")?;
    let e = f.create(ROOT, b"e", 0o644, 0, 0)?;
    f.write(e.ino, 0, &data(50_000, 7))?;
    let d = f.lookup(ROOT, b"d")?;
    let c = f.lookup(d.ino, b"c")?;
    f.setattr(c.ino, &SetAttr { size: Some(10), ..SetAttr::default() })?;
    f.sync()
}

#[test]
fn a_snapshot_reads_as_it_was_and_holds_its_blocks_until_deleted() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    setup(&f);
    let before = dump(&f);
    let snap = f.snapshot_create("s1").expect("snapshot");
    assert_eq!(f.snapshots().expect("list"), vec![("s1".to_string(), snap)]);
    let live_at_snapshot = f.engine().stats().live_bytes;
    change(&f).expect("change");
    let after = dump(&f);
    assert_ne!(before, after);
    assert!(f.engine().stats().live_bytes > live_at_snapshot, "the old blocks stay live");
    fsck_clean(&f, "with a snapshot");
    f.close().expect("close");

    let view = open(&st, Some("s1")).expect("open the snapshot");
    assert_eq!(dump(&view), before, "the snapshot reads as the tree was");
    assert!(view.create(ROOT, b"x", 0o644, 0, 0).is_err(), "a snapshot is read-only");
    drop(view);

    let f = open(&st, None).expect("reopen");
    assert_eq!(dump(&f), after, "the present after reopen");
    fsck_clean(&f, "after reopen");
    let freed = f.snapshot_delete("s1").expect("delete");
    assert!(freed > 0, "deleting the snapshot frees the blocks only it read");
    assert!(f.snapshots().expect("list").is_empty());
    fsck_clean(&f, "after the delete");
    f.clean(&CleanOptions::default(), &|_| {}).expect("cleaning runs again");
    assert_eq!(dump(&f), after);
    fsck_clean(&f, "after cleaning");
    f.close().expect("close");
    assert!(matches!(open(&st, Some("s1")), Err(fs::Error::NotFound(_))), "a deleted snapshot is gone");
    let f = open(&st, None).expect("reopen");
    assert_eq!(dump(&f), after);
    fsck_clean(&f, "at the end");
}

/// A view of a snapshot beside the writer (a mount's `.snapshots/NAME`):
/// it reads as the snapshot through the writer's changes and cleaning,
/// and once the snapshot is deleted the engine no longer keeps its point,
/// which is how the view's reader learns that a read may be torn.
#[test]
fn a_view_beside_the_writer_reads_the_snapshot_until_it_is_deleted() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    setup(&f);
    let before = dump(&f);
    f.snapshot_create("s1").expect("snapshot");
    let (view, seq) = f.view("s1", 1 << 20).expect("view");
    assert_eq!(dump(&view), before);
    change(&f).expect("change");
    let after = dump(&f);
    let gen = f.held_generation();
    f.clean(&everything(), &|_| {}).expect("clean");
    assert_ne!(f.held_generation(), gen, "cleaning moved held blocks: a view's reader must know");
    view.drop_cache();
    assert_eq!(dump(&view), before, "after the writer's changes and cleaning");
    assert!(view.create(ROOT, b"x", 0o644, 0, 0).is_err(), "a view is read-only");
    assert!(f.engine().retains(seq));
    assert!(matches!(f.view("nope", 1 << 20), Err(fs::Error::NotFound(_))));
    f.snapshot_delete("s1").expect("delete");
    assert!(!f.engine().retains(seq), "the deleted snapshot's point is let go");
    drop(view);
    assert_eq!(dump(&f), after);
    fsck_clean(&f, "after the delete");
}

/// Overwrites after a snapshot free the present's old blocks and the log
/// reuses free segments: the snapshot's blocks must not be among them.
#[test]
fn a_snapshot_survives_the_reuse_of_freed_space() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create");
    let noise = |seed: u64| common::noise(seed, 1 << 20);
    f.write(a.ino, 0, &noise(1)).expect("write");
    f.sync().expect("sync");
    f.snapshot_create("s").expect("snapshot");
    // Many times what the image holds: the log wraps into the segments
    // the old data left (cleaned, with the snapshot's blocks copied out),
    // and only the version the snapshot reads is held: the versions
    // written and overwritten after it are not.
    for round in 2..40 {
        f.write(a.ino, 0, &noise(round))
            .and_then(|_| f.sync())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    let held = f.held_bytes().expect("held");
    assert!((1 << 20..3 << 20).contains(&held), "the snapshot's version, about: {held}");
    fsck_clean(&f, "after the overwrites");
    f.close().expect("close");
    let view = open(&st, Some("s")).expect("open the snapshot");
    assert!(view.read(a.ino, 0, 1 << 20).expect("read the snapshot") == noise(1), "the snapshot's data");
    drop(view);
    // Deleting the snapshot on a full image works and gives the space back.
    let f = open(&st, None).expect("reopen");
    assert!(f.snapshot_delete("s").expect("delete") > 0);
    f.clean(&CleanOptions::default(), &|_| {}).expect("clean");
    f.write(a.ino, 0, &noise(99)).and_then(|_| f.sync()).expect("a write fits again");
    fsck_clean(&f, "after the delete");
}

/// Clean every segment that is not wholly live.
fn everything() -> CleanOptions {
    CleanOptions { max_live: 0.999, ..CleanOptions::default() }
}

/// Cleaning with snapshots: the blocks only they read are copied as they
/// are stored, with forward records, and cleaned again later (a copy
/// moved again); each snapshot reads as it was through it all, across
/// reopens; deleting them frees the copies and drops the records.
#[test]
fn cleaning_moves_what_snapshots_read() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    setup(&f);
    let first = dump(&f);
    f.snapshot_create("s1").expect("snapshot");
    change(&f).expect("change");
    let second = dump(&f);
    let rep = f.clean(&everything(), &|_| {}).expect("clean with a snapshot");
    assert!(rep.freed > 0 && rep.moved_bytes > 0, "cleaning runs and frees segments: {rep:?}");
    fsck_clean(&f, "after cleaning with s1");
    f.snapshot_create("s2").expect("snapshot");
    let a = f.lookup(ROOT, b"a").expect("a");
    f.write(a.ino, 0, &data(100_000, 11)).expect("write");
    f.unlink(ROOT, b"e").expect("unlink");
    f.sync().expect("sync");
    let third = dump(&f);
    for round in 0..3 {
        let rep = f.clean(&everything(), &|_| {}).expect("clean");
        fsck_clean(&f, &format!("clean round {round}"));
        if round == 0 {
            assert!(rep.freed > 0, "{rep:?}");
        }
    }
    f.close().expect("close");
    for (name, want) in [("s1", &first), ("s2", &second)] {
        let view = open(&st, Some(name)).expect("open a snapshot");
        assert_eq!(&dump(&view), want, "snapshot {name} reads as it was after cleaning");
    }
    let f = open(&st, None).expect("reopen");
    assert_eq!(dump(&f), third, "the present");
    assert!(f.snapshot_delete("s1").expect("delete s1") > 0, "s1 was the only reader of some blocks");
    fsck_clean(&f, "after deleting s1");
    f.close().expect("close");
    let view = open(&st, Some("s2")).expect("open s2");
    assert_eq!(dump(&view), second, "s2 after s1 went");
    drop(view);
    let f = open(&st, None).expect("reopen");
    f.snapshot_delete("s2").expect("delete s2");
    assert_eq!(f.held_bytes().expect("held"), 0, "nothing held");
    f.clean(&everything(), &|_| {}).expect("clean");
    assert_eq!(dump(&f), third, "the present at the end");
    fsck_clean(&f, "at the end");
}

/// A block is held only for the snapshots taken after it was written and
/// before it was freed: each snapshot's delete frees what only it read
/// (not just the oldest's), `snapshot_usage` says how much beforehand,
/// and data written and overwritten after the last snapshot is not held.
#[test]
fn each_snapshot_holds_only_the_blocks_it_reads() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    let noise = |seed: u64| common::noise(seed, 200_000);
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create");
    f.write(a.ino, 0, &noise(1)).expect("write");
    f.sync().expect("sync");
    f.snapshot_create("s1").expect("s1");
    let s1_tree = dump(&f);
    f.write(a.ino, 0, &noise(2)).expect("overwrite");
    let n = f.create(ROOT, b"n", 0o644, 0, 0).expect("create");
    f.write(n.ino, 0, &noise(3)).expect("write");
    f.sync().expect("sync");
    let only_s1 = f.held_bytes().expect("held");
    assert!(only_s1 >= 200_000, "the first version of a is held for s1: {only_s1}");
    f.snapshot_create("s2").expect("s2");
    let s2_tree = dump(&f);
    f.write(a.ino, 0, &noise(4)).expect("overwrite");
    f.write(n.ino, 0, &noise(5)).expect("overwrite");
    f.sync().expect("sync");
    let held = f.held_bytes().expect("held");
    assert!(held - only_s1 >= 400_000, "the second a and the first n are held for s2: {held}");
    // Written and overwritten after the last snapshot: not held.
    let x = f.create(ROOT, b"x", 0o644, 0, 0).expect("create");
    f.write(x.ino, 0, &noise(6)).expect("write");
    f.sync().expect("sync");
    f.write(x.ino, 0, &noise(7)).expect("overwrite");
    f.sync().expect("sync");
    assert_eq!(f.held_bytes().expect("held"), held, "nothing of x is held");
    // A block counts as born when its segment started to take blocks: the
    // blocks written after s1 into the segment then being filled count as
    // read by s1 too, so "only s2" is a little less than what s2 reads.
    let usage = f.snapshot_usage().expect("usage");
    let names: Vec<&str> = usage.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["s1", "s2"]);
    let s2_only = usage[1].2;
    assert!((300_000..=held - only_s1).contains(&s2_only), "{usage:?}");
    assert_eq!(f.snapshot_delete("s2").expect("delete s2"), s2_only, "the newer one frees what only it read");
    let left = f.held_bytes().expect("held");
    assert_eq!(left, held - s2_only);
    fsck_clean(&f, "after deleting s2");
    f.clean(&everything(), &|_| {}).expect("clean");
    f.close().expect("close");
    let view = open(&st, Some("s1")).expect("open s1");
    assert_eq!(dump(&view), s1_tree, "s1 reads as it was");
    assert_ne!(s1_tree, s2_tree);
    drop(view);
    let f = open(&st, None).expect("reopen");
    assert_eq!(f.snapshot_delete("s1").expect("delete s1"), left);
    assert_eq!(f.held_bytes().expect("held"), 0);
    fsck_clean(&f, "at the end");
}

/// A read-only open at a time (`at=`) reads the newest kept point at or
/// before it, or the one a clock token names; other times and tokens are
/// refused with what is kept.
#[test]
fn the_past_opens_at_a_time_or_a_clock_token() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    setup(&f);
    let first = dump(&f);
    let s1 = f.snapshot_create("s1").expect("s1");
    change(&f).expect("change");
    let second = dump(&f);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let s2 = f.snapshot_create("s2").expect("s2");
    let token = f.clock(s1.seq);
    let not_kept = f.clock(s1.seq + 1);
    f.close().expect("close");
    let at = |spec: &str| {
        let s: Arc<dyn Store> = st.clone();
        Fs::open(
            s,
            FsOptions {
                read_only: true,
                at: Some(spec.into()),
                commit_interval: None,
                ..FsOptions::default()
            },
        )
    };
    let iso = |t: fs::Time| humantime::format_rfc3339_millis(t.to_system()).to_string();
    assert_eq!(dump(&at(&iso(s1.time)).expect("at s1's time")), first);
    assert_eq!(dump(&at(&iso(s2.time)).expect("at s2's time")), second);
    assert_eq!(dump(&at("2100-01-01").expect("the future: the newest")), second);
    assert_eq!(dump(&at(&token).expect("a token of a kept point")), first);
    assert!(matches!(at("2000-01-01"), Err(fs::Error::NotFound(_))), "before the oldest");
    assert!(matches!(at(&not_kept), Err(fs::Error::NotFound(_))), "a point not kept");
    assert!(matches!(at("yesterday-ish"), Err(fs::Error::Invalid(_))));
    let s: Arc<dyn Store> = st.clone();
    let rw = Fs::open(s, FsOptions { at: Some("2100-01-01".into()), ..FsOptions::default() });
    assert!(matches!(rw, Err(fs::Error::Invalid(_))), "the past opens read-only");
}

/// With every commit kept as a point, overwrites many times the image's
/// size never get ENOSPC: the oldest automatic points go first, a named
/// snapshot never does, and fsck stays clean.
#[test]
fn automatic_points_make_room_before_enospc_and_named_snapshots_stay() {
    let st = fresh_with("all:1h,hourly:2d,daily:31d");
    let f = open(&st, None).expect("open");
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create");
    let noise = |seed: u64| common::noise(seed, 1 << 20);
    f.write(a.ino, 0, &noise(1)).expect("write");
    f.sync().expect("sync");
    f.snapshot_create("keep").expect("snapshot");
    for round in 2..60 {
        f.write(a.ino, 0, &noise(round))
            .and_then(|_| f.sync())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    assert!(f.stats().points_dropped > 0, "points were dropped for room");
    let names: Vec<String> = f.snapshots().expect("list").into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"keep".to_string()), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with('@')), "the newest points stay: {names:?}");
    fsck_clean(&f, "after the overwrites");
    f.close().expect("close");
    let view = open(&st, Some("keep")).expect("open the snapshot");
    assert!(view.read(a.ino, 0, 1 << 20).expect("read") == noise(1), "the named snapshot's data");
}

/// A log filled by named snapshots' blocks: overwrites until ENOSPC,
/// then `clean` moves what it has room to move and ends with its report
/// (a `stopped` reason when the log ran out of room part way), never an
/// error; every snapshot reads as it was and fsck stays clean.
#[test]
fn clean_on_a_log_full_of_snapshots_stops_with_its_report() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create");
    let noise = |seed: u64| common::noise(seed, 192 << 10);
    let mut kept = Vec::new();
    for round in 0..200u64 {
        let at = (round % 5) * (96 << 10);
        match f.write(a.ino, at, &noise(round)).and_then(|_| f.sync()) {
            Ok(()) => {}
            Err(fs::Error::NoSpace(_)) => break,
            Err(e) => panic!("round {round}: {e}"),
        }
        if round % 3 == 2 {
            continue; // dead space for the cleaner to find
        }
        let name = format!("s{round}");
        match f.snapshot_create(&name) {
            Ok(_) => kept.push((name, f.read(a.ino, 0, 1 << 20).expect("read"))),
            Err(fs::Error::NoSpace(_)) => break,
            Err(e) => panic!("snapshot {name}: {e}"),
        }
    }
    assert!(kept.len() > 10, "the snapshots filled the log: {}", kept.len());
    let mut stopped = 0;
    for pass in 0..3 {
        let rep = f.clean(&everything(), &|_| {}).unwrap_or_else(|e| panic!("clean pass {pass}: {e}"));
        stopped += usize::from(rep.stopped.is_some());
    }
    fsck_clean(&f, "after cleaning a full log");
    f.close().expect("close");
    for (name, want) in &kept {
        let view = open(&st, Some(name)).expect("open the snapshot");
        assert!(view.read(a.ino, 0, 1 << 20).expect("read") == *want, "snapshot {name} reads as it was");
    }
    eprintln!("{} snapshots; {stopped} of 3 passes stopped for room", kept.len());
}

/// Cleaning segments of pack blocks whose every member a snapshot keeps:
/// each block has hundreds of held parts, and their moved records are
/// committed a slice at a time that fits a journal block (sized by parts,
/// not blocks: a slice of whole blocks overflowed it).
#[test]
fn cleaning_blocks_of_many_held_parts_fits_the_journal() {
    let st = Arc::new(FaultStore::new(Geometry { segment_size: 256 << 10, segment_count: 64 }));
    let s: Arc<dyn Store> = st.clone();
    let o =
        MkfsOptions { chunk_size: 16 << 10, pack_bytes: 32 << 10, inline_max: 0, ..MkfsOptions::default() };
    fs::mkfs(s, &o).expect("mkfs");
    let f = open(&st, None).expect("open");
    let d = f.mkdir(ROOT, b"d", 0o755, 0, 0).expect("mkdir");
    for i in 0..6000u64 {
        let x = f.create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0).expect("create");
        f.write(x.ino, 0, &common::noise(i, 48)).expect("write");
    }
    f.sync().expect("sync");
    // Half the members die before the snapshot: the packs' segments are
    // worth cleaning; the other half die after it and are held.
    for i in (1..6000u64).step_by(2) {
        f.unlink(d.ino, format!("f{i}").as_bytes()).expect("unlink");
    }
    f.sync().expect("sync");
    let before = dump(&f);
    f.snapshot_create("s").expect("snapshot");
    for i in (0..6000u64).step_by(2) {
        f.unlink(d.ino, format!("f{i}").as_bytes()).expect("unlink");
    }
    f.sync().expect("sync");
    let rep = f.clean(&everything(), &|_| {}).expect("clean segments of many held parts");
    assert!(rep.moved_bytes > 0, "held blocks moved: {rep:?}");
    fsck_clean(&f, "after cleaning");
    f.close().expect("close");
    let view = open(&st, Some("s")).expect("open the snapshot");
    assert!(dump(&view) == before, "the snapshot reads as it was after cleaning");
}

/// Statfs counts what only automatic points hold as free (a writer short
/// of room drops them first), and what a named snapshot holds as used.
#[test]
fn statfs_counts_what_only_automatic_points_hold_as_free() {
    let st = fresh_with("all:1h");
    let f = open(&st, None).expect("open");
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create");
    let noise = |seed: u64| common::noise(seed, 2 << 20);
    let free = |f: &Fs| f.statfs().expect("statfs").bfree * 4096;
    f.write(a.ino, 0, &noise(1)).expect("write");
    f.sync().expect("sync");
    let before = free(&f);
    f.write(a.ino, 0, &noise(2)).expect("overwrite");
    f.sync().expect("sync");
    let held = f.held_bytes().expect("held");
    assert!(held >= 2 << 20, "the overwritten data is held for the points: {held}");
    std::thread::sleep(std::time::Duration::from_millis(2100)); // statfs counts again
                                                                // Within the bytes the index and the records took.
    let slack = 256 << 10;
    assert!(free(&f) + slack >= before, "held only for points, so free: {before} -> {}", free(&f));
    // A named snapshot reads the present: what the points hold still
    // counts free; after one more overwrite, what it holds does not.
    f.snapshot_create("keep").expect("snapshot");
    f.write(a.ino, 0, &noise(3)).expect("overwrite");
    f.sync().expect("sync");
    std::thread::sleep(std::time::Duration::from_millis(2100)); // statfs counts again
    let now = free(&f);
    assert!(now + (2 << 20) <= before + slack, "the snapshot's 2 MiB are used: {before} -> {now}");
    assert!(now + (4 << 20) > before, "the points' are not: {before} -> {now}");
}

#[test]
fn snapshots_are_named_once_and_opened_read_only() {
    let st = fresh();
    let f = open(&st, None).expect("open");
    for bad in ["", ".", "..", "a/b", "tab\there", &"x".repeat(256)] {
        assert!(matches!(f.snapshot_create(bad), Err(fs::Error::Invalid(_))), "{bad:?}");
    }
    f.snapshot_create("one").expect("create");
    assert!(matches!(f.snapshot_create("one"), Err(fs::Error::Exists(_))));
    assert!(matches!(f.snapshot_delete("two"), Err(fs::Error::NotFound(_))));
    f.close().expect("close");
    let s: Arc<dyn Store> = st.clone();
    let rw = Fs::open(s, FsOptions { snapshot: Some("one".into()), ..FsOptions::default() });
    assert!(matches!(rw, Err(fs::Error::Invalid(_))), "a snapshot opens read-only");
}

/// A power cut after every device operation of: take a snapshot, change
/// the tree, clean every segment, delete the snapshot. After each, fsck is clean, the present
/// is the tree before or after the changes, and a snapshot that survived
/// reads as the tree before them.
#[test]
fn power_cuts_during_snapshot_create_change_and_delete() {
    let run = |st: &Arc<FaultStore>| {
        let f = open(st, None)?;
        f.snapshot_create("s")?;
        change(&f)?;
        f.clean(&everything(), &|_| {})?;
        f.snapshot_delete("s")?;
        f.close()
    };
    let prepare = || {
        let st = fresh();
        let f = open(&st, None).expect("open");
        setup(&f);
        let before = dump(&f);
        f.close().expect("close");
        (st, before)
    };
    let (dry, before) = prepare();
    let base = dry.op_count();
    run(&dry).expect("a run without faults");
    let total = dry.op_count() - base;
    let after = dump(&open(&dry, None).expect("open"));
    let modes = [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder];
    let seed = common::seed("power_cuts_during_snapshot_create_change_and_delete");
    for cut in 0..total {
        let (st, _) = prepare();
        st.set_faults(FaultConfig { dead_after: Some(cut), ..FaultConfig::default() });
        let _ = run(&st);
        let mode = modes[(cut % 3) as usize];
        st.power_cut(mode, seed ^ cut);
        let ctx = format!("cut after device operation {cut} of {total} ({mode:?}), seed {seed}");
        let f = open(&st, None).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        let now = dump(&f);
        assert!(now == before || now == after, "{ctx}: the present is neither before nor after the changes");
        fsck_clean(&f, &ctx);
        let kept = f.snapshots().expect("list");
        drop(f);
        if !kept.is_empty() {
            let view = open(&st, Some("s")).unwrap_or_else(|e| panic!("{ctx}: open the snapshot: {e}"));
            assert_eq!(dump(&view), before, "{ctx}: the snapshot reads as the tree before");
        }
    }
    eprintln!("{total} cut points");
}
