//! The CLI creates and inspects image files, and waits for an image being
//! closed (the engine on an image file: crates/engine/tests/file_store.rs).

use std::process::Command;

use zlogfs_engine::store::FileStore;

/// The tests here run one at a time: a child process spawned by one (the
/// CLI test) inherits, between fork and exec, every descriptor the other has
/// open, and with it the image's flock for a moment.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("zlogfs-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
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
