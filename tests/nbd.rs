//! The NBD server (`zlogfs nbd`, `mount -o nbd=`) with real clients from
//! Debian: libnbd's nbdinfo, nbdcopy and Python binding in strict mode,
//! qemu-img, fio's nbd engine. Skipped with a note when a client is
//! missing, except under CI=true (.ci/run installs them).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::proc::{fresh_dir, is_mounted, run_ok as ok, wait_for};

const ZLOGFS: &str = env!("CARGO_BIN_EXE_zlogfs");

fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// The clients, or a note (a failure under CI).
fn clients() -> bool {
    let missing: Vec<&str> =
        [("nbdinfo", "--version"), ("nbdcopy", "--version"), ("qemu-img", "--version"), ("fio", "--version")]
            .iter()
            .filter(|(t, a)| !have(t, a))
            .map(|(t, _)| *t)
            .collect();
    let py = Command::new("/usr/bin/python3").args(["-c", "import nbd"]).status().is_ok_and(|s| s.success());
    if missing.is_empty() && py {
        return true;
    }
    let why = format!("missing {missing:?}{}", if py { "" } else { ", python3-libnbd" });
    assert!(std::env::var("CI").as_deref() != Ok("true"), "NBD tests cannot run under CI: {why}");
    eprintln!("skipping the NBD tests: {why} (apt-get install libnbd-bin python3-libnbd qemu-utils fio)");
    false
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        Dir(fresh_dir("nbd", name))
    }
    fn p(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn s(&self, name: &str) -> String {
        self.p(name).to_str().expect("utf8").to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A server that is stopped (SIGTERM, then waited for) when dropped, so
/// that a failed test leaves none behind.
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            stop(c);
        }
    }
}

fn serve(d: &Dir, extra: &[&str]) -> Server {
    let sock = d.p("sock");
    let child = Command::new(ZLOGFS)
        .args(["nbd", &d.s("img"), "--socket", sock.to_str().expect("utf8")])
        .args(extra)
        .stdin(Stdio::null())
        .spawn()
        .expect("zlogfs nbd");
    wait_for("the NBD socket", || UnixStream::connect(&sock).is_ok());
    Server(Some(child))
}

/// SIGTERM, and the exit status within 20 s (else SIGKILL and a failure).
fn stop(mut child: Child) {
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t = Instant::now();
    let s = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            assert!(std::thread::panicking(), "zlogfs nbd did not end 20 s after SIGTERM");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(std::thread::panicking() || s.success(), "zlogfs nbd ends cleanly on SIGTERM: {s:?}");
}

fn uri(d: &Dir, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", d.s("sock"))
}

/// Real data: binaries and text of /usr, `n` bytes.
fn real_data(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    for dir in ["/usr/bin", "/usr/share/perl5", "/usr/include"] {
        let mut stack = vec![PathBuf::from(dir)];
        while let Some(p) = stack.pop() {
            let Ok(rd) = fs::read_dir(&p) else { continue };
            let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
            entries.sort();
            for e in entries {
                if out.len() >= n {
                    out.truncate(n);
                    return out;
                }
                match fs::symlink_metadata(&e) {
                    Ok(m) if m.is_dir() => stack.push(e),
                    Ok(m) if m.is_file() => out.extend(fs::read(&e).unwrap_or_default()),
                    _ => {}
                }
            }
        }
    }
    out.resize(n, 0);
    out
}

