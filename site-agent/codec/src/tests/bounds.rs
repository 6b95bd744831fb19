//! The codec's tests: bounds.

use super::*;

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
