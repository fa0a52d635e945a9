//! An image of two stores (issue 29): the journal, the index and small
//! files on a fast store, large files' chunks on a bulk one. Placement by
//! class; power cuts to either store or both, at random points, give a
//! prefix of what was done since the last sync; a store that fails while
//! the other works latches the file system and loses nothing synced; a
//! full fast store spills to the bulk one; a wrong or missing partner is
//! refused with a message that says which.
//!
//! Replay a failure with the seed it prints: `ZLOGFS_SEED=n cargo test
//! -p zlogfs-fs --test two_devices`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zlogfs_engine::store::{CrashMode, FaultConfig, FaultStore, Geometry, OpKind, Store, TwoStore};
use zlogfs_engine::BlockKind;
use zlogfs_fs::{self as fs, Fs, FsOptions, MkfsOptions, ROOT};

const SEG: u32 = 256 << 10;

/// The two stores of an image and the store that joins them.
struct Rig {
    fast: Arc<FaultStore>,
    bulk: Arc<FaultStore>,
}

impl Rig {
    fn new(fast_segs: u32, bulk_segs: u32) -> Rig {
        let rig = Rig {
            fast: Arc::new(FaultStore::new(Geometry { segment_size: SEG, segment_count: fast_segs })),
            bulk: Arc::new(FaultStore::new(Geometry { segment_size: SEG, segment_count: bulk_segs })),
        };
        let o = MkfsOptions {
            chunk_size: 32 << 10,
            pack_bytes: 32 << 10,
            history: fs::HistoryPolicy::NONE,
            ..MkfsOptions::default()
        };
        fs::mkfs(rig.store(false), &o).expect("mkfs on two stores");
        rig
    }

    fn store(&self, check: bool) -> Arc<dyn Store> {
        let names = ("fast.img".to_string(), "bulk.img".to_string());
        let two = TwoStore::new(self.fast.clone(), self.bulk.clone(), names, check).expect("two stores");
        Arc::new(two)
    }

    fn open(&self) -> fs::Result<Fs> {
        // Small groups: commits (and batches written, not synced) between
        // the syncs.
        let opts = FsOptions {
            engine: common::small_opts(),
            commit_interval: None,
            dirty_bytes: 128 << 10,
            ..FsOptions::default()
        };
        Fs::open(self.store(true), opts)
    }
}

type Tree = BTreeMap<String, Vec<u8>>;

fn dump(f: &Fs) -> Tree {
    let mut t = Tree::new();
    for e in f.readdir(ROOT, None, usize::MAX).expect("readdir") {
        t.insert(String::from_utf8_lossy(&e.name).into_owned(), f.read(e.ino, 0, 1 << 24).expect("read"));
    }
    t
}

fn fsck_clean(f: &Fs, ctx: &str) {
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "{ctx}: fsck: {:?}", rep.problems);
}

/// Bytes that compress about as well as real data does (a little).
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..len).map(|i| if i % 3 == 0 { r.gen() } else { (i / 7) as u8 }).collect()
}

/// Bytes written to a store's segments (its metadata slots aside).
fn segment_bytes(s: &FaultStore) -> u64 {
    s.written_segments().iter().map(|&(_, n)| u64::from(n)).sum()
}

#[test]
fn large_files_go_to_the_bulk_store_and_the_rest_to_the_fast_one() {
    let rig = Rig::new(16, 48);
    let f = rig.open().expect("open");
    let (fast0, bulk0) = (segment_bytes(&rig.fast), segment_bytes(&rig.bulk));
    let mut want = Tree::new();
    for i in 0..40u64 {
        let name = format!("small{i}");
        let d = data(i, 2000 + i as usize * 50);
        let a = f.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create");
        f.write(a.ino, 0, &d).expect("write");
        want.insert(name, d);
    }
    f.sync().expect("sync");
    let small_fast = segment_bytes(&rig.fast) - fast0;
    assert_eq!(segment_bytes(&rig.bulk), bulk0, "small files wrote nothing to the bulk store");
    for i in 0..3u64 {
        let name = format!("large{i}");
        let d = data(100 + i, 3 << 20);
        let a = f.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create");
        f.write(a.ino, 0, &d).expect("write");
        want.insert(name, d);
    }
    f.sync().expect("sync");
    let bulk = segment_bytes(&rig.bulk) - bulk0;
    let fast = segment_bytes(&rig.fast) - fast0 - small_fast;
    assert!(bulk > 3 << 20, "the large files' chunks are on the bulk store: {bulk} bytes");
    assert!(fast < bulk / 8, "the fast store took their records only: {fast} bytes against {bulk}");
    fsck_clean(&f, "after the writes");
    f.close().expect("close");
    let f = rig.open().expect("reopen");
    assert!(dump(&f) == want, "the tree reads back after a reopen");
}

