//! The cleaner: sustained overwrites far beyond the capacity, cycles of
//! filling a small image to ENOSPC and emptying it, and power cuts at every
//! sync point of a cleaning pass and at random points inside it.
//!
//! Randomised: each test prints its seed; replay with ZLOGFS_SEED=N.

mod common;

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use zlogfs_engine::engine::Options;
use zlogfs_engine::store::{CrashMode, FaultConfig, FaultStore, Geometry, MemStore, OpKind, Store};
use zlogfs_fs::errno as fuse_errno;
use zlogfs_fs::{self as fs, CleanOptions, Fs, FsOptions, Ino, MkfsOptions, ROOT};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn fs_opts() -> FsOptions {
    FsOptions {
        engine: Options { background: false, cache_bytes: 4 << 20, ..Options::default() },
        commit_interval: None,
        dirty_bytes: 8 << 20,
        cache_bytes: 4 << 20,
        // Small overwrites as patches (the default; said here so that these
        // tests keep covering them).
        patches: true,
        ..FsOptions::default()
    }
}

/// 64 MiB in 1 MiB segments.
const SMALL: Geometry = Geometry { segment_size: 1 << 20, segment_count: 64 };

fn create(f: &Fs, name: &[u8]) -> Ino {
    f.create(ROOT, name, 0o644, 0, 0).expect("create").ino
}

fn random(r: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    r.fill_bytes(&mut v);
    v
}

/// fsck: no problem, and segment usage exactly what the live blocks hold.
#[track_caller]
fn fsck(f: &Fs, what: &str) {
    let rep = fsck_crashed(f, what);
    assert!(rep.leaked.is_empty(), "{what}: usage counts bytes nothing holds: {:?}", rep.leaked);
}

/// fsck after a crash: no problem, but usage may count blocks whose commit
/// the crash lost (FORMAT.md §7, known leaks).
#[track_caller]
fn fsck_crashed(f: &Fs, what: &str) -> zlogfs_fs::CheckReport {
    let rep = f.check(&|_, _| {}).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
    assert!(rep.problems.is_empty(), "{what}: fsck found problems: {:#?}", rep.problems);
    rep
}

/// A fresh file system on a [`SMALL`] memory store.
fn small_fs() -> (Arc<dyn Store>, Fs) {
    fs::testing::fresh_on(Arc::new(MemStore::new(SMALL)), &MkfsOptions::default(), fs_opts())
}

fn live_bytes(f: &Fs) -> u64 {
    f.engine().stats().live_bytes
}

/// Random overwrites, 64 KiB and 4 KiB, of a file that keeps an image 70%
/// full, four times the image's capacity in all: the cleaner (run by the
/// writers when space runs short) keeps up, nothing gets ENOSPC, and the
/// data reads back as the model says, before and after a reopen.
#[test]
fn sustained_overwrites_at_70_percent() {
    let seed = common::seed("sustained_overwrites_at_70_percent");
    let mut r = StdRng::seed_from_u64(seed);
    let (s, mut f) = small_fs();
    let size = SMALL.capacity() as usize * 7 / 10 / MIB * MIB;
    let mut model = random(&mut r, size);
    let ino = create(&f, b"file");
    for off in (0..size).step_by(MIB) {
        f.write(ino, off as u64, &model[off..off + MIB]).unwrap_or_else(|e| panic!("seed {seed}: fill: {e}"));
    }
    f.sync().expect("sync");
    let mut written = 0usize;
    let mut n = 0u64;
    let dev0 = f.engine().device_bytes_written();
    while written < 4 * SMALL.capacity() as usize {
        let len = if r.gen_bool(0.5) { 4 * KIB } else { 64 * KIB };
        let off = r.gen_range(0..size / len) * len;
        let data = random(&mut r, len);
        f.write(ino, off as u64, &data)
            .unwrap_or_else(|e| panic!("seed {seed}: overwrite {n} at {off} after {written} bytes: {e}"));
        model[off..off + len].copy_from_slice(&data);
        written += len;
        n += 1;
        if n % 100 == 0 {
            f.sync().unwrap_or_else(|e| panic!("seed {seed}: sync after {n} overwrites: {e}"));
        }
    }
    f.sync().expect("sync");
    let dev = f.engine().device_bytes_written() - dev0;
    eprintln!(
        "seed {seed}: {n} overwrites, {written} bytes, device wrote {dev} ({:.2}x)",
        dev as f64 / written as f64
    );
    for off in (0..size).step_by(MIB) {
        assert!(
            f.read(ino, off as u64, MIB).expect("read") == model[off..off + MIB],
            "seed {seed}: MiB at {off} differs"
        );
    }
    fsck(&f, "after the overwrites");
    f.close().expect("close");
    f = Fs::open(s.clone(), fs_opts()).expect("reopen");
    for off in (0..size).step_by(MIB) {
        assert!(
            f.read(ino, off as u64, MIB).expect("read") == model[off..off + MIB],
            "seed {seed}: MiB at {off} differs after reopen"
        );
    }
    fsck(&f, "after reopen");
}

