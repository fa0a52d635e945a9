//! `zlogfs mkfs`: a new image on a file, a block device, two devices or
//! a bucket.

use std::path::Path;
use std::sync::Arc;

use zlogfs_engine::engine;
use zlogfs_engine::store::{FileStore, Geometry, Store, TwoStore, META_AREA_SIZE};
use zlogfs_engine::{validate_geometry, DEFAULT_SEGMENT_SIZE};
use zlogfs_fs::{self as zfs, MkfsOptions};

use super::*;

/// The size of the image mkfs makes at `path`: a block device's own, else
/// `size`; refused when `path` is a directory, or exists without `force`.
pub(crate) fn target_size(path: &Path, size: u64, force: bool) -> Result<u64, String> {
    let is_dev = std::fs::metadata(path)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    if path.is_dir() {
        return Err(format!(
            "{} is a directory: give an image file (it is created) or a block device",
            path.display()
        ));
    }
    if path.exists() && !force {
        return Err(format!("{} already exists; pass --force to overwrite it", path.display()));
    }
    if is_dev {
        FileStore::len_bytes(path).map_err(|e| format!("cannot size {}: {e}", path.display()))
    } else {
        Ok(size)
    }
}

pub(crate) fn mkfs(image: &Path, f: &FormatArgs, force: bool, parts: &Parts) -> Result<(), String> {
    let s3 = s3_url(image)?;
    let size = match &s3 {
        Some(_) if force => {
            return Err(format!(
                "{}: --force cannot empty a bucket: delete the prefix's objects first",
                image.display()
            ))
        }
        Some(_) => f.size.unwrap_or(1 << 40),
        None => target_size(image, f.size.unwrap_or(1 << 30), force)?,
    };
    let fast = parts.fast.as_ref();
    let fast_size = match fast {
        Some(p) => Some(target_size(p, f.fast_size.unwrap_or(size / 8), force)?),
        None if f.fast_size.is_some() => {
            return Err("--fast-size is the size of the --fast PATH device".into())
        }
        None => None,
    };
    let segment_size = match f.segment_size {
        Some(s) => u32::try_from(s).map_err(|_| "segment size too large".to_string())?,
        None if size < 1 << 30 => 1 << 20,
        None => DEFAULT_SEGMENT_SIZE,
    };
    let segments = |bytes: u64| {
        let n = bytes.saturating_sub(META_AREA_SIZE) / u64::from(segment_size);
        Geometry { segment_size, segment_count: u32::try_from(n).unwrap_or(u32::MAX) }
    };
    let geometry = segments(size);
    validate_geometry(geometry).map_err(|e| format!("cannot make an image of {size} bytes: {e}"))?;
    let small = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} is too large"));
    let o = MkfsOptions {
        chunk_size: small(f.chunk_size, "chunk size")?,
        pack_bytes: small(f.pack_size, "pack size")?,
        inline_max: small(f.inline_max, "inline limit")?,
        codec: f.codec,
        root_uid: nix::unistd::getuid().as_raw(),
        root_gid: nix::unistd::getgid().as_raw(),
        history: f.history,
        small_max: f.small_file_max,
    };
    let create = |p: &Path, g: Geometry| {
        FileStore::create(p, g).map_err(|e| format!("cannot create {}: {e}", p.display()))
    };
    let store: Arc<dyn Store> = match (fast, fast_size) {
        (Some(fp), Some(fsize)) => {
            if absolute(fp) == absolute(image) {
                return Err(format!(
                    "--fast {} is the image itself: the fast device must be another file or device",
                    fp.display()
                ));
            }
            let fg = segments(fsize);
            if fg.segment_count < 4 {
                return Err(format!(
                    "the fast device of {fsize} bytes holds {} segments of {segment_size} bytes; it needs \
                     at least 4 (--fast-size {})",
                    fg.segment_count,
                    META_AREA_SIZE + 4 * u64::from(segment_size)
                ));
            }
            let (bulk, fst) = (create(image, geometry)?, create(fp, fg)?);
            let names = (absolute(fp).display().to_string(), absolute(image).display().to_string());
            let two =
                TwoStore::new(Arc::new(fst), Arc::new(bulk), names, false).map_err(|e| e.to_string())?;
            eprintln!(
                "fast device {}: {} segments ({} MiB): metadata, small files (up to {} KiB), packs",
                fp.display(),
                fg.segment_count,
                fg.capacity() >> 20,
                o.small_max >> 10
            );
            Arc::new(two)
        }
        _ if s3.is_some() => {
            let opts = s3_options(s3.clone().ok_or("no address")?, false, &parts.s3);
            let store = zlogfs_s3::S3Store::create(opts, geometry).map_err(|e| e.to_string())?;
            Arc::new(store)
        }
        _ => Arc::new(create(image, geometry)?),
    };
    zfs::mkfs(store.clone(), &o).map_err(|e| format!("{}: {e}", image.display()))?;
    // An image in a bucket is there once uploaded.
    store.close().map_err(|e| format!("{}: {e}", image.display()))?;
    let sb = engine::read_superblock(store.as_ref()).map_err(|e| e.to_string())?;
    let g = store.geometry();
    eprintln!(
        "created {}: {} segments of {} KiB ({} MiB), chunks of {} KiB, codec {}, history {}, uuid {}",
        image.display(),
        g.segment_count,
        g.segment_size / 1024,
        g.capacity() >> 20,
        o.chunk_size / 1024,
        o.codec,
        o.history,
        sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    Ok(())
}
