//! Edge cases of the file system layer, each checked against what POSIX
//! (and Linux) say: name limits, deep trees, chunk boundaries, a 1 TiB
//! sparse file, many hard links, rename corner cases, open-but-unlinked
//! files, xattrs and codec policies, fallocate, empty writes past the end
//! and readdir resumed while the directory changes.
//!
//! Every file system lives on a fresh in-memory store; no background
//! threads (no commit interval, engine work inline).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zlogfs_engine::engine::Options;
use zlogfs_engine::store::{Geometry, MemStore, Store};
use zlogfs_fs::{
    self as fs, Fs, FsOptions, Ino, Kind, MkfsOptions, SetAttr, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE, RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT, XATTR_CODEC, XATTR_CREATE, XATTR_PHYSICAL,
    XATTR_REPLACE,
};
use zlogfs_fs::{errno as fuse_errno, is_failure};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn fs_opts() -> FsOptions {
    FsOptions {
        engine: Options { background: false, cache_bytes: 8 << 20, ..Options::default() },
        commit_interval: None,
        cache_bytes: 8 << 20,
        ..FsOptions::default()
    }
}

fn store() -> Arc<dyn Store> {
    Arc::new(MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 256 }))
}

/// A fresh file system made with `o`.
fn mkfs_with(o: &MkfsOptions) -> (Arc<dyn Store>, Fs) {
    fs::testing::fresh_on(store(), o, fs_opts())
}

fn fresh() -> (Arc<dyn Store>, Fs) {
    mkfs_with(&MkfsOptions::default())
}

/// Close cleanly and open again.
fn reopen(s: &Arc<dyn Store>, f: Fs) -> Fs {
    f.close().expect("close");
    Fs::open(s.clone(), fs_opts()).expect("reopen")
}

/// fsck: every record consistent with every other.
#[track_caller]
fn fsck(f: &Fs) {
    let rep = f.check(&|_, _| {}).expect("fsck scan");
    assert!(rep.problems.is_empty(), "fsck found problems: {:#?}", rep.problems);
    assert!(rep.leaked.is_empty(), "usage counts bytes nothing holds: {:?}", rep.leaked);
}

/// The errno of a call that must fail with a POSIX error.
#[track_caller]
fn errno<T: std::fmt::Debug>(r: zlogfs_fs::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({:.200})", format!("{v:?}")),
        Err(e) if !is_failure(&e) => fuse_errno(&e),
        Err(e) => panic!("expected a POSIX error, got {e} (errno {})", fuse_errno(&e)),
    }
}

fn mkdir(f: &Fs, p: Ino, name: &[u8]) -> Ino {
    f.mkdir(p, name, 0o755, 0, 0)
        .unwrap_or_else(|e| panic!("mkdir {:?}: {e}", String::from_utf8_lossy(name)))
        .ino
}

fn create(f: &Fs, p: Ino, name: &[u8]) -> Ino {
    f.create(p, name, 0o644, 0, 0)
        .unwrap_or_else(|e| panic!("create {:?}: {e}", String::from_utf8_lossy(name)))
        .ino
}

/// A whole file's contents.
fn read_all(f: &Fs, ino: Ino) -> Vec<u8> {
    let size = f.getattr(ino).expect("getattr").size;
    let v = f.read(ino, 0, size as usize + 10).expect("read");
    assert_eq!(v.len() as u64, size, "read of the whole file returns its size");
    v
}

/// Every entry of a directory, read in pages of 7.
fn list(f: &Fs, dir: Ino) -> Vec<(Vec<u8>, Ino, Kind)> {
    let mut out: Vec<(Vec<u8>, Ino, Kind)> = Vec::new();
    loop {
        let after = out.last().map(|e| e.0.clone());
        let page = f.readdir(dir, after.as_deref(), 7).expect("readdir");
        if page.is_empty() {
            return out;
        }
        out.extend(page.into_iter().map(|e| (e.name, e.ino, e.kind)));
    }
}

fn names(f: &Fs, dir: Ino) -> Vec<Vec<u8>> {
    list(f, dir).into_iter().map(|e| e.0).collect()
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

/// Text-like bytes that compress well but are not all one value.
fn compressible(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 64);
    let mut i = 0u64;
    while v.len() < n {
        v.extend_from_slice(format!("line {i:08} of a very compressible file\n").as_bytes());
        i += 1;
    }
    v.truncate(n);
    v
}

// ---------------------------------------------------------------- names

#[test]
fn name_length_limits() {
    let (s, f) = fresh();
    let n255 = vec![b'a'; 255];
    let n256 = vec![b'a'; 256];
    let ino = create(&f, ROOT, &n255);
    assert_eq!(f.lookup(ROOT, &n255).expect("lookup 255").ino, ino);
    let d = mkdir(&f, ROOT, &[b'd'; 255]);
    assert_eq!(f.lookup(ROOT, &[b'd'; 255]).expect("lookup dir").ino, d);
    f.symlink(ROOT, &[b's'; 255], b"target", 0, 0).expect("symlink 255");
    f.link(ino, d, &n255).expect("link 255");
    f.rename(ROOT, &n255, ROOT, &[b'r'; 255], 0).expect("rename to 255");

    assert_eq!(errno(f.create(ROOT, &n256, 0o644, 0, 0)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.mkdir(ROOT, &n256, 0o755, 0, 0)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.mknod(ROOT, &n256, 0o010644, 0, 0, 0)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.symlink(ROOT, &n256, b"t", 0, 0)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.link(ino, ROOT, &n256)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.rename(ROOT, &[b'r'; 255], ROOT, &n256, 0)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.create(ROOT, &vec![b'x'; 4096], 0o644, 0, 0)), libc::ENAMETOOLONG);
    // Symlink targets: 1 to 4095 bytes (PATH_MAX with its NUL).
    let target: Vec<u8> = (0..4095).map(|n| b"abc/"[n % 4]).collect();
    let l = f.symlink(ROOT, b"long", &target, 0, 0).expect("symlink of 4095 bytes");
    assert_eq!(l.size, 4095);
    assert_eq!(errno(f.symlink(ROOT, b"toolong", &vec![b'a'; 4096], 0, 0)), libc::ENAMETOOLONG);
    assert_eq!(errno(f.symlink(ROOT, b"empty", b"", 0, 0)), libc::ENOENT);
    // Nothing of the refused calls is left behind.
    let f = reopen(&s, f);
    assert_eq!(f.readlink(l.ino).expect("readlink"), target);
    let mut want = vec![vec![b'd'; 255], vec![b'r'; 255], vec![b's'; 255], b"long".to_vec()];
    want.sort();
    assert_eq!(names(&f, ROOT), want);
    assert_eq!(names(&f, d), vec![n255.clone()]);
    assert_eq!(f.getattr(ino).expect("getattr").nlink, 2);
    fsck(&f);
}

#[test]
fn names_with_every_allowed_byte() {
    let (s, f) = fresh();
    // Every byte value but NUL and '/', in one name of 254 bytes.
    let all: Vec<u8> = (1u8..=255).filter(|&c| c != b'/').collect();
    assert_eq!(all.len(), 254);
    let mut rev = all.clone();
    rev.reverse();
    // Names at the top of the byte order (the end of a directory's key
    // range) and single bytes.
    let ff = vec![0xffu8; 255];
    let mut want: BTreeMap<Vec<u8>, Ino> = BTreeMap::new();
    for n in [all.clone(), ff.clone(), vec![0xff], vec![1], b"...".to_vec(), b".a".to_vec()] {
        let ino = create(&f, ROOT, &n);
        want.insert(n, ino);
    }
    // A directory named with every byte (reversed) holds a file named with
    // the highest bytes.
    let sub = mkdir(&f, ROOT, &rev);
    want.insert(rev.clone(), sub);
    let inner = create(&f, sub, &ff);
    f.write(inner, 0, b"deep").expect("write");

    let check = |f: &Fs| {
        let got: BTreeMap<Vec<u8>, Ino> = list(f, ROOT).into_iter().map(|e| (e.0, e.1)).collect();
        assert_eq!(got, want, "readdir returns every name exactly as created");
        for (n, &ino) in &want {
            assert_eq!(f.lookup(ROOT, n).expect("lookup").ino, ino);
        }
        assert_eq!(names(f, sub), vec![ff.clone()]);
        assert_eq!(f.read(inner, 0, 100).expect("read"), b"deep");
    };
    check(&f);
    // A directory whose only entry is 255 bytes of 0xff is not empty.
    assert_eq!(errno(f.rmdir(ROOT, &rev)), libc::ENOTEMPTY);
    let f = reopen(&s, f);
    check(&f);
    fsck(&f);
}

