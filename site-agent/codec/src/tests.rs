//! The codec's tests: error bounds, error feedback, every malformed frame
//! refused with the accumulator untouched, and the reduction's bit identity.

use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::frame::{FLAG_ZSTD, HEADER_LEN};
use crate::kernels::bf16_to_f32;
use crate::*;

fn config(bits: u32, block_size: u32, error_feedback: bool, zstd: bool) -> EncoderConfig {
    EncoderConfig::new(bits, block_size, error_feedback, zstd).unwrap()
}

/// A seeded stream of standard normal values (Box–Muller over ChaCha8).
struct Gaussian(ChaCha8Rng);

impl Gaussian {
    fn new(seed: u64) -> Gaussian {
        Gaussian(ChaCha8Rng::seed_from_u64(seed))
    }

    fn uniform(&mut self) -> f64 {
        // (0, 1]: never 0, so the logarithm is finite.
        (f64::from(self.0.next_u32()) + 1.0) / 4_294_967_296.0
    }

    fn sample(&mut self, n: usize, sigma: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u, v) = (self.uniform(), self.uniform());
                let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
                z as f32 * sigma
            })
            .collect()
    }
}

fn decode(frame: &Frame, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    decode_add(frame.as_bytes(), &mut out, 1.0).unwrap();
    out
}

/// The scales a frame (without zstd) holds, as f32.
fn scales(frame: &Frame) -> Vec<f32> {
    let (header, payload) = FrameHeader::parse(frame.as_bytes()).unwrap();
    assert!(!header.zstd);
    let blocks = header.codec.blocks(header.element_count);
    payload[..2 * blocks]
        .chunks_exact(2)
        .map(|p| bf16_to_f32(u16::from_le_bytes([p[0], p[1]])))
        .collect()
}

fn rms(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v * v, n + 1));
    (sum / n.max(1) as f64).sqrt()
}

// ---------------------------------------------------------------- bounds

/// |x − y| ≤ s·(½ + L·2⁻²²), in f64 (exact for f32 operands).
fn within_bound(bits: u32, x: f32, y: f32, s: f32) -> bool {
    let levels = if bits == 8 { 127.0 } else { 7.0 };
    let bound = f64::from(s) * (0.5 + levels * 2f64.powi(-22));
    (f64::from(x) - f64::from(y)).abs() <= bound
}

/// Regression: the bound documented and tested was s/2 + 2⁻²⁰·s, but
/// q = rne(fl(v·fl(1/s))) can be off by about L·2⁻²³: here by 0.5000037·s.
#[test]
fn the_error_bound_holds_where_the_old_one_did_not() {
    let values = [f32::from_bits(0x3f82_6072), f32::from_bits(0x3efd_afff)];
    let frame = Encoder::new(config(8, 2, false, false), 2)
        .encode(&values)
        .unwrap();
    let s = scales(&frame)[0];
    let decoded = decode(&frame, 2);
    let error = (f64::from(values[1]) - f64::from(decoded[1])).abs() / f64::from(s);
    assert!(error > 0.5 + 2f64.powi(-20), "{error}: the trigger");
    assert!(within_bound(8, values[1], decoded[1], s), "{error}");
    assert!(within_bound(8, values[0], decoded[0], s));
}

