//! A full file system: what still works, and that nothing accepted is
//! dropped. Issue 24, item 3: an image filled with small files, then read
//! (each read an atime update), wedged: deletes and creates failed until
//! a remount, and the accepted changes of the last group were lost at
//! unmount.
//!
//! Randomised: each test prints its seed; replay with ZLOGFS_SEED=N.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use zlogfs_engine::engine::Options;
use zlogfs_engine::store::{Geometry, MemStore, Store};
use zlogfs_fs::errno as fuse_errno;
use zlogfs_fs::{self as fs, Atime, Fs, FsOptions, Ino, MkfsOptions, ROOT};

/// What `zlogfs mkfs --size 64M` makes: 1 MiB segments.
const IMAGE_64M: Geometry = Geometry { segment_size: 1 << 20, segment_count: 63 };

/// Free space statfs shows after deletes on a full image, past which a
/// create and a write of a page are owed (SEMANTICS, A full file system).
const ROOM_SHOWN: u64 = 1 << 20;

fn opts(atime: Atime) -> FsOptions {
    FsOptions {
        engine: Options { background: false, ..Options::default() },
        commit_interval: None,
        atime,
        ..FsOptions::default()
    }
}

fn fresh(atime: Atime) -> (Arc<dyn Store>, Fs) {
    fs::testing::fresh_on(Arc::new(MemStore::new(IMAGE_64M)), &MkfsOptions::default(), opts(atime))
}

fn errno<T>(r: fs::Result<T>) -> Option<i32> {
    r.err().map(|e| fuse_errno(&e))
}

/// Small files of random bytes, in directories of 1,000, until ENOSPC.
/// Returns every file made, with its bytes.
fn fill_with_small_files(f: &Fs, r: &mut StdRng) -> Vec<(Ino, Vec<u8>)> {
    let mut made = Vec::new();
    let mut dir = 0;
    loop {
        let d = match f.mkdir(ROOT, format!("d{dir}").as_bytes(), 0o755, 0, 0) {
            Ok(a) => a.ino,
            Err(e) => {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "mkdir on a full image: {e}");
                return made;
            }
        };
        for n in 0..1000 {
            let mut data = vec![0u8; r.gen_range(700..3700)];
            r.fill_bytes(&mut data);
            let ino = match f.create(d, format!("f{n}").as_bytes(), 0o644, 0, 0) {
                Ok(a) => a.ino,
                Err(e) => {
                    assert_eq!(fuse_errno(&e), libc::ENOSPC, "create on a full image: {e}");
                    return made;
                }
            };
            match f.write(ino, 0, &data) {
                Ok(_) => made.push((ino, data)),
                Err(e) => {
                    assert_eq!(fuse_errno(&e), libc::ENOSPC, "write on a full image: {e}");
                    made.push((ino, Vec::new()));
                    return made;
                }
            }
        }
        dir += 1;
    }
}

