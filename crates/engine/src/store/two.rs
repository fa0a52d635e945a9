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
//! The two are tied in time by a pairing record on each ([`Pairing`]):
//! every read-write use of the pair (its open, and its end when the
//! store is dropped) moves
//! both records to a new generation, and an open refuses two devices
//! whose records say they were not last used together, so that a copy of
//! one device (a backup, a snapshot of a volume) is never joined with
//! the other device's newer state ([`TwoStore::check_generation`]).
//!
//! A sync syncs the bulk store, then the fast one. Order does not decide
//! what survives a crash (the log's chain does: a batch lost on either
//! store ends it there), but it keeps the usual case, data before the
//! journal naming it, short of the window.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Geometry, MetaSlot, Store, META_SLOT_SIZE};
use crate::bytes::{crc, Put, Reader};
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
    /// The pair was opened for writing: its clean close moves the
    /// pairing records on again.
    writing: AtomicBool,
}

/// What a pairing record starts with.
const PAIRING_MAGIC: [u8; 8] = *b"ZLOGPAIR";

/// Bytes of a pairing record: magic, uuid, generation, pending
/// generation, crc32c of what comes before. It lies in the slot's first
/// sector, which a device writes whole or not at all; the rest of the
/// slot is zeros.
const PAIRING_LEN: usize = 8 + 16 + 8 + 8 + 4;

/// A device's pairing record: the generation of the last use of the pair
/// it took part in. A move to generation G+1 writes the bulk device's
/// `pending` (G+1), then the fast device's `gen`, then the bulk device's
/// `gen`: a crash between any two leaves records an open accepts.
/// Absent (an image made before the records, or not yet opened for
/// writing): generation 0 on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pairing {
    /// The last use of the pair this device took part in.
    pub gen: u64,
    /// The use being started (the bulk device's record, between the
    /// first and last writes of a move): `gen` otherwise.
    pub pending: u64,
}

impl Pairing {
    fn encode(&self, uuid: &[u8; 16]) -> [u8; META_SLOT_SIZE] {
        let mut v = Vec::with_capacity(PAIRING_LEN);
        v.extend_from_slice(&PAIRING_MAGIC);
        v.extend_from_slice(uuid);
        v.put_u64(self.gen);
        v.put_u64(self.pending);
        let c = crc(&v);
        v.put_u32(c);
        let mut out = [0u8; META_SLOT_SIZE];
        out[..PAIRING_LEN].copy_from_slice(&v);
        out
    }

