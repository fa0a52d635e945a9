//! The engine on a real image file: data survives close and reopen, and a
//! second opener is refused.

use std::sync::Arc;

use zlogfs_engine::engine::{BlockWrite, Room};
use zlogfs_engine::store::{FileStore, Geometry, Store};
use zlogfs_engine::{engine, Engine, Options, WriteBatch};

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("zlogfs-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

fn open(path: &std::path::Path) -> zlogfs_engine::Result<Engine> {
    let f = FileStore::open(path).map_err(|e| zlogfs_engine::Error::io("open", e))?;
    let sb = engine::read_superblock(&f)?;
    let f = f.with_geometry(sb.geometry).map_err(|e| zlogfs_engine::Error::io("geometry", e))?;
    Engine::open(Arc::new(f), Options::default())
}

#[test]
fn file_image_round_trip_and_lock() {
    let d = tmpdir("roundtrip");
    let img = d.join("a.img");
    let g = Geometry { segment_size: 1 << 20, segment_count: 32 };
    let s: Arc<dyn Store> = Arc::new(FileStore::create(&img, g).unwrap());
    engine::mkfs(s).unwrap();
    let e = open(&img).unwrap();
    // A second opener is refused while the first holds the image.
    let err = FileStore::open(&img).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    for i in 0..5000u32 {
        let mut b = WriteBatch::new();
        b.put(i.to_be_bytes().to_vec(), format!("value-{i}").repeat(3));
        e.write(&b).unwrap();
    }
    e.flush().unwrap();
    let mut b = WriteBatch::new();
    b.put(b"tail".to_vec(), b"in the journal".to_vec());
    e.write_sync(&b).unwrap();
    let spec = "zstd:3".parse().unwrap();
    let q = vec![b'q'; 65536];
    let writes = vec![BlockWrite::new(7, spec, &q), BlockWrite::new(7, spec, b"tiny")];
    let blocks = e.write_blocks(Room::User, writes).unwrap();
    e.sync().unwrap();
    drop(e);
    let e = open(&img).unwrap();
    assert_eq!(e.get(&1234u32.to_be_bytes()).unwrap(), Some("value-1234".repeat(3).into_bytes()));
    assert_eq!(e.get(b"tail").unwrap(), Some(b"in the journal".to_vec()));
    assert_eq!(e.read_block(blocks[0]).unwrap(), vec![b'q'; 65536]);
    assert_eq!(e.read_block(blocks[1]).unwrap(), b"tiny".to_vec());
    assert!(blocks[0].len < 1000, "64 KiB of one byte must compress: {:?}", blocks[0]);
    e.close().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}
