//! zlogfs's block device front end: the regular files of a file system
//! served as NBD exports (the NetworkBlockDevice project's doc/proto.md),
//! so that any NBD client (qemu, nbdkit's and libnbd's tools, the kernel's
//! nbd driver) gets zlogfs's compression and checksums on a block device.
//!
//! The protocol is written here, not taken from a crate: the Rust NBD
//! crates found speak the old handshake or simple replies only, and what
//! zlogfs needs (fixed newstyle, structured replies, `base:allocation`,
//! concurrent requests over a file system's file) is this crate's few
//! hundred lines. [`proto`] holds the bytes, pure and fuzzable;
//! [`handshake`] the option haggling; [`transmission`] the requests.
//!
//! Semantics (docs/SEMANTICS.md): a write acknowledged with FUA, or
//! followed by an acknowledged FLUSH, survives a crash; a flush on any
//! connection covers every write answered before it on every connection
//! (it commits the whole file system), which is why CAN_MULTI_CONN is
//! advertised; after a crash a volume holds a prefix of what was
//! acknowledged, as every file does.

mod export;
mod handshake;
mod proto;
mod transmission;

use std::io::{self, Read, Write};
use std::sync::Arc;

use zlogfs_fs::Fs;

/// Serve one client on `r`/`w` (the two halves of one socket): the
/// handshake, then its requests until it disconnects.
pub fn serve_client<R: Read + Write, W: Write + Send>(
    r: R,
    w: W,
    fs: &Arc<Fs>,
    read_only: bool,
) -> io::Result<()> {
    serve_with(r, w, fs, read_only, transmission::default_workers())
}

/// [`serve_client`] with `workers` threads for the requests (0: on this
/// thread, one at a time, in order).
pub fn serve_with<R: Read + Write, W: Write + Send>(
    mut r: R,
    w: W,
    fs: &Arc<Fs>,
    read_only: bool,
    workers: usize,
) -> io::Result<()> {
    let Some(sess) = handshake::negotiate(&mut r, fs, read_only)? else {
        return Ok(());
    };
    tracing::debug!("nbd: serving {} ({} bytes)", sess.export.name, sess.export.size);
    transmission::serve(r, w, fs, &sess, workers)
}

/// A client conversation held in memory: what the client sends, and what
/// the server answered (both halves share it), with the protocol's
/// request encoding, for tests and the fuzz target (the `testing`
/// feature).
#[cfg(any(test, feature = "testing"))]
pub mod replay {
    pub use crate::proto::{cf, cmd, encode_request, Request, SIMPLE_REPLY_MAGIC};
    use std::io::{self, Read, Write};
    use std::sync::{Arc, Mutex};

    /// The client's bytes to read, and the server's answers.
    #[derive(Clone)]
    pub struct Duplex {
        input: Arc<Mutex<io::Cursor<Vec<u8>>>>,
        /// Everything the server wrote.
        pub output: Arc<Mutex<Vec<u8>>>,
    }

    impl Duplex {
        /// A conversation in which the client sends `input`.
        pub fn new(input: Vec<u8>) -> Duplex {
            Duplex { input: Arc::new(Mutex::new(io::Cursor::new(input))), output: Arc::default() }
        }
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.lock().unwrap_or_else(|p| p.into_inner()).read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The bytes of a client's handshake that picks `export` with GO
    /// (structured replies and `base:allocation` first when `structured`).
    pub fn handshake(export: &str, structured: bool) -> Vec<u8> {
        use crate::proto::*;
        let mut v = u32::from(hs::FIXED_NEWSTYLE | hs::NO_ZEROES).to_be_bytes().to_vec();
        let mut option = |o: u32, data: &[u8]| {
            v.extend_from_slice(&IHAVEOPT.to_be_bytes());
            v.extend_from_slice(&o.to_be_bytes());
            v.extend_from_slice(&(data.len() as u32).to_be_bytes());
            v.extend_from_slice(data);
        };
        if structured {
            option(opt::STRUCTURED_REPLY, &[]);
            let mut m = server_entry(export);
            m.extend_from_slice(&1u32.to_be_bytes());
            m.extend_from_slice(&server_entry(BASE_ALLOCATION));
            option(opt::SET_META_CONTEXT, &m);
        }
        let mut go = server_entry(export);
        go.extend_from_slice(&0u16.to_be_bytes());
        option(opt::GO, &go);
        v
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};
    use zlogfs_engine::store::Geometry;
    use zlogfs_fs::{Fs, SetAttr, ROOT};

    use super::proto::*;
    use super::replay::{handshake, Duplex};

