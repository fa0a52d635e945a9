//! Operations on files: attributes, open and release, read, write,
//! truncate, fallocate, copy, seek, and the file system's counts.
//!
//! Each operation checks everything it can before it changes anything, so
//! that a refused operation leaves no trace; the mutations of one operation
//! land in the same commit group (long deletes excepted, which commit in
//! steps under an orphan record).

use std::sync::Arc;

use zlogfs_engine::metrics::{self, Metrics};
use zlogfs_engine::BlockAddr;

use crate::error::{Error, Result};
use crate::event::What;
use crate::keys::*;
use crate::ops::acl;
use crate::state::State;
use crate::time::now;
use crate::{Atime, Attr, Caller, Fs, SetAttr, StatFs};
use crate::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};

/// Largest file size (a chunk index must fit the key, and sizes fit i64).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

impl State {
    fn file(&self, ino: Ino) -> Result<Inode> {
        let i = self.inode(ino)?;
        match i.kind() {
            Kind::File => Ok(i),
            Kind::Dir => Err(Error::is_dir(format!("inode {ino} is a directory"))),
            _ => Err(Error::invalid(format!("inode {ino} is not a regular file"))),
        }
    }

    /// A read of `i`: update its atime as the policy says.
    ///
    /// An atime update is the one change a read makes, and it must never
    /// cost a change the user asked for: a group of them is committed
    /// when it reaches the group's bound (reads add no other records, so
    /// nothing else would), and an update is dropped when that commit
    /// fails or when the log has no room for more than the reserve, which
    /// deletes need (docs/SEMANTICS.md, atime). Before, 27,000 reads of a
    /// full image made one group too large for the journal, and every
    /// later change failed with it.
    /// True when the atime moved.
    pub(crate) fn relatime(&mut self, mut i: Inode) -> bool {
        let t = now();
        let due = atime_due(self.atime, i.atime, i.mtime, i.ctime, t);
        // A latched engine stores nothing more: no update to accept.
        if !due || (!self.diratime && i.kind() == Kind::Dir) || self.eng.failed() {
            return false;
        }
        if self.group.bytes() + self.bufs.count() * 64 > self.group.max_bytes() / 2 {
            // The commit may change the file (a buffered chunk of zeros
            // stored as a hole comes off its allocated count): the copy
            // read before it is stale (issue 44, item 9).
            if let Err(e) = self.commit().and_then(|()| {
                i = self.inode(i.ino)?;
                Ok(())
            }) {
                // The operation that needs the commit meets this again.
                self.note_dropped_atime(&e);
                return false;
            }
        }
        // Room for the group's journal record after this one.
        if (self.group.bytes() + 64) as u64 > self.space_hint.saturating_sub(self.bufs.bytes() as u64) {
            self.stats.atime_dropped += 1;
            return false;
        }
        i.atime = t;
        self.save(&i);
        self.group.set_grew();
        true
    }

    fn note_dropped_atime(&mut self, e: &Error) {
        if self.stats.atime_dropped == 0 {
            tracing::warn!("atime updates are dropped while a commit fails: {e}");
        }
        self.stats.atime_dropped += 1;
    }
}

/// Whether a read at `t` moves an atime under `policy` (relatime: when it
/// is not after the mtime or ctime, or a day old).
fn atime_due(policy: Atime, atime: Time, mtime: Time, ctime: Time, t: Time) -> bool {
    match policy {
        Atime::Noatime => false,
        Atime::Strict => true,
        Atime::Relatime => atime <= mtime || atime <= ctime || t.sec - atime.sec >= 86_400,
    }
}

