//! Crash test: seeded workloads on the fault-injecting store, with the
//! device losing power after every I/O operation in turn (which covers every
//! sync point and every point between), under each crash mode: unsynced
//! writes dropped, the last write torn at a 512-byte boundary, or unsynced
//! writes kept at random and torn. Every reopen must succeed and show the
//! model state after some prefix of the operations that includes everything
//! acknowledged before the last completed sync.

mod common;
use std::sync::Arc;

use common::workload::*;
use common::*;
use rand::Rng;
use zlogfs_engine::store::{CrashMode, FaultConfig, FaultStore, Store};
use zlogfs_engine::{Engine, WriteBatch};

/// Run until the first error. Returns (writes acknowledged, writes
/// acknowledged before the last completed sync).
fn execute(e: &Engine, steps: &[Step]) -> (usize, usize) {
    let mut writes = 0;
    let mut durable = 0;
    for s in steps {
        let r = match s {
            Step::Write(b) => e.write(b).map(|_| ()),
            Step::Blob(k, c) => write_blob(e, k, c),
            Step::Sync => e.sync(),
            Step::Flush => e.flush(),
            Step::Merge => e.merge(),
            Step::Checkpoint => e.checkpoint(),
        };
        if std::env::var("ZLOGFS_TRACE").is_ok() {
            let name = match s {
                Step::Write(_) => "write",
                Step::Blob(..) => "blob",
                Step::Sync => "sync",
                Step::Flush => "flush",
                Step::Merge => "merge",
                Step::Checkpoint => "checkpoint",
            };
            eprintln!("step {name}: {:?}", r.as_ref().map_err(|e| e.to_string()));
        }
        match r {
            Ok(()) => match s {
                Step::Write(_) | Step::Blob(..) => writes += 1,
                // Flush and checkpoint sync the log too; a merge with
                // nothing to merge does not.
                Step::Merge => {}
                _ => durable = writes,
            },
            Err(_) => return (writes, durable),
        }
    }
    (writes, durable)
}

/// Returns the number of crash points checked.
fn crash_at_every_op(seed: u64, nsteps: usize, modes: &[CrashMode]) -> usize {
    let mut r = rng(seed);
    let steps = workload(&mut r, nsteps);
    let states = model_states(&steps);
    let opts = small_opts();
    let base = fresh_store();
    // A dry run counts the I/O operations.
    let dry = Arc::new(base.fork());
    dry.set_faults(FaultConfig::default());
    let e = open(&dry, &opts).expect("open the dry run");
    let (w, _) = execute(&e, &steps);
    assert_eq!(w, states.len() - 1, "the dry run must complete");
    drop(e);
    let total = dry.op_count();
    let mut points = 0;
    for k in 0..=total {
        for (mi, &mode) in modes.iter().enumerate() {
            let st = Arc::new(base.fork());
            st.set_faults(FaultConfig { dead_after: Some(k), ..FaultConfig::default() });
            // Opening may itself be cut short by the power loss.
            let (acked, durable) = match open(&st, &opts) {
                Ok(e) => execute(&e, &steps),
                Err(_) => (0, 0),
            };
            let crash_seed = seed ^ (k << 8) ^ mi as u64;
            st.power_cut(mode, crash_seed);
            let ctx = format!("seed {seed} crash after op {k} of {total}, mode {mode:?}");
            let e = open(&st, &opts).unwrap_or_else(|err| panic!("reopen failed: {err} ({ctx})"));
            let got = dump(&e).unwrap_or_else(|err| panic!("read failed: {err} ({ctx})"));
            // The op that failed may have been applied: allow one more.
            let hi = (acked + 1).min(states.len() - 1);
            let ok = (durable..=hi).any(|i| states[i] == got);
            if !ok {
                for (i, st) in states.iter().enumerate().take(hi + 2) {
                    let missing: Vec<_> = st
                        .keys()
                        .filter(|k| !got.contains_key(*k))
                        .map(|k| String::from_utf8_lossy(k).to_string())
                        .collect();
                    let extra: Vec<_> = got
                        .keys()
                        .filter(|k| !st.contains_key(*k))
                        .map(|k| String::from_utf8_lossy(k).to_string())
                        .collect();
                    let diffv = st.iter().filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v)).count();
                    eprintln!("state {i}: missing {missing:?} extra {extra:?} differing values {diffv}");
                }
            }
            assert!(ok, "state is not a prefix in [{durable}, {hi}] of the writes ({ctx})");
            // The reopened image must keep working.
            let mut b = WriteBatch::new();
            b.put("post-crash", "ok");
            e.write_sync(&b).unwrap_or_else(|err| panic!("write after reopen: {err} ({ctx})"));
            e.flush().unwrap_or_else(|err| panic!("flush after reopen: {err} ({ctx})"));
            drop(e);
            let e = open(&st, &opts).unwrap_or_else(|err| panic!("second reopen: {err} ({ctx})"));
            assert_eq!(e.get(b"post-crash").expect("get after the crash"), Some(b"ok".to_vec()), "{ctx}");
            points += 1;
        }
    }
    points
}

