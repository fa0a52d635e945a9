//! An image in a bucket (moto on 127.0.0.1) through the file system
//! layer: what the file system frees leaves the bucket.

use std::sync::Arc;
use std::time::Duration;

use zlogfs_engine::store::{Geometry, Store};
use zlogfs_fs::{self as fs, Fs, FsOptions, MkfsOptions, ROOT};
use zlogfs_s3::{S3Options, S3Store, S3Url, SyncMode};

struct Cache(std::path::PathBuf);
impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bytes that compress about 2:1, different for each `seed`.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 2 == 0 {
                b'a'
            } else {
                x as u8
            }
        })
        .collect()
}

/// Segments the file system frees lose their objects: a tree written and
/// deleted leaves the bucket close to empty, not holding every segment
/// ever written.
#[test]
fn freed_segments_leave_the_bucket() {
    let moto = zlogfs_testkit::s3::moto();
    let bucket = format!("space-{}", std::process::id());
    moto.bucket(&bucket);
    let cache = Cache(std::env::temp_dir().join(format!("zlogfs-space-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&cache.0);
    let url = S3Url { bucket: bucket.clone(), prefix: "img".into() };
    let opts = S3Options {
        sync: SyncMode::Remote,
        keep_replaced: Duration::ZERO,
        ..S3Options::new(url, cache.0.clone())
    };
    let g = Geometry { segment_size: 512 << 10, segment_count: 256 };
    let made: Arc<dyn Store> = Arc::new(S3Store::create(opts.clone(), g).expect("an image in the bucket"));
    fs::mkfs(made, &MkfsOptions::default()).expect("mkfs");
    let f =
        Fs::open(Arc::new(S3Store::open(opts.clone()).expect("open")), FsOptions::default()).expect("open");
    for i in 0..48u64 {
        let a = f.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).expect("create");
        f.write(a.ino, 0, &data(i, 256 << 10)).expect("write");
    }
    f.sync().expect("sync");
    let (_, full) = zlogfs_testkit::s3::stored(&bucket, "img/seg");
    for i in 0..48u64 {
        f.unlink(ROOT, format!("f{i}").as_bytes()).expect("unlink");
    }
    f.sync().expect("sync");
    f.close().expect("close");
    // A reopen and close: checkpoints move past the freed segments.
    let f =
        Fs::open(Arc::new(S3Store::open(opts.clone()).expect("open")), FsOptions::default()).expect("open");
    f.close().expect("close");
    let (n, after) = zlogfs_testkit::s3::stored(&bucket, "img/seg");
    eprintln!("{full} bytes of pieces with the files, {after} in {n} pieces after deleting them");
    assert!(after * 4 < full, "freed segments' pieces stayed: {after} of {full} bytes");
    let f = Fs::open(Arc::new(S3Store::open(opts).expect("open")), FsOptions::default()).expect("open");
    let rep = f.check(&|_, _| {}).expect("fsck");
    assert!(rep.problems.is_empty(), "fsck: {:?}", rep.problems);
    f.close().expect("close");
}