impl Fs {
    /// Attributes of an inode.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let st = self.st();
        let i = st.inode(ino)?;
        Ok(st.attr(&i))
    }

    /// Note an open handle: an inode unlinked while open lives until the
    /// last handle is released.
    pub fn open_file(&self, ino: Ino) -> Result<Attr> {
        let mut st = self.st();
        let i = st.inode(ino)?;
        *st.open.entry(ino).or_insert(0) += 1;
        Ok(st.attr(&i))
    }

    /// [`Fs::open_file`] for reading: the open moves the atime as a read
    /// would (when the policy says it is due), and says whether it moved.
    ///
    /// A front end whose reads may be served from a cache without asking
    /// (the kernel's page cache) then keeps that cache at every open, and
    /// drops only its cached attributes when the atime moved. Letting the
    /// pages go at an open instead races a write still on its way: the
    /// kernel may cache the bytes from before the write (the stress run's
    /// stale read, 2026-12-03).
    pub fn open_to_read(&self, ino: Ino) -> Result<bool> {
        let mut st = self.st();
        let i = st.inode(ino)?;
        let moved = st.relatime(i);
        *st.open.entry(ino).or_insert(0) += 1;
        Ok(moved)
    }

    /// Drop an open handle.
    pub fn release_file(&self, ino: Ino) -> Result<()> {
        let mut st = self.st();
        let left = match st.open.get_mut(&ino) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => return Ok(()),
        };
        if left == 0 {
            st.open.remove(&ino);
            if let Ok(mut i) = st.inode(ino) {
                // (Read-only: an orphan stays, and the next writer's open
                // finishes it.)
                if i.nlink == 0 && !st.read_only {
                    st.pre_relieve()?;
                    st.destroy(&mut i)?;
                }
            }
        }
        Ok(())
    }

    /// Read up to `len` bytes at `off`.
    ///
    /// The blocks the read needs that are not cached are read and
    /// decompressed first, without the lock, so that reads of several
    /// threads decompress on several cores; they are cached only if
    /// nothing placed or freed a block meanwhile (the log epoch did not
    /// move), since only then are they still what those addresses hold.
    /// The read itself then runs under the lock as before, finding them
    /// cached (or, evicted since, reading them again). A read that needs
    /// nothing uncached takes the lock once.
    pub fn read(&self, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>> {
        self.read_moving_atime(ino, off, len, true)
    }

    /// [`Fs::read`] that leaves the atime alone (a descriptor opened with
    /// `O_NOATIME`).
    pub fn read_noatime(&self, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>> {
        self.read_moving_atime(ino, off, len, false)
    }

    fn read_moving_atime(&self, ino: Ino, off: u64, len: usize, atime: bool) -> Result<Vec<u8>> {
        let mut st = self.st();
        let mut i = st.file(ino)?;
        let need = st.uncached_blocks(&i, off, len)?;
        if !need.is_empty() {
            let epoch = st.cache.epoch();
            drop(st);
            let got: Vec<(BlockAddr, Vec<u8>)> =
                need.into_iter().filter_map(|a| self.eng.read_block(a).ok().map(|b| (a, b))).collect();
            st = self.st();
            if st.cache.epoch() == epoch {
                for (a, b) in got {
                    st.cache.insert(a, Arc::new(b));
                }
            }
            // Changed or removed while the lock was not held.
            i = st.file(ino)?;
        }
        let v = st.read_data(&i, off, len)?;
        if atime {
            st.relatime(i);
        }
        Metrics::add(&metrics::global().counters.user_bytes_read, v.len() as u64);
        Ok(v)
    }

    /// Write `data` at `off`.
    pub fn write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.synced(self.write_now(ino, off, data, None), false)
    }

    /// [`Fs::write`](crate::Fs::write) by `by`, which clears set-ID bits as [`Caller`] says.
    pub fn write_by(&self, ino: Ino, off: u64, data: &[u8], by: &Caller) -> Result<usize> {
        self.synced(self.write_now(ino, off, data, Some(by)), false)
    }

    fn write_now(&self, ino: Ino, off: u64, data: &[u8], by: Option<&Caller>) -> Result<usize> {
        let mut st = self.st();
        st.pre_op()?;
        let mut i = st.file(ino)?;
        if off.checked_add(data.len() as u64).is_none_or(|e| e > MAX_FILE_SIZE) {
            return Err(Error::file_too_big(format!(
                "write at {off} of {} bytes passes the largest file size",
                data.len()
            )));
        }
        let fresh = st.fresh_bytes(&i, off, data.len())?;
        if st.pre_write(fresh)? {
            // The commit may have changed the file (see State::relatime).
            i = st.file(ino)?;
        }
        st.write_data(&mut i, off, data)?;
        let t = now();
        i.mtime = t;
        i.ctime = t;
        if let Some(c) = by {
            i.mode &= !c.cleared_by_write(i.mode, i.gid);
        }
        st.save(&i);
        st.note(ino, Kind::File, What::Data);
        st.debug_check_file(&i);
        Ok(data.len())
    }

    /// Change attributes; a size change truncates or extends.
    pub fn setattr(&self, ino: Ino, a: &SetAttr) -> Result<Attr> {
        self.synced(self.setattr_now(ino, a), false)
    }

    fn setattr_now(&self, ino: Ino, a: &SetAttr) -> Result<Attr> {
        let mut st = self.st();
        if a.size.is_some() && a.mode.is_none() && a.uid.is_none() && a.gid.is_none() {
            // A truncate: a removal, even upwards (a hole stores nothing).
            st.pre_relieve()?;
        } else {
            st.pre_op()?;
        }
        let mut i = st.inode(ino)?;
        let (mode0, gid0) = (i.mode, i.gid);
        let t = now();
        if let Some(size) = a.size {
            match i.kind() {
                Kind::File => {}
                Kind::Dir => return Err(Error::is_dir(format!("inode {ino} is a directory"))),
                _ => return Err(Error::invalid(format!("inode {ino} is not a regular file"))),
            }
            if size > MAX_FILE_SIZE {
                return Err(Error::file_too_big(format!("size {size} passes the largest file size")));
            }
            if size != i.size {
                st.note(ino, Kind::File, What::Data);
                st.set_len(&mut i, size)?;
                i.mtime = t;
            }
        }
        if let Some(m) = a.mode {
            i.mode = (i.mode & S_IFMT) | (m & 0o7777);
            let k = xattr_key(ino, acl::ACCESS);
            if let Some(mut entries) = st.get(&k)?.as_deref().and_then(acl::parse) {
                acl::chmod(&mut entries, m);
                st.put(k, acl::encode(&entries));
            }
        }
        if let Some(u) = a.uid {
            i.uid = u;
        }
        if let Some(g) = a.gid {
            i.gid = g;
        }
        if let Some(x) = a.atime {
            i.atime = x.unwrap_or(t);
        }
        if let Some(x) = a.mtime {
            i.mtime = x.unwrap_or(t);
        }
        i.ctime = a.ctime.unwrap_or(t);
        if let Some(b) = a.btime {
            i.btime = b;
        }
        // A truncate's new mtime is part of the data change.
        let times = a.atime.is_some() || a.btime.is_some() || (a.mtime.is_some() && a.size.is_none());
        if a.mode.is_some() || a.uid.is_some() || a.gid.is_some() || times {
            st.note(ino, i.kind(), What::Meta);
        }
        if let Some(c) = &a.by {
            // As the file was before the change.
            if a.size.is_some() {
                i.mode &= !c.cleared_by_write(mode0, gid0);
            }
            if a.uid.is_some() || a.gid.is_some() {
                i.mode &= !c.cleared_by_chown(mode0, gid0);
            }
        }
        st.save(&i);
        st.debug_check_file(&i);
        Ok(st.attr(&i))
    }

    /// fallocate: mode 0 or KEEP_SIZE reserve the range's unstored chunks
    /// uncompressed, so that their first write cannot meet ENOSPC (ENOSPC
    /// now if they do not fit); PUNCH_HOLE | KEEP_SIZE makes the range a
    /// hole and gives its reservations back; ZERO_RANGE zeroes and
    /// reserves it.
    pub fn fallocate(&self, ino: Ino, mode: u32, off: u64, len: u64) -> Result<()> {
        self.synced(self.fallocate_now(ino, mode, off, len, None), false)
    }

    /// [`Fs::fallocate`](crate::Fs::fallocate) by `by`, which clears set-ID bits as [`Caller`]
    /// says.
    pub fn fallocate_by(&self, ino: Ino, mode: u32, off: u64, len: u64, by: &Caller) -> Result<()> {
        self.synced(self.fallocate_now(ino, mode, off, len, Some(by)), false)
    }

    fn fallocate_now(&self, ino: Ino, mode: u32, off: u64, len: u64, by: Option<&Caller>) -> Result<()> {
        let mut st = self.st();
        if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            st.pre_relieve()?;
        } else {
            st.pre_op()?;
        }
        let mut i = st.file(ino)?;
        if len == 0 {
            return Err(Error::invalid("fallocate of 0 bytes"));
        }
        let end = off.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| {
            Error::file_too_big(format!("fallocate of {len} bytes at {off} passes the largest file size"))
        })?;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let r = match mode & !FALLOC_FL_KEEP_SIZE {
            0 => st.reserve(&mut i, off, end),
            FALLOC_FL_PUNCH_HOLE if keep => {
                st.zero_range(&mut i, off, len).and_then(|()| st.unreserve_past_size(&mut i, off, end))
            }
            // Zeroed, and then reserved as mode 0 would: on a full file
            // system the range may be zeroed and ENOSPC answered, as ext4
            // may.
            FALLOC_FL_ZERO_RANGE => {
                st.zero_range(&mut i, off, len).and_then(|()| st.reserve(&mut i, off, end))
            }
            _ => return Err(Error::not_supported(format!("fallocate mode {mode:#x} is not supported"))),
        };
        if r.is_ok() {
            if !keep && end > i.size {
                i.size = end;
            }
            let t = now();
            if mode != 0 && mode != FALLOC_FL_KEEP_SIZE {
                i.mtime = t;
            }
            i.ctime = t;
            if let Some(c) = by {
                i.mode &= !c.cleared_by_write(i.mode, i.gid);
            }
        }
        // After a failure too: what was done before it (chunks made
        // holes, their counts in `i`) stays done, and the inode with it.
        st.save(&i);
        st.note(ino, Kind::File, What::Data);
        st.debug_check_file(&i);
        r
    }

    /// Copy `len` bytes between files (through memory: no shared blocks).
    pub fn copy_file_range(&self, src: Ino, off_in: u64, dst: Ino, off_out: u64, len: u64) -> Result<u64> {
        self.copy_file_range_by(src, off_in, dst, off_out, len, None)
    }

    /// [`Fs::copy_file_range`](crate::Fs::copy_file_range) by `by`, which clears set-ID bits of the
    /// destination as [`Caller`] says.
    pub fn copy_file_range_by(
        &self,
        src: Ino,
        off_in: u64,
        dst: Ino,
        off_out: u64,
        len: u64,
        by: Option<&Caller>,
    ) -> Result<u64> {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(1 << 20) as usize;
            let buf = self.read(src, off_in + done, n)?;
            if buf.is_empty() {
                break;
            }
            self.synced(self.write_now(dst, off_out + done, &buf, by), false)?;
            done += buf.len() as u64;
        }
        Ok(done)
    }

    /// SEEK_DATA (`data` true) or SEEK_HOLE from `off`; ENXIO past the end.
    pub fn lseek(&self, ino: Ino, off: u64, data: bool) -> Result<u64> {
        let mut st = self.st();
        let i = st.inode(ino)?;
        st.seek(&i, off, data)?.ok_or_else(|| {
            Error::past_end(format!("no {} at or after {off}", if data { "data" } else { "hole" }))
        })
    }

    /// Stored (compressed) bytes of a file.
    pub fn physical_bytes(&self, ino: Ino) -> Result<u64> {
        self.st().physical(ino)
    }

    /// Space and inode counts; free space as if nothing compressed.
    pub fn statfs(&self) -> Result<StatFs> {
        let mut st = self.st();
        let bsize = 4096u64;
        if !st.group.pending().frees.is_empty() {
            // What a delete frees counts once its record is durable: make
            // it so now, so that df after rm shows the space.
            if let Err(e) = st.commit().and_then(|()| Ok(st.eng.sync()?)) {
                tracing::warn!("statfs: committing the deletes before counting free space failed: {e}");
            }
            st.purgeable_at = None;
        }
        let (usable, _) = self.eng.capacity();
        let free = st.room_with_history()?.min(usable);
        let (total, free) = (usable / bsize, free / bsize);
        let used_inodes = st.group.cfg().next_ino - 1;
        let ffree = (1u64 << 32).saturating_sub(used_inodes);
        Ok(StatFs {
            bsize: bsize as u32,
            blocks: total,
            bfree: free,
            bavail: free,
            files: used_inodes + ffree,
            ffree,
            namelen: 255,
        })
    }
}