#[test]
fn crash_at_every_io_operation() {
    let base = seed("crash_at_every_io_operation");
    let replay = zlogfs_testkit::replaying();
    let rounds = if replay { 1 } else { 24 };
    let modes = [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder];
    let mut points = 0;
    for i in 0..rounds {
        points += crash_at_every_op(base.wrapping_add(i), 90, &modes);
    }
    eprintln!("checked {points} crash points");
    if !replay {
        assert!(points >= 10_000, "only {points} crash points");
    }
}

#[test]
fn repeated_crashes_on_one_image() {
    // Crash, recover, write more, crash again: torn tails are overwritten by
    // new batches, and stale batches must never be replayed.
    let seed = seed("repeated_crashes_on_one_image");
    let mut r = rng(seed);
    let opts = small_opts();
    let st: Arc<FaultStore> = fresh_store();
    let mut model = Model::new();
    for round in 0..150 {
        let e = open(&st, &opts).unwrap_or_else(|err| panic!("seed {seed} round {round}: {err}"));
        let got = dump(&e).unwrap();
        assert_eq!(got, model, "seed {seed} round {round}: synced state lost or stale state replayed");
        let steps = workload(&mut r, 12);
        let mut m = model.clone();
        for s in &steps {
            match s {
                Step::Write(b) => {
                    e.write(b).unwrap();
                    apply(&mut m, b);
                }
                Step::Flush => e.flush().unwrap(),
                _ => {}
            }
        }
        e.sync().unwrap();
        model = m;
        // Unsynced writes after the sync, then a crash.
        let mut b = WriteBatch::new();
        b.put(format!("unsynced{round}"), vec![7u8; r.gen_range(0..3000)]);
        e.write(&b).unwrap();
        e.write_out().unwrap();
        drop(e);
        let mode = [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder][round % 3];
        st.power_cut(mode, seed ^ round as u64);
        // The unsynced write may or may not have survived: learn which.
        let e = open(&st, &opts).unwrap();
        if let Some(v) = e.get(format!("unsynced{round}").as_bytes()).unwrap() {
            model.insert(format!("unsynced{round}").into_bytes(), v);
        }
        drop(e);
    }
}

#[test]
fn rolled_back_batches_never_come_back() {
    // Batch N (x) lost and N+1 (y) kept by a reordering cache; recovery
    // rolls back to before x. The same commit x is then written again at
    // the same place: the old y must never chain onto it.
    let opts = small_opts();
    let mut cases = 0;
    for seed in 0..300u64 {
        let st = fresh_store();
        let e = open(&st, &opts).unwrap();
        let mut x = WriteBatch::new();
        x.put("x", "1");
        let mut y = WriteBatch::new();
        y.put("y", "2");
        e.write(&x).unwrap();
        e.write_out().unwrap();
        e.write(&y).unwrap();
        e.write_out().unwrap();
        drop(e);
        st.power_cut(CrashMode::Reorder, seed);
        let e = open(&st, &opts).unwrap();
        let (gx, gy) = (e.get(b"x").unwrap(), e.get(b"y").unwrap());
        assert!(gy.is_none() || gx.is_some(), "seed {seed}: y without x is not a prefix");
        if gx.is_some() {
            continue;
        }
        cases += 1;
        e.write(&x).unwrap();
        e.sync().unwrap();
        drop(e);
        st.power_cut(CrashMode::DropUnsynced, seed);
        let e = open(&st, &opts).unwrap();
        assert_eq!(e.get(b"x").unwrap(), Some(b"1".to_vec()), "seed {seed}");
        assert_eq!(e.get(b"y").unwrap(), None, "seed {seed}: a rolled-back batch came back");
    }
    assert!(cases > 0);
}

