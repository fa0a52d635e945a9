//! The io_uring transport (FUSE over io_uring, Linux 6.14 and later, when
//! the fuse module's `enable_uring` is on).
//!
//! One queue per possible CPU, each served by a thread pinned to that CPU
//! with its own ring. The kernel puts a request on the queue of the CPU
//! its caller runs on, so the request and its reply wake a thread of the
//! caller's own CPU: no cross-CPU wakeup, which on a virtual machine whose
//! idle vCPUs halt costs a VM exit each way (docs/BENCHMARKS.md).
//!
//! Each queue holds [`DEPTH`] ring entries. An entry is a 288-byte header
//! buffer (the request's `fuse_in_header`, its argument struct, and the
//! ring's own `fuse_uring_ent_in_out`) and a payload buffer (names and
//! write data in; the reply's body out), registered once with
//! `FUSE_IO_URING_CMD_REGISTER`. A request arrives as the completion of
//! an entry's command; its reply is written into the same buffers and
//! committed with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also hands
//! the entry back for the next request.
//!
//! Replies made on the queue's thread are committed after the handler
//! returns. A reply made elsewhere (a worker's, for fsync and large I/O)
//! is queued to the thread and an eventfd, polled on the ring, wakes it:
//! only the queue's thread submits to its ring (`SINGLE_ISSUER`,
//! `DEFER_TASKRUN`: the kernel copies the next request into our buffers
//! only while that thread waits in io_uring_enter).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, ThreadId};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::abi::{self, InHeader, Op};
use crate::serve::{Handler, Reply};

/// Ring entries per queue: requests of one CPU in flight at once.
pub const DEPTH: usize = 8;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `sizeof(struct fuse_uring_req_header)`.
const HEADER: usize = 288;
/// Offset of the argument struct in the header buffer.
const OP_IN: usize = 128;
/// Offset of `struct fuse_uring_ent_in_out`.
const ENT: usize = 256;
/// user_data of the eventfd poll.
const WAKE: u64 = u64::MAX;

/// A reply waiting for its queue's thread.
struct Done {
    entry: u16,
    unique: u64,
    error: i32,
    body: Vec<u8>,
}

/// What a queue shares with the threads that reply to its requests.
pub struct Queue {
    qid: u16,
    pending: Mutex<Vec<Done>>,
    wake: EventFd,
    thread: OnceLock<ThreadId>,
}

impl Queue {
    /// Queue the reply to entry `entry`'s request for the queue's thread.
    pub fn reply(&self, entry: u16, unique: u64, error: i32, parts: &[&[u8]]) {
        let body = if error == 0 { parts.concat() } else { Vec::new() };
        if let Ok(mut p) = self.pending.lock() {
            p.push(Done { entry, unique, error, body });
        }
        if self.thread.get() != Some(&std::thread::current().id()) {
            let _ = self.wake.write(1);
        }
    }
}

