//! The cache directory's record of what its local image holds: which
//! image and writer it belongs to, and per segment which bytes are local.
//! Written after the local image is synced, so what it says is local is.
//! Layout: docs/FORMAT.md §10.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MAGIC: &[u8; 8] = b"ZLGCACHE";
const HEADER: u64 = 64;
const ENTRY: u64 = 16;
/// The record's layout version. Records written before the field existed
/// hold 0 there and have this layout.
pub const VERSION: u32 = 1;

/// The header: the image and the writer the cache's local-only bytes are of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The manifest's image id.
    pub image_id: [u8; 16],
    /// The epoch of the writer that last wrote through this cache (0: a
    /// reader's cache, never trusted).
    pub epoch: u64,
    /// That writer's random id.
    pub writer: u64,
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
    /// Start a new record (the local image was just made): written whole
    /// beside `path`, synced, then renamed over it, so that a crash leaves
    /// the old record or the new one.
    pub fn create(path: &Path, h: Header) -> io::Result<CacheFile> {
        let tmp = path.with_extension("new");
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp)?;
        file.set_len(HEADER + ENTRY * u64::from(h.segment_count))?;
        let c = CacheFile { file };
        c.write_header(h)?;
        c.sync()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(path)?;
        Ok(c)
    }

    /// Remove the record (the local image is about to be rebuilt).
    pub fn remove(path: &Path) -> io::Result<()> {
        match std::fs::remove_file(path) {
            Ok(()) => sync_dir(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Open a record; None when there is none. A record that is not one,
    /// or is damaged, is an error: what the cache holds is unknown, and
    /// may be data the bucket lacks.
    pub fn open(path: &Path) -> io::Result<Option<(CacheFile, Header)>> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let damaged = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: {what}: the cache directory's record is damaged; if the bucket holds everything \
                     (the last writer closed cleanly, or synced with sync=remote), delete the directory \
                     to rebuild it from the bucket",
                    path.display()
                ),
            )
        };
        let mut b = [0u8; HEADER as usize];
        file.read_exact_at(&mut b, 0).map_err(|_| damaged("cut short"))?;
        if &b[..8] != MAGIC {
            return Err(damaged("no magic"));
        }
        if crc32c::crc32c(&b[..60]) != u32::from_le_bytes([b[60], b[61], b[62], b[63]]) {
            return Err(damaged("header checksum mismatch"));
        }
        let version = u32::from_le_bytes([b[44], b[45], b[46], b[47]]);
        if version > VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the cache directory was written by a newer zlogfs (record version {version}; this \
                     one reads up to {VERSION}): use that zlogfs, or, if the bucket holds everything (the \
                     last writer closed cleanly, or synced with sync=remote), delete the directory to \
                     rebuild it from the bucket",
                    path.display()
                ),
            ));
        }
        let mut image_id = [0u8; 16];
        image_id.copy_from_slice(&b[8..24]);
        let mut e = [0u8; 8];
        e.copy_from_slice(&b[24..32]);
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[32..40]);
        let h = Header {
            image_id,
            epoch: u64::from_le_bytes(e),
            writer: u64::from_le_bytes(w),
            segment_count: u32::from_le_bytes([b[40], b[41], b[42], b[43]]),
        };
        if file.metadata()?.len() < HEADER + ENTRY * u64::from(h.segment_count) {
            return Err(damaged("shorter than its segments"));
        }
        Ok(Some((CacheFile { file }, h)))
    }

    /// Overwrite the header.
    pub fn write_header(&self, h: Header) -> io::Result<()> {
        let mut b = [0u8; HEADER as usize];
        b[..8].copy_from_slice(MAGIC);
        b[8..24].copy_from_slice(&h.image_id);
        b[24..32].copy_from_slice(&h.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&h.writer.to_le_bytes());
        b[40..44].copy_from_slice(&h.segment_count.to_le_bytes());
        b[44..48].copy_from_slice(&VERSION.to_le_bytes());
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

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record at `path` with version `v` written in place (and its
    /// checksum made right).
    fn set_version(path: &Path, v: u32) {
        let mut b = std::fs::read(path).unwrap();
        b[44..48].copy_from_slice(&v.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn older_records_open_and_newer_ones_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("zlogfs-cache-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state");
        let h = Header { image_id: [7; 16], epoch: 3, writer: 5, segment_count: 4 };
        drop(CacheFile::create(&path, h).unwrap());
        assert_eq!(std::fs::read(&path).unwrap()[44..48], VERSION.to_le_bytes());

        // Written before the field existed: zeros there, the same layout.
        set_version(&path, 0);
        let (_, got) = CacheFile::open(&path).unwrap().expect("a record");
        assert_eq!(got, h);

        set_version(&path, VERSION + 1);
        let msg = CacheFile::open(&path).err().expect("a newer record is refused").to_string();
        assert!(msg.contains("newer zlogfs") && msg.contains(&format!("version {}", VERSION + 1)), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