#[test]
fn a_wrong_or_missing_partner_is_refused() {
    let rig = Rig::new(8, 16);
    let other = Rig::new(8, 16);
    // The bulk store alone.
    let alone: Arc<dyn Store> = rig.bulk.clone();
    let e = Fs::open(alone, FsOptions::default()).err().expect("the bulk store alone is refused").to_string();
    assert!(e.contains("fast device") && e.contains("fast.img"), "{e}");
    // The fast store alone.
    let alone: Arc<dyn Store> = rig.fast.clone();
    let e = Fs::open(alone, FsOptions::default()).err().expect("the fast store alone is refused").to_string();
    assert!(e.contains("fast device of a two-device image"), "{e}");
    // Another image's fast store.
    let names = ("other-fast.img".to_string(), "bulk.img".to_string());
    let e =
        TwoStore::new(other.fast.clone(), rig.bulk.clone(), names, true).err().expect("refused").to_string();
    assert!(e.contains("another image"), "{e}");
    // The two swapped.
    let names = ("bulk.img".to_string(), "fast.img".to_string());
    let e = TwoStore::new(rig.bulk.clone(), rig.fast.clone(), names.clone(), true).err().expect("refused");
    assert!(e.to_string().contains("not the bulk device"), "{e}");
    // The right pair opens.
    rig.open().expect("the right pair");
}

/// The two devices are tied in time (issue 44, item 4): a read-write
/// use moves both pairing records on at its open and its clean close, a
/// copy of one device taken before is refused beside the other with a
/// message naming both, and a move cut short at any of its writes still
/// opens.
#[test]
fn an_older_copy_of_one_device_is_refused() {
    let rig = Rig::new(8, 16);
    let names = ("fast.img".to_string(), "bulk.img".to_string());
    let pair = |fast: &Arc<FaultStore>, bulk: &Arc<FaultStore>| {
        TwoStore::new(fast.clone(), bulk.clone(), names.clone(), true)
    };
    let two = Arc::new(pair(&rig.fast, &rig.bulk).expect("the new pair"));
    assert_eq!(two.check_generation().unwrap(), 0, "never used for writing");
    assert_eq!(two.advance_generation().unwrap(), 1);
    let (stale_fast, stale_bulk) = (Arc::new(rig.fast.fork()), Arc::new(rig.bulk.fork()));
    let f = Fs::open(two.clone(), FsOptions { commit_interval: None, ..FsOptions::default() }).unwrap();
    f.create(ROOT, b"later", 0o644, 0, 0).unwrap();
    f.close().unwrap();
    drop(two);
    let (fg, bg) = pair(&rig.fast, &rig.bulk).unwrap().pairings().unwrap();
    assert_eq!((fg.gen, bg.gen), (2, 2), "the clean close moved both on");
    for (fast, bulk, older) in [(&stale_fast, &rig.bulk, "fast.img"), (&rig.fast, &stale_bulk, "bulk.img")] {
        let e = pair(fast, bulk).err().expect("a stale copy is refused").to_string();
        assert!(
            e.contains("not last used together") && e.contains(&format!("{older} is an older copy")),
            "{e}"
        );
    }
    // A move cut short after the bulk device's first write, then after
    // the fast device's: both open, and the next move goes on from there.
    for (dev, nth) in [(&rig.fast, 1), (&rig.bulk, 2)] {
        let two = pair(&rig.fast, &rig.bulk).expect("opens");
        dev.set_faults(FaultConfig {
            fail_at: Some(nth),
            fail_kinds: Some(OpKind::Write),
            ..Default::default()
        });
        assert!(two.advance_generation().is_err(), "the injected failure");
        dev.set_faults(FaultConfig::default());
        let two = pair(&rig.fast, &rig.bulk).expect("a move cut short opens");
        let g = two.check_generation().unwrap();
        assert!(two.advance_generation().unwrap() > g);
        two.check_generation().unwrap();
    }
    rig.open().expect("the pair opens").close().unwrap();
}

