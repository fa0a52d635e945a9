//! A mount's options.

use std::time::Duration;

use crate::kmount::MountFlags;
use crate::past::Snapdir;

/// Whether requests come through io_uring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uring {
    /// When the kernel offers it (the fuse module's `enable_uring` is on).
    Auto,
    /// Always; as root, turn the module's `enable_uring` on if it is off.
    /// The mount fails if the kernel has no FUSE over io_uring.
    On,
    /// Never: every request through `/dev/fuse`.
    Off,
}

/// Options of a mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Mount read-only (the kernel refuses every change with EROFS).
    pub read_only: bool,
    /// The generic flags of mount(2): nosuid, nodev, noexec, sync,
    /// dirsync, nosymfollow, the atime flags.
    pub flags: MountFlags,
    /// Let users other than the mounter use the mount.
    pub allow_other: bool,
    /// How long the kernel may cache attributes.
    pub attr_timeout: Duration,
    /// How long the kernel may cache names.
    pub entry_timeout: Duration,
    /// How long the kernel may cache "no such name" (0: not at all).
    pub negative_timeout: Duration,
    /// Threads serving the requests that may take long (the quick ones
    /// are served by the thread that takes them from the kernel).
    pub threads: usize,
    /// The source shown in /proc/mounts (the image path).
    pub fsname: String,
    /// Whether to use FUSE over io_uring.
    pub uring: Uring,
    /// How long the `/dev/fuse` reader looks for the next request before
    /// it sleeps, during a burst of requests (zero: never).
    pub spin: Duration,
    /// The `.snapshots` directory in the root (`-o snapdir=`).
    pub snapdir: Snapdir,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            flags: MountFlags::default(),
            allow_other: false,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            threads: 4,
            fsname: "zlogfs".into(),
            uring: Uring::Auto,
            spin: SPIN,
            snapdir: Snapdir::Hidden,
        }
    }
}

/// How long the `/dev/fuse` reader looks for the next request before it
/// sleeps, while requests come in a burst (see [`crate::dev::serve`]).
pub(crate) const SPIN: Duration = Duration::from_micros(200);
