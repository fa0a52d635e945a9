//! File data: reads of stored and buffered chunks ([`read`]);
//! buffering writes ([`write`]); storing a group's buffers at commit
//! ([`store`]); and releasing stored chunks, truncation, holes and
//! reservations ([`trim`]).
//!
//! Invariants (checked by fsck, and in debug builds by
//! [`State::debug_check_file`] at the end of every operation that changes
//! a file's data, and after a commit stores it):
//! - a file has no chunk at or past `ceil(size / chunk_size)`, and no chunk
//!   holds bytes past `size` (reservations excepted: fallocate's
//!   KEEP_SIZE leaves them past the size);
//! - `alloc` is the sum of the lengths of the file's chunks, buffered
//!   chunks counted at their buffered length.

mod read;
pub(crate) use read::extent_blocks;
mod store;
mod trim;
mod write;

use crate::keys::Inode;
#[cfg(debug_assertions)]
use crate::keys::{extents_from, orphan_key, parse_extent_key, Extent};
use crate::state::State;

/// Files of up to this many chunks are checked in debug builds (a check
/// reads every chunk record of the file).
#[cfg(debug_assertions)]
const CHECK_CHUNKS: u64 = 64;

impl State {
    /// In debug builds, panic when file `i` (as just saved) breaks the
    /// invariants above, so that a test fails at the operation that broke
    /// them rather than at the next fsck. Not checked: files of more than
    /// `CHECK_CHUNKS` chunks, files while the cleaner runs (it sets
    /// writers' buffers aside), and files with an orphan record (a long
    /// truncation or delete under way, which holds the invariants again
    /// when it ends).
    pub(crate) fn debug_check_file(&self, i: &Inode) {
        #[cfg(debug_assertions)]
        if !self.cleaning && i.size <= CHECK_CHUNKS * self.cs(i) {
            if let Err(e) = self.check_file(i) {
                panic!("inode {}: {e}", i.ino);
            }
        }
        #[cfg(not(debug_assertions))]
        let _ = i;
    }

    #[cfg(debug_assertions)]
    fn check_file(&self, i: &Inode) -> Result<(), String> {
        // Records that cannot be read (an I/O error, a damaged block) say
        // nothing of the invariants: the operation reports its own error,
        // and the check is skipped.
        let (lo, hi) = extents_from(i.ino, 0);
        let (Ok(orphan), Ok(stored)) = (self.get(&orphan_key(i.ino)), self.scan(&lo, &hi, usize::MAX)) else {
            return Ok(());
        };
        if orphan.is_some() {
            return Ok(());
        }
        let cs = self.cs(i);
        let chunks = i.size.div_ceil(cs);
        let mut alloc = 0u64;
        for (k, v) in stored {
            let Some((_, idx)) = parse_extent_key(&k) else { return Err(format!("chunk key {k:02x?}")) };
            if self.bufs.contains(i.ino, idx) {
                // The buffer is the chunk until the commit stores it.
                continue;
            }
            let e = Extent::decode(&v, "chunk").map_err(|e| e.to_string())?;
            let room = i.size.saturating_sub(idx * cs).min(cs);
            if !matches!(e, Extent::Reserved(_)) && (idx >= chunks || e.len() > room) {
                return Err(format!("stored chunk {idx} of {} bytes lies past the size {}", e.len(), i.size));
            }
            alloc += e.len();
        }
        for idx in self.bufs.chunks_from(i.ino, 0) {
            let n = self.bufs.get(i.ino, idx).map_or(0, |b| b.data().len() as u64);
            if n > i.size.saturating_sub(idx * cs).min(cs) {
                return Err(format!("buffered chunk {idx} of {n} bytes lies past the size {}", i.size));
            }
            alloc += n;
        }
        if alloc != i.alloc {
            return Err(format!("counts {} allocated bytes, its chunks hold {alloc}", i.alloc));
        }
        Ok(())
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {

    use zlogfs_engine::store::Geometry;

    use crate::ROOT;

    #[test]
    fn the_file_check_finds_a_wrong_count_and_bytes_past_the_size() {
        let (_, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let a = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
        fs.write(a.ino, 0, b"hello").unwrap();
        let st = fs.st();
        let mut i = st.inode(a.ino).unwrap();
        assert_eq!(st.check_file(&i), Ok(()));
        i.alloc += 1;
        assert!(st.check_file(&i).unwrap_err().contains("allocated"));
        i.alloc -= 1;
        i.size = 2;
        assert!(st.check_file(&i).unwrap_err().contains("past the size"));
    }
}
