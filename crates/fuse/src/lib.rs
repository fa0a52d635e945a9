//! The FUSE mount: a thin adapter from kernel requests to [`Fs`](zlogfs_fs::Fs) calls.
//!
//! The protocol is spoken here, not through a binding crate
//! (docs/decisions/2026-11-25-own-fuse-protocol.md says why): [`abi`] parses requests and encodes
//! replies, and two transports carry them:
//! - [`ring`]: FUSE over io_uring (Linux 6.14+, the fuse module's
//!   `enable_uring`), one queue per CPU, each served by a thread pinned to
//!   that CPU, so that a request and its reply never wake a thread on
//!   another CPU;
//! - [`dev`]: read(2) and writev(2) on `/dev/fuse`, one thread reading
//!   every request. It always runs: without io_uring it carries every
//!   request, with it the few the kernel still sends this way.
//!
//! Either way the thread that takes a request serves it at once unless it
//! may take long (fsync, fallocate, copy_file_range, reads and writes of
//! [`adapter::LARGE_IO`] bytes or more): those go to [`serve::Workers`], so that one that
//! blocks on the device or on a commit holds up nothing else.
//!
//! The files, by job: [`options`] (a mount's options), [`session`]
//! (mounting, the handshake, the choice of transport, serving until
//! unmounted), [`serve`] (a request's [`Reply`], the handler it goes to,
//! the workers), [`adapter`] (the requests as [`Fs`](zlogfs_fs::Fs) calls), [`past`]
//! (the `.snapshots` directory), [`dirlist`] (directory listings),
//! [`kmount`] (the kernel mount).
//!
//! What the adapter decides, and nothing else:
//! - permission checks are the kernel's (`default_permissions` is always
//!   on): the file system layer keeps modes and owners, the kernel's VFS
//!   enforces them, including the sticky bit and the suid/sgid clearing on
//!   chown and write;
//! - owners of new entries come from the request's credentials, with the
//!   group of a set-group-ID directory inherited (and its S_ISGID bit by
//!   subdirectories), as ext4 does;
//! - directory offsets: a hash of the entry's name, directories listed in
//!   hash order ([`crate::dirlist`]), so that no state is kept per open
//!   directory and the kernel need not send OPENDIR and RELEASEDIR;
//! - errors: the file system's typed [`Error`](zlogfs_fs::Error) is
//!   answered with its errno, decided once in the file system layer
//!   ([`zlogfs_fs::errno()`]); anything that is not a refused operation (an
//!   I/O failure, damage) is also logged.

mod abi;
mod adapter;
mod dev;
mod dirlist;
mod kmount;
mod options;
mod past;
mod ring;
mod serve;
mod session;

pub use adapter::ZlogFuse;
pub use kmount::{MountFlags, Unmounter};
pub use options::{MountOptions, Uring};
pub use past::Snapdir;
pub use serve::Reply;
pub use session::{mount, uring_off_in_kernel, Session};
