//! A seeded engine workload and the model states it passes through.

use rand::rngs::StdRng;
use rand::Rng;
use zlogfs::WriteBatch;

use super::{key, value, Model};

pub enum Step {
    Write(WriteBatch),
    Sync,
    Flush,
    Merge,
    Checkpoint,
}

pub fn workload(r: &mut StdRng, n: usize) -> Vec<Step> {
    (0..n)
        .map(|_| match r.gen_range(0..100) {
            0..=69 => {
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
            70..=84 => Step::Sync,
            85..=91 => Step::Flush,
            92..=95 => Step::Merge,
            _ => Step::Checkpoint,
        })
        .collect()
}

/// Model states: `states[i]` is the state after the first `i` writes.
pub fn model_states(steps: &[Step]) -> Vec<Model> {
    let mut m = Model::new();
    let mut states = vec![m.clone()];
    for s in steps {
        if let Step::Write(b) = s {
            for op in &b.ops {
                match op {
                    zlogfs::Op::Put(k, v) => {
                        m.insert(k.clone(), v.clone());
                    }
                    zlogfs::Op::Delete(k) => {
                        m.remove(k);
                    }
                    zlogfs::Op::Free(_) => {}
                }
            }
            states.push(m.clone());
        }
    }
    states
}
