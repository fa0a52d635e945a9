//! The cache directory's record of what its local image holds: which
//! image and writer it belongs to, and per segment which bytes are local.
//! Written after the local image is synced, so what it says is local is.
//! Layout: docs/FORMAT.md §11.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MAGIC: &[u8; 8] = b"ZLGCACHE";
const HEADER: u64 = 64;
const ENTRY: u64 = 16;

/// The header: the image and the writer the cache's local-only bytes are of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The manifest's image id.
    pub image_id: [u8; 16],
    /// The epoch of the writer that last wrote through this cache (0: it
    /// only read).
    pub epoch: u64,
    /// Segments in the image.
    pub segment_count: u32,
}

/// One segment's local state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// The generation the local bytes are of.
    pub gen: u64,
    /// Bytes from here to `written` are in the local image.
    pub local_from: u32,
    /// End of the segment's contents.
    pub written: u32,
}

/// The open record.
pub struct CacheFile {
    file: File,
}

impl CacheFile {
    /// Start a new record (the local image was just made).
    pub fn create(path: &Path, h: Header) -> io::Result<CacheFile> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        file.set_len(HEADER + ENTRY * u64::from(h.segment_count))?;
        let c = CacheFile { file };
        c.write_header(h)?;
        Ok(c)
    }

    /// Open a record; None when it is missing or not one (the cache is
    /// then rebuilt from the bucket).
    pub fn open(path: &Path) -> io::Result<Option<(CacheFile, Header)>> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut b = [0u8; HEADER as usize];
        if file.read_exact_at(&mut b, 0).is_err() || &b[..8] != MAGIC {
            return Ok(None);
        }
        if crc32c::crc32c(&b[..60]) != u32::from_le_bytes([b[60], b[61], b[62], b[63]]) {
            return Ok(None);
        }
        let mut image_id = [0u8; 16];
        image_id.copy_from_slice(&b[8..24]);
        let mut e = [0u8; 8];
        e.copy_from_slice(&b[24..32]);
        let h = Header {
            image_id,
            epoch: u64::from_le_bytes(e),
            segment_count: u32::from_le_bytes([b[32], b[33], b[34], b[35]]),
        };
        if file.metadata()?.len() < HEADER + ENTRY * u64::from(h.segment_count) {
            return Ok(None);
        }
        Ok(Some((CacheFile { file }, h)))
    }

    /// Overwrite the header.
    pub fn write_header(&self, h: Header) -> io::Result<()> {
        let mut b = [0u8; HEADER as usize];
        b[..8].copy_from_slice(MAGIC);
        b[8..24].copy_from_slice(&h.image_id);
        b[24..32].copy_from_slice(&h.epoch.to_le_bytes());
        b[32..36].copy_from_slice(&h.segment_count.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&b, 0)
    }

    /// Read segment `seg`'s entry.
    pub fn entry(&self, seg: u32) -> io::Result<Entry> {
        let mut b = [0u8; ENTRY as usize];
        self.file.read_exact_at(&mut b, HEADER + ENTRY * u64::from(seg))?;
        let mut g = [0u8; 8];
        g.copy_from_slice(&b[..8]);
        Ok(Entry {
            gen: u64::from_le_bytes(g),
            local_from: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            written: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }

    /// Overwrite segment `seg`'s entry (durable at [`CacheFile::sync`]).
    pub fn set_entry(&self, seg: u32, e: Entry) -> io::Result<()> {
        let mut b = [0u8; ENTRY as usize];
        b[..8].copy_from_slice(&e.gen.to_le_bytes());
        b[8..12].copy_from_slice(&e.local_from.to_le_bytes());
        b[12..].copy_from_slice(&e.written.to_le_bytes());
        self.file.write_all_at(&b, HEADER + ENTRY * u64::from(seg))
    }

    /// Make the writes so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}
