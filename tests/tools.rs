//! The command-line tools on trees and images that are not plain: trees
//! deeper than PATH_MAX, entries that cannot be read, damaged images,
//! images the caller may not write, and the small refusals of issue 24
//! (items 10, 11 and 12).

mod common;

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};

fn zlogfs(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zlogfs")).args(args).output().expect("running zlogfs")
}

fn ok(args: &[&OsStr]) -> String {
    let o = zlogfs(args);
    assert!(o.status.success(), "zlogfs {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &OsStr {
    p.as_os_str()
}

fn work(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("zlogfs-tools-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).expect("mkdir");
    p
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// zlogfs as a user whom file modes bind: nobody when we are root.
fn as_user() -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_zlogfs")]);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_zlogfs"))
    }
}

/// Open `name` in `dir` (a directory, unless `flags` say otherwise).
fn at(dir: impl AsFd, name: &[u8], flags: OFlag) -> File {
    let fd = openat(dir, OsStr::from_bytes(name), flags | OFlag::O_CLOEXEC, Mode::from_bits_truncate(0o644))
        .unwrap_or_else(|e| panic!("openat {}: {e}", String::from_utf8_lossy(name)));
    File::from(fd)
}

/// Every entry under `dir`, by descriptors: (relative path, what it is:
/// a file's bytes, a symlink's target, or "dir").
fn contents(dir: &File, prefix: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    let mut d = nix::dir::Dir::from_fd(dir.try_clone().expect("dup").into()).expect("opendir");
    let mut names: Vec<Vec<u8>> = d
        .iter()
        .map(|e| e.expect("entry").file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .collect();
    names.sort();
    for n in names {
        let mut p = prefix.to_vec();
        p.push(b'/');
        p.extend_from_slice(&n);
        let st =
            nix::sys::stat::fstatat(dir, OsStr::from_bytes(&n), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .expect("fstatat");
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                out.push((p.clone(), b"dir".to_vec()));
                let sub = at(dir, &n, OFlag::O_RDONLY | OFlag::O_DIRECTORY);
                contents(&sub, &p, out);
            }
            libc::S_IFLNK => {
                let t = nix::fcntl::readlinkat(dir, OsStr::from_bytes(&n)).expect("readlinkat");
                out.push((p, [b"-> ".as_slice(), t.as_bytes()].concat()));
            }
            _ => {
                let mut f = at(dir, &n, OFlag::O_RDONLY);
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut v).expect("read");
                out.push((p, v));
            }
        }
    }
}

/// Issue 24, item 10: a tree 40 levels of 200-byte names deep (8 KB of
/// path, twice PATH_MAX) imports, checks and exports whole, files, a
/// symlink and hard links at every depth.
#[test]
fn trees_deeper_than_path_max_import_and_export() {
    let w = work("deep");
    let src = w.join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let name = [b'd'; 200];
    let mut dir = File::open(&src).expect("open");
    for level in 0..40 {
        let f = at(&dir, format!("file{level}").as_bytes(), OFlag::O_WRONLY | OFlag::O_CREAT);
        std::io::Write::write_all(&mut &f, format!("level {level}\n").as_bytes()).expect("write");
        if level % 10 == 9 {
            let f = format!("file{level}");
            nix::unistd::symlinkat(f.as_str(), &dir, "link").expect("symlink");
            nix::unistd::linkat(&dir, f.as_str(), &dir, "hard", nix::fcntl::AtFlags::empty()).expect("link");
        }
        mkdirat(&dir, OsStr::from_bytes(&name), Mode::from_bits_truncate(0o755)).expect("mkdirat");
        dir = at(&dir, &name, OFlag::O_RDONLY | OFlag::O_DIRECTORY);
    }
    let img = w.join("img");
    ok(&[OsStr::new("import"), s(&src), s(&img)]);
    ok(&[OsStr::new("fsck"), s(&img)]);
    let out = w.join("out");
    ok(&[OsStr::new("export"), s(&img), s(&out)]);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    contents(&File::open(&src).expect("open"), b"", &mut a);
    contents(&File::open(&out).expect("open"), b"", &mut b);
    assert_eq!(a.len(), 40 * 2 + 4 * 2, "entries made");
    assert!(a == b, "the exported tree differs from the source");
    let _ = std::fs::remove_dir_all(&w);
}

