//! A store over an image file or a block device.
//!
//! Layout: metadata slot `i` at byte `i * META_SLOT_SIZE`, segment `s` at
//! `META_AREA_SIZE + s * segment_size`. I/O is positional (`pread`/`pwrite`),
//! so one handle serves every thread without a lock; `sync` is `fdatasync`.
//!
//! An open image holds an advisory `flock` lock (exclusive when opened for
//! writing, shared when read-only) for as long as the [`FileStore`] lives, so
//! two processes never write one image at once.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{fallocate, FallocateFlags, Flock, FlockArg};

use super::{check_range, Geometry, MetaSlot, Store, META_AREA_SIZE, META_SLOT_SIZE, SECTOR_SIZE};

/// Writes of at least this many bytes start their write-out at once
/// ([`FileStore::write_behind`]); smaller ones (a commit's batch) wait for
/// the sync that usually follows them.
const WRITE_BEHIND_MIN: usize = 256 << 10;

/// A store backed by an image file or a block device.
#[derive(Debug)]
pub struct FileStore {
    /// The image, locked.
    file: Flock<File>,
    geometry: Geometry,
    read_only: bool,
    block_device: bool,
}

/// Size of an open file or block device (a block device's metadata reports
/// length 0, so it is measured by seeking to its end).
fn file_len(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    if meta.file_type().is_block_device() {
        // `Seek` is implemented for `&File`; positional I/O ignores the
        // cursor, so moving it is harmless.
        let mut f = file;
        f.seek(SeekFrom::End(0))
    } else {
        Ok(meta.len())
    }
}

fn is_block_device(path: &Path) -> io::Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.file_type().is_block_device()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Take a non-blocking advisory lock on `file`, exclusive or shared; the
/// lock goes with the returned handle.
fn lock(file: File, exclusive: bool) -> io::Result<Flock<File>> {
    let arg = if exclusive { FlockArg::LockExclusiveNonblock } else { FlockArg::LockSharedNonblock };
    let mut file = file;
    loop {
        match Flock::lock(file, arg) {
            Ok(locked) => return Ok(locked),
            Err((f, Errno::EINTR)) => file = f,
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "image is in use by another process"))
            }
            Err((_, e)) => return Err(e.into()),
        }
    }
}

fn check_geometry(g: Geometry) -> io::Result<()> {
    if g.segment_size == 0 || g.segment_size as usize % SECTOR_SIZE != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("segment size {} is not a positive multiple of {SECTOR_SIZE}", g.segment_size),
        ));
    }
    Ok(())
}

/// Bytes an image of geometry `g` needs.
fn needed_bytes(g: Geometry) -> u64 {
    META_AREA_SIZE + g.capacity()
}

fn too_small(have: u64, g: Geometry) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "image is {have} bytes but {} segments of {} bytes need {} bytes \
             (including the {META_AREA_SIZE}-byte metadata area)",
            g.segment_count,
            g.segment_size,
            needed_bytes(g)
        ),
    )
}

fn read_only_error() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "image is open read-only")
}

impl FileStore {
    /// Size in bytes of the file or block device at `path`.
    pub fn len_bytes(path: impl AsRef<Path>) -> io::Result<u64> {
        let file = File::open(path)?;
        file_len(&file)
    }

