//! Patch planning: whether a small overwrite of a stored chunk is stored
//! as patches beside it or the chunk is written whole again, and the
//! arithmetic of patch blocks that the data path and the cleaner share.
//! Pure code: no state, no I/O.
//!
//! A buffer loaded from a stored chunk records which 4 KiB blocks writes
//! touched. At commit, when the chunk kept its length and few blocks
//! changed, only those blocks are stored, one patch per block, packed with
//! other small pieces; the chunk's record lists its base and patches
//! (FORMAT.md §9), and a read copies the patches over the base. A patch
//! releases its share of an own base from the segment's usage, so statfs
//! and the cleaner count the replaced bytes as dead. A chunk is written
//! whole for a write of half a chunk or more, at a 17th patch, or, if it
//! has a base, when its patches would replace more than three quarters of
//! it. A write into a stored chunk reads only the blocks it covers in part
//! (`Buf::partial`). Why not smaller chunks: the ratio falls with the
//! chunk size, and most files are written once. On by default
//! (`FsOptions::patches`, `-o nopatches`).
//!
//! A chunk's patch blocks are [`PATCH_BLOCK`] bytes; a set of them is
//! kept as runs `(first, count)`, ascending, and as a bitmap while a
//! buffer tracks the blocks written.

use crate::keys::{spans, Extent, Patch, MAX_PATCHES, PATCH_BLOCK};

/// The most of a chunk's length its patches may replace before the chunk
/// is written whole again. The replaced bytes of an own base are released
/// from its segment's live count (`add_patch`), so the cleaner sees them
/// as dead and wins them back by merging the patches, however full the
/// device is: no share that shrinks as the device fills is needed (with
/// one, 4 KiB random overwrites on a 70%-full image wrote 6.8 device bytes
/// per byte at none from 85% live and 31 at none from 70%, against 3.2
/// with a fixed half; docs/decisions/2026-11-23-patches-fixed-share.md).
///
/// Three quarters, not a half, since the cleaner stores what shows of a
/// patched base as patches instead of moving the chunk whole (so the
/// base's reduced count no longer bounds what a move costs). A chunk
/// written whole again is 16 blocks of fresh copies, most of which later
/// overwrites hide again: through FUSE, 4 KiB random overwrites near steady
/// state wrote 1.39 device bytes per byte with three quarters against 2.43
/// with a half (docs/decisions/2026-11-23-patch-share-three-quarters.md).
pub(crate) const MAX_PATCH_SHARE: f64 = 0.75;

/// Runs of set bits, as (first, count), below `n`.
pub(crate) fn runs_of(bits: &[u64], n: u32) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for b in 0..n {
        if bits.get(b as usize / 64).is_some_and(|w| w >> (b % 64) & 1 == 1) {
            match runs.last_mut() {
                Some((s, c)) if *s + *c == b => *c += 1,
                _ => runs.push((b, 1)),
            }
        }
    }
    runs
}

/// Set the bits of `blocks` (bits past the bitmap are ignored).
pub(crate) fn mark(bits: &mut [u64], blocks: std::ops::Range<usize>) {
    for b in blocks {
        if let Some(w) = bits.get_mut(b / 64) {
            *w |= 1 << (b % 64);
        }
    }
}

/// True when bit `b` of `bits` is set.
pub(crate) fn is_marked(bits: &[u64], b: usize) -> bool {
    bits.get(b / 64).is_some_and(|w| w >> (b % 64) & 1 == 1)
}

/// The patches of `patches` (oldest first) that still show some block
/// once `over` (runs written after all of them) is laid on top.
pub(crate) fn visible<'a>(patches: &'a [Patch], over: &[(u32, u32)]) -> Vec<&'a Patch> {
    let mut hidden: Vec<(u32, u32)> = over.to_vec();
    let mut out = Vec::new();
    for p in patches.iter().rev() {
        if !covers(&hidden, &p.runs) {
            out.push(p);
        }
        hidden.extend_from_slice(&p.runs);
    }
    out.reverse();
    out
}

/// The blocks of patch `i` of `patches` (oldest first) that no later
/// patch hides, as runs.
pub(crate) fn shows(patches: &[Patch], i: usize) -> Vec<(u32, u32)> {
    let over: Vec<(u32, u32)> = patches[i + 1..].iter().flat_map(|p| p.runs.iter().copied()).collect();
    shown(&patches[i].runs, &over)
}

/// The blocks of `runs` that no run of `over` hides, as runs.
pub(crate) fn shown(runs: &[(u32, u32)], over: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &(s, n) in runs {
        for b in s..s + n {
            if over.iter().any(|&(os, on)| os <= b && b < os + on) {
                continue;
            }
            match out.last_mut() {
                Some((ls, lc)) if *ls + *lc == b => *lc += 1,
                _ => out.push((b, 1)),
            }
        }
    }
    out
}

