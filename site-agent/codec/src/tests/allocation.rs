//! The codec's tests: allocation bounds.

use super::*;

/// A zstd frame of 2²⁴ zero elements at 8 bits in blocks of `block`: a few
/// KiB on the wire that decompress to tens of MiB.
fn zstd_bomb(block: u32) -> Vec<u8> {
    let n = MAX_ELEMENTS;
    // The raw size of blocks of 1 (no longer a codec) or of a real codec.
    let raw_len = if block == 1 {
        3 * n
    } else {
        Codec::new(8, block).unwrap().payload_bytes(n)
    };
    let packed = zstd::bulk::compress(&vec![0u8; raw_len], 1).unwrap();
    let mut frame = vec![0u8; HEADER_LEN];
    frame[0..4].copy_from_slice(b"LHPG");
    frame[4] = 1;
    frame[5] = 8;
    frame[6] = FLAG_ZSTD;
    set_u32(&mut frame, 8, block);
    set_u32(&mut frame, 12, n as u32);
    set_u32(&mut frame, 16, packed.len() as u32);
    frame.extend_from_slice(&packed);
    resealed(frame)
}

/// `frame` with its zstd payload replaced by bytes that are not zstd: a
/// decoder that reports `Zstd` for it decompressed before it compared the
/// element count with the accumulator.
fn not_zstd(frame: &[u8]) -> Vec<u8> {
    let mut bad = frame.to_vec();
    for b in &mut bad[HEADER_LEN..] {
        *b = 0x55;
    }
    resealed(bad)
}

/// Regression (failed before the fix): a 1.6 KB frame claiming 2²⁴ elements
/// was decompressed (48 MiB at 8 bits in blocks of 1, 32 MiB in blocks of 2)
/// before its element count was compared with the accumulator's 1000;
/// `reduce` decompressed every earlier site's payload before it looked at
/// a later site's header.
#[test]
fn a_small_frame_claiming_many_elements_is_refused_before_it_is_decompressed() {
    let bomb = zstd_bomb(2);
    assert!(bomb.len() < 64 * 1024, "{} bytes", bomb.len());
    let accumulator_length = DecodeError::AccumulatorLength {
        frame: MAX_ELEMENTS,
        accumulator: 1000,
    };
    assert_eq!(refused_untouched(&bomb, 1000), accumulator_length);
    // The order of the checks: the count is compared before zstd runs.
    assert_eq!(
        refused_untouched(&not_zstd(&bomb), 1000),
        accumulator_length
    );
    // Blocks of 1 are not a codec any more: refused from the header.
    let error = refused_untouched(&zstd_bomb(1), MAX_ELEMENTS);
    assert!(
        matches!(error, DecodeError::BlockSize { found: 1, .. }),
        "{error:?}"
    );

    // reduce checks every header against the output before decompressing
    // any payload, whatever the sites' order.
    let good_values: Vec<f32> = (0..1000).map(|i| (i / 100) as f32).collect();
    let good = Encoder::new(config(8, 256, false, true), 1000)
        .encode(&good_values)
        .unwrap();
    assert!(FrameHeader::parse(good.as_bytes()).unwrap().0.zstd);
    let good_but_not_zstd = not_zstd(good.as_bytes());
    for (first, second) in [("a", "b"), ("b", "a")] {
        for earlier in [good.as_bytes(), &good_but_not_zstd[..]] {
            let contributions = [
                Contribution {
                    site: first,
                    frame: earlier,
                    weight: 0.5,
                },
                Contribution {
                    site: second,
                    frame: &bomb,
                    weight: 0.5,
                },
            ];
            let mut out = pattern(1000);
            let error = reduce(&contributions, &mut out).unwrap_err();
            assert!(
                matches!(&error, ReduceError::Frame { site, source: DecodeError::AccumulatorLength { .. } } if site == second),
                "{error:?}"
            );
            assert_eq!(out, pattern(1000));
        }
    }
}

/// Regression (failed before the fix): magic and version were read before
/// the header's checksum, so a bit flipped in the version byte was
/// reported as an unsupported version.
#[test]
fn a_flipped_bit_in_the_header_is_a_checksum_error_whatever_field_it_hits() {
    for (name, frame, n) in small_frames() {
        for at in 0..24 {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[at] ^= 1 << bit;
                let error = refused_untouched(&bad, n);
                assert!(
                    matches!(error, DecodeError::HeaderChecksum { .. }),
                    "{name}, byte {at} bit {bit}: {error}"
                );
            }
        }
    }
}

