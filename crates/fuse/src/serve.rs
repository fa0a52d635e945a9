//! Serving a request: the [`Handler`] a transport hands each request to,
//! the [`Reply`] that answers it from any thread, and the [`Workers`] that
//! serve the requests that may take long.

use std::fs::File;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use zlogfs_engine::metrics::{self, Histogram};

use crate::abi::{self, InHeader, Op};
use crate::{dev, ring};

/// Serves parsed requests; each [`Reply`] must be answered (dropping one
/// answers EIO).
pub(crate) trait Handler: Send + Sync {
    fn serve(&self, h: &InHeader, op: Op<'_>, reply: Reply);
    /// The INIT flags agreed with the kernel (they shape some requests).
    fn flags(&self) -> u64;
}

/// Hand a request to `handler`. A panic while serving it is reported and
/// answered with EIO (the dropped [`Reply`]), and the mount goes on.
pub(crate) fn dispatch(handler: &dyn Handler, h: &InHeader, op: Op<'_>, mut reply: Reply) {
    let written = if let Op::Write { data, .. } = &op { data.len() as u64 } else { 0 };
    let read = h.opcode == abi::op::READ;
    reply.timer =
        op_histogram(h.opcode).map(|hist| Timer { hist, start: Instant::now(), bytes: written, read });
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.serve(h, op, reply)));
    if let Err(p) = r {
        tracing::error!("internal error serving FUSE operation {}: {}", h.opcode, panic_text(&*p));
    }
}

/// The histogram of FUSE requests with `opcode` in the process's metrics
/// ("fuse.read", ...), made once per opcode.
fn op_histogram(opcode: u32) -> Option<Arc<Histogram>> {
    static T: OnceLock<Vec<Option<Arc<Histogram>>>> = OnceLock::new();
    let t = T.get_or_init(|| metrics::global().op_table("fuse", (0..64).map(abi::op_name)));
    t.get(opcode as usize).cloned().flatten()
}

/// A request being timed, from its parsing to its answer.
struct Timer {
    hist: Arc<Histogram>,
    start: Instant,
    /// Bytes the request carried (a write's data).
    bytes: u64,
    /// A read: the answer's bytes count.
    read: bool,
}

/// What a panic said.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

enum Channel {
    Dev(Arc<File>),
    Ring(Arc<ring::Queue>, u16),
}

/// The answer to one request; it may be sent from any thread.
pub struct Reply {
    unique: u64,
    ch: Option<Channel>,
    timer: Option<Timer>,
}

impl Reply {
    pub(crate) fn dev(dev: Arc<File>, unique: u64) -> Reply {
        Reply { unique, ch: Some(Channel::Dev(dev)), timer: None }
    }

    pub(crate) fn ring(q: Arc<ring::Queue>, entry: u16, unique: u64) -> Reply {
        Reply { unique, ch: Some(Channel::Ring(q, entry)), timer: None }
    }

    /// The reply of a request the kernel wants none for (`/dev/fuse`):
    /// answering it sends nothing.
    pub(crate) fn none(unique: u64) -> Reply {
        Reply { unique, ch: None, timer: None }
    }

    fn send(mut self, error: i32, parts: &[&[u8]]) {
        if let Some(t) = self.timer.take() {
            let read: usize = if t.read { parts.iter().map(|p| p.len()).sum() } else { 0 };
            t.hist.since(t.start, t.bytes + read as u64);
        }
        match self.ch.take() {
            Some(Channel::Dev(f)) => dev::send(&f, self.unique, error, parts),
            Some(Channel::Ring(q, e)) => q.reply(e, self.unique, error, parts),
            None => {}
        }
    }

    /// Success with no body.
    pub(crate) fn ok(self) {
        self.send(0, &[]);
    }

    /// Success with `body`.
    pub(crate) fn data(self, body: &[u8]) {
        self.send(0, &[body]);
    }

    /// Failure with a positive errno.
    pub(crate) fn error(self, errno: i32) {
        self.send(-errno, &[]);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.ch.is_some() {
            let ch = self.ch.take();
            Reply { unique: self.unique, ch, timer: self.timer.take() }.send(-libc::EIO, &[]);
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads that serve the requests that may take long, so that the thread
/// that takes requests from the kernel stays free for the others.
pub(crate) struct Workers {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    pub(crate) fn new(n: usize) -> Workers {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n.max(1))
            .filter_map(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("zlogfs-worker-{i}"))
                    .spawn(move || loop {
                        // The lock is held only while waiting for a job.
                        let job = match rx.lock() {
                            Ok(q) => q.recv(),
                            Err(_) => return,
                        };
                        match job {
                            // A job that panics answers EIO (its Reply is
                            // dropped); the worker goes on.
                            Ok(job) => {
                                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
                                    tracing::error!("internal error in a worker: {}", panic_text(&*p));
                                }
                            }
                            Err(_) => return,
                        }
                    })
                    .ok()
            })
            .collect();
        Workers { queue: Mutex::new(Some(tx)), threads: Mutex::new(threads) }
    }

    /// Run `job` on a worker; on the calling thread if there is none (no
    /// thread could be started, or the workers were stopped).
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(job);
        let job = match self.queue.lock() {
            Ok(q) => match q.as_ref() {
                Some(tx) => match tx.send(job) {
                    Ok(()) => return,
                    Err(mpsc::SendError(job)) => job,
                },
                None => job,
            },
            Err(_) => job,
        };
        job();
    }

    /// Let the queued jobs finish and end the threads.
    pub(crate) fn stop(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let threads = self.threads.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a worker thread ended in a panic (logged where it happened)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn workers_run_jobs_beside_the_caller_and_stop_after_the_queued_ones() {
        let w = Workers::new(2);
        let caller = std::thread::current().id();
        // A job that blocks does not hold up the next one (two workers).
        let (release_tx, release_rx) = channel::<()>();
        let (done_tx, done_rx) = channel();
        let d = done_tx.clone();
        w.run(move || {
            release_rx.recv().unwrap();
            d.send("blocked").unwrap();
        });
        let d = done_tx.clone();
        w.run(move || {
            d.send(if std::thread::current().id() == caller { "inline" } else { "worker" }).unwrap()
        });
        assert_eq!(done_rx.recv().unwrap(), "worker");
        release_tx.send(()).unwrap();
        assert_eq!(done_rx.recv().unwrap(), "blocked");

        // stop() waits for every queued job.
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            let c = Arc::clone(&count);
            w.run(move || {
                std::thread::sleep(Duration::from_micros(100));
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
        w.stop();
        assert_eq!(count.load(Ordering::SeqCst), 100);

        // After stop, a job runs on the caller's thread.
        w.run(move || {
            done_tx.send(if std::thread::current().id() == caller { "inline" } else { "worker" }).unwrap()
        });
        assert_eq!(done_rx.recv().unwrap(), "inline");
    }
}
