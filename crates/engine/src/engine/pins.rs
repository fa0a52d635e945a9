//! Read points: [`Snapshot`]s, which keep the versions they see through
//! merges and hold the blocks freed after them, and [`ReadPin`]s, which
//! keep the versions but let freed blocks count free at once, holding the
//! segments they read instead (crates/engine/src/log/hold.rs) until a
//! writer that needs one breaks them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{lock, Engine, Shared};

/// The snapshots at one sequence number.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Pins {
    /// All of them (merges keep what they see).
    pub(super) readers: usize,
    /// Those that hold the blocks freed after them ([`Snapshot`]s, not
    /// [`ReadPin`]s).
    pub(super) holding: usize,
}

/// The oldest snapshot that holds the blocks freed after it.
pub(super) fn oldest_holding(snaps: &BTreeMap<u64, Pins>) -> Option<u64> {
    snaps.iter().find(|(_, p)| p.holding > 0).map(|(&s, _)| s)
}

/// A pinned read point: versions it can see are kept by merges, and the
/// blocks freed after it stay counted until it goes.
pub struct Snapshot {
    sh: Arc<Shared>,
    /// The sequence number it reads at.
    pub seq: u64,
    /// It holds the blocks freed after it (false: a [`ReadPin`]'s).
    holding: bool,
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let mut s = lock(&self.sh.snapshots);
        if let Some(p) = s.get_mut(&self.seq) {
            p.readers -= 1;
            p.holding -= usize::from(self.holding);
            if p.readers == 0 {
                s.remove(&self.seq);
            }
        }
    }
}

/// The state as of [`ReadPin::seq`] for a long reader that must not hold
/// writers up (fsck on a mount): merges keep the versions it sees, as
/// for a [`Snapshot`], but the blocks freed after it count free at once.
/// The segments that held live blocks when it was taken are not written
/// again while it lives, unless a writer finds no other free segment:
/// then it is broken ([`ReadPin::broken`]), and what was read with it
/// may be other blocks than its index says.
pub struct ReadPin {
    snap: Snapshot,
    segs: Vec<u32>,
    flag: Arc<crate::log::HoldFlag>,
}

impl ReadPin {
    /// The sequence number it reads at.
    pub fn seq(&self) -> u64 {
        self.snap.seq
    }

    /// Whether a writer that needed a segment broke it.
    pub fn broken(&self) -> bool {
        self.flag.broken()
    }
}

impl Drop for ReadPin {
    fn drop(&mut self) {
        lock(&self.snap.sh.core).log.release(&self.segs, &self.flag);
    }
}

impl Engine {
    /// Pin the current state for reads at its sequence number.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_holding(true)
    }

    fn snapshot_holding(&self, holding: bool) -> Snapshot {
        // Read the sequence number under the lock a merge takes to choose
        // its horizon: the merge either sees this snapshot or chose a
        // horizon at or below the sequence number read here.
        let mut snaps = lock(&self.sh.snapshots);
        let seq = self.seq();
        let p = snaps.entry(seq).or_default();
        p.readers += 1;
        p.holding += usize::from(holding);
        Snapshot { sh: self.sh.clone(), seq, holding }
    }

    /// Pin the current state for a long reader without holding writers
    /// up ([`ReadPin`]).
    pub fn read_pin(&self) -> ReadPin {
        // Under the core lock, where frees are applied: every block the
        // pinned index names is in a segment counted live now.
        let mut core = lock(&self.sh.core);
        let snap = self.snapshot_holding(false);
        let (segs, flag) = core.log.hold();
        ReadPin { snap, segs, flag }
    }

    /// Whether a [`ReadPin`] is live.
    pub fn read_pinned(&self) -> bool {
        lock(&self.sh.core).log.holding()
    }
}
