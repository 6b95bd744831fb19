//! What a codec is (bits and block size, in the sync planner's words) and
//! how many bytes a frame of it takes.

use crate::error::CodecError;
use crate::frame::HEADER_LEN;

/// The most elements one frame holds: 2²⁴ (64 MiB of f32). A fragment
/// larger than this is sent as several frames, each encoded with
/// [`crate::Encoder::encode_range`]. With block sizes of at least 2 every
/// payload is at most 2 bytes per element, so the bound keeps a frame's
/// payload, and the one buffer a decoder allocates for it (the
/// decompressed payload of a zstd frame), at most [`MAX_PAYLOAD_BYTES`].
pub const MAX_ELEMENTS: usize = 1 << 24;

/// The most bytes a payload takes before zstd: 2²⁵ (32 MiB), bf16 at
/// [`MAX_ELEMENTS`]; 8 bits in blocks of 2 take as much, every other codec
/// less. The decoder allocates at most 2 bytes per element of the
/// accumulator it was given, and only after the frame's element count
/// matched that accumulator.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 25;

/// The largest block size accepted: 2¹⁶ elements. Larger blocks save
/// nothing worth having (the scales are 16/B bits per element) and cost
/// precision.
pub const MAX_BLOCK_SIZE: u32 = 1 << 16;

/// Bits of each block's scale: a bf16, as the planner's `scale_bits`.
pub const SCALE_BITS: u32 = 16;

/// One way to encode a pseudo-gradient, named as the sync planner names it
/// (`longhaul_core::sync::Codec` and the plan's per-link `bits` and
/// `block_size`): `bits` per element (16, 8 or 4) and `block_size` elements
/// per scale (0 for 16 bits, which has no scales).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Codec {
    bits: u32,
    block_size: u32,
}

impl Codec {
    /// A codec, checked: 16 bits with block size 0; 8 or 4 bits with a
    /// block size in 2..=[`MAX_BLOCK_SIZE`], even for 4 bits (each block's
    /// codes then start on a byte). Blocks of 1 are refused: at 8 bits they
    /// take 3 bytes per element, more than bf16, and they would let a frame
    /// decompress to 1.5× [`MAX_PAYLOAD_BYTES`].
    pub fn new(bits: u32, block_size: u32) -> Result<Codec, CodecError> {
        let reason = match bits {
            16 if block_size != 0 => Some("must be 0 for 16 bits (bf16 has no scales)"),
            16 => None,
            8 | 4 if block_size < 2 => Some("must be at least 2"),
            8 | 4 if block_size > MAX_BLOCK_SIZE => Some("must be at most 65536"),
            4 if !block_size.is_multiple_of(2) => Some("must be even for 4 bits"),
            8 | 4 => None,
            _ => return Err(CodecError::Bits { bits }),
        };
        match reason {
            Some(reason) => Err(CodecError::BlockSize {
                bits,
                block_size,
                reason,
            }),
            None => Ok(Codec { bits, block_size }),
        }
    }

    /// bf16 as is: what the planner's standard 16-bit codec is.
    pub fn bf16() -> Codec {
        Codec {
            bits: 16,
            block_size: 0,
        }
    }

    /// The planner's standard codec of `bits` (`Codec::standard()` in
    /// `longhaul_core::sync`): bf16; 8 bits in blocks of 256; 4 bits in
    /// blocks of 64.
    pub fn standard(bits: u32) -> Result<Codec, CodecError> {
        match bits {
            16 => Ok(Codec::bf16()),
            8 => Codec::new(8, 256),
            4 => Codec::new(4, 64),
            _ => Err(CodecError::Bits { bits }),
        }
    }

    pub fn bits(&self) -> u32 {
        self.bits
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Levels each side of zero: the codes are −L..=L (127 for 8 bits, 7
    /// for 4); 0 for bf16.
    pub fn levels(&self) -> u32 {
        match self.bits {
            8 => 127,
            4 => 7,
            _ => 0,
        }
    }

    /// Blocks of `elements`: ⌈n / B⌉ (0 for bf16).
    pub fn blocks(&self, elements: usize) -> usize {
        if self.block_size == 0 {
            0
        } else {
            elements.div_ceil(self.block_size as usize)
        }
    }

    /// Bytes of the codes of `elements`: ⌈n · b / 8⌉.
    pub fn code_bytes(&self, elements: usize) -> usize {
        (elements * self.bits as usize).div_ceil(8)
    }

    /// Bytes of the payload before zstd: 2 · ⌈n / B⌉ + ⌈n · b / 8⌉.
    pub fn payload_bytes(&self, elements: usize) -> usize {
        self.blocks(elements) * (SCALE_BITS as usize / 8) + self.code_bytes(elements)
    }

    /// Bytes of a whole frame without zstd: the header plus the payload.
    pub fn frame_bytes(&self, elements: usize) -> usize {
        HEADER_LEN + self.payload_bytes(elements)
    }

    /// The planner's figure: b + 16 / B bits per element before zstd, with
    /// no framing (`longhaul_core::sync::Codec::bits_per_parameter`).
    pub fn bits_per_parameter(&self) -> f64 {
        if self.block_size == 0 {
            f64::from(self.bits)
        } else {
            f64::from(self.bits) + f64::from(SCALE_BITS) / f64::from(self.block_size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_planners_bit_widths_and_sane_blocks_are_codecs() {
        assert!(Codec::new(8, 256).is_ok());
        assert!(Codec::new(4, 64).is_ok());
        assert!(Codec::new(16, 0).is_ok());
        assert!(matches!(
            Codec::new(2, 64),
            Err(CodecError::Bits { bits: 2 })
        ));
        for (bits, block_size) in [
            (8, 0),
            (8, 1),
            (4, 0),
            (8, MAX_BLOCK_SIZE + 1),
            (4, 63),
            (16, 64),
        ] {
            assert!(
                matches!(
                    Codec::new(bits, block_size),
                    Err(CodecError::BlockSize { .. })
                ),
                "{bits} bits, blocks of {block_size}"
            );
        }
    }

    #[test]
    fn frame_sizes_follow_the_planners_bits_per_parameter_plus_the_header() {
        for bits in [16, 8, 4] {
            let codec = Codec::standard(bits).unwrap();
            let n = 1 << 20;
            let payload = codec.payload_bytes(n) as f64;
            assert_eq!(payload * 8.0 / n as f64, codec.bits_per_parameter());
            assert_eq!(codec.frame_bytes(n), HEADER_LEN + codec.payload_bytes(n));
        }
        // No codec's payload exceeds 2 bytes per element: MAX_PAYLOAD_BYTES.
        for codec in [
            Codec::bf16(),
            Codec::new(8, 2).unwrap(),
            Codec::new(4, 2).unwrap(),
        ] {
            assert!(codec.payload_bytes(MAX_ELEMENTS) <= MAX_PAYLOAD_BYTES);
        }
        assert_eq!(Codec::bf16().payload_bytes(MAX_ELEMENTS), MAX_PAYLOAD_BYTES);
        // A partial last block still has a scale; an odd 4-bit count rounds up.
        let int4 = Codec::new(4, 64).unwrap();
        assert_eq!(int4.payload_bytes(65), 2 * 2 + 33);
        assert_eq!(Codec::bf16().payload_bytes(3), 6);
    }
}
