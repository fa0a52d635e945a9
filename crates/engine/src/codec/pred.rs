//! The two predictor codecs of Burrows, Jerian, Lampson and Mann, "On-line
//! Data Compression in a Log-structured File System" (ASPLOS 1992), Table 2.
//! They reproduce the paper's ideas, not its bit-exact formats, which are
//! fixed here. Both ignore the level.
//!
//! # Context hash (both algorithms)
//!
//! For each byte, `h = ((256*c3) XOR (16*c2) XOR c1) mod 4096`, where `c1`
//! is the previous byte, `c2` the one before and `c3` the one before that;
//! bytes before the start of the block count as 0. All tables hold 4096
//! bytes and are zeroed at the start of every block, so blocks decode
//! independently.
//!
//! # Algorithm 1 (`pred1`)
//!
//! One table of predicted bytes. If `table[h]` equals the byte, emit a `0`
//! bit (hit); otherwise emit a `1` bit followed by the 8-bit literal (miss)
//! and set `table[h]` to the byte. Bits are packed MSB-first; the last byte
//! is padded with one bits. A payload is valid only if it is exactly
//! `ceil(bits / 8)` bytes long and its padding bits are all ones. (Padding
//! with ones, which cannot form a complete token in under 8 bits, makes a
//! payload decode only at its own length: with zero padding a block of
//! `n` bytes would also decode as `n + 1` bytes ending in a hit.)
//!
//! # Algorithm 2 (`pred2`)
//!
//! Two tables: `t1[h]` is the current guess and `t2[h]` the guess it
//! displaced (the alternative). Each byte becomes one token:
//!
//! - `HIT1` if the byte equals `t1[h]` (tables unchanged);
//! - `HIT2` if not, but it equals `t2[h]`;
//! - otherwise the literal byte itself (a miss).
//!
//! After a `HIT2` or a miss, `t2[h] = t1[h]; t1[h] = byte` (for `HIT2` this
//! swaps the two guesses, i.e. move-to-front).
//!
//! Tokens form a 258-symbol alphabet (literals 0..=255, `HIT1` = 256,
//! `HIT2` = 257) coded with a static canonical Huffman code whose code
//! lengths are fixed here (never sent), chosen from typical frequencies
//! (first-table hits are about half of all bytes on text and code,
//! second-table hits about a tenth, misses are dominated by lower-case
//! letters, spaces and newlines):
//!
//! | symbols                                              | length |
//! |------------------------------------------------------|--------|
//! | `HIT1`                                               | 1      |
//! | `HIT2`                                               | 3      |
//! | 32 literals: `a`-`z`, space, `\n`, NUL, `.`, `,`, `_`| 8      |
//! | 32 literals: `A`-`Z`, `0`, `1`, `(`, `)`, `\t`, `*`  | 9      |
//! | the other 192 literals                               | 10     |
//!
//! The code is complete (the Kraft sum is exactly 1), so every bit string
//! decodes. Codes are assigned canonically: in order of (length, symbol),
//! each code is the previous one plus one, shifted left when the length
//! grows (so `HIT1` = `0`, `HIT2` = `100`, the last literal = `1111111111`).
//! Bits are packed MSB-first, the last byte padded with one bits; as for
//! `pred1`, a valid payload is exactly `ceil(bits / 8)` bytes with all-ones
//! padding (which no code shorter than 8 bits matches).
//!
//! Decoders stop after exactly `raw_len` bytes, check that the payload has
//! at least one bit per output byte before allocating (so the work is
//! bounded by the payload size), read zero bits past the end of the
//! payload, and fail (never loop or panic) at the end if they read past
//! the end or bits other than the padding remain.

use std::sync::OnceLock;

use super::{Codec, CodecId, DecodeError};

const TABLE: usize = 4096;

#[inline]
fn hash(c1: u8, c2: u8, c3: u8) -> usize {
    ((usize::from(c3) << 8) ^ (usize::from(c2) << 4) ^ usize::from(c1)) & (TABLE - 1)
}

/// MSB-first bit writer appending to a Vec.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    nbits: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, nbits: 0 }
    }

    /// Write the low `len` (<= 32) bits of `code`.
    #[inline]
    fn put(&mut self, code: u32, len: u32) {
        self.acc = (self.acc << len) | u64::from(code);
        self.nbits += len;
        if self.nbits >= 32 {
            self.nbits -= 32;
            let word = (self.acc >> self.nbits) as u32;
            self.out.extend_from_slice(&word.to_be_bytes());
        }
    }

    fn finish(mut self) {
        while self.nbits >= 8 {
            self.nbits -= 8;
            self.out.push((self.acc >> self.nbits) as u8);
        }
        if self.nbits > 0 {
            let pad = 8 - self.nbits;
            self.out.push(((self.acc << pad) | ((1 << pad) - 1)) as u8);
        }
    }
}

