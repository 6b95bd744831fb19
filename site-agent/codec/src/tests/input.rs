//! The codec's tests: input values.

use super::*;

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
