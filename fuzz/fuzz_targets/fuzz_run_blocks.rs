//! The payload decoders of index runs: `decode_data_block`,
//! `decode_index_block` and `Bloom::decode`, each given the whole input.
//! They must return Err, never panic.
//!
//! Round trips on success: decode -> encode -> decode gives the same value
//! (the encodings may differ: decoders accept non-minimal varints and
//! shorter-than-possible shared key prefixes). A filter built over the keys
//! of a decoded data block contains every one of them.
#![no_main]

use std::cmp::Ordering;

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::index::run::{cmp_internal, decode_data_block, decode_index_block, encode_data_block, encode_index_block, Bloom};

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = decode_data_block(data, "run data block") {
        let again = decode_data_block(&encode_data_block(&entries), "re-encoded data block")
            .expect("re-encoded data block does not decode");
        assert_eq!(again, entries);
        for w in entries.windows(2) {
            assert_eq!(cmp_internal(&w[0].key, w[0].seq, &w[1].key, w[1].seq), Ordering::Less);
        }
        let bloom = Bloom::build(entries.len(), entries.iter().map(|e| e.key.as_slice()));
        for e in &entries {
            assert!(bloom.may_contain(&e.key), "filter misses a key it was built from");
        }
    }
    if let Ok(idx) = decode_index_block(data, "run index block") {
        let again = decode_index_block(&encode_index_block(&idx), "re-encoded index block")
            .expect("re-encoded index block does not decode");
        assert_eq!(again, idx);
    }
    if let Ok(bloom) = Bloom::decode(data, "run filter block") {
        let again = Bloom::decode(&bloom.encode(), "re-encoded filter block").expect("re-encoded filter does not decode");
        assert_eq!(again, bloom);
        // Probing a decoded filter must not panic, whatever its size.
        let _ = bloom.may_contain(b"");
        let _ = bloom.may_contain(&data[..data.len().min(64)]);
    }
});
