//! The fixed newstyle handshake: options until the client picks an
//! export (GO or EXPORT_NAME) or leaves (ABORT, or hangs up).

use std::io::{self, Read, Write};

use zlogfs_fs::Fs;

use crate::export::{self, Export};
use crate::proto::*;

/// The longest option data taken (a name is at most 4 KiB; a few of them).
const MAX_OPTION: u32 = 64 << 10;
/// The largest request payload, and what INFO says is the most a request
/// may carry.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// The most exports OPT_LIST names.
const MAX_LIST: usize = 100_000;

/// What the client settled on.
pub struct Session {
    /// The export chosen.
    pub export: Export,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected.
    pub allocation: bool,
    /// The export's transmission flags.
    pub flags: u16,
}

/// Negotiation state.
#[derive(Default)]
struct State {
    structured: bool,
    allocation: bool,
    no_zeroes: bool,
}

fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    match r.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// The transmission flags of an export.
pub fn flags(read_only: bool) -> u16 {
    let mut f = tf::HAS_FLAGS | tf::SEND_FLUSH | tf::SEND_FUA | tf::SEND_DF | tf::SEND_CACHE;
    // A flush on one connection commits the whole file system: every
    // write any connection had answered is covered.
    f |= tf::CAN_MULTI_CONN;
    if read_only {
        f |= tf::READ_ONLY;
    } else {
        f |= tf::SEND_TRIM | tf::SEND_WRITE_ZEROES | tf::SEND_FAST_ZERO;
    }
    f
}