/// A store's power cut: which stores lose what they had not synced.
#[derive(Debug, Clone, Copy)]
enum Cut {
    Fast,
    Bulk,
    Both,
}

/// Random writes, overwrites and deletes of small and large files with
/// syncs between; power cuts to the fast store, the bulk store or both
/// (the other keeping every write it had), and stores that die part way
/// while the other works: each recovery is a state since the last sync,
/// fsck is clean, and work goes on.
#[test]
fn power_cuts_to_either_store_give_a_prefix() {
    let seed = common::seed("two_devices");
    let mut r = StdRng::seed_from_u64(seed);
    let rig = Rig::new(24, 40);
    let mut f = rig.open().expect("open");
    let mut model = Tree::new();
    let mut history = vec![model.clone()];
    // (operations done, power cuts, of those that lost something, writes
    // refused by a dead store)
    let mut tally = (0u32, 0u32, 0u32, 0u32);
    for step in 0..400u32 {
        let ctx = format!("seed {seed} step {step}");
        let name = format!("f{}", r.gen_range(0..12));
        let ok = match r.gen_range(0..12) {
            0..=7 => {
                let len =
                    if r.gen_bool(0.4) { r.gen_range(100_000..400_000) } else { r.gen_range(1..20_000) };
                let d = data(r.gen(), len);
                let w = || -> fs::Result<()> {
                    let ino = match f.lookup(ROOT, name.as_bytes()) {
                        Ok(a) => {
                            f.unlink(ROOT, name.as_bytes())?;
                            let _ = a;
                            f.create(ROOT, name.as_bytes(), 0o644, 0, 0)?.ino
                        }
                        Err(_) => f.create(ROOT, name.as_bytes(), 0o644, 0, 0)?.ino,
                    };
                    f.write(ino, 0, &d)?;
                    Ok(())
                };
                let ok = w().is_ok();
                if ok {
                    model.insert(name, d);
                }
                ok
            }
            8 => match f.unlink(ROOT, name.as_bytes()) {
                Ok(()) => {
                    assert!(model.remove(&name).is_some(), "{ctx}: {name} was not there");
                    true
                }
                Err(fs::Error::NotFound(_)) => {
                    assert!(!model.contains_key(&name), "{ctx}: {name} is there");
                    false
                }
                Err(e) => panic!("{ctx}: unlink {name}: {e}"),
            },
            9 | 10 => {
                let ok = f.sync().is_ok();
                if ok {
                    history = vec![model.clone()];
                }
                ok
            }
            _ => {
                // A power cut now, or a store that dies a few operations on.
                let cut = [Cut::Fast, Cut::Bulk, Cut::Both][r.gen_range(0..3)];
                if r.gen_bool(0.5) {
                    let dying = if matches!(cut, Cut::Bulk) { &rig.bulk } else { &rig.fast };
                    dying.set_faults(FaultConfig {
                        dead_after: Some(r.gen_range(0..40)),
                        ..FaultConfig::default()
                    });
                    // Work until the file system latches (or the store lives).
                    for k in 0..30u64 {
                        let a = f.create(ROOT, format!("late{k}").as_bytes(), 0o644, 0, 0);
                        let ok = a
                            .and_then(|a| f.write(a.ino, 0, &data(k, 150_000)))
                            .and_then(|_| f.sync())
                            .is_ok();
                        if !ok {
                            // It failed, but may have been made durable
                            // before what failed after it.
                            let mut maybe = model.clone();
                            maybe.insert(format!("late{k}"), data(k, 150_000));
                            history.push(maybe);
                            tally.3 += 1;
                            break;
                        }
                        model.insert(format!("late{k}"), data(k, 150_000));
                        history = vec![model.clone()];
                    }
                }
                drop(f);
                let mode =
                    [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder][r.gen_range(0..3)];
                let s = r.gen();
                match cut {
                    Cut::Fast => {
                        rig.bulk.sync().expect("the bulk store keeps its writes");
                        rig.fast.power_cut(mode, s);
                        rig.bulk.power_cut(mode, s);
                    }
                    Cut::Bulk => {
                        rig.fast.sync().expect("the fast store keeps its writes");
                        rig.bulk.power_cut(mode, s);
                        rig.fast.power_cut(mode, s);
                    }
                    Cut::Both => {
                        rig.fast.power_cut(mode, s);
                        rig.bulk.power_cut(mode, s);
                    }
                }
                f = rig.open().unwrap_or_else(|e| panic!("{ctx}: reopen after {cut:?} {mode:?}: {e}"));
                let got = dump(&f);
                if std::env::var("DBG").is_ok() {
                    let show = |t: &Tree| {
                        t.iter().map(|(k, v)| format!("{k}:{}", v.len())).collect::<Vec<_>>().join(" ")
                    };
                    eprintln!("got   {}", show(&got));
                    for h in &history {
                        eprintln!("state {}", show(h));
                    }
                }
                let at = history.iter().rposition(|h| *h == got).unwrap_or_else(|| {
                    panic!("{ctx}: after a power cut ({cut:?}, {mode:?}) the tree matches no state since the last sync")
                });
                fsck_clean(&f, &ctx);
                tally.1 += 1;
                tally.2 += u32::from(at + 1 < history.len());
                model = history[at].clone();
                history = vec![model.clone()];
                continue;
            }
        };
        if ok {
            tally.0 += 1;
            history.push(model.clone());
        }
    }
    eprintln!(
        "{} operations, {} power cuts ({} lost unsynced work), {} stores died",
        tally.0, tally.1, tally.2, tally.3
    );
    assert!(tally.1 >= 10 && tally.2 >= 1 && tally.3 >= 1, "the run cut power and lost work: {tally:?}");
    f.sync().expect("sync");
    fsck_clean(&f, "at the end");
    assert!(dump(&f) == model, "the tree at the end");
}

