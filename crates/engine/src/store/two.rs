//! An image of two stores: a small fast one and a large bulk one, seen by
//! the engine as one segment space. Segments `0..F` are the fast store's
//! (F its segment count), the rest the bulk store's, renumbered from 0.
//!
//! The metadata slots (checkpoints) live on the fast store. Each store's
//! superblock names the image (its uuid), the split, the store's role and
//! the other store's path: a superblock written through this store goes to
//! the fast store as given and to the bulk store with its own role, so a
//! wrong or missing partner is refused with a clear message
//! ([`TwoStore::new`]).
//!
//! A sync syncs the bulk store, then the fast one. Order does not decide
//! what survives a crash (the log's chain does: a batch lost on either
//! store ends it there), but it keeps the usual case, data before the
//! journal naming it, short of the window.

use std::io;
use std::sync::Arc;

use super::{Geometry, MetaSlot, Store, META_SLOT_SIZE};
use crate::error::{Error, Result};
use crate::log::format::{Role, Superblock, INCOMPAT_TWO_DEVICES};

/// Two stores as one: see the module documentation.
pub struct TwoStore {
    fast: Arc<dyn Store>,
    bulk: Arc<dyn Store>,
    split: u32,
    geometry: Geometry,
    /// Paths recorded in each superblock as its partner's: (fast, bulk).
    names: (String, String),
}

impl TwoStore {
    /// The two stores of one image; `names` are their paths (recorded as
    /// each one's partner when a superblock is written). Both must have
    /// the same segment size. When `check` is set, both superblocks are
    /// read and must name the same image, each in its role, with this
    /// split: otherwise a message says which store is wrong.
    pub fn new(
        fast: Arc<dyn Store>,
        bulk: Arc<dyn Store>,
        names: (String, String),
        check: bool,
    ) -> Result<TwoStore> {
        let (f, b) = (fast.geometry(), bulk.geometry());
        if f.segment_size != b.segment_size {
            return Err(Error::Invalid(format!(
                "the fast device's segments are {} bytes and the bulk device's {}",
                f.segment_size, b.segment_size
            )));
        }
        let geometry =
            Geometry { segment_size: f.segment_size, segment_count: f.segment_count + b.segment_count };
        let two = TwoStore { fast, bulk, split: f.segment_count, geometry, names };
        if check {
            two.check_partners()?;
        }
        Ok(two)
    }

    /// Segments of the fast store.
    pub fn fast_segments(&self) -> u32 {
        self.split
    }

    fn check_partners(&self) -> Result<()> {
        let f = check_pair(self.fast.as_ref(), self.bulk.as_ref(), &self.names)?;
        let (fname, bname) = (&self.names.0, &self.names.1);
        if f.fast_segments != self.split || f.geometry != self.geometry {
            return Err(Error::Invalid(format!(
                "{fname} and {bname} do not have the sizes their superblocks record ({} of {} segments \
                 on the fast device; here {} of {})",
                f.fast_segments, f.geometry.segment_count, self.split, self.geometry.segment_count
            )));
        }
        Ok(())
    }

    fn route(&self, seg: u32) -> (&dyn Store, u32) {
        if seg < self.split {
            (self.fast.as_ref(), seg)
        } else {
            (self.bulk.as_ref(), seg - self.split)
        }
    }

    /// The superblock `buf` as the bulk store keeps it: its role, and the
    /// fast store's path as its partner.
    fn bulk_superblock(&self, buf: &[u8; META_SLOT_SIZE]) -> io::Result<[u8; META_SLOT_SIZE]> {
        let mut sb = Superblock::decode(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if sb.incompat & INCOMPAT_TWO_DEVICES == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a one-device superblock on two devices",
            ));
        }
        sb.role = Role::Bulk;
        sb.partner = self.names.0.clone();
        Ok(sb.encode())
    }
}

impl Store for TwoStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.fast.read_meta(slot, buf)
    }

    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        if matches!(slot, MetaSlot::Super | MetaSlot::SuperCopy) {
            self.bulk.write_meta(slot, &self.bulk_superblock(buf)?)?;
        }
        self.fast.write_meta(slot, buf)
    }

    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        let (s, n) = self.route(seg);
        s.read(n, offset, buf)
    }

    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        let (s, n) = self.route(seg);
        s.write(n, offset, data)
    }

    fn sync(&self) -> io::Result<()> {
        self.bulk.sync()?;
        self.fast.sync()
    }

    fn discard(&self, seg: u32) -> io::Result<()> {
        let (s, n) = self.route(seg);
        s.discard(n)
    }

    fn fast_segments(&self) -> Option<u32> {
        Some(self.split)
    }

    fn names(&self) -> Option<(String, String)> {
        Some(self.names.clone())
    }

    fn sealed(&self, seg: u32) {
        let (s, n) = self.route(seg);
        s.sealed(n)
    }

    fn freed(&self, seg: u32) {
        let (s, n) = self.route(seg);
        s.freed(n)
    }

    fn cached(&self, seg: u32) -> bool {
        let (s, n) = self.route(seg);
        s.cached(n)
    }

    fn close(&self) -> io::Result<()> {
        self.bulk.close()?;
        self.fast.close()
    }
}

/// Check that `fast` and `bulk` are the two devices of one image, each in
/// its role (`names`: their paths, for the messages); the fast device's
/// superblock. Reads only their superblocks, so it may come before their
/// sizes are known.
pub fn check_pair(fast: &dyn Store, bulk: &dyn Store, names: &(String, String)) -> Result<Superblock> {
    // The primary superblock, or its copy when the primary is damaged.
    let read = |s: &dyn Store, name: &str| -> Result<Superblock> {
        crate::engine::read_superblock(s).map_err(|e| match e {
            Error::Io { .. } => e,
            e => Error::Invalid(format!("{name}: {e}")),
        })
    };
    let (fname, bname) = (&names.0, &names.1);
    let f = read(fast, fname)?;
    let b = read(bulk, bname)?;
    let hex = |u: &[u8; 16]| u.iter().map(|x| format!("{x:02x}")).collect::<String>();
    if b.role != Role::Bulk {
        return Err(Error::Invalid(format!(
            "{bname} is {} of its image, not the bulk device of two",
            b.role.name()
        )));
    }
    if f.role != Role::Fast {
        return Err(Error::Invalid(format!(
            "{fname} is {} of its image (uuid {}), not a fast device",
            f.role.name(),
            hex(&f.uuid)
        )));
    }
    if f.uuid != b.uuid {
        return Err(Error::Invalid(format!(
            "{fname} is the fast device of another image (uuid {}; {bname} is {}): give the fast \
                 device made with it (it was {})",
            hex(&f.uuid),
            hex(&b.uuid),
            if b.partner.is_empty() { "not recorded" } else { &b.partner }
        )));
    }
    if f.fast_segments != b.fast_segments || f.geometry != b.geometry {
        return Err(Error::corrupt(
            format!("the superblocks of {fname} and {bname}"),
            "they name the same image but record different sizes",
        ));
    }
    Ok(f)
}
