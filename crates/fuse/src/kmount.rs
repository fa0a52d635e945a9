//! Making and ending the kernel mount.
//!
//! As root, zlogfs calls mount(2) itself, with type `fuse.zlogfs` and the
//! image path as the source, so that /proc/mounts names both and
//! `mount -o remount,ro` reaches the `mount.fuse.zlogfs` helper. Other
//! users mount through the set-user-ID `fusermount3`, which opens
//! `/dev/fuse`, mounts, and passes the descriptor back over a socket
//! (`_FUSE_COMMFD`, libfuse's protocol).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::{MntFlags, MsFlags};
use nix::sys::socket::{self, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};

use super::MountOptions;

/// A generic mount option of mount(8): the `MS_*` flag it sets or clears,
/// and whether fusermount3 (3.14, Debian 12's) takes it.
struct Generic {
    name: &'static str,
    flag: libc::c_ulong,
    set: bool,
    fusermount: bool,
}

const fn g(name: &'static str, flag: libc::c_ulong, set: bool, fusermount: bool) -> Generic {
    Generic { name, flag, set, fusermount }
}

/// Every generic option that means a flag of mount(2). `ro`/`rw` are
/// [`MountOptions::read_only`]. The atime options are also the file
/// system's own policy (the kernel leaves atime to a FUSE server); a user
/// mount through a fusermount3 that does not know them still applies
/// that policy, so they are not passed to it. `nosymfollow` is: a
/// fusermount3 that does not know it refuses the mount, which is better
/// than a mount that follows symlinks when told not to.
const GENERIC: &[Generic] = &[
    g("nosuid", libc::MS_NOSUID, true, true),
    g("suid", libc::MS_NOSUID, false, true),
    g("nodev", libc::MS_NODEV, true, true),
    g("dev", libc::MS_NODEV, false, true),
    g("noexec", libc::MS_NOEXEC, true, true),
    g("exec", libc::MS_NOEXEC, false, true),
    g("sync", libc::MS_SYNCHRONOUS, true, true),
    g("async", libc::MS_SYNCHRONOUS, false, true),
    g("dirsync", libc::MS_DIRSYNC, true, true),
    g("noatime", libc::MS_NOATIME, true, true),
    g("atime", libc::MS_NOATIME, false, true),
    g("nodiratime", libc::MS_NODIRATIME, true, false),
    g("diratime", libc::MS_NODIRATIME, false, false),
    g("relatime", libc::MS_RELATIME, true, false),
    g("norelatime", libc::MS_RELATIME, false, false),
    g("strictatime", libc::MS_STRICTATIME, true, false),
    g("nostrictatime", libc::MS_STRICTATIME, false, false),
    g("lazytime", libc::MS_LAZYTIME, true, false),
    g("nolazytime", libc::MS_LAZYTIME, false, false),
    g("nosymfollow", libc::MS_NOSYMFOLLOW, true, true),
    g("symfollow", libc::MS_NOSYMFOLLOW, false, false),
    g("silent", libc::MS_SILENT, true, false),
    g("loud", libc::MS_SILENT, false, false),
];

/// The generic flags of a mount (`MS_*` bits of mount(2)), as the
/// options that set and clear them leave them, in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountFlags(pub libc::c_ulong);

impl MountFlags {
    /// Apply generic option `name`; false if it is not one.
    pub fn apply(&mut self, name: &str) -> bool {
        let Some(o) = GENERIC.iter().find(|o| o.name == name) else { return false };
        if o.set {
            self.0 |= o.flag;
        } else {
            self.0 &= !o.flag;
        }
        true
    }

    /// Whether `flag` (an `MS_*` bit) is set.
    pub fn has(&self, flag: libc::c_ulong) -> bool {
        self.0 & flag != 0
    }

    /// The options that give these flags to fusermount3.
    fn fusermount_options(&self) -> Vec<&'static str> {
        GENERIC.iter().filter(|o| o.set && o.fusermount && self.has(o.flag)).map(|o| o.name).collect()
    }
}

fn cstring(what: &str, b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} contains NUL")))
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Mount a FUSE file system on `dir`; the open `/dev/fuse` of the mount.
pub fn mount(dir: &Path, opts: &MountOptions) -> io::Result<(File, Unmounter)> {
    if is_root() {
        mount_direct(dir, opts)
    } else {
        mount_fusermount(dir, opts)
    }
}