#[test]
fn invalid_names_are_einval() {
    let (s, f) = fresh();
    let file = create(&f, ROOT, b"file");
    let bad: [&[u8]; 7] = [b"", b".", b"..", b"a/b", b"/", b"a/", b"a\0b"];
    for n in bad {
        let what = String::from_utf8_lossy(n).into_owned();
        assert_eq!(errno(f.create(ROOT, n, 0o644, 0, 0)), libc::EINVAL, "create {what:?}");
        assert_eq!(errno(f.mkdir(ROOT, n, 0o755, 0, 0)), libc::EINVAL, "mkdir {what:?}");
        assert_eq!(errno(f.mknod(ROOT, n, 0o010644, 0, 0, 0)), libc::EINVAL, "mknod {what:?}");
        assert_eq!(errno(f.symlink(ROOT, n, b"t", 0, 0)), libc::EINVAL, "symlink {what:?}");
        assert_eq!(errno(f.link(file, ROOT, n)), libc::EINVAL, "link {what:?}");
        assert_eq!(errno(f.rename(ROOT, b"file", ROOT, n, 0)), libc::EINVAL, "rename to {what:?}");
    }
    let f = reopen(&s, f);
    assert_eq!(names(&f, ROOT), vec![b"file".to_vec()]);
    assert_eq!(f.getattr(file).expect("getattr").nlink, 1);
    assert_eq!(f.getattr(ROOT).expect("getattr").nlink, 2);
    fsck(&f);
}

// ---------------------------------------------------------------- deep tree

#[test]
fn deep_tree_create_lookup_remove() {
    const DEPTH: usize = 200;
    let (s, f) = fresh();
    let mut chain = vec![ROOT];
    for d in 0..DEPTH {
        let ino = mkdir(&f, *chain.last().expect("chain"), format!("level{d}").as_bytes());
        chain.push(ino);
    }
    let leaf = create(&f, chain[DEPTH], b"leaf");
    f.write(leaf, 0, b"at the bottom").expect("write");
    let f = reopen(&s, f);

    // Walk down by name and back up by ".." (the root's ".." is itself).
    assert_eq!(f.lookup(ROOT, b"..").expect("..").ino, ROOT);
    let mut cur = ROOT;
    for d in 0..DEPTH {
        let a = f.lookup(cur, format!("level{d}").as_bytes()).expect("lookup down");
        assert_eq!(a.ino, chain[d + 1]);
        assert_eq!(a.kind, Kind::Dir);
        assert_eq!(a.nlink, if d + 1 == DEPTH { 2 } else { 3 }, "nlink of level {d}");
        cur = a.ino;
    }
    assert_eq!(f.read(f.lookup(cur, b"leaf").expect("leaf").ino, 0, 100).expect("read"), b"at the bottom");
    for d in (0..DEPTH).rev() {
        cur = f.lookup(cur, b"..").expect("lookup ..").ino;
        assert_eq!(cur, chain[d]);
    }

    // Moving a directory below itself is refused at any depth.
    assert_eq!(errno(f.rename(ROOT, b"level0", chain[DEPTH], b"loop", 0)), libc::EINVAL);
    assert_eq!(errno(f.rename(chain[50], b"level50", chain[DEPTH], b"loop", 0)), libc::EINVAL);
    // A non-empty directory cannot go.
    assert_eq!(errno(f.rmdir(chain[DEPTH - 1], format!("level{}", DEPTH - 1).as_bytes())), libc::ENOTEMPTY);

    // Remove bottom up.
    f.unlink(chain[DEPTH], b"leaf").expect("unlink leaf");
    for d in (0..DEPTH).rev() {
        f.rmdir(chain[d], format!("level{d}").as_bytes()).expect("rmdir");
        assert_eq!(errno(f.getattr(chain[d + 1])), libc::ENOENT);
    }
    assert_eq!(errno(f.getattr(leaf)), libc::ENOENT);
    let f = reopen(&s, f);
    assert!(names(&f, ROOT).is_empty());
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 2);
    for &ino in &chain[1..] {
        assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    }
    fsck(&f);
}

// ---------------------------------------------------------------- sizes

#[test]
fn files_at_chunk_boundaries_round_trip() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    for chunk in [4096u32, MkfsOptions::default().chunk_size] {
        let o = MkfsOptions { chunk_size: chunk, ..MkfsOptions::default() };
        let (s, f) = mkfs_with(&o);
        let cs = chunk as usize;
        let mut files: Vec<(Ino, Vec<u8>)> = Vec::new();
        for size in [0, 1, cs - 1, cs, cs + 1, 3 * cs + 7] {
            let contents: [(&str, Vec<u8>); 3] = [
                ("random", random_bytes(&mut rng, size)),
                ("text", compressible(size)),
                ("zero", vec![0u8; size]),
            ];
            for (kind, data) in contents {
                let name = format!("{kind}-{size}");
                let ino = create(&f, ROOT, name.as_bytes());
                // One write for some, odd pieces for the others.
                if size % 2 == 0 {
                    assert_eq!(f.write(ino, 0, &data).expect("write"), size);
                } else {
                    let mut off = 0;
                    for piece in data.chunks(cs / 3 + 1) {
                        assert_eq!(f.write(ino, off as u64, piece).expect("write"), piece.len());
                        off += piece.len();
                    }
                }
                assert_eq!(read_all(&f, ino), data, "{name}, chunk {chunk}, buffered");
                files.push((ino, data));
            }
        }
        let check = |f: &Fs, when: &str| {
            for (ino, data) in &files {
                let a = f.getattr(*ino).expect("getattr");
                assert_eq!(a.size, data.len() as u64, "size of {ino} {when}");
                let got = read_all(f, *ino);
                assert!(got == *data, "contents of inode {ino} ({} bytes, chunk {chunk}) {when}", data.len());
                // Reads that straddle chunk boundaries and run past the end.
                for off in [0usize, 1, cs - 1, cs, cs + 1] {
                    let want = data.get(off..).map(|t| &t[..t.len().min(cs + 2)]).unwrap_or(&[]);
                    assert_eq!(f.read(*ino, off as u64, cs + 2).expect("read"), want, "read at {off} {when}");
                }
                if data.iter().any(|&b| b != 0) {
                    assert!(a.blocks * 512 >= data.len() as u64, "st_blocks of {} bytes {when}", data.len());
                }
                if data.is_empty() {
                    assert_eq!(errno(f.lseek(*ino, 0, true)), libc::ENXIO);
                }
            }
        };
        check(&f, "in the buffer");
        f.sync().expect("sync");
        check(&f, "after commit");
        let f = reopen(&s, f);
        check(&f, "after reopen");
        // All-zero files are stored as holes: no blocks, no stored bytes.
        for (ino, data) in &files {
            if data.iter().all(|&b| b == 0) {
                assert_eq!(f.getattr(*ino).expect("getattr").blocks, 0, "zero file of {}", data.len());
                assert_eq!(f.physical_bytes(*ino).expect("physical"), 0);
            }
        }
        fsck(&f);
        f.close().expect("close");
    }
}

#[test]
fn zero_length_write_past_eof_keeps_size() {
    let (s, f) = fresh();
    let ino = create(&f, ROOT, b"f");
    assert_eq!(f.write(ino, 5 * MIB, b"").expect("empty write"), 0);
    assert_eq!(f.getattr(ino).expect("getattr").size, 0);
    f.write(ino, 0, b"hello").expect("write");
    assert_eq!(f.write(ino, TIB, b"").expect("empty write far away"), 0);
    assert_eq!(f.write(ino, 5, b"").expect("empty write at eof"), 0);
    let a = f.getattr(ino).expect("getattr");
    assert_eq!(a.size, 5);
    assert_eq!(errno(f.lseek(ino, 5, false)), libc::ENXIO);
    let f = reopen(&s, f);
    assert_eq!(f.getattr(ino).expect("getattr").size, 5);
    assert_eq!(read_all(&f, ino), b"hello");
    fsck(&f);
}

// ---------------------------------------------------------------- sparse

