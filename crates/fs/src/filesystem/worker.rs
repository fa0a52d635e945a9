//! The commit thread: commits and syncs at the commit interval, and
//! cleans in the background when free segments run low.

use std::sync::{Arc, Weak};
use std::time::Duration;

use zlogfs_engine::engine::{Engine, EngineStats};

use crate::clean::{demote_marks, CLEAN_BURST};
use crate::state::handle::Inner;
use crate::{lock, CleanOptions, CleanReport};

pub(crate) fn commit_loop(w: Weak<Inner>, eng: Arc<Engine>, iv: Duration) {
    loop {
        let Some(inner) = w.upgrade() else { return };
        if !wait(&inner, iv) {
            return;
        }
        commit_and_sync(&inner, &eng);
        clean_if_low(&inner, &eng);
    }
}

/// Wait for the interval; false when the file system is closing.
fn wait(inner: &Inner, iv: Duration) -> bool {
    let stop = lock(&inner.stop);
    if *stop {
        return false;
    }
    let (stop, _) = inner.wake.wait_timeout(stop, iv).unwrap_or_else(|p| p.into_inner());
    !*stop
}

/// Commit what the interval gathered, and make it and every group
/// committed since the last sync durable: groups a bound committed, a
/// cleaning pass's moves (a sync with nothing new to make durable costs a
/// comparison). A failure is logged and counted; the next operation that
/// needs the engine meets it again (a failed write or sync latches the
/// engine), so nothing is lost by waiting.
fn commit_and_sync(inner: &Inner, eng: &Engine) {
    {
        let mut st = lock(&inner.st);
        if !st.group.is_empty() || !st.bufs.is_empty() {
            if let Err(e) = st.commit() {
                st.background_error("the interval's commit", &e);
                return;
            }
        }
    }
    if let Err(e) = eng.sync() {
        lock(&inner.st).background_error("the interval's sync", &e.into());
    }
}

/// Clean in the background when free segments run low, a round at a time
/// so that requests are served in between. A failure is logged and
/// counted; it latches the engine or is met again by the writer that needs
/// the space.
fn clean_if_low(inner: &Inner, eng: &Engine) {
    let g = eng.superblock().geometry;
    // Few: free segments kept idle are space the cleaner cannot use to
    // let dead bytes gather, and with a tenth of the image kept free,
    // 4 KiB random overwrites of a 70%-full image wrote 5.0 device
    // bytes per byte against 3.8 with 6 segments
    // (docs/decisions/2026-11-23-few-free-segments-kept.md).
    // A writer that finds no room cleans for itself (`clean_for`).
    // Both clean in bursts (`CLEAN_BURST`). Four above the reserve, as
    // with the reserve of 2 that measurement had.
    let es = eng.stats();
    let low = (g.segment_count / 64).max(es.reserve_segments + 4);
    demote_if_fast_low(inner, eng, &es);
    // A check holding the segments it reads (`Engine::read_pin`): those
    // emptied now could not be taken until it ends (a writer short of
    // room breaks it).
    if es.free_segments + es.pinned_segments >= low || eng.read_pinned() {
        return;
    }
    let opts =
        CleanOptions { max_live: 0.8, target_free: Some(low + CLEAN_BURST), ..CleanOptions::default() };
    rounds(inner, &opts, "background cleaning");
}

/// Cleaning rounds with `opts` until there is nothing (more) to do or the
/// worker stops, the lock let go between them; a failure is logged and
/// counted as `what`'s.
fn rounds(inner: &Inner, opts: &CleanOptions, what: &str) -> CleanReport {
    let (mut rep, mut tried) = (CleanReport::default(), std::collections::HashSet::new());
    while !*lock(&inner.stop) {
        let mut st = lock(&inner.st);
        match st.clean_round(opts, &mut rep, &mut tried) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                st.background_error(what, &e);
                break;
            }
        }
        drop(st);
        // Writers waiting for the lock get it between rounds.
        std::thread::yield_now();
    }
    rep
}

