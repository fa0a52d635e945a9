//! Usage accounting: logical and stored bytes of a tree (`du`) and of the
//! whole image (`stats`), by codec.

use std::collections::{BTreeMap, HashSet};

use zlogfs_engine::codec::{encode, raw_reason, CodecId, CodecSpec};
use zlogfs_engine::BlockAddr;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::{for_each_paged, State, WALK_PAGE};
use crate::Fs;

/// Logical and stored bytes of a tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeUsage {
    /// Regular files.
    pub files: u64,
    /// Directories (the top one included).
    pub dirs: u64,
    /// Other inodes.
    pub others: u64,
    /// Sum of file sizes.
    pub logical: u64,
    /// Logical bytes not in holes.
    pub allocated: u64,
    /// Stored bytes of the data (shared blocks split by share).
    pub physical: u64,
}

/// Codec use: blocks, logical bytes and stored bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodecUse {
    /// Data blocks.
    pub blocks: u64,
    /// Decompressed bytes.
    pub raw: u64,
    /// Stored bytes (with headers).
    pub stored: u64,
}

/// Whole-image usage for `zlogfs stats`.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// The tree from the root.
    pub tree: TreeUsage,
    /// Inodes in the index.
    pub inodes: u64,
    /// Data blocks by codec name ("zstd:3", "raw:no-gain", ...).
    pub codecs: BTreeMap<String, CodecUse>,
    /// Bytes of file data inline in the index.
    pub inline_bytes: u64,
    /// Chunks stored with patches (small overwrites kept beside them).
    pub patched_chunks: u64,
    /// Of those, chunks whose patches replace all of them: their bases
    /// are gone (the cleaner stored what showed of them as patches).
    pub bases_gone: u64,
    /// Stored bytes of those patches.
    pub patch_bytes: u64,
    /// Stored bytes of patched chunks' bases that their patches replace,
    /// released from the segments' live counts (dead to the cleaner).
    pub patch_released: u64,
    /// Inode records (keys and values) before compression.
    pub inode_bytes_raw: u64,
    /// Inode records compressed as the index stores them (16 KiB blocks,
    /// the index codec).
    pub inode_bytes_compressed: u64,
    /// (uid, gid, mode) triples.
    pub triples: u64,
    /// Lifetime bytes written by users and to the device.
    pub counters: Counters,
}

impl Fs {
    /// Logical and stored bytes of the tree under `ino`; on a mounted file
    /// system, a page of it at a time (changes made meanwhile are counted
    /// as they were or as they became, as `du(1)` counts on a busy disk).
    pub fn du(&self, ino: Ino) -> Result<TreeUsage> {
        self.du_paged(ino, &mut || {})
    }

    /// [`Fs::du`], with `between` called between pages, the lock let go.
    pub(crate) fn du_paged(&self, ino: Ino, between: &mut dyn FnMut()) -> Result<TreeUsage> {
        let mut u = TreeUsage::default();
        walk(&|| self.st_after_requests(), ino, between, &mut |st, node| {
            match node.kind() {
                Kind::Dir => u.dirs += 1,
                k => {
                    if k == Kind::File {
                        u.files += 1;
                        u.logical += node.size;
                    } else {
                        u.others += 1;
                    }
                    u.allocated += node.alloc;
                    u.physical += st.physical(node.ino)?;
                }
            }
            Ok(())
        })?;
        Ok(u)
    }

    /// Whole-image usage (reads every data block's header), a page at a
    /// time as [`Fs::du`].
    pub fn usage(&self) -> Result<Usage> {
        self.usage_paged(&mut || {})
    }

