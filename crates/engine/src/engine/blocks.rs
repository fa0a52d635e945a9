//! Data blocks: compressed on all cores, checksummed, placed in the log;
//! read and verified.

use rayon::prelude::*;

use crate::bytes::Reader;
use crate::codec::CodecSpec;
use crate::error::{Error, Result};
use crate::log::format::*;
use crate::log::{self, max_block_raw, NewBlock, Tier};

use super::{lock, Engine, Room};

/// A data block to place in the log ([`Engine::write_blocks`]).
pub struct BlockWrite<'a> {
    /// Its owner in the summary: the inode of file data, 0 for a block
    /// shared by several.
    pub owner: u64,
    /// Its codec.
    pub spec: CodecSpec,
    /// Its bytes.
    pub raw: &'a [u8],
    /// The same owner, codec and bytes encoded already
    /// ([`Engine::encode_data`]), or None to compress it now.
    pub ready: Option<EncodedBlock>,
    /// The head of the log it goes to (with two devices, which one).
    pub tier: Tier,
}

impl<'a> BlockWrite<'a> {
    /// A block of `owner`, to compress with `spec`.
    pub fn new(owner: u64, spec: CodecSpec, raw: &'a [u8]) -> BlockWrite<'a> {
        BlockWrite { owner, spec, raw, ready: None, tier: Tier::Fast }
    }

    /// The block, to go to the head of `tier`.
    pub fn on(mut self, tier: Tier) -> BlockWrite<'a> {
        self.tier = tier;
        self
    }
}

/// A data block compressed and checksummed ahead of its write
/// ([`Engine::encode_data`]).
pub struct EncodedBlock(NewBlock);

impl Engine {
    /// Place data blocks in the log, compressing on all cores those that
    /// were not encoded ahead; returns their addresses, in order. They are
    /// durable with the next sync; a [`WriteBatch`](super::WriteBatch)
    /// must reference them to keep them. `room` is the class of the write
    /// (how much of the reserve it may use: [`Room::User`] for writers,
    /// [`Room::Clean`] for the cleaner's copies). NoSpace comes before
    /// any block is placed.
    pub fn write_blocks(&self, room: Room, blocks: Vec<BlockWrite<'_>>) -> Result<Vec<BlockAddr>> {
        self.check_ok()?;
        let max = max_block_raw(self.sh.sb.geometry);
        if let Some(b) = blocks.iter().find(|b| b.raw.len() > max) {
            return Err(Error::Invalid(format!("block of {} bytes exceeds {max}", b.raw.len())));
        }
        let blocks: Vec<NewBlock> = blocks
            .into_par_iter()
            .map(|b| match b.ready {
                Some(EncodedBlock(e)) => e.on(b.tier),
                None => NewBlock::encode(BlockKind::Data, b.owner, b.spec, b.raw).on(b.tier),
            })
            .collect();
        self.relieve(blocks.iter().map(|b| b.bytes().len()).sum())?;
        let mut core = lock(&self.sh.core);
        let r = core.log.add_blocks(blocks, room);
        self.latch(&core, r)
    }

    /// Encode a data block now (compress and checksum it), to be written
    /// later by [`Engine::write_blocks`] as a [`BlockWrite`]'s `ready`
    /// block: what it would make of the same owner, codec and bytes.
    pub fn encode_data(owner: u64, spec: CodecSpec, raw: &[u8]) -> EncodedBlock {
        EncodedBlock(NewBlock::encode(BlockKind::Data, owner, spec, raw))
    }

    /// Place copies of data blocks `addrs` (whole blocks) in the log as
    /// they are stored: no decompression, the same bytes and checksum,
    /// each verified on the way. Returns the copies' addresses, in order;
    /// like [`Engine::write_blocks`], a batch must reference them.
    /// With two devices, the copies go to device `to`, or (None) to the
    /// one each block is on.
    pub fn copy_blocks(&self, room: Room, addrs: &[BlockAddr], to: Option<Tier>) -> Result<Vec<BlockAddr>> {
        self.check_ok()?;
        let mut blocks = Vec::with_capacity(addrs.len());
        for &a in addrs {
            let pending = lock(&self.sh.core).log.read_pending(a);
            let sealed = match pending {
                Some(b) => b,
                None => log::read_sealed(self.sh.store.as_ref(), a)?,
            };
            let tier = to.unwrap_or_else(|| lock(&self.sh.core).log.tier_of(a.seg));
            blocks.push(NewBlock::verbatim(BlockKind::Data, 0, sealed, a)?.on(tier));
        }
        self.relieve(blocks.iter().map(|b| b.bytes().len()).sum())?;
        let mut core = lock(&self.sh.core);
        let r = core.log.add_blocks(blocks, room);
        self.latch(&core, r)
    }

    /// The whole block that starts at `seg`, `offset` (its length from its
    /// header, which is not verified here: reading the block does).
    pub fn block_at(&self, seg: u32, offset: u32) -> Result<BlockAddr> {
        let h = self.block_header(BlockAddr { seg, offset, len: BLOCK_HEADER_SIZE as u32 })?;
        let len = h.stored_len.checked_add(BLOCK_HEADER_SIZE as u32).ok_or_else(|| {
            Error::corrupt(
                format!("block at {seg}:{offset}"),
                format!("stored length {} out of range", h.stored_len),
            )
        })?;
        Ok(BlockAddr { seg, offset, len })
    }

    /// Read and verify a data block.
    pub fn read_block(&self, addr: BlockAddr) -> Result<Vec<u8>> {
        let pending = lock(&self.sh.core).log.read_pending(addr);
        match pending {
            Some(buf) => log::decode_block(&buf, addr, BlockKind::Data),
            None => log::read_block(self.sh.store.as_ref(), addr, BlockKind::Data),
        }
    }

    /// The header of a data block (codec, level, raw reason, lengths), read
    /// without its payload and so without checking its crc: for reports.
    pub fn block_header(&self, addr: BlockAddr) -> Result<BlockHeader> {
        let mut buf = [0u8; BLOCK_HEADER_SIZE];
        let pending = lock(&self.sh.core).log.read_pending(addr);
        match pending {
            Some(b) if b.len() >= BLOCK_HEADER_SIZE => buf.copy_from_slice(&b[..BLOCK_HEADER_SIZE]),
            _ => {
                let g = self.sh.sb.geometry;
                if addr.seg >= g.segment_count
                    || u64::from(addr.offset) + BLOCK_HEADER_SIZE as u64 > u64::from(g.segment_size)
                {
                    return Err(Error::corrupt(
                        format!("reference to block at {addr}"),
                        "outside the device",
                    ));
                }
                self.sh
                    .store
                    .read(addr.seg, addr.offset, &mut buf)
                    .map_err(|e| Error::io(format!("reading block header at {addr}"), e))?;
            }
        }
        BlockHeader::parse(&mut Reader::new(&buf, &format!("block header at {addr}")))
    }
}