#[test]
fn real_clients_use_every_command_and_the_image_stays_clean() {
    if !clients() {
        return;
    }
    let d = Dir::new("clients");
    ok(Command::new(ZLOGFS).args(["mkfs", &d.s("img"), "--size", "512M"]));
    let server = serve(&d, &["--create", "vm/disk.raw:64M"]);
    let u = uri(&d, "vm/disk.raw");
    let info: serde_json::Value =
        serde_json::from_str(&ok(Command::new("nbdinfo").args(["--json", &u]))).expect("json");
    let x = &info["exports"][0];
    assert_eq!(x["export-size"], 64 << 20, "{info:#}");
    assert_eq!(x["can_multi_conn"], true);
    assert!(x["contexts"].as_array().is_some_and(|c| c.iter().any(|c| c == "base:allocation")), "{info:#}");
    let list = ok(Command::new("nbdinfo").args(["--list", &uri(&d, "")]));
    assert!(list.contains("export=\"vm/disk.raw\""), "{list}");
    // Every command and flag, and refused requests.
    let out = ok(Command::new("/usr/bin/python3").arg("tests/nbd/commands.py").arg(&u));
    assert!(out.trim_end().ends_with("ok"), "{out}");
    // nbdcopy in and out of a real ext4 image (made from /usr/include/linux by
    // mke2fs, no mount needed), then qemu-img convert out and back in.
    ok(Command::new("mkfs.ext4").args(["-q", "-F", "-d", "/usr/include/linux", &d.s("in.raw"), "64M"]));
    let raw = fs::read(d.p("in.raw")).expect("read");
    ok(Command::new("nbdcopy").args([&d.s("in.raw"), &u]));
    ok(Command::new("nbdcopy").args([&u, &d.s("out.raw")]));
    assert!(fs::read(d.p("out.raw")).expect("read") == raw, "nbdcopy out gives what went in");
    ok(Command::new("e2fsck").args(["-fn", &d.s("out.raw")]));
    ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &d.s("in.raw"), &u]));
    ok(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "qcow2", &u, &d.s("out.qcow2")]));
    ok(Command::new("qemu-img").args([
        "compare",
        "-f",
        "raw",
        "-F",
        "qcow2",
        &d.s("in.raw"),
        &d.s("out.qcow2"),
    ]));
    // Emptied first, so that what is read back came from the qcow2.
    let trim =
        "import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.trim(h.get_size(), 0); h.flush()";
    ok(Command::new("/usr/bin/python3").args(["-c", trim, &u]));
    assert!(ok(Command::new("nbdinfo").args(["--map", &u])).trim().lines().count() == 1, "all one hole");
    ok(Command::new("qemu-img").args(["convert", "-n", "-f", "qcow2", "-O", "raw", &d.s("out.qcow2"), &u]));
    ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &d.s("in.raw"), &u]));
    let map = ok(Command::new("nbdinfo").args(["--map", &u]));
    assert!(map.contains("hole,zero") && map.contains("data"), "the zero tail is a hole: {map}");
    // The served image cleaned through the server: every segment moved,
    // the volume stored in its cold form, and the same bytes read back.
    let vol = |d: &Dir| -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&ok(Command::new(ZLOGFS).args(["stats", &d.s("img"), "--json"])))
                .expect("json");
        v["volumes"][0].clone()
    };
    let before = vol(&d);
    assert_eq!(before["cold"], "256K zstd:9", "{before:#}");
    let rep: serde_json::Value = serde_json::from_str(&ok(Command::new(ZLOGFS).args([
        "clean",
        &d.s("img"),
        "--max-live",
        "1",
        "--json",
    ])))
    .expect("json");
    assert!(rep["chunks"].as_u64().is_some_and(|c| c > 0) && rep["stopped"].is_null(), "{rep:#}");
    let after = vol(&d);
    let physical = |v: &serde_json::Value| v["physical"].as_u64().expect("physical");
    assert!(physical(&after) < physical(&before), "{before:#} then {after:#}");
    ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &d.s("in.raw"), &u]));
    // fio's nbd engine, 4 jobs, verified.
    ok(Command::new("fio").args([
        "--name=v",
        "--ioengine=nbd",
        &format!("--uri={u}"),
        "--rw=randwrite",
        "--bs=4k",
        "--numjobs=4",
        "--iodepth=8",
        "--size=8M",
        "--offset_increment=8M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--group_reporting",
        "--verify_state_save=0",
    ]));
    drop(server);
    let fsck = ok(Command::new(ZLOGFS).args(["fsck", &d.s("img")]));
    assert!(fsck.contains("clean"), "{fsck}");
    // The volume is a file of the image, with what fio left in it.
    let stat = ok(Command::new(ZLOGFS).args(["stat", &d.s("img"), "/vm/disk.raw", "--json"]));
    assert!(stat.contains("67108864"), "{stat}");
}

