//! The POSIX file system layer: inodes, directories, links, xattrs and file
//! data as records of the index plus compressed data blocks in the log.
//! Usable as a library; the FUSE mount and the command-line tool are thin
//! front ends over [`Fs`].
//!
//! - Records and their encodings: [`keys`].
//! - Operations accepted since the last commit are one group, written to
//!   the engine as one atomic batch; file data is buffered per chunk and
//!   compressed when the group commits (on fsync, every commit interval,
//!   and when buffers pass their bounds).
//! - At commit, chunks of small files are packed together into shared
//!   blocks, very small files go inline into the index, all-zero chunks
//!   become holes, small overwrites of stored chunks become patches beside
//!   them, and the other chunks are compressed one block each; all blocks
//!   of a group are compressed in parallel.
//!
//! The source, by subsystem (folders are one layer each):
//! - records: [`keys`] (the index's keys and values, by record kind), the
//!   clock ([`time`]), change events ([`event`]), the retention policy of
//!   automatic points ([`retention`]);
//! - the API's values ([`attr`], [`options`]), errors ([`error`], and
//!   their errno, [`errno()`]);
//! - [`state`]: one lock guards the state, made of parts that own their
//!   fields: the commit group ([`state::group`]) with the blocks it frees
//!   ([`state::pending`]), the chunk buffers with compression ahead
//!   ([`state::buffers`]), the block cache ([`state::cache`]), and the
//!   handle [`Fs`] that takes the lock ([`state::handle`]);
//! - [`ops`]: the operations, `impl` blocks over the state by job (names,
//!   files, xattrs and ACLs, data, commits, usage);
//! - [`history`]: snapshots, automatic points, forwards, the change feed;
//! - [`clean`]: the cleaner's rounds;
//! - [`check`]: fsck and scrub;
//! - [`filesystem`]: making, opening and closing a file system, its commit
//!   thread ([`filesystem::worker`]) and the file system a long-running
//!   front end serves ([`Live`]).
//!
//! These layers, in this order, are the dependency rule: each module
//! names (`crate::...`) only modules of its own layer or below, and a
//! test (`layers`) checks it on the sources, so no layer names a higher
//! one. A lower module may still call a method that a higher one
//! defines on `State` or `Fs` (the commit asks the cleaner to make room):
//! one type's API spread over files by job.

mod keys;
mod retention;

mod attr;
mod check;
mod clean;
mod errno;
mod error;
mod event;
mod filesystem;
mod history;
mod ops;
mod options;
mod state;
mod stats;
mod time;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::sync::{Mutex, MutexGuard};

pub use attr::{Attr, Caller, DirEntry, SetAttr, StatFs};
pub use attr::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
pub use attr::{RENAME_EXCHANGE, RENAME_NOREPLACE};
pub use attr::{XATTR_CHUNK, XATTR_CODEC, XATTR_CREATE, XATTR_KILL_SGID, XATTR_PHYSICAL, XATTR_REPLACE};
pub use attr::{XATTR_COLD, XATTR_TIER, XATTR_UNIT};
pub use check::scrub::{ScrubOptions, ScrubReport};
pub use check::{CheckReport, CHECK_MEMORY};
pub use clean::{CleanOptions, CleanReport};
pub use errno::{engine_errno, errno, is_failure};
pub use error::{Error, Result};
pub use filesystem::live::Live;
pub use filesystem::mkfs;
pub use history::feed::{ChangeFeed, ChangeOp, FileChange};
pub use history::snapshot::parse_time;
pub use keys::{describe_key, Cold, Snapshot, TierPolicy};
pub use keys::{Config, Counters, Ino, Inode, Kind, Time, DEFAULT_SMALL_MAX, ROOT};
pub use ops::files::MAX_FILE_SIZE;
pub use retention::Policy as HistoryPolicy;
pub use state::handle::{CachesDropped, Fs, Invalidator};
// The record encodings, public for the benchmark of the seed papers'
// inode measurements (benches/papers.rs), as zlogfs-engine's `fuzzing`.
#[cfg(feature = "formats")]
pub use keys::{decode_triple, inode_key, inodes_range, parse_inode_key, triple_id, triple_key, triples_end};
pub use ops::namespace::MAX_SYMLINK;
pub use ops::usage::{CodecUse, TreeUsage, Usage};
pub use options::{Atime, FsOptions, MkfsOptions, SyncMode};
pub use stats::FsStats;
pub use time::now;

/// Lock `m`, taking over a lock that a panicking thread left poisoned (the
/// panic is reported where it happened; the commit thread must not die of
/// it too).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The layering rule of this crate's modules, checked on its sources:
/// each module names (`crate::...`) only its own layer (a folder is one)
/// or those listed before it in [`LAYERS`](layers::LAYERS), so that the
/// graph of layers has no cycle. Not checked: the order of the modules
/// inside one folder, `super::` paths, and method calls (see above).
#[cfg(test)]
mod layers {
    use std::path::{Path, PathBuf};

    /// Lowest first; `lib` is lib.rs's own items (`lock`). Records and
    /// the clock, the state's parts and the state with its handle, the
    /// operations, history, cleaning, checking, and the file system's
    /// opening and commit thread on top.
    pub(super) const LAYERS: &[&str] = &[
        "lib",
        "error",
        "errno",
        "stats",
        "keys",
        "time",
        "retention",
        "event",
        "attr",
        "options",
        "state",
        "ops",
        "history",
        "clean",
        "check",
        "filesystem",
        "testing",
    ];

