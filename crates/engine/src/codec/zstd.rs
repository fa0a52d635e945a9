//! Codec `zstd`: one Zstandard frame per block, levels 1..=19, through the
//! bulk (single-shot) API. Compression and decompression contexts are kept
//! per thread, so the codec itself is stateless.
//!
//! Decoding writes into a buffer of exactly `raw_len` bytes: a frame that
//! would expand beyond it fails, and one that expands to less is an error.
//!
//! Trained dictionaries (useful for small blocks such as inode runs) are
//! left for a future `CodecId::ZstdDict`, whose payload would start with the
//! dictionary id (a little-endian u32) followed by a frame compressed with
//! that dictionary; the dictionaries themselves would live in the index.
//! Plain `zstd` payloads never carry a dictionary.

use std::cell::RefCell;

use zstd::zstd_safe::{self, CCtx, DCtx};

use super::{Codec, CodecId, DecodeError};

/// Zstandard codec.
pub struct ZstdCodec;

thread_local! {
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

impl Codec for ZstdCodec {
    fn id(&self) -> CodecId {
        CodecId::Zstd
    }

    fn compress(&self, level: u8, src: &[u8], dst: &mut Vec<u8>) {
        let level = i32::from(level.clamp(1, 19));
        let start = dst.len();
        dst.resize(start + zstd_safe::compress_bound(src.len()), 0);
        let res = CCTX.with(|c| {
            let mut c = c.borrow_mut();
            let cctx = c.get_or_insert_with(CCtx::create);
            cctx.compress(&mut dst[start..], src, level)
        });
        match res {
            Ok(n) => dst.truncate(start + n),
            Err(_) => {
                // Cannot happen with a buffer of compress_bound bytes; fall
                // back to the streaming API rather than panic.
                dst.truncate(start);
                let mut out = Vec::new();
                if zstd::stream::copy_encode(src, &mut out, level).is_ok() {
                    dst.extend_from_slice(&out);
                }
            }
        }
    }

    fn decompress(&self, src: &[u8], raw_len: usize, dst: &mut Vec<u8>) -> Result<(), DecodeError> {
        let start = dst.len();
        let res = DCTX.with(|d| {
            let mut d = d.borrow_mut();
            let dctx = d.get_or_insert_with(DCtx::create);
            if start == 0 {
                // Into the Vec's spare capacity: no zero-filling first (it
                // cost as much as a tenth of a random read's time).
                dst.reserve_exact(raw_len);
                dctx.decompress(dst, src)
            } else {
                dst.resize(start + raw_len, 0);
                dctx.decompress(&mut dst[start..], src)
            }
        });
        match res {
            Ok(n) if n == raw_len => Ok(()),
            Ok(n) => {
                dst.truncate(start + n);
                Err(DecodeError::size(CodecId::Zstd, raw_len, format_args!("got {n}")))
            }
            Err(code) => {
                dst.truncate(start);
                Err(DecodeError::size(CodecId::Zstd, raw_len, zstd_safe::get_error_name(code)))
            }
        }
    }
}