#[test]
fn sparse_one_tib_file() {
    let (s, f) = fresh();
    let cs = u64::from(f.config().chunk_size);
    let live0 = f.engine().stats().live_bytes;
    let bfree0 = f.statfs().expect("statfs").bfree;
    let ino = create(&f, ROOT, b"sparse");
    f.write(ino, 0, b"abc").expect("write at 0");
    f.write(ino, 512 * GIB, b"mid").expect("write at 512 GiB");
    f.write(ino, TIB - 1, b"z").expect("write at 1 TiB - 1");

    let check = |f: &Fs, when: &str| {
        let a = f.getattr(ino).expect("getattr");
        assert_eq!(a.size, TIB, "size {when}");
        assert!(a.blocks * 512 <= 4 * cs, "st_blocks {} of a sparse file {when}", a.blocks);
        assert!(a.blocks > 0, "st_blocks of a file with data {when}");
        assert_eq!(f.read(ino, 0, 16).expect("read"), b"abc\0\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(f.read(ino, 512 * GIB - 2, 7).expect("read"), b"\0\0mid\0\0");
        assert_eq!(f.read(ino, TIB - 3, 100).expect("read"), b"\0\0z");
        assert_eq!(f.read(ino, TIB, 100).expect("read at eof"), b"");
        // Zeros in between, across chunk boundaries.
        for off in [3, cs - 5, 7 * GIB + 12345, 512 * GIB + 3, 800 * GIB, TIB - 4 * cs] {
            let v = f.read(ino, off, 3 * cs as usize).expect("read hole");
            assert_eq!(v.len() as u64, 3 * cs);
            assert!(v.iter().all(|&b| b == 0), "hole at {off} reads zeros {when}");
        }
        // SEEK_DATA / SEEK_HOLE find the three data ranges (to within a
        // chunk: holes are whole chunks).
        assert_eq!(f.lseek(ino, 0, true).expect("data at 0"), 0);
        let h = f.lseek(ino, 0, false).expect("hole after 0");
        assert!((3..=cs).contains(&h), "SEEK_HOLE from 0 gave {h} {when}");
        let d = f.lseek(ino, h, true).expect("data after the first hole");
        assert!(d <= 512 * GIB && d > 512 * GIB - cs, "SEEK_DATA from {h} gave {d} {when}");
        let h2 = f.lseek(ino, 512 * GIB, false).expect("hole after the middle");
        assert!(h2 >= 512 * GIB + 3 && h2 <= 512 * GIB + cs, "SEEK_HOLE from 512 GiB gave {h2} {when}");
        let d2 = f.lseek(ino, h2, true).expect("data at the end");
        assert!(d2 < TIB && d2 > TIB - 1 - cs, "SEEK_DATA from {h2} gave {d2} {when}");
        assert_eq!(f.lseek(ino, TIB - 1, true).expect("data at the last byte"), TIB - 1);
        assert_eq!(f.lseek(ino, TIB - 1, false).expect("hole at the end"), TIB, "implicit hole at EOF");
        assert_eq!(errno(f.lseek(ino, TIB, true)), libc::ENXIO);
        assert_eq!(errno(f.lseek(ino, TIB, false)), libc::ENXIO);
        assert_eq!(errno(f.lseek(ino, 2 * TIB, true)), libc::ENXIO);
        let p = f.physical_bytes(ino).expect("physical");
        // Buffered data is not stored yet; stored, the three pieces are.
        assert!(p <= 4 * cs, "physical bytes {p} of a sparse file {when}");
        assert!(when == "buffered" || p > 0, "physical bytes {p} of a sparse file {when}");
    };
    check(&f, "buffered");
    f.sync().expect("sync");
    check(&f, "committed");
    let f = reopen(&s, f);
    check(&f, "reopened");

    // Some incompressible data in the middle, so that space is visibly used.
    let mut rng = StdRng::seed_from_u64(7);
    let blob = random_bytes(&mut rng, 4 * MIB as usize);
    f.write(ino, 768 * GIB, &blob).expect("write blob");
    f.sync().expect("sync");
    let live1 = f.engine().stats().live_bytes;
    assert!(live1 >= live0 + 4 * MIB, "live bytes {live0} -> {live1} after 4 MiB of random data");
    assert_eq!(f.read(ino, 768 * GIB, blob.len()).expect("read blob"), blob);
    assert_eq!(f.lseek(ino, 600 * GIB, true).expect("seek data"), 768 * GIB);

    // Truncate back to 0: everything is released.
    let a = f.setattr(ino, &SetAttr { size: Some(0), ..Default::default() }).expect("truncate");
    assert_eq!((a.size, a.blocks), (0, 0));
    f.sync().expect("sync");
    let f = reopen(&s, f);
    let a = f.getattr(ino).expect("getattr");
    assert_eq!((a.size, a.blocks), (0, 0));
    assert_eq!(f.physical_bytes(ino).expect("physical"), 0);
    assert_eq!(f.read(ino, 0, 100).expect("read"), b"");
    assert_eq!(f.read(ino, 512 * GIB, 100).expect("read"), b"");
    assert_eq!(errno(f.lseek(ino, 0, true)), libc::ENXIO);
    let live2 = f.engine().stats().live_bytes;
    assert!(live2 <= live0 + 64 * KIB, "live bytes {live0} -> {live1} -> {live2}: truncation leaked");
    // statfs counts whole free segments; the segments that held the data
    // are reusable once the index no longer needs their journal batches,
    // which an index flush ensures (without one, see
    // `space_freed_by_delete_is_reusable`).
    f.engine().flush().expect("flush");
    f.engine().checkpoint().expect("checkpoint");
    let bfree2 = f.statfs().expect("statfs").bfree;
    assert!(
        bfree2 + 2 * MIB / 4096 >= bfree0,
        "statfs free blocks {bfree0} -> {bfree2} after writing and truncating a file"
    );
    // And the file is usable again.
    f.write(ino, 10, b"again").expect("write");
    assert_eq!(read_all(&f, ino), b"\0\0\0\0\0\0\0\0\0\0again");
    fsck(&f);
}

// ---------------------------------------------------------------- links

#[test]
fn thousand_hard_links() {
    const LINKS: usize = 1000;
    let (s, f) = fresh();
    let d = mkdir(&f, ROOT, b"d");
    let ino = create(&f, ROOT, b"orig");
    let mut rng = StdRng::seed_from_u64(3);
    let data = random_bytes(&mut rng, 200_000);
    f.write(ino, 0, &data).expect("write");
    for n in 0..LINKS {
        let dir = if n % 2 == 0 { ROOT } else { d };
        let a = f.link(ino, dir, format!("l{n}").as_bytes()).expect("link");
        assert_eq!(a.nlink as usize, n + 2);
    }
    assert_eq!(errno(f.link(ino, ROOT, b"l0")), libc::EEXIST);
    assert_eq!(errno(f.link(d, ROOT, b"dirlink")), libc::EPERM);
    let f = reopen(&s, f);
    assert_eq!(f.getattr(ino).expect("getattr").nlink as usize, LINKS + 1);
    assert_eq!(f.lookup(d, b"l999").expect("lookup").ino, ino);
    assert_eq!(list(&f, ROOT).len(), 1 + 1 + LINKS / 2);
    assert_eq!(list(&f, d).len(), LINKS / 2);
    assert!(list(&f, d).iter().all(|e| e.1 == ino && e.2 == Kind::File));
    let phys = f.physical_bytes(ino).expect("physical");
    assert!(phys >= data.len() as u64, "random data does not compress: {phys}");

    // Unlink the original and all links but the last.
    f.unlink(ROOT, b"orig").expect("unlink orig");
    for n in 0..LINKS - 1 {
        let dir = if n % 2 == 0 { ROOT } else { d };
        f.unlink(dir, format!("l{n}").as_bytes()).expect("unlink");
        assert_eq!(f.getattr(ino).expect("getattr").nlink as usize, LINKS - 1 - n);
    }
    let f = reopen(&s, f);
    let a = f.getattr(ino).expect("still there");
    assert_eq!(a.nlink, 1);
    assert_eq!(read_all(&f, ino), data);
    assert_eq!(names(&f, ROOT), vec![b"d".to_vec()]);
    assert_eq!(names(&f, d), vec![format!("l{}", LINKS - 1).into_bytes()]);

    let live = f.engine().stats().live_bytes;
    f.unlink(d, format!("l{}", LINKS - 1).as_bytes()).expect("unlink last");
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    assert_eq!(errno(f.read(ino, 0, 1)), libc::ENOENT);
    f.sync().expect("sync");
    let after = f.engine().stats().live_bytes;
    assert!(after + data.len() as u64 <= live + 4 * KIB, "live bytes {live} -> {after}: data not freed");
    let f = reopen(&s, f);
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    assert!(names(&f, d).is_empty());
    fsck(&f);
}

// ---------------------------------------------------------------- rename

#[test]
fn rename_directory_into_itself_is_einval() {
    let (_s, f) = fresh();
    let a = mkdir(&f, ROOT, b"a");
    let b = mkdir(&f, a, b"b");
    let c = mkdir(&f, b, b"c");
    assert_eq!(errno(f.rename(ROOT, b"a", a, b"x", 0)), libc::EINVAL);
    assert_eq!(errno(f.rename(ROOT, b"a", c, b"x", 0)), libc::EINVAL);
    assert_eq!(errno(f.rename(a, b"b", c, b"x", RENAME_NOREPLACE)), libc::EINVAL);
    // Exchanging a directory with an entry of its own subtree as well.
    create(&f, c, b"file");
    assert_eq!(errno(f.rename(ROOT, b"a", c, b"file", RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(errno(f.rename(c, b"file", ROOT, b"a", RENAME_EXCHANGE)), libc::EINVAL);
    // Nothing moved.
    assert_eq!(f.lookup(ROOT, b"a").expect("a").ino, a);
    assert_eq!(f.lookup(a, b"b").expect("b").ino, b);
    assert_eq!(f.lookup(b, b"c").expect("c").ino, c);
    assert_eq!(names(&f, c), vec![b"file".to_vec()]);
    assert_eq!(f.lookup(c, b"..").expect("..").ino, b);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 3);
    // Moving it up is fine.
    f.rename(b, b"c", ROOT, b"c", 0).expect("move up");
    assert_eq!(f.lookup(c, b"..").expect("..").ino, ROOT);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 4);
    assert_eq!(f.getattr(b).expect("b").nlink, 2);
    fsck(&f);
}

#[test]
fn rename_noreplace_onto_existing_is_eexist() {
    let (_s, f) = fresh();
    let x = create(&f, ROOT, b"x");
    let y = create(&f, ROOT, b"y");
    let d = mkdir(&f, ROOT, b"d");
    assert_eq!(errno(f.rename(ROOT, b"x", ROOT, b"y", RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(f.rename(ROOT, b"x", ROOT, b"d", RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(f.rename(ROOT, b"d", ROOT, b"x", RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(f.rename(ROOT, b"x", ROOT, b"y", RENAME_NOREPLACE | RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(errno(f.rename(ROOT, b"x", ROOT, b"nothere", RENAME_EXCHANGE)), libc::ENOENT);
    assert_eq!(f.lookup(ROOT, b"x").expect("x").ino, x);
    assert_eq!(f.lookup(ROOT, b"y").expect("y").ino, y);
    assert_eq!(f.lookup(ROOT, b"d").expect("d").ino, d);
    f.rename(ROOT, b"x", ROOT, b"z", RENAME_NOREPLACE).expect("noreplace onto a free name");
    assert_eq!(f.lookup(ROOT, b"z").expect("z").ino, x);
    assert_eq!(errno(f.lookup(ROOT, b"x")), libc::ENOENT);
    fsck(&f);
}

#[test]
fn rename_exchange_file_and_directory_across_parents() {
    let (s, f) = fresh();
    let p1 = mkdir(&f, ROOT, b"p1");
    let p2 = mkdir(&f, ROOT, b"p2");
    let file = create(&f, p1, b"file");
    f.write(file, 0, b"file data").expect("write");
    let dir = mkdir(&f, p2, b"dir");
    create(&f, dir, b"inside");
    assert_eq!(f.getattr(p1).expect("p1").nlink, 2);
    assert_eq!(f.getattr(p2).expect("p2").nlink, 3);

    f.rename(p1, b"file", p2, b"dir", RENAME_EXCHANGE).expect("exchange");
    let check = |f: &Fs| {
        assert_eq!(f.lookup(p1, b"file").expect("p1/file").ino, dir);
        assert_eq!(f.lookup(p1, b"file").expect("p1/file").kind, Kind::Dir);
        assert_eq!(f.lookup(p2, b"dir").expect("p2/dir").ino, file);
        assert_eq!(f.lookup(p2, b"dir").expect("p2/dir").kind, Kind::File);
        assert_eq!(f.getattr(p1).expect("p1").nlink, 3, "p1 gained a subdirectory");
        assert_eq!(f.getattr(p2).expect("p2").nlink, 2, "p2 lost its subdirectory");
        assert_eq!(f.getattr(ROOT).expect("root").nlink, 4);
        assert_eq!(f.lookup(dir, b"..").expect("..").ino, p1, "the moved directory's parent");
        assert_eq!(f.read(file, 0, 100).expect("read"), b"file data");
        assert_eq!(names(f, dir), vec![b"inside".to_vec()]);
        assert_eq!(
            list(f, p1).into_iter().map(|e| (e.0, e.2)).collect::<Vec<_>>(),
            vec![(b"file".to_vec(), Kind::Dir)]
        );
        assert_eq!(
            list(f, p2).into_iter().map(|e| (e.0, e.2)).collect::<Vec<_>>(),
            vec![(b"dir".to_vec(), Kind::File)]
        );
    };
    check(&f);
    let f = reopen(&s, f);
    check(&f);
    // p2 is now empty of directories: rmdir works after removing the file.
    f.unlink(p2, b"dir").expect("unlink");
    f.rmdir(ROOT, b"p2").expect("rmdir p2");
    // p1 holds the moved directory now.
    assert_eq!(errno(f.rmdir(ROOT, b"p1")), libc::ENOTEMPTY);
    f.unlink(dir, b"inside").expect("unlink inside");
    f.rmdir(p1, b"file").expect("rmdir moved dir");
    assert_eq!(f.getattr(p1).expect("p1").nlink, 2);
    f.rmdir(ROOT, b"p1").expect("rmdir p1");
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 2);
    fsck(&f);
}

#[test]
fn rename_over_existing_file_replaces_it() {
    let (s, f) = fresh();
    let mut rng = StdRng::seed_from_u64(11);
    let d = mkdir(&f, ROOT, b"d");
    let src = create(&f, ROOT, b"src");
    let src_data = random_bytes(&mut rng, 100_000);
    f.write(src, 0, &src_data).expect("write");
    let victim = create(&f, d, b"dst");
    f.write(victim, 0, &random_bytes(&mut rng, 100_000)).expect("write");
    // A victim with a second link survives, with one link fewer.
    let kept = create(&f, d, b"kept");
    f.write(kept, 0, b"kept data").expect("write");
    f.link(kept, ROOT, b"kept2").expect("link");
    f.sync().expect("sync");
    let live = f.engine().stats().live_bytes;

    f.rename(ROOT, b"src", d, b"dst", 0).expect("rename over a file");
    assert_eq!(f.lookup(d, b"dst").expect("dst").ino, src);
    assert_eq!(errno(f.lookup(ROOT, b"src")), libc::ENOENT);
    assert_eq!(errno(f.getattr(victim)), libc::ENOENT, "the replaced file is deleted");
    assert_eq!(read_all(&f, src), src_data);
    f.rename(d, b"dst", ROOT, b"kept2", 0).expect("rename over a link");
    assert_eq!(f.getattr(kept).expect("kept").nlink, 1);
    assert_eq!(f.lookup(ROOT, b"kept2").expect("kept2").ino, src);
    assert_eq!(f.read(kept, 0, 100).expect("read"), b"kept data");
    // Renaming one link of a file over another link of it does nothing.
    f.link(src, d, b"other").expect("link");
    f.rename(ROOT, b"kept2", d, b"other", 0).expect("rename between links");
    assert_eq!(f.lookup(ROOT, b"kept2").expect("kept2").ino, src);
    assert_eq!(f.lookup(d, b"other").expect("other").ino, src);
    assert_eq!(f.getattr(src).expect("src").nlink, 2);
    f.sync().expect("sync");
    let after = f.engine().stats().live_bytes;
    assert!(after + 90_000 <= live, "the replaced file's data is freed: {live} -> {after}");

    let f = reopen(&s, f);
    assert_eq!(errno(f.getattr(victim)), libc::ENOENT);
    assert_eq!(read_all(&f, src), src_data);
    let mut want = vec![b"kept".to_vec(), b"other".to_vec()];
    want.sort();
    assert_eq!(names(&f, d), want);
    assert_eq!(names(&f, ROOT), vec![b"d".to_vec(), b"kept2".to_vec()]);
    fsck(&f);
}

#[test]
fn rename_directory_over_directories_and_files() {
    let (s, f) = fresh();
    let a = mkdir(&f, ROOT, b"a");
    let full = mkdir(&f, ROOT, b"full");
    create(&f, full, b"x");
    let empty = mkdir(&f, ROOT, b"empty");
    let file = create(&f, ROOT, b"file");
    assert_eq!(errno(f.rename(ROOT, b"a", ROOT, b"full", 0)), libc::ENOTEMPTY);
    assert_eq!(errno(f.rename(ROOT, b"a", ROOT, b"file", 0)), libc::ENOTDIR);
    assert_eq!(errno(f.rename(ROOT, b"file", ROOT, b"a", 0)), libc::EISDIR);
    assert_eq!(f.lookup(ROOT, b"full").expect("full").ino, full);
    assert_eq!(f.lookup(ROOT, b"a").expect("a").ino, a);
    assert_eq!(f.lookup(ROOT, b"file").expect("file").ino, file);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 5);

    // Over an empty directory: it is replaced and the parent loses a link.
    f.rename(ROOT, b"a", ROOT, b"empty", 0).expect("rename over an empty dir");
    assert_eq!(f.lookup(ROOT, b"empty").expect("empty").ino, a);
    assert_eq!(errno(f.getattr(empty)), libc::ENOENT);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 4);
    // Across parents, over an empty directory.
    let e2 = mkdir(&f, full, b"e2");
    assert_eq!(f.getattr(full).expect("full").nlink, 3);
    f.rename(ROOT, b"empty", full, b"e2", 0).expect("rename across over an empty dir");
    assert_eq!(errno(f.getattr(e2)), libc::ENOENT);
    assert_eq!(f.getattr(full).expect("full").nlink, 3);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 3);
    assert_eq!(f.lookup(a, b"..").expect("..").ino, full);
    let f = reopen(&s, f);
    assert_eq!(f.getattr(full).expect("full").nlink, 3);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 3);
    assert_eq!(names(&f, full), vec![b"e2".to_vec(), b"x".to_vec()]);
    fsck(&f);
}

#[test]
fn rmdir_and_unlink_errors() {
    let (_s, f) = fresh();
    let d = mkdir(&f, ROOT, b"d");
    create(&f, d, b"f");
    create(&f, ROOT, b"file");
    assert_eq!(errno(f.rmdir(ROOT, b"d")), libc::ENOTEMPTY);
    assert_eq!(errno(f.unlink(ROOT, b"d")), libc::EISDIR);
    assert_eq!(errno(f.rmdir(ROOT, b"file")), libc::ENOTDIR);
    assert_eq!(errno(f.rmdir(ROOT, b"missing")), libc::ENOENT);
    assert_eq!(errno(f.unlink(ROOT, b"missing")), libc::ENOENT);
    assert_eq!(errno(f.rmdir(d, b".")), libc::EINVAL);
    // A file is not a directory to remove or create in.
    let file = f.lookup(ROOT, b"file").expect("file").ino;
    assert_eq!(errno(f.unlink(file, b"x")), libc::ENOTDIR);
    assert_eq!(errno(f.create(file, b"x", 0o644, 0, 0)), libc::ENOTDIR);
    assert_eq!(errno(f.readdir(file, None, 10)), libc::ENOTDIR);
    // Nothing changed.
    assert_eq!(names(&f, ROOT), vec![b"d".to_vec(), b"file".to_vec()]);
    assert_eq!(names(&f, d), vec![b"f".to_vec()]);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 3);
    f.unlink(d, b"f").expect("unlink");
    f.rmdir(ROOT, b"d").expect("rmdir");
    assert_eq!(errno(f.getattr(d)), libc::ENOENT);
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 2);
    fsck(&f);
}

// ---------------------------------------------------------------- orphans

#[test]
fn unlinked_open_file_lives_until_release() {
    let (s, f) = fresh();
    let mut rng = StdRng::seed_from_u64(21);
    let data = random_bytes(&mut rng, 300_000);
    let ino = create(&f, ROOT, b"tmp");
    f.write(ino, 0, &data).expect("write");
    f.sync().expect("sync");
    let live = f.engine().stats().live_bytes;
    f.open_file(ino).expect("open");
    f.open_file(ino).expect("open twice");
    f.unlink(ROOT, b"tmp").expect("unlink");
    assert_eq!(errno(f.lookup(ROOT, b"tmp")), libc::ENOENT);
    assert_eq!(f.getattr(ino).expect("getattr of an open orphan").nlink, 0);
    assert_eq!(read_all(&f, ino), data);
    // Still writable and readable through the handle, across a commit.
    f.write(ino, 10, b"more").expect("write to an orphan");
    f.sync().expect("sync");
    let mut want = data.clone();
    want[10..14].copy_from_slice(b"more");
    assert_eq!(read_all(&f, ino), want);
    // A new link to it is refused.
    assert_eq!(errno(f.link(ino, ROOT, b"back")), libc::ENOENT);
    f.release_file(ino).expect("release one");
    assert_eq!(read_all(&f, ino), want, "one handle is still open");
    f.release_file(ino).expect("release last");
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    assert_eq!(errno(f.read(ino, 0, 10)), libc::ENOENT);
    f.sync().expect("sync");
    let after = f.engine().stats().live_bytes;
    assert!(after + 250_000 <= live, "the orphan's data is freed: {live} -> {after}");
    // A stray release is harmless.
    f.release_file(ino).expect("stray release");
    let f = reopen(&s, f);
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    assert!(names(&f, ROOT).is_empty());
    fsck(&f);
}

#[test]
fn orphan_is_deleted_at_open_after_close_without_release() {
    let (s, f) = fresh();
    let mut rng = StdRng::seed_from_u64(22);
    let data = random_bytes(&mut rng, 300_000);
    let keep = create(&f, ROOT, b"keep");
    f.write(keep, 0, b"keep me").expect("write");
    let ino = create(&f, ROOT, b"tmp");
    f.write(ino, 0, &data).expect("write");
    f.sync().expect("sync");
    let live0 = f.engine().stats().live_bytes;
    f.open_file(ino).expect("open");
    f.unlink(ROOT, b"tmp").expect("unlink");
    f.close().expect("close without release");

    let f = Fs::open(s.clone(), fs_opts()).expect("reopen");
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT, "the orphan is deleted at open");
    assert_eq!(errno(f.read(ino, 0, 1)), libc::ENOENT);
    assert_eq!(f.physical_bytes(ino).expect("physical of a deleted inode"), 0);
    assert_eq!(f.read(keep, 0, 100).expect("read"), b"keep me");
    let live1 = f.engine().stats().live_bytes;
    assert!(live1 + 250_000 <= live0, "the orphan's data is freed at open: {live0} -> {live1}");
    let f = reopen(&s, f);
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    assert_eq!(names(&f, ROOT), vec![b"keep".to_vec()]);
    fsck(&f);
}

#[test]
fn orphan_is_deleted_at_open_after_drop_without_release() {
    let (s, f) = fresh();
    let ino = create(&f, ROOT, b"tmp");
    f.write(ino, 0, &compressible(200_000)).expect("write");
    let ino2 = create(&f, ROOT, b"tmp2");
    f.write(ino2, 0, b"tiny").expect("write");
    f.open_file(ino).expect("open");
    f.open_file(ino2).expect("open");
    f.unlink(ROOT, b"tmp").expect("unlink");
    // Replaced by a rename while open: an orphan too.
    let other = create(&f, ROOT, b"other");
    f.rename(ROOT, b"other", ROOT, b"tmp2", 0).expect("rename over an open file");
    assert_eq!(f.read(ino2, 0, 10).expect("read"), b"tiny");
    f.sync().expect("sync");
    drop(f);

    let f = Fs::open(s.clone(), fs_opts()).expect("reopen after drop");
    assert_eq!(errno(f.getattr(ino)), libc::ENOENT);
    assert_eq!(errno(f.getattr(ino2)), libc::ENOENT);
    assert_eq!(f.lookup(ROOT, b"tmp2").expect("tmp2").ino, other);
    assert_eq!(names(&f, ROOT), vec![b"tmp2".to_vec()]);
    fsck(&f);
    f.close().expect("close");
}

#[test]
fn removed_open_directory_takes_no_new_entries() {
    let (s, f) = fresh();
    let d = mkdir(&f, ROOT, b"d");
    let file = create(&f, ROOT, b"f");
    f.open_file(d).expect("open the directory");
    f.rmdir(ROOT, b"d").expect("rmdir");
    assert_eq!(f.getattr(ROOT).expect("root").nlink, 2);
    assert_eq!(errno(f.lookup(ROOT, b"d")), libc::ENOENT);
    // POSIX: no entries can be made in a removed directory (ENOENT).
    assert_eq!(errno(f.create(d, b"x", 0o644, 0, 0)), libc::ENOENT, "create in a removed dir");
    assert_eq!(errno(f.mkdir(d, b"x", 0o755, 0, 0)), libc::ENOENT, "mkdir in a removed dir");
    assert_eq!(errno(f.symlink(d, b"x", b"t", 0, 0)), libc::ENOENT, "symlink in a removed dir");
    assert_eq!(errno(f.link(file, d, b"x")), libc::ENOENT, "link into a removed dir");
    assert_eq!(errno(f.rename(ROOT, b"f", d, b"x", 0)), libc::ENOENT, "rename into a removed dir");
    assert!(f.readdir(d, None, 10).expect("readdir of a removed dir").is_empty());
    assert_eq!(f.lookup(ROOT, b"f").expect("f stays").ino, file);
    assert_eq!(f.getattr(file).expect("f").nlink, 1);
    f.release_file(d).expect("release");
    assert_eq!(errno(f.getattr(d)), libc::ENOENT);
    let f = reopen(&s, f);
    assert_eq!(names(&f, ROOT), vec![b"f".to_vec()]);
    assert_eq!(f.getattr(file).expect("f").nlink, 1);
    fsck(&f);
}

#[test]
fn blocks_follow_truncate_of_rewritten_chunks() {
    let o = MkfsOptions { chunk_size: 4096, ..MkfsOptions::default() };
    let (s, f) = mkfs_with(&o);
    let mut rng = StdRng::seed_from_u64(51);
    let mut model = random_bytes(&mut rng, 4 * 4096);
    let ino = create(&f, ROOT, b"f");
    f.write(ino, 0, &model).expect("write");
    f.sync().expect("sync");
    assert_eq!(f.getattr(ino).expect("getattr").blocks, 32);
    // Rewrite a byte in stored chunks (buffered over stored), then cut
    // them off in the same group.
    f.write(ino, 2 * 4096 + 5, b"x").expect("write");
    f.write(ino, 3 * 4096 + 5, b"y").expect("write");
    f.write(ino, 4096 + 5, b"w").expect("write");
    model[4096 + 5] = b'w';
    f.setattr(ino, &SetAttr { size: Some(4096 + 100), ..Default::default() }).expect("truncate");
    model.truncate(4096 + 100);
    let want_blocks = (4096u64 + 100).div_ceil(512);
    assert_eq!(f.getattr(ino).expect("getattr").blocks, want_blocks, "buffered");
    assert_eq!(read_all(&f, ino), model);
    f.sync().expect("sync");
    assert_eq!(f.getattr(ino).expect("getattr").blocks, want_blocks, "committed");
    // Extending leaves a hole: zeros, no blocks.
    f.setattr(ino, &SetAttr { size: Some(20_000), ..Default::default() }).expect("extend");
    model.resize(20_000, 0);
    let f = reopen(&s, f);
    assert_eq!(f.getattr(ino).expect("getattr").blocks, want_blocks, "reopened");
    assert_eq!(read_all(&f, ino), model);
    assert_eq!(f.lseek(ino, 4096 + 100, false).expect("hole"), 8192);
    fsck(&f);
}

// ---------------------------------------------------------------- xattrs

#[test]
fn xattr_set_get_list_remove() {
    let (s, f) = fresh();
    let file = create(&f, ROOT, b"f");
    let dir = mkdir(&f, ROOT, b"d");
    let link = f.symlink(ROOT, b"l", b"f", 0, 0).expect("symlink").ino;
    for ino in [file, dir, link] {
        f.setxattr(ino, b"user.a", b"1", 0).expect("set user.a");
        f.setxattr(ino, b"trusted.b", b"", 0).expect("set an empty value");
        f.setxattr(ino, b"security.c", &[0, 255, 7], 0).expect("set binary");
        assert_eq!(f.getxattr(ino, b"user.a").expect("get"), b"1");
        assert_eq!(f.getxattr(ino, b"trusted.b").expect("get"), b"");
        assert_eq!(f.getxattr(ino, b"security.c").expect("get"), [0, 255, 7]);
        assert_eq!(errno(f.getxattr(ino, b"user.none")), libc::ENODATA);

        assert_eq!(errno(f.setxattr(ino, b"user.a", b"2", XATTR_CREATE)), libc::EEXIST);
        assert_eq!(f.getxattr(ino, b"user.a").expect("get"), b"1", "a refused create changes nothing");
        assert_eq!(errno(f.setxattr(ino, b"user.new", b"2", XATTR_REPLACE)), libc::ENODATA);
        assert_eq!(errno(f.getxattr(ino, b"user.new")), libc::ENODATA, "a refused replace creates nothing");
        f.setxattr(ino, b"user.a", b"22", XATTR_REPLACE).expect("replace");
        f.setxattr(ino, b"user.new", b"3", XATTR_CREATE).expect("create");
        assert_eq!(f.getxattr(ino, b"user.a").expect("get"), b"22");

        for bad in [&b"foo"[..], b"system.foo", b"os2.x", b"USER.x", b"userx"] {
            let what = String::from_utf8_lossy(bad).into_owned();
            assert_eq!(errno(f.setxattr(ino, bad, b"v", 0)), libc::EOPNOTSUPP, "set {what}");
            assert_eq!(errno(f.getxattr(ino, bad)), libc::EOPNOTSUPP, "get {what}");
            assert_eq!(errno(f.removexattr(ino, bad)), libc::EOPNOTSUPP, "remove {what}");
        }
    }
    let f = reopen(&s, f);
    for ino in [file, dir, link] {
        let got: BTreeSet<Vec<u8>> = f.listxattr(ino).expect("list").into_iter().collect();
        let want: BTreeSet<Vec<u8>> =
            [&b"user.a"[..], b"trusted.b", b"security.c", b"user.new"].iter().map(|n| n.to_vec()).collect();
        assert_eq!(got, want);
        assert_eq!(f.getxattr(ino, b"user.a").expect("get"), b"22");
        f.removexattr(ino, b"user.a").expect("remove");
        assert_eq!(errno(f.getxattr(ino, b"user.a")), libc::ENODATA);
        assert_eq!(errno(f.removexattr(ino, b"user.a")), libc::ENODATA);
        assert_eq!(errno(f.setxattr(ino, b"user.a", b"x", XATTR_REPLACE)), libc::ENODATA);
    }
    // Xattrs of one inode do not show on another, and go with the inode.
    let other = create(&f, ROOT, b"other");
    assert!(f.listxattr(other).expect("list").is_empty());
    f.unlink(ROOT, b"f").expect("unlink");
    assert_eq!(errno(f.getxattr(file, b"user.new")), libc::ENOENT);
    let f = reopen(&s, f);
    assert_eq!(f.listxattr(dir).expect("list").len(), 3);
    assert_eq!(errno(f.listxattr(file)), libc::ENOENT);
    fsck(&f);
}

#[test]
fn codec_policy_is_inherited_and_used() {
    let (s, f) = fresh();
    let raw = compressible(512 * KIB as usize);
    let plain = mkdir(&f, ROOT, b"plain");
    let zdir = mkdir(&f, ROOT, b"z");
    f.setxattr(plain, XATTR_CODEC, b"none", 0).expect("set codec none");
    f.setxattr(zdir, XATTR_CODEC, b"zstd:3", XATTR_CREATE).expect("set codec zstd:3");
    assert_eq!(errno(f.setxattr(zdir, XATTR_CODEC, b"zstd:5", XATTR_CREATE)), libc::EEXIST);
    assert_eq!(errno(f.setxattr(ROOT, XATTR_CODEC, b"zstd", XATTR_REPLACE)), libc::ENODATA);
    assert_eq!(errno(f.setxattr(zdir, XATTR_CODEC, b"bogus", 0)), libc::EINVAL);
    assert_eq!(f.getxattr(zdir, XATTR_CODEC).expect("get"), b"zstd:3", "a bad policy changes nothing");
    assert_eq!(errno(f.getxattr(ROOT, XATTR_CODEC)), libc::ENODATA);
    assert!(f.listxattr(plain).expect("list").contains(&XATTR_CODEC.to_vec()));

    let pf = create(&f, plain, b"f");
    let zf = create(&f, zdir, b"f");
    // Inherited through a subdirectory too.
    let sub = mkdir(&f, plain, b"sub");
    let sf = create(&f, sub, b"f");
    assert_eq!(f.getxattr(pf, XATTR_CODEC).expect("inherited"), b"none");
    assert_eq!(f.getxattr(sub, XATTR_CODEC).expect("inherited"), b"none");
    assert_eq!(f.getxattr(sf, XATTR_CODEC).expect("inherited"), b"none");
    assert_eq!(f.getxattr(zf, XATTR_CODEC).expect("inherited"), b"zstd:3");
    for ino in [pf, zf, sf] {
        f.write(ino, 0, &raw).expect("write");
    }
    f.sync().expect("sync");
    let f = reopen(&s, f);
    let pp = f.physical_bytes(pf).expect("physical");
    let zp = f.physical_bytes(zf).expect("physical");
    let sp = f.physical_bytes(sf).expect("physical");
    let n = raw.len() as u64;
    assert!(pp >= n && pp <= n + n / 20, "codec none: {pp} stored bytes for {n}");
    assert!(sp >= n && sp <= n + n / 20, "codec none (subdirectory): {sp} stored bytes for {n}");
    assert!(zp * 4 < n, "codec zstd:3: {zp} stored bytes for {n} compressible bytes");
    assert_eq!(read_all(&f, pf), raw);
    assert_eq!(read_all(&f, zf), raw);
    assert_eq!(f.getxattr(pf, XATTR_CODEC).expect("after reopen"), b"none");

    // The physical size is readable as an xattr, and read-only.
    for ino in [pf, zf] {
        let v = f.getxattr(ino, XATTR_PHYSICAL).expect("get physical");
        let p: u64 = String::from_utf8(v).expect("utf-8").trim().parse().expect("a number");
        assert_eq!(p, f.physical_bytes(ino).expect("physical"));
        assert_eq!(errno(f.setxattr(ino, XATTR_PHYSICAL, b"1", 0)), libc::EPERM);
        assert_eq!(errno(f.setxattr(ino, XATTR_PHYSICAL, b"1", XATTR_CREATE)), libc::EPERM);
        assert_eq!(errno(f.setxattr(ino, XATTR_PHYSICAL, b"1", XATTR_REPLACE)), libc::EPERM);
        assert!(f.removexattr(ino, XATTR_PHYSICAL).is_err(), "removing user.zlogfs.physical");
        assert_eq!(f.getxattr(ino, XATTR_PHYSICAL).expect("still there"), p.to_string().into_bytes());
    }
    // A directory's is its subtree's; data not committed yet counts at its
    // length, marked as an estimate.
    let number = |v: Vec<u8>| String::from_utf8(v).expect("utf-8");
    assert_eq!(number(f.getxattr(plain, XATTR_PHYSICAL).expect("of a directory")), (pp + sp).to_string());
    assert_eq!(number(f.getxattr(zdir, XATTR_PHYSICAL).expect("of a directory")), zp.to_string());
    assert_eq!(number(f.getxattr(ROOT, XATTR_PHYSICAL).expect("of the root")), (pp + sp + zp).to_string());
    let late = create(&f, sub, b"late");
    f.write(late, 0, &raw[..5000]).expect("write");
    assert_eq!(number(f.getxattr(late, XATTR_PHYSICAL).expect("buffered")), "~5000");
    assert_eq!(number(f.getxattr(plain, XATTR_PHYSICAL).expect("buffered")), format!("~{}", pp + sp + 5000));
    assert!(!f.listxattr(plain).expect("list").iter().any(|n| n.as_slice() == XATTR_PHYSICAL), "not listed");
    f.sync().expect("sync");
    let lp = f.physical_bytes(late).expect("physical");
    assert_eq!(number(f.getxattr(late, XATTR_PHYSICAL).expect("committed")), lp.to_string());
    f.unlink(sub, b"late").expect("unlink");

    // Removing a policy: new files take the file system's default.
    f.removexattr(plain, XATTR_CODEC).expect("remove policy");
    assert_eq!(errno(f.getxattr(plain, XATTR_CODEC)), libc::ENODATA);
    assert_eq!(errno(f.removexattr(plain, XATTR_CODEC)), libc::ENODATA);
    let df = create(&f, plain, b"default");
    assert_eq!(errno(f.getxattr(df, XATTR_CODEC)), libc::ENODATA);
    f.write(df, 0, &raw).expect("write");
    f.sync().expect("sync");
    let dp = f.physical_bytes(df).expect("physical");
    assert!(dp * 4 < n, "default codec (zstd): {dp} stored bytes for {n}");
    // The existing file keeps its own policy.
    assert_eq!(f.getxattr(pf, XATTR_CODEC).expect("own policy"), b"none");
    fsck(&f);
}

// ---------------------------------------------------------------- fallocate

#[test]
fn fallocate_modes() {
    let o = MkfsOptions { chunk_size: 4096, ..MkfsOptions::default() };
    let (s, f) = mkfs_with(&o);
    let mut rng = StdRng::seed_from_u64(31);
    let mut model = random_bytes(&mut rng, 5 * 4096 + 100);
    let ino = create(&f, ROOT, b"f");
    f.write(ino, 0, &model).expect("write");
    f.sync().expect("sync");
    let size0 = model.len() as u64;
    let blocks0 = f.getattr(ino).expect("getattr").blocks;

    // Punch a hole across chunk boundaries, whole chunks included.
    f.fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 9000).expect("punch");
    model[1000..10_000].fill(0);
    let a = f.getattr(ino).expect("getattr");
    assert_eq!(a.size, size0, "punch keeps the size");
    assert!(a.blocks < blocks0, "punching a whole chunk frees blocks: {blocks0} -> {}", a.blocks);
    assert_eq!(read_all(&f, ino), model);
    assert_eq!(f.lseek(ino, 4096, true).expect("seek data"), 8192, "chunk 1 is a hole now");
    // Punching past the end changes neither size nor data.
    f.fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, size0 - 50, 10_000).expect("punch tail");
    model[size0 as usize - 50..].fill(0);
    assert_eq!(f.getattr(ino).expect("getattr").size, size0);
    assert_eq!(read_all(&f, ino), model);

    // ZERO_RANGE without KEEP_SIZE extends the size.
    f.fallocate(ino, FALLOC_FL_ZERO_RANGE, 12_000, 20_000).expect("zero range");
    model[12_000..].fill(0);
    model.resize(32_000, 0);
    assert_eq!(f.getattr(ino).expect("getattr").size, 32_000);
    assert_eq!(read_all(&f, ino), model);
    // With KEEP_SIZE it zeroes but does not extend.
    f.fallocate(ino, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 100, 100_000).expect("zero keep");
    model[100..].fill(0);
    assert_eq!(f.getattr(ino).expect("getattr").size, 32_000);
    assert_eq!(read_all(&f, ino), model);
    // Mode 0 allocates: extends the size with zeros; KEEP_SIZE does not.
    f.fallocate(ino, FALLOC_FL_KEEP_SIZE, 0, 1 << 20).expect("keep size");
    assert_eq!(f.getattr(ino).expect("getattr").size, 32_000);
    f.fallocate(ino, 0, 40_000, 1000).expect("allocate");
    model.resize(41_000, 0);
    assert_eq!(f.getattr(ino).expect("getattr").size, 41_000);
    assert_eq!(read_all(&f, ino), model);

    // Unsupported modes are refused without change.
    for mode in [
        FALLOC_FL_PUNCH_HOLE,                        // punch needs KEEP_SIZE
        0x08,                                        // COLLAPSE_RANGE
        0x20,                                        // INSERT_RANGE
        0x40 | FALLOC_FL_KEEP_SIZE,                  // UNSHARE_RANGE
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE, // two operations at once
    ] {
        assert_eq!(errno(f.fallocate(ino, mode, 0, 4096)), libc::EOPNOTSUPP, "mode {mode:#x}");
    }
    assert_eq!(errno(f.fallocate(ino, 0, 0, 0)), libc::EINVAL, "zero length");
    let dir = mkdir(&f, ROOT, b"d");
    assert!(f.fallocate(dir, 0, 0, 10).is_err(), "fallocate of a directory");
    assert_eq!(f.getattr(ino).expect("getattr").size, 41_000);
    assert_eq!(read_all(&f, ino), model);
    let f = reopen(&s, f);
    assert_eq!(f.getattr(ino).expect("getattr").size, 41_000);
    assert_eq!(read_all(&f, ino), model);
    fsck(&f);
}

// ---------------------------------------------------------------- readdir

#[test]
fn readdir_resume_sees_each_stable_entry_once() {
    let (s, f) = fresh();
    let d = mkdir(&f, ROOT, b"d");
    let mut live: BTreeSet<Vec<u8>> = BTreeSet::new();
    for n in 0..300 {
        let name = format!("m{n:04}").into_bytes();
        create(&f, d, &name);
        live.insert(name);
    }
    f.sync().expect("sync");
    let f = reopen(&s, f);
    let initial = live.clone();
    let mut ever: BTreeSet<Vec<u8>> = live.clone();
    let mut removed: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut added_after_cursor: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut removed_ahead: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut rng = StdRng::seed_from_u64(41);
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut cursor: Option<Vec<u8>> = None;
    let mut page_no = 0;
    loop {
        let page = f.readdir(d, cursor.as_deref(), 9).expect("readdir");
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 9);
        for e in &page {
            seen.push(e.name.clone());
        }
        cursor = Some(page.last().expect("non-empty").name.clone());
        let cur = cursor.clone().expect("cursor");
        page_no += 1;
        if page_no > 25 {
            // Stop changing the directory, so that the listing ends.
            continue;
        }
        // Change the directory between pages: entries before and after the
        // cursor come and go, the cursor's own entry included sometimes.
        let before: Vec<Vec<u8>> = live.range(..cur.clone()).cloned().collect();
        let after: Vec<Vec<u8>> = live.range(cur.clone()..).skip(1).cloned().collect();
        if !before.is_empty() {
            let n = before[rng.gen_range(0..before.len())].clone();
            f.unlink(d, &n).expect("unlink before");
            live.remove(&n);
            removed.insert(n);
        }
        if !after.is_empty() && page_no % 2 == 0 {
            let n = after[rng.gen_range(0..after.len())].clone();
            f.unlink(d, &n).expect("unlink after");
            live.remove(&n);
            removed_ahead.insert(n.clone());
            removed.insert(n);
        }
        if page_no % 3 == 0 {
            f.unlink(d, &cur).expect("unlink the cursor");
            live.remove(&cur);
            removed.insert(cur.clone());
        }
        // New names sorting before and after the cursor.
        let early = [b"a".as_slice(), &cur].concat();
        for n in [early, format!("z{page_no:04}").into_bytes(), [cur.as_slice(), b"+"].concat()] {
            if live.contains(&n) || ever.contains(&n) {
                continue;
            }
            create(&f, d, &n);
            if n > cur {
                added_after_cursor.insert(n.clone());
            }
            live.insert(n.clone());
            ever.insert(n);
        }
        if page_no % 5 == 0 {
            f.sync().expect("sync between pages");
        }
    }
    // No duplicates, in strictly increasing order.
    for w in seen.windows(2) {
        assert!(
            w[0] < w[1],
            "readdir order: {:?} then {:?}",
            String::from_utf8_lossy(&w[0]),
            String::from_utf8_lossy(&w[1])
        );
    }
    let seen_set: BTreeSet<Vec<u8>> = seen.iter().cloned().collect();
    assert_eq!(seen_set.len(), seen.len(), "an entry returned twice");
    // Every entry present throughout is returned.
    for n in initial.iter().filter(|n| !removed.contains(*n)) {
        assert!(seen_set.contains(n), "stable entry {:?} missed", String::from_utf8_lossy(n));
    }
    // Nothing that never existed, nothing removed before the cursor got
    // there, and every entry added past the cursor and kept.
    for n in &seen_set {
        assert!(ever.contains(n), "unknown entry {:?}", String::from_utf8_lossy(n));
        assert!(
            !removed_ahead.contains(n),
            "entry {:?} removed before it was reached",
            String::from_utf8_lossy(n)
        );
    }
    for n in added_after_cursor.iter().filter(|n| live.contains(*n)) {
        assert!(seen_set.contains(n), "entry {:?} added past the cursor missed", String::from_utf8_lossy(n));
    }
    assert!(page_no > 25, "enough pages to matter: {page_no}");
    // A full listing now equals what is live.
    let now: BTreeSet<Vec<u8>> = names(&f, d).into_iter().collect();
    assert_eq!(now, live);
    // Resuming after a name that never existed, or past the end.
    let page = f.readdir(d, Some(b"m0150x"), 3).expect("readdir after a missing name");
    assert!(page.iter().all(|e| e.name.as_slice() > b"m0150x".as_slice()));
    let want: Vec<Vec<u8>> = live.range(b"m0150x".to_vec()..).take(3).cloned().collect();
    assert_eq!(page.into_iter().map(|e| e.name).collect::<Vec<_>>(), want);
    assert!(f.readdir(d, Some(&[0xff; 255]), 10).expect("readdir at the end").is_empty());
    fsck(&f);
}

