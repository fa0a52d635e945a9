//! Named snapshots (issue 28, first step of docs/decisions/2026-11-25-history-design.md):
//! a snapshot is a sequence number the index keeps every record version
//! at (`Engine::set_retained`), and, while any snapshot exists, the blocks
//! a commit stops using are held ([`crate::keys::held_key`]) instead of
//! freed, and the cleaner moves nothing. Deleting a snapshot frees the
//! held blocks no remaining snapshot can read: those freed at or before
//! the oldest one left (a block freed at sequence number `died` was
//! readable only below it).

use zlogfs_engine::engine::Engine;

use crate::error::{Error, Result};
use crate::filesystem::now;
use crate::keys::*;
use crate::state::State;
use crate::Fs;

/// Held frees made per commit group when a snapshot is deleted.
const RELEASE_STEP: usize = 4096;

/// The snapshot called `name` of the image open on `eng`.
pub(crate) fn find(eng: &Engine, name: &str) -> Result<Snapshot> {
    match eng.get(&snapshot_key(name.as_bytes()))? {
        Some(v) => Ok(Snapshot::decode(&v, &format!("snapshot {name:?}"))?),
        None => Err(Error::not_found(format!("no snapshot called {name:?} (zlogfs snapshot list)"))),
    }
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "snapshot name {name:?}: 1 to 255 bytes, no '/', no control characters, not . or .."
        )))
    }
}

impl State {
    /// Make the held frees that no snapshot can read any more (freed at or
    /// before the oldest one left), deleting their records with them, in
    /// groups of [`RELEASE_STEP`]; committed. Run by a snapshot's delete,
    /// and at open, where it finishes a delete a crash cut short (its
    /// record gone in its first group, some held frees left). Returns the
    /// bytes freed.
    pub(crate) fn release_held(&mut self) -> Result<u64> {
        let oldest = self.group.snapshots().first().copied().unwrap_or(u64::MAX);
        let (lo, hi) = all_held_range();
        let held = self.scan(&lo, &hi, usize::MAX)?;
        let mut freed = 0u64;
        for (n, (k, _)) in held.into_iter().enumerate() {
            let Some((a, died, _)) = parse_held_key(&k) else {
                return Err(Error::corrupt(describe_key(&k), "a malformed held free"));
            };
            if died <= oldest {
                self.group.release(a);
                self.del(k);
                freed += u64::from(a.len);
            }
            if n % RELEASE_STEP == RELEASE_STEP - 1 {
                self.commit()?;
            }
        }
        self.drop_forwards()?;
        self.commit()?;
        Ok(freed)
    }
}

impl Fs {
    /// Take a snapshot called `name` of everything accepted so far; durable
    /// when this returns.
    pub fn snapshot_create(&self, name: &str) -> Result<Snapshot> {
        check_name(name)?;
        let mut st = self.st();
        if st.read_only {
            return Err(Error::read_only("the file system is open read-only: no snapshot can be taken"));
        }
        st.pre_op()?;
        if st.get(&snapshot_key(name.as_bytes()))?.is_some() {
            return Err(Error::exists(format!("a snapshot called {name:?} exists")));
        }
        st.commit()?;
        let snap = Snapshot { seq: st.eng.seq(), time: now() };
        st.put(snapshot_key(name.as_bytes()), snap.encode());
        st.group.start_recording();
        let mut seqs = st.group.snapshots().to_vec();
        seqs.push(snap.seq);
        st.eng.set_retained(seqs.clone());
        st.group.set_snapshots(seqs);
        st.group.mark_version(FS_VERSION);
        st.commit()?;
        drop(st);
        self.sync()?;
        Ok(snap)
    }

    /// The snapshots, by name.
    pub fn snapshots(&self) -> Result<Vec<(String, Snapshot)>> {
        let st = self.st();
        let (lo, hi) = snapshots_range();
        let mut out = Vec::new();
        for (k, v) in st.scan(&lo, &hi, usize::MAX)? {
            let name = String::from_utf8_lossy(&k[1..]).into_owned();
            out.push((name.clone(), Snapshot::decode(&v, &format!("snapshot {name:?}"))?));
        }
        Ok(out)
    }

