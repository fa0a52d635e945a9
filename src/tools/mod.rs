//! Whole-tree tools over [`Fs`](zlogfs_fs::Fs) used by the command-line
//! front end: import a directory, export a tree, check an image (fsck),
//! and measure usage (du, stats).

pub mod export;
pub mod import;
pub mod metrics;
pub mod report;

use zlogfs_fs::{self as fs, Fs, Ino, Kind, ROOT};

/// Result of a tool.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a tool can fail with: the image, the host's files, or its
/// arguments.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image refused or failed an operation.
    #[error(transparent)]
    Image(#[from] fs::Error),
    /// The host's file system failed while doing `op`.
    #[error("I/O error while {op}: {source}")]
    Host {
        /// What the tool was doing ("opening /srv/src").
        op: String,
        /// The host's error.
        #[source]
        source: std::io::Error,
    },
    /// An argument the tool cannot take.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl From<zlogfs_engine::Error> for Error {
    fn from(e: zlogfs_engine::Error) -> Self {
        Error::Image(e.into())
    }
}

impl Error {
    /// A failure of the host's file system while doing `op`.
    pub fn host(op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Host { op: op.into(), source }
    }
}

/// Resolve a path inside the image ("/" or "" is the root); symbolic links
/// are not followed.
pub fn resolve(fs: &Fs, path: &str) -> Result<Ino> {
    let mut cur = ROOT;
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        let a = fs.lookup(cur, c.as_bytes()).map_err(|e| match e {
            fs::Error::NotFound(_) => fs::Error::NotFound(format!("{path}: no such file or directory")),
            fs::Error::NotDir(_) => fs::Error::NotDir(format!("{path}: not a directory")),
            e => e,
        })?;
        cur = a.ino;
    }
    Ok(cur)
}

/// Visit every entry under `dir` depth first, in name order: `f(path,
/// entry)`; paths are relative to `dir`, without a leading slash.
pub fn walk(
    fs: &Fs,
    dir: Ino,
    prefix: &[u8],
    f: &mut dyn FnMut(&[u8], &zlogfs_fs::DirEntry) -> Result<()>,
) -> Result<()> {
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = fs.readdir(dir, after.as_deref(), 1024)?;
        let Some(last) = page.last() else { return Ok(()) };
        after = Some(last.name.clone());
        for e in &page {
            let mut p = prefix.to_vec();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&e.name);
            f(&p, e)?;
            if e.kind == Kind::Dir {
                walk(fs, e.ino, &p, f)?;
            }
        }
    }
}

/// Map an I/O error of the host to [`Error::Host`] naming what was being
/// done.
pub fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::host(what, e)
}

/// A progress bar on stderr when it is a terminal and output is not JSON.
pub fn progress(len: u64, what: &str, quiet: bool) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb
}
