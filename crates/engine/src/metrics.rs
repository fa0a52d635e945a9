//! What each operation costs, for `zlogfs stats --latency` and the
//! Prometheus endpoint: counts and latency histograms per operation kind
//! (each FUSE opcode, commit, fsync, cleaning pass, ...), time split into
//! compression, decompression, device writes, reads and syncs, and byte
//! counters.
//!
//! The figures are the process's ([`global`]): a daemon serves one image,
//! so they are that image's since it was mounted. They live in one place
//! because the codec functions and the store have no other context to
//! report to; recording is lock-free (atomic adds), so a hot path pays
//! two clock reads and a few relaxed increments.
//!
//! The histogram is written here rather than taken from `hdrhistogram`:
//! that crate records through `&mut`, so concurrent recorders would share
//! a lock; these buckets are atomics, log-linear with 8 sub-buckets per
//! power of two (a reported percentile is within 12.5% of the truth).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Sub-buckets per power of two (as a shift).
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: values below `SUB` exactly, then `SUB` per power of two.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// Durations in nanoseconds, recorded concurrently.
pub struct Histogram {
    count: AtomicU64,
    sum: AtomicU64,
    /// Bytes the operations moved (0 where that means nothing).
    bytes: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// The bucket of `v`.
fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = (v >> (e - SUB_BITS)) as usize & (SUB - 1);
    (e - SUB_BITS + 1) as usize * SUB + sub
}

/// The smallest value of bucket `i` and the bucket's width.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let e = (i / SUB) as u32 + SUB_BITS - 1;
    let sub = (i % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS);
    ((SUB as u64 + sub) * width, width)
}

impl Histogram {
    /// Record one operation of `d` that moved `bytes`.
    pub fn record(&self, d: Duration, bytes: u64) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// Record the time since `start`.
    pub fn since(&self, start: Instant, bytes: u64) {
        self.record(start.elapsed(), bytes);
    }

    /// Run `f`, recording its time (and no bytes).
    pub fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.since(t, 0);
        r
    }

    /// What it holds now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let last = buckets.iter().rposition(|&n| n > 0).map_or(0, |i| i + 1);
        HistogramSnapshot {
            count: self.count.load(Ordering::Relaxed),
            sum_ns: self.sum.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            buckets: buckets[..last].to_vec(),
        }
    }
}

/// A histogram's figures at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Operations recorded.
    pub count: u64,
    /// Their total time.
    pub sum_ns: u64,
    /// Bytes they moved.
    pub bytes: u64,
    /// Counts per bucket (trailing empty buckets left off).
    pub buckets: Vec<u64>,
}

impl HistogramSnapshot {
    /// The value below which a fraction `q` (0..=1) of the operations
    /// fall, as the middle of its bucket; 0 when nothing was recorded.
    pub fn quantile(&self, q: f64) -> u64 {
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, width) = bucket_range(i);
                return low + width / 2;
            }
        }
        0
    }

    /// Mean in nanoseconds (0 when empty).
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }

    /// The upper bounds (ns, exclusive) of the buckets with their
    /// cumulative counts, for Prometheus' `le` buckets: only buckets where
    /// the count grows.
    pub fn cumulative(&self) -> Vec<(u64, u64)> {
        let mut seen = 0;
        let mut out = Vec::new();
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 {
                seen += n;
                let (low, width) = bucket_range(i);
                out.push((low.saturating_add(width), seen));
            }
        }
        out
    }

    /// The operations recorded since `earlier` (a snapshot of the same
    /// histogram).
    pub fn minus(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &n)| n.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
            .collect();
        HistogramSnapshot {
            count: self.count.saturating_sub(earlier.count),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            buckets,
        }
    }

    /// Rebuild from what [`HistogramSnapshot::cumulative`] and the totals
    /// said (a client reading a daemon's figures).
    pub fn from_cumulative(
        count: u64,
        sum_ns: u64,
        bytes: u64,
        cumulative: &[(u64, u64)],
    ) -> HistogramSnapshot {
        let mut buckets = Vec::new();
        let mut prev = 0;
        for &(upper, seen) in cumulative {
            let i = bucket(upper.saturating_sub(1));
            if buckets.len() <= i {
                buckets.resize(i + 1, 0);
            }
            buckets[i] += seen.saturating_sub(prev);
            prev = seen;
        }
        HistogramSnapshot { count, sum_ns, bytes, buckets }
    }
}