    /// Create an image for `geometry` at `path`.
    ///
    /// A regular file is created or truncated to `META_AREA_SIZE +
    /// capacity` bytes (sparse: every byte reads as zero). A block device
    /// must already be large enough; its metadata area is zeroed, but its
    /// segments keep whatever bytes they held before.
    pub fn create(path: impl AsRef<Path>, geometry: Geometry) -> io::Result<FileStore> {
        let path = path.as_ref();
        check_geometry(geometry)?;
        let need = needed_bytes(geometry);
        let block_device = is_block_device(path)?;
        let file = if block_device {
            OpenOptions::new().read(true).write(true).open(path)?
        } else {
            // Never truncate before holding the lock: the image may be in use.
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?
        };
        let file = lock(file, true)?;
        if block_device {
            let have = file_len(&file)?;
            if have < need {
                return Err(too_small(have, geometry));
            }
            file.write_all_at(&vec![0u8; META_AREA_SIZE as usize], 0)?;
        } else {
            file.set_len(0)?;
            file.set_len(need)?;
            // Make the new directory entry durable too. Best effort: some
            // file systems refuse fsync on a directory.
            if let Some(dir) = path.parent() {
                let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
                if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                    tracing::debug!("syncing the directory of {}: {e}", path.display());
                }
            }
        }
        Ok(FileStore { file, geometry, read_only: false, block_device })
    }

    /// Open an existing image read-write with its geometry still unknown:
    /// only the metadata slots can be used until [`FileStore::with_geometry`]
    /// sets it (segment I/O fails with `InvalidInput`).
    pub fn open(path: impl AsRef<Path>) -> io::Result<FileStore> {
        Self::open_with(path.as_ref(), false)
    }

    /// Like [`FileStore::open`] but read-only: writes fail with
    /// `PermissionDenied`. Takes a shared lock, so several read-only openers
    /// may coexist, but not alongside a writer.
    pub fn open_read_only(path: impl AsRef<Path>) -> io::Result<FileStore> {
        Self::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, read_only: bool) -> io::Result<FileStore> {
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let file = lock(file, !read_only)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        let have = file_len(&file)?;
        if have < META_AREA_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("image is {have} bytes, smaller than the {META_AREA_SIZE}-byte metadata area"),
            ));
        }
        let geometry = Geometry { segment_size: 0, segment_count: 0 };
        Ok(FileStore { file, geometry, read_only, block_device })
    }

    /// Set the segment geometry (read from the superblock), checking that
    /// the image is large enough to hold it.
    pub fn with_geometry(mut self, geometry: Geometry) -> io::Result<FileStore> {
        check_geometry(geometry)?;
        let have = file_len(&self.file)?;
        if have < needed_bytes(geometry) {
            return Err(too_small(have, geometry));
        }
        self.geometry = geometry;
        Ok(self)
    }

    /// True if opened with [`FileStore::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// True if the image is a block device rather than a regular file.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    fn segment_pos(&self, seg: u32, offset: u32) -> u64 {
        META_AREA_SIZE + u64::from(seg) * u64::from(self.geometry.segment_size) + u64::from(offset)
    }

    /// Start writing `len` bytes at `pos` to the device without waiting
    /// (write-behind). The log writes a segment's batches once and never
    /// rewrites them, so there is no reason to keep them dirty in the page
    /// cache until the next sync: that would leave every byte of a large
    /// write to the sync at its end, with the CPUs idle while the device
    /// catches up. A hint: failures are ignored (the sync reports them).
    fn write_behind(&self, pos: u64, len: usize) {
        if len < WRITE_BEHIND_MIN {
            return;
        }
        let (Ok(pos), Ok(len)) = (libc::off64_t::try_from(pos), libc::off64_t::try_from(len)) else {
            return;
        };
        // nix has no sync_file_range.
        // SAFETY: `self.file` owns a valid open fd for the whole call;
        // sync_file_range only takes integers and touches no memory of ours.
        let rc =
            unsafe { libc::sync_file_range(self.file.as_raw_fd(), pos, len, libc::SYNC_FILE_RANGE_WRITE) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            tracing::debug!("write-behind of {len} bytes at {pos}: {e} (the next sync writes them)");
        }
    }

    fn meta_pos(slot: MetaSlot) -> u64 {
        slot.index() * META_SLOT_SIZE as u64
    }
}

impl Store for FileStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read_meta(&self, slot: MetaSlot, buf: &mut [u8; META_SLOT_SIZE]) -> io::Result<()> {
        self.file.read_exact_at(buf, Self::meta_pos(slot))
    }

    fn write_meta(&self, slot: MetaSlot, buf: &[u8; META_SLOT_SIZE]) -> io::Result<()> {
        if self.read_only {
            return Err(read_only_error());
        }
        self.file.write_all_at(buf, Self::meta_pos(slot))
    }

    fn read(&self, seg: u32, offset: u32, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.geometry, seg, offset, buf.len())?;
        self.file.read_exact_at(buf, self.segment_pos(seg, offset))
    }

    fn write(&self, seg: u32, offset: u32, data: &[u8]) -> io::Result<()> {
        check_range(self.geometry, seg, offset, data.len())?;
        if self.read_only {
            return Err(read_only_error());
        }
        let pos = self.segment_pos(seg, offset);
        self.file.write_all_at(data, pos)?;
        self.write_behind(pos, data.len());
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn discard(&self, seg: u32) -> io::Result<()> {
        self.discard_prefix(seg, self.geometry.segment_size)
    }

    /// A freed segment's bytes are punched out of an image file, so that
    /// the host file system (thin provisioning, a VM host) gets the space
    /// back: a cleaning pass once doubled the image file's size on the
    /// host. A failure only costs the space, and is logged.
    fn freed(&self, seg: u32) {
        if self.read_only {
            return;
        }
        if let Err(e) = self.discard(seg) {
            tracing::warn!("giving segment {seg}'s space back to the host file system: {e}");
        }
    }
}