/// Writes a file of 40 MiB on a store of 64 MiB, deletes it, and writes it
/// again: the space of deleted data must be reusable, and statfs must show
/// it free again, without waiting for the index to fill its memtable.
#[test]
fn space_freed_by_delete_is_reusable() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 64 }));
    fs::mkfs(s.clone(), &MkfsOptions::default()).expect("mkfs");
    let mut f = Fs::open(s.clone(), fs_opts()).expect("open");
    let bfree0 = f.statfs().expect("statfs").bfree;
    let mut rng = StdRng::seed_from_u64(9);
    let blob = random_bytes(&mut rng, MIB as usize);
    let mut frees = Vec::new();
    for round in 0..3 {
        let ino = create(&f, ROOT, b"big");
        for i in 0..40 {
            f.write(ino, i * MIB, &blob).unwrap_or_else(|e| panic!("round {round}, MiB {i}: {e}"));
        }
        f.sync().unwrap_or_else(|e| panic!("round {round}: sync after writing 40 MiB: {e}"));
        assert_eq!(f.read(ino, 39 * MIB, blob.len()).expect("read"), blob);
        f.unlink(ROOT, b"big").expect("unlink");
        f.sync().expect("sync");
        f = reopen(&s, f);
        frees.push(f.statfs().expect("statfs").bfree);
    }
    for (round, bfree) in frees.into_iter().enumerate() {
        assert!(
            bfree + 4 * MIB / 4096 >= bfree0,
            "round {round}: statfs free blocks {bfree0} -> {bfree} after deleting everything"
        );
    }
    fsck(&f);
}

