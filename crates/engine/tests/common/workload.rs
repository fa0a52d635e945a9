//! A seeded engine workload and the model states it passes through.

use rand::rngs::StdRng;
use rand::Rng;
use zlogfs_engine::WriteBatch;

use zlogfs_engine::engine::{BlockWrite, Room};
use zlogfs_engine::BlockAddr;
use zlogfs_engine::Engine;

use super::{key, value, Model, BLOB_PREFIX};

/// Execute a blob step: the block, then the batch that references it.
pub fn write_blob(e: &Engine, key: &[u8], content: &[u8]) -> zlogfs_engine::Result<()> {
    let spec = "zstd:1".parse()?;
    // Odd-length contents go to the bulk device of an image of two (one
    // device takes both alike).
    let tier = if content.len() % 2 == 1 { zlogfs_engine::Tier::Bulk } else { zlogfs_engine::Tier::Fast };
    let addr = e.write_blocks(Room::User, vec![BlockWrite::new(1, spec, content).on(tier)])?[0];
    let mut b = WriteBatch::new();
    if let Some(prev) = e.get(key)? {
        b.free(decode_addr(&prev));
    }
    let mut v = Vec::new();
    addr.put(&mut v);
    b.put(key.to_vec(), v);
    e.write(&b).map(|_| ())
}

pub fn decode_addr(v: &[u8]) -> BlockAddr {
    let mut r = zlogfs_engine::bytes::Reader::new(v, "blob reference");
    BlockAddr::get(&mut r).expect("blob reference")
}

pub enum Step {
    Write(WriteBatch),
    /// Store `content` as a data block and point `key` at it, freeing the
    /// block the key pointed at before.
    Blob(Vec<u8>, Vec<u8>),
    Sync,
    Flush,
    Merge,
    Checkpoint,
}

pub fn workload(r: &mut StdRng, n: usize) -> Vec<Step> {
    (0..n)
        .map(|_| match r.gen_range(0..100) {
            0..=59 => {
                let mut b = WriteBatch::new();
                for _ in 0..r.gen_range(1..4) {
                    if r.gen_ratio(1, 4) {
                        b.delete(key(r));
                    } else {
                        b.put(key(r), value(r));
                    }
                }
                Step::Write(b)
            }
            60..=69 => {
                let n = r.gen_range(0..8u32);
                let len = if r.gen_ratio(1, 3) { r.gen_range(10_000..30_000) } else { r.gen_range(1..2000) };
                let fill = r.gen::<u8>();
                let content = (0..len).map(|i| if i % 5 == 0 { r.gen() } else { fill }).collect();
                Step::Blob(format!("{BLOB_PREFIX}{n}").into_bytes(), content)
            }
            70..=84 => Step::Sync,
            85..=91 => Step::Flush,
            92..=95 => Step::Merge,
            _ => Step::Checkpoint,
        })
        .collect()
}

/// Apply a batch to the model.
pub fn apply(m: &mut Model, b: &WriteBatch) {
    for op in &b.ops {
        match op {
            zlogfs_engine::Op::Put(k, v) => {
                m.insert(k.clone(), v.clone());
            }
            zlogfs_engine::Op::Delete(k) => {
                m.remove(k);
            }
            zlogfs_engine::Op::Free(_) => {}
        }
    }
}

/// Model states: `states[i]` is the state after the first `i` writes.
pub fn model_states(steps: &[Step]) -> Vec<Model> {
    let mut m = Model::new();
    let mut states = vec![m.clone()];
    for s in steps {
        if let Step::Write(b) = s {
            apply(&mut m, b);
            states.push(m.clone());
        }
        if let Step::Blob(k, content) = s {
            m.insert(k.clone(), content.clone());
            states.push(m.clone());
        }
    }
    states
}
