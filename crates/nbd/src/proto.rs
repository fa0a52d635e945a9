//! The NBD protocol's bytes (the NetworkBlockDevice project's
//! doc/proto.md): constants, and pure decoders and encoders. Nothing here
//! does I/O, so every decoder can be fed any bytes (the fuzz target and
//! the seeded random test do) and must answer with an error, never a
//! panic.

/// "NBDMAGIC", the server's first word.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the head of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The head of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The head of every request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The head of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// The head of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod hs {
    pub const FIXED_NEWSTYLE: u16 = 1;
    pub const NO_ZEROES: u16 = 2;
}

/// Options.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    #[allow(dead_code, reason = "the specification's table, kept whole")]
    pub const ERR_TLS_REQD: u32 = (1 << 31) + 5;
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// Information types of INFO and GO.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    #[allow(dead_code, reason = "the specification's table, kept whole")]
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod tf {
    pub const HAS_FLAGS: u16 = 1;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Commands.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod cf {
    pub const FUA: u16 = 1;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
    /// Every flag this server knows.
    pub const KNOWN: u16 = FUA | NO_HOLE | DF | REQ_ONE | FAST_ZERO;
}

/// Error values of replies.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod err {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    #[allow(dead_code, reason = "the specification's table, kept whole")]
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    #[allow(dead_code, reason = "the specification's table, kept whole")]
    pub const ESHUTDOWN: u32 = 108;
}

/// Structured reply chunk types and flags.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod chunk {
    pub const FLAG_DONE: u16 = 1;
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const BLOCK_STATUS: u16 = 5;
    pub const ERROR: u16 = (1 << 15) + 1;
}

/// `base:allocation` status flags.
#[allow(missing_docs, reason = "the names are the specification's (doc/proto.md)")]
pub mod alloc {
    pub const HOLE: u32 = 1;
    pub const ZERO: u32 = 2;
}

/// The one metadata context served, and its id.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id of `base:allocation` in replies.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Bytes of a request header.
pub const REQUEST_SIZE: usize = 28;
/// Bytes of an option header after its magic.
pub const OPTION_HEADER: usize = 16;

/// What is wrong with some bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtoError {}

/// A reader of big-endian fields that fails instead of running off the end.
struct Cursor<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.b.len() < n {
            return Err(ProtoError(format!("{} ends early", self.what)));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().map_err(|_| self.short())?))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().map_err(|_| self.short())?))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().map_err(|_| self.short())?))
    }
    /// A string of `n` bytes (UTF-8, as the protocol says names are).
    fn string(&mut self, n: usize) -> Result<String, ProtoError> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError(format!("{}: a name is not UTF-8", self.what)))
    }
    fn short(&self) -> ProtoError {
        ProtoError(format!("{} ends early", self.what))
    }
    fn finish(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(ProtoError(format!("{} has {} bytes too many", self.what, self.b.len())))
        }
    }
}

/// A request's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags ([`cf`]).
    pub flags: u16,
    /// The command ([`cmd`]).
    pub kind: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Bytes concerned (of the payload, for a write).
    pub length: u32,
}

/// Decode a request header.
pub fn parse_request(b: &[u8]) -> Result<Request, ProtoError> {
    let mut c = Cursor { b, what: "a request" };
    let magic = c.u32()?;
    if magic != REQUEST_MAGIC {
        return Err(ProtoError(format!("bad request magic {magic:#010x}")));
    }
    let r = Request { flags: c.u16()?, kind: c.u16()?, cookie: c.u64()?, offset: c.u64()?, length: c.u32()? };
    c.finish()?;
    Ok(r)
}

/// Encode a request header (for tests and the fuzz target).
#[cfg(any(test, feature = "testing"))]
pub fn encode_request(r: &Request) -> [u8; REQUEST_SIZE] {
    let mut b = [0u8; REQUEST_SIZE];
    b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.length.to_be_bytes());
    b
}

/// An option's header: (option, length of its data), after the magic,
/// which is checked.
pub fn parse_option_header(b: &[u8]) -> Result<(u32, u32), ProtoError> {
    let mut c = Cursor { b, what: "an option header" };
    let magic = c.u64()?;
    if magic != IHAVEOPT {
        return Err(ProtoError(format!("bad option magic {magic:#018x}")));
    }
    let r = (c.u32()?, c.u32()?);
    c.finish()?;
    Ok(r)
}

