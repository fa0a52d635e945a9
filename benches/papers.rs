//! The measurements of the design's seed papers, reproduced on our own
//! data (the unpacked Linux source tree, /usr/bin, /usr/lib/x86_64-linux-gnu,
//! /usr/share, /usr/include) through zlogfs's own code paths. Prints
//! Markdown: per section a paragraph saying what was measured and how, then
//! a table. Section 5 also writes a CSV file and an SVG chart.
//!
//! 1. Ratio against compression unit size (Burrows et al. 1992, Table 1).
//! 2. Codec table (Burrows et al. 1992, Table 2).
//! 3. Segments consumed, compressed against uncompressed (Burrows et al.
//!    1992, Table 5).
//! 4. Bytes per inode and inodes compressed per second (Edel et al. 2004,
//!    the NVRAM study).
//! 5. Compressibility and compression speed against file size (Edel et al.
//!    2004, Figure 5).
//! 6. Space saving by file type (the block-level compression paper,
//!    Table II).
//!
//! Run with `cargo bench --bench papers` or `bench/papers.sh` (which also
//! installs and unpacks linux-source and writes the output to
//! bench/results/papers-DATE.md). Nothing about speed is asserted; files
//! that cannot be read are skipped and counted.
//!
//! Environment:
//! - `ZLOGFS_PAPERS_TREE`: the unpacked Linux tree (default: the newest
//!   `/var/tmp/zlogfs-bench/tree/linux-source-*`).
//! - `ZLOGFS_PAPERS_MB`: MiB of the Linux tree and of /usr/bin cut into units
//!   in section 1 (default 64).
//! - `ZLOGFS_PAPERS_SUBTREE`: the Linux subtree imported at each chunk size in
//!   section 1 (default `fs`).
//! - `ZLOGFS_BENCH_CORPUS`, `ZLOGFS_BENCH_TABLE_MB` (default 64),
//!   `ZLOGFS_BENCH_SLOW_MB` (default 8): the codec table's corpus (default:
//!   the cached tar of linux-source, `/var/tmp/zlogfs-bench/linux-source-*.tar`),
//!   MiB of it, and MiB for zstd-19.
//! - `ZLOGFS_BENCH_REPS`: repetitions of timed runs (default 3).
//! - `ZLOGFS_PAPERS_ZSTD19=1`: section 3 also imports with zstd:19 (slow:
//!   several minutes).
//! - `ZLOGFS_PAPERS_SMALL_MB`: at most this many MiB of small files in
//!   section 5 (default 4096; above it every k-th file is taken).
//! - `ZLOGFS_PAPERS_CLASS_MB`: MiB of input per file class in section 6
//!   (default 256).
//! - `ZLOGFS_PAPERS_CSV_DIR`: where section 5 writes its CSV and SVG
//!   (default `bench/results`); `ZLOGFS_PAPERS_DATE`: the date in their
//!   names (default today, UTC).
//! - `ZLOGFS_PAPERS_ONLY`: comma-separated subset of
//!   `units,codecs,segments,inodes,filesize,types`.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hint::black_box;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use common::*;
use zlogfs::tools::import::import;
use zlogfs_engine::codec::{self, CodecId, CodecSpec};
use zlogfs_engine::index::run::{decode_data_block, encode_data_block};
use zlogfs_engine::index::Entry;
use zlogfs_engine::log::format::{BlockAddr, BlockKind, BLOCK_HEADER_SIZE};
use zlogfs_engine::log::{decode_block, NewBlock};
use zlogfs_engine::store::{Geometry, MemStore, Store};
use zlogfs_engine::Options;
use zlogfs_fs::{
    decode_triple, inode_key, inodes_range, parse_inode_key, triple_id, triple_key, triples_end, Inode,
};
use zlogfs_fs::{Atime, Fs, FsOptions, MkfsOptions, ROOT};

/// Segment size of every image made here: the CLI's default for images of
/// 1 GiB and more.
const SEGMENT: u32 = 4 << 20;
const KIB: usize = 1024;

/// Files and directories that could not be read (skipped).
static SKIPPED: AtomicU64 = AtomicU64::new(0);

fn skipped() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

fn skip() {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------
// Inputs.

/// A regular file found by a walk.
#[derive(Clone)]
struct FileEnt {
    path: PathBuf,
    size: u64,
}

/// Regular files under `root`, depth first, names in byte order; symbolic
/// links are not followed. Unreadable directories are skipped and counted.
fn walk(root: &Path, out: &mut Vec<FileEnt>) {
    let rd = match std::fs::read_dir(root) {
        Ok(r) => r,
        Err(_) => {
            skip();
            return;
        }
    };
    let mut ents: Vec<(Vec<u8>, PathBuf)> = Vec::new();
    for e in rd {
        match e {
            Ok(e) => ents.push((e.file_name().as_bytes().to_vec(), e.path())),
            Err(_) => skip(),
        }
    }
    ents.sort();
    for (_, p) in ents {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => walk(&p, out),
            Ok(m) if m.is_file() => out.push(FileEnt { path: p, size: m.len() }),
            Ok(_) => {}
            Err(_) => skip(),
        }
    }
}

/// Walks, each done once.
#[derive(Default)]
struct Trees {
    cache: RefCell<HashMap<PathBuf, Rc<Vec<FileEnt>>>>,
}

impl Trees {
    fn files(&self, root: &Path) -> Rc<Vec<FileEnt>> {
        if let Some(v) = self.cache.borrow().get(root) {
            return v.clone();
        }
        let mut v = Vec::new();
        walk(root, &mut v);
        let v = Rc::new(v);
        self.cache.borrow_mut().insert(root.to_path_buf(), v.clone());
        v
    }
}

/// The whole file, or None (counted as skipped).
fn read_all(path: &Path) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => Some(b),
        Err(_) => {
            skip();
            None
        }
    }
}

/// Up to `n` bytes from the start of the file, or None (counted as skipped).
fn read_head(path: &Path, n: usize) -> Option<Vec<u8>> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(_) => {
            skip();
            return None;
        }
    };
    let mut buf = Vec::with_capacity(n);
    match f.by_ref().take(n as u64).read_to_end(&mut buf) {
        Ok(_) => Some(buf),
        Err(_) => {
            skip();
            None
        }
    }
}

fn default_tree() -> Option<PathBuf> {
    if let Some(t) = std::env::var_os("ZLOGFS_PAPERS_TREE") {
        return Some(PathBuf::from(t));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/var/tmp/zlogfs-bench/tree")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("linux-source-"))
        })
        .collect();
    dirs.sort();
    dirs.pop()
}

