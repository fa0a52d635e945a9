//! Automatic points of history (issue 28): with a retention policy set
//! ([`Policy`], record 0x05), the state after a commit of users' changes
//! becomes a point, kept as a named snapshot is (its name is `@` and its
//! time), under every commit while the policy keeps every point, else
//! under the first commit of each hour. Thinning drops the points the
//! policy no longer keeps; a writer that finds no room drops the oldest
//! automatic points before it gets ENOSPC. Named snapshots are never
//! dropped.

use crate::error::{Error, Result};
use crate::keys::*;
use crate::retention::Policy;
use crate::state::State;
use crate::time::now;
use crate::Fs;

/// Dropping for room takes this share of the automatic points at once.
const DROP_SHARE: usize = 8;

/// Seconds between thinning passes.
const THIN_EVERY: i64 = 60;

const HOUR: i64 = 3600;

/// The name of the automatic point `s`: its time, and its sequence
/// number (several commits may share a millisecond).
fn point_name(s: Snapshot) -> String {
    format!("{AUTO}{}#{}", humantime::format_rfc3339_millis(s.time.to_system()), s.seq)
}

impl State {
    /// The automatic points whose records are committed, oldest first:
    /// (key, point). (One just taken is not among them until its group
    /// commits: dropping it from a group set aside would bring it back.)
    fn auto_points(&self) -> Result<Vec<(Vec<u8>, Snapshot)>> {
        // '@' + 1 is 'A': the range of names that start with '@'.
        let (lo, hi) = (snapshot_key(b"@"), snapshot_key(b"A"));
        let mut out = Vec::new();
        for (k, v) in self.eng.scan(&lo, Some(&hi), usize::MAX)? {
            out.push((k.clone(), Snapshot::decode(&v, &describe_key(&k))?));
        }
        out.sort_by_key(|(_, s)| s.seq);
        Ok(out)
    }

    /// After a commit of users' changes: take a point if the policy wants
    /// one now, and thin the points once a minute.
    pub(crate) fn auto_point(&mut self) -> Result<()> {
        let p = self.group.policy();
        if !p.keeps_any() || self.read_only || self.cleaning {
            return Ok(());
        }
        let t = now();
        let last = self.group.last_point();
        let hour = |x: Time| x.sec.div_euclid(HOUR);
        if p.all > 0 || last.is_none_or(|l| hour(l) != hour(t)) {
            let s = Snapshot { seq: self.eng.seq(), time: t };
            self.put(snapshot_key(point_name(s).as_bytes()), s.encode());
            let mut seqs = self.group.snapshots().to_vec();
            seqs.push(s.seq);
            self.eng.set_retained(seqs.clone());
            self.group.set_snapshots(seqs);
            self.group.start_recording();
            self.group.mark_version(8);
            self.group.set_last_point(t);
        }
        if self.group.thinned_at().is_none_or(|at| t.sec - at >= THIN_EVERY) {
            self.group.set_thinned_at(t.sec);
            self.thin_points(t.sec)?;
        }
        // Room runs short: the oldest points go now, while dropping them
        // and cleaning what they held still find room, rather than at the
        // edge.
        if self.short_of_history_room() {
            self.drop_oldest_points(1)?;
        }
        Ok(())
    }

    /// Whether history's room is short: the log bytes no live block
    /// takes (free segments and the dead space cleaning gives back), less
    /// what fallocate reserved, are under a quarter of the log (at least
    /// four segments), so that history never makes the cleaner work in a
    /// log more than three quarters full. Blocks only points hold count
    /// as taken. (Free segments alone would not do: a log that has
    /// wrapped keeps few, and history would be dropped at every commit.)
    pub(crate) fn short_of_history_room(&self) -> bool {
        let seg = u64::from(self.eng.superblock().geometry.segment_size);
        let (usable, free) = self.eng.capacity();
        free.saturating_sub(self.group.counters().reserved) < (usable / 4).max(4 * seg)
    }

    /// Drop the automatic points the policy does not keep at `now`
    /// (seconds), and free what only they read; committed. The number
    /// dropped.
    pub(crate) fn thin_points(&mut self, now: i64) -> Result<usize> {
        let points = self.auto_points()?;
        let times: Vec<i64> = points.iter().map(|(_, s)| s.time.sec).collect();
        let keep = self.group.policy().keep(&times, now);
        let gone: Vec<_> = points.into_iter().zip(keep).filter(|(_, k)| !k).map(|(p, _)| p).collect();
        self.drop_points(&gone)?;
        Ok(gone.len())
    }