/// A commit that runs out of space must not leave blocks behind: the
/// space it could not finish using is there again once the file that did
/// not fit is deleted, and the image's live bytes account for what the
/// files hold (regression: a half-placed group of blocks stayed live,
/// unreferenced, for good).
#[test]
fn failed_commit_for_space_leaks_nothing() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 24 }));
    fs::mkfs(s.clone(), &MkfsOptions::default()).expect("mkfs");
    let mut f = Fs::open(s.clone(), fs_opts()).expect("open");
    let live0 = f.engine().stats().live_bytes;
    let mut rng = StdRng::seed_from_u64(11);
    let blob = random_bytes(&mut rng, MIB as usize);
    for round in 0..3 {
        let ino = create(&f, ROOT, b"too-big");
        // The writer gets ENOSPC (the data is committed early once it
        // could outgrow the free log); at the latest, the sync does.
        let mut refused = None;
        for i in 0..40 {
            if let Err(e) = f.write(ino, i * MIB, &blob) {
                assert_eq!(fuse_errno(&e), libc::ENOSPC, "round {round}: write {i}: {e}");
                refused = Some(i);
                break;
            }
        }
        let i = refused
            .unwrap_or_else(|| panic!("round {round}: 40 MiB of random data in a 24 MiB image accepted"));
        assert!(i >= 16, "round {round}: ENOSPC after only {i} MiB of a 24 MiB image");
        f.unlink(ROOT, b"too-big").expect("unlink after ENOSPC");
        // What fits, fits, with no sync in between: the writer's space
        // check makes the delete durable to count its space free.
        let ino = create(&f, ROOT, b"fits");
        for i in 0..16 {
            f.write(ino, i * MIB, &blob)
                .unwrap_or_else(|e| panic!("round {round}: MiB {i} after the delete: {e}"));
        }
        f.unlink(ROOT, b"fits").expect("unlink");
        f.sync().unwrap_or_else(|e| panic!("round {round}: sync after the unlinks: {e}"));
        let live = f.engine().stats().live_bytes;
        assert!(live < live0 + MIB, "round {round}: {live0} live bytes before, {live} after (leaked)");
        let ino = create(&f, ROOT, b"fits");
        for i in 0..8 {
            f.write(ino, i * MIB, &blob).expect("write");
        }
        f.sync().unwrap_or_else(|e| panic!("round {round}: 8 MiB after freeing: {e}"));
        f.unlink(ROOT, b"fits").expect("unlink");
        f.sync().expect("sync");
        f = reopen(&s, f);
    }
    fsck(&f);
}