/// Fill with small files, read every one (relatime: an atime update
/// each), then delete one (it works at once), delete more until statfs
/// shows [`ROOM_SHOWN`], and create one: every later change works, and
/// close keeps them all.
#[test]
fn a_full_image_of_small_files_still_deletes_after_reads() {
    let seed = common::seed("a_full_image_of_small_files_still_deletes_after_reads");
    for atime in [Atime::Relatime, Atime::Strict] {
        let mut r = StdRng::seed_from_u64(seed);
        let (s, f) = fresh(atime);
        let made = fill_with_small_files(&f, &mut r);
        assert!(made.len() > 10_000, "only {} files fit in 64 MiB", made.len());
        // A writer that goes on after its first ENOSPC.
        let extra = f.create(ROOT, b"more", 0o644, 0, 0).map(|a| a.ino);
        if let Ok(ino) = extra {
            let mut buf = vec![0u8; 64 << 10];
            for k in 0..64u64 {
                r.fill_bytes(&mut buf);
                if let Some(e) = errno(f.write(ino, k * buf.len() as u64, &buf)) {
                    assert_eq!(e, libc::ENOSPC);
                }
            }
        }
        for (ino, data) in &made {
            assert!(&f.read(*ino, 0, 4096).expect("read") == data, "inode {ino}");
        }
        let d0 = f.lookup(ROOT, b"d0").expect("d0").ino;
        f.unlink(d0, b"f0").expect("rm d0/f0 on a full image after reads");
        // Deleted until statfs shows room (a few small files of segments
        // all but full free nothing a writer can take).
        let (d1, mut gone) = (f.lookup(ROOT, b"d1").expect("d1").ino, HashSet::new());
        for n in 0..1000 {
            if f.statfs().expect("statfs").bavail * 4096 >= ROOM_SHOWN {
                break;
            }
            let name = format!("f{n}");
            gone.insert(f.lookup(d1, name.as_bytes()).expect("d1 file").ino);
            f.unlink(d1, name.as_bytes()).unwrap_or_else(|e| panic!("rm d1/{name} on a full image: {e}"));
        }
        let free = f.statfs().expect("statfs").bavail * 4096;
        assert!(free >= ROOM_SHOWN, "statfs shows {free} bytes free after deleting all of d1");
        let new = f.create(ROOT, b"newfile", 0o644, 0, 0).expect("touch newfile after deletes");
        f.rename(d0, b"f1", ROOT, b"renamed", 0).expect("rename");
        f.setattr(new.ino, &fs::SetAttr { mode: Some(0o600), ..Default::default() }).expect("chmod");
        f.mkdir(ROOT, b"newdir", 0o755, 0, 0).expect("mkdir");
        f.unlink(d0, b"f2").expect("rm d0/f2");
        f.close().expect("close keeps the last group");
        let f = Fs::open(s, opts(atime)).expect("reopen");
        assert!(f.lookup(d0, b"f0").is_err() && f.lookup(d0, b"f2").is_err(), "the deletes were kept");
        assert_eq!(f.lookup(ROOT, b"newfile").expect("newfile").mode & 0o777, 0o600);
        assert!(f.lookup(ROOT, b"renamed").is_ok() && f.lookup(ROOT, b"newdir").is_ok());
        for (ino, data) in made.iter().skip(3).filter(|(ino, _)| !gone.contains(ino)) {
            assert!(&f.read(*ino, 0, 4096).expect("read") == data, "inode {ino} after reopen");
        }
        let rep = f.check(&|_, _| {}).expect("fsck");
        assert!(rep.problems.is_empty(), "fsck: {:?}", rep.problems);
    }
}

/// Filled to ENOSPC with incompressible 1 MiB writes on an image of
/// 256 KiB segments, where three 64 KiB chunks fit a segment though the
/// log's room check counts more: fsck finds the counts exact, and every
/// accepted write reads back after a reopen. (The engine's case of a
/// call that finds the log full part way,
/// `log::tests::blocks_that_fill_the_log_part_way_stay_uncounted`, is
/// not reached here: the file system's own room check refuses first.)
#[test]
fn chunks_that_fill_a_log_of_small_segments_part_way_leave_the_counts_exact() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(Geometry { segment_size: 256 << 10, segment_count: 128 }));
    fs::mkfs(s.clone(), &MkfsOptions { pack_bytes: 64 << 10, ..MkfsOptions::default() }).expect("mkfs");
    let f = Fs::open(s.clone(), opts(Atime::Noatime)).expect("open");
    let r = &mut common::rng(common::seed("chunks_that_fill_a_log_of_small_segments_part_way"));
    let data: Vec<u8> = (0..1 << 20).map(|_| r.gen()).collect();
    let a = f.create(ROOT, b"big", 0o644, 0, 0).expect("create").ino;
    let mut off = 0u64;
    while let Ok(n) = f.write(a, off, &data) {
        off += n as u64;
        f.fsync(a, false).expect("fsync of what was accepted");
    }
    assert!(off > 8 << 20, "only {off} bytes written");
    f.sync().expect("sync");
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "fsck after ENOSPC: {:?}", rep.problems);
    f.close().expect("close");
    let f = Fs::open(s, opts(Atime::Noatime)).expect("reopen");
    assert_eq!(f.getattr(a).expect("getattr").size, off, "every accepted write kept");
    assert!(f.read(a, off - (1 << 20), 1 << 20).expect("read") == data, "the last accepted write reads back");
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "fsck after reopen: {:?}", rep.problems);
}