/// Two fresh stores of one image (fast, bulk), half the usual segments
/// each.
fn fresh_two() -> (Arc<FaultStore>, Arc<FaultStore>) {
    let g = zlogfs_engine::store::Geometry { segment_count: GEOMETRY.segment_count / 2, ..GEOMETRY };
    let (f, b) = (Arc::new(FaultStore::new(g)), Arc::new(FaultStore::new(g)));
    zlogfs_engine::mkfs(two_store(&f, &b)).expect("mkfs on two stores");
    (f, b)
}

fn two_store(f: &Arc<FaultStore>, b: &Arc<FaultStore>) -> Arc<dyn Store> {
    let names = ("fast".to_string(), "bulk".to_string());
    Arc::new(zlogfs_engine::store::TwoStore::new(f.clone(), b.clone(), names, false).expect("two stores"))
}

/// The crash test on an image of two stores (issue 29): one store loses
/// power after each of its I/O operations in turn while the other goes on
/// until the engine latches; then the other either keeps every write it
/// had (its cache reached it) or loses power too, under each mode. Every
/// reopen shows a prefix that includes everything acknowledged before the
/// last completed sync.
fn crash_two_at_every_op(seed: u64, nsteps: usize, modes: &[CrashMode]) -> usize {
    let mut r = rng(seed);
    let steps = workload(&mut r, nsteps);
    let states = model_states(&steps);
    let opts = small_opts();
    let (bf, bb) = fresh_two();
    let (df, db) = (Arc::new(bf.fork()), Arc::new(bb.fork()));
    let e = Engine::open(two_store(&df, &db), opts.clone()).expect("open two devices");
    let (w, _) = execute(&e, &steps);
    assert_eq!(w, states.len() - 1, "the dry run must complete");
    drop(e);
    assert!(db.op_count() > 10, "the bulk store was used: {} operations", db.op_count());
    let mut points = 0;
    for dying_bulk in [false, true] {
        let total = if dying_bulk { db.op_count() } else { df.op_count() };
        for k in 0..=total {
            let (mi, keep_other) = ((k % modes.len() as u64) as usize, k % 2 == 0);
            let mode = modes[mi];
            let (f, b) = (Arc::new(bf.fork()), Arc::new(bb.fork()));
            let (dying, other) = if dying_bulk { (&b, &f) } else { (&f, &b) };
            dying.set_faults(FaultConfig { dead_after: Some(k), ..FaultConfig::default() });
            let (acked, durable) = match Engine::open(two_store(&f, &b), opts.clone()) {
                Ok(e) => execute(&e, &steps),
                Err(_) => (0, 0),
            };
            let crash_seed = seed ^ (k << 8) ^ mi as u64;
            if keep_other {
                other.sync().expect("the other store keeps its writes");
            }
            other.power_cut(mode, crash_seed ^ 1);
            dying.power_cut(mode, crash_seed);
            let ctx = format!(
                "seed {seed}: the {} store dies after op {k} of {total}, the other {}, mode {mode:?}",
                if dying_bulk { "bulk" } else { "fast" },
                if keep_other { "keeps its writes" } else { "loses power too" }
            );
            let e = Engine::open(two_store(&f, &b), opts.clone())
                .unwrap_or_else(|err| panic!("reopen failed: {err} ({ctx})"));
            let got = dump(&e).unwrap_or_else(|err| panic!("read failed: {err} ({ctx})"));
            let hi = (acked + 1).min(states.len() - 1);
            assert!(
                (durable..=hi).any(|i| states[i] == got),
                "state is not a prefix in [{durable}, {hi}] ({ctx})"
            );
            let mut wb = WriteBatch::new();
            wb.put("post-crash", "ok");
            e.write_sync(&wb).unwrap_or_else(|err| panic!("write after reopen: {err} ({ctx})"));
            points += 1;
        }
    }
    points
}

#[test]
fn crash_at_every_io_operation_on_two_stores() {
    let base = seed("crash_at_every_io_operation_on_two_stores");
    let replay = zlogfs_testkit::replaying();
    let rounds = if replay { 1 } else { 24 };
    let modes = [CrashMode::DropUnsynced, CrashMode::TearLast, CrashMode::Reorder];
    let mut points = 0;
    for i in 0..rounds {
        points += crash_two_at_every_op(base.wrapping_add(i), 90, &modes);
    }
    eprintln!("checked {points} crash points on two stores");
    if !replay {
        assert!(points >= 4_000, "only {points} crash points");
    }
}