/// A fast store much smaller than the small files written: they spill to
/// the bulk store while the metadata keeps the fast store's last
/// segments, no write gets ENOSPC while it has room, and deleting and
/// cleaning make room on the fast store again.
#[test]
fn a_full_fast_store_spills_to_the_bulk_store() {
    let rig = Rig::new(6, 58);
    let f = rig.open().expect("open");
    let mut want = Tree::new();
    for i in 0..600u64 {
        let name = format!("s{i}");
        let d = data(i, 9000);
        let a = f.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap_or_else(|e| panic!("create {i}: {e}"));
        f.write(a.ino, 0, &d).unwrap_or_else(|e| panic!("write {i}: {e}"));
        want.insert(name, d);
        if i % 50 == 49 {
            f.sync().unwrap_or_else(|e| panic!("sync after {i}: {e}"));
        }
    }
    f.sync().expect("sync");
    // The fast store keeps its last segments for the metadata: the
    // journal, the index and the checkpoints stay on it, and only file
    // data spilled (before, the metadata went down with it).
    let es = f.engine().stats();
    let bulk = es.bulk.clone().expect("two stores");
    let meta = |d: &zlogfs_engine::engine::DeviceStats| (d.index_bytes, d.journal_bytes, d.checkpoint_bytes);
    assert_eq!(meta(&bulk), (0, 0, 0), "no live metadata on the bulk store: {bulk:?}");
    assert!(es.fast.index_bytes > 0 && es.fast.checkpoint_bytes > 0, "{:?}", es.fast);
    let not_data = |(k, b): (usize, &u64)| if k == BlockKind::Data as usize { 0 } else { *b };
    assert_eq!(
        bulk.kind_bytes.iter().enumerate().map(not_data).sum::<u64>(),
        0,
        "nothing but file data written to the bulk store"
    );
    assert!(segment_bytes(&rig.bulk) > 2 << 20, "small files spilled to the bulk store");
    fsck_clean(&f, "after spilling");
    for i in (0..600u64).step_by(2) {
        f.unlink(ROOT, format!("s{i}").as_bytes()).expect("unlink");
        want.remove(&format!("s{i}"));
    }
    f.sync().expect("sync");
    let rep =
        f.clean(&fs::CleanOptions { max_live: 0.9, ..fs::CleanOptions::default() }, &|_| {}).expect("clean");
    assert!(rep.freed > 0, "cleaning freed segments: {rep:?}");
    for i in 0..100u64 {
        let name = format!("again{i}");
        let d = data(1000 + i, 9000);
        let a = f.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create after cleaning");
        f.write(a.ino, 0, &d).expect("write after cleaning");
        want.insert(name, d);
    }
    f.sync().expect("sync");
    fsck_clean(&f, "after deleting, cleaning and writing again");
    f.close().expect("close");
    let f = rig.open().expect("reopen");
    assert!(dump(&f) == want, "the tree reads back");
}

