//! Decoding: every check first, then the additions, which cannot fail.

use std::borrow::Cow;

use crate::error::DecodeError;
use crate::frame::FrameHeader;
use crate::kernels;

/// Scales and bf16 values a frame may hold: finite, below 2⁶⁵ (bf16 bits
/// 0x6000), scales also not negative. Twice the encoder's input bound: an
/// input just below 2⁶⁴ plus its residual, rounded, can reach 2⁶⁴ itself.
const MAX_VALUE_BF16: u16 = 0x6000;
/// Weights are finite and within ±2³²: with scales below 2⁶⁵ and codes of at
/// most 128, every term q·(s·w) is finite. That is all this bound is for:
/// the collective passes weights in [0, 1] summing to at most 1, so that
/// its average stays in the encoder's domain (`MAX_SOURCE_MAGNITUDE`).
const MAX_WEIGHT: f32 = 4_294_967_296.0;

/// A frame that passed every check: header, checksums, lengths, the zstd
/// stage, scales and values. Adding it can only be refused for the
/// accumulator's length or the weight, which are checked before anything
/// is written.
#[derive(Debug, Clone)]
pub struct CheckedFrame<'a> {
    header: FrameHeader,
    /// The payload before zstd: borrowed from the frame, or decompressed.
    payload: Cow<'a, [u8]>,
}

/// Checks `frame` whole, decompressing it if it is zstd-compressed (into a
/// buffer of the header's payload size, at most
/// [`crate::MAX_PAYLOAD_BYTES`]). To decode into an accumulator, use
/// [`decode_add`], which checks the element count against the
/// accumulator before it decompresses anything.
pub fn check(frame: &[u8]) -> Result<CheckedFrame<'_>, DecodeError> {
    check_payload(FrameHeader::parse(frame)?, None)
}

/// The checks after the header's: the zstd stage (with `decompressor`, a
/// context to reuse, when given), scales, values, padding.
pub(crate) fn check_payload<'a>(
    (header, stored): (FrameHeader, &'a [u8]),
    decompressor: Option<&mut zstd::bulk::Decompressor<'static>>,
) -> Result<CheckedFrame<'a>, DecodeError> {
    let codec = header.codec;
    let raw_len = codec.payload_bytes(header.element_count);
    let payload = if header.zstd {
        let zstd_error = |e: std::io::Error| DecodeError::Zstd {
            reason: e.to_string(),
        };
        // Exactly as long as the header says: zstd refuses to write more.
        let mut raw = vec![0; raw_len];
        let found = match decompressor {
            Some(context) => context.decompress_to_buffer(stored, &mut raw[..]),
            None => zstd::bulk::decompress_to_buffer(stored, &mut raw[..]),
        }
        .map_err(zstd_error)?;
        if found != raw_len {
            return Err(DecodeError::DecompressedLength {
                expected: raw_len,
                found,
            });
        }
        Cow::Owned(raw)
    } else {
        Cow::Borrowed(stored)
    };

    let n = header.element_count;
    let (scales, codes) = payload.split_at(2 * codec.blocks(n));
    if let Some(block) = first_bf16_at_or_above(scales, MAX_VALUE_BF16, 0xFFFF) {
        return Err(DecodeError::Scale {
            block,
            bits: bf16_at(scales, block),
        });
    }
    // Subnormal scales: the encoder sends a block below the smallest
    // normal scale as scale 0 (negative ones were refused above).
    if let Some(block) = first_bf16_in(scales, 0x0001, 0x007F) {
        return Err(DecodeError::Scale {
            block,
            bits: bf16_at(scales, block),
        });
    }
    if codec.bits() == 4 && n % 2 == 1 {
        let high = codes.last().map_or(0, |&last| last >> 4);
        if high != 0 {
            return Err(DecodeError::Padding { found: high });
        }
    }
    if codec.bits() != 16 {
        check_codes(codec, n, scales, codes)?;
    }
    let bad_value = match codec.bits() {
        16 => first_bf16_at_or_above(codes, MAX_VALUE_BF16, 0x7FFF),
        _ => None,
    };
    if let Some(index) = bad_value {
        return Err(DecodeError::Value {
            index,
            bits: bf16_at(codes, index),
        });
    }
    Ok(CheckedFrame { header, payload })
}

/// Checks `frame` and adds `weight` × its values to `acc`:
/// `acc[i] ← acc[i] + q_i × (s_b × weight)` (bf16 values: `v_i × weight`), each
/// operation rounded to f32, element by element in index order. The
/// header's element count is checked against `acc` (and the weight) right
/// after the header itself, before any allocation or decompression: a
/// small frame cannot make the decoder allocate more than 2 bytes per
/// element of `acc`. On any error `acc` is untouched.
pub fn decode_add(frame: &[u8], acc: &mut [f32], weight: f32) -> Result<FrameHeader, DecodeError> {
    let parsed = FrameHeader::parse(frame)?;
    check_target(&parsed.0, acc.len(), weight)?;
    let checked = check_payload(parsed, None)?;
    checked.add_to(acc, weight)?;
    Ok(checked.header)
}

