//! Commits and the bounds that call for them: an operation first makes
//! sure the group it joins can still be committed (its size, the buffers'
//! bound, the room left in the log), then joins it; a commit stores the
//! buffered chunks and writes the group as one engine batch.

use zlogfs_engine::engine::Room;

use crate::error::{Error, Result};
use crate::state::State;

/// Commits between passes that drop old change records.
const PRUNE_EVERY: u64 = 1024;

/// The fullest segments (live share) that a writer short of room cleans:
/// the dead bytes of fuller ones cost more to reach than they give, and
/// statfs does not count them free.
pub(crate) const WRITER_MAX_LIVE: f64 = 0.95;

impl State {
    /// Before an operation that changes anything but only removes:
    /// commit first when the group or the buffers are past their bounds,
    /// so that one more operation fits in the group; and mark the group
    /// as one that may not use the reserve.
    pub(crate) fn pre_op(&mut self) -> Result<()> {
        self.bound_group()?;
        self.group.set_grew();
        Ok(())
    }

    /// Commit when the group or the buffers are past their bounds; EROFS
    /// when nothing may change, EIO once the engine has latched (a write
    /// or sync failed: nothing accepted from then on could be stored).
    pub(crate) fn bound_group(&mut self) -> Result<()> {
        if self.read_only {
            return Err(Error::read_only("the file system is open read-only"));
        }
        if self.eng.failed() {
            return Err(Error::Engine(zlogfs_engine::Error::Failed));
        }
        if self.group.bytes() + self.bufs.count() * 64 > self.group.max_bytes() / 2
            || self.bufs.bytes() > self.bufs.limit()
            || self.group.changes_full()
        {
            self.commit()?;
        }
        Ok(())
    }

    /// Group bytes left before a commit is needed inside a long operation.
    pub(crate) fn group_full(&self) -> bool {
        self.group.bytes() + self.bufs.count() * 64 > self.group.max_bytes() * 3 / 4
    }

    /// Write the group: compress and store buffered chunks, then apply all
    /// pending mutations as one atomic engine batch.
    pub(crate) fn commit(&mut self) -> Result<()> {
        // A group that only removes or renames may use part of the reserve,
        // so that a full file system can still delete.
        let room = if self.group.grew() || !self.bufs.is_empty() { Room::User } else { Room::Relieve };
        self.commit_as(room)
    }

    /// Commit, allowed to use `room` of the log's reserve.
    pub(crate) fn commit_as(&mut self, room: Room) -> Result<()> {
        // Empty commits (most of the commit interval's) are not counted.
        let busy = !(self.group.is_empty() && self.bufs.is_empty());
        let start = std::time::Instant::now();
        let r = self.commit_now(room);
        if busy {
            crate::stats::op_times().commit.since(start, 0);
        }
        r
    }

    fn commit_now(&mut self, room: Room) -> Result<()> {
        self.cache.moved();
        if !self.bufs.is_empty() {
            self.store_buffers_or_clean(room)?;
        }
        let changed = !self.group.pending().events.is_empty();
        let Some(mut b) = self.group.seal(self.eng.device_bytes_written(), room, self.eng.seq() + 1) else {
            return Ok(());
        };
        match self.eng.write(&b).map_err(Error::from) {
            // The group was accepted against the room counted then, which
            // the index and checkpoints may have taken since: its journal
            // record (a group is bounded to a fraction of a segment) may
            // use the part of the reserve deletes may use, rather than
            // fail every later change. Nothing was placed by the failure.
            Err(Error::NoSpace(_)) if room == Room::User => {
                b.room = Room::Relieve;
                self.eng.write(&b)?;
            }
            r => {
                r?;
            }
        }
        self.group.committed();
        self.stats.commits += 1;
        if self.stats.commits % PRUNE_EVERY == 1 {
            // Old change records go in the next group (after the first
            // commit of an open, then every PRUNE_EVERY).
            if let Err(e) = self.prune_changes() {
                self.background_error("dropping old change records", &e);
            }
        }
        self.space_hint = self.free_now();
        if changed {
            if let Err(e) = self.auto_point() {
                self.background_error("taking or thinning automatic points of history", &e);
            }
        }
        Ok(())
    }

