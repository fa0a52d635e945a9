//! Which merge of index runs comes next: the runs kept in levels
//! (docs/decisions/2026-12-02-merges-by-level.md).
//!
//! Level 0 holds flushed runs, newest first, their key ranges overlapping.
//! Each level below is one sorted run cut into pieces (runs whose key
//! ranges are disjoint), in key order, each level [`FANOUT`] times the
//! one above. The run list is level 0, then level 1, then level 2..., so
//! that a read takes the first version it finds: for any key, a level
//! holds it in at most one piece, and only versions older than those of
//! the levels above.
//!
//! Each merge is bounded: all of level 0 with the level-1 pieces it
//! overlaps, or one piece with the pieces of the next level it overlaps.
//! Bytes only move down, and the last level never pushes, so a series of
//! merges ends.

use crate::index::run::RunMeta;

/// Each level may hold this many times the bytes of the one above.
pub const FANOUT: u64 = 10;
/// The deepest level; it has no target and never pushes.
pub const MAX_LEVEL: u8 = 7;
/// Writers that flush stop for merges once level 0 holds more than this
/// many times `Options::level0_runs` sorted runs (merges run beside
/// flushes, so level 0 may grow past its trigger meanwhile; RocksDB stops
/// writes at 36 level-0 files against a trigger of 4).
pub const LEVEL0_STOP: usize = 3;

/// A merge to do: the runs it takes (indexes into the run list, in list
/// order), the level its output goes to, and whether it may drop
/// tombstones (no deeper run holds a key in its range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    pub inputs: Vec<usize>,
    pub out_level: u8,
    pub bottom: bool,
}

/// Bytes level `level` (1 and below) holds before it pushes a piece down.
pub(super) fn target(level: u8, level1_bytes: u64) -> u64 {
    (1..level).fold(level1_bytes, |t, _| t.saturating_mul(FANOUT))
}

/// The level an output of `bytes` goes to when one merge takes every run:
/// the first whose target holds it.
pub(super) fn level_for(bytes: u64, level1_bytes: u64) -> u8 {
    (1..MAX_LEVEL).find(|&l| target(l, level1_bytes) >= bytes).unwrap_or(MAX_LEVEL)
}

fn overlaps(a: &RunMeta, b: &RunMeta) -> bool {
    a.min_key <= b.max_key && b.min_key <= a.max_key
}

/// Whether `m` holds more tombstones than values: pushed down even under
/// its level's target, where a deeper run overlaps it, so that deletes
/// reach the runs whose keys they hide and give their space back.
fn mostly_tombstones(m: &RunMeta) -> bool {
    m.tombstones * 2 > m.entries
}

/// Sorted runs among level 0's runs `l0` (in list order): a flush cut
/// into several pieces (key-disjoint, ascending, adjacent) counts once.
fn sorted_runs(runs: &[&RunMeta], l0: &[usize]) -> usize {
    let breaks = l0.windows(2).filter(|w| runs[w[1]].min_key <= runs[w[0]].max_key).count();
    usize::from(!l0.is_empty()) + breaks
}

/// Whether level 0 is past its stop ([`LEVEL0_STOP`]): a writer that
/// flushes then waits for a merge.
pub(super) fn level0_stopped(runs: &[&RunMeta], level0_runs: usize) -> bool {
    let l0: Vec<usize> = (0..runs.len()).filter(|&i| runs[i].level == 0).collect();
    sorted_runs(runs, &l0) > level0_runs.max(1) * LEVEL0_STOP
}