/// Where the time goes, below the operations.
#[derive(Default)]
pub struct Split {
    /// Compressing blocks (bytes: raw bytes in).
    pub compress: Histogram,
    /// Decompressing blocks (bytes: raw bytes out).
    pub decompress: Histogram,
    /// Writes to the device (bytes written).
    pub device_write: Histogram,
    /// Reads from the device (bytes read).
    pub device_read: Histogram,
    /// Syncs of the device.
    pub device_sync: Histogram,
}

/// Plain counters.
#[derive(Default)]
pub struct Counters {
    /// Bytes users wrote (write, and import).
    pub user_bytes_written: AtomicU64,
    /// Bytes users read.
    pub user_bytes_read: AtomicU64,
    /// Block reads answered by the block cache.
    pub cache_hits: AtomicU64,
    /// Block reads that went to the device.
    pub cache_misses: AtomicU64,
}

/// The process's figures.
#[derive(Default)]
pub struct Metrics {
    /// Time below the operations.
    pub split: Split,
    /// Counters.
    pub counters: Counters,
    /// Operations by name ("fuse.READ", "commit", ...).
    ops: Mutex<BTreeMap<String, Arc<Histogram>>>,
    /// When recording began.
    start: OnceLock<Instant>,
}

/// Every figure at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Seconds since recording began.
    pub uptime: f64,
    /// Operations by name.
    pub ops: Vec<(String, HistogramSnapshot)>,
    /// The split, by name (compress, decompress, device_write,
    /// device_read, device_sync).
    pub split: Vec<(&'static str, HistogramSnapshot)>,
    /// Counters by name.
    pub counters: Vec<(&'static str, u64)>,
}

impl Metrics {
    /// The histogram of the operation `name`, made on first use. Callers
    /// on a hot path keep the handle.
    pub fn op(&self, name: &str) -> Arc<Histogram> {
        self.start.get_or_init(Instant::now);
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(ops.entry(name.to_string()).or_default())
    }

    /// The histograms `PREFIX.NAME` of a front end's request kinds, one
    /// per index (None where a kind has no name), made at once: a request
    /// then finds its own by indexing.
    pub fn op_table<'a>(
        &self,
        prefix: &str,
        names: impl IntoIterator<Item = Option<&'a str>>,
    ) -> Vec<Option<Arc<Histogram>>> {
        names.into_iter().map(|n| n.map(|n| self.op(&format!("{prefix}.{n}")))).collect()
    }

    /// Add `n` to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Every figure now.
    pub fn snapshot(&self) -> Snapshot {
        let start = *self.start.get_or_init(Instant::now);
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let s = &self.split;
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            uptime: start.elapsed().as_secs_f64(),
            ops: ops.iter().map(|(k, h)| (k.clone(), h.snapshot())).filter(|(_, h)| h.count > 0).collect(),
            split: vec![
                ("compress", s.compress.snapshot()),
                ("decompress", s.decompress.snapshot()),
                ("device_write", s.device_write.snapshot()),
                ("device_read", s.device_read.snapshot()),
                ("device_sync", s.device_sync.snapshot()),
            ],
            counters: vec![
                ("user_bytes_written", load(&c.user_bytes_written)),
                ("user_bytes_read", load(&c.user_bytes_read)),
                ("cache_hits", load(&c.cache_hits)),
                ("cache_misses", load(&c.cache_misses)),
            ],
        }
    }
}

/// The process's figures.
pub fn global() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics::default();
        m.start.get_or_init(Instant::now);
        m
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_the_bucket_that_holds_it() {
        let mut v = 0u64;
        while v < u64::MAX / 3 {
            for x in [v, v + 1, v * 2 + 1] {
                let (low, width) = bucket_range(bucket(x));
                assert!(low <= x && x - low < width, "{x} in bucket {} = [{low}, +{width})", bucket(x));
                assert!(width <= (x / SUB as u64).max(1), "{x}: width {width} is more than an eighth");
            }
            v = v * 3 + 1;
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles_come_from_the_right_buckets() {
        let h = Histogram::default();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us), 10);
        }
        let s = h.snapshot();
        assert_eq!((s.count, s.bytes), (100, 1000));
        assert_eq!(s.mean_ns(), 50_500);
        for (q, want) in [(0.5, 50_000.0), (0.99, 99_000.0), (0.01, 1_000.0)] {
            let got = s.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.125, "p{q}: {got} for {want}");
        }
        let cum = s.cumulative();
        assert_eq!(cum.last().map(|c| c.1), Some(100));
        assert_eq!(HistogramSnapshot::from_cumulative(s.count, s.sum_ns, s.bytes, &cum), s);
        assert_eq!(s.minus(&s).count, 0);
        assert_eq!(HistogramSnapshot::default().quantile(0.5), 0);
    }
}
