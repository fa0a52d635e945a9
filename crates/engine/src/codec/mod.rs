//! Compression codecs behind one small trait.
//!
//! Every compressed block on disk is tagged with the [`CodecId`] that wrote
//! it (and the codec's level, for information only: decoding never needs
//! it), plus a [`raw_reason`] bit set when the block was stored raw. The
//! write path calls [`encode`], which applies the storage policy (raw when
//! the codec is `none`, when a cheap probe says the data is incompressible,
//! or when compression saves less than 1/8); the read path calls [`decode`]
//! with the codec byte read from disk.
//!
//! Codecs:
//! - `none`: a copy.
//! - `lz4`: LZ4 block format (`lz4_flex`), no size prefix (the raw length is
//!   recorded by the caller).
//! - `zstd`: Zstandard frames, levels 1..=19.
//! - `deflate`: raw deflate (RFC 1951, no zlib/gzip wrapper), levels 0..=9.
//! - `pred1`, `pred2`: the two predictor codecs of Burrows, Jerian, Lampson
//!   and Mann, "On-line Data Compression in a Log-structured File System"
//!   (1992); see [`pred`] for the exact formats.
//!
//! All decoders are bounded by the caller's `raw_len`: they never allocate
//! more than that (plus a small constant), never panic, and return a
//! [`DecodeError`] for any payload that does not expand to exactly `raw_len`
//! bytes.

use std::fmt;
use std::str::FromStr;

mod deflate;
mod lz4;
mod none;
pub mod pred;
mod zstd;

#[cfg(test)]
mod tests;

/// The algorithm that wrote a block. The discriminant is the on-disk byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CodecId {
    /// Stored raw.
    None = 0,
    /// LZ4 block format.
    Lz4 = 1,
    /// Zstandard frame.
    Zstd = 2,
    /// Raw deflate.
    Deflate = 3,
    /// Burrows et al. 1992, algorithm 1 (one prediction table).
    Pred1 = 4,
    /// Burrows et al. 1992, algorithm 2 (two prediction tables, static Huffman).
    Pred2 = 5,
}

impl CodecId {
    /// Every codec, in on-disk byte order.
    pub const ALL: [CodecId; 6] =
        [CodecId::None, CodecId::Lz4, CodecId::Zstd, CodecId::Deflate, CodecId::Pred1, CodecId::Pred2];

    /// The codec with on-disk byte `v`, if any.
    pub fn from_u8(v: u8) -> Option<CodecId> {
        CodecId::ALL.get(usize::from(v)).copied()
    }

    /// The codec's name as used in specs and reports.
    pub fn name(self) -> &'static str {
        match self {
            CodecId::None => "none",
            CodecId::Lz4 => "lz4",
            CodecId::Zstd => "zstd",
            CodecId::Deflate => "deflate",
            CodecId::Pred1 => "pred1",
            CodecId::Pred2 => "pred2",
        }
    }

    /// The codec called `name` (case-insensitive), if any.
    pub fn from_name(name: &str) -> Option<CodecId> {
        CodecId::ALL.iter().copied().find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// True if the codec takes a level (zstd, deflate).
    pub fn has_level(self) -> bool {
        matches!(self, CodecId::Zstd | CodecId::Deflate)
    }

    /// The valid levels of the codec (`0..=0` for codecs without levels).
    pub fn level_range(self) -> std::ops::RangeInclusive<u8> {
        match self {
            CodecId::Zstd => 1..=19,
            CodecId::Deflate => 0..=9,
            _ => 0..=0,
        }
    }
}

impl fmt::Display for CodecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A codec and level, e.g. parsed from "zstd:3", "lz4", "none",
/// "deflate:6", "pred1", "pred2".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodecSpec {
    /// The algorithm.
    pub id: CodecId,
    /// Its level (0 for codecs without levels).
    pub level: u8,
}

const VALID_SPECS: &str = "none, lz4, zstd, zstd:1..zstd:19, deflate, deflate:0..deflate:9, pred1, pred2";

impl CodecSpec {
    /// A spec with exactly this id and level (not checked; see
    /// [`CodecSpec::normalized`]).
    pub const fn new(id: CodecId, level: u8) -> Self {
        CodecSpec { id, level }
    }

    /// The level used when a spec names no level: zstd 1 (so that "zstd"
    /// is the default spec), deflate 6, others 0.
    pub fn default_level(id: CodecId) -> u8 {
        match id {
            CodecId::Zstd => 1,
            CodecId::Deflate => 6,
            _ => 0,
        }
    }