/// Of two devices: when the fast one runs short of free segments (under
/// a sixteenth, at least 2) while the bulk one has room, move the file
/// data of its oldest segments down, a round at a time, until an eighth
/// (at least 4) is free. New small files then land on the fast device and
/// cold ones wait on the bulk one; the index runs that reclaiming
/// rewrites stay up.
fn demote_if_fast_low(inner: &Inner, eng: &Engine, es: &EngineStats) {
    let Some(bulk) = &es.bulk else { return };
    // While a check holds the segments it reads, those it empties on the
    // fast device could not be taken (see `clean_if_low`).
    if eng.read_pinned() {
        return;
    }
    let fast = &es.fast;
    let (low, target) = demote_marks(fast.segments);
    if fast.free_segments >= low || bulk.free_segments < target + CLEAN_BURST {
        return;
    }
    // A pass that could not reach the target is not tried again until
    // something was committed since (as `clean_for` does).
    let commits = lock(&inner.st).stats.commits;
    if lock(&inner.st).demote_futile_at == Some(commits) {
        return;
    }
    let opts = CleanOptions {
        max_live: 1.0,
        target_free: Some(target),
        demote: true,
        written_before: Some(eng.next_batch()),
        ..CleanOptions::default()
    };
    let rep = rounds(inner, &opts, "moving cold data to the bulk device");
    let now = eng.stats().fast.free_segments;
    let mut st = lock(&inner.st);
    st.demote_futile_at = (now < target).then_some(st.stats.commits);
    drop(st);
    if rep.freed > 0 {
        tracing::info!(
            "moved {} bytes of cold data to the bulk device, freeing {} fast segments",
            rep.moved_bytes,
            rep.freed
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use zlogfs_engine::store::{CrashMode, FaultConfig, FaultStore, Geometry, Store};

    use crate::{mkfs, Fs, FsOptions, MkfsOptions, ROOT};

    #[test]
    fn a_failed_interval_commit_is_logged_and_counted() {
        let store = Arc::new(FaultStore::new(Geometry { segment_size: 1 << 20, segment_count: 16 }));
        mkfs(store.clone(), &MkfsOptions::default()).unwrap();
        let opts = FsOptions { commit_interval: Some(Duration::from_millis(20)), ..FsOptions::default() };
        let fs = Fs::open(store.clone(), opts).unwrap();
        let a = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
        // Every device operation from now on fails (the counters restart at 0).
        store.set_faults(FaultConfig { fail_at: Some(1), persistent: true, ..Default::default() });
        fs.write(a.ino, 0, &[7u8; 10_000]).unwrap();
        let t = Instant::now();
        while fs.stats().background_errors == 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = fs.stats();
        assert!(s.background_errors > 0, "the commit thread's failure was not counted");
        let last = s.last_background_error.unwrap_or_default();
        assert!(last.contains("the interval's"), "{last}");
        // The failure stays: the next operation that needs the engine says so.
        assert!(fs.sync().is_err());
    }

    /// Once the engine latches (a write or sync failed), every operation
    /// that would change the file system fails at once (issue 44, item
    /// 3: they returned success and were never stored); reads go on.
    #[test]
    fn a_latched_file_system_refuses_every_change() {
        let store = Arc::new(FaultStore::new(Geometry { segment_size: 1 << 20, segment_count: 16 }));
        mkfs(store.clone(), &MkfsOptions::default()).unwrap();
        let fs =
            Fs::open(store.clone(), FsOptions { commit_interval: None, ..FsOptions::default() }).unwrap();
        let a = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
        let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
        fs.write(a.ino, 0, b"kept").unwrap();
        fs.sync().unwrap();
        store.set_faults(FaultConfig { fail_at: Some(1), persistent: true, ..Default::default() });
        fs.write(a.ino, 4, b" lost").unwrap();
        assert!(fs.sync().is_err(), "the sync fails and latches");
        store.set_faults(FaultConfig::default());
        let latched = |r: crate::Result<()>, what: &str| match r {
            Err(crate::Error::Engine(zlogfs_engine::Error::Failed)) => {}
            r => panic!("{what} on a latched file system: {r:?}"),
        };
        latched(fs.create(ROOT, b"g", 0o644, 0, 0).map(drop), "create");
        latched(fs.mkdir(ROOT, b"e", 0o755, 0, 0).map(drop), "mkdir");
        latched(fs.write(a.ino, 0, b"x").map(drop), "write");
        latched(fs.rename(ROOT, b"f", ROOT, b"h", 0), "rename");
        latched(fs.unlink(ROOT, b"f"), "unlink");
        latched(fs.rmdir(ROOT, b"d"), "rmdir");
        latched(fs.setxattr(a.ino, b"user.x", b"1", 0), "setxattr");
        let trunc = crate::SetAttr { size: Some(0), ..Default::default() };
        latched(fs.setattr(a.ino, &trunc).map(drop), "truncate");
        latched(fs.symlink(ROOT, b"s", b"f", 0, 0).map(drop), "symlink");
        latched(fs.link(a.ino, d.ino, b"l").map(drop), "link");
        // Reads still answer, from what was stored.
        assert_eq!(fs.read(a.ino, 0, 4).unwrap(), b"kept");
        assert!(fs.lookup(ROOT, b"g").is_err());
    }

    #[test]
    fn a_group_committed_between_intervals_is_synced_at_the_next() {
        let store = Arc::new(FaultStore::new(Geometry { segment_size: 1 << 20, segment_count: 16 }));
        mkfs(store.clone(), &MkfsOptions::default()).unwrap();
        let opts = FsOptions { commit_interval: Some(Duration::from_millis(20)), ..FsOptions::default() };
        let fs = Fs::open(store.clone(), opts).unwrap();
        let a = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
        fs.write(a.ino, 0, b"durable by the interval").unwrap();
        // Written, not synced; the group is empty when the thread looks.
        fs.commit().unwrap();
        let synced = store.sync_count();
        let t = Instant::now();
        while store.sync_count() == synced && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(fs);
        store.power_cut(CrashMode::DropUnsynced, 1);
        let dyn_store: Arc<dyn Store> = store;
        let fs = Fs::open(dyn_store, FsOptions { commit_interval: None, ..FsOptions::default() }).unwrap();
        let a = fs.lookup(ROOT, b"f").expect("the file survives the power cut");
        assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"durable by the interval");
    }
}