/// Bytes no client sends: the server says so or hangs up, and serves the
/// next client.
#[test]
fn malformed_negotiation_is_refused_and_the_server_goes_on() {
    if !clients() {
        return;
    }
    let d = Dir::new("malformed");
    ok(Command::new(ZLOGFS).args(["mkfs", &d.s("img"), "--size", "64M"]));
    let server = serve(&d, &["--create", "disk:1M"]);
    let mode = std::os::unix::fs::MetadataExt::mode(&fs::metadata(d.p("sock")).expect("socket"));
    assert_eq!(mode & 0o777, 0o600, "only the server's user reaches the volumes");
    let talk = |bytes: &[u8]| -> Vec<u8> {
        let mut s = UnixStream::connect(d.p("sock")).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).expect("hello");
        assert_eq!(&hello[..8], b"NBDMAGIC");
        s.write_all(bytes).expect("send");
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    };
    // Not fixed newstyle: hung up on.
    assert!(talk(&[0, 0, 0, 0]).is_empty());
    // A bad option magic: hung up on.
    let mut bad = 3u32.to_be_bytes().to_vec();
    bad.extend_from_slice(&[0xee; 16]);
    assert!(talk(&bad).is_empty());
    // An unknown option: ERR_UNSUP, then ABORT is acknowledged.
    let mut v = 3u32.to_be_bytes().to_vec();
    for (opt, data) in [(77u32, &b"xyz"[..]), (2, &b""[..])] {
        v.extend_from_slice(b"IHAVEOPT");
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
    }
    let out = talk(&v);
    assert!(out.len() >= 40, "{out:?}");
    assert_eq!(u32::from_be_bytes(out[12..16].try_into().expect("4")), (1 << 31) + 1, "ERR_UNSUP");
    let info = ok(Command::new("nbdinfo").arg(uri(&d, "disk")));
    assert!(info.contains("export-size: 1048576"), "{info}");
    // An export that does not exist: a clear refusal.
    let o = Command::new("nbdinfo").arg(uri(&d, "nope")).output().expect("nbdinfo");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nope") && err.contains("No such file"), "{err}");
    // A socket file removed behind the server's back (a /tmp cleaner)
    // does not keep it from stopping on SIGTERM.
    fs::remove_file(d.p("sock")).expect("remove the socket");
    drop(server);
}

/// A mounted image serves its files over NBD from its daemon: a volume
/// written through NBD reads the same through the mount.
#[test]
fn a_mount_serves_its_files_over_nbd() {
    if !clients() || !Path::new("/dev/fuse").exists() {
        return;
    }
    let d = Dir::new("mount");
    ok(Command::new(ZLOGFS).args(["mkfs", &d.s("img"), "--size", "256M"]));
    fs::create_dir_all(d.p("mnt")).expect("mkdir");
    let child = Command::new(ZLOGFS)
        .args(["mount", "-f", &d.s("img"), &d.s("mnt"), "-o", &format!("nbd={}", d.s("sock"))])
        .stdin(Stdio::null())
        .spawn()
        .expect("mount");
    // Unmounted even when an assertion fails (the daemon holds the test's
    // output open, and cargo would wait for it).
    let mut mount = Mounted(Some(child), d.p("mnt"));
    // The socket is bound before the kernel mount is made: wait for
    // both, or the file below lands in the bare directory.
    wait_for("the NBD socket", || UnixStream::connect(d.p("sock")).is_ok());
    wait_for("the mount", || is_mounted(&d.p("mnt")));
    let vol = fs::File::create(d.p("mnt/vol")).expect("create");
    vol.set_len(16 << 20).expect("size");
    vol.sync_all().expect("fsync");
    drop(vol);
    // Read through the mount first: its pages are in the kernel's cache
    // (kept across opens), which NBD's writes must drop.
    assert!(fs::read(d.p("mnt/vol")).expect("read through the mount").iter().all(|&b| b == 0));
    let data = real_data(16 << 20);
    fs::write(d.p("in.raw"), &data).expect("write");
    ok(Command::new("nbdcopy").args([&d.s("in.raw"), &uri(&d, "vol")]));
    assert!(fs::read(d.p("mnt/vol")).expect("read through the mount") == data, "the mount sees NBD's writes");
    let child = mount.0.take().expect("mounted");
    assert!(mount.unmount(child).success());
    assert!(!d.p("sock").exists(), "the socket goes with the mount");
}

