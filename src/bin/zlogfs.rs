//! The zlogfs command-line tool.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use zlogfs::log::format::{validate_geometry, DEFAULT_SEGMENT_SIZE};
use zlogfs::store::{FileStore, Geometry, Store, META_AREA_SIZE};
use zlogfs::{engine, Engine, Error, Options};

#[derive(Parser)]
#[command(name = "zlogfs", version, about = "A log-structured file system with transparent compression")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create an empty zlogfs image in a file or on a block device.
    Mkfs {
        /// Image file to create (or block device to format).
        image: PathBuf,
        /// Size of a new image file, e.g. 1G, 512M (ignored for devices).
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Segment size, e.g. 4M (128K to 1G, a multiple of 512).
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        segment_size: u64,
        /// Overwrite an existing image or file.
        #[arg(long, short)]
        force: bool,
    },
    /// Open an image (recovering it if needed) and print what it holds.
    Stats {
        /// The image.
        image: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let mul = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1u64 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], mul)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (e.g. 1G, 512M, 4096)"))?;
    n.checked_mul(mul).ok_or_else(|| format!("{s:?} is too large"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Mkfs { image, size, segment_size, force } => mkfs(&image, size, segment_size, force),
        Cmd::Stats { image, json } => stats(&image, json),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zlogfs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn mkfs(image: &Path, size: u64, segment_size: u64, force: bool) -> Result<(), String> {
    let is_dev = std::fs::metadata(image)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    if image.exists() && !force {
        return Err(format!("{} already exists; pass --force to overwrite it", image.display()));
    }
    let size = if is_dev {
        FileStore::len_bytes(image).map_err(|e| format!("cannot size {}: {e}", image.display()))?
    } else {
        size
    };
    let segment_size = u32::try_from(segment_size).map_err(|_| "segment size too large".to_string())?;
    let segment_size = if segment_size == 0 { DEFAULT_SEGMENT_SIZE } else { segment_size };
    let segment_count = size.saturating_sub(META_AREA_SIZE) / u64::from(segment_size);
    let geometry = Geometry { segment_size, segment_count: u32::try_from(segment_count).unwrap_or(u32::MAX) };
    validate_geometry(geometry).map_err(|e| format!("cannot make an image of {size} bytes: {e}"))?;
    let store =
        FileStore::create(image, geometry).map_err(|e| format!("cannot create {}: {e}", image.display()))?;
    let store: Arc<dyn Store> = Arc::new(store);
    let sb = engine::mkfs(store).map_err(|e| e.to_string())?;
    println!(
        "created {}: {} segments of {} KiB ({} MiB), uuid {}",
        image.display(),
        geometry.segment_count,
        geometry.segment_size / 1024,
        geometry.capacity() >> 20,
        sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    Ok(())
}

fn open_image(image: &Path) -> Result<Engine, String> {
    let f = FileStore::open(image).map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    let sb = engine::read_superblock(&f).map_err(|e| format!("{}: {e}", image.display()))?;
    let f = f.with_geometry(sb.geometry).map_err(|e| format!("{}: {e}", image.display()))?;
    let opts = Options { background: false, ..Options::default() };
    Engine::open(Arc::new(f), opts).map_err(|e: Error| format!("{}: {e}", image.display()))
}

fn stats(image: &Path, json: bool) -> Result<(), String> {
    let e = open_image(image)?;
    let s = e.stats();
    let g = e.superblock().geometry;
    if json {
        let v = serde_json::json!({
            "image": image.display().to_string(),
            "format_version": e.superblock().version,
            "segment_size": g.segment_size,
            "segments": s.segments,
            "free_segments": s.free_segments,
            "live_bytes": s.live_bytes,
            "index_runs": s.runs,
            "index_run_entries": s.run_entries,
            "memtable_entries": s.memtable_entries,
            "checkpoint": s.checkpoint,
            "sequence": s.seq,
        });
        println!("{v:#}");
    } else {
        println!("image:          {}", image.display());
        println!("format version: {}", e.superblock().version);
        println!("segments:       {} of {} KiB, {} free", s.segments, g.segment_size / 1024, s.free_segments);
        println!("live bytes:     {}", s.live_bytes);
        println!(
            "index:          {} runs, {} entries; {} in memtable",
            s.runs, s.run_entries, s.memtable_entries
        );
        println!("checkpoint:     {} (sequence number {})", s.checkpoint, s.seq);
    }
    Ok(())
}
