//! `CheckpointBody::decode` (with levels, as read from parts, and
//! without, as a one-block body) and `CheckpointHead::decode` on
//! arbitrary payloads: must return Err, never panic. On success, decode ->
//! encode -> decode gives the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::engine::{CheckpointBody, CheckpointHead};

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = CheckpointBody::decode(data, "checkpoint body", true) {
        let again = CheckpointBody::decode(&body.encode(), "re-encoded checkpoint body", true)
            .expect("re-encoded checkpoint body does not decode");
        assert_eq!(again, body);
    }
    if let Ok(body) = CheckpointBody::decode(data, "one-block checkpoint body", false) {
        let again = CheckpointBody::decode(&body.encode_without_levels(), "re-encoded one-block body", false)
            .expect("re-encoded one-block checkpoint body does not decode");
        assert_eq!(again, body);
    }
    if let Ok(head) = CheckpointHead::decode(data, "checkpoint head") {
        let again = CheckpointHead::decode(&head.encode(), "re-encoded checkpoint head")
            .expect("re-encoded checkpoint head does not decode");
        assert_eq!(again, head);
    }
});
