//! Extended attributes: the user., trusted. and security. namespaces,
//! POSIX ACLs (kept consistent with the mode), and zlogfs's own
//! `user.zlogfs.*` names (a file's codec policy, its stored bytes, the
//! cleaner's report and trigger).

use zlogfs_engine::codec::CodecSpec;

use crate::error::{Error, Result};
use crate::event::What;
use crate::keys::*;
use crate::ops::acl;
use crate::ops::namespace::name_str;
use crate::state::State;
use crate::time::now;
use crate::{
    Fs, XATTR_CHUNK, XATTR_CODEC, XATTR_COLD, XATTR_CREATE, XATTR_KILL_SGID, XATTR_PHYSICAL, XATTR_REPLACE,
    XATTR_TIER, XATTR_UNIT,
};

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::out_of_range(format!("xattr name of {} bytes (1 to 255 allowed)", name.len())));
    }
    let ok = [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default";
    if !ok {
        return Err(Error::not_supported(format!(
            "xattr {:?} is outside the user., trusted., security. namespaces and POSIX ACLs",
            name_str(name)
        )));
    }
    Ok(())
}

impl State {
    fn xattr_limit(&self) -> usize {
        (self.group.max_bytes() / 8).min(zlogfs_engine::MAX_VALUE)
    }

    /// Set (Some) or clear inode `i`'s own chunk size: any time on a
    /// directory, on a regular file only while it holds no data.
    fn set_chunk(&self, i: &mut Inode, chunk: Option<u32>) -> Result<()> {
        let ino = i.ino;
        match i.kind() {
            Kind::Dir => {}
            Kind::File => {
                let (lo, hi) = extents_from(ino, 0);
                if i.alloc != 0
                    || self.bufs.next_from(ino, 0).is_some()
                    || !self.scan(&lo, &hi, 1)?.is_empty()
                {
                    return Err(Error::invalid(format!(
                        "inode {ino} holds data: its chunk size is set while it has none (before the first write)"
                    )));
                }
            }
            k => {
                return Err(Error::invalid(format!(
                    "inode {ino} is a {k:?}: only files and directories have a chunk size"
                )))
            }
        }
        i.chunk = chunk;
        Ok(())
    }
}

/// A chunk size given as an xattr value: bytes, or with K, KiB or M.
fn parse_chunk(value: &[u8], image: u32) -> Result<u32> {
    parse_pow2("chunk size", value, image)
}

/// A compression unit given as an xattr value, as a chunk size.
fn parse_unit(value: &[u8]) -> Result<u32> {
    parse_pow2("compression unit", value, MAX_UNIT)
}

/// EINVAL unless `i` is a file or directory, the only kinds that have
/// `what`.
fn file_or_dir(i: &Inode, what: &str) -> Result<()> {
    if matches!(i.kind(), Kind::File | Kind::Dir) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "inode {} is a {:?}: only files and directories have {what}",
        i.ino,
        i.kind()
    )))
}

/// A cold form given as an xattr value: "UNIT CODEC" ("256K zstd:9").
fn parse_cold(value: &[u8]) -> Result<Cold> {
    let s = std::str::from_utf8(value).map_err(|_| Error::invalid("cold form is not UTF-8"))?.trim();
    let Some((unit, codec)) = s.split_once(char::is_whitespace) else {
        return Err(Error::invalid(format!("cold form {s:?}: give a unit and a codec, as \"256K zstd:9\"")));
    };
    let unit = parse_unit(unit.as_bytes())?;
    let spec: CodecSpec =
        codec.trim().parse().map_err(|e| Error::invalid(format!("cold form {s:?}: bad codec: {e}")))?;
    // The cleaner counts on moved data not growing much (its room
    // estimate): a cold form compresses.
    if spec.id == zlogfs_engine::codec::CodecId::None {
        return Err(Error::invalid(format!(
            "cold form {s:?}: the cold form compresses; give a codec, not none"
        )));
    }
    Ok(Cold { unit, spec: spec.normalized() })
}

