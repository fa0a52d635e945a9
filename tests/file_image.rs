//! The engine on a real image file: data survives close and reopen, a
//! second opener is refused, and the CLI creates and inspects images.

use std::process::Command;
use std::sync::Arc;

use zlogfs::engine::{BlockWrite, Room};
use zlogfs::store::{FileStore, Geometry, Store};
use zlogfs::{engine, Engine, Options, WriteBatch};

/// The tests here run one at a time: a child process spawned by one (the
/// CLI test) inherits, between fork and exec, every descriptor the other has
/// open, and with it the image's flock for a moment.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("zlogfs-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn open(path: &std::path::Path) -> zlogfs::Result<Engine> {
    let f = FileStore::open(path).map_err(|e| zlogfs::Error::io("open", e))?;
    let sb = engine::read_superblock(&f)?;
    let f = f.with_geometry(sb.geometry).map_err(|e| zlogfs::Error::io("geometry", e))?;
    Engine::open(Arc::new(f), Options::default())
}

#[test]
fn file_image_round_trip_and_lock() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = tmpdir("roundtrip");
    let img = d.join("a.img");
    let g = Geometry { segment_size: 1 << 20, segment_count: 32 };
    let s: Arc<dyn Store> = Arc::new(FileStore::create(&img, g).unwrap());
    engine::mkfs(s).unwrap();
    let e = open(&img).unwrap();
    // A second opener is refused while the first holds the image.
    let err = FileStore::open(&img).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    for i in 0..5000u32 {
        let mut b = WriteBatch::new();
        b.put(i.to_be_bytes().to_vec(), format!("value-{i}").repeat(3));
        e.write(&b).unwrap();
    }
    e.flush().unwrap();
    let mut b = WriteBatch::new();
    b.put(b"tail".to_vec(), b"in the journal".to_vec());
    e.write_sync(&b).unwrap();
    let spec = "zstd:3".parse().unwrap();
    let q = vec![b'q'; 65536];
    let writes = vec![BlockWrite::new(7, spec, &q), BlockWrite::new(7, spec, b"tiny")];
    let blocks = e.write_blocks(Room::User, writes).unwrap();
    e.sync().unwrap();
    drop(e);
    let e = open(&img).unwrap();
    assert_eq!(e.get(&1234u32.to_be_bytes()).unwrap(), Some("value-1234".repeat(3).into_bytes()));
    assert_eq!(e.get(b"tail").unwrap(), Some(b"in the journal".to_vec()));
    assert_eq!(e.read_block(blocks[0]).unwrap(), vec![b'q'; 65536]);
    assert_eq!(e.read_block(blocks[1]).unwrap(), b"tiny".to_vec());
    assert!(blocks[0].len < 1000, "64 KiB of one byte must compress: {:?}", blocks[0]);
    e.close().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn cli_mkfs_and_stats() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = tmpdir("cli");
    let img = d.join("b.img");
    let bin = env!("CARGO_BIN_EXE_zlogfs");
    let out = Command::new(bin).args(["mkfs", img.to_str().unwrap(), "--size", "64M"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(bin).args(["mkfs", img.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let out = Command::new(bin).args(["stats", img.to_str().unwrap(), "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format_version"], 1);
    // 64 MiB less the metadata area, in 1 MiB segments (the default below 1 GiB).
    assert_eq!(v["segments"], 63);
    // clean: on an image it reports as JSON; a directory that is not a
    // zlogfs mount point is refused (and gets no xattr).
    let out = Command::new(bin).args(["clean", img.to_str().unwrap(), "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["freed"].is_u64() && v["skipped"].is_array(), "{v}");
    let out = Command::new(bin).args(["clean", d.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a zlogfs mount point"));
    assert!(xattr::get(&d, "user.zlogfs.clean").unwrap_or(None).is_none());
    // Not an image.
    let junk = d.join("junk");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let out = Command::new(bin).args(["stats", junk.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a zlogfs image"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// A command run while another process is letting go of the image (as
/// the daemon is right after `fusermount3 -u` returns) waits for it and
/// succeeds; one that holds on gets "in use" after a few seconds.
#[test]
fn cli_waits_for_an_image_being_closed() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = tmpdir("wait");
    let img = d.join("a.img");
    let bin = env!("CARGO_BIN_EXE_zlogfs");
    let out = Command::new(bin).args(["mkfs", img.to_str().unwrap(), "--size", "64M"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let held = FileStore::open(&img).unwrap();
    let child = Command::new(bin)
        .args(["fsck", img.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(held);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fsck after the holder closed: {err}");
    assert!(err.contains("waiting for the process"), "{err}");
    let _held = FileStore::open(&img).unwrap();
    let out = Command::new(bin).args(["fsck", img.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another process"));
    std::fs::remove_dir_all(&d).unwrap();
}
