//! `CheckpointSlot::decode` on arbitrary slots: must return Err (or
//! Ok(None) for an all-zero slot), never panic.
//!
//! The input is copied into a zero-filled 4096-byte slot and tried as is and
//! with the slot crc recomputed, so the decoding behind the crc is reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::bytes::crc;
use zlogfs_engine::log::format::{CheckpointSlot, SLOT_CRC_OFFSET};
use zlogfs_engine::store::META_SLOT_SIZE;

fn check(buf: &[u8; META_SLOT_SIZE]) {
    match CheckpointSlot::decode(buf, "checkpoint slot") {
        Ok(Some(slot)) => {
            let again = CheckpointSlot::decode(&slot.encode(), "re-encoded checkpoint slot")
                .expect("re-encoded checkpoint slot does not decode");
            assert_eq!(again, Some(slot));
        }
        Ok(None) => assert!(buf.iter().all(|&b| b == 0), "Ok(None) for a slot that is not all zero"),
        Err(_) => {}
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