/// What the collective does with pseudo-gradients at the largest source
/// magnitude: every site encodes (rounds of error feedback), the owner
/// decodes, averages (weights in [0, 1] summing to 1) and re-encodes the
/// average, everyone decodes it. Every step stays in the encoder's domain.
#[test]
fn sources_below_the_bound_survive_encode_decode_average_and_re_encode() {
    let largest = f32::from_bits(MAX_SOURCE_MAGNITUDE.to_bits() - 1);
    let sites: [Vec<f32>; 3] = [
        vec![largest, -largest, largest, 1.0, -largest, largest * 0.999],
        vec![largest, -largest, largest * 0.75, -1.0, -largest, largest],
        vec![largest, -largest, -largest, 0.0, -largest, largest * 0.5],
    ];
    let n = sites[0].len();
    for (bits, block) in [(16, 0), (8, 2), (4, 2), (8, 256), (4, 64)] {
        let mut encoders: Vec<Encoder> = (0..3)
            .map(|_| Encoder::new(config(bits, block, true, false), n))
            .collect();
        let mut owner = Encoder::new(config(bits, block, true, false), n);
        for round in 0..5 {
            let frames: Vec<Frame> = encoders
                .iter_mut()
                .zip(&sites)
                .map(|(e, x)| e.encode(x).unwrap())
                .collect();
            for weights in [[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [1.0 / 3.0; 3]] {
                let contributions: Vec<Contribution<'_>> = ["a", "b", "c"]
                    .iter()
                    .zip(&frames)
                    .zip(weights)
                    .map(|((site, f), weight)| Contribution {
                        site,
                        frame: f.as_bytes(),
                        weight,
                    })
                    .collect();
                let mut average = vec![0.0; n];
                reduce(&contributions, &mut average).unwrap();
                let again = owner.encode(&average).unwrap_or_else(|e| {
                    panic!("{bits} bits, round {round}, weights {weights:?}: {e}")
                });
                let applied = decode(&again, n);
                assert!(
                    applied.iter().all(|v| v.abs() < MAX_MAGNITUDE),
                    "{bits} bits: {applied:?}"
                );
            }
        }
    }
}

/// Codes are symmetric: −128 (8 bits) and −8 (4 bits) are never sent, for
/// random blocks or blocks whose elements sit at and just below the block's
/// maximum, negative or positive, with and without error feedback.
#[test]
fn the_asymmetric_codes_are_never_sent() {
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for _ in 0..2000 {
        // A random maximum, and elements at −max, −max·(1 − k·2⁻²⁴), +max.
        let max = f32::from_bits(0x0100_0000 + rng.next_u32() % 0x5D00_0000);
        let mut block: Vec<f32> = (0..8).map(|k| -f32::from_bits(max.to_bits() - k)).collect();
        block.extend([max, -max, max * 0.5, -max * (1.0 - 1.0e-7)]);
        blocks.push(block);
    }
    blocks.push(Gaussian::new(78).sample(1 << 14, 1.0));
    for (bits, block, min) in [
        (8, 2, -127),
        (8, 12, -127),
        (8, 256, -127),
        (4, 2, -7),
        (4, 12, -7),
        (4, 64, -7),
    ] {
        for error_feedback in [false, true] {
            for values in &blocks {
                let mut encoder =
                    Encoder::new(config(bits, block, error_feedback, false), values.len());
                for _ in 0..3 {
                    let frame = encoder.encode(values).unwrap();
                    let lowest = codes(&frame).into_iter().min().unwrap();
                    assert!(lowest >= min, "{bits} bits, B = {block}: code {lowest}");
                }
            }
        }
    }
}

/// Regression (failed before the fix): frames the encoder never writes —
/// codes −128 and −8, a subnormal scale, non-zero codes under a zero scale
/// — were accepted. Each is refused naming the field.
#[test]
fn non_canonical_frames_are_refused_by_name() {
    type Expected = fn(&DecodeError) -> bool;
    let cases: Vec<(&str, u32, usize, u8, Expected)> = vec![
        ("8-bit code -128", 8, 3, 0x80, |e| {
            matches!(
                e,
                DecodeError::Code {
                    index: 1,
                    code: -128,
                    levels: 127
                }
            )
        }),
        ("4-bit code -8, low nibble", 4, 2, 0x08, |e| {
            matches!(
                e,
                DecodeError::Code {
                    index: 0,
                    code: -8,
                    levels: 7
                }
            )
        }),
        ("4-bit code -8, high nibble", 4, 2, 0x87, |e| {
            matches!(
                e,
                DecodeError::Code {
                    index: 1,
                    code: -8,
                    ..
                }
            )
        }),
        ("subnormal scale", 8, 0, 0x01, |e| {
            matches!(
                e,
                DecodeError::Scale {
                    block: 0,
                    bits: 0x0001
                }
            )
        }),
    ];
    for (what, bits, at, byte, expected) in cases {
        let frame = Encoder::new(config(bits, 4, false, false), 4)
            .encode(&[1.0, 0.0, 0.0, 0.0])
            .unwrap();
        let mut bad = frame.into_bytes();
        bad[HEADER_LEN + at] = byte;
        if what == "subnormal scale" {
            bad[HEADER_LEN + 1] = 0;
        }
        let error = refused_untouched(&resealed(bad), 4);
        assert!(expected(&error), "{what}: {error:?}");
    }
    // A block of scale 0 (too small to send) must hold zero codes.
    for bits in [8, 4] {
        let frame = Encoder::new(config(bits, 4, false, false), 8)
            .encode(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            .unwrap();
        assert_eq!(scales(&frame)[1], 0.0);
        let mut bad = frame.into_bytes();
        // Element 7: code 16 at 8 bits; the high nibble, code 1, at 4.
        let last = bad.len() - 1;
        bad[last] = 0x10;
        let error = refused_untouched(&resealed(bad), 8);
        let code = if bits == 8 { 16 } else { 1 };
        assert_eq!(
            error,
            DecodeError::ZeroScaleCode {
                block: 1,
                index: 7,
                code
            },
            "{bits} bits"
        );
    }
}

/// Every NaN hashes as the one quiet NaN; other values as their bits.
#[test]
fn the_hash_canonicalises_nan() {
    let nans = [0x7FC0_0000u32, 0xFFC0_0000, 0x7F80_0001, 0x7FFF_FFFF];
    let hashes: std::collections::BTreeSet<String> = nans
        .iter()
        .map(|&bits| fragment_hash(&[1.0, f32::from_bits(bits)]))
        .collect();
    assert_eq!(hashes.len(), 1);
    assert_ne!(fragment_hash(&[0.0]), fragment_hash(&[-0.0]));
}
