//! The zlogfs storage engine: a log of compressed, checksummed segments
//! holding data blocks and an LSM index, with checkpoints, roll-forward
//! recovery and a cleaner's half. The file system (`zlogfs-fs`) and every
//! front end are built on it; nothing here knows of files or of POSIX.
//!
//! Modules, imports pointing down only:
//! - [`engine`]: the API the file system layer builds on (log + index +
//!   recovery);
//! - [`index`]: the LSM tree of (key, sequence number, value);
//! - [`log`]: segments, batches, summaries, checkpoints, roll-forward;
//! - [`codec`]: compression algorithms behind one trait;
//! - [`store`]: where segments live (file, memory; with the `testing`
//!   feature, fault injection).

pub mod bytes;
pub mod codec;
pub mod engine;
pub mod error;
// The index's encodings are the engine's own; the fuzz targets and the
// benchmarks of the block encodings see them with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
pub mod index;
#[cfg(not(feature = "fuzzing"))]
pub(crate) mod index;
// The log's formats likewise: the layers above see the names below.
#[cfg(feature = "fuzzing")]
pub mod log;
#[cfg(not(feature = "fuzzing"))]
pub(crate) mod log;
pub mod metrics;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use engine::{mkfs, Engine, Op, Options, ReadPin, Snapshot, WriteBatch};
pub use error::{Error, Result};
pub use index::{MAX_KEY, MAX_VALUE};
pub use log::format::{validate_geometry, BlockAddr, BlockKind, Role, DEFAULT_SEGMENT_SIZE};
pub use log::{max_block_raw, SegUsage, Tier};