    /// Stored bytes held for snapshots: blocks the present no longer uses.
    pub fn held_bytes(&self) -> Result<u64> {
        let st = self.st();
        let (lo, hi) = all_held_range();
        Ok(st
            .scan(&lo, &hi, usize::MAX)?
            .iter()
            .filter_map(|(k, _)| parse_held_key(k))
            .map(|(a, _, _)| u64::from(a.len))
            .sum())
    }

    /// The snapshots, oldest first, each with the bytes deleting it
    /// alone would free now: held blocks are freed by the delete that
    /// leaves no snapshot at or before their free, so only the oldest
    /// snapshot frees any (those freed up to the next one).
    pub fn snapshot_usage(&self) -> Result<Vec<(String, Snapshot, u64)>> {
        let mut snaps = self.snapshots()?;
        snaps.sort_by_key(|(_, s)| s.seq);
        let next = snaps.get(1).map_or(u64::MAX, |(_, s)| s.seq);
        let st = self.st();
        let (lo, hi) = all_held_range();
        let mut oldest_frees = 0u64;
        for (k, _) in st.scan(&lo, &hi, usize::MAX)? {
            match parse_held_key(&k) {
                Some((a, died, _)) if died <= next => oldest_frees += u64::from(a.len),
                Some(_) => {}
                None => return Err(Error::corrupt(describe_key(&k), "a malformed held free")),
            }
        }
        Ok(snaps
            .into_iter()
            .enumerate()
            .map(|(i, (n, s))| (n, s, if i == 0 { oldest_frees } else { 0 }))
            .collect())
    }

    /// Delete the snapshot called `name`, and free the blocks only it
    /// held; durable when this returns. Returns the bytes freed.
    pub fn snapshot_delete(&self, name: &str) -> Result<u64> {
        let mut st = self.st();
        if st.read_only {
            return Err(Error::read_only("the file system is open read-only: no snapshot can be deleted"));
        }
        st.pre_relieve()?;
        let key = snapshot_key(name.as_bytes());
        let Some(v) = st.get(&key)? else {
            return Err(Error::not_found(format!("no snapshot called {name:?} (zlogfs snapshot list)")));
        };
        let gone = Snapshot::decode(&v, &format!("snapshot {name:?}"))?;
        st.del(key);
        let mut seqs = st.group.snapshots().to_vec();
        if let Some(i) = seqs.iter().position(|&s| s == gone.seq) {
            seqs.remove(i);
        }
        st.group.set_snapshots(seqs.clone());
        let freed = st.release_held()?;
        // Versions only the deleted snapshot kept may be merged away now
        // that its record is gone for good.
        st.eng.set_retained(seqs);
        drop(st);
        self.sync()?;
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, MemStore, Store};

    use crate::keys::{all_held_range, snapshot_key};
    use crate::{mkfs, Fs, FsOptions, MkfsOptions, ROOT};

    fn open(store: &Arc<dyn Store>) -> Fs {
        Fs::open(store.clone(), FsOptions { commit_interval: None, ..FsOptions::default() }).unwrap()
    }

    /// A delete cut short after its first group (the snapshot's record
    /// gone, held frees left) is finished by the next open.
    #[test]
    fn the_next_open_finishes_an_interrupted_delete() {
        let store: Arc<dyn Store> =
            Arc::new(MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 16 }));
        mkfs(store.clone(), &MkfsOptions::default()).unwrap();
        let fs = open(&store);
        let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        fs.write(a.ino, 0, &vec![7u8; 200_000]).unwrap();
        fs.snapshot_create("s").unwrap();
        fs.write(a.ino, 0, &vec![8u8; 200_000]).unwrap();
        fs.sync().unwrap();
        let (lo, hi) = all_held_range();
        {
            let mut st = fs.st();
            assert!(!st.scan(&lo, &hi, usize::MAX).unwrap().is_empty(), "frees are held");
            // The first group of the delete, and no more.
            st.del(snapshot_key(b"s"));
            st.group.set_snapshots(Vec::new());
            st.commit().unwrap();
        }
        fs.sync().unwrap();
        let live = fs.engine().stats().live_bytes;
        drop(fs);
        let fs = open(&store);
        assert!(fs.st().scan(&lo, &hi, usize::MAX).unwrap().is_empty(), "the held frees were made");
        assert!(fs.engine().stats().live_bytes < live, "and their bytes freed");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }
}
