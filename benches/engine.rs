//! Storage engine benchmarks (issue 2). Prints Markdown tables.
//!
//! Run with `cargo bench --bench engine` (or `bench/run-engine.sh`, which
//! also prepares the corpus). Timing is reported, never asserted: every
//! figure is the median of several repetitions measured with
//! `std::time::Instant`.
//!
//! Environment:
//! - `ZLOGFS_BENCH_CORPUS`: file to use as data (default: the cached tar of
//!   Debian's linux-source, `/var/tmp/zlogfs-bench/linux-source-*.tar`).
//! - `ZLOGFS_BENCH_MB`: MiB of the corpus for the log append (default 256).
//! - `ZLOGFS_BENCH_KEYS`: keys for the index benchmark (default 1000000).
//! - `ZLOGFS_BENCH_REPS`: repetitions (default 3; slow runs of more than
//!   about 2 s are done fewer times).
//! - `ZLOGFS_BENCH_ONLY`: comma-separated subset of `append,index,recovery`.
//!
//! The codec table (in the form of Table 2 of Burrows et al. 1992) is in
//! `benches/papers.rs` with the other reproductions of the seed papers.

mod common;

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::prelude::*;
use rand::rngs::StdRng;
use rayon::prelude::*;

use common::*;
use zlogfs_engine::codec;
use zlogfs_engine::engine::{BlockWrite, Room};
use zlogfs_engine::store::{Geometry, MemStore, Store};
use zlogfs_engine::{mkfs, Engine, Options, WriteBatch};

/// "MB/s" in the tables is MiB/s of uncompressed input.
const SEGMENT: u32 = 4 << 20;
/// Segment size for the index benchmark: the default.
const INDEX_SEGMENT: u32 = SEGMENT;

fn new_engine(capacity_bytes: usize, opts: Options) -> (Arc<dyn Store>, Engine) {
    new_engine_seg(capacity_bytes, SEGMENT, opts)
}

fn new_engine_seg(capacity_bytes: usize, segment: u32, opts: Options) -> (Arc<dyn Store>, Engine) {
    let count = (capacity_bytes / segment as usize + 16) as u32;
    let store: Arc<dyn Store> =
        Arc::new(MemStore::new(Geometry { segment_size: segment, segment_count: count }));
    mkfs(store.clone()).expect("mkfs");
    let e = Engine::open(store.clone(), opts).expect("open");
    (store, e)
}

fn bench_opts() -> Options {
    Options { background: false, ..Options::default() }
}

// ---------------------------------------------------------------------------
// 1. Log append of real data.

