//! The one place where errors become errno values: each kind of the file
//! system's [`Error`] to libc's constant, and the engine's failures
//! underneath to EIO, ENOSPC or EINVAL. The FUSE mount answers with it;
//! NBD narrows it to the few codes its protocol has
//! (`zlogfs_nbd`'s `failed`); the message stays with the error.

use zlogfs_engine::error::Error as EngineError;

use crate::error::Error;

/// The errno the kernel gets for `e`.
pub fn errno(e: &Error) -> i32 {
    match e {
        Error::NotFound(_) => libc::ENOENT,
        Error::Exists(_) => libc::EEXIST,
        Error::NotEmpty(_) => libc::ENOTEMPTY,
        Error::NotDir(_) => libc::ENOTDIR,
        Error::IsDir(_) => libc::EISDIR,
        Error::NameTooLong(_) => libc::ENAMETOOLONG,
        Error::Invalid(_) => libc::EINVAL,
        Error::FileTooBig(_) => libc::EFBIG,
        Error::TooManyLinks(_) => libc::EMLINK,
        Error::NoAttr(_) => libc::ENODATA,
        Error::OutOfRange(_) => libc::ERANGE,
        Error::ValueTooBig(_) => libc::E2BIG,
        Error::PastEnd(_) => libc::ENXIO,
        Error::NotSupported(_) => libc::EOPNOTSUPP,
        Error::NotPermitted(_) => libc::EPERM,
        Error::ReadOnly(_) => libc::EROFS,
        Error::NoSpace(_) => libc::ENOSPC,
        Error::Again(_) => libc::EAGAIN,
        Error::Engine(e) => engine_errno(e),
    }
}

/// The errno of a failure of the engine.
pub fn engine_errno(e: &EngineError) -> i32 {
    match e {
        EngineError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        EngineError::ChecksumMismatch { .. } | EngineError::Corrupt { .. } | EngineError::Failed => libc::EIO,
        EngineError::NoSpace(_) => libc::ENOSPC,
        EngineError::NotAnImage(_)
        | EngineError::Unsupported(_)
        | EngineError::Invalid(_)
        | EngineError::SnapshotTooOld { .. } => libc::EINVAL,
    }
}

/// True when `e` is more than a refused operation (an I/O failure, damage,
/// a failed engine): something an administrator should see in the log.
pub fn is_failure(e: &Error) -> bool {
    matches!(e, Error::Engine(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_errno() {
        let kinds = [
            Error::NotFound(String::new()),
            Error::Exists(String::new()),
            Error::NotEmpty(String::new()),
            Error::NotDir(String::new()),
            Error::IsDir(String::new()),
            Error::NameTooLong(String::new()),
            Error::Invalid(String::new()),
            Error::FileTooBig(String::new()),
            Error::TooManyLinks(String::new()),
            Error::NoAttr(String::new()),
            Error::OutOfRange(String::new()),
            Error::ValueTooBig(String::new()),
            Error::PastEnd(String::new()),
            Error::NotSupported(String::new()),
            Error::NotPermitted(String::new()),
            Error::ReadOnly(String::new()),
            Error::NoSpace(String::new()),
            Error::Again(String::new()),
        ];
        let mut seen: Vec<i32> = kinds.iter().map(errno).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), kinds.len(), "two kinds share an errno");
    }

    #[test]
    fn engine_failures_are_eio_and_its_no_space_enospc() {
        assert_eq!(errno(&Error::Engine(EngineError::Failed)), libc::EIO);
        assert_eq!(errno(&Error::Engine(EngineError::corrupt("x", "y"))), libc::EIO);
        assert_eq!(errno(&EngineError::NoSpace("full".into()).into()), libc::ENOSPC);
        let io = std::io::Error::from_raw_os_error(libc::EROFS);
        assert_eq!(errno(&Error::Engine(EngineError::io("writing", io))), libc::EROFS);
    }
}
