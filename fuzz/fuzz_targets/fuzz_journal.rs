//! `decode_journal` on arbitrary journal block payloads: must return Err,
//! never panic. (The journal encoder is private to the engine, so there is
//! no round trip here.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::engine::decode_journal;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = decode_journal(data, "journal block") {
        // Every record takes at least two bytes (first seq, op count).
        assert!(records.len() <= data.len() / 2);
    }
});