fn bench_append(corpus: &Path) {
    let mib = env_usize("ZLOGFS_BENCH_MB", 256);
    let data = load_corpus(corpus, mib);
    let blks = blocks(&data, 64 << 10);
    let n = data.len();
    let cores = rayon::current_num_threads();
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    let nrep = reps().max(3);
    println!("## 1. Log append of real data\n");
    println!(
        "Input: first {:.0} MiB of `{}`, cut into {} blocks of 64 KiB. MB/s = MiB of uncompressed input per second \
         of wall time; MB/cpu-s = the same per second of process CPU time (all threads), which is less disturbed \
         by other load on the machine. Codec = `codec::encode` (the log's policy function) over all blocks, each output dropped after its size is noted; \
         log = `Engine::write_blocks` in calls of 64 blocks on a fresh MemStore image (segments of 4 MiB; mkfs \
         and open not timed), then `Engine::sync`. 1 thread = inside a rayon pool of 1 thread; all cores = the \
         global rayon pool ({cores} threads). Codec and log runs alternate; medians of {nrep} runs each, after \
         one untimed warm-up of each.\n",
        n as f64 / MIB,
        corpus.display(),
        blks.len(),
    );
    println!(
        "| codec | threads | codec MB/s | log MB/s | log/codec (wall) | codec MB/cpu-s | log MB/cpu-s | log/codec (cpu) | stored bytes (codec) | device bytes written (log) | ratio (input/device) | raw-stored blocks |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in ["zstd:1", "lz4"] {
        let sp = spec(s);
        for threads in [1, cores] {
            let mut stored = 0usize;
            let mut raw_blocks = 0usize;
            let mut device = 0u64;
            let codec_run = |stored: &mut usize, raw_blocks: &mut usize| {
                // Keep only the sizes: holding every output would make the
                // codec pay page faults the log (which reuses memory) does not.
                let mut enc: Vec<(usize, bool)> = Vec::new();
                let m = measure(|| {
                    enc = blks
                        .par_iter()
                        .map(|b| {
                            let e = black_box(codec::encode(sp, b));
                            (e.data.len(), e.raw_reason != 0)
                        })
                        .collect()
                });
                *stored = enc.iter().map(|e| e.0).sum();
                *raw_blocks = enc.iter().filter(|e| e.1).count();
                m
            };
            let log_run = |device: &mut u64| {
                let (_store, e) = new_engine(n + n / 4, bench_opts());
                let before = e.stats().device_bytes_written;
                let m = measure(|| {
                    for chunk in blks.chunks(64) {
                        let w = chunk.iter().map(|b| BlockWrite::new(1, sp, b)).collect();
                        black_box(e.write_blocks(Room::User, w).expect("write_blocks"));
                    }
                    e.sync().expect("sync");
                });
                *device = e.stats().device_bytes_written - before;
                m
            };
            let mut body = || {
                codec_run(&mut stored, &mut raw_blocks);
                log_run(&mut device);
                let (mut c, mut l) = (Vec::new(), Vec::new());
                for _ in 0..nrep {
                    c.push(codec_run(&mut stored, &mut raw_blocks));
                    l.push(log_run(&mut device));
                }
                (median(c), median(l))
            };
            let (tc, tl) = if threads == 1 { one.install(body) } else { body() };
            let (c, l) = (mbps(n, tc.wall), mbps(n, tl.wall));
            let (cc, lc) = (mbps(n, tc.cpu), mbps(n, tl.cpu));
            println!(
                "| {s} | {threads} | {c:.0} | {l:.0} | {:.2} | {cc:.0} | {lc:.0} | {:.2} | {stored} | {device} | {:.2} | {raw_blocks} |",
                l / c,
                lc / cc,
                n as f64 / device as f64
            );
        }
    }
    // A floor for the log: what the MemStore alone costs to take the bytes
    // (fresh segments are allocated and zeroed on first write).
    let ts = time_median(Duration::from_secs(4), || {
        let count = (n / SEGMENT as usize + 16) as u32;
        let st = MemStore::new(Geometry { segment_size: SEGMENT, segment_count: count });
        measure(|| {
            for (i, c) in data.chunks(1 << 20).enumerate() {
                let off = (i << 20) as u64;
                st.write((off / u64::from(SEGMENT)) as u32, (off % u64::from(SEGMENT)) as u32, c)
                    .expect("write");
            }
        })
    });
    println!(
        "\nFloor: writing the same {:.0} MiB uncompressed into a fresh MemStore in 1 MiB writes (segment \
         allocation + copy): {:.0} MB/s.\n",
        n as f64 / MIB,
        mbps(n, ts.wall)
    );
}

// ---------------------------------------------------------------------------
// 2. Index.

/// 16-byte key: inode number and block number, both big-endian. Existing
/// keys have even block numbers; odd ones are misses inside the key range.
fn key(i: u64, miss: bool) -> [u8; 16] {
    let ino = 1000 + (i >> 3);
    let blk = ((i & 7) << 1) | u64::from(miss);
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k[8..].copy_from_slice(&blk.to_be_bytes());
    k
}