/// Issue 24, item 12: an entry that cannot be read is skipped with a
/// warning, the rest is imported, and the exit status is 1 (as tar and
/// rsync). Run as nobody when root, so that modes apply.
#[test]
fn import_skips_what_it_cannot_read() {
    let w = work("unreadable");
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let src = w.join("src");
    std::fs::create_dir_all(src.join("closed")).expect("mkdir");
    std::fs::create_dir_all(src.join("open")).expect("mkdir");
    std::fs::write(src.join("open/a"), b"readable").expect("write");
    std::fs::write(src.join("secret"), b"no").expect("write");
    std::fs::write(src.join("closed/inside"), b"hidden").expect("write");
    std::fs::write(src.join("z"), b"last").expect("write");
    for p in ["secret", "closed"] {
        std::fs::set_permissions(src.join(p), std::fs::Permissions::from_mode(0o000)).expect("chmod");
    }
    let img = w.join("img");
    let o = as_user().arg("import").arg(&src).arg(&img).arg("--size").arg("64M").output().expect("import");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "exit status 1 when entries were skipped: {err}");
    assert!(err.contains("secret") && err.contains("closed"), "the skipped entries are named: {err}");
    assert_eq!(ok(&[OsStr::new("cat"), s(&img), OsStr::new("/open/a")]), "readable");
    assert_eq!(ok(&[OsStr::new("cat"), s(&img), OsStr::new("/z")]), "last", "entries after a skipped one");
    let ls = ok(&[OsStr::new("ls"), s(&img), OsStr::new("/")]);
    assert!(!ls.contains("secret"), "a file that could not be read is not half there: {ls}");
    ok(&[OsStr::new("fsck"), s(&img)]);
    let _ = std::fs::remove_dir_all(&w);
}

/// Issue 24, item 11: one flipped bit in a file's data: export copies
/// everything else, leaves the damaged bytes a hole, names the file and
/// range, and exits 1; fsck names the file too.
#[test]
fn export_salvages_a_damaged_image() {
    let w = work("damaged");
    let src = w.join("src");
    std::fs::create_dir_all(src.join("raw")).expect("mkdir");
    // Incompressible bytes are stored raw: they can be found in the image.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |n: usize| -> Vec<u8> {
        seed += 1;
        common::noise(seed, n)
    };
    let victim = noise(300_000);
    std::fs::write(src.join("raw/victim"), &victim).expect("write");
    for i in 0..50 {
        std::fs::write(src.join(format!("f{i}")), noise(5000 + i * 100)).expect("write");
    }
    let img = w.join("img");
    ok(&[OsStr::new("import"), s(&src), s(&img), OsStr::new("--size"), OsStr::new("64M")]);
    // Flip a bit in the middle of the victim's second chunk.
    let mut bytes = std::fs::read(&img).expect("read image");
    let probe = &victim[100_000..100_064];
    let at = bytes.windows(probe.len()).position(|w| w == probe).expect("the victim's bytes in the image");
    bytes[at + 10] ^= 0x10;
    std::fs::write(&img, &bytes).expect("write image");
    let out = w.join("out");
    let o = zlogfs(&[OsStr::new("export"), s(&img), s(&out), OsStr::new("--json")]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let damaged = rep["damaged"].as_array().expect("damaged list");
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(damaged[0]["path"], "/raw/victim");
    let (start, end) =
        (damaged[0]["start"].as_u64().expect("start"), damaged[0]["end"].as_u64().expect("end"));
    assert!(start <= 100_010 && 100_010 < end && end - start <= 65536, "the damaged range {start}..{end}");
    let got = std::fs::read(out.join("raw/victim")).expect("the damaged file is there");
    assert_eq!(got.len(), victim.len());
    assert!(
        got[..start as usize] == victim[..start as usize] && got[end as usize..] == victim[end as usize..]
    );
    assert!(got[start as usize..end as usize].iter().all(|&b| b == 0), "the damaged bytes are a hole");
    for i in 0..50 {
        let f = format!("f{i}");
        assert_eq!(
            std::fs::read(out.join(&f)).expect("read"),
            std::fs::read(src.join(&f)).expect("read"),
            "{f}"
        );
    }
    let o = zlogfs(&[OsStr::new("fsck"), s(&img)]);
    assert_eq!(o.status.code(), Some(1));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("/raw/victim"), "fsck names the file of the damaged block: {report}");
    // Scrub finds the same block, and says which file and bytes.
    let o = zlogfs(&[OsStr::new("scrub"), s(&img), OsStr::new("--json")]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let damaged = rep["damaged"].as_array().expect("damaged list");
    assert_eq!(damaged.len(), 1, "{rep:#}");
    let d = damaged[0].as_str().expect("text");
    assert!(d.contains("/raw/victim (bytes 65536..131072)"), "{d}");
    assert!(rep["blocks"].as_u64() > Some(5), "the victim's 5 chunks and the packed files: {rep:#}");
    let _ = std::fs::remove_dir_all(&w);
}