/// The next merge due in `runs` (the run list, in order), if any: level 0
/// once it holds more than `level0_runs` sorted runs, or a run mostly of
/// tombstones above a deeper run; else the first level past its target,
/// or holding a piece mostly of tombstones above a deeper run, pushes the
/// piece that overlaps the fewest bytes below it per byte of its own.
pub(super) fn plan(runs: &[&RunMeta], level0_runs: usize, level1_bytes: u64) -> Option<Plan> {
    let at = |l: u8| (0..runs.len()).filter(move |&i| runs[i].level == l);
    let deeper_than = |i: usize, level: u8| runs.iter().any(|m| m.level > level && overlaps(runs[i], m));
    let l0: Vec<usize> = at(0).collect();
    let tombstones = || l0.iter().any(|&i| mostly_tombstones(runs[i]) && deeper_than(i, 0));
    if sorted_runs(runs, &l0) > level0_runs || tombstones() {
        return Some(level_0_merge(runs, l0, level1_bytes));
    }
    for level in 1..MAX_LEVEL {
        let pieces: Vec<usize> = at(level).collect();
        let bytes: u64 = pieces.iter().map(|&i| runs[i].bytes).sum();
        let below = |i: usize| at(level + 1).filter(move |&j| overlaps(runs[i], runs[j]));
        let over = bytes > target(level, level1_bytes);
        let candidates: Vec<usize> = pieces
            .into_iter()
            .filter(|&i| over || (mostly_tombstones(runs[i]) && deeper_than(i, level)))
            .collect();
        let cost = |i: usize| {
            let under: u64 = below(i).map(|j| runs[j].bytes).sum();
            under as f64 / runs[i].bytes.max(1) as f64
        };
        let best = candidates.into_iter().min_by(|&a, &b| cost(a).total_cmp(&cost(b)));
        if let Some(i) = best {
            let mut inputs = vec![i];
            inputs.extend(below(i));
            return Some(finish(runs, inputs, level + 1));
        }
    }
    None
}

/// All of level 0 (`l0`) with every level-1 piece inside its whole key
/// span (one output run spans it: a piece in a gap between level-0 runs
/// left out would overlap it). With nothing below level 0 (an image whose
/// runs all predate levels), the output goes to the first level whose
/// target holds it.
fn level_0_merge(runs: &[&RunMeta], l0: Vec<usize>, level1_bytes: u64) -> Plan {
    let lo = l0.iter().map(|&i| &runs[i].min_key).min().cloned().unwrap_or_default();
    let hi = l0.iter().map(|&i| &runs[i].max_key).max().cloned().unwrap_or_default();
    let mut inputs = l0;
    inputs.extend(
        (0..runs.len()).filter(|&j| runs[j].level == 1 && runs[j].min_key <= hi && lo <= runs[j].max_key),
    );
    let out_level = if runs.iter().all(|m| m.level == 0) {
        level_for(runs.iter().map(|m| m.bytes).sum(), level1_bytes)
    } else {
        1
    };
    finish(runs, inputs, out_level)
}

fn finish(runs: &[&RunMeta], inputs: Vec<usize>, out_level: u8) -> Plan {
    let taken = |i: usize| inputs.contains(&i);
    let bottom = !(0..runs.len()).any(|j| {
        !taken(j) && runs[j].level > out_level && inputs.iter().any(|&i| overlaps(runs[i], runs[j]))
    });
    Plan { inputs, out_level, bottom }
}

/// Whether `runs` keep the order reads rely on: levels never decrease
/// along the list, and below level 0 each level's pieces are in key
/// order with disjoint ranges. Checked where a run list is made (merges)
/// and where one is read (a checkpoint).
pub(super) fn check_order(runs: &[&RunMeta]) -> std::result::Result<(), String> {
    for w in runs.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.level > b.level {
            return Err(format!(
                "run {} of level {} before run {} of level {}",
                a.id, a.level, b.id, b.level
            ));
        }
        if a.level > 0 && a.level == b.level && a.max_key >= b.min_key {
            return Err(format!(
                "runs {} and {} of level {} overlap or are out of order",
                a.id, b.id, a.level
            ));
        }
    }
    match runs.iter().find(|m| m.level > MAX_LEVEL) {
        Some(m) => Err(format!("run {} of level {}, past the deepest ({MAX_LEVEL})", m.id, m.level)),
        None => Ok(()),
    }
}

