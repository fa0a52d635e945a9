//! Scrub: read every stored block of file data from the device and
//! verify its checksum, a page of chunks at a time, at a rate limit, so
//! that a mounted file system goes on serving meanwhile (fsck, which
//! checks cross-references too, holds the file system for its whole run).
//! A block that fails is reported with the files and byte ranges whose
//! data it holds, unless it was moved or freed since it was listed (then
//! it is not damage: the cleaner or a writer got there first). The
//! index's own blocks are verified last.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use zlogfs_engine::BlockAddr;

use crate::check::path_of;
use crate::error::Result;
use crate::keys::{
    all_extents_range, all_held_range, held_range_in, key_after, parse_extent_key, parse_held_key, Extent,
    Ino,
};
use crate::ops::data::extent_blocks;
use crate::Fs;

/// Chunks listed per page (the file system is held while it is listed).
const PAGE: usize = 4096;

/// How to scrub.
#[derive(Debug, Clone, Default)]
pub struct ScrubOptions {
    /// Read at most this many bytes per second (None: as fast as the
    /// device goes).
    pub rate: Option<u64>,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Blocks read and verified.
    pub blocks: u64,
    /// Their stored bytes.
    pub bytes: u64,
    /// About how many stored bytes there are to read (the log's live
    /// bytes when the scrub began).
    pub total: u64,
    /// Blocks that failed but had been moved or freed by then.
    pub moved: u64,
    /// Each damaged block: what failed, and the data it holds.
    pub damaged: Vec<String>,
}

impl Fs {
    /// Scrub the file system; `progress` sees the report after each block.
    pub fn scrub(&self, opts: &ScrubOptions, progress: &dyn Fn(&ScrubReport)) -> Result<ScrubReport> {
        let mut rep = ScrubReport { total: self.eng.stats().live_bytes, ..ScrubReport::default() };
        let start = Instant::now();
        let (mut lo, hi) = all_extents_range();
        loop {
            let page = self.scrub_page(&lo, &hi)?;
            for (a, users) in &page.blocks {
                self.pace(opts, &rep, start);
                match self.eng.read_block(*a) {
                    Ok(_) => {}
                    Err(e) => self.damaged(*a, users, &e.to_string(), &mut rep)?,
                }
                rep.blocks += 1;
                rep.bytes += u64::from(a.len);
                progress(&rep);
            }
            match page.next {
                Some(k) => lo = k,
                None => break,
            }
        }
        self.scrub_held(opts, start, &mut rep, progress)?;
        for d in self.eng.verify_runs() {
            rep.damaged.push(format!("index run {}, block {}: {}", d.run, d.addr, d.error));
        }
        Ok(rep)
    }

    /// Verify the blocks kept for snapshots (held): a damaged one is
    /// reported with the snapshots that read it, unless it was moved or
    /// freed meanwhile.
    fn scrub_held(
        &self,
        opts: &ScrubOptions,
        start: Instant,
        rep: &mut ScrubReport,
        progress: &dyn Fn(&ScrubReport),
    ) -> Result<()> {
        // The blocks, not every held part of them (issue 45: a million
        // deletes kept for history are a million held frees): keys order
        // the frees by block, and pages release the lock between them.
        let (mut lo, hi) = all_held_range();
        let mut starts: Vec<(u32, u32)> = Vec::new();
        loop {
            let page = self.st_after_requests().scan(&lo, &hi, PAGE)?;
            let Some((last, _)) = page.last() else { break };
            lo = key_after(last);
            for (a, _, _) in page.iter().filter_map(|(k, _)| parse_held_key(k)) {
                if starts.last() != Some(&(a.seg, a.offset)) {
                    starts.push((a.seg, a.offset));
                }
            }
        }
        for (seg, offset) in starts {
            self.pace(opts, rep, start);
            let r = self.eng.block_at(seg, offset).and_then(|a| self.eng.read_block(a).map(|_| a));
            match r {
                Ok(a) => rep.bytes += u64::from(a.len),
                Err(e) => {
                    let (lo, hi) = held_range_in(seg);
                    let still = self
                        .st()
                        .scan(&lo, &hi, usize::MAX)?
                        .iter()
                        .any(|(k, _)| parse_held_key(k).is_some_and(|(a, _, _)| a.offset == offset));
                    if still {
                        rep.damaged.push(format!("block {seg}:{offset}, kept for snapshots: {e}"));
                    } else {
                        rep.moved += 1;
                    }
                }
            }
            rep.blocks += 1;
            progress(rep);
        }
        Ok(())
    }

    /// The blocks of the next page of chunks from `lo`, each with the
    /// chunks that read it; and the key to go on from.
    fn scrub_page(&self, lo: &[u8], hi: &[u8]) -> Result<Page> {
        let st = self.st_after_requests();
        let found = st.scan(lo, hi, PAGE)?;
        let next = (found.len() >= PAGE).then(|| found.last().map(|(k, _)| key_after(k))).flatten();
        let mut blocks: BTreeMap<BlockAddr, Vec<(Ino, u64)>> = BTreeMap::new();
        let mut out = Vec::new();
        for (k, v) in found {
            let Some((ino, idx)) = parse_extent_key(&k) else { continue };
            // fsck reports a chunk record that does not decode.
            let Ok(e) = Extent::decode(&v, "chunk") else { continue };
            out.clear();
            extent_blocks(&e, &mut out);
            for a in &out {
                blocks.entry(*a).or_default().push((ino, idx));
            }
        }
        Ok(Page { blocks, next })
    }

    /// Sleep as long as keeps the scrub under its rate.
    fn pace(&self, opts: &ScrubOptions, rep: &ScrubReport, start: Instant) {
        if let Some(rate) = opts.rate.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(rep.bytes as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }

    /// Block `a` failed with `why`: damage if a chunk of `users` still
    /// reads it, with those chunks' files (their paths found then) and
    /// bytes.
    fn damaged(&self, a: BlockAddr, users: &[(Ino, u64)], why: &str, rep: &mut ScrubReport) -> Result<()> {
        let st = self.st();
        let mut still = Vec::new();
        let mut out = Vec::new();
        for &(ino, idx) in users {
            out.clear();
            if let Some(e) = st.stored_extent(ino, idx)? {
                extent_blocks(&e, &mut out);
            }
            if out.contains(&a) {
                still.push((ino, idx));
            }
        }
        if still.is_empty() {
            rep.moved += 1;
            return Ok(());
        }
        let files: Vec<String> = still
            .iter()
            .map(|&(i, c)| {
                let cs = st.inode(i).map_or(st.group.chunk_size(), |f| st.cs(&f));
                format!("{} (bytes {}..{})", path_of(&st, i), c * cs, (c + 1) * cs)
            })
            .collect();
        // `why` names the block.
        let d = format!("{why}; it holds data of {}", files.join(", "));
        tracing::error!("scrub: {d}");
        rep.damaged.push(d);
        Ok(())
    }
}

/// A page of chunks' blocks.
struct Page {
    blocks: BTreeMap<BlockAddr, Vec<(Ino, u64)>>,
    next: Option<Vec<u8>>,
}
