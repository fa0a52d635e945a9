//! Codec `lz4`: the LZ4 block format (`lz4_flex`, safe decoder with bounds
//! checks), without a size prefix: the caller records the raw length.

use super::{Codec, CodecId, DecodeError};

/// LZ4 block codec. No levels.
pub struct Lz4Codec;

impl Codec for Lz4Codec {
    fn id(&self) -> CodecId {
        CodecId::Lz4
    }

    fn compress(&self, _level: u8, src: &[u8], dst: &mut Vec<u8>) {
        let start = dst.len();
        dst.resize(start + lz4_flex::block::get_maximum_output_size(src.len()), 0);
        match lz4_flex::block::compress_into(src, &mut dst[start..]) {
            Ok(n) => dst.truncate(start + n),
            Err(_) => {
                // Cannot happen with a buffer of the maximum output size;
                // fall back to the allocating API rather than panic.
                dst.truncate(start);
                dst.extend_from_slice(&lz4_flex::block::compress(src));
            }
        }
    }

    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError> {
        let start = dst.len();
        dst.resize(start + raw_len, 0);
        let res = lz4_flex::block::decompress_into(src, &mut dst[start..]);
        match res {
            Ok(n) if n == raw_len => Ok(()),
            Ok(n) => {
                dst.truncate(start + n);
                Err(DecodeError::size(CodecId::Lz4, raw_len, format_args!("got {n}")))
            }
            Err(e) => {
                dst.truncate(start);
                Err(DecodeError::size(CodecId::Lz4, raw_len, e))
            }
        }
    }
}