/// SEEK_DATA / SEEK_HOLE on a file of the largest size, with data only in
/// its last chunk: the answer must not take time proportional to the size
/// of the hole.
#[test]
fn seek_on_largest_sparse_file() {
    let (s, f) = fresh();
    let ino = create(&f, ROOT, b"huge");
    let max = i64::MAX as u64; // the largest file size (sizes fit off_t)
    f.setattr(ino, &SetAttr { size: Some(max), ..Default::default() }).expect("truncate up");
    assert_eq!(f.write(ino, max - 1, b"x").expect("write the last byte"), 1);
    assert_eq!(errno(f.write(ino, max, b"y")), libc::EFBIG);
    assert_eq!(errno(f.write(ino, max - 1, b"yz")), libc::EFBIG);
    assert_eq!(errno(f.setattr(ino, &SetAttr { size: Some(max + 1), ..Default::default() })), libc::EFBIG);
    f.sync().expect("sync");
    let f = reopen(&s, f);
    assert_eq!(f.getattr(ino).expect("getattr").size, max);
    assert_eq!(f.read(ino, max - 3, 10).expect("read"), b"\0\0x");
    let f = Arc::new(f);
    let (tx, rx) = std::sync::mpsc::channel();
    let g = f.clone();
    std::thread::spawn(move || {
        let r = (g.lseek(ino, 0, true), g.lseek(ino, 0, false), g.lseek(ino, max - 1, true));
        let _ = tx.send(r);
    });
    let (d, h, d2) = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("SEEK_DATA over a hole of 8 EiB did not answer within 5 s");
    let cs = u64::from(f.config().chunk_size);
    let d = d.expect("SEEK_DATA");
    assert!(d < max && d > max - 1 - cs, "SEEK_DATA from 0 gave {d}");
    assert_eq!(h.expect("SEEK_HOLE"), 0);
    assert_eq!(d2.expect("SEEK_DATA at the last byte"), max - 1);
    fsck(&f);
}