    /// [`Fs::usage`], with `between` called between pages, the lock let
    /// go.
    pub(crate) fn usage_paged(&self, between: &mut dyn FnMut()) -> Result<Usage> {
        let tree = self.du_paged(ROOT, between)?;
        let mut u = {
            let mut st = self.st();
            st.commit()?;
            Usage {
                tree,
                triples: st.group.triple_count() as u64,
                counters: st.group.counters_now(st.eng.device_bytes_written()),
                ..Usage::default()
            }
        };
        let lock = || self.st_after_requests();
        let (lo, hi) = inodes_range();
        let mut block = Vec::new();
        let spec = CodecSpec::new(CodecId::Zstd, 3);
        for_each_paged(&lock, &lo, &hi, WALK_PAGE, between, |_, k, v| {
            u.inodes += 1;
            u.inode_bytes_raw += (k.len() + v.len()) as u64;
            block.extend_from_slice(k);
            block.extend_from_slice(v);
            if block.len() >= 16 << 10 {
                u.inode_bytes_compressed += encode(spec, &block).data.len() as u64;
                block.clear();
            }
            Ok(())
        })?;
        if !block.is_empty() {
            u.inode_bytes_compressed += encode(spec, &block).data.len() as u64;
        }
        // Each block's header is read under the lock that read the chunk
        // naming it (the cleaner moves blocks under it), once.
        let mut seen: HashSet<BlockAddr> = HashSet::new();
        let mut fresh = Vec::new();
        let (lo, hi) = all_extents_range();
        for_each_paged(&lock, &lo, &hi, WALK_PAGE, between, |st, k, v| {
            let e = Extent::decode(v, &format!("chunk {k:02x?}"))?;
            if let Extent::Patched { base, patches, freed } = &e {
                u.patched_chunks += 1;
                u.bases_gone += u64::from(matches!(**base, Extent::Gone(_)));
                u.patch_released += u64::from(*freed);
                u.patch_bytes += patches.iter().map(|p| p.piece.phys()).sum::<u64>();
            }
            for p in e.parts() {
                match p {
                    Extent::Inline(b) => u.inline_bytes += b.len() as u64,
                    p => fresh.extend(p.addr().filter(|a| seen.insert(*a))),
                }
            }
            for a in fresh.drain(..) {
                count_codec(st, a, &mut u.codecs)?;
            }
            Ok(())
        })?;
        Ok(u)
    }
}

/// Count block `a` under its codec in `codecs`, from its header.
fn count_codec(st: &State, a: BlockAddr, codecs: &mut BTreeMap<String, CodecUse>) -> Result<()> {
    let h = st.eng.block_header(a)?;
    let name = match CodecId::from_u8(h.codec) {
        Some(CodecId::None) if h.raw_reason & raw_reason::PROBE != 0 => "raw (looked incompressible)".into(),
        Some(CodecId::None) if h.raw_reason & raw_reason::NO_GAIN != 0 => "raw (no gain)".into(),
        Some(CodecId::None) => "none".into(),
        Some(c) => CodecSpec::new(c, h.level).to_string(),
        None => format!("unknown codec {}", h.codec),
    };
    let e = codecs.entry(name).or_default();
    e.blocks += 1;
    e.raw += u64::from(h.raw_len);
    e.stored += u64::from(a.len);
    Ok(())
}

/// Call `f` on every inode of the subtree at `ino` (itself included),
/// each once (hard links and all), with the state `lock` gives: taken for
/// a page of a directory's entries at a time, `between` called between
/// pages with it let go. Holds the directories, and the files of more
/// than one link, not every inode of the tree (issue 45). A directory
/// removed before its turn is passed over.
fn walk<G: std::ops::Deref<Target = State>>(
    lock: &dyn Fn() -> G,
    ino: Ino,
    between: &mut dyn FnMut(),
    f: &mut dyn FnMut(&State, &Inode) -> Result<()>,
) -> Result<()> {
    let (mut linked, mut seen) = (HashSet::new(), HashSet::new());
    let mut dirs = vec![ino];
    while let Some(d) = dirs.pop() {
        if !seen.insert(d) {
            continue; // a damaged image's loop
        }
        let node = match lock().inode(d) {
            Ok(n) => n,
            Err(Error::NotFound(_)) if d != ino => continue,
            Err(e) => return Err(e),
        };
        if node.kind() != Kind::Dir {
            // An entry said directory; the inode says otherwise.
            if node.nlink <= 1 || linked.insert(d) {
                f(&lock(), &node)?;
            }
            continue;
        }
        let (lo, hi) = dirents_range(d);
        for_each_paged(lock, &lo, &hi, WALK_PAGE, between, |st, _, v| {
            let (child, kind) = decode_dirent(v)?;
            if kind == Kind::Dir {
                dirs.push(child); // its inode's kind decides, when popped
                return Ok(());
            }
            let node = st.inode(child)?;
            if node.kind() == Kind::Dir {
                dirs.push(child);
            } else if node.nlink <= 1 || linked.insert(child) {
                f(st, &node)?;
            }
            Ok(())
        })?;
        f(&lock(), &node)?;
    }
    Ok(())
}