/// MSB-first bit reader over a slice. Reading past the end yields zero
/// bits; `consumed` tells how many bits were taken.
struct BitReader<'a> {
    src: &'a [u8],
    pos: usize,
    /// Bits, MSB-aligned.
    acc: u64,
    /// Valid bits in `acc`.
    nbits: u32,
    /// Bits consumed so far.
    consumed: u64,
}

impl<'a> BitReader<'a> {
    fn new(src: &'a [u8]) -> Self {
        BitReader { src, pos: 0, acc: 0, nbits: 0, consumed: 0 }
    }

    /// The next `n` (1..=32) bits, zero-filled past the end.
    #[inline]
    fn peek(&mut self, n: u32) -> u32 {
        if self.nbits < n {
            while self.nbits <= 56 {
                match self.src.get(self.pos) {
                    Some(&b) => {
                        self.acc |= u64::from(b) << (56 - self.nbits);
                        self.nbits += 8;
                        self.pos += 1;
                    }
                    None => break,
                }
            }
        }
        (self.acc >> (64 - n)) as u32
    }

    #[inline]
    fn skip(&mut self, n: u32) {
        self.acc = if n >= 64 { 0 } else { self.acc << n };
        self.nbits = self.nbits.saturating_sub(n);
        self.consumed += u64::from(n);
    }

    fn total_bits(&self) -> u64 {
        self.src.len() as u64 * 8
    }

    /// Check that the stream ended exactly: no bits were read past the end,
    /// at most 7 padding bits remain, and they are all ones.
    fn finish(mut self, id: CodecId, raw_len: usize) -> Result<(), DecodeError> {
        let total = self.total_bits();
        if self.consumed > total {
            return Err(DecodeError::size(id, raw_len, "payload is truncated"));
        }
        let left = total - self.consumed;
        if left >= 8 {
            return Err(DecodeError::size(id, raw_len, format_args!("{} trailing bytes", left / 8)));
        }
        if left > 0 && self.peek(left as u32) != (1 << left) - 1 {
            return Err(DecodeError::size(id, raw_len, "bad padding bits"));
        }
        Ok(())
    }
}

/// Reject payloads too short to hold `raw_len` bytes at the best possible
/// rate (1 bit per byte for both algorithms) before allocating.
fn check_min_len(id: CodecId, src: &[u8], raw_len: usize) -> Result<(), DecodeError> {
    if (src.len() as u64) * 8 < raw_len as u64 {
        return Err(DecodeError::size(
            id,
            raw_len,
            format_args!("payload of {} bytes is too short", src.len()),
        ));
    }
    Ok(())
}

/// Algorithm 1: one prediction table, 1-bit hits and 9-bit misses.
pub struct Pred1Codec;

impl Codec for Pred1Codec {
    fn id(&self) -> CodecId {
        CodecId::Pred1
    }

    fn compress(&self, _level: u8, src: &[u8], dst: &mut Vec<u8>) {
        dst.reserve(src.len() + src.len() / 8 + 1);
        let mut table = [0u8; TABLE];
        let mut w = BitWriter::new(dst);
        let (mut c1, mut c2, mut c3) = (0u8, 0u8, 0u8);
        for &b in src {
            let h = hash(c1, c2, c3);
            if table[h] == b {
                w.put(0, 1);
            } else {
                w.put(0x100 | u32::from(b), 9);
                table[h] = b;
            }
            c3 = c2;
            c2 = c1;
            c1 = b;
        }
        w.finish();
    }

    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError> {
        check_min_len(CodecId::Pred1, src, raw_len)?;
        let start = dst.len();
        dst.resize(start + raw_len, 0);
        let mut table = [0u8; TABLE];
        let mut r = BitReader::new(src);
        let (mut c1, mut c2, mut c3) = (0u8, 0u8, 0u8);
        for slot in dst[start..].iter_mut() {
            let h = hash(c1, c2, c3);
            let v = r.peek(9);
            let b = if v & 0x100 == 0 {
                r.skip(1);
                table[h]
            } else {
                r.skip(9);
                let b = v as u8;
                table[h] = b;
                b
            };
            *slot = b;
            c3 = c2;
            c2 = c1;
            c1 = b;
        }
        r.finish(CodecId::Pred1, raw_len)
    }
}