/// fallocate reserves (issue 24, item 7): more than the image holds is
/// ENOSPC with nothing changed; what fits shows in st_blocks and statfs
/// at once, and its first write succeeds on a file system that others
/// filled since; a reservation survives a reopen and is given back by a
/// hole punched over it, or by writing it.
/// At ENOSPC, statfs says about nothing is free (issue 44, item 12: a
/// full 64 MiB image said 5 MB, 6-7%, were available while every write
/// got ENOSPC), and a delete's room shows once it is synced.
#[test]
fn statfs_says_a_full_image_is_full() {
    let (_s, f) = fresh(Atime::Noatime);
    let r = &mut common::rng(common::seed("statfs_says_a_full_image_is_full"));
    let data: Vec<u8> = (0..1 << 20).map(|_| r.gen()).collect();
    let a = f.create(ROOT, b"big", 0o644, 0, 0).expect("create").ino;
    let mut off = 0u64;
    loop {
        match f.write(a, off, &data) {
            Ok(n) => off += n as u64,
            Err(e) => {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    // A write of one more small file may still fit in what is left.
    let free = f.statfs().expect("statfs").bavail * 4096;
    let cap = f.statfs().expect("statfs").blocks * 4096;
    assert!(free < cap / 50, "{free} bytes said free of {cap} when a 1 MiB write gets ENOSPC");
    f.setattr(a, &fs::SetAttr { size: Some(off / 2), ..fs::SetAttr::default() }).expect("truncate");
    f.sync().expect("sync");
    let after = f.statfs().expect("statfs").bavail * 4096;
    assert!(after > free + off / 3, "the truncated half shows: {free} -> {after}");
}

/// statfs says what a writer can take (issue 44, item 12; xfstests
/// generic/103): on an image of a few files, a fallocate of all but
/// 512 KiB of what statfs says is free succeeds (it got ENOSPC: statfs
/// counted the current segment's unwritten rest, which the writer's room
/// check does not), and a delete's room shows in statfs at once, not after
/// the next commit and sync.
#[test]
fn fallocate_takes_what_statfs_says_is_free() {
    let (_s, f) = fresh(Atime::Noatime);
    let r = &mut common::rng(common::seed("fallocate_takes_what_statfs_says_is_free"));
    for n in 0..64 {
        f.create(ROOT, format!("f{n}").as_bytes(), 0o644, 0, 0).expect("create");
    }
    let data: Vec<u8> = (0..8 << 20).map(|_| r.gen()).collect();
    let d = f.create(ROOT, b"data", 0o644, 0, 0).expect("create").ino;
    f.write(d, 0, &data).expect("write 8 MiB");
    f.sync().expect("sync");
    let free = f.statfs().expect("statfs").bavail * 4096;
    f.unlink(ROOT, b"data").expect("unlink");
    let after = f.statfs().expect("statfs").bavail * 4096;
    assert!(after >= free + (6 << 20), "8 MiB deleted, statfs free {free} -> {after} before a sync");
    let spc = f.create(ROOT, b"spc", 0o644, 0, 0).expect("create").ino;
    f.fallocate(spc, 0, 0, after - (512 << 10)).expect("fallocate of what statfs says is free, less 512 KiB");
    let left = f.statfs().expect("statfs").bavail * 4096;
    assert!(left <= 1 << 20, "{left} bytes still said free after the fallocate");
}

/// The same with automatic points of history holding the deleted data
/// (mkfs's default policy keeps every commit for an hour): statfs counts
/// what releasing those blocks gives back segment by segment. Added up,
/// the held bytes of full segments counted more than cleaning them gives
/// back (the segments' headers), and a fallocate of what df said was free
/// less 512 KiB got ENOSPC (xfstests generic/103 after other tests had
/// written and deleted; issue 44, item 12).
#[test]
fn fallocate_takes_what_statfs_says_is_free_when_history_holds_the_deletes() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(IMAGE_64M));
    let history = fs::HistoryPolicy::DEFAULT;
    fs::mkfs(s.clone(), &MkfsOptions { history, ..MkfsOptions::default() }).expect("mkfs");
    let f = Fs::open(s, opts(Atime::Noatime)).expect("open");
    let r = &mut common::rng(common::seed(
        "fallocate_takes_what_statfs_says_is_free_when_history_holds_the_deletes",
    ));
    for n in 0..4 {
        let data: Vec<u8> = (0..6 << 20).map(|_| r.gen()).collect();
        let d = f.create(ROOT, format!("data{n}").as_bytes(), 0o644, 0, 0).expect("create").ino;
        f.write(d, 0, &data).expect("write 6 MiB");
        f.sync().expect("sync");
    }
    for n in 0..4 {
        f.unlink(ROOT, format!("data{n}").as_bytes()).expect("unlink");
        f.sync().expect("sync");
    }
    assert!(f.purgeable_bytes().expect("purgeable") >= 20 << 20, "the deleted data is held for history");
    let free = f.statfs().expect("statfs").bavail * 4096;
    let spc = f.create(ROOT, b"spc", 0o644, 0, 0).expect("create").ino;
    f.fallocate(spc, 0, 0, free - (512 << 10))
        .unwrap_or_else(|e| panic!("fallocate of what statfs says is free ({free}), less 512 KiB: {e}"));
    let left = f.statfs().expect("statfs").bavail * 4096;
    assert!(left <= 1 << 20, "{left} bytes still said free after the fallocate");
}

/// xfstests generic/213's steps: fallocate 1 GiB, truncate (down, to the
/// same size, up), delete. A long truncate commits midway; the commit
/// stored the cut first chunk as a hole and took it off the allocated
/// count, then the truncate saved its copy of the inode over that
/// (issue 44, item 9: "counts 100 allocated bytes, its chunks hold 0").
#[test]
fn fallocate_truncate_and_delete_of_a_gigabyte_keep_the_counts() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(Geometry { segment_size: 4 << 20, segment_count: 1200 }));
    let history = fs::HistoryPolicy::DEFAULT;
    fs::mkfs(s.clone(), &MkfsOptions { history, ..MkfsOptions::default() }).expect("mkfs");
    let f = Fs::open(s, FsOptions::default()).expect("open");
    for (n, size) in [100u64, 1 << 30, 2 << 30, 3 << 30].into_iter().enumerate() {
        let a = f.create(ROOT, b"ouch", 0o644, 0, 0).expect("create").ino;
        f.fallocate(a, 0, 0, 1 << 30).expect("fallocate 1 GiB");
        if n == 3 {
            f.fallocate(a, 0, 2 << 30, 1 << 20).expect("fallocate 1 MiB at 2 GiB");
        }
        f.setattr(a, &fs::SetAttr { size: Some(size), ..fs::SetAttr::default() }).expect("truncate");
        assert_eq!(f.getattr(a).expect("stat").size, size);
        f.unlink(ROOT, b"ouch").expect("unlink");
        let rep = f.check(&|_, _| {}).expect("fsck");
        assert!(
            rep.problems.is_empty(),
            "file {n}: {} problems: {:?}",
            rep.problems.len(),
            rep.problems.first()
        );
    }
}

