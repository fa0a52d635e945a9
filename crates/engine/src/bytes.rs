//! Bounds-checked little-endian encoding and decoding, and LEB128 varints.
//! Every decoder of on-disk bytes goes through [`Reader`], so a damaged
//! structure becomes an [`Error::Corrupt`] naming it, never a panic.

use crate::error::{Error, Result};

/// crc32c of `data`.
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Appends encodings to a `Vec<u8>`.
pub trait Put {
    /// Append a little-endian u8.
    fn put_u8(&mut self, v: u8);
    /// Append a little-endian u16.
    fn put_u16(&mut self, v: u16);
    /// Append a little-endian u32.
    fn put_u32(&mut self, v: u32);
    /// Append a little-endian u64.
    fn put_u64(&mut self, v: u64);
    /// Append an unsigned LEB128 varint.
    fn put_var(&mut self, v: u64);
    /// Append a varint length followed by the bytes.
    fn put_lenbytes(&mut self, b: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_var(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.push(v as u8);
    }
    fn put_lenbytes(&mut self, b: &[u8]) {
        self.put_var(b.len() as u64);
        self.extend_from_slice(b);
    }
}

/// A cursor over bytes read from disk. Every read is bounds-checked and
/// names the structure being decoded in its error.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'a str,
}

impl<'a> Reader<'a> {
    /// Decode `buf`, which holds the structure `what` (used in errors).
    pub fn new(buf: &'a [u8], what: &'a str) -> Self {
        Reader { buf, pos: 0, what }
    }

    /// Bytes consumed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// True when everything was consumed.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// An error about this structure.
    pub fn err(&self, detail: impl Into<String>) -> Error {
        Error::corrupt(self.what, detail)
    }

    /// Take the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "needs {n} bytes at offset {} but only {} remain",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Take `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    /// The next byte, without taking it.
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// A u8.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// An unsigned LEB128 varint of at most 10 bytes.
    pub fn var(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(self.err("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    /// A varint that must not exceed `max` (a length or count).
    pub fn var_max(&mut self, max: u64, name: &str) -> Result<u64> {
        let v = self.var()?;
        if v > max {
            return Err(self.err(format!("{name} {v} exceeds the limit {max}")));
        }
        Ok(v)
    }

    /// A varint length (at most `max`) followed by that many bytes.
    pub fn lenbytes(&mut self, max: usize, name: &str) -> Result<&'a [u8]> {
        let n = self.var_max(max as u64, name)? as usize;
        self.bytes(n)
    }

    /// Fail unless everything was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(self.err(format!("{} trailing bytes", self.remaining())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip_and_limits() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            b.put_var(v);
            let mut r = Reader::new(&b, "test");
            assert_eq!(r.var().unwrap(), v);
            assert!(r.is_empty());
        }
        let bad = [0xffu8; 11];
        assert!(Reader::new(&bad, "test").var().is_err());
        let trunc = [0x80u8];
        assert!(Reader::new(&trunc, "test").var().is_err());
        let mut b = Vec::new();
        b.put_var(1000);
        assert!(Reader::new(&b, "t").var_max(999, "len").is_err());
    }

    #[test]
    fn short_reads_are_errors_naming_the_structure() {
        let mut r = Reader::new(&[1, 2, 3], "superblock");
        let e = r.u32().unwrap_err();
        assert!(e.to_string().contains("superblock"), "{e}");
    }
}
