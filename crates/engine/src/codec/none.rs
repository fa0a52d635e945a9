//! Codec `none`: the payload is the data.

use super::{Codec, CodecId, DecodeError};

/// The identity codec.
pub struct NoneCodec;

impl Codec for NoneCodec {
    fn id(&self) -> CodecId {
        CodecId::None
    }

    fn compress(&self, _level: u8, src: &[u8], dst: &mut Vec<u8>) {
        dst.extend_from_slice(src);
    }

    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError> {
        if src.len() != raw_len {
            return Err(DecodeError::size(
                CodecId::None,
                raw_len,
                format_args!("payload is {} bytes", src.len()),
            ));
        }
        dst.extend_from_slice(src);
        Ok(())
    }
}
