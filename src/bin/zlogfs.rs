//! The zlogfs command-line tool.

/// The allocator: mimalloc keeps freed memory for reuse where glibc's
/// malloc gave it back to the kernel and faulted it in again (7% of the
/// daemon's CPU in a sequential write); docs/decisions/2026-11-25-mimalloc.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

/// `println!` that ends the program quietly when standard output is a
/// pipe its reader closed (`zlogfs ls IMG / | head -1`), where
/// `println!` panics; any other failure to write is said, exit 1.
macro_rules! outln {
    () => { $crate::out_line(format_args!("")) };
    ($($t:tt)*) => { $crate::out_line(format_args!($($t)*)) };
}

fn out_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("zlogfs: writing to standard output: {e}");
        std::process::exit(1);
    }
}

#[path = "zlogfs/admin.rs"]
mod admin;
#[path = "zlogfs/cli.rs"]
mod cli;
#[path = "zlogfs/image.rs"]
mod image;
#[path = "zlogfs/logging.rs"]
mod logging;
#[path = "zlogfs/metrics_http.rs"]
mod metrics_http;
#[path = "zlogfs/mkfs.rs"]
mod mkfs;
#[path = "zlogfs/mount.rs"]
mod mount;
#[path = "zlogfs/nbd.rs"]
mod nbd;
#[path = "zlogfs/pressure.rs"]
mod pressure;
#[path = "zlogfs/tree.rs"]
mod tree;

use cli::{Cli, Cmd, FormatArgs};
use image::{absolute, close, open_fs, open_fs_ro, open_image, s3_options, s3_url, Parts, S3Flags};
use mkfs::mkfs;
use tree::{cat, export, import, ls, stat};

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
    // Run as mount.fuse.zlogfs (a link to this program), mount(8) and
    // /etc/fstab lines of type fuse.zlogfs mount through it.
    // Arguments need not be UTF-8 (file names need not be): clap reads
    // them as OS strings; here only the helper form needs text.
    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let name = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
    // mount.fuse3 (what mount(8) runs for type fuse.zlogfs when there is no
    // mount.fuse.zlogfs) runs `zlogfs IMAGE DIR -o OPTIONS` from PATH.
    let helper_form = argv.get(1).is_some_and(|a| {
        !a.starts_with('-')
            && a != "help"
            && !<Cli as clap::CommandFactory>::command().get_subcommands().any(|c| c.get_name() == a)
    });
    if name.starts_with("mount.") || (helper_form && argv.len() >= 3) {
        if let Some(bad) = std::env::args_os().skip(1).find(|a| a.to_str().is_none()) {
            return finish(Err(format!(
                "{}: mount(8)'s form takes UTF-8 paths and options; use `zlogfs mount IMAGE DIR`",
                bad.to_string_lossy()
            )));
        }
        return finish(mount::helper(&argv[1..]));
    }
    let cli = Cli::parse();
    let parts = Parts {
        fast: cli.fast.as_deref().map(absolute),
        s3: S3Flags { cache: cli.cache.clone(), sync: cli.s3_sync, cache_size: cli.cache_size },
    };
    if !matches!(cli.cmd, Cmd::Mount { .. }) {
        if let Err(e) = logging::init(None, logging::Sink::Stderr) {
            return finish(Err(e));
        }
    }
    let r = match cli.cmd {
        Cmd::Mount { image, dir, mut options, foreground } => {
            // The global flags reach the daemon as mount options
            // (--fast was once dropped here, so a two-device image
            // mounted with the recorded path instead).
            options.extend(parts.s3.as_options());
            if let Some(f) = &parts.fast {
                options.push(format!("fast={}", f.display()));
            }
            mount::mount(&image, &dir, &options, foreground)
        }
        Cmd::Mkfs { image, fmt, force } => mkfs(&image, &fmt, force, &parts).map(|_| ExitCode::SUCCESS),
        Cmd::Import { dir, image, fmt, json } => import(&dir, &image, &fmt, json, &parts),
        Cmd::Export { image, dir, path, json } => export(&image, &dir, &path, json, &parts),
        Cmd::Ls { image, path, json } => ls(&image, &path, json, &parts),
        Cmd::Cat { image, path } => cat(&image, &path, &parts),
        Cmd::Stat { image, path, json } => stat(&image, &path, json, &parts),
        Cmd::Du { target, path, json } => admin::du(&target, &parts, &path, json),
        Cmd::Stats { target, latency: false, watch: false, json, .. } => admin::stats(&target, &parts, json),
        Cmd::Stats { target, watch: false, json, .. } => admin::latency(&target, json),
        Cmd::Stats { target, interval, count, json, .. } => admin::watch(&target, interval, count, json),
        Cmd::Fsck { target, repair, memory, json } => admin::fsck(&target, &parts, repair, memory, json),
        Cmd::Clean { target, segments, max_live, demote, json } => {
            admin::clean(&target, &parts, segments, max_live, demote, json)
        }
        Cmd::Sync { target, json } => admin::sync(&target, &parts, json),
        Cmd::DropCaches { target, json } => admin::drop_caches(&target, json),
        Cmd::Snapshot { action, target, name, json } => {
            admin::snapshot(&target, &parts, &action, name.as_deref(), json)
        }
        Cmd::Changes { target, since, until, json } => {
            admin::changes(&target, &parts, &since, until.as_deref(), json)
        }
        Cmd::Nbd { image, socket, listen, create, chunk_size, unit, cold, options } => {
            let at = match (socket, listen) {
                (Some(p), _) => nbd::Listen::Unix(p),
                (None, Some(a)) => nbd::Listen::Tcp(a),
                (None, None) => return finish(Err("give --socket PATH or --listen HOST:PORT".into())),
            };
            let layout = nbd::VolumeLayout { chunk: chunk_size, unit, cold };
            nbd::nbd(&image, &parts, at, &create, &layout, &options)
        }
        Cmd::Scrub { target, rate, json } => admin::scrub(&target, &parts, rate, json),
    };
    finish(r)
}

fn finish(r: Res) -> ExitCode {
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zlogfs: {e}");
            ExitCode::from(2)
        }
    }
}

type Res = Result<ExitCode, String>;
