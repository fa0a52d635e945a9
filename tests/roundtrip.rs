//! Round trip of real trees through the command-line tool: `zlogfs
//! import`, `zlogfs export`, `zlogfs fsck`, then a byte-for-byte and
//! metadata-for-metadata comparison (type, mode, owner, mtime, size, device
//! numbers, symlink targets, xattrs, hard links, holes).
//!
//! Trees: a synthetic tree with every kind of entry, /usr/include, and the
//! trees named in `ZLOGFS_ROUNDTRIP_TREES` (colon-separated; test.sh puts
//! the unpacked linux-source tree there).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zlogfs")
}

fn run(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(bin()).args(args).output().expect("running zlogfs");
    assert!(
        out.status.success(),
        "zlogfs {:?} failed ({}):\n{}\n{}",
        args,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[derive(Debug, PartialEq)]
struct Meta {
    kind: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    rdev: u64,
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// First path (in walk order) of the same inode.
    link: Vec<u8>,
}

fn scan(root: &Path) -> BTreeMap<Vec<u8>, Meta> {
    let mut out = BTreeMap::new();
    let mut first: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut ents: Vec<_> = std::fs::read_dir(root.join(&rel))
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        ents.sort();
        for name in ents {
            let r = rel.join(&name);
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).expect("lstat");
            let key = r.as_os_str().as_bytes().to_vec();
            let link = if m.is_dir() {
                key.clone()
            } else {
                first.entry((m.dev(), m.ino())).or_insert(key.clone()).clone()
            };
            let mut xattrs = BTreeMap::new();
            for n in xattr::list(&p).expect("listxattr") {
                xattrs
                    .insert(n.as_bytes().to_vec(), xattr::get(&p, &n).expect("getxattr").unwrap_or_default());
            }
            let target = m
                .file_type()
                .is_symlink()
                .then(|| std::fs::read_link(&p).expect("readlink").as_os_str().as_bytes().to_vec());
            out.insert(
                key,
                Meta {
                    kind: m.mode() & 0o170000,
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                    size: if m.is_dir() { 0 } else { m.len() },
                    mtime: (m.mtime(), m.mtime_nsec()),
                    rdev: m.rdev(),
                    target,
                    xattrs,
                    link,
                },
            );
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    out
}

fn same_contents(a: &Path, b: &Path) -> bool {
    let (fa, fb) = (std::fs::File::open(a).expect("open"), std::fs::File::open(b).expect("open"));
    let len = fa.metadata().expect("stat").len();
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut off = 0;
    while off < len {
        let n = ((len - off) as usize).min(x.len());
        fa.read_exact_at(&mut x[..n], off).expect("read");
        fb.read_exact_at(&mut y[..n], off).expect("read");
        if x[..n] != y[..n] {
            return false;
        }
        off += n as u64;
    }
    true
}

fn round_trip(src: &Path, work: &Path) {
    let img = work.join("t.img");
    let out = work.join("out");
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_dir_all(&out);
    let size = "64G"; // sparse: only what is written takes space
    run(&["import".as_ref(), src.as_os_str(), img.as_os_str(), "--size".as_ref(), size.as_ref()]);
    run(&["fsck".as_ref(), img.as_os_str()]);
    run(&["export".as_ref(), img.as_os_str(), out.as_os_str()]);
    let (a, b) = (scan(src), scan(&out));
    assert!(!a.is_empty(), "{} is empty", src.display());
    let missing: Vec<_> = a.keys().filter(|k| !b.contains_key(*k)).take(5).collect();
    assert!(missing.is_empty(), "{}: not exported: {missing:?}", src.display());
    assert_eq!(a.len(), b.len(), "{}: entry counts differ", src.display());
    for (k, ma) in &a {
        let mb = &b[k];
        assert_eq!(ma, mb, "{}: {:?} differs", src.display(), String::from_utf8_lossy(k));
        if ma.kind == 0o100000 {
            let rel = Path::new(std::ffi::OsStr::from_bytes(k));
            assert!(
                same_contents(&src.join(rel), &out.join(rel)),
                "{}: contents of {rel:?} differ",
                src.display()
            );
        }
    }
    eprintln!("{}: {} entries identical after import and export", src.display(), a.len());
    std::fs::remove_file(&img).ok();
    std::fs::remove_dir_all(&out).ok();
}

fn work(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zlogfs-roundtrip-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

#[test]
fn synthetic_tree_round_trips() {
    use std::os::unix::fs::PermissionsExt;
    let w = work("synthetic");
    let src = w.join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::fs::write(src.join("one"), b"x").unwrap();
    for n in [65535usize, 65536, 65537, 200_000] {
        let v: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(src.join(format!("size{n}")), v).unwrap();
    }
    // A sparse file: data at the start, at 1 GiB and at 4 GiB.
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(&[9u8; 70000], 1 << 30).unwrap();
    f.write_all_at(b"tail", 4 << 30).unwrap();
    drop(f);
    std::fs::write(src.join("sub/linked"), b"hard link contents").unwrap();
    std::fs::hard_link(src.join("sub/linked"), src.join("link2")).unwrap();
    std::fs::hard_link(src.join("sub/linked"), src.join("sub/deeper/link3")).unwrap();
    std::os::unix::fs::symlink("sub/linked", src.join("sym")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", src.join("dangling")).unwrap();
    let odd: Vec<u8> = (1..=255u8).filter(|&b| b != b'/').take(200).collect();
    std::fs::write(src.join(std::ffi::OsStr::from_bytes(&odd)), b"odd name").unwrap();
    std::fs::write(src.join(std::ffi::OsStr::from_bytes(&[b'n'; 255])), b"long name").unwrap();
    xattr::set(src.join("one"), "user.comment", b"hello").unwrap();
    xattr::set(src.join("sub"), "user.empty", b"").unwrap();
    xattr::set(&src, "user.top", b"the root's").unwrap();
    std::fs::set_permissions(src.join("one"), std::fs::Permissions::from_mode(0o4751)).unwrap();
    std::fs::set_permissions(src.join("sub/deeper"), std::fs::Permissions::from_mode(0o500)).unwrap();
    let fifo = std::ffi::CString::new(src.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let dev = std::ffi::CString::new(src.join("null").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) }, 0);
        std::os::unix::fs::lchown(src.join("one"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(src.join("sym"), Some(42), Some(43)).unwrap();
    }
    round_trip(&src, &w);
    // The exported sparse file stays sparse: round_trip removed `out`, so
    // check through a fresh export of the image's sparse file instead.
    let img = w.join("s.img");
    let rep = run(&[
        "import".as_ref(),
        src.as_os_str(),
        img.as_os_str(),
        "--size".as_ref(),
        "8G".as_ref(),
        "--json".as_ref(),
    ]);
    let rep: serde_json::Value = serde_json::from_str(&rep).unwrap();
    assert_eq!(rep["xattrs"], 3, "the root's xattr is counted with the others: {rep}");
    let out = w.join("o");
    run(&["export".as_ref(), img.as_os_str(), out.as_os_str()]);
    let m = std::fs::metadata(out.join("sparse")).unwrap();
    assert_eq!(m.len(), (4 << 30) + 4);
    assert!(m.blocks() * 512 < 1 << 20, "exported sparse file takes {} bytes", m.blocks() * 512);
    let du = run(&["du".as_ref(), img.as_os_str(), "--json".as_ref()]);
    let v: serde_json::Value = serde_json::from_str(&du).unwrap();
    assert!(v["total"]["logical"].as_u64().unwrap() > 4 << 30, "{du}");
    assert!(v["total"]["physical"].as_u64().unwrap() < 2 << 20, "{du}");
    std::fs::set_permissions(src.join("sub/deeper"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(out.join("sub/deeper"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_dir_all(&w).ok();
}

#[test]
fn real_trees_round_trip() {
    let mut trees = vec![PathBuf::from("/usr/include")];
    if let Ok(v) = std::env::var("ZLOGFS_ROUNDTRIP_TREES") {
        trees.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for t in trees {
        assert!(t.is_dir(), "{} is missing", t.display());
        let w = work("real");
        round_trip(&t, &w);
        std::fs::remove_dir_all(&w).ok();
    }
}