/// True when every block of `inner` is in `outer`.
pub(crate) fn covers(outer: &[(u32, u32)], inner: &[(u32, u32)]) -> bool {
    inner.iter().all(|&(s, c)| (s..s + c).all(|b| outer.iter().any(|&(os, oc)| os <= b && b < os + oc)))
}

/// The share of a base's `stored` bytes that `patches` replace in a chunk
/// of `len` bytes: stored bytes times the fraction of the chunk the
/// patches cover together, rounded down. Compression is not uniform over
/// a chunk, so this is an estimate; it is only ever used for space
/// accounting, and the base's release adds up to its stored bytes.
pub(crate) fn replaced_share(patches: &[Patch], stored: u32, len: u32) -> u32 {
    let mut spans: Vec<(u64, u64)> = patches.iter().flat_map(|p| p.spans(u64::from(len))).collect();
    spans.sort_unstable();
    let (mut covered, mut end) = (0u64, 0u64);
    for (a, b) in spans {
        let a = a.max(end);
        if b > a {
            covered += b - a;
            end = b;
        }
    }
    (u64::from(stored) * covered / u64::from(len).max(1)) as u32
}

/// The runs of patch blocks to store instead of the whole chunk, or None
/// to store it whole. `stored` is the chunk as stored, `len` its length
/// now, `touched` the blocks written since it was loaded, `chunk_size`
/// the file system's.
///
/// While the cleaner runs (`cleaning`), writers' buffers are set aside,
/// and the only buffers that track blocks are patches the cleaner moves:
/// they replace no more than the patches they replace, whatever the share.
pub(crate) fn plan(
    stored: Option<&Extent>,
    len: usize,
    touched: &[u64],
    chunk_size: u64,
    cleaning: bool,
) -> Option<Vec<(u32, u32)>> {
    let e = stored?;
    if matches!(e, Extent::Inline(_)) || e.len() != len as u64 {
        return None;
    }
    let len = len as u64;
    let runs = runs_of(touched, len.div_ceil(u64::from(PATCH_BLOCK)) as u32);
    if cleaning {
        return (!runs.is_empty()).then_some(runs);
    }
    let bytes: u64 = spans(&runs, len).map(|(a, b)| b - a).sum();
    let (old, gone): (&[Patch], bool) = match e {
        Extent::Patched { patches, base, .. } => (patches, matches!(**base, Extent::Gone(_))),
        _ => (&[], false),
    };
    let kept = visible(old, &runs);
    let (n, before) = kept.iter().fold((0, 0), |(n, b), p| (n + 1, b + p.piece.len()));
    // A chunk without a base has nothing to merge into: its patches are
    // all it is, and their share does not matter.
    let fits = bytes > 0
        && n < MAX_PATCHES
        && (gone || (bytes + before) as f64 <= len as f64 * MAX_PATCH_SHARE)
        && bytes < chunk_size / 2;
    fits.then_some(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zlogfs_engine::BlockAddr;

    const CS: u64 = 64 << 10;

    fn own(len: u32) -> Extent {
        Extent::Own(BlockAddr { seg: 1, offset: 0, len: 1000 }, len)
    }

    fn patch(runs: &[(u32, u32)]) -> Patch {
        let bytes = runs.iter().map(|r| r.1).sum::<u32>() * PATCH_BLOCK;
        Patch { runs: runs.to_vec(), piece: Extent::Own(BlockAddr { seg: 2, offset: 0, len: 100 }, bytes) }
    }

    fn bits(blocks: &[usize]) -> Vec<u64> {
        let mut b = vec![0u64; 1];
        for &x in blocks {
            mark(&mut b, x..x + 1);
        }
        b
    }

    #[test]
    fn runs_join_neighbours_and_stop_at_n() {
        assert_eq!(runs_of(&[0b1101], 4), vec![(0, 1), (2, 2)]);
        assert_eq!(runs_of(&[0b1101], 3), vec![(0, 1), (2, 1)]);
        assert_eq!(runs_of(&[1 << 63, 1], 128), vec![(63, 2)], "a run across two words");
        assert_eq!(runs_of(&[], 16), vec![]);
    }

    #[test]
    fn mark_sets_a_range_and_ignores_bits_past_the_map() {
        let mut b = vec![0u64; 1];
        mark(&mut b, 3..6);
        mark(&mut b, 62..70);
        assert_eq!(b[0], 0b111000 | 0b11 << 62);
        assert!(is_marked(&b, 4) && !is_marked(&b, 6) && !is_marked(&b, 64));
    }

    #[test]
    fn later_runs_hide_earlier_ones() {
        assert_eq!(shown(&[(0, 4)], &[(1, 2)]), vec![(0, 1), (3, 1)]);
        assert_eq!(shown(&[(0, 2)], &[(0, 4)]), vec![]);
        let ps = [patch(&[(0, 2)]), patch(&[(1, 1)])];
        assert_eq!(shows(&ps, 0), vec![(0, 1)]);
        assert_eq!(shows(&ps, 1), vec![(1, 1)]);
        assert!(covers(&[(0, 2), (4, 1)], &[(1, 1), (4, 1)]));
        assert!(!covers(&[(0, 2)], &[(1, 2)]));
    }

    #[test]
    fn visible_drops_patches_hidden_whole() {
        let ps = [patch(&[(0, 1)]), patch(&[(0, 2)]), patch(&[(5, 1)])];
        let v = visible(&ps, &[]);
        assert_eq!(v, vec![&ps[1], &ps[2]], "the first is under the second");
        let v = visible(&ps, &[(5, 1)]);
        assert_eq!(v, vec![&ps[1]], "and a later write hides the third");
    }

    #[test]
    fn replaced_share_counts_overlaps_once() {
        let len = 16 * PATCH_BLOCK;
        assert_eq!(replaced_share(&[patch(&[(0, 8)])], 1000, len), 500);
        assert_eq!(replaced_share(&[patch(&[(0, 8)]), patch(&[(4, 4)])], 1000, len), 500);
        assert_eq!(replaced_share(&[patch(&[(0, 4)]), patch(&[(12, 4)])], 1000, len), 500);
        assert_eq!(replaced_share(&[], 1000, len), 0);
    }

    #[test]
    fn a_small_overwrite_of_a_stored_chunk_is_a_patch() {
        let len = CS as usize;
        assert_eq!(plan(Some(&own(CS as u32)), len, &bits(&[3, 4]), CS, false), Some(vec![(3, 2)]));
    }

    #[test]
    fn whole_when_nothing_stored_inline_or_resized() {
        let t = bits(&[0]);
        assert_eq!(plan(None, CS as usize, &t, CS, false), None);
        assert_eq!(plan(Some(&Extent::Inline(vec![1; 100])), 100, &t, CS, false), None);
        assert_eq!(plan(Some(&own(CS as u32)), CS as usize - 1, &t, CS, false), None, "the length changed");
        assert_eq!(plan(Some(&own(CS as u32)), CS as usize, &[0], CS, false), None, "nothing written");
    }

    #[test]
    fn whole_when_half_the_chunk_or_past_the_share_is_written() {
        let len = CS as usize;
        let half: Vec<usize> = (0..8).collect();
        assert_eq!(plan(Some(&own(CS as u32)), len, &bits(&half), CS, false), None);
        // 7 blocks now, over 6 of older patches still shown: 13 of 16 is
        // past three quarters.
        let old =
            Extent::Patched { base: Box::new(own(CS as u32)), patches: vec![patch(&[(8, 6)])], freed: 0 };
        let seven: Vec<usize> = (0..7).collect();
        assert_eq!(plan(Some(&old), len, &bits(&seven), CS, false), None);
        assert_eq!(plan(Some(&old), len, &bits(&[0, 1, 2, 3, 4, 5]), CS, false).map(|r| r.len()), Some(1));
        // The same over a base that is gone: the share does not apply.
        let gone = Extent::Patched {
            base: Box::new(Extent::Gone(CS as u32)),
            patches: vec![patch(&[(8, 6)])],
            freed: 0,
        };
        assert_eq!(plan(Some(&gone), len, &bits(&seven), CS, false), Some(vec![(0, 7)]));
    }

    #[test]
    fn whole_at_the_patch_limit_and_any_share_while_cleaning() {
        let ps: Vec<Patch> = (0..MAX_PATCHES as u32).map(|b| patch(&[(b % 16, 1)])).collect();
        let full = Extent::Patched { base: Box::new(Extent::Gone(CS as u32)), patches: ps, freed: 0 };
        // Block 0 hides the first patch only: 15 still show, plus this one.
        assert_eq!(plan(Some(&full), CS as usize, &bits(&[0]), CS, false), Some(vec![(0, 1)]));
        let many: Vec<Patch> =
            (0..MAX_PATCHES as u32).map(|_| patch(&[(9, 1)])).chain([patch(&[(1, 1)])]).collect();
        let at_limit = Extent::Patched { base: Box::new(Extent::Gone(CS as u32)), patches: many, freed: 0 };
        assert_eq!(
            plan(Some(&at_limit), CS as usize, &bits(&[2]), CS, false),
            Some(vec![(2, 1)]),
            "the hidden ones do not count"
        );
        // A chunk of 32 blocks with 16 patches that all show: one more
        // that hides none is past the limit.
        let ps: Vec<Patch> = (0..MAX_PATCHES as u32).map(|b| patch(&[(b, 1)])).collect();
        let sixteen = Extent::Patched { base: Box::new(Extent::Gone(2 * CS as u32)), patches: ps, freed: 0 };
        assert_eq!(plan(Some(&sixteen), 2 * CS as usize, &bits(&[20]), 2 * CS, false), None);
        assert_eq!(plan(Some(&sixteen), 2 * CS as usize, &bits(&[15]), 2 * CS, false), Some(vec![(15, 1)]));
        let half: Vec<usize> = (0..12).collect();
        assert_eq!(plan(Some(&own(CS as u32)), CS as usize, &bits(&half), CS, true), Some(vec![(0, 12)]));
    }
}
