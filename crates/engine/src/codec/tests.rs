//! Tests of the codec module. Randomised tests print their seed and honour
//! `ZLOGFS_SEED`.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

use zlogfs_testkit::seed;

fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(seed(test))
}

fn runner(test: &str, cases: u32) -> TestRunner {
    let s = seed(test);
    let mut bytes = [0u8; 32];
    StdRng::seed_from_u64(s).fill_bytes(&mut bytes);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

const WORDS: &[&str] = &[
    "the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as",
    "with", "his", "they", "I", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but",
    "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which",
    "she", "do", "how", "their", "if", "struct", "fn", "let", "mut", "return", "int", "char", "#include",
    "static", "const", "void", "unsigned", "long", "{", "}", "(", ")", ";", "=", "==", "->", "*", "0", "1",
    "42",
];

/// Text-like data: words from a small vocabulary with punctuation and lines.
fn text(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
        out.push(match rng.gen_range(0..12) {
            0 => b'\n',
            1 => b',',
            _ => b' ',
        });
    }
    out.truncate(len);
    out
}

fn random(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

fn levels(id: CodecId) -> Vec<u8> {
    match id {
        CodecId::Zstd => vec![1, 3, 9, 19],
        CodecId::Deflate => vec![0, 1, 6, 9],
        _ => vec![0],
    }
}

fn round_trip(id: CodecId, level: u8, data: &[u8]) {
    let c = codec(id);
    assert_eq!(c.id(), id);
    let mut comp = vec![0xAA, 0xBB]; // compress appends
    c.compress(level, data, &mut comp);
    assert_eq!(&comp[..2], &[0xAA, 0xBB]);
    let mut out = vec![7u8]; // decompress appends
    c.decompress(&comp[2..], data.len(), &mut out)
        .unwrap_or_else(|e| panic!("{id:?}:{level} len {}: {e}", data.len()));
    assert_eq!(out[0], 7);
    assert!(out[1..] == *data, "{id:?}:{level} len {} mismatch", data.len());
    let dec = decode(id as u8, &comp[2..], data.len()).expect("decode");
    assert!(dec == data);
    // A wrong raw length is an error, not a wrong answer.
    assert!(decode(id as u8, &comp[2..], data.len() + 1).is_err(), "{id:?} len+1");
    if !data.is_empty() {
        assert!(decode(id as u8, &comp[2..], data.len() - 1).is_err(), "{id:?} len-1");
    }
}

#[test]
fn round_trip_all_codecs_levels_and_sizes() {
    let mut r = rng("round_trip_all_codecs_levels_and_sizes");
    let mut inputs: Vec<(String, Vec<u8>)> =
        vec![("empty".into(), vec![]), ("one".into(), vec![b'x']), ("one zero".into(), vec![0])];
    for size in [16 << 10, 64 << 10, 1 << 20] {
        inputs.push((format!("zeros {size}"), vec![0; size]));
        inputs.push((format!("text {size}"), text(&mut r, size)));
        inputs.push((format!("random {size}"), random(&mut r, size)));
    }
    for id in CodecId::ALL {
        for level in levels(id) {
            for (name, data) in &inputs {
                // Slow levels only on the smaller inputs.
                if data.len() >= 1 << 20 && level >= 9 && id == CodecId::Zstd {
                    continue;
                }
                eprintln!("{id:?}:{level} {name}");
                round_trip(id, level, data);
            }
        }
    }
}

#[test]
fn spec_parse_and_display() {
    for (s, id, level) in [
        ("zstd:3", CodecId::Zstd, 3),
        ("zstd", CodecId::Zstd, 1),
        ("ZSTD:19", CodecId::Zstd, 19),
        ("lz4", CodecId::Lz4, 0),
        ("none", CodecId::None, 0),
        ("deflate:6", CodecId::Deflate, 6),
        ("deflate:0", CodecId::Deflate, 0),
        ("deflate", CodecId::Deflate, 6),
        ("pred1", CodecId::Pred1, 0),
        ("pred2", CodecId::Pred2, 0),
        ("lz4:7", CodecId::Lz4, 0),
    ] {
        let spec: CodecSpec = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(spec, CodecSpec::new(id, level), "{s}");
        let back: CodecSpec = spec.to_string().parse().expect("round trip");
        assert_eq!(back, spec);
    }
    for bad in ["", "zstd:0", "zstd:20", "deflate:10", "gzip", "zstd:x", "zstd:-1", "lz4:x"] {
        match bad.parse::<CodecSpec>() {
            Err(crate::Error::Invalid(msg)) => assert!(msg.contains("zstd:1"), "{msg}"),
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
    assert_eq!(CodecSpec::default().to_string(), "zstd:1");
    assert_eq!("lz4".parse::<CodecSpec>().map(|s| s.to_string()).ok(), Some("lz4".into()));
    for id in CodecId::ALL {
        assert_eq!(CodecId::from_u8(id as u8), Some(id));
        assert_eq!(CodecId::from_name(id.name()), Some(id));
    }
    for v in 6..=255u8 {
        assert_eq!(CodecId::from_u8(v), None);
    }
}

#[test]
fn encode_policy() {
    let mut r = rng("encode_policy");
    let rand64 = random(&mut r, 64 << 10);
    let text64 = text(&mut r, 64 << 10);
    let zeros = vec![0u8; 64 << 10];
    for id in CodecId::ALL {
        let spec = CodecSpec::new(id, CodecSpec::default_level(id));
        let e = encode(spec, &rand64);
        assert_eq!(e.codec, CodecId::None);
        assert_eq!(e.level, 0);
        assert_eq!(e.data, rand64);
        if id == CodecId::None {
            assert_eq!(e.raw_reason, raw_reason::POLICY);
            continue;
        }
        assert_eq!(e.raw_reason, raw_reason::PROBE, "{id:?}");
        for data in [&text64, &zeros] {
            let e = encode(spec, data);
            assert_eq!(e.codec, id);
            assert_eq!(e.level, spec.level);
            assert_eq!(e.raw_reason, 0);
            assert!(e.data.len() <= data.len() - data.len() / 8);
            assert_eq!(&decode(e.codec as u8, &e.data, data.len()).expect("decode"), data);
        }
        // Small random input is below the probe's minimum: NO_GAIN.
        let small = random(&mut r, 500);
        let e = encode(spec, &small);
        assert_eq!((e.codec, e.raw_reason), (CodecId::None, raw_reason::NO_GAIN), "{id:?}");
        assert_eq!(decode(e.codec as u8, &e.data, small.len()).expect("decode"), small);
        // Empty input: stored raw, or compressed to nothing (pred).
        let e = encode(spec, &[]);
        assert!(e.data.is_empty() || e.codec == CodecId::None, "{id:?}");
        assert_eq!(decode(e.codec as u8, &e.data, 0).expect("decode"), b"");
    }
    // Levels are clamped.
    let e = encode(CodecSpec::new(CodecId::Zstd, 200), &text64);
    assert_eq!((e.codec, e.level), (CodecId::Zstd, 19));
    let e = encode(CodecSpec::new(CodecId::Lz4, 5), &text64);
    assert_eq!((e.codec, e.level), (CodecId::Lz4, 0));
}

#[test]
fn decode_errors_are_descriptive() {
    assert_eq!(decode(9, &[], 0).unwrap_err().to_string(), "unknown codec 9");
    let mut comp = Vec::new();
    codec(CodecId::Lz4).compress(0, &[1u8; 1000], &mut comp);
    let e = decode(CodecId::Lz4 as u8, &comp, 65536).unwrap_err();
    assert!(e.to_string().starts_with("lz4 payload does not expand to 65536 bytes"), "{e}");
    let e: crate::Error = e.into();
    assert!(e.is_corruption());
}

/// Corrupted (bit flips, truncation, extension) real payloads never panic
/// and, when they decode, decode to exactly raw_len bytes.
#[test]
fn decode_corrupt_payloads() {
    let mut r = rng("decode_corrupt_payloads");
    let data = text(&mut r, 20_000);
    for id in CodecId::ALL {
        for level in levels(id) {
            let mut comp = Vec::new();
            codec(id).compress(level, &data, &mut comp);
            // Truncations fail (for every codec, a shorter payload cannot
            // represent the same output; `none` by length).
            for cut in [0, 1, comp.len() / 2, comp.len().saturating_sub(1)] {
                if cut < comp.len() {
                    assert!(decode(id as u8, &comp[..cut], data.len()).is_err(), "{id:?} cut {cut}");
                }
            }
            // Trailing garbage fails, except for codecs whose framing
            // cannot tell (lz4 block format ends with literals).
            let mut ext = comp.clone();
            ext.extend_from_slice(&[0x5A; 3]);
            let res = decode(id as u8, &ext, data.len());
            if matches!(id, CodecId::None | CodecId::Deflate | CodecId::Pred1 | CodecId::Pred2) {
                assert!(res.is_err(), "{id:?} trailing");
            }
            for _ in 0..200 {
                let mut bad = comp.clone();
                for _ in 0..r.gen_range(1..4) {
                    if bad.is_empty() {
                        break;
                    }
                    let i = r.gen_range(0..bad.len());
                    bad[i] ^= 1 << r.gen_range(0..8);
                }
                if let Ok(out) = decode(id as u8, &bad, data.len()) {
                    assert_eq!(out.len(), data.len());
                }
            }
        }
    }
}

/// Random bytes and random raw_len up to 1 MiB for every codec byte 0..=7.
#[test]
fn decode_garbage_never_panics() {
    let mut runner = runner("decode_garbage_never_panics", 400);
    let strat = (
        0u8..=7,
        prop_oneof![Just(0usize), 0usize..64, 0usize..=(1 << 20)],
        proptest::collection::vec(any::<u8>(), 0..4096),
    );
    runner
        .run(&strat, |(id, raw_len, bytes)| {
            match decode(id, &bytes, raw_len) {
                Ok(out) => prop_assert_eq!(out.len(), raw_len),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            Ok(())
        })
        .unwrap();
}

fn check_round_trip(data: &[u8]) -> Result<(), TestCaseError> {
    for id in CodecId::ALL {
        for level in levels(id) {
            if level >= 9 && data.len() > 64 << 10 {
                continue;
            }
            let mut comp = Vec::new();
            codec(id).compress(level, data, &mut comp);
            let out = decode(id as u8, &comp, data.len());
            prop_assert!(out.as_deref() == Ok(data), "{:?}:{} len {}", id, level, data.len());
        }
    }
    Ok(())
}

#[test]
fn proptest_round_trip_arbitrary() {
    let mut runner = runner("proptest_round_trip_arbitrary", 48);
    let strat = proptest::collection::vec(any::<u8>(), 0..=(256 << 10));
    runner.run(&strat, |data| check_round_trip(&data)).unwrap();
}

/// Structured inputs: runs, repeats, small alphabets, text.
#[test]
fn proptest_round_trip_structured() {
    let mut runner = runner("proptest_round_trip_structured", 64);
    let piece = prop_oneof![
        (any::<u8>(), 1usize..5000).prop_map(|(b, n)| vec![b; n]),
        proptest::collection::vec(0u8..4, 0..5000),
        proptest::collection::vec(prop_oneof![Just(b' '), b'a'..=b'z', Just(b'\n')], 0..5000),
        (proptest::collection::vec(any::<u8>(), 1..64), 1usize..200).prop_map(|(p, n)| p.repeat(n)),
        proptest::collection::vec(any::<u8>(), 0..2000),
    ];
    let strat = proptest::collection::vec(piece, 0..40).prop_map(|ps| {
        let mut v = ps.concat();
        v.truncate(256 << 10);
        v
    });
    runner.run(&strat, |data| check_round_trip(&data)).unwrap();
}

#[test]
fn pred2_code_is_complete() {
    let kraft: u32 = (0..258u16).map(|s| 1u32 << (10 - pred::pred2_code_length(s))).sum();
    assert_eq!(kraft, 1 << 10);
}

#[test]
fn predictors_compress_text() {
    let mut r = rng("predictors_compress_text");
    let data = text(&mut r, 64 << 10);
    for id in [CodecId::Pred1, CodecId::Pred2] {
        let mut comp = Vec::new();
        codec(id).compress(0, &data, &mut comp);
        eprintln!("{id:?}: {} -> {}", data.len(), comp.len());
        assert!(comp.len() < data.len() * 3 / 4, "{id:?}");
    }
    // Zeros: pred1 is 1 bit a byte; pred2 1 bit a byte as well.
    let mut comp = Vec::new();
    codec(CodecId::Pred1).compress(0, &[0; 8000], &mut comp);
    assert_eq!(comp.len(), 1000);
    comp.clear();
    codec(CodecId::Pred2).compress(0, &[0; 8000], &mut comp);
    assert_eq!(comp.len(), 1000);
}

#[test]
fn probe() {
    let mut r = rng("probe");
    assert!(looks_incompressible(&random(&mut r, 64 << 10)));
    assert!(looks_incompressible(&random(&mut r, 1024)));
    assert!(looks_incompressible(&random(&mut r, 16 << 10)));
    assert!(!looks_incompressible(&random(&mut r, 1000)));
    assert!(!looks_incompressible(&[]));
    let t = text(&mut r, 1 << 20);
    assert!(!looks_incompressible(&t));
    assert!(!looks_incompressible(&t[..2000]));
    assert!(!looks_incompressible(&vec![0u8; 64 << 10]));
    let mut z = Vec::new();
    codec(CodecId::Zstd).compress(19, &t, &mut z);
    assert!(z.len() > 16 << 10);
    assert!(looks_incompressible(&z), "zstd output");
    let mut d = Vec::new();
    codec(CodecId::Deflate).compress(9, &t, &mut d);
    assert!(looks_incompressible(&d), "deflate output");
    for path in ["/bin/ls", "/usr/bin/ls"] {
        if let Ok(elf) = std::fs::read(path) {
            assert!(!looks_incompressible(&elf), "{path}");
            for block in elf.chunks(64 << 10) {
                assert!(!looks_incompressible(block), "{path} block");
            }
            break;
        }
    }
    let src = std::fs::read(file!()).unwrap_or_default();
    assert!(!looks_incompressible(&src));
}

/// Real-data benchmark: ratio and MB/s of each codec on 64 KiB blocks of
/// concatenated /usr/include headers. Run with
/// `cargo test --release -- --ignored --nocapture bench_codecs`.
#[test]
#[ignore]
fn bench_codecs() {
    use std::time::Instant;
    let limit: usize =
        std::env::var("ZLOGFS_BENCH_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(32 << 20);
    let mut data = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/usr/include")];
    let mut files = Vec::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut ents: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        ents.sort();
        for p in ents {
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "h") {
                files.push(p);
            }
        }
    }
    files.sort();
    for f in files {
        if data.len() >= limit {
            break;
        }
        if let Ok(b) = std::fs::read(&f) {
            data.extend_from_slice(&b);
        }
    }
    data.truncate(limit);
    let blocks: Vec<&[u8]> = data.chunks(64 << 10).collect();
    let mb = data.len() as f64 / 1e6;
    eprintln!("{} bytes of /usr/include headers, {} blocks of 64 KiB", data.len(), blocks.len());
    eprintln!("{:<10} {:>7} {:>10} {:>10}", "codec", "ratio", "comp MB/s", "dec MB/s");
    let t = Instant::now();
    let n = blocks.iter().filter(|b| looks_incompressible(b)).count();
    eprintln!("probe: {:.0} MB/s ({n} blocks judged incompressible)", mb / t.elapsed().as_secs_f64());
    let specs = [
        "none",
        "lz4",
        "zstd:1",
        "zstd:3",
        "zstd:9",
        "zstd:19",
        "deflate:1",
        "deflate:6",
        "deflate:9",
        "pred1",
        "pred2",
    ];
    for s in specs {
        let spec: CodecSpec = s.parse().expect("spec");
        let c = codec(spec.id);
        let t = Instant::now();
        let comps: Vec<Vec<u8>> = blocks
            .iter()
            .map(|b| {
                let mut v = Vec::new();
                c.compress(spec.level, b, &mut v);
                v
            })
            .collect();
        let ct = t.elapsed().as_secs_f64();
        let total: usize = comps.iter().map(|v| v.len()).sum();
        let t = Instant::now();
        for (b, v) in blocks.iter().zip(&comps) {
            let mut out = Vec::new();
            c.decompress(v, b.len(), &mut out).expect("decompress");
            assert!(out == *b);
        }
        let dt = t.elapsed().as_secs_f64();
        eprintln!("{:<10} {:>7.3} {:>10.1} {:>10.1}", s, total as f64 / data.len() as f64, mb / ct, mb / dt);
    }
}
