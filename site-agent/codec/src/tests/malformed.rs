//! The codec's tests: malformed frames.

use super::*;

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