fn name_of(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// About `mib` MiB of the files, spread over the whole list: every k-th
/// file in path order (k = total bytes / wanted bytes, at least 1), then,
/// if that is not enough, every k-th file from the second, and so on;
/// concatenated and cut at `mib` MiB.
fn sample(files: &[FileEnt], mib: usize) -> (Vec<u8>, usize) {
    let want = mib << 20;
    let total: u64 = files.iter().map(|f| f.size).sum();
    let k = ((total / want.max(1) as u64) as usize).max(1);
    let mut out = Vec::with_capacity(want);
    let mut n = 0;
    'outer: for first in 0..k {
        for f in files.iter().skip(first).step_by(k) {
            if out.len() >= want {
                break 'outer;
            }
            if let Some(b) = read_all(&f.path) {
                out.extend_from_slice(&b);
                n += 1;
            }
        }
    }
    out.truncate(want);
    (out, n)
}

// ---------------------------------------------------------------------------
// Images.

/// What `zlogfs stats` reports of an image, and the import's time.
#[derive(Default, Clone)]
struct ImageStats {
    files: u64,
    dirs: u64,
    others: u64,
    logical: u64,
    physical: u64,
    live: u64,
    segments: u32,
    free: u32,
    pinned: u32,
    inodes: u64,
    inode_raw: u64,
    inode_comp: u64,
    run_bytes: u64,
    import_secs: f64,
}

fn fs_options() -> FsOptions {
    // As the CLI opens an image (src/bin/zlogfs.rs, open_fs).
    FsOptions {
        engine: Options { background: false, ..Options::default() },
        commit_interval: None,
        atime: Atime::Noatime,
        ..FsOptions::default()
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Names in a directory of the image.
fn names(fs: &Fs, dir: u64) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = fs.readdir(dir, after.as_deref(), 1024).map_err(err)?;
        let Some(last) = page.last() else { return Ok(out) };
        after = Some(last.name.clone());
        out.extend(page.into_iter().map(|e| e.name));
    }
}

/// A fresh in-memory image (segments of 4 MiB, room for `bytes` uncompressed)
/// made with `chunk` and `codec`, into which each source tree is imported
/// with `zlogfs::tools::import::import`, as `zlogfs import` does (then sync,
/// flush, close). `import` loads into the root only, so a source with a
/// destination name is imported into the root and its top-level entries
/// are then renamed into a new directory of that name. The image is then
/// opened again, as `zlogfs stats` opens it, and measured the same way.
fn build_image(
    sources: &[(&Path, Option<&str>)],
    chunk: u32,
    codec: CodecSpec,
    bytes: u64,
) -> Result<(Fs, ImageStats), String> {
    let count = (bytes * 11 / 10 / u64::from(SEGMENT) + 64) as u32;
    let store: Arc<dyn Store> =
        Arc::new(MemStore::new(Geometry { segment_size: SEGMENT, segment_count: count }));
    let mo = MkfsOptions { chunk_size: chunk, codec, ..MkfsOptions::default() };
    zlogfs_fs::mkfs(store.clone(), &mo).map_err(err)?;
    let fs = Fs::open(store.clone(), fs_options()).map_err(err)?;
    let t = Instant::now();
    for (src, dest) in sources {
        let before = names(&fs, ROOT)?;
        if let Some(d) = dest {
            if std::fs::symlink_metadata(src.join(d)).is_ok() {
                return Err(format!("{} has an entry named {d}", src.display()));
            }
        }
        import(&fs, src, &|_, _| {}).map_err(|e| format!("importing {}: {e}", src.display()))?;
        if let Some(d) = dest {
            let dir = fs.mkdir(ROOT, d.as_bytes(), 0o755, 0, 0).map_err(err)?.ino;
            for n in names(&fs, ROOT)? {
                if n != d.as_bytes() && !before.contains(&n) {
                    fs.rename(ROOT, &n, dir, &n, 0).map_err(err)?;
                }
            }
        }
    }
    fs.sync().map_err(err)?;
    fs.engine().flush().map_err(err)?;
    let import_secs = t.elapsed().as_secs_f64();
    fs.close().map_err(err)?;
    let fs = Fs::open(store, fs_options()).map_err(err)?;
    let u = fs.usage().map_err(err)?;
    let s = fs.engine().stats();
    let st = ImageStats {
        files: u.tree.files,
        dirs: u.tree.dirs,
        others: u.tree.others,
        logical: u.tree.logical,
        physical: u.tree.physical,
        live: s.live_bytes,
        segments: s.segments,
        free: s.free_segments,
        pinned: s.pinned_segments,
        inodes: u.inodes,
        inode_raw: u.inode_bytes_raw,
        inode_comp: u.inode_bytes_compressed,
        run_bytes: s.run_bytes,
        import_secs,
    };
    Ok((fs, st))
}

fn tree_bytes(t: &Trees, roots: &[&Path]) -> u64 {
    roots.iter().map(|r| t.files(r).iter().map(|f| f.size).sum::<u64>()).sum()
}