/// The data of INFO and GO: the export's name and the information asked
/// for.
pub fn parse_info_request(b: &[u8]) -> Result<(String, Vec<u16>), ProtoError> {
    let mut c = Cursor { b, what: "an INFO or GO option" };
    let n = c.u32()? as usize;
    let name = c.string(n)?;
    let count = c.u16()?;
    let infos = (0..count).map(|_| c.u16()).collect::<Result<Vec<_>, _>>()?;
    c.finish()?;
    Ok((name, infos))
}

/// The data of LIST_META_CONTEXT and SET_META_CONTEXT: the export's name
/// and the queries.
pub fn parse_meta_context(b: &[u8]) -> Result<(String, Vec<String>), ProtoError> {
    let mut c = Cursor { b, what: "a META_CONTEXT option" };
    let n = c.u32()? as usize;
    let name = c.string(n)?;
    let count = c.u32()?;
    let mut queries = Vec::new();
    for _ in 0..count {
        let n = c.u32()? as usize;
        queries.push(c.string(n)?);
    }
    c.finish()?;
    Ok((name, queries))
}

/// An option reply.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// NBD_INFO_EXPORT's data.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = info::EXPORT.to_be_bytes().to_vec();
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

/// NBD_INFO_BLOCK_SIZE's data.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = info::BLOCK_SIZE.to_be_bytes().to_vec();
    for x in [min, preferred, max] {
        v.extend_from_slice(&x.to_be_bytes());
    }
    v
}

/// A name-carrying reply's data (SERVER, INFO NAME): a length and the
/// name for SERVER, the name alone after the type for INFO.
pub fn server_entry(name: &str) -> Vec<u8> {
    let mut v = (name.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v
}

/// A META_CONTEXT reply's data.
pub fn meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut v = id.to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v
}

/// A simple reply's header.
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk's header.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..].copy_from_slice(&length.to_be_bytes());
    b
}

/// An error chunk's payload: the error and a message.
pub fn error_payload(error: u32, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(4096)];
    let mut v = error.to_be_bytes().to_vec();
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request { flags: cf::FUA, kind: cmd::WRITE, cookie: 7, offset: 1 << 40, length: 4096 };
        assert_eq!(parse_request(&encode_request(&r)), Ok(r));
        let mut bad = encode_request(&r);
        bad[0] ^= 1;
        assert!(parse_request(&bad).unwrap_err().0.contains("magic"));
        assert!(parse_request(&bad[..10]).is_err());
    }

    #[test]
    fn options_decode_or_say_why() {
        let mut go = server_entry("vm/disk.raw");
        go.extend_from_slice(&2u16.to_be_bytes());
        go.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
        go.extend_from_slice(&info::NAME.to_be_bytes());
        assert_eq!(parse_info_request(&go), Ok(("vm/disk.raw".into(), vec![info::BLOCK_SIZE, info::NAME])));
        assert!(parse_info_request(&go[..go.len() - 1]).is_err());
        let mut meta = server_entry("");
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&server_entry(BASE_ALLOCATION));
        assert_eq!(parse_meta_context(&meta), Ok((String::new(), vec![BASE_ALLOCATION.into()])));
        let mut huge = u32::MAX.to_be_bytes().to_vec();
        huge.extend_from_slice(b"abc");
        assert!(parse_meta_context(&huge).is_err(), "a length past the data");
    }

    /// Any bytes: an answer, never a panic. Seeded; replay with
    /// ZLOGFS_SEED.
    #[test]
    fn random_bytes_never_panic_the_decoders() {
        let seed = zlogfs_testkit::seed("proto decoders");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..20_000 {
            let n = rng.gen_range(0..64);
            let mut b: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            if rng.gen_bool(0.5) && b.len() >= 4 {
                b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            }
            let _ = parse_request(&b);
            let _ = parse_option_header(&b);
            let _ = parse_info_request(&b);
            let _ = parse_meta_context(&b);
        }
    }
}