proptest! {
    /// |x − q(x)| ≤ s·(½ + L·2⁻²²) per element, s its block's scale, and
    /// with error feedback the residual is exactly v − q(v).
    #[test]
    fn each_element_is_within_its_blocks_error_bound(
        bits in prop::sample::select(vec![8u32, 4]),
        half_block in 1u32..80,
        magnitude in -30i32..30,
        values in prop::collection::vec(-1.0f32..1.0, 0..600),
        error_feedback in any::<bool>(),
    ) {
        let block = 2 * half_block;
        let scale_up = 2f32.powi(magnitude);
        let values: Vec<f32> = values.iter().map(|v| v * scale_up).collect();
        let mut encoder = Encoder::new(config(bits, block, error_feedback, false), values.len());
        let frame = encoder.encode(&values).unwrap();
        let decoded = decode(&frame, values.len());
        let scales = scales(&frame);
        for (i, (&x, &y)) in values.iter().zip(&decoded).enumerate() {
            let s = scales[i / block as usize];
            prop_assert!(within_bound(bits, x, y, s), "element {i}: {x} decoded as {y}, scale {s}");
        }
        for (b, chunk) in values.chunks(block as usize).enumerate() {
            let max = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
            let levels = if bits == 8 { 127.0 } else { 7.0 };
            prop_assert!(scales[b] >= max / levels * (1.0 - 1e-6));
            prop_assert!(scales[b] <= max / levels * (1.0 + 2f32.powi(-7)));
        }
        if error_feedback {
            for ((&x, &y), &r) in values.iter().zip(&decoded).zip(encoder.residual()) {
                prop_assert_eq!(r.to_bits(), (x - y).to_bits());
            }
        }
    }

    /// bf16 passthrough: the nearest bf16, |x − y| ≤ 2⁻⁸·|x|.
    #[test]
    fn bf16_passthrough_is_within_half_an_ulp(
        values in prop::collection::vec(-1.0e6f32..1.0e6, 0..300),
    ) {
        let mut encoder = Encoder::new(config(16, 0, false, false), values.len());
        let decoded = decode(&encoder.encode(&values).unwrap(), values.len());
        for (&x, &y) in values.iter().zip(&decoded) {
            prop_assert!((x - y).abs() <= x.abs() * 2f32.powi(-8), "{x} decoded as {y}");
        }
    }

    /// zstd changes the bytes on the wire, never what they decode to.
    #[test]
    fn zstd_decodes_to_the_same_values(
        bits in prop::sample::select(vec![16u32, 8, 4]),
        values in prop::collection::vec(-4i8..4, 0..2000),
    ) {
        let block = if bits == 16 { 0 } else { 64 };
        let values: Vec<f32> = values.iter().map(|&v| f32::from(v) * 0.25).collect();
        let plain = Encoder::new(config(bits, block, true, false), values.len()).encode(&values).unwrap();
        let packed = Encoder::new(config(bits, block, true, true), values.len()).encode(&values).unwrap();
        prop_assert!(packed.len() <= plain.len());
        let (a, b) = (decode(&plain, values.len()), decode(&packed, values.len()));
        prop_assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

#[test]
fn zstd_is_used_only_where_it_shrinks_the_payload() {
    let n = 4096;
    let flags = |frame: &Frame| frame.as_bytes()[6];
    // A smooth fragment compresses: the flag is set and the frame shorter.
    let smooth: Vec<f32> = (0..n).map(|i| (i / 512) as f32).collect();
    let mut encoder = Encoder::new(config(8, 256, false, true), n);
    let frame = encoder.encode(&smooth).unwrap();
    assert_eq!(flags(&frame) & FLAG_ZSTD, FLAG_ZSTD);
    assert!(frame.len() < Codec::new(8, 256).unwrap().frame_bytes(n) / 4);
    // Uniform noise uses every code: zstd cannot shrink it, it is sent raw.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let noise: Vec<f32> = (0..n)
        .map(|_| rng.next_u32() as f32 / 4.3e9 - 0.5)
        .collect();
    let frame = Encoder::new(config(8, 256, false, true), n)
        .encode(&noise)
        .unwrap();
    assert_eq!(flags(&frame) & FLAG_ZSTD, 0);
    assert_eq!(frame.len(), Codec::new(8, 256).unwrap().frame_bytes(n));
}

#[test]
fn bf16_input_encodes_as_its_f32_values_do() {
    let values = Gaussian::new(3).sample(40_000, 0.01);
    let bf16: Vec<u16> = values.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    let widened: Vec<f32> = bf16.iter().map(|&b| bf16_to_f32(b)).collect();
    for (bits, block) in [(16, 0), (8, 256), (4, 64), (4, 6)] {
        let mut from_f32 = Encoder::new(config(bits, block, true, false), values.len());
        let mut from_bf16 = Encoder::new(config(bits, block, true, false), values.len());
        for _ in 0..3 {
            let a = from_f32.encode(&widened).unwrap();
            let b = from_bf16.encode_bf16(&bf16).unwrap();
            assert_eq!(
                a.as_bytes()[HEADER_LEN..],
                b.as_bytes()[HEADER_LEN..],
                "{bits} bits"
            );
            assert!(FrameHeader::parse(b.as_bytes()).unwrap().0.bf16_input);
        }
        assert_eq!(from_f32.residual(), from_bf16.residual());
    }
}

#[test]
fn a_block_of_zeros_or_subnormals_is_sent_as_zeros_and_kept_in_the_residual() {
    let values = [0.0, 1.0e-40, -1.0e-39, 0.0];
    let mut encoder = Encoder::new(config(8, 4, true, false), 4);
    let frame = encoder.encode(&values).unwrap();
    assert_eq!(scales(&frame), [0.0]);
    assert_eq!(decode(&frame, 4), [0.0; 4]);
    assert_eq!(encoder.residual(), values);
}

#[test]
fn the_frame_layout_is_pinned() {
    // Scale ↑bf16(1/127) = 0x3c02 (0x3c01 is just below 1/127); codes
    // rne(x·(1/s)): 126, −63, 32, 0.
    let mut encoder = Encoder::new(config(8, 4, false, false), 4);
    let frame = encoder.encode(&[1.0, -0.5, 0.25, 0.0]).unwrap();
    let bytes = frame.as_bytes();
    assert_eq!(
        &bytes[..16],
        b"LHPG\x01\x08\x00\x00\x04\x00\x00\x00\x04\x00\x00\x00"
    );
    assert_eq!(&bytes[16..20], &6u32.to_le_bytes());
    assert_eq!(&bytes[20..24], &crc32c::crc32c(&bytes[28..]).to_le_bytes());
    assert_eq!(&bytes[24..28], &crc32c::crc32c(&bytes[..24]).to_le_bytes());
    assert_eq!(&bytes[28..], [0x02, 0x3c, 126, (-63i8) as u8, 32, 0]);
    // 4 bits: codes 7, −3 (0xd), 2, 0, 1 → bytes 0xd7, 0x02, 0x01.
    let mut encoder = Encoder::new(config(4, 6, false, false), 5);
    let frame = encoder.encode(&[1.0, -0.4, 0.3, 0.0, 0.1]).unwrap();
    assert_eq!(&frame.as_bytes()[28..], [0x13, 0x3e, 0xd7, 0x02, 0x01]);
}

/// The planner's standard codecs are this crate's, and a frame of n
/// elements is 28 bytes plus n × the planner's `bits_per_parameter` / 8.
#[test]
fn frames_are_the_size_the_sync_planners_byte_model_says() {
    let planned = longhaul_core::sync::Codec::standard();
    assert_eq!(planned.len(), 3);
    for p in planned {
        let codec = Codec::new(p.bits, p.block_size).unwrap();
        assert_eq!(Codec::standard(p.bits).unwrap(), codec);
        if p.block_size > 0 {
            assert_eq!(p.scale_bits, SCALE_BITS);
        }
        assert_eq!(codec.bits_per_parameter(), p.bits_per_parameter());
        let n = 1 << 16;
        let values = Gaussian::new(2).sample(n, 1.0e-3);
        let config = EncoderConfig {
            codec,
            error_feedback: true,
            zstd: false,
        };
        let frame = Encoder::new(config, n).encode(&values).unwrap();
        let modelled = n as f64 * p.bits_per_parameter() / 8.0;
        assert_eq!(
            (frame.len() - HEADER_LEN) as f64,
            modelled,
            "{} bits",
            p.bits
        );
    }
}

// ----------------------------------------------------------- error feedback

/// Σ over rounds of what was sent against Σ of the inputs: the error of the
/// model's accumulated update.
fn accumulated_error(bits: u32, block: u32, error_feedback: bool, rounds: usize) -> (f64, f64) {
    let n = 1 << 14;
    let mut stream = Gaussian::new(42);
    let mut encoder = Encoder::new(config(bits, block, error_feedback, false), n);
    let mut sent = vec![0.0f64; n];
    let mut truth = vec![0.0f64; n];
    let mut first = 0.0;
    for round in 0..rounds {
        let x = stream.sample(n, 1.0e-3);
        let y = decode(&encoder.encode(&x).unwrap(), n);
        for i in 0..n {
            sent[i] += f64::from(y[i]);
            truth[i] += f64::from(x[i]);
        }
        if round == 0 {
            first = rms(sent.iter().zip(&truth).map(|(s, t)| s - t));
        }
    }
    (first, rms(sent.iter().zip(&truth).map(|(s, t)| s - t)))
}

#[test]
fn error_feedback_keeps_the_accumulated_error_bounded() {
    for (bits, block) in [(8, 256), (4, 64)] {
        let (first, with) = accumulated_error(bits, block, true, 100);
        let (first_without, without) = accumulated_error(bits, block, false, 100);
        assert_eq!(first, first_without, "round 1 is the same either way");
        // With feedback the accumulated error is the last residual: about
        // one round's. Without, 100 independent errors add up: about √100×.
        assert!(
            with < 1.5 * first,
            "{bits} bits: {with} after 100 rounds, {first} after 1"
        );
        assert!(
            without > 7.0 * first,
            "{bits} bits: {without} after 100 rounds, {first} after 1"
        );
    }
}

// ---------------------------------------------------------- malformed frames

fn small_frames() -> Vec<(String, Vec<u8>, usize)> {
    let values = Gaussian::new(9).sample(37, 1.0);
    let long = Gaussian::new(9).sample(301, 1.0);
    let mut frames = Vec::new();
    for (bits, block) in [(16, 0), (8, 8), (4, 8)] {
        for zstd in [false, true] {
            // Repetitive values, so that zstd does compress them.
            let input: Vec<f32> = if zstd {
                long.iter().map(|v| v.signum()).collect()
            } else {
                values.clone()
            };
            let mut encoder = Encoder::new(config(bits, block, true, zstd), input.len());
            let frame = encoder.encode(&input).unwrap();
            assert_eq!(FrameHeader::parse(frame.as_bytes()).unwrap().0.zstd, zstd);
            frames.push((
                format!("{bits} bits, zstd {zstd}"),
                frame.into_bytes(),
                input.len(),
            ));
        }
    }
    frames
}

/// An accumulator with a recognisable pattern, to see that nothing wrote to it.
fn pattern(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 3.0).collect()
}

fn refused_untouched(frame: &[u8], n: usize) -> DecodeError {
    let mut acc = pattern(n);
    let error = decode_add(frame, &mut acc, 1.0).expect_err("a malformed frame is refused");
    assert_eq!(acc, pattern(n), "the accumulator was written: {error}");
    error
}

#[test]
fn a_frame_with_any_byte_flipped_is_refused_and_the_accumulator_untouched() {
    for (name, frame, n) in small_frames() {
        decode_add(&frame, &mut pattern(n), 1.0).unwrap();
        for at in 0..frame.len() {
            for flip in [0x01, 0x80, 0xFF] {
                let mut bad = frame.clone();
                bad[at] ^= flip;
                let error = refused_untouched(&bad, n);
                assert!(!error.to_string().is_empty(), "{name}, byte {at}");
            }
        }
    }
}

#[test]
fn a_frame_cut_at_any_length_or_extended_is_refused() {
    for (name, frame, n) in small_frames() {
        for len in 0..frame.len() {
            let error = refused_untouched(&frame[..len], n);
            assert!(
                matches!(
                    error,
                    DecodeError::Truncated { .. } | DecodeError::FrameLength { .. }
                ),
                "{name}, cut at {len}: {error}"
            );
        }
        let mut longer = frame.clone();
        longer.push(0);
        assert!(matches!(
            refused_untouched(&longer, n),
            DecodeError::FrameLength { .. }
        ));
    }
}

/// Rewrites the checksums after a deliberate change, so that the check
/// under test is the one that refuses.
fn resealed(mut frame: Vec<u8>) -> Vec<u8> {
    let payload = crc32c::crc32c(&frame[HEADER_LEN..]);
    frame[20..24].copy_from_slice(&payload.to_le_bytes());
    let header = crc32c::crc32c(&frame[..24]);
    frame[24..28].copy_from_slice(&header.to_le_bytes());
    frame
}

fn set_u32(frame: &mut [u8], at: usize, value: u32) {
    frame[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn each_malformed_field_is_refused_by_name() {
    // (what is wrong, the frame's values, the codec, the change, the error)
    type Change = fn(&mut Vec<u8>);
    type Expected = fn(&DecodeError) -> bool;
    let n = 37;
    let values = Gaussian::new(5).sample(n, 1.0);
    let cases: Vec<(&str, u32, u32, Change, Expected)> = vec![
        (
            "magic",
            8,
            8,
            |f| f[0] = b'X',
            |e| matches!(e, DecodeError::Magic { .. }),
        ),
        (
            "version",
            8,
            8,
            |f| f[4] = 2,
            |e| matches!(e, DecodeError::Version { found: 2, .. }),
        ),
        (
            "header checksum",
            8,
            8,
            |f| f[24] ^= 1,
            |e| matches!(e, DecodeError::HeaderChecksum { .. }),
        ),
        (
            "bits",
            8,
            8,
            |f| f[5] = 2,
            |e| matches!(e, DecodeError::Bits { found: 2 }),
        ),
        (
            "flags",
            8,
            8,
            |f| f[6] = 0x80,
            |e| matches!(e, DecodeError::Flags { found: 0x80 }),
        ),
        (
            "reserved",
            8,
            8,
            |f| f[7] = 1,
            |e| matches!(e, DecodeError::Reserved { found: 1 }),
        ),
        (
            "block size 0",
            8,
            8,
            |f| set_u32(f, 8, 0),
            |e| matches!(e, DecodeError::BlockSize { found: 0, .. }),
        ),
        (
            "absurd block size",
            8,
            8,
            |f| set_u32(f, 8, 1 << 20),
            |e| matches!(e, DecodeError::BlockSize { .. }),
        ),
        (
            "odd 4-bit block",
            4,
            8,
            |f| set_u32(f, 8, 7),
            |e| matches!(e, DecodeError::BlockSize { found: 7, .. }),
        ),
        (
            "bf16 with blocks",
            16,
            0,
            |f| set_u32(f, 8, 8),
            |e| matches!(e, DecodeError::BlockSize { .. }),
        ),
        (
            "too many elements",
            8,
            8,
            |f| set_u32(f, 12, u32::MAX),
            |e| matches!(e, DecodeError::ElementCount { .. }),
        ),
        (
            "another element count",
            8,
            8,
            |f| set_u32(f, 12, 36),
            |e| matches!(e, DecodeError::PayloadLength { .. }),
        ),
        (
            "payload length",
            8,
            8,
            |f| set_u32(f, 16, u32::MAX),
            |e| matches!(e, DecodeError::PayloadLength { .. }),
        ),
        (
            "zstd flag on a raw payload",
            8,
            8,
            |f| f[6] |= FLAG_ZSTD,
            |e| matches!(e, DecodeError::PayloadLength { .. }),
        ),
        (
            "payload checksum",
            8,
            8,
            |f| set_u32(f, 20, 0),
            |e| matches!(e, DecodeError::PayloadChecksum { .. }),
        ),
        (
            "NaN scale",
            8,
            8,
            |f| {
                f[28] = 0xC0;
                f[29] = 0x7F;
            },
            |e| {
                matches!(
                    e,
                    DecodeError::Scale {
                        block: 0,
                        bits: 0x7FC0
                    }
                )
            },
        ),
        (
            "negative scale",
            8,
            8,
            |f| f[31] |= 0x80,
            |e| matches!(e, DecodeError::Scale { block: 1, .. }),
        ),
        (
            "infinite bf16 value",
            16,
            0,
            |f| {
                f[30] = 0x80;
                f[31] = 0xFF;
            },
            |e| {
                matches!(
                    e,
                    DecodeError::Value {
                        index: 1,
                        bits: 0xFF80
                    }
                )
            },
        ),
        (
            "4-bit padding",
            4,
            8,
            |f| {
                let last = f.len() - 1;
                f[last] |= 0x50;
            },
            |e| matches!(e, DecodeError::Padding { found: 5 }),
        ),
    ];
    for (what, bits, block, change, expected) in cases {
        let mut encoder = Encoder::new(config(bits, block, false, false), n);
        let mut frame = encoder.encode(&values).unwrap().into_bytes();
        change(&mut frame);
        match what {
            "header checksum" => {}
            // The payload's checksum is the field under test: reseal the header only.
            "payload checksum" => {
                let header = crc32c::crc32c(&frame[..24]);
                frame[24..28].copy_from_slice(&header.to_le_bytes());
            }
            _ => frame = resealed(frame),
        }
        let error = refused_untouched(&frame, n);
        assert!(expected(&error), "{what}: refused with {error:?}");
    }
}

#[test]
fn a_zstd_payload_that_is_not_what_the_header_says_is_refused() {
    let n = 4096;
    let values: Vec<f32> = (0..n).map(|i| (i / 512) as f32).collect();
    let frame = Encoder::new(config(8, 256, false, true), n)
        .encode(&values)
        .unwrap();
    // Claim fewer elements: the zstd frame decompresses to more bytes.
    let mut shorter = frame.as_bytes().to_vec();
    set_u32(&mut shorter, 12, n as u32 - 256);
    let error = refused_untouched(&resealed(shorter), n - 256);
    assert!(
        matches!(
            error,
            DecodeError::Zstd { .. } | DecodeError::DecompressedLength { .. }
        ),
        "{error:?}"
    );
    // Claim 256 more elements: zstd fills fewer bytes than the header
    // says, and the decoder reports exactly that.
    let mut longer = frame.as_bytes().to_vec();
    set_u32(&mut longer, 12, n as u32 + 256);
    let error = refused_untouched(&resealed(longer), n + 256);
    let raw = Codec::new(8, 256).unwrap().payload_bytes(n);
    assert_eq!(
        error,
        DecodeError::DecompressedLength {
            expected: Codec::new(8, 256).unwrap().payload_bytes(n + 256),
            found: raw
        }
    );
    // Garbage behind a valid checksum.
    let mut garbage = frame.as_bytes().to_vec();
    for b in &mut garbage[HEADER_LEN..] {
        *b = 0x55;
    }
    assert!(matches!(
        refused_untouched(&resealed(garbage), n),
        DecodeError::Zstd { .. }
    ));
}

#[test]
fn the_accumulator_and_the_weight_are_checked_before_adding() {
    let frame = Encoder::new(config(8, 8, false, false), 10)
        .encode(&[1.0; 10])
        .unwrap();
    let mut acc = pattern(9);
    let error = decode_add(frame.as_bytes(), &mut acc, 1.0).unwrap_err();
    assert_eq!(
        error,
        DecodeError::AccumulatorLength {
            frame: 10,
            accumulator: 9
        }
    );
    assert_eq!(acc, pattern(9));
    for weight in [f32::NAN, f32::INFINITY, 1.0e10] {
        let mut acc = pattern(10);
        let error = decode_add(frame.as_bytes(), &mut acc, weight).unwrap_err();
        assert!(matches!(error, DecodeError::Weight { .. }));
        assert_eq!(acc, pattern(10));
    }
}

// ------------------------------------------------------------- input values

#[test]
fn non_finite_or_huge_input_is_refused_naming_the_element_and_the_residual_kept() {
    let n = 10_000;
    let good = Gaussian::new(1).sample(n, 1.0);
    for bad in [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        MAX_MAGNITUDE,
        -3.0e30,
    ] {
        let mut encoder = Encoder::new(config(8, 256, true, false), n);
        encoder.encode(&good).unwrap();
        let residual = encoder.residual().to_vec();
        let mut values = good.clone();
        values[7777] = bad;
        let error = encoder.encode(&values).unwrap_err();
        assert!(
            matches!(error, EncodeError::Value { index: 7777, .. }),
            "{bad}: {error:?}"
        );
        assert_eq!(encoder.residual(), residual);
        // bf16 input likewise.
        let bf16: Vec<u16> = values.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let error = encoder.encode_bf16(&bf16).unwrap_err();
        assert!(
            matches!(error, EncodeError::Value { index: 7777, .. }),
            "{bad}: {error:?}"
        );
        assert_eq!(encoder.residual(), residual);
    }
    // The largest accepted magnitude encodes and decodes finitely.
    let mut encoder = Encoder::new(config(4, 64, true, false), 3);
    let edge = [MAX_MAGNITUDE * 0.999, -MAX_MAGNITUDE * 0.999, 1.0];
    let decoded = decode(&encoder.encode(&edge).unwrap(), 3);
    assert!(decoded.iter().all(|v| v.is_finite()));
}

/// Regression: the largest f32 below 2⁶⁴ rounds to 2⁶⁴ as a bf16, and its
/// residual pushes the next round's value past 2⁶⁴: every frame the encoder
/// writes from accepted input must decode.
#[test]
fn frames_of_the_largest_accepted_inputs_decode() {
    let largest = f32::from_bits(0x5F7F_FFFF);
    let values = [largest, -largest, largest * 0.999, 1.0, -largest];
    for (bits, block) in [(16, 0), (8, 2), (4, 2)] {
        let mut encoder = Encoder::new(config(bits, block, true, false), values.len());
        for round in 0..5 {
            let frame = encoder.encode(&values).unwrap();
            let mut acc = vec![0.0; values.len()];
            decode_add(frame.as_bytes(), &mut acc, 1.0)
                .unwrap_or_else(|e| panic!("{bits} bits, round {round}: {e}"));
            assert!(acc.iter().all(|v| v.is_finite()));
        }
    }
}

#[test]
fn ranges_encode_with_their_own_part_of_the_residual() {
    let n = 1000;
    let values = Gaussian::new(11).sample(n, 1.0);
    let mut whole = Encoder::new(config(8, 100, true, false), n);
    let mut parts = Encoder::new(config(8, 100, true, false), n);
    let frame = whole.encode(&values).unwrap();
    let first = parts.encode_range(0, &values[..600]).unwrap();
    let mut second = Frame::new();
    parts.encode_into(600, &values[600..], &mut second).unwrap();
    // Blocks start at 0 and at 600 in both: the same residual.
    assert_eq!(whole.residual(), parts.residual());
    let mut joined = vec![0.0; n];
    decode_add(first.as_bytes(), &mut joined[..600], 1.0).unwrap();
    decode_add(second.as_bytes(), &mut joined[600..], 1.0).unwrap();
    assert_eq!(joined, decode(&frame, n));
    assert!(matches!(
        parts.encode_range(900, &values[..200]),
        Err(EncodeError::Range { .. })
    ));
    assert!(matches!(
        parts.encode(&values[..10]),
        Err(EncodeError::FragmentLength { .. })
    ));
}

// ------------------------------------------------------------------ reduce

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

// ------------------------------------------------------- allocation bounds

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

/// The codes of a frame (without zstd) as signed integers.
fn codes(frame: &Frame) -> Vec<i8> {
    let (header, payload) = FrameHeader::parse(frame.as_bytes()).unwrap();
    assert!(!header.zstd);
    let codes = &payload[2 * header.codec.blocks(header.element_count)..];
    match header.codec.bits() {
        8 => codes.iter().map(|&c| c as i8).collect(),
        _ => codes
            .iter()
            .flat_map(|&c| [((c << 4) as i8) >> 4, (c as i8) >> 4])
            .take(header.element_count)
            .collect(),
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