/// ~40-byte value: a block-pointer-like record.
fn value(i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(40);
    v.extend_from_slice(&(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
    v.extend_from_slice(&(i as u32).to_le_bytes());
    v.extend_from_slice(&65536u32.to_le_bytes());
    v.extend_from_slice(&[1u8; 8]);
    v.extend_from_slice(&(i * 4096).to_le_bytes());
    v.extend_from_slice(&(i ^ 0x5555).to_le_bytes());
    v
}

fn bench_index() {
    let nkeys = env_usize("ZLOGFS_BENCH_KEYS", 1_000_000) as u64;
    let mut rng = StdRng::seed_from_u64(42);
    println!("## 2. Index\n");
    let opts = bench_opts();
    println!(
        "{nkeys} keys of 16 bytes (inode, block; big-endian), values of 40 bytes, inserted in random order in \
         batches of 100 puts (no sync per batch) with `Options::default()` except `background: false` \
         (memtable {} MiB, cache {} MiB, runs zstd:{}), MemStore with segments of {} MiB; then `flush` + `merge` of \
         every run (output cut into key-disjoint runs when a run's filter or sparse index would exceed \
         the block limit, a quarter segment). \
         Lookups go through `Engine::get` / `Engine::scan` after a warm-up pass over every key.\n",
        opts.memtable_bytes >> 20,
        opts.cache_bytes >> 20,
        opts.index_codec.level,
        INDEX_SEGMENT >> 20
    );
    let (_store, engine) = new_engine_seg(2 << 30, INDEX_SEGMENT, opts);
    let e = &engine;
    let mut order: Vec<u64> = (0..nkeys).collect();
    order.shuffle(&mut rng);
    let t = Instant::now();
    for c in order.chunks(100) {
        let mut b = WriteBatch::new();
        for &i in c {
            b.put(key(i, false).to_vec(), value(i));
        }
        e.write(&b).expect("write");
    }
    e.sync().expect("sync");
    let t_insert = t.elapsed();
    let t = Instant::now();
    e.flush().expect("flush");
    let t_flush = t.elapsed();
    let runs_before = e.stats().runs;
    let t = Instant::now();
    e.merge().expect("merge");
    let t_merge = t.elapsed();
    let st = e.stats();
    // Warm the cache.
    let t = Instant::now();
    for i in 0..nkeys {
        assert!(e.get(&key(i, false)).expect("get").is_some(), "key {i} missing");
    }
    let t_warm = t.elapsed();

    let nq = nkeys as usize;
    let hits: Vec<[u8; 16]> = (0..nq).map(|_| key(rng.gen_range(0..nkeys), false)).collect();
    let hits2: Vec<[u8; 16]> = (0..nq).map(|_| key(rng.gen_range(0..nkeys), false)).collect();
    let misses: Vec<[u8; 16]> = (0..nq).map(|_| key(rng.gen_range(0..nkeys), true)).collect();
    // A hot set: 1% of the keys, contiguous (what fits in CPU caches).
    let hot_n = (nkeys / 100).max(1);
    let hot_lo = rng.gen_range(0..nkeys - hot_n + 1);
    let hot: Vec<[u8; 16]> = (0..nq).map(|_| key(hot_lo + rng.gen_range(0..hot_n), false)).collect();
    let slow = Duration::from_secs(10);
    let lookups = |keys: &[[u8; 16]], want: bool| {
        let mut found = 0usize;
        for k in keys {
            found += usize::from(e.get(k).expect("get").is_some());
        }
        assert_eq!(found, if want { keys.len() } else { 0 });
    };
    let t1 = time_median(slow, || measure(|| lookups(&hits, true)));
    let t2 = time_median(slow, || {
        measure(|| {
            std::thread::scope(|s| {
                s.spawn(|| lookups(&hits, true));
                s.spawn(|| lookups(&hits2, true));
            })
        })
    });
    let th = time_median(slow, || measure(|| lookups(&hot, true)));
    let tm = time_median(slow, || measure(|| lookups(&misses, false)));
    let nscan = (nq / 50).max(100);
    let starts: Vec<[u8; 16]> = (0..nscan).map(|_| key(rng.gen_range(0..nkeys), false)).collect();
    let mut scanned = 0usize;
    let ts = time_median(slow, || {
        scanned = 0;
        measure(|| {
            for s in &starts {
                scanned += e.scan(s, None, 100).expect("scan").len();
            }
        })
    });
    let ts2 = time_median(slow, || {
        measure(|| {
            std::thread::scope(|sc| {
                for half in starts.chunks(starts.len().div_ceil(2)) {
                    sc.spawn(move || {
                        for s in half {
                            black_box(e.scan(s, None, 100).expect("scan"));
                        }
                    });
                }
            })
        })
    });
    let per = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    println!("| phase | time | rate |");
    println!("|---|---:|---:|");
    println!(
        "| insert {nkeys} keys (incl. inline flushes; {runs_before} runs before merge) | {:.2} s | {:.0} keys/s |",
        t_insert.as_secs_f64(),
        per(nq, t_insert)
    );
    println!("| final flush + checkpoint | {:.2} s | |", t_flush.as_secs_f64());
    println!(
        "| merge of every run ({} entries in {} runs, {:.1} MiB of run blocks on disk) | {:.2} s | {:.0} entries/s |",
        st.run_entries,
        st.runs,
        (st.live_bytes as f64) / MIB,
        t_merge.as_secs_f64(),
        per(st.run_entries as usize, t_merge)
    );
    println!(
        "| warm-up: every key once, in key order | {:.2} s | {:.0} gets/s |",
        t_warm.as_secs_f64(),
        per(nq, t_warm)
    );
    println!();
    println!(
        "| read workload (warm cache; median of {} runs) | threads | ops | ops/s (wall) | ops/s per thread | ops per CPU-second |",
        reps()
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |what: &str, threads: usize, ops: usize, t: Sample| {
        println!(
            "| {what} | {threads} | {ops} | {:.0} | {:.0} | {:.0} |",
            per(ops, t.wall),
            per(ops, t.wall) / threads as f64,
            per(ops, t.cpu)
        );
    };
    row("point lookup, random existing key", 1, nq, t1);
    row("point lookup, random existing key", 2, 2 * nq, t2);
    row(&format!("point lookup, random key of a hot 1% ({hot_n} keys)"), 1, nq, th);
    row("point lookup, miss (key inside the range)", 1, nq, tm);
    println!(
        "| scan of 100 keys from a random existing key | 1 | {nscan} scans | {:.0} scans/s = {:.0} keys/s | | {:.0} scans |",
        per(nscan, ts.wall),
        per(scanned, ts.wall),
        per(nscan, ts.cpu)
    );
    println!(
        "| scan of 100 keys from a random existing key | 2 | {nscan} scans | {:.0} scans/s = {:.0} keys/s | {:.0} scans/s | {:.0} scans |",
        per(nscan, ts2.wall),
        per(scanned, ts2.wall),
        per(nscan, ts2.wall) / 2.0,
        per(nscan, ts2.cpu)
    );
    println!();
}

// ---------------------------------------------------------------------------
// 3. Recovery.

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn bench_recovery() {
    println!("## 3. Recovery with a full memtable\n");
    let opts = bench_opts();
    println!(
        "`Options::default()` (memtable_bytes = {} MiB) with `background: false`; the memtable is filled to 95% \
         of memtable_bytes (as the memtable counts: key + value + 64 bytes per version) by batches written \
         with `write_sync`, never flushed; the engine is dropped without `close`, then `Engine::open` on the \
         same MemStore is timed (median of {} opens; each replays the whole journal). \
         Journal raw = encoded journal records; journal on device = bytes written by the filling engine \
         (journal blocks, lz4, with batch headers and padding).\n",
        opts.memtable_bytes >> 20,
        reps()
    );
    println!("| value size | batch (puts per sync) | versions replayed | journal raw MiB | journal on device MiB | open time | replay MiB/s (raw) | versions/s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (vlen, per_batch) in [(40usize, 100usize), (4000, 8)] {
        let (store, e) = new_engine(256 << 20, opts.clone());
        let per_entry = 16 + vlen + 64;
        let target = opts.memtable_bytes * 95 / 100;
        let n = target / per_entry;
        let mut raw = 0usize;
        let mut rng = StdRng::seed_from_u64(7);
        let mut i = 0u64;
        while (i as usize) < n {
            let mut b = WriteBatch::new();
            let first = e.seq() + 1;
            let mut ops = 0;
            while ops < per_batch && (i as usize) < n {
                let mut v = vec![0u8; vlen];
                // Half random, half repetitive: lz4 gets something to do.
                rng.fill(&mut v[..vlen / 2]);
                b.put(key(i, false).to_vec(), v);
                raw += 1 + varint_len(16) + 16 + varint_len(vlen as u64) + vlen;
                i += 1;
                ops += 1;
            }
            raw += varint_len(first) + varint_len(ops as u64);
            e.write_sync(&b).expect("write_sync");
        }
        let st = e.stats();
        assert_eq!(st.runs, 0, "the memtable was flushed");
        assert_eq!(st.memtable_entries, n);
        let device = st.device_bytes_written;
        drop(e);
        let mut got = 0;
        let t = time_median(Duration::from_secs(30), || {
            let mut e = None;
            let m = measure(|| e = Some(Engine::open(store.clone(), opts.clone()).expect("open")));
            got = e.map_or(0, |e| e.stats().memtable_entries);
            m
        });
        assert_eq!(got, n);
        println!(
            "| {vlen} B | {per_batch} | {n} | {:.1} | {:.1} | {:.0} ms | {:.0} | {:.0} |",
            raw as f64 / MIB,
            device as f64 / MIB,
            t.wall.as_secs_f64() * 1e3,
            mbps(raw, t.wall),
            n as f64 / t.wall.as_secs_f64()
        );
    }
    println!();
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // binary without it, and a test run must not spend minutes measuring.
    if !std::env::args().any(|a| a == "--bench") {
        println!("engine benchmarks: run them with `cargo bench --bench engine` or bench/run-engine.sh");
        return;
    }
    let corpus = corpus_from_env();
    let only = std::env::var("ZLOGFS_BENCH_ONLY").unwrap_or_default();
    let want = |s: &str| only.is_empty() || only.split(',').any(|o| o.trim() == s);
    println!("# zlogfs storage engine benchmarks\n");
    println!("rayon threads: {}; load average at start: {}\n", rayon::current_num_threads(), load_average());
    let need_corpus = want("append");
    let corpus = match corpus {
        Some(c) => Some(c),
        None if need_corpus => {
            eprintln!(
                "no corpus: set ZLOGFS_BENCH_CORPUS or run bench/run-engine.sh (it prepares \
                 /var/tmp/zlogfs-bench/linux-source-*.tar); skipping the data benchmarks"
            );
            None
        }
        None => None,
    };
    if let Some(c) = &corpus {
        if want("append") {
            bench_append(c);
        }
    }
    if want("index") {
        bench_index();
    }
    if want("recovery") {
        bench_recovery();
    }
    println!("Load average at the end: {}", load_average());
}