    /// The spec with its level clamped into the codec's valid range (0 for
    /// codecs without levels).
    pub fn normalized(self) -> Self {
        let r = self.id.level_range();
        CodecSpec::new(self.id, self.level.clamp(*r.start(), *r.end()))
    }
}

impl Default for CodecSpec {
    fn default() -> Self {
        CodecSpec::new(CodecId::Zstd, 1)
    }
}

impl FromStr for CodecSpec {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| {
            crate::Error::Invalid(format!("bad codec {s:?}: {why}; valid forms: {VALID_SPECS}"))
        };
        let t = s.trim();
        let (name, level) = match t.split_once(':') {
            Some((n, l)) => (n.trim(), Some(l.trim())),
            None => (t, None),
        };
        let id = CodecId::from_name(name).ok_or_else(|| bad(format!("unknown codec {name:?}")))?;
        let level = match level {
            None => CodecSpec::default_level(id),
            Some(l) => {
                let v: u8 = l.parse().map_err(|_| bad(format!("bad level {l:?}")))?;
                if !id.has_level() {
                    0
                } else if id.level_range().contains(&v) {
                    v
                } else {
                    let r = id.level_range();
                    return Err(bad(format!("{} level must be {}..={}", id.name(), r.start(), r.end())));
                }
            }
        };
        Ok(CodecSpec::new(id, level))
    }
}

impl fmt::Display for CodecSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.id.has_level() {
            write!(f, "{}:{}", self.id.name(), self.level)
        } else {
            f.write_str(self.id.name())
        }
    }
}

/// An error decoding a payload; Display says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl DecodeError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        DecodeError(msg.into())
    }

    /// "`codec` payload does not expand to `raw_len` bytes (detail)".
    pub(crate) fn size(codec: CodecId, raw_len: usize, detail: impl fmt::Display) -> Self {
        DecodeError(format!("{} payload does not expand to {raw_len} bytes ({detail})", codec.name()))
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

impl From<DecodeError> for crate::Error {
    fn from(e: DecodeError) -> Self {
        crate::Error::corrupt("compressed block", e.0)
    }
}

/// One compression algorithm. Stateless; shared between threads.
pub trait Codec: Send + Sync {
    /// Which codec this is.
    fn id(&self) -> CodecId;
    /// Append the compressed form of `src` to `dst`. `level` is clamped into
    /// the codec's range; codecs without levels ignore it.
    fn compress(&self, level: u8, src: &[u8], dst: &mut Vec<u8>);
    /// Decompress `src`, which must expand to exactly `raw_len` bytes,
    /// appending to `dst`. Never panics and never allocates more than
    /// `raw_len` (+ small constant) on any input. On error `dst` may hold
    /// partial output beyond its original length.
    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError>;
}

static NONE: none::NoneCodec = none::NoneCodec;
static LZ4: lz4::Lz4Codec = lz4::Lz4Codec;
static ZSTD: zstd::ZstdCodec = zstd::ZstdCodec;
static DEFLATE: deflate::DeflateCodec = deflate::DeflateCodec;
static PRED1: pred::Pred1Codec = pred::Pred1Codec;
static PRED2: pred::Pred2Codec = pred::Pred2Codec;

/// The implementation of codec `id`.
pub fn codec(id: CodecId) -> &'static dyn Codec {
    match id {
        CodecId::None => &NONE,
        CodecId::Lz4 => &LZ4,
        CodecId::Zstd => &ZSTD,
        CodecId::Deflate => &DEFLATE,
        CodecId::Pred1 => &PRED1,
        CodecId::Pred2 => &PRED2,
    }
}

/// Why a block was stored raw (bit flags recorded on disk in each block
/// header; 0 when the block is compressed).
pub mod raw_reason {
    /// Codec `none` was asked for.
    pub const POLICY: u8 = 1;
    /// The early incompressibility test ([`super::looks_incompressible`]) said so.
    pub const PROBE: u8 = 2;
    /// Compression saved less than 1/8.
    pub const NO_GAIN: u8 = 4;
}

/// The result of [`encode`]: what to store and how it was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// The codec of `data` ([`CodecId::None`] when stored raw).
    pub codec: CodecId,
    /// The level used (0 when stored raw or the codec has none).
    pub level: u8,
    /// [`raw_reason`] flags; 0 when compressed.
    pub raw_reason: u8,
    /// The payload to store.
    pub data: Vec<u8>,
}

impl Encoded {
    fn raw(raw: &[u8], reason: u8) -> Self {
        Encoded { codec: CodecId::None, level: 0, raw_reason: reason, data: raw.to_vec() }
    }
}