/// A power of two from 4K to `max` given as an xattr value: bytes, or
/// with K, KiB or M; `what` names it in errors.
fn parse_pow2(what: &str, value: &[u8], max: u32) -> Result<u32> {
    let s = std::str::from_utf8(value).map_err(|_| Error::invalid(format!("{what} is not UTF-8")))?.trim();
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let mul: u64 = match s[digits.len()..].to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        u => return Err(Error::invalid(format!("{what} {s:?}: unknown unit {u:?} (use K or M)"))),
    };
    let n = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(mul));
    match n {
        Some(n) if n.is_power_of_two() && (u64::from(MIN_CHUNK)..=u64::from(max)).contains(&n) => {
            Ok(n as u32)
        }
        _ => Err(Error::invalid(format!("{what} {s:?}: a power of two from 4K to {}K is needed", max >> 10))),
    }
}

impl Fs {
    /// Value of an xattr. `user.zlogfs.physical` gives the stored bytes of
    /// a file, or of a directory's subtree (a walk of it, as `du`),
    /// prefixed `~` when data not committed yet is counted at its
    /// uncompressed length; `user.zlogfs.codec` the codec policy.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.st();
        let i = st.inode(ino)?;
        if name == XATTR_PHYSICAL {
            let (n, estimated) =
                if i.kind() == Kind::Dir { st.subtree_physical(ino)? } else { st.physical_now(ino)? };
            return Ok(format!("{}{n}", if estimated { "~" } else { "" }).into_bytes());
        }
        if name == XATTR_CODEC {
            return match i.policy {
                Some(p) => Ok(p.to_string().into_bytes()),
                None => Err(Error::no_attr(format!("inode {ino} has no codec policy"))),
            };
        }
        if name == XATTR_CHUNK {
            return match i.chunk {
                Some(c) => Ok(format!("{}K", c >> 10).into_bytes()),
                None => Err(Error::no_attr(format!("inode {ino} has no chunk size of its own"))),
            };
        }
        if name == XATTR_UNIT {
            return match i.unit {
                Some(u) => Ok(format!("{}K", u >> 10).into_bytes()),
                None => Err(Error::no_attr(format!("inode {ino} has no compression unit"))),
            };
        }
        if name == XATTR_COLD {
            return match i.cold {
                Some(c) => Ok(format!("{}K {}", c.unit >> 10, c.spec).into_bytes()),
                None => Err(Error::no_attr(format!("inode {ino} has no cold form"))),
            };
        }
        if name == XATTR_TIER {
            return match i.tier {
                Some(TierPolicy::Fast) => Ok(b"fast".to_vec()),
                Some(TierPolicy::Bulk) => Ok(b"bulk".to_vec()),
                None => Err(Error::no_attr(format!("inode {ino} has no device policy (auto)"))),
            };
        }
        check_xattr_name(name)?;
        st.get(&xattr_key(ino, name))?
            .ok_or_else(|| Error::no_attr(format!("inode {ino} has no xattr {:?}", name_str(name))))
    }

    /// Set an xattr ([`XATTR_CREATE`], [`XATTR_REPLACE`]).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.synced(self.setxattr_now(ino, name, value, flags), false)
    }

    fn setxattr_now(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let mut st = self.st();
        st.pre_op()?;
        st.pre_grow(name.len() + value.len() + 64)?;
        let mut i = st.inode(ino)?;
        if name == XATTR_PHYSICAL {
            return Err(Error::not_permitted("user.zlogfs.physical is read-only"));
        }
        if name == acl::ACCESS && flags & XATTR_KILL_SGID != 0 {
            i.mode &= !0o2000;
        }
        let flags = flags & !XATTR_KILL_SGID;
        if name == acl::ACCESS {
            // The mode follows the ACL (the kernel leaves that to us).
            if let Some(entries) = acl::parse(value) {
                i.mode = (i.mode & !0o777) | acl::mode_bits(&entries);
            }
            if let Some(perm) = acl::equiv_mode(value) {
                // An access ACL that says no more than the mode is the mode
                // (as on ext4): `cp -a` and `tar --acls` set one on every
                // file, and storing it would cost index bytes per file.
                i.mode = (i.mode & !0o777) | perm;
                let k = xattr_key(ino, name);
                if st.get(&k)?.is_some() {
                    st.del(k);
                }
                i.ctime = now();
                st.save(&i);
                st.note(ino, i.kind(), What::Meta);
                return Ok(());
            }
        }
        let exists = if name == XATTR_CODEC {
            i.policy.is_some()
        } else if name == XATTR_CHUNK {
            i.chunk.is_some()
        } else if name == XATTR_TIER {
            i.tier.is_some()
        } else if name == XATTR_UNIT {
            i.unit.is_some()
        } else if name == XATTR_COLD {
            i.cold.is_some()
        } else {
            check_xattr_name(name)?;
            if value.len() > st.xattr_limit() {
                return Err(Error::value_too_big(format!(
                    "xattr value of {} bytes exceeds {}",
                    value.len(),
                    st.xattr_limit()
                )));
            }
            st.get(&xattr_key(ino, name))?.is_some()
        };
        if flags & XATTR_CREATE != 0 && exists {
            return Err(Error::exists(format!("xattr {:?} exists", name_str(name))));
        }
        if flags & XATTR_REPLACE != 0 && !exists {
            return Err(Error::no_attr(format!("xattr {:?} does not exist", name_str(name))));
        }
        if name == XATTR_CODEC {
            let s = std::str::from_utf8(value).map_err(|_| Error::invalid("codec policy is not UTF-8"))?;
            let spec: CodecSpec =
                s.trim().parse().map_err(|e| Error::invalid(format!("bad codec policy {s:?}: {e}")))?;
            i.policy = Some(spec.normalized());
        } else if name == XATTR_CHUNK {
            let c = parse_chunk(value, st.group.cfg().chunk_size)?;
            st.set_chunk(&mut i, Some(c))?;
        } else if name == XATTR_UNIT {
            file_or_dir(&i, "a compression unit")?;
            i.unit = Some(parse_unit(value)?);
        } else if name == XATTR_COLD {
            file_or_dir(&i, "a cold form")?;
            i.cold = Some(parse_cold(value)?);
        } else if name == XATTR_TIER {
            i.tier = match value.trim_ascii() {
                b"fast" => Some(TierPolicy::Fast),
                b"bulk" => Some(TierPolicy::Bulk),
                b"auto" => None,
                _ => return Err(Error::invalid("a device policy is fast, bulk or auto")),
            };
            if i.tier.is_some() {
                st.group.mark_version(9);
            }
        } else {
            st.put(xattr_key(ino, name), value.to_vec());
        }
        i.ctime = now();
        st.save(&i);
        st.note(ino, i.kind(), What::Meta);
        Ok(())
    }

    /// Names of an inode's xattrs.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let st = self.st();
        let i = st.inode(ino)?;
        let (lo, hi) = xattrs_range(ino);
        let mut v: Vec<Vec<u8>> = Vec::new();
        for (k, _) in st.scan(&lo, &hi, usize::MAX)? {
            if let Some((_, n)) = parse_xattr_key(&k) {
                v.push(n.to_vec());
            }
        }
        if i.policy.is_some() {
            v.push(XATTR_CODEC.to_vec());
        }
        Ok(v)
    }

    /// Remove an xattr.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.synced(self.removexattr_now(ino, name), false)
    }

    fn removexattr_now(&self, ino: Ino, name: &[u8]) -> Result<()> {
        let mut st = self.st();
        st.pre_relieve()?;
        let mut i = st.inode(ino)?;
        if name == XATTR_CODEC {
            if i.policy.take().is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no codec policy")));
            }
        } else if name == XATTR_CHUNK {
            if i.chunk.is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no chunk size of its own")));
            }
            st.set_chunk(&mut i, None)?;
        } else if name == XATTR_UNIT {
            if i.unit.take().is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no compression unit")));
            }
        } else if name == XATTR_COLD {
            if i.cold.take().is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no cold form")));
            }
        } else if name == XATTR_TIER {
            if i.tier.take().is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no device policy")));
            }
        } else {
            check_xattr_name(name)?;
            let k = xattr_key(ino, name);
            if st.get(&k)?.is_none() {
                return Err(Error::no_attr(format!("inode {ino} has no xattr {:?}", name_str(name))));
            }
            st.del(k);
        }
        i.ctime = now();
        st.save(&i);
        st.note(ino, i.kind(), What::Meta);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zlogfs_engine::store::{Geometry, Store};

    use crate::keys::extents_from;
    use crate::{Error, Fs, FsOptions, ROOT, XATTR_CHUNK, XATTR_COLD, XATTR_UNIT};

    fn open(store: &Arc<dyn Store>) -> Fs {
        crate::testing::open(store, crate::testing::quiet(FsOptions::default()))
    }

    /// How many chunks of `ino` share each shared block it uses, in
    /// address order.
    fn shared_blocks(fs: &Fs, ino: u64) -> Vec<usize> {
        let (lo, hi) = extents_from(ino, 0);
        let mut blocks = std::collections::BTreeMap::new();
        for (_, v) in fs.st().scan(&lo, &hi, usize::MAX).unwrap() {
            if let crate::keys::Extent::Shared { addr, .. } = crate::keys::Extent::decode(&v, "t").unwrap() {
                *blocks.entry(addr).or_insert(0) += 1;
            }
        }
        blocks.into_values().collect()
    }

    fn invalid<T: std::fmt::Debug>(r: crate::Result<T>) -> String {
        match r {
            Err(Error::Invalid(m)) => m,
            r => panic!("expected EINVAL, got {r:?}"),
        }
    }

    #[test]
    fn a_file_of_its_own_chunk_size_stores_chunks_of_that_size() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 32 });
        let a = fs.create(ROOT, b"vol", 0o644, 0, 0).unwrap();
        fs.setxattr(a.ino, XATTR_CHUNK, b"16K", 0).unwrap();
        assert_eq!(fs.getxattr(a.ino, XATTR_CHUNK).unwrap(), b"16K");
        assert_eq!(fs.getattr(a.ino).unwrap().blksize, 16384);
        assert!(!fs.listxattr(a.ino).unwrap().iter().any(|n| n == XATTR_CHUNK), "not listed");
        let data: Vec<u8> = (0..100_000u32).map(|n| (n * 7 % 251) as u8).collect();
        fs.write(a.ino, 0, &data).unwrap();
        assert!(invalid(fs.setxattr(a.ino, XATTR_CHUNK, b"4K", 0)).contains("holds data"));
        fs.commit().unwrap();
        let (lo, hi) = extents_from(a.ino, 0);
        assert_eq!(fs.st().scan(&lo, &hi, usize::MAX).unwrap().len(), 100_000usize.div_ceil(16384));
        // A 4 KiB overwrite in the middle, a hole punched, a truncation.
        fs.write(a.ino, 20_000, &[9; 4096]).unwrap();
        fs.fallocate(a.ino, crate::FALLOC_FL_PUNCH_HOLE | crate::FALLOC_FL_KEEP_SIZE, 40_000, 30_000)
            .unwrap();
        fs.setattr(a.ino, &crate::SetAttr { size: Some(90_001), ..Default::default() }).unwrap();
        let mut want = data.clone();
        want[20_000..24_096].fill(9);
        want[40_000..70_000].fill(0);
        want.truncate(90_001);
        assert_eq!(fs.read(a.ino, 0, 200_000).unwrap(), want);
        fs.close().unwrap();
        let fs = open(&store);
        assert_eq!(fs.read(a.ino, 0, 200_000).unwrap(), want, "after reopen");
        assert_eq!(fs.config().version, 8, "the image is marked as holding such inodes (and change records)");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }

    /// A volume of 16 KiB chunks in 64 KiB compression units: whole chunks
    /// written together share blocks of four (aligned to the unit), and
    /// read back through overwrites, patches, holes, truncation, cleaning
    /// and a reopen; the setting is checked and inherited.
    #[test]
    fn chunks_of_a_compression_unit_share_blocks() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 32 });
        let d = fs.mkdir(ROOT, b"vols", 0o755, 0, 0).unwrap();
        for bad in [&b"3K"[..], b"2K", b"2M", b"abc", b""] {
            assert!(invalid(fs.setxattr(d.ino, XATTR_UNIT, bad, 0)).contains("compression unit"), "{bad:?}");
        }
        fs.setxattr(d.ino, XATTR_UNIT, b"64K", 0).unwrap();
        let a = fs.create(d.ino, b"vol", 0o644, 0, 0).unwrap();
        assert_eq!(fs.getxattr(a.ino, XATTR_UNIT).unwrap(), b"64K", "inherited");
        fs.setxattr(a.ino, XATTR_CHUNK, b"16K", 0).unwrap();
        // 10 chunks from chunk 1 on: units [1..4), [4..8), [8..11).
        let data: Vec<u8> = (0..160 * 1024u32).map(|n| (n * 7 % 251) as u8).collect();
        fs.write(a.ino, 16384, &data).unwrap();
        fs.commit().unwrap();
        let shared = |fs: &Fs| shared_blocks(fs, a.ino);
        assert_eq!(shared(&fs), vec![3, 4, 3], "chunks share blocks by unit");
        let mut want = vec![0u8; 16384];
        want.extend_from_slice(&data);
        // A patch over a shared chunk, a chunk written whole again, a
        // hole punched, a truncation.
        fs.write(a.ino, 40_000, &[9; 4096]).unwrap();
        fs.write(a.ino, 5 * 16384, &[3; 16384]).unwrap();
        fs.fallocate(a.ino, crate::FALLOC_FL_PUNCH_HOLE | crate::FALLOC_FL_KEEP_SIZE, 100_000, 30_000)
            .unwrap();
        fs.setattr(a.ino, &crate::SetAttr { size: Some(170_001), ..Default::default() }).unwrap();
        want[40_000..44_096].fill(9);
        want[5 * 16384..6 * 16384].fill(3);
        want[100_000..130_000].fill(0);
        want.truncate(170_001);
        assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), want);
        fs.clean(&crate::CleanOptions { max_live: 1.0, ..Default::default() }, &|_| {}).unwrap();
        assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), want, "after cleaning");
        fs.close().unwrap();
        let fs = open(&store);
        assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), want, "after reopen");
        assert_eq!(fs.config().version, 10, "the image is marked as holding such inodes");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
        fs.removexattr(a.ino, XATTR_UNIT).unwrap();
        assert!(matches!(fs.getxattr(a.ino, XATTR_UNIT), Err(Error::NoAttr(_))));
    }

    /// A file's cold form is how the cleaner stores the chunks it moves:
    /// written alone, its 16 KiB chunks share 64 KiB blocks once cleaned,
    /// and a chunk written again is stored alone again; the setting is
    /// checked, inherited and marks the image.
    #[test]
    fn the_cleaner_stores_a_file_in_its_cold_form() {
        let (store, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 128 });
        let d = fs.mkdir(ROOT, b"vols", 0o755, 0, 0).unwrap();
        for (bad, says) in [
            (&b"64K"[..], "give a unit and a codec"),
            (b"3K zstd:9", "compression unit"),
            (b"2M zstd:9", "compression unit"),
            (b"64K zstd:99", "bad codec"),
            (b"64K nosuch", "bad codec"),
            (b"64K none", "not none"),
            (b"", "give a unit and a codec"),
        ] {
            let e = invalid(fs.setxattr(d.ino, XATTR_COLD, bad, 0));
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        fs.setxattr(d.ino, XATTR_COLD, b"64K  zstd:9 ", 0).unwrap();
        let a = fs.create(d.ino, b"vol", 0o644, 0, 0).unwrap();
        assert_eq!(fs.getxattr(a.ino, XATTR_COLD).unwrap(), b"64K zstd:9", "inherited");
        assert!(!fs.listxattr(a.ino).unwrap().iter().any(|n| n == XATTR_COLD), "not listed");
        fs.setxattr(a.ino, XATTR_CHUNK, b"16K", 0).unwrap();
        // Writes store pairs of chunks (32 KiB units, and no compression
        // ahead); the cold form fours.
        fs.setxattr(a.ino, XATTR_UNIT, b"32K", 0).unwrap();
        let data: Vec<u8> = (0..160 * 1024u32).map(|n| (n * 7 % 251) as u8).collect();
        fs.write(a.ino, 0, &data).unwrap();
        fs.commit().unwrap();
        let shared = |fs: &Fs| shared_blocks(fs, a.ino);
        assert_eq!(shared(&fs), vec![2; 5], "written: in 32 KiB units");
        // Incompressible bytes after it: the cleaner leaves the log's head.
        let f = fs.create(ROOT, b"filler", 0o644, 0, 0).unwrap();
        let mut x = 1u64;
        let noise: Vec<u8> = (0..3 << 20)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        fs.write(f.ino, 0, &noise).unwrap();
        fs.commit().unwrap();
        let rep = fs.clean(&crate::CleanOptions { max_live: 1.0, ..Default::default() }, &|_| {}).unwrap();
        assert!(rep.chunks >= 10, "{rep:?}");
        assert_eq!(shared(&fs), vec![4, 4, 2], "cleaned: in 64 KiB units");
        let mut want = data.clone();
        fs.write(a.ino, 4 * 16384, &[3; 16384]).unwrap();
        want[4 * 16384..5 * 16384].fill(3);
        fs.commit().unwrap();
        assert_eq!(shared(&fs), vec![4, 3, 2], "a chunk written again is stored as writes store it");
        // Writes committed by a snapshot's delete (whose commits run as
        // the cleaner's do) are stored as writes store them too: new
        // chunks 13 and 14 in two 32 KiB units, not one 64 KiB unit.
        fs.snapshot_create("s").unwrap();
        fs.write(a.ino, 13 * 16384, &data[..32768]).unwrap();
        want.resize(13 * 16384, 0);
        want.extend_from_slice(&data[..32768]);
        fs.snapshot_delete("s").unwrap();
        assert_eq!(shared(&fs), vec![4, 3, 2], "chunks 13 and 14 alone, not in a cold unit");
        assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), want);
        fs.close().unwrap();
        let fs = open(&store);
        assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), want, "after reopen");
        assert_eq!(fs.config().version, 11, "the image is marked as holding such inodes");
        let rep = fs.check(&|_, _| {}).unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
        fs.removexattr(a.ino, XATTR_COLD).unwrap();
        assert!(matches!(fs.getxattr(a.ino, XATTR_COLD), Err(Error::NoAttr(_))));
        let l = fs.symlink(d.ino, b"s", b"vol", 0, 0).unwrap();
        assert!(
            invalid(fs.setxattr(l.ino, XATTR_COLD, b"64K zstd:9", 0)).contains("only files and directories")
        );
    }

    #[test]
    fn chunk_sizes_are_checked_and_inherited() {
        let (_, fs) = crate::testing::fresh(Geometry { segment_size: 1 << 20, segment_count: 16 });
        let d = fs.mkdir(ROOT, b"vols", 0o755, 0, 0).unwrap();
        for bad in [&b"3K"[..], b"2K", b"128K", b"1M", b"abc", b"16Q", b""] {
            assert!(invalid(fs.setxattr(d.ino, XATTR_CHUNK, bad, 0)).contains("chunk size"), "{bad:?}");
        }
        fs.setxattr(d.ino, XATTR_CHUNK, b"8192", 0).unwrap();
        let f = fs.create(d.ino, b"a", 0o644, 0, 0).unwrap();
        let sub = fs.mkdir(d.ino, b"sub", 0o755, 0, 0).unwrap();
        let g = fs.create(sub.ino, b"b", 0o644, 0, 0).unwrap();
        let s = fs.symlink(d.ino, b"s", b"a", 0, 0).unwrap();
        for ino in [d.ino, f.ino, sub.ino, g.ino] {
            assert_eq!(fs.getxattr(ino, XATTR_CHUNK).unwrap(), b"8K", "inode {ino}");
        }
        assert!(matches!(fs.getxattr(s.ino, XATTR_CHUNK), Err(Error::NoAttr(_))), "not on a symlink");
        assert!(invalid(fs.setxattr(s.ino, XATTR_CHUNK, b"8K", 0)).contains("only files and directories"));
        // A file's own setting goes while it holds no data.
        fs.removexattr(g.ino, XATTR_CHUNK).unwrap();
        assert_eq!(fs.getattr(g.ino).unwrap().blksize, 65536, "the image's again");
        assert!(matches!(fs.removexattr(g.ino, XATTR_CHUNK), Err(Error::NoAttr(_))));
        let root = fs.create(ROOT, b"c", 0o644, 0, 0).unwrap();
        assert!(matches!(fs.getxattr(root.ino, XATTR_CHUNK), Err(Error::NoAttr(_))), "the root has none");
    }
}
