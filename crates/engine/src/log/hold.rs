//! Holds on segments: a reader that reads the log as it was at one moment
//! (fsck on a mounted file system, for minutes at ten million files) keeps
//! the segments that held live blocks then from being written again while
//! it reads, without holding up the writers.
//!
//! A held segment that empties still counts as free: the room writers are
//! granted does not shrink for a reader. It is only not *taken* while
//! another free segment is there; a writer that finds none breaks every
//! hold and takes it. The reader learns so from [`HoldFlag::broken`] and
//! throws away what it read (blocks it read afterwards may be new ones).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::LogWriter;

/// Set when the hold was broken: its segments may have been rewritten.
#[derive(Debug, Default)]
pub struct HoldFlag(AtomicBool);

impl HoldFlag {
    /// Whether a writer that found no other free segment broke the hold.
    pub fn broken(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The holds on a log's segments.
#[derive(Default)]
pub(super) struct Holds {
    /// Per segment: holds that keep it (empty until the first hold, and
    /// after the holds are broken).
    count: Vec<u32>,
    /// The live holds' flags.
    live: Vec<Arc<HoldFlag>>,
}

impl LogWriter {
    /// Hold every segment that holds live blocks now, and the heads'
    /// (blocks of a batch not written yet are not counted live); the
    /// segments held and the hold's flag. Give them back with
    /// [`LogWriter::release`].
    pub fn hold(&mut self) -> (Vec<u32>, Arc<HoldFlag>) {
        let n = self.geometry.segment_count as usize;
        let segs: Vec<u32> =
            (0..n as u32).filter(|&s| self.usage[s as usize].live > 0 || self.is_head(s)).collect();
        let holds = &mut self.holds;
        holds.count.resize(n, 0);
        for &s in &segs {
            holds.count[s as usize] += 1;
        }
        let flag = Arc::new(HoldFlag::default());
        holds.live.push(flag.clone());
        (segs, flag)
    }

    /// Let the segments of a hold go (nothing if it was broken: they were
    /// let go then).
    pub fn release(&mut self, segs: &[u32], flag: &Arc<HoldFlag>) {
        let holds = &mut self.holds;
        let Some(i) = holds.live.iter().position(|f| Arc::ptr_eq(f, flag)) else { return };
        holds.live.swap_remove(i);
        for &s in segs {
            if let Some(c) = holds.count.get_mut(s as usize) {
                *c = c.saturating_sub(1);
            }
        }
    }

    /// Whether any hold is live.
    pub fn holding(&self) -> bool {
        !self.holds.live.is_empty()
    }

    /// Whether `seg` is free and no hold keeps it: a writer may take it.
    pub(super) fn is_takeable(&self, seg: u32) -> bool {
        self.is_free(seg) && self.holds.count.get(seg as usize).is_none_or(|&c| c == 0)
    }

    /// A writer found no free segment but held ones: break every hold.
    pub(super) fn break_holds(&mut self) {
        let holds = &mut self.holds;
        tracing::info!(
            "a writer needed a segment that {} reader(s) of the log as it was held: they stop",
            holds.live.len()
        );
        for f in holds.live.drain(..) {
            f.0.store(true, Ordering::Release);
        }
        holds.count.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::writer_of;
    use crate::log::Room;

    /// Segments held while they empty are taken last: writers take every
    /// other free segment first, then the first one they need breaks the
    /// hold (the room they were granted never counted on the reader).
    /// A hold let go leaves nothing held.
    #[test]
    fn held_segments_are_taken_last_and_a_writer_needing_one_breaks_the_hold() {
        let mut w = writer_of(40, None);
        let rec = vec![0x5a; 700];
        let mut n = 0;
        let mut write = |w: &mut crate::log::LogWriter| {
            w.add_journal(&rec, n, Room::User).expect("room was granted");
            w.write_pending(Room::User).expect("write");
            n += 1;
        };
        while w.pos().seg < 10 {
            write(&mut w);
        }
        for s in 0..10 {
            w.usage[s].live = 1;
        }
        let (segs, flag) = w.hold();
        assert!((0..10).all(|s| segs.contains(&s)), "{segs:?}");
        assert!(w.holding());
        // Their blocks are overwritten: free, as far as room goes.
        for s in 0..10 {
            w.usage[s].live = 0;
        }
        w.keep_from_batch = u64::MAX;
        let free = w.free_segments();
        assert!(free >= 39 - 10, "held segments count free: {free}");
        let mut visited = std::collections::BTreeSet::new();
        while w.pos().seg >= 10 {
            assert!(!flag.broken(), "broken in segment {} before a held one was needed", w.pos().seg);
            visited.insert(w.pos().seg);
            write(&mut w);
        }
        assert_eq!(visited, (10..40).collect(), "every other free segment first");
        assert!(flag.broken(), "a held segment was taken with the hold whole");
        assert!(!w.holding());
        w.release(&segs, &flag);
        let (segs, flag) = w.hold();
        w.release(&segs, &flag);
        assert!((0..40).filter(|&s| w.is_free(s)).all(|s| w.is_takeable(s)), "a released hold keeps nothing");
    }

    /// Two holds overlap: a segment stays held until both are let go.
    #[test]
    fn a_segment_stays_held_until_every_hold_on_it_goes() {
        let mut w = writer_of(40, None);
        w.usage[5].live = 1;
        let (a, fa) = w.hold();
        w.usage[6].live = 1;
        let (b, fb) = w.hold();
        w.usage[5].live = 0;
        w.usage[6].live = 0;
        w.keep_from_batch = u64::MAX;
        assert!(w.is_free(5) && !w.is_takeable(5) && !w.is_takeable(6));
        w.release(&a, &fa);
        assert!(!w.is_takeable(5), "the second hold keeps it");
        assert!(!w.is_takeable(6));
        w.release(&b, &fb);
        assert!(w.is_takeable(5) && w.is_takeable(6));
        assert!(!w.holding());
    }
}