    fn fs_with_volume() -> Arc<Fs> {
        let (_, fs) = zlogfs_fs::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 32 });
        let f = fs.create(ROOT, b"disk", 0o600, 0, 0).expect("create");
        fs.setattr(f.ino, &SetAttr { size: Some(1 << 20), ..SetAttr::default() }).expect("size");
        Arc::new(fs)
    }

    fn request(kind: u16, flags: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
        encode_request(&Request { flags, kind, cookie, offset, length }).to_vec()
    }

    /// Run a session; the server's bytes after the handshake's.
    fn session(fs: &Arc<Fs>, requests: &[u8], structured: bool) -> Vec<u8> {
        let mut input = handshake("disk", structured);
        let hello = handshake_reply_len(fs, structured);
        input.extend_from_slice(requests);
        let d = Duplex::new(input);
        let r = super::serve_client(d.clone(), d.clone(), fs, false);
        assert!(r.is_ok(), "{r:?}");
        let out = d.output.lock().expect("lock").clone();
        out[hello..].to_vec()
    }

    /// How many bytes the server's side of the handshake takes.
    fn handshake_reply_len(fs: &Arc<Fs>, structured: bool) -> usize {
        let d = Duplex::new(handshake("disk", structured));
        super::serve_client(d.clone(), d.clone(), fs, false).expect("handshake");
        let n = d.output.lock().expect("lock").len();
        n
    }

    #[test]
    fn a_session_reads_what_it_wrote_and_errors_keep_it_going() {
        let fs = fs_with_volume();
        let data = vec![0xabu8; 4096];
        let mut reqs = request(cmd::WRITE, cf::FUA, 1, 8192, 4096);
        reqs.extend_from_slice(&data);
        let out = session(&fs, &reqs, false);
        assert_eq!(out, simple_reply(1, 0));
        // Past the end, an unknown command, then a read: two errors, and
        // the read still answers.
        let mut reqs = request(cmd::READ, 0, 2, 1 << 20, 1);
        reqs.extend_from_slice(&request(99, 0, 3, 0, 0));
        reqs.extend_from_slice(&request(cmd::READ, 0, 4, 8192, 4096));
        let out = session(&fs, &reqs, false);
        // Workers answer in any order: find each reply by its cookie.
        let find = |cookie: u64| {
            out.windows(16)
                .position(|w| w[8..16] == cookie.to_be_bytes() && w[..4] == SIMPLE_REPLY_MAGIC.to_be_bytes())
        };
        let err_of = |at: usize| u32::from_be_bytes(out[at + 4..at + 8].try_into().expect("4 bytes"));
        assert_eq!(err_of(find(2).expect("reply 2")), err::EINVAL);
        assert_eq!(err_of(find(3).expect("reply 3")), err::EINVAL);
        let at = find(4).expect("reply 4");
        assert_eq!(err_of(at), 0);
        assert_eq!(&out[at + 16..at + 16 + 4096], &data[..]);
    }

    #[test]
    fn block_status_says_where_data_is() {
        let fs = fs_with_volume();
        let mut reqs = request(cmd::WRITE, 0, 1, 65536, 4096);
        reqs.extend_from_slice(&[7u8; 4096]);
        reqs.extend_from_slice(&request(cmd::FLUSH, 0, 2, 0, 0));
        session(&fs, &reqs, true);
        let out = session(&fs, &request(cmd::BLOCK_STATUS, 0, 3, 0, 1 << 20), true);
        assert_eq!(out[..4], STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(u16::from_be_bytes([out[6], out[7]]), chunk::BLOCK_STATUS);
        let payload = &out[20..];
        let ext: Vec<(u32, u32)> = payload[4..]
            .chunks(8)
            .map(|c| {
                (
                    u32::from_be_bytes(c[..4].try_into().expect("4")),
                    u32::from_be_bytes(c[4..].try_into().expect("4")),
                )
            })
            .collect();
        assert_eq!(ext.iter().map(|e| u64::from(e.0)).sum::<u64>(), 1 << 20, "{ext:?}");
        let hole = alloc::HOLE | alloc::ZERO;
        assert_eq!(ext.first().map(|e| e.1), Some(hole), "{ext:?}");
        assert!(ext.iter().any(|e| e.1 == 0), "the written chunk is data: {ext:?}");
    }

    /// Random requests and random bytes after a valid handshake: the
    /// server answers or hangs up, never panics. Seeded; replay with
    /// ZLOGFS_SEED.
    #[test]
    fn random_sessions_never_panic_the_server() {
        let seed = zlogfs_testkit::seed("nbd sessions");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let fs = fs_with_volume();
        for _ in 0..200 {
            let structured = rng.gen_bool(0.5);
            let mut input = if rng.gen_bool(0.9) { handshake("disk", structured) } else { Vec::new() };
            for _ in 0..rng.gen_range(0..8) {
                if rng.gen_bool(0.8) {
                    let kind = rng.gen_range(0..10);
                    let len = if rng.gen_bool(0.8) { rng.gen_range(0..8192) } else { rng.gen() };
                    let off = if rng.gen_bool(0.8) { rng.gen_range(0..2 << 20) } else { rng.gen() };
                    input.extend_from_slice(&request(kind, rng.gen_range(0..64), rng.gen(), off, len));
                    if kind == cmd::WRITE && len < 16384 {
                        input.extend((0..len).map(|_| rng.gen::<u8>()));
                    }
                } else {
                    input.extend((0..rng.gen_range(0..40)).map(|_| rng.gen::<u8>()));
                }
            }
            let d = Duplex::new(input);
            let workers = if rng.gen_bool(0.5) { 0 } else { 2 };
            let _ = super::serve_with(d.clone(), d, &fs, rng.gen_bool(0.2), workers);
        }
    }
}
