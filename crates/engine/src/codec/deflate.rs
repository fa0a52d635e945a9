//! Codec `deflate`: raw deflate (RFC 1951, no zlib or gzip wrapper) via
//! `flate2`, levels 0..=9. Decoding writes into a buffer of `raw_len + 1`
//! bytes, so output beyond `raw_len` is detected without being produced in
//! full; the stream must end exactly at `raw_len` bytes and consume the
//! whole payload.

use std::io::Write;

use flate2::{write::DeflateEncoder, Compression, Decompress, FlushDecompress, Status};

use super::{Codec, CodecId, DecodeError};

/// Raw deflate codec.
pub struct DeflateCodec;

impl Codec for DeflateCodec {
    fn id(&self) -> CodecId {
        CodecId::Deflate
    }

    fn compress(&self, level: u8, src: &[u8], dst: &mut Vec<u8>) {
        let start = dst.len();
        // Writing into a Vec cannot fail.
        let ok = {
            let mut enc = DeflateEncoder::new(&mut *dst, Compression::new(u32::from(level.min(9))));
            match enc.write_all(src) {
                Ok(()) => enc.finish().is_ok(),
                Err(_) => false,
            }
        };
        if !ok {
            dst.truncate(start);
        }
    }

    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError> {
        let err = |d: std::fmt::Arguments<'_>| DecodeError::size(CodecId::Deflate, raw_len, d);
        let start = dst.len();
        dst.resize(start + raw_len + 1, 0);
        let mut dec = Decompress::new(false);
        let res = dec.decompress(src, &mut dst[start..], FlushDecompress::Finish);
        let out = usize::try_from(dec.total_out()).unwrap_or(usize::MAX);
        let used = usize::try_from(dec.total_in()).unwrap_or(usize::MAX);
        dst.truncate(start + out.min(raw_len + 1));
        match res {
            Err(e) => Err(err(format_args!("{e}"))),
            Ok(_) if out > raw_len => Err(err(format_args!("output is longer"))),
            Ok(Status::StreamEnd) if out < raw_len => Err(err(format_args!("got {out}"))),
            Ok(Status::StreamEnd) if used != src.len() => {
                Err(err(format_args!("{} trailing bytes", src.len() - used)))
            }
            Ok(Status::StreamEnd) => Ok(()),
            Ok(_) => Err(err(format_args!("stream truncated after {out} bytes"))),
        }
    }
}