/// Full chunks are compressed on the pool as sequential writes fill them
/// (`FsStats::ahead_used`), and a chunk changed after that, in any way
/// (a write into it, a truncate, a punched hole, a codec change), is
/// stored as it is at the commit, never as it was compressed.
#[test]
fn chunks_compressed_ahead_are_used_only_for_the_same_bytes() {
    let (s, f) = fresh();
    let cs = 64 * KIB as usize;
    let text = |n: usize, seed: u8| -> Vec<u8> {
        (0..n).map(|i| b"abcdefgh"[(i / 7 + seed as usize) % 8] ^ ((i / 4096) as u8 & seed)).collect()
    };
    // 8 MiB written a chunk at a time: the pool gets some of them.
    let a = create(&f, ROOT, b"seq");
    let data = text(128 * cs, 3);
    for c in data.chunks(cs) {
        let off = (c.as_ptr() as usize - data.as_ptr() as usize) as u64;
        f.write(a, off, c).expect("write");
        // Let the pool's threads take the job, as a real writer's next
        // request would.
        std::thread::sleep(std::time::Duration::from_micros(300));
    }
    f.sync().expect("sync");
    assert!(f.stats().ahead_used > 0, "no chunk was stored from a block compressed ahead");
    // Chunks changed after they were filled: a byte written, cut short,
    // holed, and a file whose codec changed.
    let b = create(&f, ROOT, b"changed");
    let mut want = text(6 * cs, 5);
    for k in 0..6 {
        f.write(b, (k * cs) as u64, &want[k * cs..(k + 1) * cs]).expect("write");
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    f.write(b, (cs + 100) as u64, b"CHANGED").expect("write into a full chunk");
    want[cs + 100..cs + 107].copy_from_slice(b"CHANGED");
    f.fallocate(b, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (3 * cs) as u64, 4096).expect("punch");
    want[3 * cs..3 * cs + 4096].fill(0);
    f.setattr(b, &SetAttr { size: Some((5 * cs + 1000) as u64), ..SetAttr::default() }).expect("truncate");
    want.truncate(5 * cs + 1000);
    let c = create(&f, ROOT, b"codec");
    let cdata = text(2 * cs, 7);
    f.write(c, 0, &cdata).expect("write");
    std::thread::sleep(std::time::Duration::from_millis(50));
    f.setxattr(c, XATTR_CODEC, b"lz4", 0).expect("codec");
    // The same bytes in a file that was lz4 from the start.
    let d = create(&f, ROOT, b"lz4");
    f.setxattr(d, XATTR_CODEC, b"lz4", 0).expect("codec");
    f.write(d, 0, &cdata).expect("write");
    f.sync().expect("sync");
    let f = reopen(&s, f);
    assert_eq!(f.read(a, 0, data.len()).expect("read"), data);
    assert_eq!(f.read(b, 0, want.len() + 10).expect("read"), want);
    assert_eq!(f.read(c, 0, cdata.len()).expect("read"), cdata);
    let physical = |ino| f.getxattr(ino, XATTR_PHYSICAL).expect("physical");
    assert_eq!(physical(c), physical(d), "a codec change after the chunks filled is the codec stored");
    fsck(&f);
}

// ---------------------------------------------------------------- caches

/// Dropping the caches (memory pressure, `zlogfs drop-caches`) frees what
/// reads put in them and says how much; the files read the same after,
/// and reads fill the caches again.
#[test]
fn dropped_caches_fill_again_and_read_the_same() {
    let (s, f) = fresh();
    let files: Vec<(Ino, Vec<u8>)> = (0..8)
        .map(|n| {
            let ino = create(&f, ROOT, format!("f{n}").as_bytes());
            let data = compressible(200_000 + n * 1000);
            assert_eq!(f.write(ino, 0, &data).expect("write"), data.len());
            (ino, data)
        })
        .collect();
    f.sync().expect("sync");
    let f = reopen(&s, f);
    for (ino, data) in &files {
        assert!(read_all(&f, *ino) == *data, "inode {ino} before the drop");
    }
    let (blocks, index) = (f.block_cache_bytes(), f.engine().index_cache_bytes());
    assert!(blocks > 0 && index > 0, "reads filled the caches: {blocks} and {index} bytes");
    let d = f.drop_caches();
    assert_eq!((d.blocks, d.index), (blocks, index), "what the drop says it freed");
    assert_eq!((f.block_cache_bytes(), f.engine().index_cache_bytes()), (0, 0));
    for (ino, data) in &files {
        assert!(read_all(&f, *ino) == *data, "inode {ino} after the drop");
    }
    assert!(f.block_cache_bytes() > 0, "reads fill the cache again");
    fsck(&f);
}
