//! The I/O-error loop, as SQLite tests itself: fail the Nth I/O operation
//! for N = 1, 2, 3, … until the workload completes, once with a single
//! failure and once with failures that persist. Every failure must surface
//! as an error (never a panic), a failed write or sync must latch the
//! engine, and a reopen must show a valid prefix of the writes.

mod common;
use std::sync::Arc;

use common::workload::*;
use common::*;
use zlogfs_engine::store::FaultConfig;
use zlogfs_engine::{Engine, Error};

/// Run every step, carrying on after errors. Returns (writes attempted,
/// writes attempted before the last successful sync, number of errors).
fn execute_all(e: &Engine, steps: &[Step], ctx: &str) -> (usize, usize, usize) {
    let mut attempted = 0;
    let mut durable = 0;
    let mut errors = 0;
    let mut latched = false;
    for s in steps {
        let r = match s {
            Step::Write(b) => {
                attempted += 1;
                e.write(b).map(|_| ())
            }
            Step::Blob(k, c) => {
                attempted += 1;
                write_blob(e, k, c)
            }
            Step::Sync => e.sync(),
            Step::Flush => e.flush(),
            Step::Merge => e.merge(),
            Step::Checkpoint => e.checkpoint(),
        };
        match r {
            Ok(()) => {
                assert!(
                    !latched || matches!(s, Step::Merge),
                    "an operation succeeded after the engine latched ({ctx})"
                );
                if matches!(s, Step::Sync | Step::Flush | Step::Checkpoint) {
                    durable = attempted;
                }
            }
            Err(err) => {
                errors += 1;
                if matches!(err, Error::Failed) {
                    latched = true;
                }
                assert!(!err.to_string().is_empty());
                // A failed write (a blob step may fail on its read) was not
                // applied; the writes after it would not form a prefix.
                if matches!(s, Step::Write(_) | Step::Blob(..)) {
                    break;
                }
            }
        }
    }
    (attempted, durable, errors)
}

fn io_error_loop(seed: u64, persistent: bool) -> u64 {
    let mut r = rng(seed);
    let steps = workload(&mut r, 60);
    let states = model_states(&steps);
    let opts = small_opts();
    let base = fresh_store();
    let mut n = 1;
    loop {
        let st = Arc::new(base.fork());
        st.set_faults(FaultConfig { fail_at: Some(n), persistent, ..FaultConfig::default() });
        let ctx = format!("seed {seed} fail_at {n} persistent {persistent}");
        let (attempted, durable, errors) = match open(&st, &opts) {
            Ok(e) => execute_all(&e, &steps, &ctx),
            Err(err) => {
                assert!(!err.to_string().is_empty());
                (0, 0, 1)
            }
        };
        // A process restart on the same device, faults gone.
        st.set_faults(FaultConfig::default());
        let e = open(&st, &opts).unwrap_or_else(|err| panic!("reopen failed: {err} ({ctx})"));
        let got = dump(&e).unwrap_or_else(|err| panic!("read failed: {err} ({ctx})"));
        let ok = (durable..=attempted).any(|i| states[i] == got);
        assert!(ok, "state is not a prefix in [{durable}, {attempted}] ({ctx})");
        if errors == 0 {
            return n;
        }
        n += 1;
        assert!(n < 100_000, "the workload never completed ({ctx})");
    }
}

#[test]
fn fail_nth_io_once() {
    let base = seed("fail_nth_io_once");
    for i in 0..3 {
        let n = io_error_loop(base.wrapping_add(i), false);
        eprintln!("workload completed at N = {n}");
    }
}

#[test]
fn fail_nth_io_persistently() {
    let base = seed("fail_nth_io_persistently");
    for i in 0..3 {
        let n = io_error_loop(base.wrapping_add(i), true);
        eprintln!("workload completed at N = {n}");
    }
}

/// Found by `fail_nth_io_persistently` (2026-12-02): a merge that failed
/// reading an input freed its outputs' blocks by writing the waiting batch;
/// that write failed, unlatched, and a later sync said yes with the
/// batch's writes lost.
#[test]
fn a_merge_failing_on_a_read_latches_when_its_cleanup_write_fails() {
    io_error_loop(5_599_107_023_278_983_760, true);
}

#[test]
fn failed_sync_latches_until_reopen() {
    let st = fresh_store();
    let e = open(&st, &small_opts()).unwrap();
    let mut b = zlogfs_engine::WriteBatch::new();
    b.put("a", "1");
    e.write(&b).unwrap();
    st.set_faults(FaultConfig {
        fail_at: Some(1),
        fail_kinds: Some(zlogfs_engine::store::OpKind::Sync),
        ..FaultConfig::default()
    });
    assert!(matches!(e.sync(), Err(Error::Io { .. })));
    st.set_faults(FaultConfig::default());
    // The device works again, but the engine refuses: what reached the
    // disk is unknown until recovery says.
    assert!(matches!(e.write(&b), Err(Error::Failed)));
    assert!(matches!(e.sync(), Err(Error::Failed)));
    drop(e);
    let e = open(&st, &small_opts()).unwrap();
    e.write_sync(&b).unwrap();
}
