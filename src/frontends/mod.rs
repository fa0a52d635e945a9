//! Front ends: they translate requests into calls of [`crate::fs::Fs`] and
//! hold no file system logic of their own.
//!
//! - [`fuse`]: the kernel mount through FUSE.
//!
//! The command-line tool (`src/bin/zlogfs.rs`, with [`crate::tools`]) is
//! the third front end.

pub mod dirlist;
pub mod fuse;