    /// Delete points (keys and points), then free the held blocks no
    /// point left reads; committed, with the writers' buffered data and
    /// pending changes set aside meanwhile (as a cleaning round does),
    /// since a writer short of room runs this inside its commit.
    fn drop_points(&mut self, gone: &[(Vec<u8>, Snapshot)]) -> Result<()> {
        if gone.is_empty() {
            return Ok(());
        }
        self.aside(|st, _| {
            let mut seqs = st.group.snapshots().to_vec();
            for (k, s) in gone {
                st.del(k.clone());
                if let Some(i) = seqs.iter().position(|&x| x == s.seq) {
                    seqs.remove(i);
                }
            }
            st.group.set_snapshots(seqs);
            st.release_held().map(|_| ())
        })
    }

    /// Drop the oldest automatic points for room, keeping the newest
    /// `keep`: an eighth of them at a time (at least one), since each
    /// drop reads every held free once. The number dropped.
    pub(crate) fn drop_oldest_points(&mut self, keep: usize) -> Result<usize> {
        let mut points = self.auto_points()?;
        let n = (points.len() / DROP_SHARE).max(1).min(points.len().saturating_sub(keep));
        if n == 0 {
            return Ok(0);
        }
        points.truncate(n);
        tracing::info!(
            "the file system is short of room: dropping the {n} oldest automatic points of history, {} to {}",
            String::from_utf8_lossy(&points[0].0[1..]),
            String::from_utf8_lossy(&points[n - 1].0[1..])
        );
        self.drop_points(&points)?;
        self.stats.points_dropped += n as u64;
        Ok(n)
    }
}

impl Fs {
    /// The retention policy of automatic points.
    pub fn history_policy(&self) -> Policy {
        self.st().group.policy()
    }

    /// Set the retention policy of automatic points; durable when this
    /// returns. `none` stops taking them and drops those taken.
    pub fn set_history_policy(&self, p: Policy) -> Result<()> {
        let mut st = self.st();
        if st.read_only {
            return Err(Error::read_only("the file system is open read-only: the policy cannot change"));
        }
        st.pre_op()?;
        st.group.set_policy(p);
        st.put(policy_key(), p.to_string().into_bytes());
        st.group.mark_version(8);
        st.commit()?;
        st.thin_points(now().sec)?;
        drop(st);
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, MemStore};

    use super::*;
    use crate::{FsOptions, MkfsOptions, ROOT};

    /// Under "every commit for an hour", each commit of changes is a
    /// point that reads as the tree was; thinning three days later keeps
    /// the last of the day (and the newest); "none" drops them all; fsck
    /// stays clean and what only dropped points held is freed.
    #[test]
    fn every_commit_is_a_point_until_thinned() {
        let policy: Policy = "all:1h,hourly:2d,daily:31d".parse().unwrap();
        let (store, fs) = crate::testing::fresh_on(
            Arc::new(MemStore::new(Geometry { segment_size: 1 << 20, segment_count: 32 })),
            &MkfsOptions { history: policy, ..MkfsOptions::default() },
            crate::testing::quiet(FsOptions::default()),
        );
        assert_eq!(fs.history_policy(), policy);
        let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
        let data = |n: u32| -> Vec<u8> {
            (0..100_000u32).map(|i| ((i ^ (n << 20)).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
        };
        let mut versions = Vec::new();
        for n in 0..4u32 {
            fs.write(a.ino, 0, &data(n)).unwrap();
            fs.commit().unwrap();
            versions.push(fs.engine().seq());
        }
        fs.sync().unwrap();
        let points = fs.st().auto_points().unwrap();
        assert!(points.len() >= 4, "a point per commit: {}", points.len());
        assert!(points.iter().all(|(k, _)| k[1] == b'@'));
        let held = fs.held_bytes().unwrap();
        assert!(held >= 300_000, "the overwritten versions are held: {held}");
        let tokens: Vec<String> = versions.iter().map(|&s| fs.clock(s)).collect();
        fs.close().unwrap();
        for (n, t) in tokens.iter().enumerate() {
            let view = Fs::open(
                store.clone(),
                FsOptions {
                    read_only: true,
                    at: Some(t.clone()),
                    commit_interval: None,
                    ..FsOptions::default()
                },
            )
            .unwrap();
            assert!(view.read(a.ino, 0, 100_000).unwrap() == data(n as u32), "point {n}");
        }
        let fs =
            Fs::open(store.clone(), FsOptions { commit_interval: None, ..FsOptions::default() }).unwrap();
        let dropped = fs.st().thin_points(now().sec + 3 * 86_400).unwrap();
        let left = fs.st().auto_points().unwrap().len();
        assert_eq!(left, 1, "the last of the day, also the newest ({dropped} dropped)");
        assert!(fs.held_bytes().unwrap() < held, "what only the dropped points read is freed");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
        fs.set_history_policy(Policy::NONE).unwrap();
        assert!(fs.st().auto_points().unwrap().is_empty(), "none drops them all");
        assert_eq!(fs.held_bytes().unwrap(), 0);
        assert!(matches!(fs.snapshot_create("@mine"), Err(Error::Invalid(_))), "'@' names are the points'");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }
}
