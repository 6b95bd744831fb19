//! The codec's tests: reduce.

use super::*;

/// Each site's frame, at magnitudes 100× apart: sums of codes times scales
/// of similar magnitude are often exact in f32, whatever the order, and
/// the test needs sums that are not.
fn site_frames(n: usize, sites: &[&str]) -> Vec<(String, Vec<u8>)> {
    sites
        .iter()
        .enumerate()
        .map(|(k, site)| {
            let values = Gaussian::new(100 + k as u64).sample(n, 100f32.powi(k as i32));
            let frame = Encoder::new(config(8, 256, true, false), n)
                .encode(&values)
                .unwrap();
            (site.to_string(), frame.into_bytes())
        })
        .collect()
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, n - 1);
            out.push(p);
        }
    }
    out
}

#[test]
fn the_reduction_is_bit_identical_whatever_order_frames_arrive_in() {
    let n = 3000;
    let frames = site_frames(n, &["us-east", "eu-west", "ap-south", "us-west"]);
    let weight = 0.25;
    let mut hashes = std::collections::BTreeSet::new();
    let mut arrival_order_sums = std::collections::BTreeSet::new();
    for order in permutations(frames.len()) {
        let contributions: Vec<Contribution<'_>> = order
            .iter()
            .map(|&k| Contribution {
                site: &frames[k].0,
                frame: &frames[k].1,
                weight,
            })
            .collect();
        let mut out = pattern(n);
        reduce(&contributions, &mut out).unwrap();
        hashes.insert(fragment_hash(&out));
        // Summed in arrival order instead, the bits would differ.
        let mut naive = vec![0.0; n];
        for c in &contributions {
            decode_add(c.frame, &mut naive, c.weight).unwrap();
        }
        arrival_order_sums.insert(fragment_hash(&naive));
    }
    assert_eq!(hashes.len(), 1, "{hashes:?}");
    assert!(
        arrival_order_sums.len() > 1,
        "the test data must be order-sensitive"
    );
}

#[test]
fn a_reduction_with_a_bad_frame_is_refused_naming_the_site_and_writes_nothing() {
    let n = 500;
    let mut frames = site_frames(n, &["a", "b", "c"]);
    let last = frames[1].1.len() - 1;
    frames[1].1[last] ^= 0x10;
    let contributions: Vec<Contribution<'_>> = frames
        .iter()
        .map(|(site, frame)| Contribution {
            site,
            frame,
            weight: 1.0 / 3.0,
        })
        .collect();
    let mut out = pattern(n);
    let error = reduce(&contributions, &mut out).unwrap_err();
    assert!(
        matches!(&error, ReduceError::Frame { site, source: DecodeError::PayloadChecksum { .. } } if site == "b"),
        "{error:?}"
    );
    assert_eq!(out, pattern(n));
    // The good ones reduce, re-weighted, once "b" is excluded.
    let without_b = [contributions[0], contributions[2]].map(|c| Contribution { weight: 0.5, ..c });
    reduce(&without_b, &mut out).unwrap();
    // Exactly 0.5·a + 0.5·c, decoded and summed in site order from +0.0.
    let mut expected = vec![0.0; n];
    decode_add(&frames[0].1, &mut expected, 0.5).unwrap();
    decode_add(&frames[2].1, &mut expected, 0.5).unwrap();
    assert_eq!(
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );

    let twice = [contributions[0], contributions[0]];
    assert!(matches!(
        reduce(&twice, &mut out),
        Err(ReduceError::DuplicateSite { .. })
    ));
    assert_eq!(reduce(&[], &mut out), Err(ReduceError::Empty));
    let mut short = pattern(n - 1);
    assert!(matches!(
        reduce(&without_b, &mut short),
        Err(ReduceError::Frame {
            source: DecodeError::AccumulatorLength { .. },
            ..
        })
    ));
    assert_eq!(short, pattern(n - 1));
}

#[test]
fn the_hash_is_printable_and_pinned() {
    let hash = fragment_hash(&[0.0, 1.0, -2.5]);
    assert_eq!(hash.len(), 71);
    assert!(hash.bytes().all(|b| b.is_ascii_graphic()));
    assert!(hash.starts_with("blake3:"));
    // The same bytes as hashing the little-endian f32s directly.
    let bytes: Vec<u8> = [0.0f32, 1.0, -2.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(hash, format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    // Across chunk boundaries of the hasher's 64 KiB buffer (16,384 f32s):
    // a seeded reduction of 40,000 elements, its hash pinned, so that a
    // change of the bits a reduction gives (another CPU, another build,
    // another kernel) or of the hashing is caught.
    // Uniform inputs from integers (no libm, whose last bits may differ
    // between platforms), at magnitudes 100× apart as in `site_frames`.
    let n = 40_000;
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let frames: Vec<(String, Vec<u8>)> = ["us-east", "eu-west", "ap-south"]
        .iter()
        .enumerate()
        .map(|(k, site)| {
            let magnitude = 100f32.powi(k as i32) * 2f32.powi(-31);
            let values: Vec<f32> = (0..n)
                .map(|_| rng.next_u32() as i32 as f32 * magnitude)
                .collect();
            let frame = Encoder::new(config(8, 256, true, false), n)
                .encode(&values)
                .unwrap();
            (site.to_string(), frame.into_bytes())
        })
        .collect();
    let contributions: Vec<Contribution<'_>> = frames
        .iter()
        .map(|(site, frame)| Contribution {
            site,
            frame,
            weight: 1.0 / 3.0,
        })
        .collect();
    let mut reduced = vec![0.0; n];
    reduce(&contributions, &mut reduced).unwrap();
    let bytes: Vec<u8> = reduced.iter().flat_map(|v| v.to_le_bytes()).collect();
    let hash = fragment_hash(&reduced);
    assert_eq!(hash, format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    assert_eq!(hash, GOLDEN_REDUCTION_HASH);
}

/// The hash of the seeded reduction in `the_hash_is_printable_and_pinned`.
const GOLDEN_REDUCTION_HASH: &str =
    "blake3:b05113b70af068ac622448158da20edb5a5f92fc90fea3a4f7433e6692977fda";