/// Compress `raw` with `spec`, applying the policy: codec none -> raw
/// (POLICY); if [`looks_incompressible`] -> raw (PROBE); compress, and if
/// the compressed form is larger than `raw.len() - raw.len()/8` -> raw
/// (NO_GAIN). When stored raw, codec = None and level = 0. The level is
/// clamped into the codec's range ([`CodecSpec::normalized`]).
pub fn encode(spec: CodecSpec, raw: &[u8]) -> Encoded {
    let spec = spec.normalized();
    if spec.id == CodecId::None {
        return Encoded::raw(raw, raw_reason::POLICY);
    }
    let start = std::time::Instant::now();
    let enc = compress(spec, raw);
    crate::metrics::global().split.compress.since(start, raw.len() as u64);
    enc
}

/// [`encode`] for a codec other than none: probe, compress, keep if worth it.
fn compress(spec: CodecSpec, raw: &[u8]) -> Encoded {
    if looks_incompressible(raw) {
        return Encoded::raw(raw, raw_reason::PROBE);
    }
    let mut data = Vec::new();
    codec(spec.id).compress(spec.level, raw, &mut data);
    if data.len() > raw.len() - raw.len() / 8 {
        return Encoded::raw(raw, raw_reason::NO_GAIN);
    }
    Encoded { codec: spec.id, level: spec.level, raw_reason: 0, data }
}

/// Decode a stored payload written by `codec` (a raw byte from disk:
/// unknown values are an error) into exactly `raw_len` bytes.
pub fn decode(codec: u8, stored: &[u8], raw_len: usize) -> Result<Vec<u8>, DecodeError> {
    let id = CodecId::from_u8(codec).ok_or_else(|| DecodeError(format!("unknown codec {codec}")))?;
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    self::codec(id).decompress(stored, raw_len, &mut out)?;
    if id != CodecId::None {
        crate::metrics::global().split.decompress.since(start, raw_len as u64);
    }
    if out.len() != raw_len {
        return Err(DecodeError::size(id, raw_len, format_args!("got {}", out.len())));
    }
    Ok(out)
}

/// Inputs shorter than this are never judged incompressible: compressing
/// them is cheap, and the sample would be too small to judge.
const PROBE_MIN_LEN: usize = 1024;
/// Bytes sampled by the probe, in `PROBE_CHUNKS` chunks spread evenly.
const PROBE_SAMPLE: usize = 4096;
const PROBE_CHUNKS: usize = 8;
/// Bias-corrected order-0 entropy (bits per byte) above which a sample is
/// judged incompressible. Text is about 4.5-5.5, machine code 5.5-6.8,
/// compressed or encrypted data 7.9-8.0.
const PROBE_ENTROPY_BITS: f64 = 7.5;

/// A cheap early test that says data is evidently incompressible (already
/// compressed media, random data). False for text, source code, binaries,
/// zeros and anything under 1 KiB.
///
/// It samples up to 4 KiB (eight chunks spread over the input, or 1/16 of
/// the input when that is smaller, but at least 1 KiB) and estimates the
/// order-0 byte entropy with the Miller-Madow bias correction; above 7.5
/// bits per byte the data is judged incompressible. Cost: a pass over the
/// sample and 256 logarithms, about 2% of zstd-1 on a 64 KiB block.
/// Data that is compressible only through long repeats of high-entropy
/// content is misjudged; that is the price of the probe being cheap.
pub fn looks_incompressible(data: &[u8]) -> bool {
    let n = data.len();
    if n < PROBE_MIN_LEN {
        return false;
    }
    let sample = (n / 16).clamp(PROBE_MIN_LEN, PROBE_SAMPLE).min(n);
    let chunk = sample / PROBE_CHUNKS;
    let mut counts = [0u32; 256];
    let stride = (n - chunk) / (PROBE_CHUNKS - 1);
    for i in 0..PROBE_CHUNKS {
        let start = i * stride;
        for &b in &data[start..start + chunk] {
            counts[usize::from(b)] += 1;
        }
    }
    let total = (chunk * PROBE_CHUNKS) as f64;
    let mut h = 0.0f64;
    let mut bins = 0u32;
    for &c in counts.iter() {
        if c != 0 {
            bins += 1;
            let p = f64::from(c) / total;
            h -= p * p.log2();
        }
    }
    // Miller-Madow correction: the plug-in estimate is biased low by about
    // (K - 1) / (2 n ln 2) bits.
    h += f64::from(bins.saturating_sub(1)) / (2.0 * total * std::f64::consts::LN_2);
    h > PROBE_ENTROPY_BITS
}