/// A read whose atime update commits first (the group was past half its
/// bound) saved the inode it had read before the commit: the commit had
/// stored a buffered chunk of zeros as a hole and taken it off the
/// allocated count, and the read put the older count back (xfstests
/// generic/247: direct writes of zeros racing mmap writes over a file of
/// 500 MiB; "counts 524288000 allocated bytes, its chunks hold 494927872";
/// issue 44, item 9).
#[test]
fn a_read_that_commits_for_its_atime_keeps_the_allocated_count() {
    let (_s, f) = fresh(Atime::Relatime);
    let r = &mut common::rng(common::seed("a_read_that_commits_for_its_atime_keeps_the_allocated_count"));
    let cs = 64 << 10;
    let data: Vec<u8> = (0..200 * cs).map(|_| r.gen()).collect();
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create").ino;
    f.write(a, 0, &data).expect("write");
    f.sync().expect("sync");
    let zeros = vec![0u8; cs];
    for n in 0..200u64 {
        f.write(a, n * cs as u64, &zeros).expect("write zeros");
        let name = format!("{n:0>250}");
        f.create(ROOT, name.as_bytes(), 0o644, 0, 0).expect("create a long name");
        f.read(a, 0, 1).expect("read");
    }
    f.sync().expect("sync");
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "{} problems: {:?}", rep.problems.len(), rep.problems.first());
    assert_eq!(f.getattr(a).expect("stat").blocks, 0, "every chunk is zeros: a hole");
}

