//! The control channel of a mounted image: how the admin commands
//! (`stats`, `du`, `fsck`, `scrub`, `clean`, `sync`, and the `metrics`
//! of `stats --latency`) reach the daemon that has the
//! image open (the image is locked while it is mounted, so they cannot
//! open it themselves).
//!
//! - **Where:** a Unix socket per mount, its name derived from the mount
//!   point ([`socket_path`]), in a directory only its owner can enter:
//!   `/run/zlogfs/` for root's mounts, `/run/user/UID/zlogfs/` for a
//!   user's when the system made that user a runtime directory, else
//!   `/tmp/zlogfs-UID/` (created 0700, refused if anyone else owns it).
//!   The daemon and every command derive the same path from the mount
//!   point and its owner (FUSE's `user_id=` in /proc/self/mountinfo).
//! - **Who:** the daemon answers its owner and root only (the peer's
//!   credentials, `SO_PEERCRED`); anyone else gets an error and is hung up
//!   on.
//! - **What:** JSON, a request per line, versioned
//!   (docs/CONTROL.md gives every request and answer). A request is an
//!   object `{"v": 1, "op": NAME, ...}`; the answer is zero or more
//!   progress lines `{"v": 1, "progress": {...}}` and then one line
//!   `{"v": 1, "ok": true, "result": ...}` or `{"v": 1, "ok": false,
//!   "error": MESSAGE}`. Malformed requests get an error answer; the
//!   daemon goes on serving.
//!
//! The protocol is small and line-based, so it is written here rather
//! than taken from an RPC crate: what it needs beyond serde_json is a
//! socket and a line reader, and its framing is what docs/CONTROL.md
//! states.

mod client;
mod ops;
mod server;

use std::path::{Path, PathBuf};

pub use client::request;
pub use ops::{handler, Info};
pub use server::{accept_or_stop, remove_stale_socket, Handler, Server};

/// The protocol version this build speaks.
pub const VERSION: u64 = 1;

/// The longest request line taken (bytes, newline included).
pub const MAX_REQUEST: usize = 64 << 10;

/// The directory of the control sockets of `uid`'s mounts.
pub fn socket_dir(uid: u32) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return PathBuf::from("/run/zlogfs");
    }
    let runtime = PathBuf::from(format!("/run/user/{uid}"));
    match std::fs::metadata(&runtime) {
        Ok(m) if m.is_dir() && m.uid() == uid => runtime.join("zlogfs"),
        _ => PathBuf::from(format!("/tmp/zlogfs-{uid}")),
    }
}

/// The control socket of the mount at `mountpoint` (canonical) owned by
/// `uid`, where its daemon makes it.
pub fn socket_path(mountpoint: &Path, uid: u32) -> PathBuf {
    socket_dir(uid).join(socket_name(mountpoint))
}

/// Where a command looks for the control socket of the mount at
/// `mountpoint` owned by `uid`: where the daemon would make it now, or,
/// for a user whose runtime directory appeared after the mount, in the
/// fallback directory.
pub fn find_socket(mountpoint: &Path, uid: u32) -> PathBuf {
    let p = socket_path(mountpoint, uid);
    let fallback = PathBuf::from(format!("/tmp/zlogfs-{uid}")).join(socket_name(mountpoint));
    if uid != 0 && !p.exists() && fallback.exists() {
        fallback
    } else {
        p
    }
}

/// The socket's file name: FNV-1a of the mount point, a name of fixed
/// length for any path (the daemon's hello says which one it serves).
fn socket_name(mountpoint: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in mountpoint.as_os_str().as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_differ_by_mount_point_and_owner() {
        let a = socket_path(Path::new("/mnt/a"), 0);
        assert_eq!(a.parent(), Some(Path::new("/run/zlogfs")));
        assert_ne!(a, socket_path(Path::new("/mnt/b"), 0));
        assert_ne!(socket_path(Path::new("/mnt/a"), 1000), a);
        assert_eq!(a, socket_path(Path::new("/mnt/a"), 0), "the same mount, the same name");
    }
}
