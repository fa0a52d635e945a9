//! History: the change records and the frees held for snapshots.

use std::collections::HashMap;

use super::*;
use crate::error::Result;

impl<'a> Checker<'a> {
    /// Change records decode, and the record of where they start is
    /// there when any is.
    pub(super) fn change_records(&mut self) -> Result<()> {
        let (lo, hi) = changes_range();
        let from = match crate::history::feed::records_from(self.st) {
            Ok(f) => f,
            Err(e) => {
                self.bad(format!("{e}"));
                return Ok(());
            }
        };
        let st = self.st;
        st.for_each(&lo, &hi, |k, v| {
            let what = describe_key(k);
            match parse_change_key(k) {
                None => self.bad(format!("malformed change record key {k:02x?}")),
                Some(s) if from.is_none_or(|f| s <= f.seq) => {
                    self.bad(format!("{what} lies before where change records start"))
                }
                Some(_) => {}
            }
            if let Err(e) = crate::event::Record::decode(v, &what) {
                self.bad(format!("{e}"));
            }
            Ok(())
        })
    }

    /// Frees held for snapshots: their bytes stay counted in their
    /// segments (`per_seg`), their blocks read back with a good checksum;
    /// they and forward records exist only while a snapshot does.
    pub(super) fn held(&mut self, per_seg: &mut HashMap<u32, u64>) -> Result<()> {
        let none = self.st.group.snapshots().is_empty();
        let (st, (lo, hi)) = (self.st, all_held_range());
        let (mut count, mut last) = (0u64, None);
        st.for_each(&lo, &hi, |k, v| {
            count += 1;
            if let Err(e) = decode_born(v, &describe_key(k)) {
                self.bad(format!("{e}"));
            }
            let Some((a, _, _)) = parse_held_key(k) else {
                self.bad(format!("malformed held free {k:02x?}"));
                return Ok(());
            };
            *per_seg.entry(a.seg).or_default() += u64::from(a.len);
            // Keys order the frees by block: each block is read once.
            if last != Some((a.seg, a.offset)) {
                last = Some((a.seg, a.offset));
                if let Err(e) = st.eng.block_at(a.seg, a.offset).and_then(|b| st.eng.read_block(b)) {
                    self.bad(format!("a block kept for snapshots at {}:{}: {e}", a.seg, a.offset));
                }
            }
            Ok(())
        })?;
        if count > 0 && none {
            self.bad(format!("{count} frees are held for snapshots, but there is none"));
        }
        let (lo, hi) = seg_borns_range();
        st.for_each(&lo, &hi, |k, v| {
            if parse_seg_born_key(k).is_none() {
                self.bad(format!("malformed segment born key {k:02x?}"));
            } else if let Err(e) = decode_born(v, &describe_key(k)) {
                self.bad(format!("{e}"));
            }
            Ok(())
        })?;
        let (lo, hi) = all_forward_range();
        let mut forwards = 0u64;
        st.for_each(&lo, &hi, |k, v| {
            forwards += 1;
            if parse_forward_key(k).is_none() {
                self.bad(format!("malformed forward record key {k:02x?}"));
            } else if let Err(e) = decode_addr(v, &describe_key(k)) {
                self.bad(format!("{e}"));
            }
            Ok(())
        })?;
        if forwards > 0 && none {
            self.bad(format!("{forwards} forward records, but no snapshot"));
        }
        Ok(())
    }
}
