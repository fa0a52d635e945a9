//! Writes seed corpora for the fuzz targets: valid encodings of every
//! on-disk structure, made with zlogfs's own encoders.
//!
//! Usage: gen_seeds <corpus dir>   (writes <corpus dir>/<target>/seed-*)
//!
//! Seeds are generated rather than committed so they follow format changes.

use std::fs;
use std::path::{Path, PathBuf};

use zlogfs_engine::bytes::{crc, Put};
use zlogfs_engine::codec::{self, CodecId, CodecSpec};
use zlogfs_engine::engine::{CheckpointBody, CheckpointHead};
use zlogfs_engine::index::run::{encode_data_block, encode_index_block, Bloom, IndexEntry, RunMeta};
use zlogfs_engine::index::Entry;
use zlogfs_engine::log::format::*;
use zlogfs_engine::log::{NewBlock, SegUsage};
use zlogfs_engine::store::Geometry;

struct Out {
    root: PathBuf,
    count: usize,
}

impl Out {
    fn write(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir).expect("create corpus dir");
        fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
        self.count += 1;
    }
}

/// Deterministic pseudo-random bytes.
fn noise(n: usize, mut s: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

fn text(n: usize) -> Vec<u8> {
    let words = ["the ", "log ", "segment ", "block ", "checkpoint\n", "zlogfs ", "Index(", ") ", "0123 ", "\t*"];
    let mut v = Vec::new();
    let mut i = 7usize;
    while v.len() < n {
        i = (i * 31 + 11) % 97;
        v.extend_from_slice(words[i % words.len()].as_bytes());
    }
    v.truncate(n);
    v
}

fn samples() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("short", b"hello, zlogfs".to_vec()),
        ("text", text(3000)),
        ("zeros", vec![0u8; 2048]),
        ("noise", noise(1500, 42)),
    ]
}

fn entries() -> Vec<Entry> {
    let mut v = Vec::new();
    for i in 0..20u64 {
        let key = format!("inode/{:04}/name{}", i / 3, i % 3).into_bytes();
        let value = if i % 5 == 4 { None } else { Some(text(10 + i as usize * 7)) };
        v.push(Entry { key, seq: 1000 - i, value });
    }
    // A second version of the last key, older (lower seq) sorts after.
    let last = v.last().unwrap().clone();
    v.push(Entry { key: last.key, seq: 1, value: Some(b"old".to_vec()) });
    v
}

fn addr(i: u32) -> BlockAddr {
    BlockAddr { seg: i % 7, offset: i * 512, len: 16 + i * 3 }
}

fn seal(kind: BlockKind, spec: CodecSpec, raw: &[u8]) -> Vec<u8> {
    NewBlock::encode(kind, 0, spec, raw).bytes().to_vec()
}

fn journal() -> Vec<u8> {
    let mut v = Vec::new();
    for (first, n) in [(1u64, 3u64), (4, 1), (5, 2)] {
        v.put_var(first);
        v.put_var(n);
        for j in 0..n {
            match (first + j) % 3 {
                0 => {
                    v.put_u8(1);
                    v.put_lenbytes(format!("key{first}-{j}").as_bytes());
                    v.put_lenbytes(&text(40));
                }
                1 => {
                    v.put_u8(2);
                    v.put_lenbytes(b"deleted key");
                }
                _ => {
                    v.put_u8(3);
                    addr(j as u32).put(&mut v);
                }
            }
        }
    }
    v
}

fn checkpoint_body() -> CheckpointBody {
    let run = |id: u64| RunMeta {
        id,
        level: 1,
        tombstones: 3,
        entries: 21,
        min_seq: 1,
        max_seq: 1000,
        min_key: b"inode/0000/name0".to_vec(),
        max_key: b"inode/0006/name2".to_vec(),
        index: addr(id as u32),
        filter: addr(id as u32 + 1),
        bytes: 12345,
    };
    CheckpointBody {
        number: 7,
        flushed_seq: 900,
        next_seq: 1001,
        horizon: 800,
        next_run_id: 3,
        prev_body: addr(5),
        deferred: vec![(6, addr(1)), (6, addr(2))],
        runs: vec![run(2), run(1)],
        usage: (0..8).map(|i| SegUsage { live: i * 4096, last_batch: u64::from(i) * 3 }).collect(),
    }
}