    fn decode(buf: &[u8; META_SLOT_SIZE], uuid: &[u8; 16], what: &str) -> Result<Pairing> {
        if buf[..PAIRING_LEN].iter().all(|&b| b == 0) {
            return Ok(Pairing::default());
        }
        let mut r = Reader::new(&buf[..PAIRING_LEN], what);
        if r.array::<8>()? != PAIRING_MAGIC {
            return Err(Error::corrupt(what, "not a pairing record (wrong magic)"));
        }
        let stored = u32::from_le_bytes(buf[PAIRING_LEN - 4..PAIRING_LEN].try_into().unwrap_or([0; 4]));
        let got = crc(&buf[..PAIRING_LEN - 4]);
        if stored != got {
            return Err(Error::ChecksumMismatch { what: what.into(), expected: stored, got });
        }
        if &r.array::<16>()? != uuid {
            return Err(Error::corrupt(what, "the record names another image"));
        }
        let (gen, pending) = (r.u64()?, r.u64()?);
        if pending < gen || pending > gen + 1 {
            return Err(Error::corrupt(what, format!("generation {gen} with {pending} pending")));
        }
        Ok(Pairing { gen, pending })
    }
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
        let two = TwoStore { fast, bulk, split: f.segment_count, geometry, names, writing: false.into() };
        if check {
            two.check_partners()?;
            two.check_generation()?;
        }
        Ok(two)
    }

    /// The paths the two have now (in [`TwoStore::new`]'s `names`),
    /// recorded in both superblocks as each one's partner; synced.
    pub fn record_names(&self) -> Result<()> {
        let mut sb = crate::engine::read_superblock(self.fast.as_ref())?;
        sb.partner = self.names.1.clone();
        for slot in [MetaSlot::Super, MetaSlot::SuperCopy] {
            let what = || format!("writing the superblocks of {} and {}", self.names.0, self.names.1);
            self.write_meta(slot, &sb.encode()).map_err(|e| Error::io(what(), e))?;
            self.sync().map_err(|e| Error::io(what(), e))?;
        }
        Ok(())
    }

    /// The pairing records of (fast, bulk).
    pub fn pairings(&self) -> Result<(Pairing, Pairing)> {
        let uuid = crate::engine::read_superblock(self.fast.as_ref())?.uuid;
        let read = |s: &dyn Store, name: &str| -> Result<Pairing> {
            let mut buf = [0u8; META_SLOT_SIZE];
            let what = format!("the pairing record of {name}");
            s.read_meta(MetaSlot::Pairing, &mut buf).map_err(|e| Error::io(format!("reading {what}"), e))?;
            Pairing::decode(&buf, &uuid, &what)
        };
        Ok((read(self.fast.as_ref(), &self.names.0)?, read(self.bulk.as_ref(), &self.names.1)?))
    }

    /// The generation of the pair's last use, when the two devices were
    /// last used together; otherwise an error that names both devices and
    /// says which one is older.
    pub fn check_generation(&self) -> Result<u64> {
        let (f, b) = self.pairings()?;
        // Together: the same generation, or a move cut short after the
        // fast device's record (the bulk's pending says so).
        if f.gen == b.gen || (f.gen == b.pending && b.pending == b.gen + 1) {
            return Ok(f.gen);
        }
        let (fname, bname) = (&self.names.0, &self.names.1);
        let (older, newer) = if f.gen < b.gen { (fname, bname) } else { (bname, fname) };
        Err(Error::Invalid(format!(
            "{fname} (the fast device, use {}) and {bname} (the bulk device, use {}) were not last used \
             together: {older} is an older copy than {newer}. Opening them together would show an old \
             tree or overwrite data the other still needs; give the two devices that were last used \
             together (back up both devices of an image together, while it is not mounted)",
            f.gen, b.gen
        )))
    }

    /// Move both pairing records to a new generation (at a read-write
    /// open, and again at its clean close); synced.
    pub fn advance_generation(&self) -> Result<u64> {
        let (f, b) = self.pairings()?;
        let uuid = crate::engine::read_superblock(self.fast.as_ref())?.uuid;
        let cur = f.gen.max(b.gen);
        let next = cur + 1;
        let put = |s: &dyn Store, p: Pairing, name: &str| -> Result<()> {
            let what = || format!("writing the pairing record of {name}");
            s.write_meta(MetaSlot::Pairing, &p.encode(&uuid)).map_err(|e| Error::io(what(), e))?;
            s.sync().map_err(|e| Error::io(what(), e))
        };
        put(self.bulk.as_ref(), Pairing { gen: cur, pending: next }, &self.names.1)?;
        put(self.fast.as_ref(), Pairing { gen: next, pending: next }, &self.names.0)?;
        put(self.bulk.as_ref(), Pairing { gen: next, pending: next }, &self.names.1)?;
        self.writing.store(true, Ordering::Release);
        Ok(next)
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

impl Drop for TwoStore {
    /// The last user of a pair opened for writing is gone (the file
    /// system closed, or its process ends): a copy of one device taken
    /// while the pair was open is older than the pair from now on. (A
    /// process killed does not get here: a copy taken during its use is
    /// then caught only from the next read-write use on.)
    fn drop(&mut self) {
        if self.writing.load(Ordering::Acquire) {
            if let Err(e) = self.advance_generation() {
                tracing::error!(
                    "{} and {}: moving the pairing records on at close: {e}",
                    self.names.0,
                    self.names.1
                );
            }
        }
    }
}

/// Refuse a bulk device given at another path (`names.1`) than the one
/// the fast device recorded while the recorded one is still there, the
/// bulk device of the same image: the one given is a copy (`cp bulk.img
/// backup.img`), and opening it with the fast device would leave the
/// original behind the fast device's state. A device moved, with nothing
/// left at the old path, passes. Returns the path recorded.
pub fn check_not_a_copy(fast: &dyn Store, names: &(String, String)) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let f = crate::engine::read_superblock(fast)?;
    let (fname, bname) = names;
    let rec = &f.partner;
    if rec.is_empty() || rec == bname {
        return Ok(rec.clone());
    }
    let Ok(other) = super::FileStore::open_read_only(std::path::Path::new(rec)) else {
        return Ok(rec.clone());
    };
    let same_image =
        crate::engine::read_superblock(&other).is_ok_and(|o| o.uuid == f.uuid && o.role == Role::Bulk);
    let same_file = match (std::fs::metadata(rec), std::fs::metadata(bname)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    };
    if !same_image || same_file {
        return Ok(rec.clone());
    }
    Err(Error::Invalid(format!(
        "{bname} is a copy of the bulk device {rec}: {fname} was last used with that one, which is \
         still there. Give {rec} (or, if {bname} is to replace it, move {rec} away first): a copy \
         opened with the fast device would leave the original behind it"
    )))
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
