//! Blocks kept for snapshots, moved by the cleaner (step 5 of
//! docs/decisions/2026-11-25-history-design.md): a held block in a victim
//! segment is copied as it is stored (no decompression: the same bytes
//! and checksum) and a forward record names the copy; reads as of a point
//! before the move follow the forward records. The records of the
//! present never name held blocks, so reads of the present never look.

use std::collections::BTreeMap;

use zlogfs_engine::engine::Room;
use zlogfs_engine::BlockAddr;

use crate::error::{Error, Result};
use crate::keys::*;
use crate::state::pending::{del_bytes, put_bytes, FREE_BYTES};
use crate::state::State;

/// Forward records followed at most for one read (a block moved this many
/// times since a point is a damaged chain).
const MAX_HOPS: usize = 4096;

/// A held part of a block: its record's key and value, the part, died, n.
type HeldPart = (Vec<u8>, Vec<u8>, BlockAddr, u64, u32);

/// Journal bytes that moving a block with held parts `parts` adds to the
/// group, at most: per part its old record deleted, its new one put and
/// its free; per block a forward record and the free of parts no snapshot
/// held.
fn moved_bytes(parts: &[HeldPart]) -> usize {
    let per_part: usize =
        parts.iter().map(|(k, v, ..)| del_bytes(k.len()) + put_bytes(k.len(), v.len()) + FREE_BYTES).sum();
    per_part + FORWARD_BYTES + FREE_BYTES
}

/// Journal bytes of a forward record: its 17-byte key and an address.
const FORWARD_BYTES: usize = put_bytes(17, 12);

impl State {
    /// Where block `a`, named by a record read as of the point this state
    /// reads at, lies now: `a` itself for the present.
    pub(crate) fn forward(&self, a: BlockAddr) -> Result<BlockAddr> {
        let Some(point) = self.at else { return Ok(a) };
        let (mut cur, mut after) = (a, point);
        for _ in 0..MAX_HOPS {
            let (lo, hi) = forward_range(cur.seg, cur.offset, after);
            // Forward records are written after the point: read the present.
            match self.eng.scan(&lo, Some(&hi), 1)?.into_iter().next() {
                None => return Ok(cur),
                Some((k, v)) => {
                    let (_, _, moved) = parse_forward_key(&k)
                        .ok_or_else(|| Error::corrupt(describe_key(&k), "a malformed key"))?;
                    cur = decode_addr(&v, &describe_key(&k))?;
                    after = moved;
                }
            }
        }
        Err(Error::corrupt(format!("the forward records of block {a}"), "they do not end"))
    }

    /// Copy the held blocks of segment `seg` elsewhere as they are stored,
    /// in the pending group: each held part's record names the copy, the
    /// old parts are freed (whatever snapshots exist: the copy holds them),
    /// and a forward record leads from the old place to the copy. The
    /// caller commits at once (the forward records carry the group's first
    /// sequence number); a segment of many held blocks is committed here
    /// too, a slice of blocks at a time, so that no group outgrows a
    /// journal block. Returns the stored bytes copied.
    pub(crate) fn move_held(&mut self, seg: u32) -> Result<u64> {
        let (lo, hi) = held_range_in(seg);
        let mut blocks: BTreeMap<u32, Vec<HeldPart>> = BTreeMap::new();
        for (k, v) in self.scan(&lo, &hi, usize::MAX)? {
            let (a, died, n) = parse_held_key(&k)
                .ok_or_else(|| Error::corrupt(describe_key(&k), "a malformed held free"))?;
            blocks.entry(a.offset).or_default().push((k, v, a, died, n));
        }
        if blocks.is_empty() {
            return Ok(0);
        }
        self.held_blocks_move();
        let mut whole = Vec::with_capacity(blocks.len());
        for (&offset, parts) in &blocks {
            let block = self.eng.block_at(seg, offset)?;
            let len = block.len;
            let held: u64 = parts.iter().map(|p| u64::from(p.2.len)).sum();
            if held > u64::from(len) {
                return Err(Error::corrupt(
                    format!("block at {seg}:{offset}"),
                    format!("{held} bytes of it are held, but it has {len}"),
                ));
            }
            whole.push(block);
        }
        let bytes = whole.iter().map(|a| u64::from(a.len)).sum();
        let mut parts: Vec<Vec<HeldPart>> = blocks.into_values().collect();
        // Slices whose records stay within a quarter of the group's bound;
        // the group is committed first when it and the slice could pass
        // the bound (half a journal block: the estimates are upper bounds).
        let max = self.group.max_bytes();
        let budget = max / 4;
        let mut start = 0;
        while start < whole.len() {
            let (mut end, mut est) = (start, 0);
            while let Some(p) = parts.get(end - start) {
                let n = moved_bytes(p);
                if end > start && est + n > budget {
                    break;
                }
                est += n;
                end += 1;
            }
            if self.group.bytes() + est > max {
                self.commit_as(Room::Clean)?;
            }
            let slice_parts = parts.drain(..end - start).collect();
            self.move_held_slice(&whole[start..end], slice_parts)?;
            start = end;
        }
        Ok(bytes)
    }

    /// [`State::move_held`] for the held blocks `whole` with their held
    /// parts, in the pending group (committed next).
    fn move_held_slice(&mut self, whole: &[BlockAddr], parts: Vec<Vec<HeldPart>>) -> Result<()> {
        // Moving data down, held blocks go down too.
        let to = self.demoting.then_some(zlogfs_engine::Tier::Bulk);
        let copies = self.eng.copy_blocks(Room::Clean, whole, to)?;
        let moved = self.eng.seq() + 1;
        self.group.placed(&copies, moved);
        for ((parts, old), new) in parts.into_iter().zip(whole).zip(copies) {
            let mut held = 0;
            for (k, born, part, died, n) in parts {
                self.del(k);
                self.group.release(part);
                // The copy is the block: born when it was.
                self.put(held_key(BlockAddr { len: part.len, ..new }, died, n), born);
                held += part.len;
            }
            if held < new.len {
                // Parts freed before any snapshot held them: the copy
                // counts them, nothing reads them.
                self.group.release(BlockAddr { len: new.len - held, ..new });
            }
            self.put(forward_key(old.seg, old.offset, moved), encode_addr(new));
        }
        Ok(())
    }

    /// Delete the forward records no snapshot can follow: those of moves
    /// at or before the oldest snapshot (all when none is left), in the
    /// pending group.
    pub(crate) fn drop_forwards(&mut self) -> Result<()> {
        let oldest = self.group.snapshots().first().copied().unwrap_or(u64::MAX);
        let (lo, hi) = all_forward_range();
        for (k, _) in self.scan(&lo, &hi, usize::MAX)? {
            match parse_forward_key(&k) {
                Some((_, _, moved)) if moved <= oldest => {
                    self.del(k);
                    // Each group must fit one journal block: however many
                    // forwards go, they go in groups that do.
                    if self.group_full() {
                        self.commit()?;
                    }
                }
                Some(_) => {}
                None => return Err(Error::corrupt(describe_key(&k), "a malformed key")),
            }
        }
        Ok(())
    }
}
