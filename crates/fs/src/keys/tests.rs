//! Round trips and damage of every record.

use super::*;
use zlogfs_engine::codec::{CodecId, CodecSpec};
use zlogfs_engine::BlockAddr;

#[test]
fn inode_round_trip_and_size() {
    let t = Time { sec: 1_700_000_000, nsec: 0 };
    let mut i = Inode {
        ino: 5,
        mode: 0o100644,
        uid: 0,
        gid: 0,
        nlink: 1,
        size: 1234,
        alloc: 1234,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
        btime: t,
        parent: 0,
        policy: None,
        chunk: None,
        tier: None,
        unit: None,
        cold: None,
    };
    let b = i.encode(3, 1_700_000_000);
    // flags, triple, size (2), mtime (2)
    assert_eq!(b.len(), 6, "{b:?}");
    let tr = |id| (id == 3).then_some((0, 0, 0o100644));
    assert_eq!(Inode::decode(5, &b, 1_700_000_000, tr).unwrap(), i);
    i.nlink = 7;
    i.rdev = 0x0801;
    i.atime.nsec = 5;
    i.ctime = Time { sec: 1_800_000_000, nsec: 999_999_999 };
    i.btime = Time { sec: -5, nsec: 1 };
    i.alloc = 65536;
    i.policy = Some(CodecSpec::new(CodecId::Lz4, 0));
    i.parent = 9;
    i.chunk = Some(16384);
    i.tier = Some(TierPolicy::Bulk);
    i.unit = Some(128 << 10);
    let b = i.encode(3, 1_700_000_000);
    assert_eq!(Inode::decode(5, &b, 1_700_000_000, tr).unwrap(), i);
    assert!(Inode::decode(5, &b, 0, |_| None).is_err());
    // A chunk size out of range is refused, not used.
    let mut bad = b.clone();
    let n = bad.len() - 3; // the chunk size, before the device policy and unit
    bad[n] = 40;
    assert!(Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string().contains("chunk size"));
    let mut bad = b.clone();
    let n = bad.len() - 2;
    bad[n] = 7;
    assert!(Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string().contains("device policy"));
    for shift in [11, 21] {
        let mut bad = b.clone();
        *bad.last_mut().unwrap() = shift;
        let e = Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string();
        assert!(e.contains("compression unit"), "{e}");
    }
    // The cold form: unit, codec, level after the rest.
    i.cold = Some(Cold { unit: 256 << 10, spec: CodecSpec::new(CodecId::Zstd, 9) });
    let b = i.encode(3, 1_700_000_000);
    assert_eq!(Inode::decode(5, &b, 1_700_000_000, tr).unwrap(), i);
    let mut bad = b.clone();
    let n = bad.len() - 2;
    bad[n] = 200;
    let e = Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string();
    assert!(e.contains("unknown codec 200 in cold form"), "{e}");
    let mut bad = b.clone();
    let n = bad.len() - 3;
    bad[n] = 22;
    let e = Inode::decode(5, &bad, 1_700_000_000, tr).unwrap_err().to_string();
    assert!(e.contains("compression unit 2^22"), "{e}");
    for n in 0..b.len() {
        let _ = Inode::decode(5, &b[..n], 1_700_000_000, tr);
    }
}

#[test]
fn time_conversions() {
    for t in [Time { sec: -1, nsec: 5 }, Time { sec: 0, nsec: 0 }, Time { sec: 12345, nsec: 999 }] {
        assert_eq!(Time::from_system(t.to_system()), t);
    }
}

#[test]
fn held_and_snapshot_records_round_trip() {
    let a = BlockAddr { seg: 7, offset: 4096, len: 300 };
    let k = held_key(a, 12345, 2);
    assert_eq!(parse_held_key(&k), Some((a, 12345, 2)));
    assert!(parse_held_key(&k[..24]).is_none() && parse_shared_key(&k).is_none());
    let (lo, hi) = all_held_range();
    assert!(lo <= k && k < hi);
    assert!(describe_key(&k).contains("held free"), "{}", describe_key(&k));
    let s = Snapshot { seq: 99, time: Time { sec: -3, nsec: 5 } };
    assert_eq!(Snapshot::decode(&s.encode(), "snapshot").unwrap(), s);
    assert!(Snapshot::decode(&[], "snapshot").is_err());
    let k = snapshot_key(b"before-upgrade");
    let (lo, hi) = snapshots_range();
    assert!(lo <= k && k < hi && describe_key(&k).contains("before-upgrade"));
}