fn mount_direct(dir: &Path, opts: &MountOptions) -> io::Result<(File, Unmounter)> {
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let mut data = format!("fd={},rootmode=40000,user_id=0,group_id=0,default_permissions", dev.as_raw_fd());
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let source = cstring("image path", opts.fsname.as_bytes())?;
    let target = cstring("mount point", dir.as_os_str().as_bytes())?;
    // No MS_NOSUID or MS_NODEV unless asked: root mounts behave as a disk
    // file system. The atime flags only show in /proc/mounts: atime is
    // the file system's own policy (the kernel leaves it to FUSE servers).
    let mut flags = MsFlags::from_bits_retain(opts.flags.0);
    if opts.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    nix::mount::mount(
        Some(source.as_c_str()),
        target.as_c_str(),
        Some("fuse.zlogfs"),
        flags,
        Some(data.as_str()),
    )?;
    Ok((dev, Unmounter::Direct(target)))
}

fn mount_fusermount(dir: &Path, opts: &MountOptions) -> io::Result<(File, Unmounter)> {
    let (ours, theirs) =
        socket::socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    // fusermount3 inherits its end: a copy without close-on-exec.
    let theirs_inherited = nix::unistd::dup(&theirs)?;
    drop(theirs);
    let mut o = format!(
        "fsname={},subtype=zlogfs,default_permissions,{}",
        opts.fsname.replace(',', "\\,"),
        if opts.read_only { "ro" } else { "rw" }
    );
    if opts.allow_other {
        o.push_str(",allow_other");
    }
    for f in opts.flags.fusermount_options() {
        o.push(',');
        o.push_str(f);
    }
    let out = Command::new("fusermount3")
        .arg("-o")
        .arg(&o)
        .arg("--")
        .arg(dir)
        .env("_FUSE_COMMFD", theirs_inherited.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("cannot run fusermount3: {e} (apt-get install fuse3)"))
        })?;
    drop(theirs_inherited);
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let hint = if msg.contains("unknown option") {
            " (this fusermount3 does not know an option given; mount as root to pass it with mount(2))"
        } else {
            ""
        };
        return Err(io::Error::other(format!(
            "fusermount3 failed ({}){}{hint}",
            out.status,
            if msg.is_empty() { String::new() } else { format!(": {msg}") }
        )));
    }
    let fd = receive_fd(&ours)?;
    Ok((File::from(fd), Unmounter::Fusermount(dir.to_path_buf())))
}

/// The descriptor fusermount3 sends over `sock` (SCM_RIGHTS).
fn receive_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg =
        socket::recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: SCM_RIGHTS just installed `fd` in this process;
                // nothing else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(io::Error::other("fusermount3 mounted but sent no /dev/fuse descriptor"))
}

/// Ends a mount from another thread (a signal handler's).
pub enum Unmounter {
    /// Mounted by this process with mount(2): umount2.
    Direct(CString),
    /// Mounted through fusermount3.
    Fusermount(PathBuf),
}

impl Unmounter {
    /// Unmount; the session's loop then ends.
    pub fn unmount(&mut self) -> io::Result<()> {
        match self {
            Unmounter::Direct(dir) => {
                // A plain unmount; when files are still open, a lazy one
                // (the session ends when the last of them is closed).
                for flags in [MntFlags::empty(), MntFlags::MNT_DETACH] {
                    match nix::mount::umount2(dir.as_c_str(), flags) {
                        Ok(()) => return Ok(()),
                        Err(nix::errno::Errno::EBUSY) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            }
            Unmounter::Fusermount(dir) => {
                let st = Command::new("fusermount3")
                    .args(["-u", "-q", "-z", "--"])
                    .arg(&*dir)
                    .stdin(Stdio::null())
                    .status()?;
                if st.success() {
                    Ok(())
                } else {
                    Err(io::Error::other(format!("fusermount3 -u {} failed ({st})", dir.display())))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_options_set_and_clear_their_flags_in_order() {
        let mut f = MountFlags::default();
        for o in ["nosuid", "nodev", "noexec", "dirsync", "nosymfollow", "relatime", "exec"] {
            assert!(f.apply(o), "{o}");
        }
        assert!(!f.apply("bogus") && !f.apply("ro"));
        assert!(f.has(libc::MS_NOSUID) && f.has(libc::MS_NODEV) && !f.has(libc::MS_NOEXEC));
        assert_eq!(
            f.0,
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_DIRSYNC | libc::MS_NOSYMFOLLOW | libc::MS_RELATIME
        );
        // relatime is not passed to fusermount3 (3.14 refuses it); the rest is.
        assert_eq!(f.fusermount_options(), ["nosuid", "nodev", "dirsync", "nosymfollow"]);
    }
}
