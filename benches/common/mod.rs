//! Helpers shared by the benchmark programs (`benches/engine.rs`,
//! `benches/papers.rs`): environment knobs, timing (wall and process CPU
//! time, medians), the corpus file and codec specs. Each program uses a
//! part of them.

#![allow(dead_code, reason = "each test program uses a part of the helpers")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zlogfs_engine::codec::CodecSpec;

pub const MIB: f64 = 1024.0 * 1024.0;

pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
        Err(_) => default,
    }
}

pub fn reps() -> usize {
    env_usize("ZLOGFS_BENCH_REPS", 3).max(1)
}

/// CPU time (user + system) of the whole process, all threads.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct we hand it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(r, 0, "getrusage failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Wall and CPU time of one run.
#[derive(Clone, Copy, Default)]
pub struct Sample {
    pub wall: Duration,
    pub cpu: Duration,
}

/// Time `f` (wall and process CPU time).
pub fn measure(f: impl FnOnce()) -> Sample {
    let (c, t) = (cpu_time(), Instant::now());
    f();
    Sample { wall: t.elapsed(), cpu: cpu_time() - c }
}

/// Medians (wall and CPU separately) of samples.
pub fn median(mut v: Vec<Sample>) -> Sample {
    let mid = v.len() / 2;
    v.sort_by_key(|s| s.wall);
    let wall = v[mid].wall;
    v.sort_by_key(|s| s.cpu);
    Sample { wall, cpu: v[mid].cpu }
}

/// Median of `f` over `reps()` runs, or a single run when the first one
/// takes longer than `slow`.
pub fn time_median(slow: Duration, mut f: impl FnMut() -> Sample) -> Sample {
    let mut v = vec![f()];
    let n = if v[0].wall > slow { 1 } else { reps() };
    while v.len() < n {
        v.push(f());
    }
    median(v)
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// MiB per second.
pub fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / MIB / d.as_secs_f64()
}

/// The cached tar of Debian's linux-source (`/var/tmp/zlogfs-bench/linux-source-*.tar`,
/// made by bench/run-engine.sh or bench/papers.sh), newest first.
pub fn default_corpus() -> Option<PathBuf> {
    let dir = Path::new("/var/tmp/zlogfs-bench");
    let mut tars: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-source-") && n.ends_with(".tar"))
        })
        .collect();
    tars.sort();
    tars.pop()
}

/// `ZLOGFS_BENCH_CORPUS`, else [`default_corpus`].
pub fn corpus_from_env() -> Option<PathBuf> {
    std::env::var_os("ZLOGFS_BENCH_CORPUS").map(PathBuf::from).or_else(default_corpus)
}

/// The first `mib` MiB of the corpus.
pub fn load_corpus(path: &Path, mib: usize) -> Vec<u8> {
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("opening corpus {}: {e}", path.display()));
    let mut buf = Vec::with_capacity(mib << 20);
    f.by_ref().take((mib as u64) << 20).read_to_end(&mut buf).expect("reading the corpus");
    buf
}

pub fn blocks(data: &[u8], size: usize) -> Vec<&[u8]> {
    data.chunks(size).collect()
}

pub fn spec(s: &str) -> CodecSpec {
    s.parse().expect("codec spec")
}