#[test]
fn extent_and_key_round_trips() {
    let a = BlockAddr { seg: 3, offset: 4096, len: 777 };
    for e in [
        Extent::Inline(b"hello".to_vec()),
        Extent::Inline(vec![]),
        Extent::Own(a, 65536),
        Extent::Shared { addr: a, off: 10, len: 20, phys: 5 },
    ] {
        assert_eq!(Extent::decode(&e.encode(), "x").unwrap(), e);
    }
    assert_eq!(parse_shared_key(&shared_key(a)), Some(a));
    assert_eq!(parse_extent_key(&extent_key(7, 9)), Some((7, 9)));
    assert_eq!(parse_dirent_key(&dirent_key(7, b"n")), Some((7, &b"n"[..])));
    assert!(dirent_key(1, &[0xff; 255]) < dirents_range(1).1);
    assert!(dirents_range(1).1 < dirent_key(2, b""));
    assert_eq!(decode_refs(&encode_refs(&[(1, 2), (3, 4)], 0)).unwrap(), (vec![(1, 2), (3, 4)], 0));
    assert_eq!(decode_refs(&encode_refs(&[(1, 2)], 700)).unwrap(), (vec![(1, 2)], 700));
    assert_eq!(decode_dirent(&encode_dirent(99, Kind::Socket)).unwrap(), (99, Kind::Socket));
}

#[test]
fn patched_extents_round_trip_and_bad_ones_are_refused() {
    let a = BlockAddr { seg: 3, offset: 4096, len: 777 };
    let b = BlockAddr { seg: 4, offset: 0, len: 300 };
    // A chunk of 10000 bytes: blocks 0, 1 and a short block 2 (1808 bytes).
    let base = Extent::Own(a, 10_000);
    let p1 = Patch {
        runs: vec![(0, 1), (2, 1)],
        piece: Extent::Shared { addr: b, off: 7, len: 4096 + 1808, phys: 90 },
    };
    let p2 = Patch { runs: vec![(1, 1)], piece: Extent::Own(b, 4096) };
    let e =
        Extent::Patched { base: Box::new(base.clone()), patches: vec![p1.clone(), p2.clone()], freed: 300 };
    assert_eq!(Extent::decode(&e.encode(), "x").unwrap(), e);
    // Chunk type 3 (record version 2) is type 4 without the freed bytes.
    let old = Extent::Patched { base: Box::new(base.clone()), patches: vec![p1.clone()], freed: 0 };
    let mut v = old.encode();
    assert_eq!(v[0], 4);
    v[0] = 3;
    v.remove(base.encode().len() + 1);
    assert_eq!(Extent::decode(&v, "x").unwrap(), old);
    // No more released than the base's own stored bytes.
    for (base, freed) in [(base.clone(), 778), (p1.piece.clone(), 1)] {
        let v = Extent::Patched { base: Box::new(base), patches: vec![p2.clone()], freed }.encode();
        let err = Extent::decode(&v, "x").unwrap_err().to_string();
        assert!(err.contains(&format!("{freed} bytes of its base released")), "{err}");
    }
    assert_eq!(e.len(), 10_000);
    assert_eq!(e.phys(), 777 + 90 + 300);
    assert_eq!(e.parts(), vec![&base, &p1.piece, &p2.piece]);
    assert_eq!(p1.spans(10_000).collect::<Vec<_>>(), vec![(0, 4096), (8192, 10_000)]);
    let bad = |patches: Vec<Patch>, base: Extent| {
        let v = Extent::Patched { base: Box::new(base), patches, freed: 0 }.encode();
        Extent::decode(&v, "x").expect_err("must be refused").to_string()
    };
    let piece = |len| Extent::Shared { addr: b, off: 0, len, phys: 1 };
    assert!(bad(vec![], base.clone()).contains("without patches"));
    // Runs that overlap, touch, lie outside or are empty.
    for runs in [vec![(0, 2), (1, 1)], vec![(0, 1), (1, 1)], vec![(2, 2)], vec![(0, 0)]] {
        let p = Patch { runs, piece: piece(4096) };
        assert!(bad(vec![p], base.clone()).contains("patch run"));
    }
    // A piece shorter than the blocks it replaces.
    let p = Patch { runs: vec![(0, 1)], piece: piece(4000) };
    assert!(bad(vec![p], base.clone()).contains("replaces 4096"));
    // A base that is not a block.
    let p = Patch { runs: vec![(0, 1)], piece: piece(4096) };
    assert!(bad(vec![p.clone()], Extent::Inline(vec![1; 10])).contains("unknown extent type 0"));
    let nested = Extent::Patched { base: Box::new(base.clone()), patches: vec![p.clone()], freed: 0 };
    assert!(bad(vec![p.clone()], nested).contains("unknown extent type 4"));
    // Cut short anywhere: an error, never a panic.
    let full = e.encode();
    for n in 0..full.len() {
        assert!(Extent::decode(&full[..n], "x").is_err(), "prefix of {n} bytes accepted");
    }
    // A base that is gone: only where the patches cover every block,
    // and never as a chunk of its own or in a type 3 record.
    let gone =
        Extent::Patched { base: Box::new(Extent::Gone(10_000)), patches: vec![p1.clone(), p2], freed: 0 };
    let v = gone.encode();
    assert_eq!(Extent::decode(&v, "x").unwrap(), gone);
    assert_eq!((gone.len(), gone.phys()), (10_000, 90 + 300));
    let mut v3 = v.clone();
    v3[0] = 3;
    assert!(Extent::decode(&v3, "x").unwrap_err().to_string().contains("unknown extent type 5"));
    assert!(bad(vec![p1], Extent::Gone(10_000)).contains("do not cover the whole chunk"));
    assert!(Extent::decode(&Extent::Gone(10).encode(), "x")
        .unwrap_err()
        .to_string()
        .contains("unknown extent type 5"));
    for n in 0..v.len() {
        assert!(Extent::decode(&v[..n], "x").is_err(), "prefix of {n} bytes accepted");
    }
}

