//! `BatchHeader::decode` and `SummaryEntry::decode_all` on arbitrary batches:
//! must return Err (or Ok(None) without the magic), never panic.
//!
//! The whole input is the batch. Each input is tried as is, and (if it is at
//! least a header long) with the magic set and `total_len`, `summary_off`
//! and `summary_count` patched so that the summary fits the input: the
//! per-entry checks are then reached without the fuzzer having to guess the
//! lengths.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlogfs_engine::log::format::{BatchHeader, SummaryEntry, BATCH_HEADER_SIZE, BATCH_MAGIC, SUMMARY_ENTRY_SIZE};

fn check(batch: &[u8]) {
    let h = match BatchHeader::decode(batch) {
        Ok(Some(h)) => h,
        Ok(None) => {
            assert!(batch.len() < BATCH_HEADER_SIZE || batch[..4] != BATCH_MAGIC);
            return;
        }
        Err(_) => return,
    };
    assert_eq!(BatchHeader::decode(&h.encode()).expect("re-encoded header"), Some(h));
    let Ok(entries) = SummaryEntry::decode_all(batch, &h, "batch") else { return };
    assert_eq!(entries.len(), h.summary_count as usize);
    // Re-encode the summary in place: it decodes to the same entries.
    let start = h.summary_off as usize;
    let mut summary = Vec::with_capacity(entries.len() * SUMMARY_ENTRY_SIZE);
    for e in &entries {
        e.put(&mut summary);
    }
    let mut copy = batch.to_vec();
    copy[start..start + summary.len()].copy_from_slice(&summary);
    let again = SummaryEntry::decode_all(&copy, &h, "re-encoded batch").expect("re-encoded summary does not decode");
    assert_eq!(again, entries);
    for e in &entries {
        // Blocks lie inside the batch, after the header, before the summary.
        assert!(e.offset as usize >= BATCH_HEADER_SIZE);
        assert!(e.offset as usize + e.len as usize <= start);
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() < BATCH_HEADER_SIZE || data.len() > u32::MAX as usize {
        return;
    }
    let mut b = data.to_vec();
    b[..4].copy_from_slice(&BATCH_MAGIC);
    let len = b.len();
    let max_count = (len - BATCH_HEADER_SIZE) / SUMMARY_ENTRY_SIZE;
    let count = u32::from_le_bytes(b[36..40].try_into().unwrap()) as usize % (max_count + 1);
    put_u32(&mut b, 28, len as u32); // total_len
    put_u32(&mut b, 32, (len - count * SUMMARY_ENTRY_SIZE) as u32); // summary_off
    put_u32(&mut b, 36, count as u32); // summary_count
    check(&b);
});
