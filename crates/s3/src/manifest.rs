//! The manifest: the one object that says what the image in a bucket is.
//! Manifests are numbered and created only if absent, so creating number
//! `n + 1` is a compare-and-swap on the image's state: of two writers that
//! both read `n`, one succeeds and the other learns it lost (fencing). The
//! newest manifest holds the metadata slots (superblock, checkpoints) and,
//! for each segment, the pieces of its current generation in the bucket.
//! Layout: docs/FORMAT.md §10.

use zlogfs_engine::store::{Geometry, META_SLOT_SIZE};

/// First bytes of every manifest.
pub const MAGIC: &[u8; 8] = b"ZLGMANIF";
/// The manifest version this build writes and reads.
pub const VERSION: u32 = 1;
/// The metadata slots a manifest carries, in order: superblock,
/// checkpoint A, checkpoint B, superblock copy (their slot indexes).
pub const SLOTS: [u64; 4] = [0, 1, 2, 15];
const HEADER: usize = 72;
/// Most segments an image in a bucket has (16 TiB of 4 MiB segments): the
/// store keeps a few dozen bytes per segment in memory.
pub const MAX_SEGMENTS: u32 = 1 << 22;

/// What is wrong with a manifest's bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    /// Not a manifest, or cut short.
    #[error("not a zlogfs manifest ({0})")]
    NotManifest(&'static str),
    /// Written by a newer build.
    #[error("manifest version {0}; this build reads version {VERSION}: use a newer zlogfs")]
    Version(u32),
    /// The checksum does not match: the object is damaged.
    #[error("manifest checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        /// The crc the object ends with.
        stored: u32,
        /// The crc of its bytes.
        computed: u32,
    },
    /// A field is out of range.
    #[error("manifest field out of range: {0}")]
    Invalid(String),
}

/// One uploaded piece of a segment: its bytes `[offset, offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Where in the segment it starts.
    pub offset: u32,
    /// Its length (> 0).
    pub len: u32,
    /// The epoch of the writer that uploaded it.
    pub epoch: u64,
    /// That writer's random id: with the epoch, part of the piece's name,
    /// so that no two writers ever create the same object (not even two
    /// that tried to claim the same epoch).
    pub writer: u64,
}

impl Piece {
    /// Where it ends.
    pub fn end(&self) -> u32 {
        self.offset + self.len
    }
}

/// One segment's current contents in the bucket.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegObjects {
    /// Generation: a new one each time the segment is written again from
    /// offset 0. Its high 32 bits are the epoch of the writer that began it.
    pub gen: u64,
    /// Its pieces, contiguous from offset 0.
    pub pieces: Vec<Piece>,
}

impl SegObjects {
    /// Bytes `[0, end)` of the segment are in the bucket.
    pub fn end(&self) -> u32 {
        self.pieces.last().map_or(0, Piece::end)
    }
}