/// ZERO_RANGE whose reservation commits for room: the punch had lowered
/// the allocated count in memory only, and reading the inode back after
/// the commit put the old count back (review of aafb17c; issue 44, item
/// 9). Now the inode is saved before the commit.
#[test]
fn zero_range_that_commits_for_room_keeps_the_allocated_count() {
    let (_s, f) = fresh(Atime::Noatime);
    let r = &mut common::rng(common::seed("zero_range_that_commits_for_room_keeps_the_allocated_count"));
    let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| r.gen()).collect() };
    let a = f.create(ROOT, b"a", 0o644, 0, 0).expect("create").ino;
    f.write(a, 0, &bytes(4 << 20)).expect("write 4 MiB");
    f.sync().expect("sync");
    let free = f.statfs().expect("statfs").bavail * 4096;
    let filler = f.create(ROOT, b"filler", 0o644, 0, 0).expect("create").ino;
    f.write(filler, 0, &bytes((free - (6 << 20)) as usize)).expect("fill to 6 MiB free");
    f.sync().expect("sync");
    f.fallocate(a, fs::FALLOC_FL_ZERO_RANGE, 0, 8 << 20).expect("zero 8 MiB: 4 freed, 6 free");
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "{} problems: {:?}", rep.problems.len(), rep.problems.first());
    assert_eq!(f.getattr(a).expect("stat").blocks * 512, 8 << 20);
}