impl State {
    /// The stored bytes of the subtree at directory `ino`, with data not
    /// committed yet counted as [`State::physical_now`] does; and whether
    /// any was. A walk of the subtree: a scan of each directory's entries
    /// and of each file's chunk records, as `du` does.
    pub(crate) fn subtree_physical(&self, ino: Ino) -> Result<(u64, bool)> {
        let (mut total, mut estimated) = (0, false);
        walk(&|| self, ino, &mut || {}, &mut |st, node| {
            if node.kind() != Kind::Dir {
                let (n, e) = st.physical_now(node.ino)?;
                total += n;
                estimated |= e;
            }
            Ok(())
        })?;
        Ok((total, estimated))
    }
}

#[cfg(test)]
mod tests {
    use zlogfs_engine::store::Geometry;

    use crate::state::WALK_PAGE;
    use crate::{Fs, ROOT};

    fn geometry() -> Geometry {
        Geometry { segment_size: 1 << 20, segment_count: 64 }
    }

    /// Whether another request could take the state now.
    fn lock_free(fs: &Fs) -> bool {
        fs.inner.st.try_lock().is_ok()
    }

    #[test]
    fn du_lets_go_of_the_lock_between_pages_and_passes_over_directories_removed_meanwhile() {
        let (_store, fs) = crate::testing::fresh(geometry());
        // One past a page of directories in the root: the walk lists the
        // root in two pages, and the first page's directories wait on the
        // walk's stack while the second is read.
        let n = WALK_PAGE + 1;
        for d in 0..n {
            fs.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap();
        }
        fs.sync().unwrap();
        assert_eq!(fs.du(ROOT).unwrap().dirs, n as u64 + 1);
        let mut betweens = 0;
        let u = fs
            .du_paged(ROOT, &mut || {
                assert!(lock_free(&fs), "the walk holds the state between pages");
                if betweens == 0 {
                    for d in 0..n {
                        fs.rmdir(ROOT, format!("d{d}").as_bytes()).unwrap();
                    }
                }
                betweens += 1;
            })
            .unwrap();
        assert_eq!(betweens, 1);
        // The first page's directories were removed before their turn,
        // the second page's before it was read: only the root is left.
        assert_eq!(u.dirs, 1);
        assert_eq!(fs.du(ROOT).unwrap().dirs, 1);
    }

    #[test]
    fn usage_lets_go_of_the_lock_between_pages_and_counts_what_it_saw() {
        let (_store, fs) = crate::testing::fresh(geometry());
        let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
        // Files past a page of entries, of inodes and of chunk records,
        // each with a block of its own (past the inline size).
        let n = WALK_PAGE + 1;
        for f in 0..n {
            let ino = fs.create(d, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(ino, 0, format!("{f:08}").repeat(1024).as_bytes()).unwrap();
        }
        fs.sync().unwrap();
        let still = fs.usage().unwrap();
        assert_eq!(still.tree.files, n as u64);
        assert_eq!(still.codecs.values().map(|c| c.raw).sum::<u64>(), n as u64 * 8192);
        let mut betweens = 0;
        let u = fs
            .usage_paged(&mut || {
                assert!(lock_free(&fs), "the walk holds the state between pages");
                betweens += 1;
            })
            .unwrap();
        assert!(betweens >= 3, "{betweens} pauses: the dirents, inodes and chunks each take two pages");
        assert_eq!(u.tree, still.tree);
        assert_eq!(u.codecs, still.codecs);
        assert_eq!(u.inodes, still.inodes);
        // Writes between pages: the walk goes on and sees each file once.
        let mut k = 0;
        let u = fs
            .usage_paged(&mut || {
                let ino = fs.create(d, format!("new{k}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                fs.write(ino, 0, &vec![7u8; 8192]).unwrap();
                k += 1;
            })
            .unwrap();
        assert!(u.tree.files >= n as u64 && u.tree.files <= (n + k) as u64, "{} files", u.tree.files);
    }
}