/// A damaged block of a hard-linked file whose first link was removed:
/// the file names no directory as its parent any more, and fsck and
/// scrub still name it by its other link (they found names by the
/// parent only: "inode N"; review of 9195cbc, issue 45).
#[test]
fn a_damaged_file_is_named_by_its_remaining_link() {
    use std::sync::Arc;
    use zlogfs_engine::store::{FileStore, Store};
    use zlogfs_fs::{Fs, FsOptions, ROOT};
    let w = work("linked");
    let img = w.join("img");
    ok(&[OsStr::new("mkfs"), s(&img), OsStr::new("--size"), OsStr::new("64M")]);
    // Incompressible bytes are stored raw: they can be found in the image.
    let victim = common::noise(0x9e37_79b9_7f4a_7c15, 200_000);
    {
        let file = FileStore::open(&img).expect("open the image");
        let sb = zlogfs_engine::engine::read_superblock(&file).expect("superblock");
        let st: Arc<dyn Store> = Arc::new(file.with_geometry(sb.geometry).expect("geometry"));
        let f = Fs::open(st, FsOptions::default()).expect("open");
        let a = f.mkdir(ROOT, b"a", 0o755, 0, 0).expect("mkdir").ino;
        let b = f.mkdir(ROOT, b"b", 0o755, 0, 0).expect("mkdir").ino;
        let v = f.create(a, b"first", 0o644, 0, 0).expect("create").ino;
        f.write(v, 0, &victim).expect("write");
        f.link(v, b, b"second").expect("link");
        f.unlink(a, b"first").expect("unlink the first link");
        f.close().expect("close");
    }
    let mut bytes = std::fs::read(&img).expect("read image");
    let probe = &victim[70_000..70_064];
    let at = bytes.windows(probe.len()).position(|w| w == probe).expect("the victim's bytes in the image");
    bytes[at + 10] ^= 0x10;
    std::fs::write(&img, &bytes).expect("write image");
    let o = zlogfs(&[OsStr::new("fsck"), s(&img)]);
    assert_eq!(o.status.code(), Some(1));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("/b/second (bytes 65536..131072)"), "fsck names the file by its link: {report}");
    let o = zlogfs(&[OsStr::new("scrub"), s(&img)]);
    assert_eq!(o.status.code(), Some(1));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("/b/second (bytes 65536..131072)"), "scrub names it too: {report}");
    let _ = std::fs::remove_dir_all(&w);
}

