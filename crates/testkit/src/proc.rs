//! Helpers of the tests that run programs (the zlogfs binary, FUSE
//! mounts, NBD clients).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A fresh, empty directory under the temporary directory, named after
/// `prefix`, `name` and this process.
pub fn fresh_dir(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zlogfs-{prefix}-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).expect("mkdir");
    d
}

/// Run `c`; its standard output, or a failure that shows both outputs.
pub fn run_ok(c: &mut Command) -> String {
    let o = c.output().expect("run");
    assert!(
        o.status.success(),
        "{c:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Wait up to 30 s for `f` to hold.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `dir` is a mount point now (a line of /proc/self/mounts).
pub fn is_mounted(dir: &Path) -> bool {
    let dir = fs::canonicalize(dir).unwrap_or(dir.to_path_buf());
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap_or("")))
}
