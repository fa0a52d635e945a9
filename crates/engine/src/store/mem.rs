//! An in-memory store for tests: segments are allocated on first write,
//! nothing is ever lost and `sync` does nothing.

use std::io;
use std::sync::{Mutex, MutexGuard};

use super::{check_range, Geometry, MetaSlot, Store, META_SLOTS, META_SLOT_SIZE};

#[derive(Clone)]
struct Inner {
    segments: Vec<Option<Vec<u8>>>,
    meta: [[u8; META_SLOT_SIZE]; META_SLOTS],
}

/// A store held entirely in memory.
pub struct MemStore {
    geometry: Geometry,
    inner: Mutex<Inner>,
}

impl MemStore {
    /// A copy of this store's bytes as they are now (a fuzz target starts
    /// each input from the same prepared image).
    pub fn fork(&self) -> MemStore {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone();
        MemStore { geometry: self.geometry, inner: Mutex::new(inner) }
    }

    /// An empty store: every segment and metadata slot reads as zeros.
    pub fn new(geometry: Geometry) -> MemStore {
        MemStore {
            geometry,
            inner: Mutex::new(Inner {
                segments: vec![None; geometry.segment_count as usize],
                meta: [[0; META_SLOT_SIZE]; META_SLOTS],
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the plain byte buffers
        // in an invalid state, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        buf.copy_from_slice(&self.lock().meta[slot.index() as usize]);
        Ok(())
    }

    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.lock().meta[slot.index() as usize].copy_from_slice(buf);
        Ok(())
    }

    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.geometry, seg, offset, buf.len())?;
        let inner = self.lock();
        match &inner.segments[seg as usize] {
            Some(data) => {
                let start = offset as usize;
                buf.copy_from_slice(&data[start..start + buf.len()]);
            }
            None => buf.fill(0),
        }
        Ok(())
    }

    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        check_range(self.geometry, seg, offset, data.len())?;
        let size = self.geometry.segment_size as usize;
        let mut inner = self.lock();
        let segment = inner.segments[seg as usize].get_or_insert_with(|| vec![0; size]);
        let start = offset as usize;
        segment[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, seg: u32) -> io::Result<()> {
        check_range(self.geometry, seg, 0, 0)?;
        self.lock().segments[seg as usize] = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry { segment_size: 8192, segment_count: 4 }
    }

    #[test]
    fn round_trip() {
        let s = MemStore::new(geo());
        assert_eq!(s.geometry(), geo());
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        s.write(2, 512, &data).unwrap();
        let mut buf = vec![0u8; 1000];
        s.read(2, 512, &mut buf).unwrap();
        assert_eq!(buf, data);
        // Bytes around the write are still zero.
        let mut buf = vec![1u8; 512];
        s.read(2, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        s.sync().unwrap();
    }

    #[test]
    fn a_fork_has_the_bytes_and_goes_its_own_way() {
        let s = MemStore::new(geo());
        s.write(1, 0, &[5; 100]).unwrap();
        let f = s.fork();
        s.write(1, 0, &[6; 100]).unwrap();
        let mut buf = vec![0u8; 100];
        f.read(1, 0, &mut buf).unwrap();
        assert_eq!(buf, vec![5; 100], "the fork keeps what was there");
        f.write(2, 0, &[7; 10]).unwrap();
        s.read(2, 0, &mut buf[..10]).unwrap();
        assert_eq!(&buf[..10], &[0; 10], "and the original does not see the fork's writes");
    }

    #[test]
    fn unwritten_reads_zero() {
        let s = MemStore::new(geo());
        let mut buf = vec![7u8; 8192];
        s.read(3, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        let mut m = [9u8; META_SLOT_SIZE];
        s.read_meta(MetaSlot::CheckpointB, &mut m).unwrap();
        assert!(m.iter().all(|&b| b == 0));
    }

    #[test]
    fn meta_round_trip() {
        let s = MemStore::new(geo());
        let a = [0xAAu8; META_SLOT_SIZE];
        let b = [0xBBu8; META_SLOT_SIZE];
        s.write_meta(MetaSlot::CheckpointA, &a).unwrap();
        s.write_meta(MetaSlot::CheckpointB, &b).unwrap();
        let mut m = [0u8; META_SLOT_SIZE];
        s.read_meta(MetaSlot::CheckpointA, &mut m).unwrap();
        assert_eq!(m, a);
        s.read_meta(MetaSlot::CheckpointB, &mut m).unwrap();
        assert_eq!(m, b);
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert_eq!(m, [0u8; META_SLOT_SIZE]);
    }

    #[test]
    fn bounds_errors() {
        let s = MemStore::new(geo());
        let mut buf = [0u8; 16];
        let e = s.read(4, 0, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = s.write(0, 8190, &buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = s.read(0, u32::MAX, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(s.discard(4).is_err());
        // Exactly up to the end is fine.
        s.write(3, 8192 - 16, &buf).unwrap();
    }

    #[test]
    fn discard_frees() {
        let s = MemStore::new(geo());
        s.write(1, 0, &[5u8; 100]).unwrap();
        s.discard(1).unwrap();
        let mut buf = [1u8; 100];
        s.read(1, 0, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 100]);
    }

    #[test]
    fn is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<MemStore>();
    }
}