    fn layer(unit: &str) -> Option<usize> {
        LAYERS.iter().position(|l| *l == unit)
    }

    fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rs_files(&p, out)
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p)
            }
        }
    }

    /// A file's code: its lines up to its inline test module (a test
    /// attribute over `mod NAME {`), less comments.
    fn code(text: &str) -> String {
        let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
        let test = |l: &str| l.starts_with("#[cfg(test)]") || l.starts_with("#[cfg(all(test");
        let end = (0..lines.len())
            .find(|&i| {
                test(lines[i]) && lines.get(i + 1).is_some_and(|m| m.starts_with("mod ") && m.ends_with('{'))
            })
            .unwrap_or(lines.len());
        lines[..end].iter().filter(|l| !l.starts_with("//")).copied().collect::<Vec<_>>().join("\n")
    }

    fn ident(s: &str) -> &str {
        &s[..s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len())]
    }

    /// The first segment of each `crate::` path, one per member of a
    /// `crate::{...}` group.
    fn heads(code: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            if rest.starts_with('*') {
                out.push("*");
                continue;
            }
            let Some(group) = rest.strip_prefix('{') else {
                out.push(ident(rest));
                continue;
            };
            let (mut depth, mut from) = (0, 0);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    ',' | '}' if depth == 0 => {
                        out.push(ident(group[from..].trim_start()));
                        if c == '}' {
                            break;
                        }
                        from = j + 1;
                    }
                    _ => {}
                }
            }
        }
        out.retain(|h| !h.is_empty());
        out
    }

    #[test]
    fn modules_use_only_lower_layers() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let lib = code(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
        // `crate::NAME`: a module, an item of lib.rs, or a name lib.rs
        // re-exports from a module.
        let unit_of = |head: &str| -> String {
            if layer(head).is_some() {
                return head.to_string();
            }
            if lib.contains(&format!("fn {head}(")) || lib.contains(&format!("fn {head}<")) {
                return "lib".into();
            }
            // A statement, less the attributes before it (a feature gate).
            let bare = |s: &str| -> String {
                let mut s = s.trim();
                while let Some(rest) = s.strip_prefix("#[") {
                    s = rest.split_once(']').map_or("", |(_, r)| r).trim_start();
                }
                s.to_string()
            };
            let s = lib
                .split(';')
                .map(bare)
                .filter(|s| s.starts_with("pub use "))
                .find(|s| s.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == head))
                .unwrap_or_else(|| panic!("crate::{head}: no module, and lib.rs re-exports no such name"));
            ident(s["pub use ".len()..].trim_start_matches("crate::")).to_string()
        };
        let (mut files, mut wrong) = (Vec::new(), Vec::new());
        rs_files(&src, &mut files);
        assert!(files.len() > 30, "the sources were not found: {files:?}");
        for path in files {
            let rel = path.strip_prefix(&src).unwrap().to_path_buf();
            let first = rel.components().next().unwrap().as_os_str().to_str().unwrap().to_string();
            let unit = first.trim_end_matches(".rs");
            // lib.rs is the root; a tests.rs is a test module (declared
            // under #[cfg(test)]), free to build a whole file system.
            if unit == "lib" || rel.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let own =
                layer(unit).unwrap_or_else(|| panic!("{}: in no layer; add it to LAYERS", rel.display()));
            for head in heads(&code(&std::fs::read_to_string(&path).unwrap())) {
                if head == "*" {
                    wrong.push(format!("{} uses crate::* (every layer)", rel.display()));
                    continue;
                }
                let used = unit_of(head);
                if used != unit && layer(&used).is_none_or(|l| l >= own) {
                    wrong.push(format!("{} uses {used}", rel.display()));
                }
            }
        }
        wrong.sort();
        wrong.dedup();
        assert!(wrong.is_empty(), "uses of the same or a higher layer:\n{}", wrong.join("\n"));
    }

    /// Files that read in one sitting: none over 900 lines.
    #[test]
    fn no_file_passes_900_lines() {
        let mut files = Vec::new();
        rs_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        let long: Vec<String> = files
            .iter()
            .map(|p| (p, std::fs::read_to_string(p).unwrap().lines().count()))
            .filter(|(_, n)| *n > 900)
            .map(|(p, n)| format!("{}: {n} lines", p.display()))
            .collect();
        assert!(long.is_empty(), "split these by job: {long:?}");
    }

    /// The checker finds a use of a higher layer (it is not vacuous).
    #[test]
    fn heads_reads_paths_and_groups() {
        let c = "use crate::keys::*;\nuse crate::{lock, worker::Run, Fs};\nlet x = crate::clean::f();";
        assert_eq!(heads(c), ["keys", "lock", "worker", "Fs", "clean"]);
        assert!(layer("filesystem") > layer("state"));
        // A test-only item or module file does not end the scan; an
        // inline test module does.
        let f = "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nfn t() {}\nuse crate::a;\n#[cfg(test)]\nmod tests {\nuse crate::b;";
        assert_eq!(heads(&code(f)), ["a"]);
        assert_eq!(heads("use crate::*;"), ["*"]);
    }
}
