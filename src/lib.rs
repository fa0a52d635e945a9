//! zlogfs: a log-structured file system with transparent, on-line
//! compression.
//!
//! Layers, each a module with one job, imports pointing down only:
//! - [`frontends`]: the FUSE mount (the command-line tool is the other);
//! - [`fs`]: the POSIX file system layer over the engine;
//! - [`engine`]: the storage engine (log + index + recovery), the API the
//!   file system layer builds on;
//! - [`index`]: the LSM tree of (key, sequence number, value);
//! - [`log`]: segments, batches, summaries, checkpoints, roll-forward;
//! - [`codec`]: compression algorithms behind one trait;
//! - [`store`]: where segments live (file, memory, fault injection).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod bytes;
pub mod codec;
pub mod engine;
pub mod error;
pub mod frontends;
pub mod fs;
pub mod index;
pub mod log;
pub mod store;
pub mod tools;

pub use engine::{mkfs, Engine, Op, Options, Snapshot, WriteBatch};
pub use error::{Error, Result};