impl FileStore {
    /// Like [`Store::discard`] for bytes `[0, len)` of segment `seg` only
    /// (what a cache of another store drops; bytes from `len` on keep
    /// their contents). A hint as well.
    pub fn discard_prefix(&self, seg: u32, len: u32) -> io::Result<()> {
        self.discard_range(seg, 0, len)
    }

    /// Like [`FileStore::discard_prefix`] for bytes `[offset, offset +
    /// len)` of segment `seg`.
    pub fn discard_range(&self, seg: u32, offset: u32, len: u32) -> io::Result<()> {
        check_range(self.geometry, seg, offset, len as usize)?;
        if self.read_only {
            return Err(read_only_error());
        }
        if self.block_device || len == 0 {
            return Ok(());
        }
        let Ok(pos) = i64::try_from(self.segment_pos(seg, offset)) else { return Ok(()) };
        let len = i64::from(len);
        let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match fallocate(&*self.file, punch, pos, len) {
            // Discard is a hint: a file system that cannot punch holes just
            // keeps the old bytes.
            Ok(()) | Err(Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A scratch directory removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "zlogfs-store-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn geo() -> Geometry {
        Geometry { segment_size: 64 * 1024, segment_count: 8 }
    }

    #[test]
    fn create_round_trip_and_layout() {
        let dir = TempDir::new();
        let p = dir.path("img");
        let s = FileStore::create(&p, geo()).unwrap();
        assert_eq!(FileStore::len_bytes(&p).unwrap(), META_AREA_SIZE + geo().capacity());
        assert!(!s.is_block_device());
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        s.write(3, 1024, &data).unwrap();
        let mut buf = vec![0u8; data.len()];
        s.read(3, 1024, &mut buf).unwrap();
        assert_eq!(buf, data);
        let meta = [0x5Au8; META_SLOT_SIZE];
        s.write_meta(MetaSlot::CheckpointB, &meta).unwrap();
        s.sync().unwrap();
        drop(s);

        // Check the on-disk layout directly.
        let raw = std::fs::read(&p).unwrap();
        let seg3 = (META_AREA_SIZE + 3 * 64 * 1024) as usize;
        assert_eq!(&raw[seg3 + 1024..seg3 + 1024 + data.len()], &data[..]);
        assert_eq!(&raw[2 * META_SLOT_SIZE..3 * META_SLOT_SIZE], &meta[..]);
    }

    #[test]
    fn unwritten_reads_zero() {
        let dir = TempDir::new();
        let s = FileStore::create(dir.path("img"), geo()).unwrap();
        let mut buf = vec![1u8; 64 * 1024];
        s.read(7, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        let mut m = [1u8; META_SLOT_SIZE];
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert!(m.iter().all(|&b| b == 0));
    }

    #[test]
    fn bounds_errors() {
        let dir = TempDir::new();
        let s = FileStore::create(dir.path("img"), geo()).unwrap();
        let mut buf = [0u8; 10];
        assert_eq!(s.read(8, 0, &mut buf).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(s.write(0, 64 * 1024 - 5, &buf).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(s.discard(8).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn bad_geometry_rejected() {
        let dir = TempDir::new();
        let g = Geometry { segment_size: 1000, segment_count: 2 };
        let e = FileStore::create(dir.path("img"), g).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn reopen_keeps_data_and_meta() {
        let dir = TempDir::new();
        let p = dir.path("img");
        let s = FileStore::create(&p, geo()).unwrap();
        s.write(1, 0, &[9u8; 4096]).unwrap();
        s.write_meta(MetaSlot::Super, &[3u8; META_SLOT_SIZE]).unwrap();
        s.sync().unwrap();
        drop(s);

        let s = FileStore::open(&p).unwrap();
        assert_eq!(s.geometry(), Geometry { segment_size: 0, segment_count: 0 });
        let mut m = [0u8; META_SLOT_SIZE];
        s.read_meta(MetaSlot::Super, &mut m).unwrap();
        assert_eq!(m, [3u8; META_SLOT_SIZE]);
        // No geometry yet: segment I/O is refused.
        let mut buf = [0u8; 4096];
        assert_eq!(s.read(1, 0, &mut buf).unwrap_err().kind(), io::ErrorKind::InvalidInput);

        let s = s.with_geometry(geo()).unwrap();
        s.read(1, 0, &mut buf).unwrap();
        assert_eq!(buf, [9u8; 4096]);
    }

    #[test]
    fn with_geometry_too_large() {
        let dir = TempDir::new();
        let p = dir.path("img");
        drop(FileStore::create(&p, geo()).unwrap());
        let s = FileStore::open(&p).unwrap();
        let big = Geometry { segment_size: 64 * 1024, segment_count: 9 };
        let e = s.with_geometry(big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("need"), "{e}");
    }

    #[test]
    fn open_rejects_tiny_file() {
        let dir = TempDir::new();
        let p = dir.path("tiny");
        std::fs::write(&p, b"hello").unwrap();
        let e = FileStore::open(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn read_only_refuses_writes() {
        let dir = TempDir::new();
        let p = dir.path("img");
        let s = FileStore::create(&p, geo()).unwrap();
        s.write(0, 0, &[1u8; 512]).unwrap();
        s.sync().unwrap();
        drop(s);
        let r = FileStore::open_read_only(&p).unwrap().with_geometry(geo()).unwrap();
        assert!(r.is_read_only());
        let mut buf = [0u8; 512];
        r.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, [1u8; 512]);
        assert_eq!(r.write(0, 512, &buf).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        let m = [0u8; META_SLOT_SIZE];
        assert_eq!(r.write_meta(MetaSlot::Super, &m).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        r.sync().unwrap();
        // A second reader is fine; a writer is not.
        let r2 = FileStore::open_read_only(&p).unwrap();
        assert_eq!(FileStore::open(&p).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop((r, r2));
        FileStore::open(&p).unwrap();
    }

    #[test]
    fn second_open_is_locked_out() {
        let dir = TempDir::new();
        let p = dir.path("img");
        let s = FileStore::create(&p, geo()).unwrap();
        s.write(0, 0, &[7u8; 512]).unwrap();
        for e in [
            FileStore::open(&p).unwrap_err(),
            FileStore::open_read_only(&p).unwrap_err(),
            FileStore::create(&p, geo()).unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            assert_eq!(e.to_string(), "image is in use by another process");
        }
        // The failed create did not truncate the image.
        let mut buf = [0u8; 512];
        s.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 512]);
        drop(s);
        FileStore::open(&p).unwrap();
    }

    #[test]
    fn a_freed_segment_gives_its_space_back() {
        use std::os::unix::fs::MetadataExt;
        let dir = TempDir::new();
        let p = dir.path("img");
        let s = FileStore::create(&p, geo()).unwrap();
        let seg = geo().segment_size as usize;
        for n in 0..4 {
            s.write(n, 0, &vec![n as u8 + 1; seg]).unwrap();
        }
        s.sync().unwrap();
        let before = std::fs::metadata(&p).unwrap().blocks() * 512;
        s.freed(1);
        s.freed(2);
        let after = std::fs::metadata(&p).unwrap().blocks() * 512;
        assert!(after + 2 * seg as u64 <= before, "{before} -> {after} bytes allocated");
        let mut buf = vec![0u8; seg];
        s.read(3, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 4), "the others keep their bytes");
        s.write(1, 0, &[9u8; 512]).unwrap();
        s.read(1, 0, &mut buf[..512]).unwrap();
        assert_eq!(&buf[..512], &[9u8; 512], "a freed segment takes writes again");
    }

    #[test]
    fn discard_then_rewrite() {
        let dir = TempDir::new();
        let s = FileStore::create(dir.path("img"), geo()).unwrap();
        s.write(2, 0, &[4u8; 8192]).unwrap();
        s.write(3, 0, &[5u8; 512]).unwrap();
        s.discard(2).unwrap();
        s.write(2, 0, &[6u8; 512]).unwrap();
        let mut buf = [0u8; 512];
        s.read(2, 0, &mut buf).unwrap();
        assert_eq!(buf, [6u8; 512]);
        // The neighbour is untouched.
        s.read(3, 0, &mut buf).unwrap();
        assert_eq!(buf, [5u8; 512]);
    }

    #[test]
    fn create_truncates_existing() {
        let dir = TempDir::new();
        let p = dir.path("img");
        let s = FileStore::create(&p, geo()).unwrap();
        s.write(0, 0, &[1u8; 512]).unwrap();
        drop(s);
        let s = FileStore::create(&p, geo()).unwrap();
        let mut buf = [9u8; 512];
        s.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 512]);
    }

    #[test]
    fn concurrent_writers_share_a_handle() {
        let dir = TempDir::new();
        let s = std::sync::Arc::new(FileStore::create(dir.path("img"), geo()).unwrap());
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..16u32 {
                        s.write(t, i * 512, &[(t * 16 + i) as u8; 512]).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let mut buf = [0u8; 512];
        for t in 0..4u32 {
            for i in 0..16u32 {
                s.read(t, i * 512, &mut buf).unwrap();
                assert_eq!(buf, [(t * 16 + i) as u8; 512]);
            }
        }
    }
}
