//! fsck against damage, in one pass and in many.

use std::sync::Arc;

use zlogfs_engine::store::{FaultStore, Geometry};

use super::*;
use crate::{FsOptions, MkfsOptions};

/// A xorshift stream from `seed`.
fn stream(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// Bytes of no pattern a codec finds much in (each file its own).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    stream(seed).take(n).map(|x| (x % 7) as u8 + b'a').collect()
}

/// Bytes no codec shrinks.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    stream(seed).take(n).map(|x| (x >> 32) as u8).collect()
}

/// A tree of directories, small files (packed: shared blocks), large
/// files (owned blocks over several segments), empty files, hard links
/// and xattrs.
fn tree() -> Fs {
    tree_of(MkfsOptions::default().history)
}

/// [`tree`] with automatic points of history kept by `history`, on a
/// store whose freed segments turn to junk (a check reading one it
/// should still hold finds damage).
fn tree_of(history: crate::retention::Policy) -> Fs {
    let store = FaultStore::new(Geometry { segment_size: 256 << 10, segment_count: 64 });
    store.junk_freed(true);
    let (_, fs) = crate::testing::fresh_on(
        Arc::new(store),
        &MkfsOptions { pack_bytes: 32 << 10, chunk_size: 32 << 10, history, ..MkfsOptions::default() },
        crate::testing::quiet(FsOptions::default()),
    );
    for d in 0..4u64 {
        let dir = fs.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
        let sub = fs.mkdir(dir, b"sub", 0o755, 0, 0).unwrap().ino;
        for f in 0..8u64 {
            let a = fs.create(dir, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            let n = if f == 0 { 300_000 } else { 1_000 + 500 * f as usize };
            fs.write(a, 0, &bytes(n, d * 100 + f)).unwrap();
            if f == 1 {
                fs.link(a, sub, b"linked").unwrap();
                fs.setxattr(a, b"user.note", b"x", 0).unwrap();
            }
        }
        for e in 0..30 {
            fs.create(sub, format!("empty{e}").as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    fs.commit().unwrap();
    fs
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// What two reports must agree on: every count and every problem.
fn summary(r: &CheckReport) -> String {
    format!(
        "{} inodes, {} entries, {} chunks, {} blocks of {} bytes, {} xattrs, {} orphans, leaked {:?}, \
         problems {:#?}",
        r.inodes,
        r.dirents,
        r.extents,
        r.blocks,
        r.block_bytes,
        r.xattrs,
        r.orphans,
        r.leaked,
        sorted(r.problems.clone())
    )
}

/// Memory sizes for many spans of everything (384), block maps given
/// up part way through the first inode span (3,840), and block maps
/// kept across two inode spans (16,384); and the spans each made.
const SIZES: [(usize, (usize, usize)); 3] = [(384, (54, 3)), (3_840, (6, 3)), (16_384, (2, 1))];

/// Damage of each kind fsck knows, found alike in one pass and in
/// many: each memory size of [`SIZES`] gives the report of one pass.
#[test]
fn many_passes_find_what_one_pass_finds() {
    let fs = tree();
    let one = fs.check(&|_, _| {}).unwrap();
    assert!(one.problems.is_empty(), "{:?}", one.problems);
    assert_eq!(one.passes, (1, 1));
    let mut made = Vec::new();
    for (memory, _) in SIZES {
        let many = fs.check_within(memory, &|_, _| {}).unwrap();
        assert_eq!(summary(&many), summary(&one), "clean, in {memory} bytes");
        made.push((memory, many.passes));
    }
    assert_eq!(made, SIZES, "the spans each memory size makes");
    let d0 = fs.lookup(ROOT, b"d0").unwrap().ino;
    let d1 = fs.lookup(ROOT, b"d1").unwrap().ino;
    let d2 = fs.lookup(ROOT, b"d2").unwrap().ino;
    let f3 = fs.lookup(d1, b"f3").unwrap().ino;
    let first_big = fs.lookup(d0, b"f0").unwrap().ino;
    let last = fs.lookup(fs.lookup(d2, b"sub").unwrap().ino, b"empty29").unwrap().ino;
    {
        let mut st = fs.st();
        // An extra name: a link count one short.
        st.put(dirent_key(d2, b"extra"), encode_dirent(f3, Kind::File));
        // An entry naming no inode, and an xattr of no inode.
        st.put(dirent_key(d2, b"ghost"), encode_dirent(999_999, Kind::File));
        st.put(xattr_key(999_998, b"user.x"), b"v".to_vec());
        // A directory whose entry goes: it and its files unreachable.
        st.del(dirent_key(ROOT, b"d3"));
        // A block owned twice, early in the chunks (before the block
        // maps are given up at 3,840 bytes).
        let first = st.get(&extent_key(first_big, 0)).unwrap().unwrap();
        st.put(extent_key(first_big, 1_000), first);
        // A shared block without its reference list.
        let (lo, hi) = all_shared_range();
        let shared = st.scan(&lo, &hi, usize::MAX).unwrap();
        st.del(shared[0].0.clone());
        // Malformed keys that sort into later spans: a chunk key of a
        // late inode cut short, an xattr key of seven bytes of inode
        // number, a directory entry key likewise, and the last shared
        // block's key cut short.
        let mut k = extent_key(last, 0);
        k.truncate(12);
        st.put(k, b"x".to_vec());
        let mut k = xattr_key(0x0100, b"");
        k.truncate(8);
        st.put(k, b"x".to_vec());
        let mut k = dirent_key(0x0100, b"");
        k.truncate(8);
        st.put(k, encode_dirent(f3, Kind::File));
        let mut k = shared.last().unwrap().0.clone();
        k.truncate(11);
        st.put(k, b"x".to_vec());
        // An orphan.
        st.put(orphan_key(last), vec![0]);
        st.commit().unwrap();
    }
    let one = fs.check(&|_, _| {}).unwrap();
    let want = [
        "has link count 1, but 2 entries name it",
        "points at missing inode 999999",
        "belongs to missing inode 999998",
        "is not reachable from the root",
        "is owned by chunk",
        "lies past its size",
        "but has no reference list",
        "directory 1 has link count 6, its entries make 5",
        "malformed chunk key",
        "malformed xattr key",
        "malformed directory entry key",
        "malformed shared-block key",
    ];
    for w in want {
        assert!(one.problems.iter().any(|p| p.contains(w)), "{w:?} not in {:?}", one.problems);
    }
    assert_eq!(one.orphans, 1);
    for (memory, _) in SIZES {
        let many = fs.check_within(memory, &|_, _| {}).unwrap();
        assert_eq!(summary(&many), summary(&one), "damaged, in {memory} bytes");
    }
}

/// Run a check on another thread; at its first progress report (with
/// the check under way), run `work` here and let the check go on. What
/// the check returned, and whether `work` finished while the check was
/// under way (a check holding the file system's lock would keep it
/// waiting until the check ends: then false, after 30 s).
fn check_during(fs: &Fs, work: impl FnOnce()) -> (Result<CheckReport>, bool) {
    use std::sync::mpsc;
    let (started, wait_started) = mpsc::channel();
    let (done, wait_done) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let checker = s.spawn(move || {
            let during = std::cell::Cell::new(None);
            let rep = fs.check(&|_, _| {
                if during.get().is_none() {
                    started.send(()).unwrap();
                    during.set(Some(wait_done.recv_timeout(std::time::Duration::from_secs(30)).is_ok()));
                }
            });
            (rep, during.get().unwrap_or(false))
        });
        wait_started.recv().expect("the check reports progress");
        work();
        let _ = done.send(());
        checker.join().unwrap()
    })
}

/// Changes of every kind the checker cross-checks: a chunk overwritten,
/// a packed file deleted (its shared block's list shrinks), a hard link
/// made, an xattr set, files created, one renamed; durable.
fn change_the_tree(fs: &Fs) {
    let d0 = fs.lookup(ROOT, b"d0").unwrap().ino;
    let d1 = fs.lookup(ROOT, b"d1").unwrap().ino;
    let big = fs.lookup(d0, b"f0").unwrap().ino;
    fs.write(big, 0, &bytes(300_000, 77)).unwrap();
    fs.unlink(d1, b"f2").unwrap();
    let f3 = fs.lookup(d1, b"f3").unwrap().ino;
    fs.link(f3, d0, b"f3-again").unwrap();
    fs.setxattr(f3, b"user.later", b"y", 0).unwrap();
    for name in [&b"new"[..], b"newer"] {
        let n = fs.create(d1, name, 0o644, 0, 0).unwrap().ino;
        fs.write(n, 0, &bytes(50_000, 78)).unwrap();
    }
    fs.rename(d1, b"f4", d0, b"f4-moved", 0).unwrap();
    fs.sync().unwrap();
}

/// A check reads the file system as it was when it was pinned: every
/// pass (links, chunks, shared-block lists, segment usage) finds what a
/// check before the changes found, though the changes were made and
/// synced between the pin and the passes, on a store that turns freed
/// segments to junk.
#[test]
fn a_check_reads_the_image_as_it_was_pinned() {
    let fs = tree_of(crate::retention::Policy::NONE);
    // A file of segments of its own, whose delete empties them.
    let old = fs.create(ROOT, b"old", 0o644, 0, 0).unwrap().ino;
    fs.write(old, 0, &noise(2 << 20, 3)).unwrap();
    fs.sync().unwrap();
    let before = fs.check(&|_, _| {}).unwrap();
    assert!(before.problems.is_empty() && before.leaked.is_empty(), "{}", summary(&before));
    let pinned = Pinned::take(&fs).unwrap();
    fs.unlink(ROOT, b"old").unwrap();
    fs.sync().unwrap();
    // A checkpoint tells the store which segments are free (junk here).
    fs.eng.settle().unwrap();
    change_the_tree(&fs);
    fs.eng.settle().unwrap();
    let rep = pinned.check(CHECK_MEMORY, &|_, _| {}).unwrap();
    assert!(!pinned.pin.broken());
    assert_eq!(summary(&rep), summary(&before));
    drop(pinned);
    let after = fs.check(&|_, _| {}).unwrap();
    assert!(after.problems.is_empty() && after.leaked.is_empty(), "{}", summary(&after));
    assert_eq!(after.inodes, before.inodes, "two created, two deleted");
}

/// A check does not hold the file system's lock: writers go on while it
/// runs (issue 45: at 10M files a check on a mount held every request
/// for minutes).
#[test]
fn a_check_lets_writers_go_on() {
    let fs = tree();
    let (rep, during) = check_during(&fs, || change_the_tree(&fs));
    assert!(during, "the writes waited for the check");
    let rep = rep.unwrap();
    assert!(rep.problems.is_empty() && rep.leaked.is_empty(), "{}", summary(&rep));
}

/// A writer that needs the segments a check holds takes them: the write
/// succeeds, and the check says it gave way (EAGAIN) instead of reporting
/// what it read from rewritten segments. Run again, it is clean.
#[test]
fn a_writer_short_of_segments_breaks_off_a_check() {
    // No automatic points: the blocks a delete frees are free at once.
    let fs = tree_of(crate::retention::Policy::NONE);
    let old = fs.create(ROOT, b"old", 0o644, 0, 0).unwrap().ino;
    fs.write(old, 0, &noise(8 << 20, 1)).unwrap();
    fs.sync().unwrap();
    let (rep, during) = check_during(&fs, || {
        // Its segments empty, held: the new file needs some of them.
        fs.unlink(ROOT, b"old").unwrap();
        fs.sync().unwrap();
        let new = fs.create(ROOT, b"new", 0o644, 0, 0).unwrap().ino;
        fs.write(new, 0, &noise(8 << 20, 2)).expect("the room a writer was granted");
        fs.sync().expect("the room a writer was granted");
    });
    assert!(during, "the writes waited for the check");
    match rep {
        Err(crate::Error::Again(m)) => assert!(m.contains("run it again"), "{m}"),
        other => panic!("the check went on over rewritten segments: {other:?}"),
    }
    let after = fs.check(&|_, _| {}).unwrap();
    assert!(after.problems.is_empty() && after.leaked.is_empty(), "{}", summary(&after));
}