/// A decoded manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Its number (its object's name).
    pub number: u64,
    /// The epoch of the writer that wrote it: the number of the manifest
    /// with which that writer claimed the image.
    pub epoch: u64,
    /// That writer's random id (two writers that tried to claim the same
    /// number wrote different manifests).
    pub writer: u64,
    /// Random, fixed at mkfs: tells a cache directory which image it holds.
    pub image_id: [u8; 16],
    /// The segment space.
    pub geometry: Geometry,
    /// The metadata slots of [`SLOTS`], zeros when never written.
    pub slots: Vec<[u8; META_SLOT_SIZE]>,
    /// Per segment (index = segment number).
    pub segs: Vec<SegObjects>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Manifest {
    /// An empty image's manifest: no segment written yet.
    pub fn new(number: u64, image_id: [u8; 16], geometry: Geometry) -> Manifest {
        Manifest {
            number,
            epoch: number,
            writer: 0,
            image_id,
            geometry,
            slots: vec![[0u8; META_SLOT_SIZE]; SLOTS.len()],
            segs: vec![SegObjects::default(); geometry.segment_count as usize],
        }
    }

    /// The bytes of the object.
    pub fn encode(&self) -> Vec<u8> {
        let used: Vec<(usize, &SegObjects)> =
            self.segs.iter().enumerate().filter(|(_, s)| !s.pieces.is_empty()).collect();
        let mut b = Vec::with_capacity(HEADER + SLOTS.len() * META_SLOT_SIZE + used.len() * 40 + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.number.to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.writer.to_le_bytes());
        b.extend_from_slice(&self.image_id);
        b.extend_from_slice(&self.geometry.segment_size.to_le_bytes());
        b.extend_from_slice(&self.geometry.segment_count.to_le_bytes());
        b.extend_from_slice(&(used.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for s in &self.slots {
            b.extend_from_slice(s);
        }
        for (seg, s) in used {
            b.extend_from_slice(&(seg as u32).to_le_bytes());
            b.extend_from_slice(&(s.pieces.len() as u32).to_le_bytes());
            b.extend_from_slice(&s.gen.to_le_bytes());
            for p in &s.pieces {
                b.extend_from_slice(&p.offset.to_le_bytes());
                b.extend_from_slice(&p.len.to_le_bytes());
                b.extend_from_slice(&p.epoch.to_le_bytes());
                b.extend_from_slice(&p.writer.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode and check an object's bytes. Never panics.
    pub fn decode(b: &[u8]) -> Result<Manifest, ManifestError> {
        let fixed = HEADER + SLOTS.len() * META_SLOT_SIZE + 4;
        if b.len() < 12 || &b[..8] != MAGIC {
            return Err(ManifestError::NotManifest("no magic"));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(ManifestError::Version(version));
        }
        if b.len() < fixed {
            return Err(ManifestError::NotManifest("cut short"));
        }
        let body = b.len() - 4;
        let (stored, computed) = (u32_at(b, body), crc32c::crc32c(&b[..body]));
        if stored != computed {
            return Err(ManifestError::Checksum { stored, computed });
        }
        let mut image_id = [0u8; 16];
        image_id.copy_from_slice(&b[40..56]);
        let geometry = Geometry { segment_size: u32_at(b, 56), segment_count: u32_at(b, 60) };
        zlogfs_engine::validate_geometry(geometry).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        if geometry.segment_count > MAX_SEGMENTS {
            return Err(ManifestError::Invalid(format!(
                "{} segments (at most {MAX_SEGMENTS})",
                geometry.segment_count
            )));
        }
        let nsegs = u32_at(b, 64) as usize;
        let mut slots = Vec::with_capacity(SLOTS.len());
        for i in 0..SLOTS.len() {
            let at = HEADER + i * META_SLOT_SIZE;
            let mut s = [0u8; META_SLOT_SIZE];
            s.copy_from_slice(&b[at..at + META_SLOT_SIZE]);
            slots.push(s);
        }
        let mut segs = vec![SegObjects::default(); geometry.segment_count as usize];
        let mut at = HEADER + SLOTS.len() * META_SLOT_SIZE;
        for _ in 0..nsegs {
            if at + 16 > body {
                return Err(ManifestError::NotManifest("segment table cut short"));
            }
            let (seg, n, gen) = (u32_at(b, at), u32_at(b, at + 4) as usize, u64_at(b, at + 8));
            at += 16;
            if n.saturating_mul(24) > body - at {
                return Err(ManifestError::NotManifest("piece table cut short"));
            }
            let slot = segs.get_mut(seg as usize).ok_or_else(|| {
                ManifestError::Invalid(format!("segment {seg} of {}", geometry.segment_count))
            })?;
            if !slot.pieces.is_empty() || n == 0 {
                return Err(ManifestError::Invalid(format!(
                    "segment {seg}: listed twice, or without pieces"
                )));
            }
            let mut end = 0u32;
            for _ in 0..n {
                let (o, l) = (u32_at(b, at), u32_at(b, at + 4));
                let (epoch, writer) = (u64_at(b, at + 8), u64_at(b, at + 16));
                at += 24;
                let fits =
                    o == end && l > 0 && u64::from(o) + u64::from(l) <= u64::from(geometry.segment_size);
                if !fits {
                    return Err(ManifestError::Invalid(format!("segment {seg}: piece at {o} of {l} bytes")));
                }
                end = o + l;
                slot.pieces.push(Piece { offset: o, len: l, epoch, writer });
            }
            slot.gen = gen;
        }
        if at != body {
            return Err(ManifestError::Invalid(format!("{} bytes after the segment table", body - at)));
        }
        Ok(Manifest {
            number: u64_at(b, 16),
            epoch: u64_at(b, 24),
            writer: u64_at(b, 32),
            image_id,
            geometry,
            slots,
            segs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn p(offset: u32, len: u32, epoch: u64) -> Piece {
        Piece { offset, len, epoch, writer: epoch * 7 }
    }

    fn sample() -> Manifest {
        let g = Geometry { segment_size: 1 << 20, segment_count: 8 };
        let mut m = Manifest::new(7, [3; 16], g);
        m.epoch = 5;
        m.writer = 99;
        m.slots[1][0] = 9;
        m.segs[2] = SegObjects { gen: 5 << 32 | 1, pieces: vec![p(0, 4096, 5), p(4096, 100, 6)] };
        m.segs[7] = SegObjects { gen: 2 << 32, pieces: vec![p(0, 1 << 20, 2)] };
        m
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.segs[2].end(), 4196);
    }

    #[test]
    fn damage_is_reported() {
        let b = sample().encode();
        let mut bad = b.clone();
        bad[70] ^= 1;
        assert!(matches!(Manifest::decode(&bad), Err(ManifestError::Checksum { .. })));
        let mut newer = b.clone();
        newer[8] = 2;
        assert_eq!(Manifest::decode(&newer), Err(ManifestError::Version(2)));
        assert!(Manifest::decode(&b[..b.len() - 1]).is_err());
        assert!(Manifest::decode(b"ZLGMANIF").is_err());
    }

    #[test]
    fn pieces_must_be_contiguous_and_inside() {
        let mut m = sample();
        m.segs[2].pieces = vec![p(0, 10, 1), p(20, 10, 1)];
        assert!(matches!(Manifest::decode(&m.encode()), Err(ManifestError::Invalid(_))));
        m.segs[2].pieces = vec![p(0, (1 << 20) + 1, 1)];
        assert!(matches!(Manifest::decode(&m.encode()), Err(ManifestError::Invalid(_))));
    }

    /// Random damage never panics (the checksum is recomputed so that the
    /// parser behind it is reached).
    #[test]
    fn random_bytes_never_panic() {
        let seed = zlogfs_testkit::seed("manifest damage");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let good = sample().encode();
        for _ in 0..2000 {
            let mut b = good.clone();
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..b.len() - 4);
                b[i] = rng.gen();
            }
            if rng.gen_bool(0.3) {
                b.truncate(rng.gen_range(0..b.len()));
            }
            if b.len() >= 4 {
                let n = b.len() - 4;
                let crc = crc32c::crc32c(&b[..n]);
                b[n..].copy_from_slice(&crc.to_le_bytes());
            }
            let _ = Manifest::decode(&b);
        }
    }
}