impl CheckedFrame<'_> {
    pub fn header(&self) -> &FrameHeader {
        &self.header
    }

    /// Elements the frame holds.
    pub fn len(&self) -> usize {
        self.header.element_count
    }

    pub fn is_empty(&self) -> bool {
        self.header.element_count == 0
    }

    /// Adds `weight` × the frame's values to `acc`, as [`decode_add`]
    /// does; refused, with `acc` untouched, when `acc` is not as long as
    /// the frame or the weight is not finite and within ±2³².
    pub fn add_to(&self, acc: &mut [f32], weight: f32) -> Result<(), DecodeError> {
        self.check_target(acc.len(), weight)?;
        let n = self.header.element_count;
        let codec = self.header.codec;
        let (scales, codes) = self.payload.split_at(2 * codec.blocks(n));
        if codec.bits() == 16 {
            kernels::add16(codes, weight, acc);
            return Ok(());
        }
        let block = codec.block_size() as usize;
        let code_block = block * codec.bits() as usize / 8;
        let add = if codec.bits() == 8 {
            kernels::add8
        } else {
            kernels::add4
        };
        let blocks = acc
            .chunks_mut(block)
            .zip(codes.chunks(code_block))
            .zip(scales.chunks_exact(2));
        for ((a, c), s) in blocks {
            let scale = kernels::bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            add(c, scale * weight, a);
        }
        Ok(())
    }
}

impl CheckedFrame<'_> {
    /// What [`CheckedFrame::add_to`] refuses: see [`check_target`].
    pub(crate) fn check_target(&self, accumulator: usize, weight: f32) -> Result<(), DecodeError> {
        check_target(&self.header, accumulator, weight)
    }
}

/// An accumulator of another length than the frame's, or a weight that is
/// not finite or beyond ±2³².
pub(crate) fn check_target(
    header: &FrameHeader,
    accumulator: usize,
    weight: f32,
) -> Result<(), DecodeError> {
    if accumulator != header.element_count {
        return Err(DecodeError::AccumulatorLength {
            frame: header.element_count,
            accumulator,
        });
    }
    if weight.is_nan() || weight.abs() > MAX_WEIGHT {
        return Err(DecodeError::Weight { weight });
    }
    Ok(())
}

/// Codes of a canonical frame: never −128 (8 bits) or −8 (4 bits), and all
/// zero in a block whose scale is 0. One pass over the codes, a byte-wise
/// maximum the compiler vectorises; the blocks of scale 0 are looked at
/// only when there are any.
fn check_codes(
    codec: crate::Codec,
    n: usize,
    scales: &[u8],
    codes: &[u8],
) -> Result<(), DecodeError> {
    const CHUNK: usize = 8192;
    // 8 bits: 0x80 is −128. 4 bits: a nibble of 8 is −8.
    let bad = |b: u8| match codec.bits() {
        8 => b == 0x80,
        _ => (b & 0x0F) == 0x08 || (b & 0xF0) == 0x80,
    };
    let per_byte = if codec.bits() == 8 { 1 } else { 2 };
    for (c, chunk) in codes.chunks(CHUNK).enumerate() {
        if chunk.iter().fold(0u8, |m, &b| m | u8::from(bad(b))) != 0 {
            let at = c * CHUNK + chunk.iter().position(|&b| bad(b)).unwrap_or(0);
            let byte = codes[at];
            let (index, code) = if codec.bits() == 8 || (byte & 0x0F) == 0x08 {
                (at * per_byte, if codec.bits() == 8 { -128 } else { -8 })
            } else {
                (at * per_byte + 1, -8)
            };
            return Err(DecodeError::Code {
                index,
                code,
                levels: codec.levels(),
            });
        }
    }
    let block = codec.block_size() as usize;
    let code_block = block * codec.bits() as usize / 8;
    for (b, scale) in scales.chunks_exact(2).enumerate() {
        if scale != [0, 0] {
            continue;
        }
        let start = b * code_block;
        let end = (start + code_block).min(codes.len());
        if let Some(k) = codes[start..end].iter().position(|&byte| byte != 0) {
            let byte = codes[start + k];
            let (index, code) = if codec.bits() == 8 {
                (b * block + k, byte as i8)
            } else if byte & 0x0F != 0 {
                (b * block + 2 * k, ((byte << 4) as i8) >> 4)
            } else {
                (b * block + 2 * k + 1, (byte as i8) >> 4)
            };
            // Padding beyond the last element is the padding check's.
            if index < n {
                return Err(DecodeError::ZeroScaleCode {
                    block: b,
                    index,
                    code,
                });
            }
        }
    }
    Ok(())
}

/// The index of the first little-endian bf16 in `bytes` within `lo..=hi`.
fn first_bf16_in(bytes: &[u8], lo: u16, hi: u16) -> Option<usize> {
    bytes
        .chunks_exact(2)
        .position(|pair| (lo..=hi).contains(&u16::from_le_bytes([pair[0], pair[1]])))
}

fn bf16_at(bytes: &[u8], index: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]])
}

/// The index of the first little-endian bf16 in `bytes` whose bits under
/// `mask` reach `limit`.
fn first_bf16_at_or_above(bytes: &[u8], limit: u16, mask: u16) -> Option<usize> {
    const CHUNK: usize = 8192;
    let value = |pair: &[u8]| u16::from_le_bytes([pair[0], pair[1]]) & mask;
    for (c, chunk) in bytes.chunks(CHUNK).enumerate() {
        let max = chunk.chunks_exact(2).fold(0, |m, pair| m.max(value(pair)));
        if max >= limit {
            let within = chunk
                .chunks_exact(2)
                .position(|pair| value(pair) >= limit)?;
            return Some(c * CHUNK / 2 + within);
        }
    }
    None
}
