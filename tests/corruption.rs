//! Corruption: flip bits in every structure on disk — superblock, both
//! checkpoint slots, and every written byte range of every segment (batch
//! headers, summaries, journal, run and checkpoint blocks, padding). Opening
//! and reading everything must either give exactly the right data or fail
//! with an error that names what is damaged: never a panic, never wrong data.

mod common;
use std::sync::Arc;

use common::workload::*;
use common::*;
use rand::Rng;
use zlogfs::store::{FaultStore, MetaSlot, Target};
use zlogfs::Error;

fn acceptable(err: &Error) -> bool {
    err.is_corruption() || matches!(err, Error::NotAnImage(_) | Error::Unsupported(_))
}

/// Build an image through a workload; returns the store and its state.
fn build(seed: u64, close: bool) -> (Arc<FaultStore>, Model) {
    let mut r = rng(seed);
    let steps = workload(&mut r, 150);
    let states = model_states(&steps);
    let st = fresh_store();
    let e = open(&st, &small_opts()).unwrap();
    for s in &steps {
        match s {
            Step::Write(b) => drop(e.write(b).unwrap()),
            Step::Blob(k, c) => write_blob(&e, k, c).unwrap(),
            Step::Sync => e.sync().unwrap(),
            Step::Flush => e.flush().unwrap(),
            Step::Merge => e.merge().unwrap(),
            Step::Checkpoint => e.checkpoint().unwrap(),
        }
    }
    e.sync().unwrap();
    if close {
        e.close().unwrap();
    } else {
        drop(e);
    }
    let model = states[states.len() - 1].clone();
    assert_eq!(dump(&open(&st, &small_opts()).unwrap()).unwrap(), model);
    (st, model)
}

/// Flip one bit and check the outcome. Returns true if it was detected.
fn flip(st: &FaultStore, model: &Model, target: Target, offset: u64, bit: u8, ctx: &str) -> bool {
    let f = Arc::new(st.fork());
    f.corrupt_durable(target, offset, bit);
    let ctx = format!("{ctx}: bit {bit} of byte {offset} of {target:?}");
    let got = open(&f, &small_opts()).and_then(|e| dump(&e));
    match got {
        Ok(m) => {
            assert!(m == *model, "wrong data after a bit flip ({ctx})");
            false
        }
        Err(e) => {
            assert!(acceptable(&e), "unexpected error class: {e} ({ctx})");
            true
        }
    }
}

#[test]
fn bit_flips_anywhere_are_detected_or_harmless() {
    let seed = seed("bit_flips_anywhere_are_detected_or_harmless");
    let mut r = rng(seed);
    let (st, model) = build(seed, true);
    let ctx = format!("seed {seed}");
    let mut detected = 0;
    let mut flips = 0;
    // Every byte of the superblock's used part and its crc.
    for off in (0..72).chain(4092..4096) {
        flips += 1;
        assert!(
            flip(&st, &model, Target::Meta(MetaSlot::Super), off, r.gen_range(0..8), &ctx),
            "superblock damage must be reported ({ctx}, byte {off})"
        );
        detected += 1;
    }
    // The checkpoint slots: damage to one falls back to the other.
    for slot in [MetaSlot::CheckpointA, MetaSlot::CheckpointB] {
        for off in (0..92).chain(4092..4096) {
            flips += 1;
            detected += usize::from(flip(&st, &model, Target::Meta(slot), off, r.gen_range(0..8), &ctx));
        }
    }
    // Segments: a sample of every written range.
    for (seg, end) in st.written_segments() {
        let mut off = r.gen_range(0..97u64);
        while off < u64::from(end) {
            flips += 1;
            detected += usize::from(flip(&st, &model, Target::Segment(seg), off, r.gen_range(0..8), &ctx));
            off += r.gen_range(8..48);
        }
    }
    eprintln!("{flips} bit flips, {detected} detected, the rest harmless");
    assert!(flips > 2000 && detected > 0);
}

#[test]
fn damaged_synced_batch_is_an_error_not_a_silent_truncation() {
    // An image whose newest state lives in the journal (no close), with
    // several synced batches after the last checkpoint.
    let seed = seed("damaged_synced_batch_is_an_error");
    let st = fresh_store();
    let opts = small_opts();
    let e = open(&st, &opts).unwrap();
    for i in 0..5u32 {
        let mut b = zlogfs::WriteBatch::new();
        b.put(format!("key{i}"), vec![i as u8; 100]);
        e.write_sync(&b).unwrap();
    }
    drop(e);
    // Find the batches: the log starts after the mkfs checkpoint in segment 0.
    let written = st.written_segments();
    assert!(!written.is_empty());
    // Damage a byte inside the second journal batch (each is one sector).
    let (seg, _) = written[0];
    let before = Arc::new(st.fork());
    let e = open(&before, &opts).unwrap();
    assert_eq!(dump(&e).unwrap().len(), 5);
    drop(e);
    let f = Arc::new(st.fork());
    f.corrupt_durable(Target::Segment(seg), 512 * 2 + 100, 3);
    match open(&f, &opts).and_then(|e| dump(&e)) {
        Err(e) => {
            assert!(e.is_corruption(), "{e}");
            let msg = e.to_string();
            assert!(msg.contains("segment") && msg.contains("offset"), "error must name the place: {msg}");
            eprintln!("seed {seed}: {msg}");
        }
        Ok(m) => panic!("a damaged synced batch was silently dropped: {} keys left", m.len()),
    }
}
