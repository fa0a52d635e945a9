//! Making a file system ([`mkfs`]), opening one (recovery, orphans, the
//! commit thread), a view of its past, and closing it. The handle itself
//! is [`crate::state::handle`]; the operations are in [`crate::ops::namespace`],
//! [`crate::ops::files`] and [`crate::ops::xattr`].

use std::sync::Arc;

use zlogfs_engine::engine::{self, Engine, Options, WriteBatch};
use zlogfs_engine::max_block_raw;
use zlogfs_engine::store::Store;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::group::Group;
use crate::state::handle::{Fs, Inner};
use crate::state::State;
use crate::time::now;
use crate::{lock, FsOptions, MkfsOptions};

pub(crate) mod live;
pub(crate) mod worker;

/// Make an empty file system on `store`: the engine's format plus the
/// config record and the root directory.
pub fn mkfs(store: Arc<dyn Store>, o: &MkfsOptions) -> Result<()> {
    let max = max_block_raw(store.geometry()) as u32;
    if !o.chunk_size.is_power_of_two() || o.chunk_size < 4096 || o.chunk_size > (1 << 20) {
        return Err(Error::Invalid(format!(
            "chunk size {} is not a power of two from 4 KiB to 1 MiB",
            o.chunk_size
        )));
    }
    if o.chunk_size > max || o.pack_bytes > max {
        return Err(Error::Invalid(format!(
            "chunk size {} or pack size {} exceeds the largest block of this segment size ({max})",
            o.chunk_size, o.pack_bytes
        )));
    }
    if o.inline_max > 4096 {
        return Err(Error::Invalid(format!("inline limit {} exceeds 4096", o.inline_max)));
    }
    if o.small_max > 1 << 40 {
        return Err(Error::Invalid(format!("small-file size {} exceeds 1 TiB", o.small_max)));
    }
    engine::mkfs(store.clone())?;
    let eng = Engine::open(store, Options { background: false, ..Options::default() })?;
    let t = now();
    let cfg = Config {
        chunk_size: o.chunk_size,
        pack_bytes: o.pack_bytes.max(o.chunk_size),
        inline_max: o.inline_max,
        codec: o.codec.normalized(),
        base_sec: t.sec,
        next_ino: ROOT + 1,
        next_triple: 1,
        small_max: o.small_max,
        // A policy record is version 8's.
        version: if o.history.keeps_any() { 8 } else { 1 },
    };
    let root = Inode {
        ino: ROOT,
        mode: 0o040755,
        uid: o.root_uid,
        gid: o.root_gid,
        nlink: 2,
        size: 0,
        alloc: 0,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
        btime: t,
        parent: ROOT,
        policy: None,
        chunk: None,
        tier: None,
        unit: None,
        cold: None,
    };
    let mut b = WriteBatch::new();
    b.put(config_key(), cfg.encode());
    b.put(triple_key(0), encode_triple(root.triple()));
    b.put(inode_key(ROOT), root.encode(0, cfg.base_sec));
    if o.history.keeps_any() {
        b.put(policy_key(), o.history.to_string().into_bytes());
    }
    eng.write_sync(&b)?;
    Ok(eng.close()?)
}

impl Fs {
    /// Open the file system on `store`, recovering it to its last durable
    /// state and finishing deletes and truncations a crash interrupted.
    pub fn open(store: Arc<dyn Store>, opts: FsOptions) -> Result<Fs> {
        if (opts.snapshot.is_some() || opts.at.is_some()) && !opts.read_only {
            return Err(Error::invalid("a snapshot opens read-only (-o ro,snapshot=NAME or -o ro,at=TIME)"));
        }
        if opts.snapshot.is_some() && opts.at.is_some() {
            return Err(Error::invalid("give a snapshot or a time (at=), not both"));
        }
        // Merges keep every version until the snapshots are known.
        let eng_opts = Options {
            read_only: opts.read_only || opts.engine.read_only,
            keep_history: true,
            ..opts.engine.clone()
        };
        let eng = Arc::new(Engine::open(store, eng_opts)?);
        let group = Group::open(&eng)?;
        eng.set_retained(group.snapshots().to_vec());
        let at = match (&opts.snapshot, &opts.at) {
            (Some(name), _) => Some(crate::history::snapshot::find(&eng, name)?.seq),
            (None, Some(spec)) => Some(crate::history::snapshot::find_at(&eng, spec)?.seq),
            (None, None) => None,
        };
        let st = State::new(eng.clone(), group, &opts, at);
        let inner = Arc::new(Inner::new(st));
        if !opts.read_only {
            let mut st = lock(&inner.st);
            st.finish_orphans()?;
            st.settle_segment_borns();
            st.release_held()?;
            st.commit()?;
            eng.sync()?;
        }
        let worker = opts.commit_interval.map(|iv| {
            let w = Arc::downgrade(&inner);
            let e = eng.clone();
            std::thread::Builder::new()
                .name("zlogfs-commit".into())
                .spawn(move || worker::commit_loop(w, e, iv))
                .expect("spawning the commit thread")
        });
        Ok(Fs { inner, eng, worker, sync_mode: opts.sync, invalidator: Default::default() })
    }

    /// A read-only view of snapshot `name` (a named one or an automatic
    /// point) sharing this file system's engine, as a mount's
    /// `.snapshots/NAME` directory reads it: it reads as an open with
    /// `read_only` and `snapshot: Some(name)` would. With its sequence
    /// number. A read through the view saw the snapshot whole if, after
    /// it, [`Engine::retains`] that number (a delete lets its versions and
    /// blocks go) and [`Fs::held_generation`] is what it was before it
    /// (the cleaner moved no block it reads; when that count moved, drop
    /// the view's cache and read again).
    pub fn view(&self, name: &str, cache_bytes: usize) -> Result<(Fs, u64)> {
        let seq = crate::history::snapshot::find(&self.eng, name)?.seq;
        let group = Group::open(&self.eng)?;
        let opts = FsOptions { read_only: true, cache_bytes, dirty_bytes: 0, ..FsOptions::default() };
        let mut st = State::new(self.eng.clone(), group, &opts, Some(seq));
        st.held_gen = self.st().held_gen.clone();
        let inner = Arc::new(Inner::new(st));
        let fs = Fs {
            inner,
            eng: self.eng.clone(),
            worker: None,
            sync_mode: opts.sync,
            invalidator: Default::default(),
        };
        Ok((fs, seq))
    }

    /// Commit, sync, flush the index and checkpoint ([`Engine::settle`]),
    /// and close: the next open replays nothing.
    pub fn close(mut self) -> Result<()> {
        self.stop_worker();
        let s = self.stats();
        if s.background_errors > 0 {
            tracing::warn!(
                "{} errors in background work while open; the last: {}",
                s.background_errors,
                s.last_background_error.unwrap_or_default()
            );
        }
        if self.st().read_only {
            return Ok(());
        }
        self.sync()?;
        self.eng.settle()?;
        // What the last group, the index flush and the checkpoint wrote is
        // counted by a group of its own; only what recording it writes
        // (a journal record, a small run, a checkpoint) goes uncounted.
        let mut st = self.st();
        if st.group.count_device_bytes(self.eng.device_bytes_written()) {
            st.commit()?;
            drop(st);
            self.eng.sync()?;
            self.eng.settle()?;
        }
        Ok(())
    }
}
