//! The pseudo-gradient codec: what DiLoCo sites send each other at an outer
//! step, and how they add up what they receive.
//!
//! Pure: no I/O, no clock, no threads, no randomness. The transport moves
//! [`Frame`]s; the collective decides who reduces what.
//!
//! # Codecs
//!
//! Named as the sync planner names them (`longhaul_core::sync::Codec`,
//! `bits` and `block_size`; the plan's per-link `error_feedback` and
//! `zstd`): 16 bits (bf16 as is), 8 or 4 bits with one bf16 scale per
//! block of B elements (the planner's standard: B = 256 at 8 bits, 64 at 4).
//!
//! **Quantisation** (8 and 4 bits, L = 127 or 7 levels each side of zero):
//! per block, s = ↑bf16(max|v| / L), the quotient rounded *up* to a bf16 so
//! that |v/s| ≤ L; codes q = rne(fl(v × fl(1/s))), rounded to nearest with
//! ties to even (deterministic, no random rounding); decoded as q × s
//! (exact: at most 7 + 8 significant bits). The two f32 roundings before
//! rne put fl(v·fl(1/s)) within |v/s|·2⁻²³·(1 + 2⁻²³) ≤ L·2⁻²³·(1 + 2⁻²³)
//! of v/s, so, per element, **|v − q·s| ≤ s·(½ + L·2⁻²²)** (s/2 and at most
//! 2⁻¹⁵·s at 8 bits, 2⁻¹⁹·s at 4; not s/2 plus 2⁻²⁰·s, which 8 bits in
//! blocks of 2 exceed: 0.5000037·s), and s ≤ max|v|/L × (1 + 2⁻⁷). A block whose scale would be below the
//! smallest normal f32 (max|v| < L·2⁻¹²⁶) is sent with s = 0, as zeros.
//! At 16 bits, v is rounded to the nearest bf16 (ties to even):
//! |v − bf16(v)| ≤ 2⁻⁸·|v|.
//!
//! **Error feedback** ([`Encoder`], when `error_feedback`): the encoder keeps
//! a residual e per element of its fragment, zero at first; each round it
//! encodes v = x + e and keeps e ← v − decode(encode(v)). The error of the
//! sum of all rounds sent so far is then just the last residual, bounded
//! by s·(½ + L·2⁻²²) per element, where without feedback the rounding errors of the
//! rounds add up.
//!
//! **Size**, for n elements: payload = 2·⌈n/B⌉ + ⌈n·b/8⌉ bytes (bf16: 2n),
//! frame = 28 + payload. Per parameter that is b/8 + 2/B bytes plus 28/n,
//! the planner's b + 16/B bits (`bits_per_parameter`): 1.0078 B at 8 bits
//! (B = 256), 0.5313 B at 4 bits (B = 64), 0.5156 B at 4 bits (B = 128),
//! 2 B at 16 bits. zstd (level 1, optional per frame) replaces the payload
//! by a zstd frame only when that is shorter.
//!
//! # Decoding and reducing
//!
//! [`decode_add`] adds weight × a frame's values to an f32 accumulator:
//! `acc[i] ← acc[i] + q_i × (s × w)`. It checks everything first — header
//! fields, both CRC-32C checksums, every length against the header (no
//! arithmetic on an unchecked length), the element count against the
//! accumulator's length before any allocation or decompression (so a
//! frame can make it allocate at most 2 bytes per accumulator element, at
//! most [`MAX_PAYLOAD_BYTES`]), the zstd stage, every scale and
//! value finite and below 2⁶⁵, the frame canonical (no code −128 or −8,
//! no subnormal scale, only zero codes under a zero scale: what the
//! encoder writes), the accumulator's length and the weight —
//! and refuses with a [`DecodeError`] naming the field, having written
//! nothing. [`reduce()`] sums several sites' contributions in the order of
//! their site ids, so the result is bit-identical at every site, and
//! [`fragment_hash`] is what a site reports to the round.
//!
//! Bounds: at most [`MAX_ELEMENTS`] (2²⁴) elements per frame, block sizes
//! from 2 up to [`MAX_BLOCK_SIZE`] (2¹⁶), payloads of at most
//! [`MAX_PAYLOAD_BYTES`] (2²⁵) before zstd, inputs finite and below
//! [`MAX_MAGNITUDE`] (2⁶⁴) in magnitude ([`EncodeError::Value`] names the
//! first element that is not; the residual is then unchanged). Decoded
//! values can exceed their inputs (scales round up), so no bound is closed
//! under encode → decode; inputs below [`MAX_SOURCE_MAGNITUDE`] (2⁶⁰) stay
//! below 2⁶⁴ through the collective's encode → decode → weighted average
//! (weights in [0, 1] summing to at most 1) → re-encode → decode, with 2⁴
//! of headroom (at most 1.09× per hop).
//!
//! The frame's byte layout is in [`frame`]'s docs.

mod codec;
mod decoder;
mod encoder;
mod error;
pub mod frame;
mod kernels;
mod reduce;
#[cfg(test)]
mod tests;

pub use codec::{Codec, MAX_BLOCK_SIZE, MAX_ELEMENTS, MAX_PAYLOAD_BYTES, SCALE_BITS};
pub use decoder::{CheckedFrame, check, decode_add};
pub use encoder::{Encoder, EncoderConfig, MAX_MAGNITUDE, MAX_SOURCE_MAGNITUDE, ZSTD_LEVEL};
pub use error::{CodecError, DecodeError, EncodeError, ReduceError};
pub use frame::{Frame, FrameHeader};
pub use reduce::{Contribution, fragment_hash, reduce};