fn main() {
    let root = std::env::args_os().nth(1).expect("usage: gen_seeds <corpus dir>");
    let mut out = Out { root: Path::new(&root).to_path_buf(), count: 0 };

    // Superblock.
    let sb = Superblock {
        version: FORMAT_VERSION,
        compat: 0,
        incompat: 0,
        ro_compat: 0,
        uuid: *b"0123456789abcdef",
        geometry: Geometry { segment_size: DEFAULT_SEGMENT_SIZE, segment_count: 16 },
        created_ns: 1_700_000_000_000_000_000,
        fast_segments: 0,
        role: Role::Single,
        partner: String::new(),
    };
    out.write("fuzz_superblock", "valid", &sb.encode());
    // The bulk device of two, naming its fast device.
    let two = Superblock {
        incompat: INCOMPAT_TWO_DEVICES,
        fast_segments: 4,
        role: Role::Bulk,
        partner: "/var/lib/zlogfs/fast.img".into(),
        ..sb.clone()
    };
    out.write("fuzz_superblock", "two", &two.encode());

    // Checkpoint slot.
    let pos = |seg: u32| LogPos {
        seg,
        offset: 1024,
        batch_seq: 42,
        prev_crc: 0xdead_beef,
        next_seg: NO_SEGMENT,
        alt: None,
        seg_prev_crc: 0,
    };
    let slot = CheckpointSlot { number: 9, uuid: sb.uuid, body: addr(4), replay: pos(1), after_body: pos(2) };
    out.write("fuzz_checkpoint_slot", "valid", &slot.encode());
    // Of two devices: the bulk head at the replay start.
    let alt = HeadPos { seg: 9, offset: 512, next_seg: 10, seg_prev_crc: 0x0bad_cafe };
    let replay = LogPos { alt: Some(alt), seg_prev_crc: 0x1234_5678, ..pos(1) };
    let slot = CheckpointSlot { replay, ..slot };
    out.write("fuzz_checkpoint_slot", "two", &slot.encode());

    // Run blocks.
    let ents = entries();
    out.write("fuzz_run_blocks", "data", &encode_data_block(&ents));
    out.write("fuzz_run_blocks", "data-empty", &encode_data_block(&[]));
    let idx: Vec<IndexEntry> = ents
        .iter()
        .step_by(4)
        .enumerate()
        .map(|(i, e)| IndexEntry { last_key: e.key.clone(), last_seq: e.seq, addr: addr(i as u32) })
        .collect();
    out.write("fuzz_run_blocks", "index", &encode_index_block(&idx));
    let bloom = Bloom::build(ents.len(), ents.iter().map(|e| e.key.as_slice()));
    out.write("fuzz_run_blocks", "filter", &bloom.encode());

    // Checkpoint body and journal.
    let body = checkpoint_body();
    out.write("fuzz_checkpoint_body", "valid", &body.encode());
    out.write("fuzz_checkpoint_body", "one-block", &body.encode_without_levels());
    let head =
        CheckpointHead { number: 7, body_len: 70_000, parts: vec![addr(8), addr(9)], prev_parts: vec![addr(4)] };
    out.write("fuzz_checkpoint_body", "head", &head.encode());
    out.write("fuzz_journal", "valid", &journal());

    // Codec payloads: codec byte, raw_len (u32 LE), payload.
    for id in CodecId::ALL {
        for (name, raw) in samples() {
            let mut c = Vec::new();
            codec::codec(id).compress(CodecSpec::default_level(id), &raw, &mut c);
            let mut v = vec![id as u8];
            v.put_u32(raw.len() as u32);
            v.extend_from_slice(&c);
            out.write("fuzz_codec", &format!("{}-{name}", id.name()), &v);
        }
    }

    // Blocks: every kind, every codec (stored raw when compression does not pay).
    let payloads: Vec<(BlockKind, Vec<u8>)> = vec![
        (BlockKind::Journal, journal()),
        (BlockKind::RunData, encode_data_block(&ents)),
        (BlockKind::RunIndex, encode_index_block(&idx)),
        (BlockKind::RunFilter, bloom.encode()),
        (BlockKind::Checkpoint, body.encode_without_levels()),
        (BlockKind::Data, text(3000)),
        (BlockKind::CheckpointHead, head.encode()),
        (BlockKind::CheckpointPart, body.encode()[..40].to_vec()),
    ];
    for (kind, raw) in &payloads {
        for id in CodecId::ALL {
            let spec = CodecSpec::new(id, CodecSpec::default_level(id));
            let name = format!("{}-{}", kind.name().replace(' ', "_"), id.name());
            out.write("fuzz_block", &name, &seal(*kind, spec, raw));
        }
    }

    // A batch: header, a few blocks, summary.
    let mut b = vec![0u8; BATCH_HEADER_SIZE];
    let mut summary = Vec::new();
    for (i, (kind, raw)) in payloads.iter().enumerate() {
        let spec = CodecSpec::new(CodecId::ALL[i % CodecId::ALL.len()], 0).normalized();
        let blk = seal(*kind, spec, raw);
        let e = SummaryEntry {
            kind: *kind as u8,
            codec: blk[4],
            offset: b.len() as u32,
            len: blk.len() as u32,
            raw_len: raw.len() as u32,
            owner: i as u64 * 10,
        };
        e.put(&mut summary);
        b.extend_from_slice(&blk);
        // Blocks need not be adjacent: leave a gap after the first.
        if i == 0 {
            b.extend_from_slice(&[0u8; 8]);
        }
    }
    let summary_off = b.len() as u32;
    b.extend_from_slice(&summary);
    let mut h = BatchHeader {
        batch_crc: 0,
        log_id: sb.log_id(),
        seq: 42,
        prev_crc: 0xdead_beef,
        total_len: b.len() as u32,
        summary_off,
        summary_count: payloads.len() as u32,
        next_seg: NO_SEGMENT,
        epoch: 0x1234_5678,
        durable_seq: 41,
        seg_prev_crc: 0,
        bulk_head: false,
    };
    b[..BATCH_HEADER_SIZE].copy_from_slice(&h.encode());
    h.batch_crc = crc(&b[8..]);
    b[..BATCH_HEADER_SIZE].copy_from_slice(&h.encode());
    out.write("fuzz_batch", "valid", &b);
    // An empty batch (header only).
    let h0 = BatchHeader { total_len: BATCH_HEADER_SIZE as u32, summary_off: BATCH_HEADER_SIZE as u32, summary_count: 0, ..h };
    out.write("fuzz_batch", "empty", &h0.encode());

    println!("gen_seeds: wrote {} seeds under {}", out.count, out.root.display());
}
