//! What a peer sends as a pseudo-gradient frame (`longhaul_codec::decode_add`), and what a
//! trainer hands the encoder. The first byte picks the case: bit 0 reseals the input's
//! checksums, so that the fuzzer reaches the zstd stage, the scales and the values behind
//! them; bits 1–2 make the accumulator one element shorter or longer than the header says;
//! bit 3 encodes the rest of the input as f32 values first (refused, or a frame that decodes).
//! A refused frame leaves the accumulator exactly as it was; an accepted one adds finite values,
//! the same bits every time; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_codec::{Codec, Encoder, EncoderConfig, FrameHeader, check, decode_add};

const HEADER_LEN: usize = 28;

fn reseal(frame: &mut [u8]) {
    if frame.len() < HEADER_LEN {
        return;
    }
    let payload = crc32c::crc32c(&frame[HEADER_LEN..]);
    frame[20..24].copy_from_slice(&payload.to_le_bytes());
    let header = crc32c::crc32c(&frame[..24]);
    frame[24..28].copy_from_slice(&header.to_le_bytes());
}

fn pattern(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.25 - 1.0).collect()
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, rest)) = input.split_first() else {
        return;
    };
    let mut frame = rest.to_vec();
    if flags & 8 != 0 {
        let values: Vec<f32> = rest
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let codec = match flags >> 4 & 3 {
            0 => Codec::bf16(),
            1 => Codec::new(8, 16).expect("a codec"),
            _ => Codec::new(4, 6).expect("a codec"),
        };
        let config = EncoderConfig { codec, error_feedback: true, zstd: flags & 64 != 0 };
        let mut encoder = Encoder::new(config, values.len());
        match encoder.encode(&values) {
            Ok(encoded) => {
                let mut acc = vec![0.0; values.len()];
                decode_add(encoded.as_bytes(), &mut acc, 1.0).expect("an encoded frame decodes");
                assert!(acc.iter().all(|v| v.is_finite()));
                frame = encoded.into_bytes();
            }
            Err(_) => assert!(encoder.residual().iter().all(|&r| r == 0.0)),
        }
    }
    if flags & 1 != 0 {
        reseal(&mut frame);
    }
    let declared = match FrameHeader::parse(&frame) {
        Ok((header, _)) => header.element_count,
        Err(_) => frame.get(12..16).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .min(1 << 16) as usize,
    };
    let n = match flags >> 1 & 3 {
        1 => declared.saturating_sub(1),
        2 => declared + 1,
        _ => declared,
    };
    let mut acc = pattern(n);
    match decode_add(&frame, &mut acc, 0.5) {
        Ok(header) => {
            assert_eq!(header.element_count, n);
            assert!(acc.iter().all(|v| v.is_finite()));
            let mut again = pattern(n);
            check(&frame).expect("it was accepted").add_to(&mut again, 0.5).expect("and adds");
            assert_eq!(
                acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            assert_eq!(
                acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                pattern(n).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "refused ({error}) but written"
            );
        }
    }
});
