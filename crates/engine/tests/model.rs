//! Model test: random sequences of put / delete / get / scan / flush /
//! merge / checkpoint / snapshot reads / close-and-reopen, checked against
//! a BTreeMap after every step.
#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions unwrap like the tests")]

mod common;
use common::*;
use rand::Rng;
use zlogfs_engine::WriteBatch;

fn run(seed: u64, steps: usize) {
    let mut r = rng(seed);
    let store = fresh_store();
    let opts = small_opts();
    let mut e = open(&store, &opts).unwrap();
    let mut model = Model::new();
    // Pinned snapshots and the model state they must read.
    let mut snaps: Vec<(zlogfs_engine::Snapshot, Model)> = Vec::new();
    for step in 0..steps {
        let ctx = || format!("seed {seed} step {step}");
        match r.gen_range(0..100) {
            40..=44 => {
                let n = r.gen_range(0..6u32);
                let len = if r.gen_ratio(1, 4) { r.gen_range(5000..32_000) } else { r.gen_range(0..3000) };
                let content: Vec<u8> = (0..len).map(|i| (i as u8) ^ (n as u8)).collect();
                let k = format!("{BLOB_PREFIX}{n}").into_bytes();
                common::workload::write_blob(&e, &k, &content).unwrap();
                model.insert(k, content);
            }
            0..=39 => {
                e.write(&random_batch(&mut r, &mut model)).unwrap();
            }
            45..=59 => {
                let k = key(&mut r);
                assert_eq!(e.get(&k).unwrap(), model.get(&k).cloned(), "get {}", ctx());
            }
            60..=69 => {
                let a = key(&mut r);
                let b = key(&mut r);
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                let limit = r.gen_range(1..20);
                let got = e.scan(&lo, Some(&hi), limit).unwrap();
                let want: Vec<_> = model
                    .range(lo.clone()..hi.clone())
                    .take(limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(got, want, "scan {}", ctx());
            }
            70..=73 => e.flush().unwrap(),
            74..=75 => e.merge().unwrap(),
            76..=78 => e.checkpoint().unwrap(),
            79..=82 => e.sync().unwrap(),
            83..=85 => {
                if snaps.len() < 3 {
                    snaps.push((e.snapshot(), model.clone()));
                }
            }
            86..=89 => {
                if let Some((s, m)) = snaps.first() {
                    let k = key(&mut r);
                    assert_eq!(e.get_at(&k, s.seq).unwrap(), m.get(&k).cloned(), "get_at {}", ctx());
                    let all = dump_at(&e, s.seq).unwrap();
                    assert_eq!(&all, m, "scan_at {}", ctx());
                }
                if r.gen_ratio(1, 3) && !snaps.is_empty() {
                    snaps.remove(0);
                }
            }
            90..=95 => {
                // Clean close and reopen (snapshots do not survive).
                snaps.clear();
                e.close().unwrap();
                e = open(&store, &opts).unwrap();
                assert_eq!(dump(&e).unwrap(), model, "after reopen {}", ctx());
            }
            _ => {
                // Sync, then drop without closing: a process exit.
                snaps.clear();
                e.sync().unwrap();
                drop(e);
                e = open(&store, &opts).unwrap();
                assert_eq!(dump(&e).unwrap(), model, "after unclean reopen {}", ctx());
            }
        }
    }
    assert_eq!(dump(&e).unwrap(), model, "final, seed {seed}");
}

/// A batch of 1 to 3 random puts and deletes, applied to `model` too.
fn random_batch(r: &mut rand::rngs::StdRng, model: &mut Model) -> WriteBatch {
    let mut b = WriteBatch::new();
    for _ in 0..r.gen_range(1..4) {
        let k = key(r);
        if r.gen_ratio(1, 4) {
            model.remove(&k);
            b.delete(k);
        } else {
            let v = value(r);
            model.insert(k.clone(), v.clone());
            b.put(k, v);
        }
    }
    b
}

#[test]
fn model_random_sequences() {
    let base = seed("model_random_sequences");
    let rounds = if zlogfs_testkit::replaying() { 1 } else { 24 };
    for i in 0..rounds {
        run(base.wrapping_add(i), 600);
    }
}

/// Kept points of history (`Engine::set_retained`), as the file system
/// keeps them: random writes, flushes, merges, checkpoints and reopens
/// (after which the points are named again, as the layer above does from
/// its records); every read at a kept point sees the state it was taken
/// at, and a point let go is refused once a merge passed it.
#[test]
fn kept_points_read_as_they_were_through_merges_and_reopen() {
    let base = seed("kept_points_read_as_they_were_through_merges_and_reopen");
    let rounds = if zlogfs_testkit::replaying() { 1 } else { 12 };
    for i in 0..rounds {
        kept_points(base.wrapping_add(i), 500);
    }
}

fn kept_points(seed: u64, steps: usize) {
    let mut r = rng(seed);
    let store = fresh_store();
    let opts = zlogfs_engine::Options { keep_history: true, ..small_opts() };
    let mut e = open(&store, &opts).unwrap();
    let mut model = Model::new();
    let mut points: Vec<(u64, Model)> = Vec::new();
    let retain =
        |e: &zlogfs_engine::Engine, p: &[(u64, Model)]| e.set_retained(p.iter().map(|(s, _)| *s).collect());
    retain(&e, &points);
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        match r.gen_range(0..100) {
            0..=49 => {
                e.write(&random_batch(&mut r, &mut model)).unwrap();
            }
            50..=59 => {
                if points.len() < 6 {
                    points.push((e.seq(), model.clone()));
                    retain(&e, &points);
                }
            }
            60..=64 => {
                if !points.is_empty() {
                    let (gone, _) = points.remove(r.gen_range(0..points.len()));
                    retain(&e, &points);
                    e.flush().unwrap();
                    e.merge().unwrap();
                    if gone < e.seq() && !points.iter().any(|(s, _)| *s == gone) {
                        assert!(e.get_at(b"k", gone).is_err(), "a point let go is refused, {ctx}");
                    }
                }
            }
            65..=79 => {
                for (s, m) in &points {
                    assert_eq!(&dump_at(&e, *s).unwrap(), m, "read at point {s}, {ctx}");
                }
            }
            80..=84 => e.flush().unwrap(),
            85..=89 => e.merge().unwrap(),
            90..=92 => e.checkpoint().unwrap(),
            93..=96 => {
                e.close().unwrap();
                e = open(&store, &opts).unwrap();
                retain(&e, &points);
            }
            _ => {
                e.sync().unwrap();
                drop(e);
                e = open(&store, &opts).unwrap();
                retain(&e, &points);
            }
        }
    }
    for (s, m) in &points {
        assert_eq!(&dump_at(&e, *s).unwrap(), m, "read at point {s} at the end, seed {seed}");
    }
    assert_eq!(dump(&e).unwrap(), model, "final, seed {seed}");
}

