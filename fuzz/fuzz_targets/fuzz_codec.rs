//! `codec::decode` on arbitrary payloads: must return Err, never panic,
//! and on success return exactly `raw_len` bytes.
//!
//! Input: byte 0 = codec id (low 3 bits: 0..=5 are the codecs, 6 and 7 are
//! unknown ids), bytes 1..5 = raw_len (u32 LE, reduced to at most 1 MiB),
//! the rest = the stored payload.
//!
//! When decoding succeeds, the output is compressed again with the same
//! codec, both directly and through the write path's policy (`encode`),
//! and must decode back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::codec::{self, CodecId, CodecSpec};

const MAX_RAW: usize = 1 << 20;
const ROUND_TRIP_MAX: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let codec_byte = data[0] & 7;
    let raw_len = u32::from_le_bytes(data[1..5].try_into().unwrap()) as usize % (MAX_RAW + 1);
    let stored = &data[5..];
    let Ok(out) = codec::decode(codec_byte, stored, raw_len) else { return };
    assert_eq!(out.len(), raw_len);
    let id = CodecId::from_u8(codec_byte).expect("unknown codec decoded successfully");
    if out.len() > ROUND_TRIP_MAX {
        return;
    }
    let level = CodecSpec::default_level(id);
    let mut direct = Vec::new();
    codec::codec(id).compress(level, &out, &mut direct);
    let again = codec::decode(id as u8, &direct, out.len()).expect("compressed output does not decode");
    assert!(again == out, "{id} round trip changed the data");
    let enc = codec::encode(CodecSpec::new(id, level), &out);
    let again = codec::decode(enc.codec as u8, &enc.data, out.len()).expect("encoded output does not decode");
    assert!(again == out, "{id} encode round trip changed the data");
});
