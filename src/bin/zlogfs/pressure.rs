//! Giving the caches back under memory pressure (issue 45).
//!
//! A daemon's caches (decompressed blocks, decoded index blocks: up to
//! `block_cache` and `index_cache`) are the process's memory, which the
//! kernel cannot reclaim as it reclaims the page cache. The kernel says
//! when memory is short through PSI: a trigger on `/proc/pressure/memory`
//! (the machine) and on the `memory.pressure` of the daemon's own cgroup
//! (version 2: a service limited by `MemoryHigh=`) wakes this thread when
//! tasks stalled on memory for [`STALL`] within [`WINDOW`]. It then drops
//! both caches, which fill again as requests read.
//!
//! Where no trigger can be set (a kernel without PSI or booted with
//! `psi=0`; before Linux 6.5 a user without CAP_SYS_RESOURCE may not set
//! one) the daemon logs why at start, at info level, and keeps its caches
//! to their bounds. The memory limit of a cgroup of version 1 is not
//! watched (it has no PSI file).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use zlogfs_fs::Live;

/// Time stalled on memory, within [`WINDOW`], that counts as pressure:
/// a tenth of the time.
const STALL: Duration = Duration::from_millis(200);

/// The window PSI measures [`STALL`] over. A user's triggers need a
/// multiple of two seconds.
const WINDOW: Duration = Duration::from_secs(2);

/// The files a trigger can be set on: the machine's, and the cgroup's the
/// daemon runs in when it is a cgroup of version 2 other than the
/// machine's root.
fn trigger_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("/proc/pressure/memory")];
    let text = match std::fs::read_to_string("/proc/self/cgroup") {
        Ok(t) => t,
        Err(e) => {
            tracing::info!("no cgroup memory pressure watched: /proc/self/cgroup: {e}");
            return files;
        }
    };
    if let Some(own) = cgroup2_path(&text) {
        let roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
        files.extend(roots.iter().find_map(|root| own_pressure_file(Path::new(root), &own)));
    }
    files
}

/// The cgroup (version 2) of `/proc/self/cgroup`'s text.
fn cgroup2_path(text: &str) -> Option<String> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    path.starts_with('/').then(|| path.to_string())
}

/// The `memory.pressure` of cgroup `own` under the cgroup file system
/// mounted at `root`, unless it is missing or `own` is the machine's root
/// (whose pressure is /proc's). In a container's cgroup namespace "/" is
/// the container's cgroup, which, as every cgroup but the machine's root,
/// has a `cgroup.type`.
fn own_pressure_file(root: &Path, own: &str) -> Option<PathBuf> {
    let dir = root.join(own.trim_start_matches('/'));
    let file = dir.join("memory.pressure");
    let machine_root = own == "/" && !dir.join("cgroup.type").exists();
    (file.exists() && !machine_root).then_some(file)
}

/// A PSI trigger set on `file`.
fn trigger(file: &Path) -> std::io::Result<OwnedFd> {
    let mut f = OpenOptions::new().read(true).write(true).open(file)?;
    f.write_all(format!("some {} {}\0", STALL.as_micros(), WINDOW.as_micros()).as_bytes())?;
    Ok(f.into())
}

