//! The file system a long-running front end serves, which a read-only
//! mount of an image that another process writes (an image in a bucket)
//! replaces with a newer state as the writer moves on.
//!
//! Each request takes the current [`Fs`] and finishes on it: a replaced
//! one keeps serving the requests that hold it (its store keeps its state,
//! see `Store::refresh`) and goes when the last lets go.
//!
//! A thread of the mount calls [`Live::refresh`] every `refresh` seconds.
//! If the new `Fs` fails to open, `Live` keeps its store and tries it
//! again at the next refresh. The FUSE adapter drops its listings and
//! reopens its `.snapshots` views (same node ids) when
//! [`Live::generation`] moves. A control request holds the `Live`
//! ([`Live::hold`]), so that no refresh runs under an fsck or scrub.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use zlogfs_engine::store::Store;

use crate::{Fs, FsOptions, Result};

/// See the module documentation.
pub struct Live {
    cur: RwLock<Arc<Fs>>,
    /// Bumped at each replacement (front ends drop what they cached).
    generation: AtomicU64,
    /// How a newer state opens: the first open's options; None when this
    /// file system does not follow.
    follow: Option<FsOptions>,
    /// One refresh at a time. Holds the store of a newer state whose file
    /// system did not open (the current one's store is retired by then):
    /// the next refresh tries it again.
    refreshing: Mutex<Option<Arc<dyn Store>>>,
    /// Operations that must finish on one state (a whole-image check);
    /// no refresh while there are any.
    holds: AtomicUsize,
}

/// While alive, the [`Live`] it came from is not replaced.
pub struct Hold<'a>(&'a Live);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.holds.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Live {
    /// `fs`, never replaced.
    pub fn fixed(fs: Arc<Fs>) -> Live {
        Live {
            cur: RwLock::new(fs),
            generation: AtomicU64::new(0),
            follow: None,
            refreshing: Mutex::new(None),
            holds: AtomicUsize::new(0),
        }
    }

    /// `fs`, opened read-only with `opts`, replaced by [`Live::refresh`]
    /// when its store has a newer state.
    pub fn following(fs: Arc<Fs>, opts: FsOptions) -> Live {
        Live { follow: Some(opts), ..Live::fixed(fs) }
    }

    /// Whether this file system follows a writer elsewhere.
    pub fn follows(&self) -> bool {
        self.follow.is_some()
    }

    /// The current file system.
    pub fn get(&self) -> Arc<Fs> {
        Arc::clone(&self.cur.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Keep the current file system current until the hold is dropped (a
    /// refresh in progress finishes first): take it, then [`Live::get`].
    pub fn hold(&self) -> Hold<'_> {
        let _one = self.refreshing.lock().unwrap_or_else(|p| p.into_inner());
        self.holds.fetch_add(1, Ordering::AcqRel);
        Hold(self)
    }

    /// The current file system, this one gone.
    pub fn into_inner(self) -> Arc<Fs> {
        self.cur.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// How many times it was replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// If the store holds a newer state than the current file system's,
    /// open it and make it the current one (with the old one's
    /// invalidator). Whether it did; nothing while held. On failure the
    /// current one stays.
    pub fn refresh(&self) -> Result<bool> {
        let Some(opts) = &self.follow else { return Ok(false) };
        let mut pending = self.refreshing.lock().unwrap_or_else(|p| p.into_inner());
        if self.holds.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        let io = |e| zlogfs_engine::Error::io("looking for a newer state", e);
        let store = match pending.take() {
            Some(s) => match s.refresh() {
                Ok(newer) => newer.unwrap_or(s),
                Err(e) => {
                    *pending = Some(s);
                    return Err(io(e).into());
                }
            },
            None => match self.get().engine().store().refresh().map_err(io)? {
                Some(s) => s,
                None => return Ok(false),
            },
        };
        let fs = match Fs::open(Arc::clone(&store), opts.clone()) {
            Ok(fs) => fs,
            Err(e) => {
                *pending = Some(store);
                return Err(e);
            }
        };
        fs.set_invalidator(self.get().invalidator());
        let mut cur = self.cur.write().unwrap_or_else(|p| p.into_inner());
        *cur = Arc::new(fs);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }
}
