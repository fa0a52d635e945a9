//! The daemon's figures of what operations cost
//! ([`zlogfs_engine::metrics`]) as JSON (`zlogfs stats --latency --json`,
//! the control channel's `metrics` request) and as Prometheus text (`-o
//! metrics=ADDR`).

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use zlogfs_engine::metrics::{global, HistogramSnapshot, Snapshot};

/// Percentiles reported, as (label, fraction).
pub const PERCENTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)];

/// A histogram's figures: count, total, mean, percentiles (ns), bytes.
pub fn summary(h: &HistogramSnapshot) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("count".into(), h.count.into());
    m.insert("total_ns".into(), h.sum_ns.into());
    m.insert("mean_ns".into(), h.mean_ns().into());
    for (label, q) in PERCENTILES {
        m.insert(format!("{label}_ns"), h.quantile(q).into());
    }
    m.insert("bytes".into(), h.bytes.into());
    m
}

/// [`summary`] and the cumulative buckets, from which a client works out
/// an interval's figures.
fn histogram(h: &HistogramSnapshot) -> Value {
    let mut m = summary(h);
    let cum: Vec<Value> = h.cumulative().into_iter().map(|(le, n)| json!([le, n])).collect();
    m.insert("buckets".into(), cum.into());
    Value::Object(m)
}

/// A histogram back from its JSON (for a client working out what changed
/// between two answers).
pub fn histogram_from_json(v: &Value) -> HistogramSnapshot {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let cum: Vec<(u64, u64)> = v["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p.get(0)?.as_u64()?, p.get(1)?.as_u64()?)))
        .collect();
    HistogramSnapshot::from_cumulative(n("count"), n("total_ns"), n("bytes"), &cum)
}

/// The process's figures as JSON: `ops` (by operation), `split` (time
/// below the operations: compress, decompress, device_write, device_read,
/// device_sync) and `counters`; each histogram with its count, total,
/// mean, percentiles (ns), bytes and cumulative buckets `[upper_ns,
/// count]`.
pub fn metrics() -> Value {
    let s: Snapshot = global().snapshot();
    let ops: Map<String, Value> = s.ops.iter().map(|(k, h)| (k.clone(), histogram(h))).collect();
    let split: Map<String, Value> = s.split.iter().map(|(k, h)| (k.to_string(), histogram(h))).collect();
    let counters: Map<String, Value> = s.counters.iter().map(|(k, n)| (k.to_string(), (*n).into())).collect();
    json!({"uptime_s": s.uptime, "ops": ops, "split": split, "counters": counters})
}

/// Prometheus' `le` bounds: powers of two from 1 µs to 68 s (in ns), on
/// which the histograms' buckets align.
fn bounds() -> impl Iterator<Item = u64> {
    (10..=36).map(|k| 1u64 << k)
}

fn prom_histogram(out: &mut String, name: &str, label: &str, h: &HistogramSnapshot) {
    let cum = h.cumulative();
    for le in bounds() {
        let n = cum.iter().take_while(|(upper, _)| *upper <= le).last().map_or(0, |c| c.1);
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{}\"}} {n}", le as f64 / 1e9);
    }
    let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{label}}} {}", h.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{{{label}}} {}", h.count);
}

/// The process's figures in Prometheus' text format (version 0.0.4),
/// with `extra` gauges (name, help, value) from the image's stats.
pub fn prometheus(extra: &[(&str, &str, f64)]) -> String {
    let s = global().snapshot();
    let mut out = String::new();
    out.push_str("# HELP zlogfs_op_duration_seconds Time to serve an operation, by kind.\n");
    out.push_str("# TYPE zlogfs_op_duration_seconds histogram\n");
    for (op, h) in &s.ops {
        prom_histogram(&mut out, "zlogfs_op_duration_seconds", &format!("op=\"{op}\""), h);
    }
    out.push_str("# HELP zlogfs_op_bytes_total Bytes the operations of a kind moved.\n");
    out.push_str("# TYPE zlogfs_op_bytes_total counter\n");
    for (op, h) in &s.ops {
        let _ = writeln!(out, "zlogfs_op_bytes_total{{op=\"{op}\"}} {}", h.bytes);
    }
    out.push_str("# HELP zlogfs_split_duration_seconds Time below the operations: compression, decompression, device writes, reads and syncs.\n");
    out.push_str("# TYPE zlogfs_split_duration_seconds histogram\n");
    for (part, h) in &s.split {
        prom_histogram(&mut out, "zlogfs_split_duration_seconds", &format!("part=\"{part}\""), h);
    }
    out.push_str("# HELP zlogfs_split_bytes_total Bytes compressed (raw), decompressed (raw), written to and read from the device.\n");
    out.push_str("# TYPE zlogfs_split_bytes_total counter\n");
    for (part, h) in &s.split {
        let _ = writeln!(out, "zlogfs_split_bytes_total{{part=\"{part}\"}} {}", h.bytes);
    }
    for (name, n) in &s.counters {
        let _ = writeln!(out, "# TYPE zlogfs_{name}_total counter\nzlogfs_{name}_total {n}");
    }
    for (name, help, v) in extra {
        let _ = writeln!(out, "# HELP zlogfs_{name} {help}\n# TYPE zlogfs_{name} gauge\nzlogfs_{name} {v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn figures_survive_their_json_and_show_in_prometheus_text() {
        let h = global().op("test.op");
        for us in [3u64, 30, 300, 3000] {
            h.record(Duration::from_micros(us), 4096);
        }
        let v = metrics();
        let back = histogram_from_json(&v["ops"]["test.op"]);
        assert_eq!(back, h.snapshot());
        assert!(v["ops"]["test.op"]["p50_ns"].as_u64().unwrap() >= 26_000);
        let text = prometheus(&[("free_bytes", "Free bytes.", 5.0)]);
        assert!(text.contains("zlogfs_op_duration_seconds_count{op=\"test.op\"} 4"), "{text}");
        assert!(text.contains("zlogfs_op_bytes_total{op=\"test.op\"} 16384"));
        assert!(text.contains("zlogfs_free_bytes 5"));
        // 3 µs and 30 µs are below 32.768 µs; 300 µs is not.
        assert!(
            text.contains("zlogfs_op_duration_seconds_bucket{op=\"test.op\",le=\"0.000032768\"} 2"),
            "{text}"
        );
    }
}
