//! A run's filter block: a blocked Bloom filter over its user keys, about
//! 10 bits a key (FORMAT.md §3.4).

use crate::bytes::{Put, Reader};
use crate::error::Result;

/// A blocked Bloom filter over user keys: every key's `k` bits fall in one
/// 64-byte line, so a probe costs one cache miss instead of `k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    k: u8,
    bits: Vec<u8>,
}

/// Bytes in one filter line.
const BLOOM_LINE: usize = 64;

/// splitmix64's finaliser: spreads every input bit over the output.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A key's 64-bit filter hash: all a filter needs of it (a run being
/// written keeps these, 8 bytes a key, instead of the keys).
pub fn key_hash(key: &[u8]) -> u64 {
    mix64(u64::from(crc32c::crc32c(key)) << 32 | u64::from(crc32c::crc32c_append(0x9e37_79b9, key)))
}

/// The line (byte offset) and the `k` bit positions within it of a key
/// hash `h`: the line from its high half, the positions from 9-bit
/// slices of a second hash of it, so the two choices are independent.
fn bloom_probe(bits_len: usize, k: u8, h: u64) -> (usize, impl Iterator<Item = usize>) {
    let lines = (bits_len / BLOOM_LINE).max(1) as u64;
    let line = (((h >> 32) * lines) >> 32) as usize;
    let g = mix64(h ^ 0x2545_f491_4f6c_dd1d);
    let bits = (0..u32::from(k.min(7))).map(move |i| ((g >> (9 * i)) & 511) as usize);
    (line * BLOOM_LINE, bits)
}

impl Bloom {
    /// A filter for `n` keys at about 10 bits per key (about 1% false
    /// positives). (Runs build theirs from hashes kept while writing:
    /// [`Bloom::from_hashes`]; tests and the fuzz targets use this.)
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn build<'a>(n: usize, keys: impl Iterator<Item = &'a [u8]>) -> Bloom {
        Bloom::from_hashes(n, keys.map(key_hash))
    }

    /// A filter for `n` keys from their [`key_hash`]es (about 10 bits per
    /// key, about 1% false positives).
    pub fn from_hashes(n: usize, hashes: impl Iterator<Item = u64>) -> Bloom {
        let nbytes = (n * 10).div_ceil(8).clamp(BLOOM_LINE, 1 << 27).next_multiple_of(BLOOM_LINE);
        let mut b = Bloom { k: 7, bits: vec![0u8; nbytes] };
        for h in hashes {
            let (base, probes) = bloom_probe(b.bits.len(), b.k, h);
            for bit in probes {
                b.bits[base + bit / 8] |= 1 << (bit % 8);
            }
        }
        b
    }
    /// A filter that rules out nothing (in place of a damaged one).
    pub fn everything() -> Bloom {
        Bloom { k: 7, bits: Vec::new() }
    }

    /// False if `key` is certainly absent.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        if self.bits.len() < BLOOM_LINE {
            return true;
        }
        let (base, mut probes) = bloom_probe(self.bits.len(), self.k, key_hash(key));
        let line = &self.bits[base..base + BLOOM_LINE];
        probes.all(|bit| line[bit / 8] & (1 << (bit % 8)) != 0)
    }
    /// Encode the filter block payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.bits.len() + 8);
        v.put_u8(self.k);
        v.put_lenbytes(&self.bits);
        v
    }
    /// Decode a filter block payload.
    pub fn decode(buf: &[u8], what: &str) -> Result<Bloom> {
        let mut r = Reader::new(buf, what);
        let k = r.u8()?;
        if k == 0 || k > 30 {
            return Err(r.err(format!("bad hash count {k}")));
        }
        let bits = r.lenbytes(1 << 28, "filter length")?.to_vec();
        if bits.len() % BLOOM_LINE != 0 {
            return Err(r.err(format!("filter of {} bytes is not whole {BLOOM_LINE}-byte lines", bits.len())));
        }
        r.finish()?;
        Ok(Bloom { k, bits })
    }
}