/// Symbol of a first-table hit.
const HIT1: u16 = 256;
/// Symbol of a second-table hit.
const HIT2: u16 = 257;
const NSYM: usize = 258;
/// Longest code, in bits.
const MAX_LEN: u32 = 10;

/// The fixed code length of each symbol (see the module doc).
pub fn pred2_code_length(sym: u16) -> u32 {
    match sym {
        HIT1 => 1,
        HIT2 => 3,
        _ => match sym as u8 {
            b'a'..=b'z' | b' ' | b'\n' | 0 | b'.' | b',' | b'_' => 8,
            b'A'..=b'Z' | b'0' | b'1' | b'(' | b')' | b'\t' | b'*' => 9,
            _ => 10,
        },
    }
}

/// The canonical code: per symbol (code, length), and a decode table indexed
/// by the next `MAX_LEN` bits giving (symbol, length).
struct Pred2Code {
    enc: [(u16, u8); NSYM],
    dec: [(u16, u8); 1 << MAX_LEN],
}

fn pred2_code() -> &'static Pred2Code {
    static CODE: OnceLock<Pred2Code> = OnceLock::new();
    CODE.get_or_init(|| {
        let mut syms: Vec<u16> = (0..NSYM as u16).collect();
        syms.sort_by_key(|&s| (pred2_code_length(s), s));
        let mut enc = [(0u16, 0u8); NSYM];
        let mut dec = [(0u16, 0u8); 1 << MAX_LEN];
        let mut code: u32 = 0;
        let mut prev_len = pred2_code_length(syms[0]);
        for (i, &s) in syms.iter().enumerate() {
            let len = pred2_code_length(s);
            if i > 0 {
                code = (code + 1) << (len - prev_len);
            }
            prev_len = len;
            enc[usize::from(s)] = (code as u16, len as u8);
            let shift = MAX_LEN - len;
            let first = (code << shift) as usize;
            for slot in dec.iter_mut().skip(first).take(1 << shift) {
                *slot = (s, len as u8);
            }
        }
        Pred2Code { enc, dec }
    })
}

/// Algorithm 2: two prediction tables and a static Huffman code.
pub struct Pred2Codec;

impl Codec for Pred2Codec {
    fn id(&self) -> CodecId {
        CodecId::Pred2
    }

    fn compress(&self, _level: u8, src: &[u8], dst: &mut Vec<u8>) {
        let code = pred2_code();
        dst.reserve(src.len() / 2 + 8);
        let mut t1 = [0u8; TABLE];
        let mut t2 = [0u8; TABLE];
        let mut w = BitWriter::new(dst);
        let (mut c1, mut c2, mut c3) = (0u8, 0u8, 0u8);
        for &b in src {
            let h = hash(c1, c2, c3);
            let sym = if t1[h] == b {
                HIT1
            } else {
                let s = if t2[h] == b { HIT2 } else { u16::from(b) };
                t2[h] = t1[h];
                t1[h] = b;
                s
            };
            let (c, l) = code.enc[usize::from(sym)];
            w.put(u32::from(c), u32::from(l));
            c3 = c2;
            c2 = c1;
            c1 = b;
        }
        w.finish();
    }

    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError> {
        check_min_len(CodecId::Pred2, src, raw_len)?;
        let code = pred2_code();
        let start = dst.len();
        dst.resize(start + raw_len, 0);
        let mut t1 = [0u8; TABLE];
        let mut t2 = [0u8; TABLE];
        let mut r = BitReader::new(src);
        let (mut c1, mut c2, mut c3) = (0u8, 0u8, 0u8);
        for slot in dst[start..].iter_mut() {
            let h = hash(c1, c2, c3);
            let v = r.peek(MAX_LEN) as usize & ((1 << MAX_LEN) - 1);
            let (sym, len) = code.dec[v];
            r.skip(u32::from(len));
            let b = match sym {
                HIT1 => t1[h],
                HIT2 => t2[h],
                lit => lit as u8,
            };
            if sym != HIT1 {
                t2[h] = t1[h];
                t1[h] = b;
            }
            *slot = b;
            c3 = c2;
            c2 = c1;
            c1 = b;
        }
        r.finish(CodecId::Pred2, raw_len)
    }
}
