//! The background thread: flushes frozen memtables and merges runs, so
//! that writers do not wait for either.

use std::sync::atomic::Ordering as AtOrd;
use std::sync::Arc;

use crate::error::Result;

use super::{lock, Engine, Shared};

#[derive(Default)]
pub(super) struct BgState {
    stop: bool,
    work: bool,
    error: Option<String>,
}

pub(super) fn background(sh: Arc<Shared>) {
    let e = Engine { sh, worker: None };
    loop {
        {
            let (m, cv) = &e.sh.bg;
            let mut st = lock(m);
            while !st.stop && !st.work {
                st = cv
                    .wait_timeout(st, std::time::Duration::from_secs(1))
                    .map(|r| r.0)
                    .unwrap_or_else(|p| p.into_inner().0);
                if !e.version().frozen.is_empty() || e.merge_due() {
                    break;
                }
            }
            if st.stop {
                break;
            }
            st.work = false;
        }
        if e.sh.failed.load(AtOrd::Acquire) {
            continue;
        }
        let r = (|| -> Result<()> {
            while e.flush_frozen()? {}
            e.maybe_merge()
        })();
        if let Err(err) = r {
            // Latched: every later write says so, and this says why.
            tracing::error!("the index's background flush or merge failed, the engine stops writing: {err}");
            lock(&e.sh.bg.0).error = Some(err.to_string());
            e.sh.failed.store(true, AtOrd::Release);
        }
    }
}

impl Engine {
    pub(super) fn kick(&self) {
        let (m, cv) = &self.sh.bg;
        lock(m).work = true;
        cv.notify_one();
    }

    pub(super) fn stop_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            {
                let (m, cv) = &self.sh.bg;
                lock(m).stop = true;
                cv.notify_all();
            }
            let _ = w.join();
        }
    }

    /// The error that stopped the background thread, if any.
    pub fn background_error(&self) -> Option<String> {
        lock(&self.sh.bg.0).error.clone()
    }
}