/// Patches made while the image is emptier, then other data fills it:
/// the bytes of patched chunks that their patches replace must count as
/// dead, so that the cleaner can win them back (by merging the patches
/// into their chunks) even when nothing writes those chunks again; else
/// live data that fits gets ENOSPC. A file of incompressible data takes
/// a third of what statfs says a small image holds and gets many small
/// overwrites, which become patches; then a second file fills the image
/// to 96% and is overwritten at random, 4 to 64 KiB at a time, the
/// image's capacity over. No ENOSPC; both read back as the model says,
/// before and after a reopen; fsck is clean.
#[test]
fn patches_made_early_do_not_fill_the_device() {
    let seed = common::seed("patches_made_early_do_not_fill_the_device");
    let mut r = StdRng::seed_from_u64(seed);
    let (s, mut f) = small_fs();
    // What statfs says the image holds (the log less its reserve).
    let st = f.statfs().expect("statfs");
    let cap = (st.blocks * u64::from(st.bsize)) as usize;
    let sizes = [cap * 33 / 100 / MIB * MIB, cap * 63 / 100 / MIB * MIB];
    let mut models = [random(&mut r, sizes[0]), random(&mut r, sizes[1])];
    let inos = [create(&f, b"patched"), create(&f, b"other")];
    let fill = |f: &Fs, k: usize, model: &[u8]| {
        for off in (0..model.len()).step_by(MIB) {
            f.write(inos[k], off as u64, &model[off..off + MIB])
                .unwrap_or_else(|e| panic!("seed {seed}: fill file {k} at {off}: {e}"));
        }
        f.sync().unwrap_or_else(|e| panic!("seed {seed}: sync after filling file {k}: {e}"));
    };
    let write = |f: &Fs, k: usize, model: &mut Vec<u8>, len: usize, n: u64, r: &mut StdRng| {
        let off = r.gen_range(0..=(model.len() - len) / (4 * KIB)) * 4 * KIB;
        let data = random(r, len);
        f.write(inos[k], off as u64, &data)
            .unwrap_or_else(|e| panic!("seed {seed}: write {n} of {len} at {off} in file {k}: {e}"));
        model[off..off + len].copy_from_slice(&data);
        if n % 50 == 0 {
            f.sync().unwrap_or_else(|e| panic!("seed {seed}: sync after write {n}: {e}"));
        }
    };
    fill(&f, 0, &models[0]);
    // While 40% is live: 28 KiB written into each 64 KiB chunk, which
    // becomes a patch replacing 7 of its 16 blocks. The chunks are never
    // written again, so only the cleaner can win those blocks back.
    let cs = 64 * KIB;
    for (n, c) in (0..sizes[0] / cs).enumerate() {
        let off = c * cs + r.gen_range(0..=10) * 4 * KIB;
        let data = random(&mut r, 24 * KIB);
        f.write(inos[0], off as u64, &data).unwrap_or_else(|e| panic!("seed {seed}: patch {n}: {e}"));
        models[0][off..off + data.len()].copy_from_slice(&data);
        if n % 50 == 0 {
            f.sync().unwrap_or_else(|e| panic!("seed {seed}: sync after patch {n}: {e}"));
        }
    }
    f.sync().expect("sync");
    let u = f.usage().expect("usage");
    eprintln!(
        "seed {seed}: {} patches, {} patched chunks replacing {} stored bytes",
        f.stats().patches,
        u.patched_chunks,
        u.patch_released
    );
    assert!(u.patched_chunks > 100, "seed {seed}: only {} patched chunks", u.patched_chunks);
    assert!(u.patch_released > 0, "seed {seed}: patches released nothing of their bases");
    // The other file fills the image to 96%, then is overwritten at random.
    fill(&f, 1, &models[1]);
    let mut written = 0;
    for n in 0.. {
        if written >= cap {
            break;
        }
        let len = r.gen_range(1..=16) * 4 * KIB;
        write(&f, 1, &mut models[1], len, n, &mut r);
        written += len;
    }
    f.sync().expect("sync");
    let check = |f: &Fs, what: &str| {
        for (k, model) in models.iter().enumerate() {
            for off in (0..model.len()).step_by(MIB) {
                assert!(
                    f.read(inos[k], off as u64, MIB).expect("read") == model[off..off + MIB],
                    "seed {seed}: MiB at {off} of file {k} differs {what}"
                );
            }
        }
        fsck(f, what);
    };
    let u = f.usage().expect("usage");
    eprintln!(
        "seed {seed}: at the end {} patched chunks replacing {} stored bytes",
        u.patched_chunks, u.patch_released
    );
    check(&f, "after the writes");
    f.close().expect("close");
    f = Fs::open(s.clone(), fs_opts()).expect("reopen");
    check(&f, "after reopen");
}

/// Every file of the root directory and its contents.
fn tree(f: &Fs) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let ents = f.readdir(ROOT, after.as_deref(), 256).expect("readdir");
        let Some(last) = ents.last() else { return out };
        after = Some(last.name.clone());
        for e in ents {
            let a = f.lookup(ROOT, &e.name).expect("lookup");
            out.insert(e.name, f.read(e.ino, 0, a.size as usize).expect("read"));
        }
    }
}

