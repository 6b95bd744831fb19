//! What a peer sends as a pseudo-gradient frame (`longhaul_codec::decode_add`, `reduce`), and
//! what a trainer hands the encoder. The first byte picks the case: bit 0 reseals the frame's
//! checksums, so that the fuzzer reaches the zstd stage, the scales and the values behind
//! them; bits 1–2 make the accumulator one element shorter or longer than the header says;
//! bit 3 encodes the rest of the input (after three bytes of mutation) as f32 values first
//! (refused, or a frame that decodes; bits 4–5 pick the codec, bit 6 zstd), also with
//! `encode_into` at an offset into a larger fragment, which must give the same frame; bit 7
//! then flips bits of that frame (valid zstd payloads included) at the position the mutation
//! bytes give. Every frame is then reduced with one or two encoded frames of other sites.
//! A refused frame leaves the accumulator exactly as it was; an accepted one adds finite values,
//! the same bits every time; a reduction is refused exactly when one of its frames is, and
//! otherwise equals the frames decoded and added in site order; never a panic. Element counts
//! the target allocates for are capped at 2^16.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_codec::{
    Codec, Contribution, Encoder, EncoderConfig, Frame, FrameHeader, check, decode_add, reduce,
};

const HEADER_LEN: usize = 28;
/// The most elements the target allocates an accumulator for.
const MAX_TARGET_ELEMENTS: usize = 1 << 16;

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

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn run(input: &[u8]) {
    let Some((&flags, rest)) = input.split_first() else {
        return;
    };
    let mut frame = rest.to_vec();
    let mut codec = Codec::bf16();
    if flags & 8 != 0 {
        let (mutation, rest) = rest.split_at(rest.len().min(3));
        let values: Vec<f32> = rest
            .chunks_exact(4)
            .take(MAX_TARGET_ELEMENTS)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        codec = match flags >> 4 & 3 {
            0 => Codec::bf16(),
            1 => Codec::new(8, 16).expect("a codec"),
            2 => Codec::new(8, 2).expect("a codec"),
            _ => Codec::new(4, 6).expect("a codec"),
        };
        let config = EncoderConfig {
            codec,
            error_feedback: true,
            zstd: flags & 64 != 0,
        };
        let mut encoder = Encoder::new(config, values.len());
        // The same values at an offset into a larger fragment: the same frame.
        let offset = mutation.first().map_or(0, |&b| usize::from(b % 64));
        let mut ranged = Encoder::new(config, offset + values.len() + 3);
        let mut ranged_frame = Frame::new();
        let ranged_result = ranged.encode_into(offset, &values, &mut ranged_frame);
        match encoder.encode(&values) {
            Ok(encoded) => {
                ranged_result.expect("the same values encode at an offset");
                assert_eq!(ranged_frame.as_bytes(), encoded.as_bytes());
                let mut acc = vec![0.0; values.len()];
                decode_add(encoded.as_bytes(), &mut acc, 1.0).expect("an encoded frame decodes");
                assert!(acc.iter().all(|v| v.is_finite()));
                frame = encoded.into_bytes();
            }
            Err(_) => {
                assert!(ranged_result.is_err());
                assert!(encoder.residual().iter().all(|&r| r == 0.0));
                assert!(ranged.residual().iter().all(|&r| r == 0.0));
            }
        }
        if flags & 128 != 0 && !frame.is_empty() && mutation.len() == 3 {
            let at = usize::from(u16::from_le_bytes([mutation[1], mutation[2]])) % frame.len();
            frame[at] ^= mutation[2] | 1;
        }
    }
    if flags & 1 != 0 {
        reseal(&mut frame);
    }
    let declared = match FrameHeader::parse(&frame) {
        Ok((header, _)) => header.element_count,
        Err(_) => frame
            .get(12..16)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) as usize,
    }
    .min(MAX_TARGET_ELEMENTS);
    let n = match flags >> 1 & 3 {
        1 => declared.saturating_sub(1),
        2 => declared + 1,
        _ => declared,
    };
    let mut acc = pattern(n);
    let accepted = match decode_add(&frame, &mut acc, 0.5) {
        Ok(header) => {
            assert_eq!(header.element_count, n);
            assert!(acc.iter().all(|v| v.is_finite()));
            let mut again = pattern(n);
            check(&frame)
                .expect("it was accepted")
                .add_to(&mut again, 0.5)
                .expect("and adds");
            assert_eq!(bits(&acc), bits(&again));
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            assert_eq!(
                bits(&acc),
                bits(&pattern(n)),
                "refused ({error}) but written"
            );
            false
        }
    };

    // A reduction of this frame with one or two frames of other sites, of n elements in
    // the frame's codec (bf16 when it has none): refused exactly when this frame is.
    let others = 1 + usize::from(flags & 2 != 0);
    let config = EncoderConfig {
        codec,
        error_feedback: false,
        zstd: flags & 64 != 0,
    };
    let other_frames: Vec<Frame> = (0..others)
        .map(|k| {
            let values: Vec<f32> = (0..n)
                .map(|i| ((i * 7 + k * 3) % 11) as f32 - 5.0)
                .collect();
            Encoder::new(config, n)
                .encode(&values)
                .expect("small values encode")
        })
        .collect();
    let sites = ["m", "a", "z"];
    let mut contributions = vec![Contribution {
        site: sites[0],
        frame: &frame,
        weight: 0.5,
    }];
    for (k, other) in other_frames.iter().enumerate() {
        contributions.push(Contribution {
            site: sites[k + 1],
            frame: other.as_bytes(),
            weight: 0.25,
        });
    }
    let mut out = pattern(n);
    match reduce(&contributions, &mut out) {
        Ok(()) => {
            assert!(accepted, "reduce accepted a frame decode_add refused");
            let mut ordered = contributions.clone();
            ordered.sort_by(|a, b| a.site.cmp(b.site));
            let mut expected = vec![0.0; n];
            for c in &ordered {
                decode_add(c.frame, &mut expected, c.weight).expect("each frame was accepted");
            }
            assert_eq!(bits(&out), bits(&expected));
        }
        Err(error) => {
            assert!(
                !accepted,
                "reduce refused ({error}) a frame decode_add accepted"
            );
            assert_eq!(
                bits(&out),
                bits(&pattern(n)),
                "refused ({error}) but written"
            );
        }
    }
}

fuzz_target!(|input: &[u8]| run(input));