/// A `zlogfs mount -f` child, unmounted when dropped.
struct Mounted(Option<Child>, PathBuf);

impl Mounted {
    fn unmount(&self, mut c: Child) -> std::process::ExitStatus {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.1).status();
        c.wait().expect("wait for the mount")
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            self.unmount(c);
        }
    }
}

/// kill -9 of the server while a client writes: every write covered by
/// an acknowledged FLUSH or FUA is there after a restart, and the image
/// is clean.
#[test]
fn flushed_writes_survive_a_kill_of_the_server() {
    use std::io::BufRead;
    if !clients() {
        return;
    }
    let d = Dir::new("kill");
    ok(Command::new(ZLOGFS).args(["mkfs", &d.s("img"), "--size", "256M"]));
    let mut server = serve(&d, &["--create", "vol:16M"]);
    let u = uri(&d, "vol");
    let seed = common::seed("nbd kill");
    let mut writer = Command::new("/usr/bin/python3")
        .args(["tests/nbd/crash.py", "write", &u, &seed.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("writer");
    let mut flushed = 0u64;
    let lines = std::io::BufReader::new(writer.stdout.take().expect("stdout")).lines();
    for l in lines {
        let l = l.expect("line");
        flushed = l.trim_start_matches("flushed ").parse().expect("a count");
        if flushed >= 600 {
            break;
        }
    }
    let mut child = server.0.take().expect("server");
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    let _ = writer.wait();
    let fsck = ok(Command::new(ZLOGFS).args(["fsck", &d.s("img")]));
    assert!(fsck.contains("clean"), "{fsck}");
    let _server = serve(&d, &[]);
    let out = ok(Command::new("/usr/bin/python3").args([
        "tests/nbd/crash.py",
        "verify",
        &u,
        &seed.to_string(),
        &flushed.to_string(),
    ]));
    assert!(out.starts_with("ok"), "{out}");
}

/// A volume served as it was at a snapshot (`-o ro,snapshot=NAME`, or
/// `-o ro,at=TIME`): its blocks as then, after the present overwrote
/// them, and read-only.
#[test]
fn a_volume_is_served_as_it_was_at_a_snapshot() {
    if !clients() {
        return;
    }
    let d = Dir::new("snapshot");
    // No automatic points: at= then names the snapshot, the newest point.
    ok(Command::new(ZLOGFS).args(["mkfs", &d.s("img"), "--size", "256M", "--history", "none"]));
    let then = real_data(4 << 20);
    fs::write(d.p("then"), &then).expect("write");
    fs::write(d.p("now"), real_data(6 << 20).split_off(2 << 20)).expect("write");
    let u = uri(&d, "vol");
    {
        let _s = serve(&d, &["--create", "vol:4M"]);
        ok(Command::new("nbdcopy").args([&d.s("then"), &u]));
    }
    ok(Command::new(ZLOGFS).args(["snapshot", "create", &d.s("img"), "before"]));
    {
        let _s = serve(&d, &[]);
        ok(Command::new("nbdcopy").args([&d.s("now"), &u]));
    }
    for opts in ["ro,snapshot=before", "ro,at=2100-01-01"] {
        let _s = serve(&d, &["-o", opts]);
        let info = ok(Command::new("nbdinfo").args(["--json", &u]));
        assert!(info.contains("\"is_read_only\": true"), "{opts}: {info}");
        let out = d.p("out");
        let _ = fs::remove_file(&out);
        ok(Command::new("nbdcopy").args([&u, out.to_str().expect("utf8")]));
        assert!(fs::read(&out).expect("read") == then, "{opts}: the volume as it was");
    }
    let _s = serve(&d, &[]);
    let out = d.p("out");
    let _ = fs::remove_file(&out);
    ok(Command::new("nbdcopy").args([&u, out.to_str().expect("utf8")]));
    assert!(fs::read(&out).expect("read") == fs::read(d.p("now")).expect("read"), "the present");
}