/// Bytes that compress about 3.5:1 (two bits of entropy a byte).
fn compressible(r: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = random(r, n);
    for b in &mut v {
        *b = b'a' + (*b & 3);
    }
    v
}

/// Write files of `file` bytes made by `gen` until ENOSPC, each one synced;
/// the file that hit ENOSPC is deleted (which must succeed). Returns the
/// number of files written whole.
fn fill(
    f: &Fs,
    r: &mut StdRng,
    prefix: &str,
    file: usize,
    gen: fn(&mut StdRng, usize) -> Vec<u8>,
    model: &mut std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    what: &str,
) -> usize {
    for n in 0..100_000 {
        let name = format!("{prefix}{n:05}").into_bytes();
        let ino = create(f, &name);
        let data = gen(r, file);
        let mut res = Ok(());
        for piece in (0..file).step_by(256 * KIB) {
            let end = (piece + 256 * KIB).min(file);
            res = f.write(ino, piece as u64, &data[piece..end]).map(|_| ());
            if res.is_err() {
                break;
            }
        }
        match res.and_then(|_| f.fsync(ino, false)) {
            Ok(()) => {
                model.insert(name, data);
            }
            Err(e) => {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "{what}: file {n}: {e}");
                f.unlink(ROOT, &name).unwrap_or_else(|e| panic!("{what}: unlink after ENOSPC: {e}"));
                f.sync().unwrap_or_else(|e| panic!("{what}: sync after the unlink: {e}"));
                return n;
            }
        }
    }
    panic!("{what}: never ran out of space");
}

