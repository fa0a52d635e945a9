//! Usage accounting: logical and stored bytes of a tree (`du`) and of the
//! whole image (`stats`), by codec.

use std::collections::{BTreeMap, HashSet};

use zlogfs_engine::codec::{encode, raw_reason, CodecId, CodecSpec};
use zlogfs_engine::BlockAddr;

use crate::error::Result;
use crate::keys::*;
use crate::state::State;
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
    /// Logical and stored bytes of the tree under `ino`.
    pub fn du(&self, ino: Ino) -> Result<TreeUsage> {
        let st = self.st();
        let mut u = TreeUsage::default();
        st.walk(ino, &mut |node| {
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

    /// Whole-image usage (reads every data block's header).
    pub fn usage(&self) -> Result<Usage> {
        let tree = self.du(ROOT)?;
        let mut st = self.st();
        st.commit()?;
        let mut u = Usage {
            tree,
            triples: st.group.triple_count() as u64,
            counters: st.group.counters_now(st.eng.device_bytes_written()),
            ..Usage::default()
        };
        let (lo, hi) = inodes_range();
        let mut block = Vec::new();
        let spec = CodecSpec::new(CodecId::Zstd, 3);
        st.for_each(&lo, &hi, |k, v| {
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
        let mut blocks: HashSet<BlockAddr> = HashSet::new();
        let (lo, hi) = all_extents_range();
        st.for_each(&lo, &hi, |k, v| {
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
                    p => blocks.extend(p.addr()),
                }
            }
            Ok(())
        })?;
        let mut sorted: Vec<BlockAddr> = blocks.into_iter().collect();
        sorted.sort_by_key(|a| (a.seg, a.offset));
        for a in sorted {
            let h = st.eng.block_header(a)?;
            let name = match CodecId::from_u8(h.codec) {
                Some(CodecId::None) if h.raw_reason & raw_reason::PROBE != 0 => {
                    "raw (looked incompressible)".into()
                }
                Some(CodecId::None) if h.raw_reason & raw_reason::NO_GAIN != 0 => "raw (no gain)".into(),
                Some(CodecId::None) => "none".into(),
                Some(c) => CodecSpec::new(c, h.level).to_string(),
                None => format!("unknown codec {}", h.codec),
            };
            let e = u.codecs.entry(name).or_default();
            e.blocks += 1;
            e.raw += u64::from(h.raw_len);
            e.stored += u64::from(a.len);
        }
        Ok(u)
    }
}

impl State {
    /// The stored bytes of the subtree at directory `ino`, with data not
    /// committed yet counted as [`State::physical_now`] does; and whether
    /// any was. A walk of the subtree: a scan of each directory's entries
    /// and of each file's chunk records, as `du` does.
    pub(crate) fn subtree_physical(&self, ino: Ino) -> Result<(u64, bool)> {
        let (mut total, mut estimated) = (0, false);
        self.walk(ino, &mut |node| {
            if node.kind() != Kind::Dir {
                let (n, e) = self.physical_now(node.ino)?;
                total += n;
                estimated |= e;
            }
            Ok(())
        })?;
        Ok((total, estimated))
    }

    /// Call `f` on every inode of the subtree at `ino` (itself included),
    /// each once (hard links and all). Holds the directories, and the
    /// files of more than one link, not every inode of the tree: a
    /// directory's entries are read a page at a time, its files handled
    /// as they come (issue 45).
    fn walk(&self, ino: Ino, f: &mut dyn FnMut(&Inode) -> Result<()>) -> Result<()> {
        let (mut linked, mut seen) = (HashSet::new(), HashSet::new());
        let mut dirs = vec![ino];
        while let Some(d) = dirs.pop() {
            if !seen.insert(d) {
                continue; // a damaged image's loop
            }
            let node = self.inode(d)?;
            if node.kind() != Kind::Dir {
                // An entry said directory; the inode says otherwise.
                if node.nlink <= 1 || linked.insert(d) {
                    f(&node)?;
                }
                continue;
            }
            let (lo, hi) = dirents_range(d);
            self.for_each(&lo, &hi, |_, v| {
                let (child, kind) = decode_dirent(v)?;
                if kind == Kind::Dir {
                    dirs.push(child); // its inode's kind decides, when popped
                    return Ok(());
                }
                let node = self.inode(child)?;
                if node.kind() == Kind::Dir {
                    dirs.push(child);
                } else if node.nlink <= 1 || linked.insert(child) {
                    f(&node)?;
                }
                Ok(())
            })?;
            f(&node)?;
        }
        Ok(())
    }
}