/// `user.zlogfs.tier`: a directory's policy is inherited by what is made
/// in it and puts small files on the bulk store (or a large one on the
/// fast store); `auto` removes it; a bad value is refused; it survives a
/// reopen.
#[test]
fn a_directory_policy_places_its_files() {
    let rig = Rig::new(24, 40);
    let f = rig.open().expect("open");
    let d = f.mkdir(ROOT, b"cold", 0o755, 0, 0).expect("mkdir");
    f.setxattr(d.ino, fs::XATTR_TIER, b"bulk", 0).expect("set the policy");
    assert!(f.setxattr(d.ino, fs::XATTR_TIER, b"warm", 0).is_err(), "only fast, bulk or auto");
    let bulk0 = segment_bytes(&rig.bulk);
    let mut files = Vec::new();
    for i in 0..20u64 {
        let a = f.create(d.ino, format!("s{i}").as_bytes(), 0o644, 0, 0).expect("create");
        assert_eq!(f.getxattr(a.ino, fs::XATTR_TIER).expect("inherited"), b"bulk");
        f.write(a.ino, 0, &data(i, 5000)).expect("write");
        files.push(a.ino);
    }
    f.sync().expect("sync");
    assert!(segment_bytes(&rig.bulk) > bulk0 + 50_000, "the small files went to the bulk store");
    // A large file kept on the fast store.
    let fast0 = segment_bytes(&rig.fast);
    let big = f.create(ROOT, b"hot", 0o644, 0, 0).expect("create");
    f.setxattr(big.ino, fs::XATTR_TIER, b"fast", 0).expect("set");
    let bulk1 = segment_bytes(&rig.bulk);
    f.write(big.ino, 0, &data(99, 1 << 20)).expect("write");
    f.sync().expect("sync");
    assert!(segment_bytes(&rig.fast) > fast0 + (1 << 20) / 2, "the large file went to the fast store");
    assert!(segment_bytes(&rig.bulk) < bulk1 + (64 << 10), "and not to the bulk store");
    f.setxattr(d.ino, fs::XATTR_TIER, b"auto", 0).expect("auto");
    assert!(f.getxattr(d.ino, fs::XATTR_TIER).is_err(), "auto is no policy");
    fsck_clean(&f, "with policies");
    f.close().expect("close");
    let f = rig.open().expect("reopen");
    assert_eq!(f.getxattr(big.ino, fs::XATTR_TIER).expect("kept"), b"fast");
    assert_eq!(f.read(files[3], 0, 5000).expect("read"), data(3, 5000));
    assert_eq!(f.config().version, 9, "the records say a policy may be there");
}

/// A head goes on in the segment it was writing after a reopen, and
/// after a power cut: the cleaner still walks every batch of such a
/// segment (each names the one before it there, across the reopen), so
/// no segment is left that cleaning skips.
#[test]
fn segments_written_across_reopens_stay_cleanable() {
    let rig = Rig::new(16, 48);
    let mut names = Vec::new();
    for round in 0..6u64 {
        let f = rig.open().expect("open");
        let name = format!("big{round}");
        let a = f.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create");
        f.write(a.ino, 0, &data(round, 100_000)).expect("write");
        let s = f.create(ROOT, format!("small{round}").as_bytes(), 0o644, 0, 0).expect("create");
        f.write(s.ino, 0, &data(round + 50, 3000)).expect("write");
        f.sync().expect("sync");
        names.push(name);
        if round % 2 == 0 {
            f.close().expect("close");
        } else {
            drop(f);
            rig.fast.power_cut(CrashMode::DropUnsynced, round);
            rig.bulk.power_cut(CrashMode::DropUnsynced, round);
        }
    }
    let f = rig.open().expect("open");
    for n in names.iter().step_by(2) {
        f.unlink(ROOT, n.as_bytes()).expect("unlink");
    }
    f.sync().expect("sync");
    let rep = f
        .clean(&fs::CleanOptions { max_live: 0.999, ..fs::CleanOptions::default() }, &|_| {})
        .expect("clean");
    assert!(rep.skipped.is_empty(), "segments the cleaner could not walk: {:?}", rep.skipped);
    assert!(rep.freed > 0, "{rep:?}");
    fsck_clean(&f, "after cleaning");
    for (i, n) in names.iter().enumerate().skip(1).step_by(2) {
        let a = f.lookup(ROOT, n.as_bytes()).expect("lookup");
        assert!(f.read(a.ino, 0, 200_000).expect("read") == data(i as u64, 100_000), "{n}");
    }
}