/// The number of queues the kernel wants: one per possible CPU (it waits
/// for all of them before it uses any).
pub fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| cpu_count(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One more than the highest CPU of a kernel CPU list ("0-3,8-11").
fn cpu_count(list: &str) -> Option<usize> {
    list.trim()
        .split(',')
        .map(|r| r.rsplit('-').next()?.trim().parse::<usize>().ok())
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()
        .map(|m| m + 1)
}

/// Queue threads with their rings set up, waiting for [`Rings::start`].
pub struct Rings {
    go: Vec<mpsc::Sender<Option<Start>>>,
    threads: Vec<JoinHandle<()>>,
}

/// What a queue thread needs once INIT is answered.
struct Start {
    dev: Arc<File>,
    payload_size: usize,
    handler: Arc<dyn Handler>,
}

impl Rings {
    /// Start a thread for each possible CPU and set up its ring. Fails if
    /// any ring cannot be made (io_uring disabled, too old a kernel): the
    /// kernel must then not be told to use io_uring, since it would wait
    /// for every queue before it serves any request.
    pub fn prepare() -> io::Result<Rings> {
        let n = possible_cpus();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let mut rings = Rings { go: Vec::new(), threads: Vec::new() };
        for qid in 0..n {
            let (go_tx, go_rx) = mpsc::channel::<Option<Start>>();
            let ready = ready_tx.clone();
            let t = std::thread::Builder::new().name(format!("zlogfs-ring-{qid}")).spawn(move || {
                queue_thread(qid as u16, &ready, go_rx);
            })?;
            rings.go.push(go_tx);
            rings.threads.push(t);
        }
        drop(ready_tx);
        for _ in 0..n {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    rings.stop();
                    return Err(e);
                }
                Err(_) => {
                    rings.stop();
                    return Err(io::Error::other("a ring thread ended before its ring was ready"));
                }
            }
        }
        Ok(rings)
    }

    /// INIT is answered with io_uring on: register the queues and serve.
    pub fn start(
        self,
        dev: &Arc<File>,
        payload_size: usize,
        handler: &Arc<dyn Handler>,
    ) -> Vec<JoinHandle<()>> {
        for go in &self.go {
            let _ = go.send(Some(Start { dev: Arc::clone(dev), payload_size, handler: Arc::clone(handler) }));
        }
        self.threads
    }

    /// Not used after all: end the threads.
    pub fn stop(self) {
        for go in &self.go {
            let _ = go.send(None);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

fn new_ring() -> io::Result<Ring> {
    let entries = (DEPTH as u32 + 2).next_power_of_two();
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
}

fn queue_thread(qid: u16, ready: &mpsc::Sender<io::Result<()>>, go: mpsc::Receiver<Option<Start>>) {
    // Serve this CPU's requests on this CPU (best effort: a CPU that is
    // offline now has no callers either).
    let mut cpus = nix::sched::CpuSet::new();
    if cpus.set(qid as usize).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpus);
    }
    let setup = new_ring().and_then(|ring| {
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok((ring, wake))
    });
    let (ring, wake) = match setup {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let Ok(Some(start)) = go.recv() else { return };
    let queue = Arc::new(Queue { qid, pending: Mutex::new(Vec::new()), wake, thread: OnceLock::new() });
    let _ = queue.thread.set(std::thread::current().id());
    let mut q = QueueLoop::new(ring, queue, start);
    if let Err(e) = q.run() {
        tracing::warn!("io_uring queue {qid}: {e}");
    }
    if q.entries.iter().any(|e| e.state != State::Dead) {
        // The kernel may still write into these buffers: never free them.
        std::mem::forget(q.entries);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A command is with the kernel: REGISTER (true) or COMMIT_AND_FETCH.
    Armed { register: bool },
    /// A request is being served.
    Held,
    /// The kernel gave the entry up (unmount, or an error).
    Dead,
}

struct Entry {
    header: Box<[u8; HEADER]>,
    payload: Box<[u8]>,
    /// The two buffers as REGISTER takes them; read by the kernel until
    /// the REGISTER completes.
    iov: Box<[libc::iovec; 2]>,
    state: State,
    unique: u64,
    commit_id: u64,
    /// Registrations in a row that failed with an unexpected error.
    retries: u32,
}

struct QueueLoop {
    ring: Ring,
    queue: Arc<Queue>,
    entries: Vec<Entry>,
    dev: Arc<File>,
    handler: Arc<dyn Handler>,
    cqes: Vec<(u64, i32, u32)>,
    done: Vec<Done>,
}

impl QueueLoop {
    fn new(ring: Ring, queue: Arc<Queue>, start: Start) -> QueueLoop {
        let entries = (0..DEPTH)
            .map(|_| {
                let mut header = Box::new([0u8; HEADER]);
                let mut payload = vec![0u8; start.payload_size].into_boxed_slice();
                let iov = Box::new([
                    libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER },
                    libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
                ]);
                Entry { header, payload, iov, state: State::Dead, unique: 0, commit_id: 0, retries: 0 }
            })
            .collect();
        QueueLoop {
            ring,
            queue,
            entries,
            dev: start.dev,
            handler: start.handler,
            cqes: Vec::with_capacity(2 * DEPTH),
            done: Vec::new(),
        }
    }

    fn cmd(&self, commit_id: u64) -> [u8; 80] {
        // struct fuse_uring_cmd_req: flags, commit_id, qid.
        let mut c = [0u8; 80];
        c[8..16].copy_from_slice(&commit_id.to_le_bytes());
        c[16..18].copy_from_slice(&self.queue.qid.to_le_bytes());
        c
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an SQE points at (an entry's iovec
            // array and the buffers it names) lives in `self.entries`,
            // which is freed only when no entry is with the kernel (or
            // never: see queue_thread).
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            // Full: hand what is queued to the kernel and try again.
            self.ring.submit()?;
        }
    }

    fn register(&mut self, i: usize) -> io::Result<()> {
        let fd = types::Fd(self.dev.as_raw_fd());
        let iov = self.entries[i].iov.as_ptr() as u64;
        let mut sqe = opcode::UringCmd80::new(fd, CMD_REGISTER)
            .cmd(self.cmd(0))
            .addr(Some(iov))
            .build()
            .user_data(i as u64);
        // SAFETY: `squeue::Entry128` is `#[repr(C)]`: the kernel's 64-byte
        // `struct io_uring_sqe` followed by the 64 more bytes of a 128-byte
        // SQE (the size assertion below holds it to that). The sqe's `len`
        // is the u32 at byte 24; REGISTER needs it to count the two iovecs,
        // and the crate's UringCmd80 has no setter for it.
        unsafe {
            const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
            let p = (&mut sqe as *mut squeue::Entry128).cast::<u8>();
            std::ptr::write_unaligned(p.add(24).cast::<u32>(), 2);
        }
        self.entries[i].state = State::Armed { register: true };
        self.push(sqe)
    }

    fn commit(&mut self, i: usize) -> io::Result<()> {
        let fd = types::Fd(self.dev.as_raw_fd());
        let sqe = opcode::UringCmd80::new(fd, CMD_COMMIT_AND_FETCH)
            .cmd(self.cmd(self.entries[i].commit_id))
            .build()
            .user_data(i as u64);
        self.entries[i].state = State::Armed { register: false };
        self.push(sqe)
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let fd = types::Fd(self.queue.wake.as_fd().as_raw_fd());
        let sqe = opcode::PollAdd::new(fd, libc::POLLIN as u32).multi(true).build().user_data(WAKE);
        self.push(squeue::Entry128::from(sqe))
    }

    fn live(&self) -> bool {
        self.entries.iter().any(|e| e.state != State::Dead)
    }

    fn run(&mut self) -> io::Result<()> {
        for i in 0..self.entries.len() {
            self.register(i)?;
        }
        self.arm_wake()?;
        while self.live() {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => return Err(e),
            }
            self.cqes.clear();
            self.cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
            for k in 0..self.cqes.len() {
                let (ud, res, flags) = self.cqes[k];
                if ud == WAKE {
                    let _ = self.queue.wake.read();
                    if !cqueue::more(flags) {
                        self.arm_wake()?;
                    }
                } else {
                    self.completed(ud as usize, res)?;
                }
            }
            self.commit_done()?;
        }
        Ok(())
    }

    /// Entry `i`'s command completed with `res`.
    fn completed(&mut self, i: usize, res: i32) -> io::Result<()> {
        let Some(e) = self.entries.get_mut(i) else { return Ok(()) };
        let State::Armed { register } = e.state else { return Ok(()) };
        if res == 0 {
            e.retries = 0;
            return self.serve(i);
        }
        let err = -res;
        match err {
            // The end of the session: unmounted, aborted, or the daemon's
            // ring is going away.
            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                e.state = State::Dead;
                Ok(())
            }
            // The kernel is off io_uring for this mount: it serves through
            // /dev/fuse.
            libc::EOPNOTSUPP if register => {
                e.state = State::Dead;
                Ok(())
            }
            libc::EAGAIN | libc::EINTR if register => self.register(i),
            _ => {
                tracing::warn!(
                    "io_uring queue {}: {} failed: {}",
                    self.queue.qid,
                    if register { "REGISTER" } else { "COMMIT_AND_FETCH" },
                    io::Error::from_raw_os_error(err)
                );
                // Put the entry back, a few times at most, so that the
                // queue keeps its depth.
                let e = &mut self.entries[i];
                e.retries += 1;
                if e.retries > 3 {
                    e.state = State::Dead;
                    Ok(())
                } else {
                    self.register(i)
                }
            }
        }
    }

    /// Entry `i` holds a request: parse it and hand it to the handler.
    fn serve(&mut self, i: usize) -> io::Result<()> {
        let e = &mut self.entries[i];
        e.state = State::Held;
        let payload_sz = (abi::u32_at(&e.header[..], ENT + 16).unwrap_or(0) as usize).min(e.payload.len());
        e.commit_id = abi::u64_at(&e.header[..], ENT + 8).unwrap_or(0);
        let h = match InHeader::parse(&e.header[..abi::IN_HEADER]) {
            Ok(h) => h,
            Err(_) => {
                // Cannot happen for 40 bytes; answer anyway, so that the
                // entry is handed back.
                e.unique = 0;
                self.queue.reply(i as u16, 0, -libc::EIO, &[]);
                return Ok(());
            }
        };
        e.unique = h.unique;
        let arg_len = abi::arg_size(h.opcode, self.handler.flags()).min(HEADER - OP_IN - 32);
        let arg = &e.header[OP_IN..OP_IN + arg_len];
        let data = &e.payload[..payload_sz];
        let reply = Reply::ring(Arc::clone(&self.queue), i as u16, h.unique);
        match Op::parse(h.opcode, arg, data) {
            // Every ring request is committed, even one with no reply (the
            // handler answers FORGETs with nothing), or its entry is never
            // handed back.
            Ok(op) => crate::serve::dispatch(&*self.handler, &h, op, reply),
            Err(b) => {
                tracing::warn!("malformed FUSE request (operation {}): {}", h.opcode, b.0);
                reply.error(libc::EIO);
            }
        }
        Ok(())
    }

    /// Commit every reply that is ready.
    fn commit_done(&mut self) -> io::Result<()> {
        let mut done = std::mem::take(&mut self.done);
        if let Ok(mut p) = self.queue.pending.lock() {
            std::mem::swap(&mut *p, &mut done);
        }
        for d in done.drain(..) {
            let i = d.entry as usize;
            let Some(e) = self.entries.get_mut(i) else { continue };
            if e.state != State::Held || e.unique != d.unique {
                continue;
            }
            let (error, body) = if d.body.len() > e.payload.len() {
                tracing::warn!("a reply of {} bytes does not fit the ring's buffer", d.body.len());
                (-libc::EIO, &[][..])
            } else {
                (d.error, &d.body[..])
            };
            e.payload[..body.len()].copy_from_slice(body);
            e.header[..abi::OUT_HEADER].copy_from_slice(&abi::out_header(d.unique, error, body.len()));
            e.header[ENT + 16..ENT + 20].copy_from_slice(&(body.len() as u32).to_le_bytes());
            self.commit(i)?;
        }
        self.done = done;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_count("0-1\n"), Some(2));
        assert_eq!(cpu_count("0"), Some(1));
        assert_eq!(cpu_count("0-3,8-11"), Some(12));
        assert_eq!(cpu_count(""), None);
        assert_eq!(cpu_count("0-x"), None);
    }
}