/// Issue 24, item 12: the small refusals say what is wrong, and an image
/// the caller may not write still serves the commands that only read.
#[test]
fn clear_refusals_and_read_only_images() {
    let w = work("refusals");
    let src = w.join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    std::fs::write(src.join("d/f"), b"data").expect("write");
    let img = w.join("img");
    ok(&[OsStr::new("import"), s(&src), s(&img), OsStr::new("--size"), OsStr::new("64M")]);
    // cat of a directory.
    let o = zlogfs(&[OsStr::new("cat"), s(&img), OsStr::new("/d")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a directory"));
    // Importing what does not exist makes no image.
    let none = w.join("none.img");
    let o = zlogfs(&[OsStr::new("import"), s(&w.join("missing")), s(&none)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!none.exists(), "no image made for a missing source");
    // mkfs on a directory: no --force suggested.
    let o = zlogfs(&[OsStr::new("mkfs"), s(&src)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is a directory") && !err.contains("--force"), "{err}");
    // A name that exists: said with its path.
    let o = zlogfs(&[OsStr::new("import"), s(&src), s(&img)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/d exists in the image"), "{err}");
    // Read-only to the caller: mode 0444 as nobody (root passes modes).
    std::fs::set_permissions(&img, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let as_user = |args: &[&OsStr]| -> Output { as_user().args(args).output().expect("run") };
    for cmd in ["fsck", "ls", "stats", "du"] {
        let o = as_user(&[OsStr::new(cmd), s(&img)]);
        assert!(o.status.success(), "{cmd} of a read-only image: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = as_user(&[OsStr::new("cat"), s(&img), OsStr::new("/d/f")]);
    assert_eq!(o.stdout, b"data");
    let o = as_user(&[OsStr::new("clean"), s(&img)]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read-only to you"),
        "a writing command says why it cannot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&w);
}

/// `mkfs --history` and `snapshot policy`: automatic points are taken by
/// an import (each commit of it) and listed as automatic; `policy none`
/// drops them; a bad policy is refused with an example.
#[test]
fn the_history_policy_from_the_command_line() {
    let d = work("history");
    let img = d.join("img");
    let src = d.join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    for n in 0..50 {
        std::fs::write(src.join("sub").join(format!("f{n}")), vec![n as u8; 20_000]).expect("write");
    }
    let (img, src) = (img.to_str().expect("utf8"), src.to_str().expect("utf8"));
    let run = |a: &[&str]| zlogfs(&a.iter().map(OsStr::new).collect::<Vec<_>>());
    let okk = |a: &[&str]| {
        let out = run(a);
        assert!(out.status.success(), "zlogfs {a:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    okk(&["mkfs", img, "--size", "64M", "--history", "all:1h,daily:31d"]);
    let shown = okk(&["snapshot", "policy", img, "--json"]);
    assert!(shown.contains("all:1h,hourly:0s,daily:31d"), "{shown}");
    okk(&["import", src, img]);
    let list: serde_json::Value =
        serde_json::from_str(&okk(&["snapshot", "list", img, "--json"])).expect("json");
    let autos = list["snapshots"].as_array().expect("rows").iter().filter(|r| r["automatic"] == true).count();
    assert!(autos >= 1, "the import's commits are points: {list}");
    let stats: serde_json::Value = serde_json::from_str(&okk(&["stats", img, "--json"])).expect("json");
    assert_eq!(stats["automatic_points"], autos, "{stats}");
    assert_eq!(stats["history_policy"], "all:1h,hourly:0s,daily:31d", "{stats}");
    assert!(okk(&["stats", img]).contains("automatic points (policy all:1h"), "the text form says it");
    okk(&["snapshot", "policy", img, "none"]);
    let list = okk(&["snapshot", "list", img, "--json"]);
    assert!(!list.contains("\"automatic\": true"), "none drops them: {list}");
    let stats: serde_json::Value = serde_json::from_str(&okk(&["stats", img, "--json"])).expect("json");
    assert_eq!(
        (stats["automatic_points"].as_u64(), stats["snapshot_held_bytes"].as_u64()),
        (Some(0), Some(0))
    );
    let bad = run(&["snapshot", "policy", img, "weekly:2w"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("all:1h"), "{bad:?}");
    let fsck = okk(&["fsck", img]);
    assert!(fsck.contains("clean"), "{fsck}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Two devices from the command line (issue 29): mkfs BULK --fast FAST,
/// import and export through both (the fast device found from the path
/// the bulk device recorded, or given), stats per device, fsck; each
/// device alone, another image's fast device, and --fast on a one-device
/// image are refused with a message that says what to do.
#[test]
fn two_devices_from_the_command_line() {
    let w = work("two");
    let (bulk, fast, other) = (w.join("bulk.img"), w.join("fast.img"), w.join("other.img"));
    let src = w.join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    std::fs::write(src.join("small"), b"a small file").expect("write");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(src.join("d/big"), &big).expect("write");
    let fast_arg = format!("--fast={}", fast.display());
    ok(&[s("mkfs".as_ref()), s(&bulk), fast_arg.as_ref(), s("--size=64M".as_ref())]);
    ok(&[s("import".as_ref()), s(&src), s(&bulk)]);
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&[s("stats".as_ref()), s(&bulk), s("--json".as_ref())])).expect("json");
    let devs = stats["devices"].as_array().expect("devices");
    assert_eq!(devs.len(), 2, "{devs:?}");
    assert_eq!((devs[0]["role"].as_str(), devs[1]["role"].as_str()), (Some("fast"), Some("bulk")));
    let live = |d: &serde_json::Value| d["live_bytes"].as_u64().expect("live");
    assert!(
        live(&devs[1]) > 2_000_000 && live(&devs[0]) < live(&devs[1]) / 4,
        "the big file is on the bulk device: {devs:?}"
    );
    // By class: the index, journal and checkpoints on the fast device
    // only (a closed image may have no journal left); the big file's data
    // on the bulk one; the classes add up.
    let class = |d: &serde_json::Value, c: &str| d["live_by_class"][c].as_u64().expect("class");
    for c in ["index", "checkpoints"] {
        assert!(class(&devs[0], c) > 0, "{c}: {devs:?}");
    }
    for c in ["index", "journal", "checkpoints"] {
        assert_eq!(class(&devs[1], c), 0, "{c}: {devs:?}");
    }
    assert!(class(&devs[1], "file_data") > 2_000_000, "{devs:?}");
    for d in devs {
        let meta: u64 = ["index", "journal", "checkpoints"].iter().map(|c| class(d, c)).sum();
        assert!(meta <= live(d), "metadata classes within the live bytes: {d:?}");
        assert_eq!(meta + class(d, "file_data"), live(d), "{d:?}");
    }
    let out = w.join("out");
    ok(&[s("export".as_ref()), s(&bulk), s(&out), fast_arg.as_ref()]);
    assert_eq!(std::fs::read(out.join("d/big")).expect("read"), big);
    assert_eq!(std::fs::read(out.join("small")).expect("read"), b"a small file");
    let fsck = ok(&[s("fsck".as_ref()), s(&bulk)]);
    assert!(fsck.contains("clean"), "{fsck}");
    // Refusals.
    let err = |args: &[&OsStr]| {
        let o = zlogfs(args);
        assert!(!o.status.success(), "zlogfs {args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = err(&[s("ls".as_ref()), s(&fast)]);
    assert!(e.contains("fast device of a two-device image") && e.contains("bulk.img"), "{e}");
    ok(&[s("mkfs".as_ref()), s(&other), s("--size=16M".as_ref())]);
    let e = err(&[s("ls".as_ref()), s(&bulk), format!("--fast={}", other.display()).as_ref()]);
    assert!(e.contains("not a fast device"), "{e}");
    let e = err(&[s("ls".as_ref()), s(&other), fast_arg.as_ref()]);
    assert!(e.contains("a one-device image"), "{e}");
    let same = w.join("same.img");
    let e = err(&[s("mkfs".as_ref()), s(&same), format!("--fast={}", same.display()).as_ref()]);
    assert!(e.contains("the image itself"), "{e}");
    std::fs::rename(&fast, w.join("moved.img")).expect("rename");
    let e = err(&[s("ls".as_ref()), s(&bulk)]);
    assert!(e.contains("its fast device") && e.contains("fast.img"), "{e}");
    let moved = format!("--fast={}", w.join("moved.img").display());
    ok(&[s("ls".as_ref()), s(&bulk), moved.as_ref()]);
    // Opened read-write from there, the bulk device records the new path.
    ok(&[s("sync".as_ref()), s(&bulk), moved.as_ref()]);
    let listed = ok(&[s("ls".as_ref()), s(&bulk)]);
    assert!(listed.contains("small"), "{listed}");
    let _ = std::fs::remove_dir_all(&w);
}

/// Bad command lines get a clear error, never a panic (exit 101), and a
/// closed pipe ends a listing quietly (issue 44, items 13 and 14).
#[test]
fn no_panic_on_odd_arguments_or_a_closed_pipe() {
    let dir = work("odd");
    let img = dir.join("a.img");
    ok(&[OsStr::new("mkfs"), s(&img), OsStr::new("--size"), OsStr::new("64M")]);
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..3000 {
        std::fs::write(src.join(format!("a-file-with-a-long-enough-name-{i:05}")), b"x").unwrap();
    }
    let img2 = dir.join("b.img");
    ok(&[OsStr::new("import"), s(&src), s(&img2)]);

    // An argument that is not UTF-8, as a file name may be.
    let odd = OsStr::from_bytes(b"/tmp/\xff\xfe.img");
    for args in [vec![OsStr::new("ls"), odd, OsStr::new("/")], vec![odd, s(&dir.join("mnt"))]] {
        let o = zlogfs(&args);
        assert_ne!(o.status.code(), Some(101), "{args:?} panicked: {}", String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success(), "{args:?}");
        assert!(!o.stderr.is_empty(), "{args:?} says why");
    }

    // `zlogfs ls IMG / | head -1` and `du` into a closed pipe.
    for cmd in ["ls", "du"] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_zlogfs"))
            .args([OsStr::new(cmd), s(&img2), OsStr::new("/")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(c.stdout.take());
        let o = c.wait_with_output().unwrap();
        assert_ne!(
            o.status.code(),
            Some(101),
            "{cmd} into a closed pipe: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.stderr.is_empty(), "{cmd} ends quietly: {}", String::from_utf8_lossy(&o.stderr));
    }

    // An endpoint without a scheme.
    let o = Command::new(env!("CARGO_BIN_EXE_zlogfs"))
        .args(["mkfs", "s3://bucket/x"])
        .env("AWS_ENDPOINT_URL", "127.0.0.1:5000")
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(101), "{err}");
    assert!(!o.status.success() && err.contains("not an http"), "{err}");

    // `nbd --socket` on a regular file: refused, the file kept.
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, b"mine").unwrap();
    let o = zlogfs(&[OsStr::new("nbd"), s(&img), OsStr::new("--socket"), s(&notes)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&notes).unwrap(), b"mine", "the file stays");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A copy of one device of a two-device image is refused beside the
/// other (issue 44, item 4): (a) an older copy of the fast device with
/// the current bulk device, read-only or not, and (b) a copy of the bulk
/// device while the original is still where the fast device recorded
/// it. Each message names both devices. Moving a device still works.
#[test]
fn a_copy_of_one_device_is_refused_beside_the_other() {
    let w = work("pair");
    let (bulk, fast) = (w.join("bulk.img"), w.join("fast.img"));
    let src = w.join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    std::fs::write(src.join("a"), b"first").expect("write");
    let fast_arg = format!("--fast={}", fast.display());
    ok(&[s("mkfs".as_ref()), s(&bulk), fast_arg.as_ref(), s("--size=64M".as_ref())]);
    ok(&[s("import".as_ref()), s(&src), s(&bulk)]);
    let err = |args: &[&OsStr]| {
        let o = zlogfs(args);
        assert!(!o.status.success(), "zlogfs {args:?} succeeded: {}", String::from_utf8_lossy(&o.stdout));
        assert_ne!(o.status.code(), Some(101), "a panic");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };

    // (a) A backup of the fast device, then more writing.
    let fast_copy = w.join("fast-backup.img");
    std::fs::copy(&fast, &fast_copy).expect("copy");
    let src2 = w.join("src2");
    std::fs::create_dir_all(&src2).expect("mkdir");
    std::fs::write(src2.join("b"), b"second").expect("write");
    ok(&[s("import".as_ref()), s(&src2), s(&bulk)]);
    let copy_arg = format!("--fast={}", fast_copy.display());
    for cmd in ["ls", "fsck", "sync"] {
        let e = err(&[s(cmd.as_ref()), s(&bulk), copy_arg.as_ref()]);
        assert!(
            e.contains("not last used together") && e.contains("fast-backup.img") && e.contains("bulk.img"),
            "{cmd}: {e}"
        );
    }
    assert!(ok(&[s("ls".as_ref()), s(&bulk)]).contains('b'), "the current pair opens");

    // (b) A copy of the bulk device, the original still in place.
    let bulk_copy = w.join("bulk-backup.img");
    std::fs::copy(&bulk, &bulk_copy).expect("copy");
    let e = err(&[s("sync".as_ref()), s(&bulk_copy), fast_arg.as_ref()]);
    assert!(e.contains("is a copy of the bulk device") && e.contains("fast.img"), "{e}");
    let fsck = ok(&[s("fsck".as_ref()), s(&bulk)]);
    assert!(fsck.contains("clean"), "the original is untouched: {fsck}");

    // A bulk device moved (nothing left at the old path) opens from its
    // new path, which is recorded; then the old copy is the older one.
    let moved = w.join("moved.img");
    std::fs::rename(&bulk, &moved).expect("rename");
    ok(&[s("sync".as_ref()), s(&moved), fast_arg.as_ref()]);
    std::fs::rename(&bulk_copy, &bulk).expect("rename");
    let e = err(&[s("ls".as_ref()), s(&bulk), fast_arg.as_ref()]);
    assert!(e.contains("copy of the bulk device") || e.contains("not last used together"), "{e}");
    assert!(ok(&[s("ls".as_ref()), s(&moved)]).contains('b'));
    let _ = std::fs::remove_dir_all(&w);
}
