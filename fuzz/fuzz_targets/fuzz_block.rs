//! `decode_block` (header parse, crc check, kind check, codec decode) on
//! arbitrary blocks for every `BlockKind`: must return Err, never panic.
//!
//! Each input is tried as is (exercising the crc and length checks) and with
//! the header repaired: `stored_len` set to the payload length, `raw_len`
//! kept below 1 MiB unless it is beyond the format's limit (so the range
//! check is still reached) and the crc recomputed, so the codec decoders
//! named in the header are reached.
//!
//! Block header: crc32c u32 (over bytes 4..), codec u8, level u8,
//! raw_reason u8, kind u8, raw_len u32, stored_len u32; all little-endian.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::log::{decode_block, NewBlock};
use zlogfs_engine::log::format::{BlockAddr, BlockKind, BLOCK_HEADER_SIZE, MAX_SEGMENT_SIZE};

/// Largest raw length `decode_block` accepts (max_block_raw of the largest segment).
const MAX_RAW: u32 = MAX_SEGMENT_SIZE / 4;
/// Raw lengths we let through to the codecs (keeps executions fast).
const FUZZ_RAW: u32 = 1 << 20;
/// Largest decoded payload we re-encode for the round trip.
const ROUND_TRIP_MAX: usize = 64 << 10;

fn check(buf: &[u8]) {
    let addr = BlockAddr { seg: 3, offset: 4096, len: buf.len() as u32 };
    for kind in BlockKind::ALL {
        let Ok(raw) = decode_block(buf, addr, kind) else { continue };
        // A successful decode implies a sound header.
        let hdr_kind = buf[7];
        assert_eq!(hdr_kind, kind as u8);
        let raw_len = u32::from_le_bytes(buf[8..12].try_into().unwrap());
        assert_eq!(raw.len(), raw_len as usize);
        if raw.len() <= ROUND_TRIP_MAX {
            round_trip(buf[4], kind, &raw);
        }
    }
}

/// Re-encode the decoded payload with the codec the block named (through
/// the write path's storage policy) into a new block: it decodes back.
fn round_trip(codec_byte: u8, kind: BlockKind, raw: &[u8]) {
    let id = CodecId::from_u8(codec_byte).expect("decoded block names an unknown codec");
    // The engine's own write path: compress with the policy, seal.
    let blk = NewBlock::encode(kind, 0, CodecSpec::new(id, CodecSpec::default_level(id)), raw).bytes().to_vec();
    let addr = BlockAddr { seg: 0, offset: 0, len: blk.len() as u32 };
    let again = decode_block(&blk, addr, kind).expect("re-encoded block does not decode");
    assert!(again == raw, "re-encoded block decodes to different bytes");
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() < BLOCK_HEADER_SIZE || data.len() > u32::MAX as usize {
        return;
    }
    let mut b = data.to_vec();
    let mut raw_len = u32::from_le_bytes(b[8..12].try_into().unwrap());
    if raw_len <= MAX_RAW && raw_len > FUZZ_RAW {
        raw_len %= FUZZ_RAW + 1;
    }
    b[8..12].copy_from_slice(&raw_len.to_le_bytes());
    let stored_len = (b.len() - BLOCK_HEADER_SIZE) as u32;
    b[12..16].copy_from_slice(&stored_len.to_le_bytes());
    let c = zlogfs_engine::bytes::crc(&b[4..]);
    b[..4].copy_from_slice(&c.to_le_bytes());
    check(&b);
});
