//! A store that times what it passes on: device writes, reads and syncs
//! and their bytes, into the process's [`metrics`](crate::metrics). The
//! engine wraps every store it opens in one.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::{Geometry, MetaSlot, Store, META_SLOT_SIZE};
use crate::metrics::{global, Histogram};

/// `inner`, timed.
pub(crate) struct Metered(pub(crate) Arc<dyn Store>);

fn timed<T>(h: &Histogram, bytes: usize, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let start = Instant::now();
    let r = f();
    if r.is_ok() {
        h.since(start, bytes as u64);
    }
    r
}

impl Store for Metered {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }

    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        timed(&global().split.device_read, META_SLOT_SIZE, || self.0.read_meta(slot, buf))
    }

    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        timed(&global().split.device_write, META_SLOT_SIZE, || self.0.write_meta(slot, buf))
    }

    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        let n = buf.len();
        timed(&global().split.device_read, n, || self.0.read(seg, offset, buf))
    }

    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        timed(&global().split.device_write, data.len(), || self.0.write(seg, offset, data))
    }

    fn sync(&self) -> io::Result<()> {
        timed(&global().split.device_sync, 0, || self.0.sync())
    }

    fn discard(&self, seg: u32) -> io::Result<()> {
        self.0.discard(seg)
    }

    fn fast_segments(&self) -> Option<u32> {
        self.0.fast_segments()
    }

    fn names(&self) -> Option<(String, String)> {
        self.0.names()
    }

    fn sealed(&self, seg: u32) {
        self.0.sealed(seg)
    }

    fn freed(&self, seg: u32) {
        self.0.freed(seg)
    }

    fn close(&self) -> io::Result<()> {
        self.0.close()
    }

    fn cached(&self, seg: u32) -> bool {
        self.0.cached(seg)
    }

    fn remote_stats(&self) -> Option<super::RemoteStats> {
        self.0.remote_stats()
    }

    fn refresh(&self) -> io::Result<Option<Arc<dyn Store>>> {
        self.0.refresh()
    }
}
