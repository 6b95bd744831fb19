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

mod allocation;
mod bounds;
mod error_feedback;
mod input;
mod malformed;
mod reduce;

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
