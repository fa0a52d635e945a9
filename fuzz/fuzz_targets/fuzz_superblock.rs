//! `Superblock::decode` on arbitrary slots: must return Err, never panic.
//!
//! The input is copied into a zero-filled 4096-byte slot. Each input is tried
//! twice: as is, and with the slot crc recomputed so that the field checks
//! behind the crc are reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::bytes::crc;
use zlogfs_engine::log::format::{Superblock, SLOT_CRC_OFFSET};
use zlogfs_engine::store::META_SLOT_SIZE;

fn check(buf: &[u8; META_SLOT_SIZE]) {
    if let Ok(sb) = Superblock::decode(buf) {
        // decode -> encode -> decode gives the same value (the encoding
        // itself may differ: reserved and trailing bytes are ignored).
        let again = Superblock::decode(&sb.encode()).expect("re-encoded superblock does not decode");
        assert_eq!(again, sb);
        let _ = sb.log_id();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut buf = [0u8; META_SLOT_SIZE];
    let n = data.len().min(META_SLOT_SIZE);
    buf[..n].copy_from_slice(&data[..n]);
    check(&buf);
    let c = crc(&buf[..SLOT_CRC_OFFSET]);
    buf[SLOT_CRC_OFFSET..].copy_from_slice(&c.to_le_bytes());
    check(&buf);
});
