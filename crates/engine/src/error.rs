//! Error classes of the engine. Callers branch on the variant: an I/O failure
//! (the device said no), corruption (bytes on disk are not what was written),
//! bad input, out of space, or the latched failed state after an I/O error.

use std::io;

/// Result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device failed an operation. The engine latches into
    /// [`Error::Failed`] after a failed write or sync.
    #[error("I/O error while {op}: {source}")]
    Io {
        /// What the engine was doing ("writing segment 3 at 4096").
        op: String,
        /// The device's error.
        #[source]
        source: io::Error,
    },
    /// A checksum did not match: the structure named by `what` is damaged.
    #[error("checksum mismatch in {what}: stored {expected:#010x}, computed {got:#010x}")]
    ChecksumMismatch {
        /// The damaged structure and where it is.
        what: String,
        /// The checksum stored on disk.
        expected: u32,
        /// The checksum of the bytes read.
        got: u32,
    },
    /// A structure passed its checksum (or has none) but does not decode.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// The damaged structure and where it is.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The image is not a zlogfs image at all.
    #[error("not a zlogfs image: {0}")]
    NotAnImage(String),
    /// The image was written by a format this build does not understand.
    #[error("unsupported image format: {0}")]
    Unsupported(String),
    /// Out of physical space on the device.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// A caller passed something invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A previous write or sync failed; nothing more is written until the
    /// image is reopened (which recovers to the last durable state).
    #[error("a previous I/O error left the engine in a failed state: reopen required")]
    Failed,
    /// A read asked for a sequence number whose versions were merged away.
    #[error("sequence number {requested} is older than the oldest retained version ({horizon})")]
    SnapshotTooOld {
        /// The sequence number asked for.
        requested: u64,
        /// The oldest sequence number still readable.
        horizon: u64,
    },
}

impl Error {
    /// An I/O error while doing `op`.
    pub fn io(op: impl Into<String>, source: io::Error) -> Self {
        Error::Io { op: op.into(), source }
    }

    /// A decode failure of `what`.
    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Corrupt { what: what.into(), detail: detail.into() }
    }

    /// True for damage found on disk (checksum or decode failures).
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::ChecksumMismatch { .. } | Error::Corrupt { .. })
    }
}