/// The journal codec is the writer's choice: a journal written with any
/// codec (lz4 on images made before zstd:1 became the default, none, zstd)
/// replays under a writer that uses another, and the journal blocks it
/// appends after replay are read back by the next open.
#[test]
fn journals_of_every_codec_replay() {
    use zlogfs_engine::codec::{CodecId, CodecSpec};
    let seed = seed("journals_of_every_codec_replay");
    let specs =
        [CodecSpec::new(CodecId::Lz4, 0), CodecSpec::new(CodecId::None, 0), CodecSpec::new(CodecId::Zstd, 1)];
    for (i, &w) in specs.iter().enumerate() {
        let r2 = specs[(i + 1) % specs.len()];
        let mut r = rng(seed.wrapping_add(i as u64));
        let store = fresh_store();
        let mut model = Model::new();
        let write = |e: &zlogfs_engine::Engine, model: &mut Model, r: &mut rand::rngs::StdRng| {
            for _ in 0..20 {
                let mut b = WriteBatch::new();
                let (k, v) = (key(r), value(r));
                model.insert(k.clone(), v.clone());
                b.put(k, v);
                e.write_sync(&b).unwrap();
            }
        };
        // Large memtable, no flush: everything is in the journal.
        let opts = |c| zlogfs_engine::Options { journal_codec: c, memtable_bytes: 1 << 20, ..small_opts() };
        let e = open(&store, &opts(w)).unwrap();
        write(&e, &mut model, &mut r);
        drop(e); // no close: the next open replays the journal
        let e = open(&store, &opts(r2)).unwrap();
        assert_eq!(
            dump(&e).unwrap(),
            model,
            "seed {seed}: journal written with {w:?}, replayed by a {r2:?} writer"
        );
        write(&e, &mut model, &mut r);
        drop(e);
        let e = open(&store, &opts(w)).unwrap();
        assert_eq!(dump(&e).unwrap(), model, "seed {seed}: journals of {w:?} then {r2:?}");
    }
}