/// The thread that waits for memory pressure, until dropped.
pub(crate) struct Watch {
    /// Closing it wakes the thread to end.
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    /// Watch for memory pressure and drop `live`'s caches under it. None
    /// when no trigger could be set (logged at info: the caches stay to
    /// their bounds).
    pub(crate) fn start(live: Arc<Live>) -> Option<Watch> {
        let (mut triggers, mut refused) = (Vec::new(), Vec::new());
        for f in trigger_files() {
            match trigger(&f) {
                Ok(fd) => triggers.push((f, fd)),
                Err(e) => refused.push(format!("{}: {e}", f.display())),
            }
        }
        if triggers.is_empty() {
            tracing::info!(
                "no memory pressure trigger could be set ({}; no PSI in the kernel, or before Linux 6.5 \
                 a trigger needs CAP_SYS_RESOURCE): the caches are not freed under pressure; size them \
                 with -o block_cache=SIZE,index_cache=SIZE",
                refused.join(", ")
            );
            return None;
        }
        let (wake, stop) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(
                    "cannot watch for memory pressure (pipe: {e}): the caches are not given back"
                );
                return None;
            }
        };
        let names: Vec<String> = triggers.iter().map(|(f, _)| f.display().to_string()).collect();
        let thread = std::thread::Builder::new()
            .name("zlogfs-pressure".into())
            .spawn(move || wait(triggers, wake, || drop_caches(&live)));
        match thread {
            Ok(t) => {
                tracing::info!("freeing the caches under memory pressure ({})", names.join(", "));
                Some(Watch { stop: Some(stop), thread: Some(t) })
            }
            Err(e) => {
                tracing::error!(
                    "cannot start the memory pressure thread: {e}: the caches are not given back"
                );
                None
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the memory pressure thread panicked");
            }
        }
    }
}

/// What one wake-up of [`wait`] says.
#[derive(Debug, PartialEq, Eq)]
struct Step {
    /// The stop pipe spoke (closed): end.
    stop: bool,
    /// A live trigger fired.
    fire: bool,
    /// Triggers whose file went away (a cgroup removed): error or
    /// hang-up, with or without an event (a removed cgroup's file says
    /// POLLPRI too: not pressure).
    gone: Vec<usize>,
}

/// The [`Step`] of the poll results of the stop pipe and the triggers.
fn classify(stop: PollFlags, triggers: &[PollFlags]) -> Step {
    let dead = PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL;
    Step {
        stop: !stop.is_empty(),
        fire: triggers.iter().any(|r| r.contains(PollFlags::POLLPRI) && !r.intersects(dead)),
        gone: (0..triggers.len()).filter(|&i| triggers[i].intersects(dead)).collect(),
    }
}

/// Until `wake` says stop (its other end closed): `act` on the events of
/// the triggers, at most once per [`WINDOW`] (the machine's and the
/// cgroup's fire for the same stall). A trigger whose file went away is
/// left; with none left the thread ends.
fn wait(mut triggers: Vec<(PathBuf, OwnedFd)>, wake: OwnedFd, act: impl Fn()) {
    let mut last: Option<Instant> = None;
    loop {
        let mut fds: Vec<PollFd> = std::iter::once(PollFd::new(wake.as_fd(), PollFlags::POLLIN))
            .chain(triggers.iter().map(|(_, fd)| PollFd::new(fd.as_fd(), PollFlags::POLLPRI)))
            .collect();
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(
                    "waiting for memory pressure: {e}: the caches are no longer freed under pressure"
                );
                return;
            }
        }
        let revents: Vec<PollFlags> =
            fds.iter().map(|fd| fd.revents().unwrap_or(PollFlags::empty())).collect();
        drop(fds);
        let step = classify(revents[0], &revents[1..]);
        if step.stop {
            return;
        }
        for &i in step.gone.iter().rev() {
            let (f, _) = triggers.remove(i);
            tracing::warn!("the memory pressure trigger on {} went away", f.display());
        }
        if step.fire && last.is_none_or(|t| t.elapsed() >= WINDOW - WINDOW / 4) {
            last = Some(Instant::now());
            act();
        }
        if triggers.is_empty() {
            tracing::warn!(
                "no memory pressure trigger is left: the caches are no longer freed under pressure"
            );
            return;
        }
    }
}

