//! Errors of the file system layer: what went wrong, as a kind callers can
//! branch on, with a message that names the operation and its arguments.
//!
//! The kinds are POSIX's, and each has its errno, decided once in
//! [`crate::errno`](crate::errno()): the FUSE mount answers with it, NBD
//! narrows it to its protocol's codes. Failures of the engine underneath
//! (I/O, damage, a latched engine) are carried as they are, in
//! [`Error::Engine`].

use zlogfs_engine::error::Error as EngineError;

/// Result with the file system's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything an operation of the file system can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such file, directory, inode or name (ENOENT).
    #[error("{0}")]
    NotFound(String),
    /// The name exists already (EEXIST).
    #[error("{0}")]
    Exists(String),
    /// A directory to remove or replace has entries (ENOTEMPTY).
    #[error("{0}")]
    NotEmpty(String),
    /// A directory was needed (ENOTDIR).
    #[error("{0}")]
    NotDir(String),
    /// Something other than a directory was needed (EISDIR).
    #[error("{0}")]
    IsDir(String),
    /// A name longer than 255 bytes (ENAMETOOLONG).
    #[error("{0}")]
    NameTooLong(String),
    /// An argument the operation cannot take (EINVAL).
    #[error("{0}")]
    Invalid(String),
    /// A size or offset past the largest file (EFBIG).
    #[error("{0}")]
    FileTooBig(String),
    /// A link count at its limit (EMLINK).
    #[error("{0}")]
    TooManyLinks(String),
    /// No extended attribute of that name (ENODATA).
    #[error("{0}")]
    NoAttr(String),
    /// An extended attribute name out of the allowed length (ERANGE).
    #[error("{0}")]
    OutOfRange(String),
    /// An extended attribute value too large to store (E2BIG).
    #[error("{0}")]
    ValueTooBig(String),
    /// No data (or hole) at or after an offset (ENXIO, from lseek).
    #[error("{0}")]
    PastEnd(String),
    /// An operation or mode this file system does not do (EOPNOTSUPP).
    #[error("{0}")]
    NotSupported(String),
    /// Not allowed, whoever asks (EPERM).
    #[error("{0}")]
    NotPermitted(String),
    /// The file system is open read-only (EROFS).
    #[error("{0}")]
    ReadOnly(String),
    /// The log has no room for the change (ENOSPC); nothing of it was
    /// done. The engine's own out-of-space lands here too.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// Long read-only work (fsck on a mount) gave way to writers that
    /// needed what it held; nothing was changed, and it may be run again
    /// (EAGAIN).
    #[error("{0}")]
    Again(String),
    /// The engine failed: I/O, damage found on disk, a latched engine.
    #[error(transparent)]
    Engine(EngineError),
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NoSpace(m) => Error::NoSpace(m),
            e => Error::Engine(e),
        }
    }
}

impl Error {
    /// Damage found decoding `what` (an engine error, as all damage is).
    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Engine(EngineError::corrupt(what, detail))
    }

    /// True for damage found on disk (checksum or decode failures).
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Engine(e) if e.is_corruption())
    }

    /// The same kind of error, its message rewritten by `f` (a front end
    /// adding the path it knows); an engine error is kept as it is.
    pub fn map_msg(self, f: impl FnOnce(String) -> String) -> Self {
        use Error::*;
        match self {
            NotFound(m) => NotFound(f(m)),
            Exists(m) => Exists(f(m)),
            NotEmpty(m) => NotEmpty(f(m)),
            NotDir(m) => NotDir(f(m)),
            IsDir(m) => IsDir(f(m)),
            NameTooLong(m) => NameTooLong(f(m)),
            Invalid(m) => Invalid(f(m)),
            FileTooBig(m) => FileTooBig(f(m)),
            TooManyLinks(m) => TooManyLinks(f(m)),
            NoAttr(m) => NoAttr(f(m)),
            OutOfRange(m) => OutOfRange(f(m)),
            ValueTooBig(m) => ValueTooBig(f(m)),
            PastEnd(m) => PastEnd(f(m)),
            NotSupported(m) => NotSupported(f(m)),
            NotPermitted(m) => NotPermitted(f(m)),
            ReadOnly(m) => ReadOnly(f(m)),
            NoSpace(m) => NoSpace(f(m)),
            Again(m) => Again(f(m)),
            Engine(e) => Engine(e),
        }
    }

    pub(crate) fn not_found(m: impl Into<String>) -> Self {
        Error::NotFound(m.into())
    }

    pub(crate) fn exists(m: impl Into<String>) -> Self {
        Error::Exists(m.into())
    }

    pub(crate) fn not_empty(m: impl Into<String>) -> Self {
        Error::NotEmpty(m.into())
    }

    pub(crate) fn not_dir(m: impl Into<String>) -> Self {
        Error::NotDir(m.into())
    }

    pub(crate) fn is_dir(m: impl Into<String>) -> Self {
        Error::IsDir(m.into())
    }

    pub(crate) fn name_too_long(m: impl Into<String>) -> Self {
        Error::NameTooLong(m.into())
    }

    pub(crate) fn invalid(m: impl Into<String>) -> Self {
        Error::Invalid(m.into())
    }

    pub(crate) fn file_too_big(m: impl Into<String>) -> Self {
        Error::FileTooBig(m.into())
    }

    pub(crate) fn too_many_links(m: impl Into<String>) -> Self {
        Error::TooManyLinks(m.into())
    }

    pub(crate) fn no_attr(m: impl Into<String>) -> Self {
        Error::NoAttr(m.into())
    }

    pub(crate) fn out_of_range(m: impl Into<String>) -> Self {
        Error::OutOfRange(m.into())
    }

    pub(crate) fn value_too_big(m: impl Into<String>) -> Self {
        Error::ValueTooBig(m.into())
    }

    pub(crate) fn past_end(m: impl Into<String>) -> Self {
        Error::PastEnd(m.into())
    }

    pub(crate) fn not_supported(m: impl Into<String>) -> Self {
        Error::NotSupported(m.into())
    }

    pub(crate) fn not_permitted(m: impl Into<String>) -> Self {
        Error::NotPermitted(m.into())
    }

    pub(crate) fn read_only(m: impl Into<String>) -> Self {
        Error::ReadOnly(m.into())
    }
}