#[test]
fn fallocate_reserves_room_for_the_first_write() {
    let seed = common::seed("fallocate_reserves_room_for_the_first_write");
    let mut r = StdRng::seed_from_u64(seed);
    let (s, f) = fresh(Atime::Noatime);
    let free0 = f.statfs().expect("statfs").bfree * 4096;
    let db = f.create(ROOT, b"db", 0o644, 0, 0).expect("create").ino;
    let e = f.fallocate(db, 0, 0, 4 << 30).expect_err("4 GiB in 64 MiB");
    assert_eq!(fuse_errno(&e), libc::ENOSPC, "{e}");
    assert_eq!(f.getattr(db).expect("stat").size, 0, "a refused fallocate changes nothing");
    assert_eq!(f.getattr(db).expect("stat").blocks, 0);
    const RES: u64 = 20 << 20;
    f.fallocate(db, 0, 0, RES).expect("fallocate 20 MiB");
    let a = f.getattr(db).expect("stat");
    assert_eq!((a.size, a.blocks * 512), (RES, RES), "size and allocated bytes after fallocate");
    let free1 = f.statfs().expect("statfs").bfree * 4096;
    assert!(free0 - free1 >= RES, "statfs counts the reservation: {free0} -> {free1}");
    // Past the end, KEEP_SIZE: allocated, the size kept.
    let tail = f.create(ROOT, b"tail", 0o644, 0, 0).expect("create").ino;
    f.fallocate(tail, fs::FALLOC_FL_KEEP_SIZE, 0, 1 << 20).expect("keep size");
    let a = f.getattr(tail).expect("stat");
    assert_eq!((a.size, a.blocks * 512), (0, 1 << 20));
    let free2 = f.statfs().expect("statfs").bfree * 4096;
    assert!(free1 - free2 >= 1 << 20, "and this one: {free1} -> {free2}");
    // Reopen: the reservations are still there.
    f.close().expect("close");
    let f = Fs::open(s.clone(), opts(Atime::Noatime)).expect("reopen");
    assert_eq!(f.statfs().expect("statfs").bfree * 4096, free2);
    // Another writer fills the rest.
    let other = f.create(ROOT, b"other", 0o644, 0, 0).expect("create").ino;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        r.fill_bytes(&mut buf);
        match f.write(other, off, &buf) {
            Ok(_) => off += buf.len() as u64,
            Err(e) => {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    assert!(off >= 20 << 20, "the other writer got only {off} bytes");
    // The reserved range takes its first write, incompressible, in full.
    let mut model = vec![0u8; RES as usize];
    r.fill_bytes(&mut model);
    for (k, piece) in model.chunks(1 << 20).enumerate() {
        f.write(db, (k << 20) as u64, piece)
            .unwrap_or_else(|e| panic!("write {k} into the reservation: {e}"));
    }
    f.sync().expect("sync the reserved range's data");
    assert_eq!(f.getattr(db).expect("stat").blocks * 512, RES, "writing the range does not grow it");
    // A hole punched over the tail's reservation gives it back.
    let before = f.statfs().expect("statfs").bfree;
    f.fallocate(tail, fs::FALLOC_FL_PUNCH_HOLE | fs::FALLOC_FL_KEEP_SIZE, 0, 1 << 20).expect("punch");
    assert_eq!(f.getattr(tail).expect("stat").blocks, 0);
    // Most of it: the index and journal records of the 20 MiB written
    // into the other reservation took some of the log (a reservation
    // covers data, not records), and statfs says only what a writer can
    // take (issue 44, item 12).
    let after = f.statfs().expect("statfs").bfree;
    assert!(after >= before + 200, "the punched reservation is free again: {before} -> {after}");
    f.close().expect("close");
    let f = Fs::open(s, opts(Atime::Noatime)).expect("reopen");
    assert!(f.read(db, 0, RES as usize + 1).expect("read") == model, "the reserved range's data");
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "fsck: {:?}", rep.problems);
}

/// A write into an unaligned fallocated range does not grow the file's
/// allocation (the regression suite's generic/568).
#[test]
fn writing_a_fallocated_range_does_not_grow_it() {
    let (_s, f) = fresh(Atime::Noatime);
    let ino = f.create(ROOT, b"f", 0o644, 0, 0).expect("create").ino;
    f.fallocate(ino, 0, 4095, 2).expect("fallocate 2 bytes across a block");
    let before = f.getattr(ino).expect("stat").blocks;
    assert!(before * 512 >= 4097, "the range is allocated: {} bytes", before * 512);
    f.write(ino, 4095, b"xy").expect("write");
    let a = f.getattr(ino).expect("stat");
    assert_eq!((a.size, a.blocks), (4097, before), "the write stays inside the allocation");
    f.sync().expect("sync");
    assert_eq!(f.getattr(ino).expect("stat").blocks, before, "and after it is stored");
}

/// Files made in the root until ENOSPC, going on after each error as a
/// copy of many files does; the last one made may be empty (its write got
/// ENOSPC). Returns the names made, with their bytes.
fn fill_going_on_after_errors(f: &Fs) -> Vec<(String, Vec<u8>)> {
    let (mut enospc, mut made, mut n) = (0, Vec::new(), 0usize);
    while enospc < 3000 {
        n += 1;
        let name = format!("f{n:06}");
        let data = common::noise(n as u64, 700 + n * 7919 % 3000);
        let ino = match f.create(ROOT, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(e) => {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "create {name}: {e}");
                enospc += 1;
                continue;
            }
        };
        match f.write(ino, 0, &data) {
            Ok(_) => made.push((name, data)),
            Err(e) => {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "write {name}: {e}");
                enospc += 1;
                made.push((name, Vec::new()));
            }
        }
        assert!(n < 200_000, "a 64 MiB image took {n} files");
    }
    made
}