/// Drop the caches of the file system `live` serves now, and count it
/// (`zlogfs stats --latency`: `pressure.drop_caches`, its bytes the
/// memory given back).
fn drop_caches(live: &Live) {
    let start = Instant::now();
    let d = live.get().drop_caches();
    let bytes = (d.blocks + d.index) as u64;
    if bytes == 0 {
        return;
    }
    zlogfs::give_back_memory();
    zlogfs_engine::metrics::global().op("pressure.drop_caches").since(start, bytes);
    tracing::info!(
        "memory pressure: freed {} KiB of decompressed blocks and {} KiB of index blocks",
        d.blocks >> 10,
        d.index >> 10
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_cgroup_is_version_2_s_and_not_the_machine_s_root() {
        let v2 = "0::/system.slice/zlogfs-nbd@a.service\n";
        assert_eq!(cgroup2_path(v2).as_deref(), Some("/system.slice/zlogfs-nbd@a.service"));
        assert_eq!(cgroup2_path("4:memory:/user.slice\n0::/\n").as_deref(), Some("/"));
        assert_eq!(cgroup2_path("4:memory:/user.slice\n"), None, "version 1 only");
        let root = std::env::temp_dir().join(format!("zlogfs-pressure-{}", std::process::id()));
        let service = root.join("system.slice/a.service");
        std::fs::create_dir_all(&service).expect("mkdir");
        for f in [root.join("memory.pressure"), service.join("memory.pressure"), service.join("cgroup.type")]
        {
            std::fs::write(f, "").expect("write");
        }
        let own = |path: &str| own_pressure_file(&root, path);
        assert_eq!(own("/system.slice/a.service"), Some(service.join("memory.pressure")));
        assert_eq!(own("/"), None, "the machine's root: no cgroup.type");
        assert_eq!(own("/system.slice/gone.service"), None, "no such cgroup");
        // A container's namespace: its root is a cgroup with a type.
        std::fs::write(root.join("cgroup.type"), "domain\n").expect("write");
        assert_eq!(own("/"), Some(root.join("memory.pressure")));
        std::fs::remove_dir_all(&root).expect("clean up");
    }

    #[test]
    fn only_a_live_trigger_s_event_fires_and_dead_ones_go() {
        use PollFlags as F;
        let none = F::empty();
        let step = |stop, fire, gone: &[usize]| Step { stop, fire, gone: gone.to_vec() };
        assert_eq!(classify(none, &[F::POLLPRI, none]), step(false, true, &[]));
        assert_eq!(classify(none, &[none, none]), step(false, false, &[]));
        // A removed cgroup's file: error and an event, which is not pressure.
        assert_eq!(classify(none, &[F::POLLERR | F::POLLPRI, F::POLLPRI]), step(false, true, &[0]));
        assert_eq!(classify(none, &[F::POLLERR | F::POLLPRI]), step(false, false, &[0]));
        assert_eq!(classify(none, &[F::POLLHUP, F::POLLNVAL]), step(false, false, &[0, 1]));
        assert_eq!(classify(F::POLLHUP, &[F::POLLPRI]), step(true, true, &[]));
    }

    /// A trigger set where the kernel has PSI; where it has not, the test
    /// says so (it cannot fail on such a kernel, and is not the proof).
    #[test]
    fn a_trigger_is_set_on_the_machine_s_pressure() {
        let f = Path::new("/proc/pressure/memory");
        if !f.exists() {
            eprintln!("skipped: this kernel has no PSI ({} missing)", f.display());
            return;
        }
        match trigger(f) {
            Ok(_) => {}
            // An unprivileged user may not set triggers on older kernels.
            // Not allowed (a user before Linux 6.5), a read-only /proc (a
            // container), PSI disabled at boot (psi=0).
            Err(e)
                if [libc::EPERM, libc::EACCES, libc::EROFS, libc::EOPNOTSUPP]
                    .contains(&e.raw_os_error().unwrap_or(0)) =>
            {
                eprintln!("skipped: no trigger may be set here: {e}")
            }
            Err(e) => panic!("a trigger of {STALL:?} in {WINDOW:?} was refused: {e}"),
        }
    }

    #[test]
    fn the_watch_ends_when_told_and_acts_on_nothing_else() {
        let (wake, stop) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let acted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let a = Arc::clone(&acted);
        // A trigger that never fires: the read end of a pipe kept open.
        let (quiet, _quiet_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let t = std::thread::spawn(move || {
            wait(vec![(PathBuf::from("quiet"), quiet)], wake, || {
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(stop);
        t.join().expect("the watch ends");
        assert_eq!(acted.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