/// Put merged runs in list order: by level, level 0 as it is (newest
/// first), deeper levels by key. The sort is stable.
pub(super) fn sort(runs: &mut [std::sync::Arc<crate::index::run::Run>]) {
    runs.sort_by(|a, b| {
        let (a, b) = (&a.meta, &b.meta);
        a.level.cmp(&b.level).then_with(|| {
            if a.level == 0 {
                std::cmp::Ordering::Equal
            } else {
                a.min_key.cmp(&b.min_key)
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::format::BlockAddr;

    fn run(id: u64, level: u8, lo: u8, hi: u8, bytes: u64) -> RunMeta {
        RunMeta {
            id,
            level,
            entries: 100,
            tombstones: 0,
            min_seq: 1,
            max_seq: 1,
            min_key: vec![lo],
            max_key: vec![hi],
            index: BlockAddr::default(),
            filter: BlockAddr::default(),
            bytes,
        }
    }

    fn refs(v: &[RunMeta]) -> Vec<&RunMeta> {
        v.iter().collect()
    }

    /// A level-0 run mostly of tombstones goes down at once where a deeper
    /// run holds keys of its range, and waits where none does.
    #[test]
    fn level_0_deletes_go_down_to_what_they_hide() {
        let mut v = vec![run(1, 0, 10, 20, 5), run(2, 1, 30, 40, 50)];
        v[0].tombstones = 51;
        assert_eq!(plan(&refs(&v), 4, 1000), None, "nothing below holds its keys");
        v[1].min_key = vec![20];
        let p = plan(&refs(&v), 4, 1000).expect("a merge");
        assert_eq!(p, Plan { inputs: vec![0, 1], out_level: 1, bottom: true });
        v[0].tombstones = 50;
        assert_eq!(plan(&refs(&v), 4, 1000), None, "half tombstones is not most");
    }

    /// Level 0 at its limit waits; one sorted run more merges all of it
    /// with the level-1 pieces inside its key span, and only those. A
    /// flush cut into pieces counts once.
    #[test]
    fn level_0_merges_one_run_past_its_limit() {
        let mut v = vec![run(1, 0, 10, 20, 5)];
        v.extend([run(3, 1, 0, 9, 50), run(4, 1, 12, 18, 50), run(5, 1, 26, 40, 50), run(6, 1, 41, 60, 50)]);
        // A flush cut into two pieces, in key order, in front.
        v.insert(0, run(7, 0, 22, 25, 5));
        v.insert(0, run(8, 0, 0, 5, 5));
        assert_eq!(plan(&refs(&v), 2, 1000), None, "runs 8 and 7 are one flush's pieces: two sorted runs");
        v.insert(0, run(9, 0, 19, 19, 5));
        let p = plan(&refs(&v), 2, 1000).expect("a merge");
        // Level 0 spans 0-25: the level-1 pieces at 0-9 and 12-18.
        assert_eq!(p, Plan { inputs: vec![0, 1, 2, 3, 4, 5], out_level: 1, bottom: true });
    }

    /// Writers stop for merges past `LEVEL0_STOP` times `level0_runs`
    /// sorted runs at level 0, not at it; a flush's pieces count once.
    #[test]
    fn writers_stop_one_sorted_run_past_level_0s_stop() {
        let level0_runs = 2;
        let edge = level0_runs * LEVEL0_STOP;
        // Overlapping level-0 runs, each its own sorted run.
        let mut v: Vec<RunMeta> = (0..edge as u64).map(|i| run(i, 0, 10, 20, 5)).collect();
        v.push(run(99, 1, 0, 60, 50));
        assert!(!level0_stopped(&refs(&v), level0_runs), "{edge} sorted runs: at the stop, not past it");
        // A flush in two key-disjoint pieces adds one sorted run.
        v.insert(0, run(100, 0, 30, 40, 5));
        v.insert(0, run(101, 0, 0, 5, 5));
        assert!(level0_stopped(&refs(&v), level0_runs), "{} sorted runs: past the stop", edge + 1);
        assert!(!level0_stopped(&refs(&v[..edge]), level0_runs));
    }

    /// A level-1 piece in a gap between level-0 runs is merged too: the
    /// output spans the gap (issue 45 review: left out, it overlapped the
    /// output and the merge was refused, stopping the engine).
    #[test]
    fn a_level_0_merge_takes_the_level_1_pieces_in_its_gaps() {
        let mut v = vec![run(1, 0, 40, 50, 5), run(2, 0, 10, 20, 5)];
        v[0].tombstones = 90;
        v.extend([run(3, 1, 0, 5, 50), run(4, 1, 30, 35, 50), run(5, 1, 45, 46, 50), run(6, 1, 60, 70, 50)]);
        let p = plan(&refs(&v), 4, 1000).expect("a merge");
        assert_eq!(p.inputs, vec![0, 1, 3, 4], "the piece at 30-35 lies between the level-0 runs");
    }

    /// Runs that all predate levels (an older image's) go, merged, to the
    /// level whose target holds them, not all into level 1.
    #[test]
    fn an_older_images_runs_go_to_the_level_that_holds_them() {
        let v: Vec<RunMeta> = (0..8).map(|i| run(i, 0, 0, 100, 300)).collect();
        let p = plan(&refs(&v), 4, 1000).expect("a merge");
        assert_eq!((p.inputs.len(), p.out_level, p.bottom), (8, 2, true));
    }

    /// A level at its target waits; past it by one piece, one piece goes
    /// down with the pieces below it overlaps: the one overlapping least.
    #[test]
    fn a_level_past_its_target_pushes_the_piece_overlapping_least() {
        let mut v = vec![run(1, 1, 0, 49, 60), run(2, 1, 50, 99, 40)];
        v.extend([run(3, 2, 0, 30, 300), run(4, 2, 31, 60, 300), run(5, 2, 70, 80, 10)]);
        assert_eq!(plan(&refs(&v), 4, 100), None, "level 1 holds its target of 100");
        v[1].bytes = 41;
        let p = plan(&refs(&v), 4, 100).expect("a merge");
        // The first piece overlaps 600 bytes below for its 60 (10 a byte),
        // the second 310 for its 41 (7.6 a byte).
        assert_eq!(p, Plan { inputs: vec![1, 3, 4], out_level: 2, bottom: true });
    }

    /// Tombstones may be dropped only where no deeper run holds a key of
    /// the merge's range; a piece mostly of tombstones goes down under its
    /// target while a deeper run overlaps it, and stays at the bottom.
    #[test]
    fn tombstones_go_down_to_what_they_hide() {
        let mut v = vec![run(1, 1, 0, 9, 10), run(2, 2, 20, 29, 10), run(3, 3, 0, 9, 10)];
        assert_eq!(plan(&refs(&v), 4, 100), None);
        v[0].tombstones = 51;
        let p = plan(&refs(&v), 4, 100).expect("a merge");
        assert_eq!(
            p,
            Plan { inputs: vec![0], out_level: 2, bottom: false },
            "level 3 holds keys of its range"
        );
        v[0].level = 3;
        v[2].level = 3;
        v.swap(0, 1);
        assert_eq!(plan(&refs(&v[..2]), 4, 100), None, "at the bottom nothing is below");
    }

    #[test]
    fn targets_grow_by_the_fanout_and_end_at_the_last_level() {
        assert_eq!((target(1, 64), target(2, 64), target(3, 64)), (64, 640, 6400));
        assert_eq!(level_for(64, 64), 1);
        assert_eq!(level_for(65, 64), 2);
        assert_eq!(level_for(u64::MAX, 64), MAX_LEVEL);
        assert_eq!(target(MAX_LEVEL, u64::MAX / 2), u64::MAX);
    }

    #[test]
    fn the_order_reads_rely_on_is_checked() {
        let ok = vec![run(1, 0, 5, 9, 1), run(2, 0, 0, 50, 1), run(3, 1, 0, 9, 1), run(4, 1, 10, 20, 1)];
        assert_eq!(check_order(&refs(&ok)), Ok(()));
        let mut bad = ok.clone();
        bad.swap(1, 2);
        assert!(check_order(&refs(&bad)).unwrap_err().contains("before run"));
        let mut bad = ok.clone();
        bad[3].min_key = vec![9];
        assert!(check_order(&refs(&bad)).unwrap_err().contains("overlap"));
        let mut bad = ok;
        bad[3].level = MAX_LEVEL + 1;
        assert!(check_order(&refs(&bad)).unwrap_err().contains("past the deepest"));
    }
}