/// Moving cold data down (`clean --demote`, and the mount's worker when
/// the fast store runs short): the fast store's oldest segments are
/// cleaned into the bulk store until the target is free there; every file
/// reads the same, fsck is clean, and new small files land on the fast
/// store again.
#[test]
fn cold_small_files_move_down_to_the_bulk_store() {
    let rig = Rig::new(12, 52);
    let f = rig.open().expect("open");
    let mut want = Tree::new();
    for i in 0..260u64 {
        let name = format!("s{i}");
        let a = f.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create");
        let d = data(i, 9000);
        f.write(a.ino, 0, &d).expect("write");
        want.insert(name, d);
    }
    f.sync().expect("sync");
    let free = |f: &Fs| f.engine().stats().fast.free_segments;
    let before = free(&f);
    assert!(before < 6, "the small files filled the fast store: {before} free");
    let bulk0 = segment_bytes(&rig.bulk);
    let opts =
        fs::CleanOptions { max_live: 1.0, target_free: Some(6), demote: true, ..fs::CleanOptions::default() };
    let rep = f.clean(&opts, &|_| {}).expect("demote");
    assert!(rep.freed > 0 && free(&f) >= 6, "fast segments freed: {} free now, {rep:?}", free(&f));
    assert!(rep.skipped.is_empty(), "{:?}", rep.skipped);
    assert!(segment_bytes(&rig.bulk) > bulk0 + (1 << 20), "the data went down");
    fsck_clean(&f, "after moving data down");
    assert!(dump(&f) == want, "every file reads the same");
    // Data blocks written to each store (live bytes would also move with
    // the index's merges, which may run at the sync).
    let data_written = |f: &Fs| {
        let s = f.engine().stats();
        let d = BlockKind::Data as usize;
        (s.fast.kind_bytes[d], s.bulk.expect("two devices").kind_bytes[d])
    };
    let (fast0, bulk0) = data_written(&f);
    let a = f.create(ROOT, b"new", 0o644, 0, 0).expect("create");
    f.write(a.ino, 0, &data(7, 9000)).expect("write");
    f.sync().expect("sync");
    want.insert("new".into(), data(7, 9000));
    let (fast1, bulk1) = data_written(&f);
    assert!(
        fast1 > fast0 + 2000 && bulk1 == bulk0,
        "a new small file lands on the fast store: {fast0} -> {fast1}, bulk {bulk0} -> {bulk1}"
    );
    f.close().expect("close");
    let f = rig.open().expect("reopen");
    assert!(dump(&f) == want, "after a reopen");
}

/// Moving data down on the smallest fast store, holding what cannot move
/// down (the index of many empty files), where its target is out of
/// reach: each pass meets each segment at most once and ends, and the
/// image stays consistent. (This does not reproduce a pass chasing its own
/// index runs, which `CleanOptions::written_before` rules out by
/// construction: a pass picks only segments written before it began.)
#[test]
fn moving_data_down_ends_when_the_target_is_out_of_reach() {
    let rig = Rig::new(4, 60);
    let f = rig.open().expect("open");
    for i in 0..3000u64 {
        let a = f.create(ROOT, format!("empty-file-with-a-long-name-{i:06}").as_bytes(), 0o644, 0, 0);
        a.expect("create");
        if i % 500 == 499 {
            f.sync().expect("sync");
        }
    }
    f.sync().expect("sync");
    for pass in 0..2 {
        let opts = fs::CleanOptions {
            max_live: 1.0,
            target_free: Some(4),
            demote: true,
            ..fs::CleanOptions::default()
        };
        let rep = f.clean(&opts, &|_| {}).unwrap_or_else(|e| panic!("pass {pass}: {e}"));
        assert!(rep.examined <= 4, "pass {pass} met each fast segment at most once: {rep:?}");
    }
    fsck_clean(&f, "after moving data down");
}