/// Filled to ENOSPC beside the commit thread (its interval from the
/// seed) by a writer that goes on after ENOSPC: deletes work, a create
/// works once statfs says the deletes made room, and close keeps every
/// accepted change. (CI at 3e8b0f3, under load: the mount's create after
/// three deletes got ENOSPC, because index merges, whole-memtable
/// flushes and cleaning rounds that cost more than they gave back had
/// taken the log's reserve, and the cleaner had no room left to work.)
#[test]
fn a_full_image_filled_beside_the_commit_thread_keeps_its_reserve() {
    let seed = common::seed("a_full_image_filled_beside_the_commit_thread_keeps_its_reserve");
    for k in 0..3u64 {
        let ms = 1 + (seed.wrapping_add(k * 13)) % 40;
        let o =
            FsOptions { commit_interval: Some(std::time::Duration::from_millis(ms)), ..FsOptions::default() };
        let (s, f) =
            fs::testing::fresh_on(Arc::new(MemStore::new(IMAGE_64M)), &MkfsOptions::default(), o.clone());
        let made = fill_going_on_after_errors(&f);
        let at = format!("run {k}, commit interval {ms} ms, {} files", made.len());
        let st = f.engine().stats();
        assert!(
            st.free_segments >= st.reserve_segments / 2,
            "{at}: the reserve was taken: {} free segments of a reserve of {}",
            st.free_segments,
            st.reserve_segments
        );
        let mut gone = 0;
        while gone < 3 || f.statfs().expect("statfs").bavail * 4096 < ROOM_SHOWN {
            let name = &made[gone].0;
            f.unlink(ROOT, name.as_bytes())
                .unwrap_or_else(|e| panic!("{at}: rm {name} on a full image: {e}"));
            gone += 1;
            assert!(gone < made.len() / 4, "{at}: statfs showed no room after {gone} deletes");
        }
        f.mkdir(ROOT, b"room", 0o755, 0, 0)
            .unwrap_or_else(|e| panic!("{at}: mkdir after {gone} deletes: {e}"));
        let new = f.create(ROOT, b"new", 0o644, 0, 0).unwrap_or_else(|e| panic!("{at}: create: {e}"));
        f.write(new.ino, 0, &[7u8; 4096]).unwrap_or_else(|e| panic!("{at}: write after {gone} deletes: {e}"));
        f.close().expect("close keeps the last group");
        let f = Fs::open(s, o).expect("reopen");
        assert!(f.lookup(ROOT, b"room").is_ok(), "{at}: the mkdir was kept");
        assert_eq!(f.read(f.lookup(ROOT, b"new").expect("new").ino, 0, 8192).expect("read"), vec![7u8; 4096]);
        for (i, (name, data)) in made.iter().enumerate() {
            match f.lookup(ROOT, name.as_bytes()) {
                Ok(a) if i >= gone => assert!(&f.read(a.ino, 0, 4096).expect("read") == data, "{at}: {name}"),
                Err(_) if i < gone => {}
                r => panic!("{at}: {name} (deleted: {}): {:?}", i < gone, r.map(|a| a.ino)),
            }
        }
        let rep = f.check(&|_, _| {}).expect("fsck");
        assert!(rep.problems.is_empty(), "{at}: fsck: {:?}", rep.problems);
    }
}

/// The same when the deletes' data is held by points of history taken
/// part way through the writes, so that many segments hold some of it
/// (xfstests generic/103 on a scratch image other tests had used; a 400
/// MiB image of 4 MiB segments, as fewer bytes moved too few to show).
/// fallocate asked for room in parts: cleaning for the first part copied
/// held blocks (segments at most 95% live are cleaned), the next part
/// dropped the points, and the copies died in their new place, room df
/// had counted free: ENOSPC. Now the cleaner copies (next to) nothing.
#[test]
fn fallocate_takes_what_statfs_says_is_free_when_points_hold_part_of_each_segment() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(Geometry { segment_size: 4 << 20, segment_count: 100 }));
    let history = fs::HistoryPolicy::DEFAULT;
    fs::mkfs(s.clone(), &MkfsOptions { history, ..MkfsOptions::default() }).expect("mkfs");
    let f = Fs::open(s, opts(Atime::Noatime)).expect("open");
    let r = &mut common::rng(common::seed(
        "fallocate_takes_what_statfs_says_is_free_when_points_hold_part_of_each_segment",
    ));
    for n in 0..20 {
        let data: Vec<u8> = (0..16 << 20).map(|_| r.gen()).collect();
        let d = f.create(ROOT, format!("data{n}").as_bytes(), 0o644, 0, 0).expect("create").ino;
        f.write(d, 0, &data).expect("write 16 MiB");
    }
    for n in 0..20 {
        f.unlink(ROOT, format!("data{n}").as_bytes()).expect("unlink");
    }
    for n in 0..64 {
        f.create(ROOT, format!("f{n}").as_bytes(), 0o644, 0, 0).expect("create");
    }
    assert!(f.purgeable_bytes().expect("purgeable") >= 64 << 20, "points of history hold deleted data");
    let free = f.statfs().expect("statfs").bavail * 4096;
    let spc = f.create(ROOT, b"spc", 0o644, 0, 0).expect("create").ino;
    f.fallocate(spc, 0, 0, free - (512 << 10))
        .unwrap_or_else(|e| panic!("fallocate of what statfs says is free ({free}), less 512 KiB: {e}"));
    let copied = f.stats().clean_live;
    assert!(copied < 64 << 10, "the cleaner copied {copied} bytes for room that dropping points gives");
    // Less than the 512 KiB left and the index records not yet flushed
    // (counted uncompressed: df under-promises by at most about them).
    let left = f.statfs().expect("statfs").bavail * 4096;
    assert!(left <= 2 << 20, "{left} bytes still said free after the fallocate");
}