/// Fill a 64 MiB image with incompressible data until ENOSPC, then with
/// compressible data until ENOSPC; check everything synced; delete it all;
/// clean; 20 times. Deletes always succeed, the space comes back every
/// time (used space returns to what the empty tree takes), nothing is
/// lost, fsck is clean and the image reopens.
#[test]
fn enospc_cycles_on_a_small_image() {
    let seed = common::seed("enospc_cycles_on_a_small_image");
    let mut r = StdRng::seed_from_u64(seed);
    let (s, mut f) = small_fs();
    let live0 = live_bytes(&f);
    let mut first: Option<(usize, usize)> = None;
    for cycle in 0..20 {
        let what = format!("seed {seed} cycle {cycle}");
        let mut model = std::collections::BTreeMap::new();
        let hard = fill(&f, &mut r, "rand", MIB, random, &mut model, &what);
        let soft = fill(&f, &mut r, "text", 512 * KIB, compressible, &mut model, &what);
        eprintln!("{what}: {hard} MiB of random data, then {soft} files of 512 KiB of compressible data");
        // At least 3/4 of the image takes incompressible data, and the
        // space stays the same from cycle to cycle (nothing leaks).
        assert!(hard * MIB >= SMALL.capacity() as usize * 3 / 4, "{what}: only {hard} MiB fit");
        let (h0, s0) = *first.get_or_insert((hard, soft));
        assert!(hard + 2 >= h0, "{what}: {hard} MiB fit, {h0} in the first cycle");
        assert!(2 * hard + soft + 8 >= 2 * h0 + s0, "{what}: {hard} + {soft} fit, {h0} + {s0} at first");
        assert!(tree(&f) == model, "{what}: the synced files differ");
        fsck(&f, &what);
        for name in model.keys() {
            f.unlink(ROOT, name).unwrap_or_else(|e| panic!("{what}: unlink: {e}"));
        }
        f.sync().expect("sync");
        let rep = f.clean(&CleanOptions::default(), &|_| {}).unwrap_or_else(|e| panic!("{what}: clean: {e}"));
        let live = live_bytes(&f);
        assert!(
            live <= live0 + 256 * KIB as u64,
            "{what}: {live} bytes live with no files ({live0} at first); {rep:?}"
        );
        fsck(&f, &what);
        f.close().unwrap_or_else(|e| panic!("{what}: close: {e}"));
        f = Fs::open(s.clone(), fs_opts()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        assert!(tree(&f).is_empty(), "{what}: files left after deleting them all");
    }
}

/// An image with dead space of every kind: overwritten chunks, deleted big
/// files, and shared blocks of small files of which some were deleted.
fn dirty_image() -> (Arc<FaultStore>, std::collections::BTreeMap<Vec<u8>, Vec<u8>>) {
    let st = Arc::new(FaultStore::new(Geometry { segment_size: 512 * 1024, segment_count: 64 }));
    let s: Arc<dyn Store> = st.clone();
    fs::mkfs(s.clone(), &MkfsOptions::default()).expect("mkfs");
    let f = Fs::open(s, fs_opts()).expect("open");
    let mut r = StdRng::seed_from_u64(7);
    for i in 0..300u32 {
        let name = format!("small{i:03}").into_bytes();
        let ino = create(&f, &name);
        let n = r.gen_range(600..9000);
        f.write(ino, 0, &compressible(&mut r, n)).expect("write");
    }
    for i in 0..6u32 {
        let ino = create(&f, format!("big{i}").as_bytes());
        f.write(ino, 0, &random(&mut r, 2 * MIB)).expect("write");
    }
    f.sync().expect("sync");
    for i in (0..300u32).step_by(3) {
        f.unlink(ROOT, format!("small{i:03}").as_bytes()).expect("unlink");
    }
    f.unlink(ROOT, b"big1").expect("unlink");
    f.unlink(ROOT, b"big4").expect("unlink");
    let ino = f.lookup(ROOT, b"big2").expect("lookup").ino;
    for k in 0..20 {
        f.write(ino, k * 96 * KIB as u64, &random(&mut r, 20 * KIB)).expect("overwrite");
    }
    f.sync().expect("sync");
    // Those overwrites are patches, so cleaning also moves patches and
    // merges patched chunks.
    assert!(f.stats().patches >= 20, "only {} patches", f.stats().patches);
    let model = tree(&f);
    f.close().expect("close");
    (st, model)
}

/// A cleaning pass while writers have data buffered commits none of
/// their operations: a power cut after it leaves the tree as of the last
/// sync or with all of those operations, never a file's new size without
/// the bytes written, and fsck finds every count right. (Before, the
/// cleaner's commits carried the writers' index changes without their
/// data.)
#[test]
fn cleaning_leaves_buffered_operations_out() {
    let seed = common::seed("cleaning_leaves_buffered_operations_out");
    let mut r = StdRng::seed_from_u64(seed);
    let (base, model) = dirty_image();
    for (n, mode) in
        [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder].into_iter().enumerate()
    {
        let what = format!("seed {seed}: {mode:?}");
        let st = Arc::new(base.fork());
        let s: Arc<dyn Store> = st.clone();
        let f = Fs::open(s.clone(), fs_opts()).expect("open");
        // Buffered, never synced: a file grows, another is made.
        let ino = f.lookup(ROOT, b"big0").expect("lookup").ino;
        f.write(ino, 2 * MIB as u64, &random(&mut r, 300 * KIB)).expect("grow");
        let c = create(&f, b"new");
        f.write(c, 0, &random(&mut r, 100 * KIB)).expect("write");
        let after = tree(&f);
        let rep = f.clean(&CleanOptions::default(), &|_| {}).expect("clean");
        assert!(rep.freed > 0, "{what}: the pass freed nothing: {rep:?}");
        assert!(tree(&f) == after, "{what}: the tree changed in the pass");
        drop(f);
        st.power_cut(mode, seed ^ n as u64);
        let f = Fs::open(s, fs_opts()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        let got = tree(&f);
        assert!(
            got == model || got == after,
            "{what}: after the cut the tree is neither the synced one nor the latest"
        );
        fsck(&f, &what);
    }
}

/// Power cuts at every sync point of a cleaning pass, and after a random
/// number of device operations inside it: the image reopens, the tree is
/// exactly what it was (cleaning changes nothing a reader sees), fsck is
/// clean, and a second pass then works.
#[test]
fn crash_while_cleaning() {
    let seed = common::seed("crash_while_cleaning");
    let mut r = StdRng::seed_from_u64(seed);
    let (base, model) = dirty_image();
    let open = |st: &Arc<FaultStore>| {
        let s: Arc<dyn Store> = st.clone();
        Fs::open(s, fs_opts())
    };
    // A pass without faults: how many syncs and operations it takes.
    let st = Arc::new(base.fork());
    let f = open(&st).expect("open");
    st.set_faults(FaultConfig::default());
    let syncs0 = st.sync_count();
    let rep = f.clean(&CleanOptions::default(), &|_| {}).expect("clean");
    let (syncs, ops) = (st.sync_count() - syncs0, st.op_count());
    eprintln!("a pass: {rep:?}, {syncs} syncs, {ops} device operations");
    assert!(rep.freed >= 4 && rep.chunks > 0, "the pass must move data and free segments: {rep:?}");
    // Victims older than the replay start are freed by a sync alone; the
    // cuts below must fall in rounds of that kind.
    assert!(rep.rounds > rep.flushes, "no round freed its victims without a flush: {rep:?}");
    assert!(tree(&f) == model, "the tree changed in a pass");
    fsck(&f, "after a clean pass");
    drop(f);
    let modes = [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder];
    let mut points: Vec<(&str, FaultConfig)> = (1..=syncs)
        .map(|k| {
            let c = FaultConfig {
                fail_at: Some(k),
                fail_kinds: Some(OpKind::Sync),
                persistent: true,
                ..FaultConfig::default()
            };
            ("sync", c)
        })
        .collect();
    for _ in 0..24 {
        points.push(("op", FaultConfig { dead_after: Some(r.gen_range(0..ops)), ..FaultConfig::default() }));
    }
    for (n, (kind, cfg)) in points.into_iter().enumerate() {
        let what = format!("seed {seed}: cut {n} ({kind} {cfg:?})");
        let st = Arc::new(base.fork());
        let f = open(&st).unwrap_or_else(|e| panic!("{what}: open: {e}"));
        st.set_faults(cfg);
        let res = f.clean(&CleanOptions::default(), &|_| {});
        drop(f);
        st.power_cut(modes[n % 3], seed ^ n as u64);
        let f = open(&st).unwrap_or_else(|e| panic!("{what}: reopen after the cut (clean: {res:?}): {e}"));
        assert!(tree(&f) == model, "{what}: the tree changed");
        fsck_crashed(&f, &what);
        let rep =
            f.clean(&CleanOptions::default(), &|_| {}).unwrap_or_else(|e| panic!("{what}: clean again: {e}"));
        assert!(tree(&f) == model, "{what}: the tree changed in the second pass ({rep:?})");
        fsck_crashed(&f, &what);
    }
}

/// Small overwrites of stored chunks are stored as patches beside them,
/// not by rewriting the chunk: each synced 4 KiB overwrite costs the
/// device far less than the 64 KiB chunk it lands in. The file reads back
/// as written throughout, after a reopen, and after the cleaner stored what
/// still showed of the patched bases as patches too (the bases are gone);
/// fsck is clean each time.
#[test]
fn small_overwrites_are_patches() {
    let seed = common::seed("small_overwrites_are_patches");
    let mut r = StdRng::seed_from_u64(seed);
    let (s, mut f) = small_fs();
    let size = 4 * MIB;
    let mut model = compressible(&mut r, size);
    let ino = create(&f, b"file");
    f.write(ino, 0, &model).expect("write");
    f.sync().expect("sync");
    // Change records mark the image as version 8 from its first change
    // (before them, the first patch marked it 4).
    assert_eq!(f.config().version, 8);
    let dev0 = f.engine().device_bytes_written();
    let n = 200;
    for k in 0..n {
        let (len, off) = match k % 4 {
            // Not aligned to the patch blocks: touches two of them.
            0 => (100, r.gen_range(0..size - 100)),
            _ => (4 * KIB, r.gen_range(0..size / (4 * KIB)) * 4 * KIB),
        };
        let data = compressible(&mut r, len);
        f.write(ino, off as u64, &data).expect("overwrite");
        model[off..off + len].copy_from_slice(&data);
        f.sync().expect("sync");
        if k % 50 == 0 {
            assert!(
                f.read(ino, 0, size).expect("read") == model,
                "seed {seed}: differs after {k} overwrites"
            );
        }
    }
    let per = (f.engine().device_bytes_written() - dev0) / n;
    let patches = f.stats().patches;
    eprintln!("seed {seed}: {n} synced small overwrites: {patches} patches, {per} device bytes each");
    assert!(patches > n / 2, "seed {seed}: only {patches} of {n} overwrites became patches");
    // An estimate, not a measurement: a rewritten chunk alone would be
    // 64 KiB at this data's ratio of about 3.5, so about 18 KiB.
    assert!(per < 16 * KIB as u64, "seed {seed}: {per} device bytes per synced overwrite");
    assert!(f.read(ino, 0, size).expect("read") == model, "seed {seed}: differs after the overwrites");
    fsck(&f, "after the overwrites");
    f.close().expect("close");
    f = Fs::open(s.clone(), fs_opts()).expect("reopen");
    assert_eq!(f.config().version, 8);
    // The replaced part of each patched base no longer counts as live: the
    // cleaner sees it. At most half of each (the most patches may replace).
    let u = f.usage().expect("usage");
    assert!(u.patch_released > 0, "seed {seed}: patches released nothing of their bases: {u:?}");
    assert!(f.read(ino, 0, size).expect("read") == model, "seed {seed}: differs after reopen");
    let rep = f.clean(&CleanOptions { max_live: 1.0, ..CleanOptions::default() }, &|_| {}).expect("clean");
    assert!(rep.patches > 0, "seed {seed}: the cleaner moved no patch: {rep:?}");
    // The cleaner stored what showed of patched bases as patches: those
    // chunks are their patches now.
    let u = f.usage().expect("usage");
    assert!(u.bases_gone > 0, "seed {seed}: no patched base was dissolved by the cleaner: {u:?} {rep:?}");
    assert!(f.read(ino, 0, size).expect("read") == model, "seed {seed}: differs after cleaning");
    fsck(&f, "after cleaning");
    f.close().expect("close");
    let f = Fs::open(s, fs_opts()).expect("reopen");
    assert!(f.read(ino, 0, size).expect("read") == model, "seed {seed}: differs after cleaning and reopen");
    fsck(&f, "after cleaning and reopen");
}

/// Not a check but a measurement (ignored; run it with
/// `cargo test --release -p zlogfs-fs --test clean -- --ignored overwrite_breakdown --nocapture`):
/// write amplification of 4 KiB random overwrites of incompressible data
/// on an image kept 70% full (1 GiB in 4 MiB segments, as `zlogfs mkfs`
/// makes one), split into what writers stored whole, what they stored as
/// patches and packs, what the cleaner wrote, and the rest (index and
/// journal). Three phases: the first 256 MiB after the fill, 512 MiB
/// more, then 256 MiB nearer steady state. The data still verifies.
/// `SEGS` and `PCT` change the image and its fill; `PERM=1` writes each
/// phase's blocks without repeats, in random order (as fio's randwrite
/// does), instead of uniformly at random. Also printed: the device bytes by
/// block kind, and the segments cleaned with how live they were when
/// picked.
#[test]
#[ignore]
fn overwrite_breakdown() {
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let seed = common::seed("overwrite_breakdown");
    let mut r = StdRng::seed_from_u64(seed);
    let g = Geometry { segment_size: 4 << 20, segment_count: env("SEGS", 255) as u32 };
    let s: Arc<dyn Store> = Arc::new(MemStore::new(g));
    fs::mkfs(s.clone(), &MkfsOptions::default()).expect("mkfs");
    let o =
        FsOptions { engine: Options { cache_bytes: 64 << 20, ..Options::default() }, ..FsOptions::default() };
    let f = Fs::open(s, o).expect("open");
    let ino = create(&f, b"f");
    let size = g.segment_count as usize * (4 << 20) * env("PCT", 70) / 100 / MIB * MIB;
    let mut model = random(&mut r, size);
    for off in (0..size).step_by(MIB) {
        f.write(ino, off as u64, &model[off..off + MIB]).expect("fill");
    }
    f.sync().expect("sync");
    let bs = 4 * KIB;
    for (name, total) in [
        ("first 256 MiB", 256 * MIB),
        ("512 MiB more", 512 * MIB),
        ("more (LAST MiB, 256 unless set)", env("LAST", 256) * MIB),
    ] {
        let (d0, s0, c0) = (f.engine().device_bytes_written(), f.stats(), f.engine().stats().checkpoint);
        let k0 = f.engine().stats().kind_bytes;
        // PERM=1: each phase writes distinct blocks in random order, as
        // fio's randwrite does (its random map); otherwise uniformly at
        // random, with repeats.
        let perm = env("PERM", 0) == 1;
        let mut order: Vec<usize> = (0..size / bs).collect();
        order.shuffle(&mut r);
        for i in 0..total / bs {
            if perm && i > 0 && i % order.len() == 0 {
                order.shuffle(&mut r); // the next pass
            }
            let off = if perm { order[i % order.len()] } else { r.gen_range(0..size / bs) } * bs;
            r.fill_bytes(&mut model[off..off + bs]);
            f.write(ino, off as u64, &model[off..off + bs]).expect("overwrite");
        }
        f.sync().expect("sync");
        let (d, s1) = (f.engine().device_bytes_written() - d0, f.stats());
        let es = f.engine().stats();
        eprintln!("checkpoints {}, runs {}, run bytes {}", es.checkpoint - c0, es.runs, es.run_bytes);
        let kb = |k: usize| (es.kind_bytes[k] - k0[k]) as f64 / total as f64;
        eprintln!(
            "journal {:.3}, run data {:.3}, run index {:.3}, filter {:.3}, checkpoint {:.3}, data {:.3}, headers and padding {:.3}",
            kb(1), kb(2), kb(3), kb(4), kb(5) + kb(7) + kb(8), kb(6),
            (d as f64 - (1..9).map(|k| (es.kind_bytes[k] - k0[k]) as f64).sum::<f64>()) / total as f64
        );
        let freed = s1.clean_freed - s0.clean_freed;
        eprintln!(
            "segments cleaned {freed}, live when picked {:.3}; live {:.1} MiB of {} MiB in files, {} free, {} pinned, {} reserved",
            (s1.clean_live - s0.clean_live) as f64 / (freed.max(1) * u64::from(g.segment_size)) as f64,
            es.live_bytes as f64 / MIB as f64,
            size / MIB,
            es.free_segments,
            es.pinned_segments,
            es.reserve_segments,
        );
        let x = |a: u64, b: u64| (a - b) as f64 / total as f64;
        let blocks = (s1.whole_stored + s1.pack_stored + s1.clean_stored)
            - (s0.whole_stored + s0.pack_stored + s0.clean_stored);
        eprintln!(
            "{name}: write amplification {:.2} = whole chunks {:.2} + patches {:.2} + cleaner {:.2} + index and journal {:.2}",
            d as f64 / total as f64,
            x(s1.whole_stored, s0.whole_stored),
            x(s1.pack_stored, s0.pack_stored),
            x(s1.clean_stored, s0.clean_stored),
            (d as f64 - blocks as f64) / total as f64,
        );
    }
    for off in (0..size).step_by(MIB) {
        assert!(
            f.read(ino, off as u64, MIB).expect("read") == model[off..off + MIB],
            "seed {seed}: MiB at {off} differs"
        );
    }
    fsck(&f, "after the overwrites");
}

/// Readers beside a writer that overwrites far past the capacity (so the
/// cleaner moves data and segments are used again): a read decompresses
/// without the file system's lock and caches what it read only if no
/// block was placed or freed meanwhile. Every chunk says which version it
/// is; a read must return a whole version, no older than the one written
/// before the read began, and at the end every chunk reads as last
/// written, through the same cache and after a reopen.
#[test]
fn readers_beside_overwrites_and_cleaning_read_what_was_written() {
    let seed = common::seed("readers_beside_overwrites_and_cleaning_read_what_was_written");
    // A stale read needs an unlucky interleaving: three rounds make one
    // likelier. With the epoch check taken out of `Fs::read`, 4 of 26
    // rounds failed when this was written; with it, none ever has.
    for round in 0..3 {
        readers_round(seed.wrapping_add(round));
    }
}

fn readers_round(seed: u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (s, f) = small_fs();
    let f = Arc::new(f);
    const CHUNK: usize = 64 * KIB;
    let chunks = SMALL.capacity() as usize * 55 / 100 / CHUNK;
    // Version v of chunk c: v in its first 8 bytes, then noise from (c, v).
    let content = |c: usize, v: u64| -> Vec<u8> {
        let mut x = (c as u64) << 32 ^ v ^ 0x9e37_79b9_7f4a_7c15;
        let mut out = v.to_le_bytes().to_vec();
        while out.len() < CHUNK {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.truncate(CHUNK);
        out
    };
    let ino = create(&f, b"file");
    for c in 0..chunks {
        f.write(ino, (c * CHUNK) as u64, &content(c, 0)).expect("fill");
    }
    f.sync().expect("sync");
    let versions: Arc<Vec<AtomicU64>> = Arc::new((0..chunks).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (f, versions, stop) = (Arc::clone(&f), Arc::clone(&versions), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut r = StdRng::seed_from_u64(seed ^ (t + 1));
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let c = r.gen_range(0..chunks);
                    let before = versions[c].load(Ordering::SeqCst);
                    let got = f.read(ino, (c * CHUNK) as u64, CHUNK).expect("read");
                    let after = versions[c].load(Ordering::SeqCst);
                    let v = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
                    assert!(
                        v >= before && v <= after + 1,
                        "seed {seed}: chunk {c} read as version {v}, written {before}..{after}"
                    );
                    assert!(got == content(c, v), "seed {seed}: chunk {c}: not a whole version {v}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let mut r = StdRng::seed_from_u64(seed);
    let writes = 4 * SMALL.capacity() as usize / CHUNK;
    for n in 0..writes {
        let c = r.gen_range(0..chunks);
        let v = versions[c].load(Ordering::SeqCst) + 1;
        f.write(ino, (c * CHUNK) as u64, &content(c, v))
            .unwrap_or_else(|e| panic!("seed {seed}: write: {e}"));
        versions[c].store(v, Ordering::SeqCst);
        if n % 64 == 0 {
            f.sync().expect("sync");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|h| h.join().expect("reader")).sum();
    assert!(reads > 100, "the readers read only {reads} times");
    let rep = f.stats();
    assert!(rep.clean_freed > 0, "seed {seed}: the cleaner never ran");
    for c in 0..chunks {
        let v = versions[c].load(Ordering::SeqCst);
        assert!(
            f.read(ino, (c * CHUNK) as u64, CHUNK).expect("read") == content(c, v),
            "seed {seed}: chunk {c}"
        );
    }
    let f = Arc::try_unwrap(f).unwrap_or_else(|_| panic!("still shared"));
    f.close().expect("close");
    let f = Fs::open(s, fs_opts()).expect("reopen");
    for c in 0..chunks {
        let v = versions[c].load(Ordering::SeqCst);
        assert!(
            f.read(ino, (c * CHUNK) as u64, CHUNK).expect("read") == content(c, v),
            "seed {seed}: chunk {c} after reopen"
        );
    }
    fsck(&f, "after the readers");
}

/// Issue 24, item 4: writers that create, overwrite (small overwrites
/// become patches), append, truncate and delete, each checking its own
/// files, readers, and a loop of cleaning passes, all at once; then
/// segment usage must be exactly what the live blocks hold (fsck checks
/// both directions) and every file what its writer wrote. Before the fix,
/// usage fell below the live bytes of some segments after a few seconds of
/// this (as through FUSE with `zlogfs clean` in a loop).
/// `ZLOGFS_STRESS_SECS` sets the length (default 6 s a round).
#[test]
fn concurrent_writers_and_a_clean_loop_keep_usage_exact() {
    let seed = common::seed("concurrent_writers_and_a_clean_loop_keep_usage_exact");
    let secs: u64 = std::env::var("ZLOGFS_STRESS_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
    // With patches (the default), and without (every overwrite rewrites
    // its chunk: the setting of the stale read seen once through FUSE).
    for (round, patches) in [(0, true), (1, false)] {
        stress_round(seed.wrapping_add(round), secs, patches);
    }
}

fn stress_round(seed: u64, secs: u64, patches: bool) {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let s: Arc<dyn Store> = Arc::new(MemStore::new(SMALL));
    fs::mkfs(s.clone(), &MkfsOptions::default()).expect("mkfs");
    let opts = FsOptions { patches, ..fs_opts() };
    let f = Arc::new(Fs::open(s.clone(), opts.clone()).expect("open"));
    let stop = Arc::new(AtomicBool::new(false));
    // Semi-compressible bytes: runs of a byte, and noise.
    fn bytes(r: &mut StdRng, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let k = r.gen_range(1..512).min(n - v.len());
            if r.gen_bool(0.5) {
                v.extend(std::iter::repeat_n(r.gen::<u8>(), k));
            } else {
                v.extend((0..k).map(|_| r.gen::<u8>()));
            }
        }
        v
    }
    // Each writer owns its files; its model is checked against reads.
    const FILES: usize = 6;
    let max_len = SMALL.capacity() as usize * 35 / 100 / 4 / FILES;
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let (f, stop) = (Arc::clone(&f), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut r = StdRng::seed_from_u64(seed ^ ((t + 1) * 0x9e37));
                let mut files: HashMap<usize, (Ino, Vec<u8>)> = HashMap::new();
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = r.gen_range(0..FILES);
                    let name = format!("w{t}-{k}");
                    let what = format!("seed {seed}: writer {t}, op {ops} on {name}");
                    match files.get_mut(&k) {
                        None => {
                            let ino = create(&f, name.as_bytes());
                            files.insert(k, (ino, Vec::new()));
                        }
                        Some((ino, model)) => match r.gen_range(0..10) {
                            // A small overwrite (a patch) or a larger one.
                            0..=3 if !model.is_empty() => {
                                let n = if r.gen_bool(0.7) { 4 * KIB } else { r.gen_range(1..96 * KIB) };
                                let off = r.gen_range(0..model.len()) / (4 * KIB) * (4 * KIB);
                                let data = bytes(&mut r, n);
                                f.write(*ino, off as u64, &data)
                                    .unwrap_or_else(|e| panic!("{what}: write: {e}"));
                                if model.len() < off + n {
                                    model.resize(off + n, 0);
                                }
                                model[off..off + n].copy_from_slice(&data);
                            }
                            4..=5 => {
                                let n = r.gen_range(1..128 * KIB);
                                let data = bytes(&mut r, n);
                                let off = model.len();
                                f.write(*ino, off as u64, &data)
                                    .unwrap_or_else(|e| panic!("{what}: append: {e}"));
                                model.extend_from_slice(&data);
                            }
                            6..=7 => {
                                // Down, or up (a hole), or down and up again.
                                let len = r.gen_range(0..=model.len() + 64 * KIB);
                                let sa = zlogfs_fs::SetAttr { size: Some(len as u64), ..Default::default() };
                                f.setattr(*ino, &sa).unwrap_or_else(|e| panic!("{what}: truncate: {e}"));
                                model.resize(len, 0);
                            }
                            8 => {
                                f.unlink(ROOT, name.as_bytes())
                                    .unwrap_or_else(|e| panic!("{what}: unlink: {e}"));
                                files.remove(&k);
                            }
                            _ => {
                                if r.gen_bool(0.2) {
                                    f.fsync(*ino, false).unwrap_or_else(|e| panic!("{what}: fsync: {e}"));
                                }
                            }
                        },
                    }
                    if let Some((ino, model)) = files.get_mut(&k) {
                        if model.len() > max_len {
                            let sa = zlogfs_fs::SetAttr { size: Some(0), ..Default::default() };
                            f.setattr(*ino, &sa).unwrap_or_else(|e| panic!("{what}: truncate to 0: {e}"));
                            model.clear();
                        }
                        let got =
                            f.read(*ino, 0, model.len() + 1).unwrap_or_else(|e| panic!("{what}: read: {e}"));
                        assert!(
                            got == *model,
                            "{what}: read back {} bytes, {} written",
                            got.len(),
                            model.len()
                        );
                    }
                    ops += 1;
                }
                files
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (f, stop) = (Arc::clone(&f), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut r = StdRng::seed_from_u64(seed ^ 0x5eed ^ t);
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("w{}-{}", r.gen_range(0..4), r.gen_range(0..FILES));
                    if let Ok(a) = f.lookup(ROOT, name.as_bytes()) {
                        // Removed meanwhile is fine; damage is not.
                        match f.read(a.ino, 0, 1 << 20) {
                            Ok(_) => {}
                            Err(e) if fuse_errno(&e) == libc::ENOENT => {}
                            Err(e) => panic!("seed {seed}: reader: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    let cleaner = {
        let (f, stop) = (Arc::clone(&f), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut passes = 0;
            while !stop.load(Ordering::Relaxed) {
                f.clean(&CleanOptions::default(), &|_| {})
                    .unwrap_or_else(|e| panic!("seed {seed}: clean: {e}"));
                passes += 1;
            }
            passes
        })
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let models: Vec<_> = writers.into_iter().map(|w| w.join().expect("writer")).collect();
    readers.into_iter().for_each(|r| r.join().expect("reader"));
    let passes = cleaner.join().expect("cleaner");
    assert!(passes > 0, "seed {seed}: no cleaning pass ran");
    fsck(&f, &format!("seed {seed}: after the stress"));
    let f = Arc::try_unwrap(f).unwrap_or_else(|_| panic!("still shared"));
    f.close().expect("close");
    let f = Fs::open(s, opts).expect("reopen");
    for files in &models {
        for (ino, model) in files.values() {
            assert!(
                f.read(*ino, 0, model.len() + 1).expect("read") == *model,
                "seed {seed}: inode {ino} after reopen"
            );
        }
    }
    fsck(&f, &format!("seed {seed}: after reopen"));
}
