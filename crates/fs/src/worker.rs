//! The commit thread: commits and syncs at the commit interval, and
//! cleans in the background when free segments run low.

use std::sync::{Arc, Weak};
use std::time::Duration;

use zlogfs_engine::engine::Engine;

use crate::clean::CLEAN_BURST;
use crate::filesystem::Inner;
use crate::{lock, CleanOptions, CleanReport};

pub(crate) fn commit_loop(w: Weak<Inner>, eng: Arc<Engine>, iv: Duration) {
    loop {
        let Some(inner) = w.upgrade() else { return };
        {
            let stop = lock(&inner.stop);
            if *stop {
                return;
            }
            let (stop, _) = inner.wake.wait_timeout(stop, iv).unwrap_or_else(|p| p.into_inner());
            if *stop {
                return;
            }
        }
        let busy = {
            let mut st = lock(&inner.st);
            let busy = !st.group.is_empty() || !st.bufs.is_empty();
            // An error here is reported again by the next operation that
            // needs the engine (it latches); nothing is lost by waiting.
            busy && st.commit().is_ok()
        };
        if busy {
            let _ = eng.sync();
        }
        // Clean in the background when free segments run low, a round at a
        // time so that requests are served in between. An error latches
        // the engine or is met again by the writer that needs the space.
        let g = eng.superblock().geometry;
        // Few: free segments kept idle are space the cleaner cannot use to
        // let dead bytes gather, and with a tenth of the image kept free,
        // 4 KiB random overwrites of a 70%-full image wrote 5.0 device
        // bytes per byte against 3.8 with 6 segments (docs/BENCHMARKS.md).
        // A writer that finds no room cleans for itself (`clean_for`).
        // Both clean in bursts (`CLEAN_BURST`).
        let low = (g.segment_count / 64).max(6);
        let es = eng.stats();
        if es.free_segments + es.pinned_segments < low {
            let opts = CleanOptions {
                max_live: 0.8,
                target_free: Some(low + CLEAN_BURST),
                ..CleanOptions::default()
            };
            let (mut rep, mut tried) = (CleanReport::default(), std::collections::HashSet::new());
            while !*lock(&inner.stop) {
                match lock(&inner.st).clean_round(&opts, &mut rep, &mut tried) {
                    Ok(true) => {}
                    _ => break,
                }
            }
        }
    }
}