/// Run the handshake on `s`; None when the client left without choosing.
pub fn negotiate<S: Read + Write>(s: &mut S, fs: &Fs, read_only: bool) -> io::Result<Option<Session>> {
    let mut hello = NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(hs::FIXED_NEWSTYLE | hs::NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let mut cf = [0u8; 4];
    if !read_exact_or_eof(s, &mut cf)? {
        return Ok(None);
    }
    let client = u32::from_be_bytes(cf);
    if client & u32::from(hs::FIXED_NEWSTYLE) == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the client does not speak fixed newstyle"));
    }
    let mut st = State { no_zeroes: client & u32::from(hs::NO_ZEROES) != 0, ..State::default() };
    loop {
        let mut h = [0u8; OPTION_HEADER];
        if !read_exact_or_eof(s, &mut h)? {
            return Ok(None);
        }
        let (option, len) =
            parse_option_header(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if len > MAX_OPTION {
            // Skip what it sent, and say no.
            io::copy(&mut Read::by_ref(s).take(u64::from(len)), &mut io::sink())?;
            s.write_all(&option_reply(option, rep::ERR_TOO_BIG, b"option data too large"))?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        if !read_exact_or_eof(s, &mut data)? {
            return Ok(None);
        }
        match one_option(s, fs, read_only, &mut st, option, &data)? {
            Step::More => {}
            Step::Abort => return Ok(None),
            Step::Go(x) => {
                let flags = flags(read_only);
                if option == opt::EXPORT_NAME {
                    let mut v = x.size.to_be_bytes().to_vec();
                    v.extend_from_slice(&flags.to_be_bytes());
                    if !st.no_zeroes {
                        v.extend_from_slice(&[0u8; 124]);
                    }
                    s.write_all(&v)?;
                }
                return Ok(Some(Session {
                    export: x,
                    structured: st.structured,
                    allocation: st.allocation,
                    flags,
                }));
            }
        }
    }
}

enum Step {
    More,
    Abort,
    Go(Export),
}

/// Answer one option.
fn one_option<S: Write>(
    s: &mut S,
    fs: &Fs,
    ro: bool,
    st: &mut State,
    option: u32,
    data: &[u8],
) -> io::Result<Step> {
    let reply = |s: &mut S, kind: u32, d: &[u8]| s.write_all(&option_reply(option, kind, d));
    match option {
        opt::ABORT => {
            reply(s, rep::ACK, &[])?;
            Ok(Step::Abort)
        }
        opt::EXPORT_NAME => {
            let name = String::from_utf8_lossy(data);
            match export::find(fs, &name) {
                Some(x) => Ok(Step::Go(x)),
                // The protocol has no way to say no here but to hang up.
                None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no export {name:?}"))),
            }
        }
        opt::LIST => {
            if !data.is_empty() {
                reply(s, rep::ERR_INVALID, b"LIST takes no data")?;
                return Ok(Step::More);
            }
            for name in export::list(fs, MAX_LIST) {
                reply(s, rep::SERVER, &server_entry(&name))?;
            }
            reply(s, rep::ACK, &[])?;
            Ok(Step::More)
        }
        opt::STRUCTURED_REPLY => {
            let kind = if data.is_empty() { rep::ACK } else { rep::ERR_INVALID };
            st.structured |= data.is_empty();
            reply(s, kind, &[])?;
            Ok(Step::More)
        }
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => meta(s, fs, st, option, data),
        opt::INFO | opt::GO => info(s, fs, ro, option, data),
        opt::STARTTLS => {
            reply(s, rep::ERR_POLICY, b"TLS is not offered: use a Unix socket, or a TLS proxy")?;
            Ok(Step::More)
        }
        _ => {
            reply(s, rep::ERR_UNSUP, format!("option {option} is not supported").as_bytes())?;
            Ok(Step::More)
        }
    }
}

/// INFO or GO: the export's size, flags, name and block sizes.
fn info<S: Write>(s: &mut S, fs: &Fs, ro: bool, option: u32, data: &[u8]) -> io::Result<Step> {
    let (name, asked) = match parse_info_request(data) {
        Ok(x) => x,
        Err(e) => {
            s.write_all(&option_reply(option, rep::ERR_INVALID, e.0.as_bytes()))?;
            return Ok(Step::More);
        }
    };
    let Some(x) = export::find(fs, &name) else {
        let msg = format!("no export {name:?} (a regular file of the image, by its path)");
        s.write_all(&option_reply(option, rep::ERR_UNKNOWN, msg.as_bytes()))?;
        return Ok(Step::More);
    };
    s.write_all(&option_reply(option, rep::INFO, &info_export(x.size, flags(ro))))?;
    if asked.contains(&info::NAME) {
        let mut d = info::NAME.to_be_bytes().to_vec();
        d.extend_from_slice(x.name.as_bytes());
        s.write_all(&option_reply(option, rep::INFO, &d))?;
    }
    // Always: any alignment works, 4 KiB is best, a request carries up to
    // MAX_PAYLOAD.
    s.write_all(&option_reply(option, rep::INFO, &info_block_size(1, 4096, MAX_PAYLOAD)))?;
    s.write_all(&option_reply(option, rep::ACK, &[]))?;
    Ok(if option == opt::GO { Step::Go(x) } else { Step::More })
}

/// LIST_META_CONTEXT or SET_META_CONTEXT: `base:allocation` is the one
/// context.
fn meta<S: Write>(s: &mut S, fs: &Fs, st: &mut State, option: u32, data: &[u8]) -> io::Result<Step> {
    let reply = |s: &mut S, kind: u32, d: &[u8]| s.write_all(&option_reply(option, kind, d));
    if option == opt::SET_META_CONTEXT && !st.structured {
        reply(s, rep::ERR_INVALID, b"SET_META_CONTEXT needs structured replies first")?;
        return Ok(Step::More);
    }
    let (name, queries) = match parse_meta_context(data) {
        Ok(x) => x,
        Err(e) => {
            reply(s, rep::ERR_INVALID, e.0.as_bytes())?;
            return Ok(Step::More);
        }
    };
    if export::find(fs, &name).is_none() {
        reply(s, rep::ERR_UNKNOWN, format!("no export {name:?}").as_bytes())?;
        return Ok(Step::More);
    }
    let list = option == opt::LIST_META_CONTEXT;
    let wants = (list && queries.is_empty())
        || queries.iter().any(|q| q == BASE_ALLOCATION || (list && (q == "base:" || q.is_empty())));
    if option == opt::SET_META_CONTEXT {
        st.allocation = wants;
    }
    if wants {
        reply(s, rep::META_CONTEXT, &meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION))?;
    }
    reply(s, rep::ACK, &[])?;
    Ok(Step::More)
}