fn pct(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

fn ratio(input: u64, output: u64) -> f64 {
    input as f64 / output.max(1) as f64
}

fn compressed_len(sp: CodecSpec, b: &[u8]) -> usize {
    let mut v = Vec::new();
    codec::codec(sp.id).compress(sp.level, b, &mut v);
    v.len()
}

// ---------------------------------------------------------------------------
// 1. Ratio against compression unit size.

fn sec_units(t: &Trees, linux: &Path) {
    let mib = env_usize("ZLOGFS_PAPERS_MB", 64);
    println!("## 1. Ratio against compression unit size (Burrows et al. 1992, Table 1)\n");
    let units = [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 1024];
    let codecs = ["zstd:3", "lz4", "pred2"];
    let lin = t.files(linux);
    let biggest_c = |dir: &str| {
        let prefix = linux.join(dir);
        lin.iter()
            .filter(|f| f.path.starts_with(&prefix) && f.path.extension().is_some_and(|e| e == "c"))
            .max_by_key(|f| f.size)
            .cloned()
    };
    let mut sets: Vec<(String, Vec<u8>)> = Vec::new();
    for dir in ["kernel", "drivers"] {
        if let Some(f) = biggest_c(dir) {
            if let Some(b) = read_all(&f.path) {
                let rel = f.path.strip_prefix(linux).unwrap_or(&f.path).display().to_string();
                sets.push((format!("`{rel}` (the largest .c file under {dir}/, {} bytes)", b.len()), b));
            }
        }
    }
    let (ls, ln) = sample(&lin, mib);
    sets.push((
        format!(
            "the Linux tree: {ln} regular files (every k-th in path order, k chosen to spread {mib} MiB over \
             the whole tree) concatenated, {:.1} MiB",
            ls.len() as f64 / MIB
        ),
        ls,
    ));
    let bin = t.files(Path::new("/usr/bin"));
    let (bs, bn) = sample(&bin, mib);
    sets.push((
        format!(
            "/usr/bin: {bn} regular files (every k-th in name order) concatenated, {:.1} MiB",
            bs.len() as f64 / MIB
        ),
        bs,
    ));
    println!(
        "**Codec only.** Each input is cut into units of the given size (the last unit of an input may be \
         shorter; units larger than the input are the whole input), each unit is compressed on its own \
         with the codec's own `compress` (`zlogfs_engine::codec::codec(id).compress`: no raw-storage policy, \
         no block header), and the outputs are summed. Size = output as % of input (the paper's \
         \"compression ratio\"); ratio = input / output. zstd:3 is the file system's default codec, \
         pred2 the paper's Algorithm 2. Inputs: {}.\n",
        sets.iter().map(|s| s.0.as_str()).collect::<Vec<_>>().join("; ")
    );
    for (what, data) in &sets {
        if data.is_empty() {
            continue;
        }
        println!("Input: {what}\n");
        print!("| unit | units |");
        for c in codecs {
            print!(" {c} size | {c} ratio |");
        }
        println!();
        println!("|---:|---:|{}", "---:|---:|".repeat(codecs.len()));
        for u in units {
            let n = data.len().div_ceil(u * KIB);
            let label = if u >= 1024 { format!("{} MiB", u / 1024) } else { format!("{u} KiB") };
            print!("| {label} | {n} |");
            for c in codecs {
                let sp = spec(c);
                let out: usize = data.par_chunks(u * KIB).map(|b| compressed_len(sp, b)).sum();
                print!(
                    " {:.1}% | {:.2} |",
                    pct(out as u64, data.len() as u64),
                    ratio(data.len() as u64, out as u64)
                );
            }
            println!();
        }
        println!();
    }

    let sub = std::env::var("ZLOGFS_PAPERS_SUBTREE").unwrap_or_else(|_| "fs".into());
    let root = linux.join(&sub);
    if !root.is_dir() {
        println!("(No `{sub}/` in {}: the file system rows are skipped.)\n", linux.display());
        return;
    }
    let bytes = tree_bytes(t, &[root.as_path()]);
    println!(
        "**Whole file system.** The Linux subtree `{sub}/` ({:.1} MiB in {} regular files) imported with \
         `zlogfs::tools::import::import` into a fresh in-memory image per chunk size (mkfs chunk size, \
         codec zstd:3, 128 KiB pack blocks, 512-byte inline limit, 4 MiB segments), then sync, flush, \
         close and reopen, as `zlogfs import` + `zlogfs stats` do. Data stored = the stored bytes of the \
         file data blocks (stats' `physical_bytes`; data ratio = logical / that, stats' `ratio`); image = \
         every live byte of the log (stats' `live_bytes`: file data, index runs, journal, checkpoint), \
         image ratio = logical / live bytes. Files under half a chunk are packed together into blocks of \
         about 128 KiB (at least one chunk), and files of 512 bytes or less live inline in the index, so \
         these columns are not a per-unit codec measurement.\n",
        bytes as f64 / MIB,
        t.files(&root).len()
    );
    println!(
        "| chunk size | files | logical bytes | data stored | data ratio | index bytes | image (live bytes) | image ratio | import s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for chunk in [4u32 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20] {
        let label =
            if chunk >= 1 << 20 { format!("{} MiB", chunk >> 20) } else { format!("{} KiB", chunk >> 10) };
        match build_image(&[(&root, None)], chunk, spec("zstd:3"), bytes) {
            Ok((_fs, s)) => println!(
                "| {label} | {} | {} | {} | {:.2} | {} | {} | {:.2} | {:.1} |",
                s.files,
                s.logical,
                s.physical,
                ratio(s.logical, s.physical),
                s.run_bytes,
                s.live,
                ratio(s.logical, s.live),
                s.import_secs
            ),
            Err(e) => println!("| {label} | failed: {e} | | | | | | | |"),
        }
    }
    println!();
}

// ---------------------------------------------------------------------------
// 2. Codec table (Burrows et al. 1992, Table 2).

fn sec_codecs(corpus: &Path) {
    let mib = env_usize("ZLOGFS_BENCH_TABLE_MB", 64);
    let slow_mib = env_usize("ZLOGFS_BENCH_SLOW_MB", 8).min(mib);
    let data = load_corpus(corpus, mib);
    let slow_mib = slow_mib.min(data.len() >> 20);
    println!("## 2. Codecs (in the form of Table 2 of Burrows et al. 1992)\n");
    println!(
        "Each codec's own `compress`/`decompress` (no raw-storage policy), one thread, over the first {:.0} MiB \
         of `{}` cut into blocks (zstd-19: first {slow_mib} MiB only). Size = compressed bytes as % of the \
         input (the paper's \"compression ratio\"); speeds in MiB/s of uncompressed data; median of up to {} runs \
         (1 run when a pass takes more than 2 s).\n",
        data.len() as f64 / MIB,
        corpus.display(),
        reps()
    );
    let codecs = ["none", "lz4", "zstd:1", "zstd:3", "zstd:19", "deflate:6", "pred1", "pred2"];
    let names = [
        "none",
        "lz4",
        "zstd-1",
        "zstd-3",
        "zstd-19",
        "deflate-6",
        "pred1 (Algorithm 1)",
        "pred2 (Algorithm 2)",
    ];
    for bs in [16usize << 10, 64 << 10] {
        println!("Blocks of {} KiB:\n", bs >> 10);
        println!("| codec | input MiB | size (% of input) | ratio (input/output) | compress MB/s | decompress MB/s |");
        println!("|---|---:|---:|---:|---:|---:|");
        for (s, name) in codecs.iter().zip(names) {
            let sp = spec(s);
            let input =
                if sp.id == CodecId::Zstd && sp.level >= 19 { &data[..slow_mib << 20] } else { &data[..] };
            if input.is_empty() {
                continue;
            }
            let blks = blocks(input, bs);
            let c = codec::codec(sp.id);
            let mut out: Vec<Vec<u8>> = Vec::new();
            let tc = time_median(Duration::from_secs(2), || {
                let mut o: Vec<Vec<u8>> = Vec::new();
                let m = measure(|| {
                    o = blks
                        .iter()
                        .map(|b| {
                            let mut v = Vec::new();
                            c.compress(sp.level, b, &mut v);
                            v
                        })
                        .collect()
                });
                out = o;
                m
            });
            let td = time_median(Duration::from_secs(2), || {
                measure(|| {
                    for (b, z) in blks.iter().zip(&out) {
                        let mut v = Vec::with_capacity(b.len());
                        c.decompress(z, b.len(), &mut v).expect("decompress");
                        black_box(&v);
                    }
                })
            });
            // Correctness spot check outside the timing.
            for (b, z) in blks.iter().zip(&out).step_by(97) {
                let mut v = Vec::new();
                c.decompress(z, b.len(), &mut v).expect("decompress");
                assert_eq!(&v[..], *b, "{s} does not round-trip");
            }
            let stored: usize = out.iter().map(|z| z.len()).sum();
            println!(
                "| {name} | {:.0} | {:.1}% | {:.2} | {:.0} | {:.0} |",
                input.len() as f64 / MIB,
                100.0 * stored as f64 / input.len() as f64,
                input.len() as f64 / stored as f64,
                mbps(input.len(), tc.wall),
                mbps(input.len(), td.wall)
            );
        }
        println!();
    }
}

// ---------------------------------------------------------------------------
// 3. Segments consumed (Burrows et al. 1992, Table 5).

fn sec_segments(t: &Trees, linux: &Path) {
    let bin = Path::new("/usr/bin");
    let lname = name_of(linux);
    let bytes = tree_bytes(t, &[linux, bin]);
    // pred2 is the paper's Algorithm 2, the closest to what it measured.
    let mut codecs = vec!["none", "lz4", "pred2", "zstd:3"];
    let z19 = std::env::var("ZLOGFS_PAPERS_ZSTD19").is_ok_and(|v| v == "1");
    if z19 {
        codecs.push("zstd:19");
    }
    println!("## 3. Segments consumed (Burrows et al. 1992, Table 5)\n");
    println!(
        "An OS source tree plus binaries: the Linux tree (as `/{lname}`) and /usr/bin (as `/usr-bin`), {:.0} MiB \
         of regular files, imported with `zlogfs::tools::import::import` into one fresh in-memory image per \
         codec (4 MiB segments, 64 KiB chunks, the other mkfs defaults), then sync, flush, close and reopen, \
         as `zlogfs import` + `zlogfs stats` do. Each tree is imported into the root and its top-level \
         entries are then renamed into its directory (`import` has no destination argument). Live bytes = \
         every live block of the log (file data, index runs, journal, checkpoint; stats' `live_bytes`); \
         segments in use = `EngineStats::segments - free_segments` (the engine's own count of segments not \
         free, including those with nothing live that are kept until the next flush, shown as pinned). \
         pred2 is the paper's Algorithm 2 (`crates/engine/src/codec/pred.rs`), zstd:3 the default codec. The two ratio \
         columns divide the uncompressed image's figure by this one's. {}\n",
        bytes as f64 / MIB,
        if z19 { "" } else { "zstd:19 is left out (set ZLOGFS_PAPERS_ZSTD19=1; it takes minutes)." }
    );
    println!(
        "| codec | files | dirs + others | logical bytes | data stored | live bytes | live bytes / 4 MiB | segments in use (pinned) | ratio (segments) | ratio (live bytes) | import s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut base: Option<ImageStats> = None;
    for c in codecs {
        match build_image(&[(linux, Some(lname.as_str())), (bin, Some("usr-bin"))], 64 << 10, spec(c), bytes)
        {
            Ok((fs, s)) => {
                drop(fs);
                let used = s.segments - s.free;
                let b = base.get_or_insert_with(|| s.clone());
                let bused = b.segments - b.free;
                println!(
                    "| {c} | {} | {} | {} | {} | {} | {:.1} | {used} ({}) | {:.2} | {:.2} | {:.1} |",
                    s.files,
                    s.dirs + s.others,
                    s.logical,
                    s.physical,
                    s.live,
                    s.live as f64 / f64::from(SEGMENT),
                    s.pinned,
                    f64::from(bused) / f64::from(used.max(1)),
                    ratio(b.live, s.live),
                    s.import_secs
                );
            }
            Err(e) => println!("| {c} | failed: {e} | | | | | | | | | |"),
        }
    }
    println!();
}

// ---------------------------------------------------------------------------
// 4. Bytes per inode and inodes compressed per second (Edel et al. 2004).

/// Cut entries into run data blocks as the engine's run builder does (a
/// block ends once key + value + 12 bytes per entry reach `block_bytes`).
fn cut_blocks(entries: Vec<Entry>, block_bytes: usize) -> Vec<Vec<Entry>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut cur_bytes = 0;
    for e in entries {
        cur_bytes += e.key.len() + e.value.as_ref().map_or(0, |v| v.len()) + 12;
        cur.push(e);
        if cur_bytes >= block_bytes {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// One index codec's results in section 4.
struct CodecRow {
    name: String,
    blocks: usize,
    raw: usize,
    stored: usize,
    tc: Sample,
    td: Sample,
}

fn sec_inodes(t: &Trees, linux: &Path) {
    let inc = Path::new("/usr/include");
    let lname = name_of(linux);
    let bytes = tree_bytes(t, &[linux, inc]);
    println!("## 4. Bytes per inode and inodes compressed per second (Edel et al. 2004)\n");
    let (fs, s) = match build_image(
        &[(linux, Some(lname.as_str())), (inc, Some("usr-include"))],
        64 << 10,
        spec("zstd:3"),
        bytes,
    ) {
        Ok(v) => v,
        Err(e) => {
            println!("Import failed: {e}\n");
            return;
        }
    };
    let eng = fs.engine();
    let base_sec = fs.config().base_sec;
    let opts = Options::default();
    // The inode records as stored, decoded back into `Inode`s (not timed).
    let mut ids: HashMap<u32, (u32, u32, u32)> = HashMap::new();
    let mut rev: HashMap<(u32, u32, u32), u32> = HashMap::new();
    let trip = eng.scan(&triple_key(0), Some(&triples_end()), usize::MAX).unwrap_or_default();
    for (k, v) in trip {
        if let (Some(id), Ok(tr)) = (triple_id(&k), decode_triple(&v)) {
            ids.insert(id, tr);
            rev.insert(tr, id);
        }
    }
    let (lo, hi) = inodes_range();
    let recs = eng.scan(&lo, Some(&hi), usize::MAX).unwrap_or_default();
    let mut inodes: Vec<Inode> = Vec::with_capacity(recs.len());
    let mut bad = 0usize;
    for (k, v) in &recs {
        match parse_inode_key(k).map(|ino| Inode::decode(ino, v, base_sec, |id| ids.get(&id).copied())) {
            Some(Ok(i)) => inodes.push(i),
            _ => bad += 1,
        }
    }
    let n = inodes.len();
    drop(recs);
    println!(
        "The Linux tree (as `/{lname}`) and /usr/include (as `/usr-include`) imported into one in-memory image \
         (zstd:3, 64 KiB chunks, 4 MiB segments) as in section 3: {} files, {} directories, {} others, {} \
         inode records ({} triples of (uid, gid, mode)). **Stats**: `inode_bytes_raw` and \
         `inode_bytes_compressed` exactly as `zlogfs stats --json` computes them (`Fs::usage`: the records' \
         key + value bytes, concatenated in key order into pieces of 16 KiB, each through `codec::encode` with \
         zstd:3; no block headers, no run framing). **Timed** (one thread, no other work; median of {} runs), \
         for all {n} inodes: (a) *encode*: for each inode, `inode_key(ino)` and `Inode::encode(triple id, \
         base_sec)` with the triple id looked up in a hash map, as the fs layer saves an inode; (b) *encode + \
         compress*: (a), then the entries (sequence numbers 1..n) cut into run data blocks as the engine's run \
         builder cuts them (about `run_block_bytes` = {} KiB of key + value + 12 bytes each), \
         `encode_data_block`, and `NewBlock::encode(RunData, ...)` with the engine's index codec (the real \
         compression + crc of an index block); the stored bytes include the 16-byte block headers; (c) \
         *decompress + decode*: `log::decode_block` (crc check, decompression) of those blocks, \
         `decode_data_block`, and `Inode::decode` of every entry. Not timed: the import, reading the records \
         out of the index, the merge and write-out of runs, the other records (names, extents) that share the \
         real run blocks. Rows other than {} show the same records under other codecs for comparison.{}\n",
        s.files,
        s.dirs,
        s.others,
        s.inodes,
        ids.len(),
        reps(),
        opts.run_block_bytes >> 10,
        opts.index_codec,
        if bad > 0 { format!(" {bad} records could not be decoded and were left out.") } else { String::new() }
    );
    println!("| measure | inodes | raw bytes | raw bytes / inode | stored bytes | bytes / inode | saved |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| `zlogfs stats` (zstd:3, 16 KiB pieces, payload only) | {} | {} | {:.1} | {} | {:.2} | {:.1}% |",
        s.inodes,
        s.inode_raw,
        s.inode_raw as f64 / s.inodes.max(1) as f64,
        s.inode_comp,
        s.inode_comp as f64 / s.inodes.max(1) as f64,
        100.0 - pct(s.inode_comp, s.inode_raw)
    );
    let encode_all = |inodes: &[Inode]| -> Vec<Entry> {
        inodes
            .iter()
            .enumerate()
            .map(|(i, ino)| {
                let tid = rev.get(&ino.triple()).copied().unwrap_or(0);
                Entry { key: inode_key(ino.ino), seq: i as u64 + 1, value: Some(ino.encode(tid, base_sec)) }
            })
            .collect()
    };
    let te = time_median(Duration::from_secs(5), || measure(|| drop(black_box(encode_all(&inodes)))));
    let mut rows: Vec<CodecRow> = Vec::new();
    for c in [opts.index_codec, spec("zstd:1"), spec("lz4")] {
        let build = |inodes: &[Inode]| -> (Vec<NewBlock>, usize) {
            let blocks = cut_blocks(encode_all(inodes), opts.run_block_bytes);
            let mut raw = 0;
            let out = blocks
                .iter()
                .map(|b| {
                    let r = encode_data_block(b);
                    raw += r.len();
                    NewBlock::encode(BlockKind::RunData, 1, c, &r)
                })
                .collect();
            (out, raw)
        };
        let mut sealed: Vec<NewBlock> = Vec::new();
        let mut raw = 0;
        let tc = time_median(Duration::from_secs(5), || {
            let mut r = (Vec::new(), 0);
            let m = measure(|| r = build(&inodes));
            (sealed, raw) = r;
            m
        });
        let stored: usize = sealed.iter().map(|b| b.bytes().len()).sum();
        let mut decoded = 0usize;
        let td = time_median(Duration::from_secs(5), || {
            measure(|| {
                decoded = 0;
                for b in &sealed {
                    let Ok(r) = decode_block(b.bytes(), BlockAddr::default(), BlockKind::RunData) else {
                        continue;
                    };
                    let Ok(es) = decode_data_block(&r, "run data block") else { continue };
                    for e in es {
                        if let (Some(ino), Some(v)) = (parse_inode_key(&e.key), e.value.as_deref()) {
                            if Inode::decode(ino, v, base_sec, |id| ids.get(&id).copied()).is_ok() {
                                decoded += 1;
                            }
                        }
                    }
                }
            })
        });
        if decoded != n {
            println!("(warning: {c}: {decoded} of {n} inodes decoded back)");
        }
        rows.push(CodecRow { name: c.to_string(), blocks: sealed.len(), raw, stored, tc, td });
    }
    for r in &rows {
        println!(
            "| run data blocks, {} ({} blocks, 16-byte headers included) | {n} | {} | {:.1} | {} | {:.2} | {:.1}% |",
            r.name,
            r.blocks,
            r.raw,
            r.raw as f64 / n.max(1) as f64,
            r.stored,
            r.stored as f64 / n.max(1) as f64,
            100.0 - pct(r.stored as u64, r.raw as u64)
        );
    }
    println!();
    let per = |d: Duration| n as f64 / d.as_secs_f64();
    println!("| index codec | (a) encode: inodes/s | (b) encode + compress: inodes/s | (b) MiB/s of raw blocks | (c) decompress + decode: inodes/s |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r.name,
            per(te.wall),
            per(r.tc.wall),
            mbps(r.raw, r.tc.wall),
            per(r.td.wall)
        );
    }
    println!();
}

// ---------------------------------------------------------------------------
// 5. Compressibility and speed against file size (Edel et al. 2004, Fig. 5).

const BUCKET: u64 = 512;
const SMALL_MAX: u64 = 128 << 10;
const NBUCKETS: usize = (SMALL_MAX / BUCKET) as usize;

#[derive(Default, Clone, Copy)]
struct Bucket {
    files: u64,
    bytes: u64,
    comp: u64,
    secs: f64,
}

fn today() -> String {
    if let Ok(d) = std::env::var("ZLOGFS_PAPERS_DATE") {
        return d;
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Ratio (top) and compression speed (bottom) per 512-byte bucket.
fn svg_chart(b: &[Bucket]) -> String {
    let (w, left, right, top, ph, gap) = (960.0, 70.0, 35.0, 50.0, 200.0, 70.0);
    let pw = w - left - right;
    let h = top + 2.0 * ph + gap + 50.0;
    let bw = pw / NBUCKETS as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">zlogfs: files of at most 128 KiB compressed alone with zstd:3, per 512-byte size bucket</text>"#,
        w / 2.0
    );
    let ratios: Vec<f64> =
        b[1..].iter().map(|x| if x.comp > 0 { ratio(x.bytes, x.comp) } else { 0.0 }).collect();
    let speeds: Vec<f64> =
        b[1..].iter().map(|x| if x.secs > 0.0 { x.bytes as f64 / MIB / x.secs } else { 0.0 }).collect();
    let panels: [(&str, &Vec<f64>, &str, f64); 2] = [
        ("ratio (input / output)", &ratios, "#3b6fb6", top),
        ("compress MiB/s (one thread)", &speeds, "#d0792c", top + ph + gap),
    ];
    for (label, vals, color, y0) in panels {
        let max = vals.iter().copied().fold(0.0f64, f64::max);
        // A round scale: 1, 2 or 5 times a power of ten per gridline.
        let step = {
            let raw = (max / 5.0).max(1e-9);
            let p = 10f64.powf(raw.log10().floor());
            [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|v| *v >= raw).unwrap_or(10.0 * p)
        };
        let ymax = (max / step).ceil().max(1.0) * step;
        let y = |v: f64| y0 + ph - v / ymax * ph;
        let mut g = 0.0;
        while g <= ymax + step / 2.0 {
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + pw,
                y(g),
                y(g),
                left - 6.0,
                y(g) + 4.0,
                if step < 1.0 { format!("{g:.1}") } else { format!("{g:.0}") }
            );
            g += step;
        }
        for (i, v) in vals.iter().enumerate() {
            if *v > 0.0 {
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{color}"/>"#,
                    left + i as f64 * bw,
                    y(*v),
                    (bw - 0.5).max(0.5),
                    y0 + ph - y(*v)
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="black"/><line x1="{left}" x2="{left}" y1="{y0}" y2="{}" stroke="black"/>"#,
            left + pw,
            y0 + ph,
            y0 + ph,
            y0 + ph
        );
        for k in (0..=128).step_by(16) {
            let x = left + k as f64 * 2.0 * bw;
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="black"/><text x="{x:.1}" y="{}" text-anchor="middle">{k} KiB</text>"#,
                y0 + ph,
                y0 + ph + 5.0,
                y0 + ph + 18.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">{label}</text>"#,
            y0 + ph / 2.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">file size (bucket = ceil(size / 512))</text>"#,
        left + pw / 2.0,
        h - 8.0
    );
    s.push_str("</svg>\n");
    s
}

fn sec_filesize(t: &Trees, linux: &Path) {
    let cap = env_usize("ZLOGFS_PAPERS_SMALL_MB", 4096) as u64;
    let roots = [linux, Path::new("/usr/share"), Path::new("/usr/bin")];
    let mut files: Vec<FileEnt> = Vec::new();
    for r in &roots {
        files.extend(t.files(r).iter().filter(|f| f.size <= SMALL_MAX).cloned());
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let k = (total.div_ceil((cap << 20).max(1)) as usize).max(1);
    let files: Vec<FileEnt> = files.into_iter().step_by(k).collect();
    let sp = spec("zstd:3");
    let zc = codec::codec(sp.id);
    let mut b = vec![Bucket::default(); NBUCKETS + 1];
    // Read a batch on all cores, then compress its files one at a time on
    // this thread, timing each compression alone.
    for batch in files.chunks(512) {
        let data: Vec<Option<Vec<u8>>> = batch.par_iter().map(|f| read_all(&f.path)).collect();
        for d in data.into_iter().flatten() {
            let i = (d.len() as u64).div_ceil(BUCKET) as usize;
            if i > NBUCKETS {
                continue; // grew since the walk
            }
            let x = &mut b[i];
            x.files += 1;
            x.bytes += d.len() as u64;
            if d.is_empty() {
                continue;
            }
            let mut v = Vec::new();
            let t0 = Instant::now();
            zc.compress(sp.level, &d, &mut v);
            x.secs += t0.elapsed().as_secs_f64();
            x.comp += v.len() as u64;
        }
    }
    println!("## 5. Compressibility and compression speed against file size (Edel et al. 2004, Figure 5)\n");
    let all_files: u64 = b.iter().map(|x| x.files).sum();
    println!(
        "Every regular file of at most 128 KiB in the Linux tree, /usr/share and /usr/bin ({all_files} files, \
         {:.0} MiB{}), each compressed alone with zstd:3 through the codec's own `compress` (no raw-storage \
         policy: what zstd makes of the file, frame header included), one thread, each call timed on its own \
         with `Instant` (file reading not timed). Files are bucketed by ceil(size / 512): bucket i holds sizes \
         512(i-1)+1 ..= 512i. Ratio = bytes / compressed bytes; saved = 1 - compressed / bytes (the paper's \
         \"compressibility\"); MiB/s = bytes / summed compression time. The rows below merge buckets; the \
         full table of 256 buckets is in the CSV file, and the SVG plots ratio and speed per bucket.\n",
        b.iter().map(|x| x.bytes).sum::<u64>() as f64 / MIB,
        if k > 1 { format!("; every {k}-th file, to stay under {cap} MiB") } else { String::new() }
    );
    let dir =
        PathBuf::from(std::env::var("ZLOGFS_PAPERS_CSV_DIR").unwrap_or_else(|_| "bench/results".into()));
    let stem = format!("papers-{}-filesize", today());
    let mut csv = String::from(
        "bucket,size_min,size_max,files,bytes,compressed_bytes,ratio,saved_pct,compress_seconds,compress_mib_per_s\n",
    );
    for (i, x) in b.iter().enumerate() {
        let (lo, hi) = if i == 0 { (0, 0) } else { ((i as u64 - 1) * BUCKET + 1, i as u64 * BUCKET) };
        let _ = writeln!(
            csv,
            "{i},{lo},{hi},{},{},{},{:.4},{:.2},{:.6},{:.1}",
            x.files,
            x.bytes,
            x.comp,
            if x.comp > 0 { ratio(x.bytes, x.comp) } else { 0.0 },
            if x.bytes > 0 { 100.0 - pct(x.comp, x.bytes) } else { 0.0 },
            x.secs,
            if x.secs > 0.0 { x.bytes as f64 / MIB / x.secs } else { 0.0 }
        );
    }
    let written = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(dir.join(format!("{stem}.csv")), &csv))
        .and_then(|_| std::fs::write(dir.join(format!("{stem}.svg")), svg_chart(&b)));
    // Shown relative to the working directory (the package root under
    // `cargo bench`) when inside it.
    let shown = |name: String| {
        let p = dir.join(name);
        let cwd = std::env::current_dir().unwrap_or_default();
        p.strip_prefix(&cwd).map(Path::to_path_buf).unwrap_or(p).display().to_string()
    };
    match written {
        Ok(()) => println!(
            "Full table: `{}`; chart: `{}`.\n",
            shown(format!("{stem}.csv")),
            shown(format!("{stem}.svg"))
        ),
        Err(e) => println!("(Could not write the CSV/SVG into {}: {e}.)\n", dir.display()),
    }
    println!("| file size | files | bytes | compressed bytes | ratio | saved | compress MiB/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let row = |label: &str, xs: &[Bucket]| {
        let s = xs.iter().fold(Bucket::default(), |a, x| Bucket {
            files: a.files + x.files,
            bytes: a.bytes + x.bytes,
            comp: a.comp + x.comp,
            secs: a.secs + x.secs,
        });
        println!(
            "| {label} | {} | {} | {} | {:.2} | {:.1}% | {:.0} |",
            s.files,
            s.bytes,
            s.comp,
            ratio(s.bytes, s.comp),
            100.0 - pct(s.comp, s.bytes),
            s.bytes as f64 / MIB / s.secs.max(1e-12)
        );
    };
    println!("| empty | {} | 0 | | | | |", b[0].files);
    let mut lo = 1usize;
    for (label, hi) in [
        ("1 B - 1 KiB", 2usize),
        ("1 - 2 KiB", 4),
        ("2 - 4 KiB", 8),
        ("4 - 8 KiB", 16),
        ("8 - 16 KiB", 32),
        ("16 - 32 KiB", 64),
        ("32 - 64 KiB", 128),
        ("64 - 128 KiB", 256),
    ] {
        row(label, &b[lo..=hi]);
        lo = hi + 1;
    }
    row("**4 - 128 KiB** (the paper's range)", &b[9..]);
    row("**all non-empty**", &b[1..]);
    println!();
}

// ---------------------------------------------------------------------------
// 6. Space saving by file type (block-level compression paper, Table II).

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Class {
    Text,
    Source,
    Binary,
    Document,
    Compressed,
    Other,
}

impl Class {
    const ALL: [Class; 6] =
        [Class::Text, Class::Source, Class::Binary, Class::Document, Class::Compressed, Class::Other];

    fn name(self) -> &'static str {
        match self {
            Class::Text => "text",
            Class::Source => "source",
            Class::Binary => "binaries (ELF)",
            Class::Document => "documents",
            Class::Compressed => "already compressed",
            Class::Other => "other",
        }
    }
}

const SOURCE_EXT: &[&str] = &[
    "c", "h", "cc", "cpp", "cxx", "hh", "hpp", "hxx", "py", "pl", "pm", "rs", "sh", "bash", "s", "asm",
    "java", "js", "ts", "go", "rb", "lua", "awk", "sed", "y", "l", "cmake", "mk", "el", "scm", "tcl", "php",
    "m4", "dts", "dtsi", "lds", "cocci", "bpf", "tc", "vim",
];
const DOC_EXT: &[&str] = &[
    "html", "htm", "xhtml", "xml", "pdf", "ps", "eps", "tex", "md", "rst", "svg", "json", "yaml", "yml",
    "toml", "css", "csv", "tsv", "dtd", "xsl", "xslt", "sgml", "texi", "docbook",
];
const COMPRESSED_EXT: &[&str] = &[
    "gz", "tgz", "xz", "txz", "bz2", "zst", "lz4", "lzma", "z", "zip", "jar", "png", "jpg", "jpeg", "gif",
    "webp", "woff", "woff2", "mp3", "ogg", "oga", "flac", "mp4", "deb", "7z", "br", "whl",
];
const TEXT_EXT: &[&str] = &["txt", "text", "conf", "cfg", "ini", "log", "info"];

/// Mostly printable: no NUL, and at least 90% of the bytes are printable
/// ASCII, whitespace, or bytes of UTF-8 sequences.
fn looks_text(head: &[u8]) -> bool {
    if head.contains(&0) {
        return false;
    }
    let ok =
        head.iter().filter(|&&c| c >= 0x20 || c == b'\n' || c == b'\r' || c == b'\t' || c == 0x0c).count();
    ok * 10 >= head.len() * 9
}

fn classify(path: &Path, head: &[u8]) -> Class {
    if head.starts_with(b"\x7fELF") {
        return Class::Binary;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let ext = match name.rfind('.') {
        Some(i) if i > 0 => Some(&name[i + 1..]),
        _ => None,
    };
    match ext {
        Some(e) if SOURCE_EXT.contains(&e) => Class::Source,
        Some(e) if DOC_EXT.contains(&e) => Class::Document,
        Some(e) if COMPRESSED_EXT.contains(&e) => Class::Compressed,
        Some(e) if TEXT_EXT.contains(&e) => Class::Text,
        // Uncompressed man pages: name.1 .. name.9 (and 3pm, 1ssl, ...).
        Some(e)
            if e.as_bytes().first().is_some_and(u8::is_ascii_digit) && e.len() <= 5 && looks_text(head) =>
        {
            if name.starts_with("readme") || path.components().any(|c| c.as_os_str() == "man") {
                Class::Text
            } else {
                Class::Other
            }
        }
        _ if name.starts_with("readme") && looks_text(head) => Class::Text,
        None if looks_text(head) => Class::Text,
        _ => Class::Other,
    }
}

fn sec_types(t: &Trees, linux: &Path) {
    let cap = (env_usize("ZLOGFS_PAPERS_CLASS_MB", 256) as u64) << 20;
    let chunk = 64 * KIB;
    let sp = spec("zstd:3");
    let roots =
        [linux, Path::new("/usr/bin"), Path::new("/usr/lib/x86_64-linux-gnu"), Path::new("/usr/share")];
    // Classify every file, in order (trees in the order above, paths
    // sorted); a class over the cap is thinned to every k-th file.
    let mut classes: BTreeMap<Class, Vec<FileEnt>> = BTreeMap::new();
    for r in &roots {
        let files = t.files(r);
        let heads: Vec<Option<Vec<u8>>> = files.par_iter().map(|f| read_head(&f.path, 8 * KIB)).collect();
        for (f, h) in files.iter().zip(heads) {
            let Some(h) = h else { continue };
            classes.entry(classify(&f.path, &h)).or_default().push(f.clone());
        }
    }
    println!("## 6. Space saving by file type (block-level compression paper, Table II)\n");
    println!(
        "Regular files of the Linux tree, /usr/bin, /usr/lib/x86_64-linux-gnu and /usr/share, classified by the \
         ELF magic number first, then by extension: source (.c .h .S .py .pl .rs .sh .java .js .dts .vim ...), \
         documents (.html .xml .pdf .ps .tex .md .rst .svg .json .yaml .css .csv .tsv ...), already compressed (.gz .xz \
         .bz2 .zst .zip .jar .png .jpg .gif .woff2 .ogg .deb ...), text (.txt .conf .info, README*, \
         uncompressed man pages, and files without an extension whose first 8 KiB look like text: no NUL, \
         90% printable), other (everything else: .mo catalogues, fonts, archives, data files, unknown \
         extensions). Input per class: all its files, or when they hold more than {} MiB every k-th of them \
         (trees in the order listed, paths sorted; k = ceil(class bytes / cap)). Stored = as zlogfs stores the data of \
         large files: each file cut into 64 KiB chunks, an all-zero chunk stored as a hole (0 bytes), every \
         other chunk through the log's policy function `codec::encode` with zstd:3 (stored raw when the entropy \
         probe calls it incompressible or compression saves less than 1/8), plus the 16-byte block header. Real \
         small files are packed together or inlined instead, which this leaves out. Space saving = 1 - stored \
         / input.\n",
        cap >> 20
    );
    println!(
        "| class | files seen | bytes seen | files measured | input bytes | stored bytes | space saving | ratio | chunks stored raw |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut tot = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    for c in Class::ALL {
        let all = classes.get(&c).map(Vec::as_slice).unwrap_or_default();
        let (sf, sb) = (all.len() as u64, all.iter().map(|f| f.size).sum::<u64>());
        let k = (sb.div_ceil(cap.max(1)) as usize).max(1);
        let files: Vec<&FileEnt> = all.iter().step_by(k).collect();
        let res: Vec<(u64, u64, u64, u64)> = files
            .par_iter()
            .filter_map(|f| {
                let d = read_all(&f.path)?;
                let (mut stored, mut raw_chunks, mut chunks) = (0u64, 0u64, 0u64);
                for ch in d.chunks(chunk) {
                    chunks += 1;
                    if ch.iter().all(|&x| x == 0) {
                        continue;
                    }
                    let e = codec::encode(sp, ch);
                    stored += (e.data.len() + BLOCK_HEADER_SIZE) as u64;
                    raw_chunks += u64::from(e.raw_reason != 0);
                }
                Some((d.len() as u64, stored, raw_chunks, chunks))
            })
            .collect();
        let n = res.len() as u64;
        let input: u64 = res.iter().map(|r| r.0).sum();
        let stored: u64 = res.iter().map(|r| r.1).sum();
        let raw: u64 = res.iter().map(|r| r.2).sum();
        let chunks: u64 = res.iter().map(|r| r.3).sum();
        tot = (tot.0 + sf, tot.1 + sb, tot.2 + n, tot.3 + input, tot.4 + stored, tot.5 + raw);
        println!(
            "| {} | {sf} | {sb} | {n} | {input} | {stored} | {:.1}% | {:.2} | {raw} of {chunks} |",
            c.name(),
            100.0 - pct(stored, input),
            ratio(input, stored)
        );
    }
    let other = classes.get(&Class::Other).map(Vec::as_slice).unwrap_or_default();
    let mut exts: HashMap<String, u64> = HashMap::new();
    for f in other {
        let name = f.path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        let e = match name.rfind('.') {
            Some(i) if i > 0 => format!(".{}", &name[i + 1..]),
            _ => "(no extension)".into(),
        };
        *exts.entry(e).or_default() += f.size;
    }
    let mut exts: Vec<(String, u64)> = exts.into_iter().collect();
    exts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other_note = exts
        .iter()
        .take(8)
        .map(|(e, b)| format!("{e} {:.0} MiB", *b as f64 / MIB))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "| **all measured** | {} | {} | {} | {} | {} | {:.1}% | {:.2} | {} |",
        tot.0,
        tot.1,
        tot.2,
        tot.3,
        tot.4,
        100.0 - pct(tot.4, tot.3),
        ratio(tot.3, tot.4),
        tot.5
    );
    println!("\nThe largest parts of \"other\" seen, by extension: {other_note}.\n");
}

// ---------------------------------------------------------------------------

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // binary without it, and a test run must not spend minutes measuring.
    if !std::env::args().any(|a| a == "--bench") {
        println!("seed paper reproductions: run them with `cargo bench --bench papers` or bench/papers.sh");
        return;
    }
    let only = std::env::var("ZLOGFS_PAPERS_ONLY").unwrap_or_default();
    let want = |s: &str| only.is_empty() || only.split(',').any(|o| o.trim() == s);
    let start = Instant::now();
    let linux = default_tree().filter(|p| p.is_dir());
    let corpus = corpus_from_env();
    println!("# zlogfs: the seed papers' measurements on our data\n");
    println!(
        "rayon threads: {}; load average at start: {}; Linux tree: {}; codec table corpus: {}\n",
        rayon::current_num_threads(),
        load_average(),
        linux.as_ref().map_or("none (set ZLOGFS_PAPERS_TREE or run bench/papers.sh)".into(), |p| format!(
            "`{}`",
            p.display()
        )),
        corpus.as_ref().map_or("none".into(), |p| format!("`{}`", p.display()))
    );
    let trees = Trees::default();
    let mut times: Vec<(&str, f64, u64)> = Vec::new();
    let mut run = |name: &'static str, f: &mut dyn FnMut()| {
        if !want(name) {
            return;
        }
        let (t, sk) = (Instant::now(), skipped());
        f();
        let secs = t.elapsed().as_secs_f64();
        let sk = skipped() - sk;
        println!("_Section `{name}`: {secs:.1} s; {sk} unreadable files or directories skipped._\n");
        times.push((name, secs, sk));
    };
    let need_tree = |name: &str| {
        println!("(Section `{name}` needs the Linux tree: skipped.)\n");
    };
    run("units", &mut || match &linux {
        Some(l) => sec_units(&trees, l),
        None => need_tree("units"),
    });
    run("codecs", &mut || match &corpus {
        Some(c) => sec_codecs(c),
        None => println!(
            "(Section `codecs` needs the corpus: set ZLOGFS_BENCH_CORPUS or run bench/papers.sh, which \
             prepares /var/tmp/zlogfs-bench/linux-source-*.tar; skipped.)\n"
        ),
    });
    type Section = fn(&Trees, &Path);
    let on_tree: [(&'static str, Section); 4] = [
        ("segments", sec_segments),
        ("inodes", sec_inodes),
        ("filesize", sec_filesize),
        ("types", sec_types),
    ];
    for (name, sec) in on_tree {
        run(name, &mut || match &linux {
            Some(l) => sec(&trees, l),
            None => need_tree(name),
        });
    }
    println!(
        "Total: {:.1} s ({}); load average at the end: {}",
        start.elapsed().as_secs_f64(),
        times.iter().map(|(n, s, _)| format!("{n} {s:.1} s")).collect::<Vec<_>>().join(", "),
        load_average()
    );
}