    /// Store the buffers; when the log is full, clean and try once more,
    /// then, since the data was accepted, with the part of the reserve
    /// deletes may use (the index and checkpoints may have taken the room
    /// counted when it was accepted).
    fn store_buffers_or_clean(&mut self, room: Room) -> Result<()> {
        match self.store_dirty(room) {
            Err(Error::NoSpace(_)) if !self.cleaning => {
                match self.make_room(self.bufs.bytes() as u64) {
                    // Cleaning found no room: the part of the reserve
                    // below may still hold what was accepted.
                    Ok(()) | Err(Error::NoSpace(_)) => {}
                    Err(e) => return Err(e),
                }
                match self.store_dirty(room) {
                    Err(Error::NoSpace(_)) if room == Room::User => self.store_dirty(Room::Relieve),
                    r => r,
                }
            }
            r => r,
        }
    }

    /// Before buffering `len` more bytes: when the buffered data could
    /// outgrow the free log (counted uncompressed), commit first to learn
    /// what it really takes; ENOSPC when the log is full. True when it
    /// committed: a caller's copy of an inode read before is stale.
    pub(crate) fn pre_write(&mut self, len: usize) -> Result<bool> {
        if (self.bufs.bytes() + len) as u64 <= self.space_hint {
            return Ok(false);
        }
        self.commit()?;
        self.space_hint = self.free_now();
        if len as u64 > self.space_hint {
            // Blocks freed by deletes count as free once their journal
            // record is durable: sync, and look again.
            self.eng.sync()?;
            self.space_hint = self.free_now();
        }
        if len as u64 > self.space_hint && !self.cleaning {
            // Clean segments with dead space until the write fits.
            self.make_room(len as u64)?;
        }
        if len as u64 > self.space_hint {
            return Err(Error::NoSpace(format!(
                "{} bytes free in the log for a write of {len} bytes",
                self.space_hint
            )));
        }
        Ok(true)
    }

    /// Free log bytes for writes other than into reserved chunks: the
    /// free segments outside the reserve, less what fallocate reserved.
    pub(crate) fn free_now(&self) -> u64 {
        self.eng.free_bytes().saturating_sub(self.group.counters().reserved)
    }

    /// All the room a writer could make (what statfs shows): what its
    /// room check would grant (free segments, and what cleaning for room
    /// gives back), less what fallocate reserved, with what only automatic
    /// points of history hold counted free (a writer short of room drops
    /// them).
    pub(crate) fn room_with_history(&mut self) -> Result<u64> {
        let purgeable = self.purgeable_by_segment()?;
        let free = self.eng.writable_bytes_freeing(WRITER_MAX_LIVE, &purgeable);
        Ok(free.saturating_sub(self.group.counters().reserved))
    }

    /// Before an operation that adds about `len` bytes of records (a new
    /// inode, name or xattr): the group must still fit outside the
    /// reserve once it holds them, so that it can always be committed. A
    /// group that cannot would fail every later change, deletes too. So
    /// commit first when the log may be short of room, and answer ENOSPC
    /// when it is: the room left in the log's current segment and the
    /// free ones counts here, as the commit places its records there.
    pub(crate) fn pre_grow(&mut self, len: usize) -> Result<()> {
        let need = |st: &State| (st.bufs.bytes() + st.group.bytes() + len) as u64;
        if need(self) <= self.space_hint {
            return Ok(());
        }
        self.commit()?;
        let room = |st: &State| st.eng.room_bytes(Room::User);
        if need(self) > room(self) {
            self.eng.sync()?;
        }
        if need(self) > room(self) && !self.cleaning {
            self.make_room(need(self))?;
        }
        if need(self) > room(self) {
            return Err(Error::NoSpace(format!(
                "{} bytes of room in the log for {len} bytes of new records",
                room(self)
            )));
        }
        Ok(())
    }

    /// Before an operation that only removes or shrinks (unlink, rmdir,
    /// rename, truncate, a punched hole): when the log is short of room
    /// and the group holds new records or data, commit it first, while
    /// it fits outside the reserve, so that the removal commits on its
    /// own and may use the part of the reserve kept for it.
    pub(crate) fn pre_relieve(&mut self) -> Result<()> {
        self.bound_group()?;
        let seg = u64::from(self.eng.superblock().geometry.segment_size);
        let held = (self.group.bytes() + self.bufs.bytes()) as u64;
        if (self.group.grew() || !self.bufs.is_empty()) && self.space_hint < held + 4 * seg {
            self.commit()?;
        }
        Ok(())
    }
}