/// Random overwrites of a file that keeps a 128 MiB image 70% full, in
/// 4-64 KiB writes of incompressible data, 2.75 times the image, with
/// automatic points of history taken as it goes (mkfs's default policy):
/// the mount suite's fio job (tests/posix, "clean"). CI at ccb7c3e, under
/// load: a writer's cleaning round copied the blocks the points held out
/// of its victims into the last segments of the reserve, and from then
/// on every commit failed: fio got ENOSPC, `zlogfs clean` failed, and the
/// group pending at unmount was lost (its blocks leaked). The cleaner's
/// copies now stop two segments short of the end (`Room::Clean`): one is
/// for the commits of accepted changes and deletes, one for the index.
/// (The failure depends on the index thread's timing: here it showed in
/// one run of about twenty before the fix; the mount's fio job under
/// three busy loops, in one of four to twelve.)
#[test]
fn overwrites_at_70_percent_with_points_of_history_never_take_the_commits_room() {
    let seed = common::seed("overwrites_at_70_percent_with_points_of_history_never_take_the_commits_room");
    let r = &mut common::rng(seed);
    let s: Arc<dyn Store> = Arc::new(MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 127 }));
    let history = fs::HistoryPolicy::DEFAULT;
    fs::mkfs(s.clone(), &MkfsOptions { history, ..MkfsOptions::default() }).expect("mkfs");
    let o = FsOptions { commit_interval: None, ..FsOptions::default() };
    let f = Fs::open(s.clone(), o.clone()).expect("open");
    let size: u64 = 88 << 20;
    let ino = f.create(ROOT, b"ow", 0o644, 0, 0).expect("create").ino;
    // Not laid out first: the file grows as the writes land, so that the
    // log fills while the cleaner has work (laid out, the failure above
    // did not show here).
    let mut model = vec![0u8; size as usize];
    let mut written = 0u64;
    while written < size * 11 / 4 {
        let len = 4096 * r.gen_range(1..=16usize);
        let off = 4096 * r.gen_range(0..(size as usize - len) / 4096 + 1);
        r.fill_bytes(&mut model[off..off + len]);
        f.write(ino, off as u64, &model[off..off + len])
            .unwrap_or_else(|e| panic!("write of {len} at {off} after {written} bytes: {e}"));
        written += len as u64;
        if r.gen_ratio(1, 64) {
            f.fsync(ino, false).unwrap_or_else(|e| panic!("fsync after {written} bytes: {e}"));
        }
    }
    f.clean(&fs::CleanOptions::default(), &|_| {}).expect("clean on the full image");
    f.close().expect("close keeps the last group");
    let f = Fs::open(s, o).expect("reopen");
    for (n, want) in model.chunks(1 << 20).enumerate() {
        let at = (n as u64) << 20;
        // Past the last write's end the file ends (the model holds zeros).
        let got = f.read(ino, at, want.len()).expect("read");
        let (here, past) = want.split_at(got.len());
        assert!(got == here && past.iter().all(|&b| b == 0), "the MiB at {at} reads as written");
    }
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "fsck: {:?}", rep.problems);
    assert_eq!(rep.leaked_bytes(), 0, "leaked: {:?}", rep.leaked);
}