/// Paged scans over a large memtable (issue 45: a scan copied everything
/// from its start to the end of the range out of the memtable, so listing
/// a directory of a million entries page by page was quadratic). Each
/// memtable now gives a page's keys and a margin; runs of tombstones
/// longer than the margin, newer versions over a run's keys, and pages of
/// every size must still read as the model does.
#[test]
fn paged_scans_over_a_large_memtable_match_the_model() {
    let seed = common::seed("paged_scans_over_a_large_memtable_match_the_model");
    let mut r = rng(seed);
    let store = fresh_store();
    let opts = zlogfs_engine::Options { memtable_bytes: 64 << 20, ..small_opts() };
    let e = open(&store, &opts).unwrap();
    let mut model = Model::new();
    let k = |i: u32| format!("k{i:08}").into_bytes();
    // Half of the keys in runs, then all of them over it in the memtable:
    // long stretches deleted, others rewritten.
    for chunk in (0..20_000u32).step_by(2).collect::<Vec<_>>().chunks(500) {
        let mut b = WriteBatch::new();
        for &i in chunk {
            b.put(k(i), b"run".to_vec());
            model.insert(k(i), b"run".to_vec());
        }
        e.write(&b).unwrap();
    }
    e.flush().unwrap();
    // Past the runs' last key, keys only the memtable holds, after
    // tombstones.
    for chunk in (0..21_000u32).collect::<Vec<_>>().chunks(500) {
        let mut b = WriteBatch::new();
        for &i in chunk {
            if (20_000..20_600).contains(&i) {
                // Tombstones of keys no run holds: longer than the margin.
                b.delete(k(i));
                continue;
            }
            if i >= 20_600 {
                b.put(k(i), b"tail".to_vec());
                model.insert(k(i), b"tail".to_vec());
                continue;
            }
            // Stretches of 500 deleted keys (past any margin), the rest
            // rewritten now and then.
            if (i / 500) % 3 == 1 {
                b.delete(k(i));
                model.remove(&k(i));
            } else if r.gen_ratio(1, 3) {
                b.put(k(i), format!("mem{i}").into_bytes());
                model.insert(k(i), format!("mem{i}").into_bytes());
            }
        }
        e.write(&b).unwrap();
    }
    for limit in [1usize, 7, 64, 100, 4096] {
        let mut got = Vec::new();
        let mut from = Vec::new();
        loop {
            let page = e.scan(&from, None, limit).unwrap();
            assert!(page.len() <= limit, "seed {seed}: a page of {} for a limit of {limit}", page.len());
            let more = page.len() == limit;
            if let Some((last, _)) = page.last() {
                from = last.clone();
                from.push(0);
            }
            got.extend(page);
            if !more {
                break;
            }
        }
        let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert!(
            got == want,
            "seed {seed}: pages of {limit} read {} entries, the model has {}",
            got.len(),
            want.len()
        );
    }
}