#[test]
fn config_versions() {
    let c = Config {
        chunk_size: 65536,
        pack_bytes: 131072,
        inline_max: 512,
        codec: CodecSpec::new(CodecId::Zstd, 3),
        base_sec: 1_700_000_000,
        next_ino: 5,
        next_triple: 2,
        version: 1,
        small_max: DEFAULT_SMALL_MAX,
    };
    for version in 1..=FS_VERSION {
        let c = Config { version, ..c.clone() };
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
    }
    // The small-file size only when it is not the default: records
    // of images made before it stay the same bytes.
    let other = Config { small_max: 4096, ..c.clone() };
    assert_eq!(other.encode().len(), c.encode().len() + 2);
    assert_eq!(Config::decode(&other.encode()).unwrap(), other);
    let mut v = c.encode();
    v[0] = FS_VERSION + 1;
    let e = Config::decode(&v).unwrap_err().to_string();
    assert!(
        e.contains(&format!("version {}; this build reads versions 1 to {FS_VERSION}", FS_VERSION + 1)),
        "{e}"
    );
}

#[test]
fn counters_round_trip() {
    let c = Counters { user_bytes: 1 << 40, device_bytes: 300, reserved: 0 };
    let b = c.encode();
    // Golden bytes: two LEB128 varints (FORMAT.md §9, tag 0x03).
    assert_eq!(b, [0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0xac, 0x02]);
    assert_eq!(Counters::decode(&b).unwrap(), c);
    assert!(Counters::decode(&b[..5]).is_err());
    assert!(Counters::decode(&[b.as_slice(), &[0]].concat()).is_err());
    // Reserved bytes, when there are any, are a third varint.
    let r = Counters { reserved: 65536, ..c };
    assert_eq!(r.encode(), [b.as_slice(), &[0x80, 0x80, 0x04]].concat());
    assert_eq!(Counters::decode(&r.encode()).unwrap(), r);
    let e = Extent::Reserved(4097);
    assert_eq!(e.encode(), [6, 0x81, 0x20]);
    assert_eq!(Extent::decode(&e.encode(), "t").unwrap(), e);
    assert!(Extent::decode(&[6, 0], "t").is_err(), "a reservation of nothing");
    assert!(Extent::decode(&[6, 0x81, 0x80, 0x80, 0x01], "t").is_err(), "more than a chunk's 1 MiB");
    assert!(triple_key(u32::MAX) < counters_key() && counters_key() < orphan_key(0));
}
