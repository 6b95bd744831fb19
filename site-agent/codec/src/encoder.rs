//! The encoder: one per fragment a site sends, holding that fragment's
//! error-feedback residual from round to round.

use std::io::Cursor;

use crate::codec::{Codec, MAX_ELEMENTS};
use crate::error::{CodecError, EncodeError};
use crate::frame::{Frame, FrameHeader, HEADER_LEN};
use crate::kernels;

/// The zstd level of the optional stage: level 1, the fastest of the
/// regular levels, whose speed the planner assumes
/// (`ZSTD_BYTES_PER_SECOND_PER_CORE`).
pub const ZSTD_LEVEL: i32 = 1;

/// The encoder refuses inputs that are not finite or not below this in
/// magnitude (2⁶⁴): then x plus a residual never overflows, and every scale
/// and bf16 value it writes stays below the decoder's bound of 2⁶⁵.
///
/// No single bound can also hold the encoder's own decoded output: scales
/// are rounded *up* (and bf16 rounds to nearest), so an input just below
/// any bound T can decode to T or more (the largest f32 below 2⁶⁴ decodes
/// to 2⁶⁴ at bf16 and above it at 4 bits, and re-encoding that is refused).
/// What the collective relies on is therefore [`MAX_SOURCE_MAGNITUDE`],
/// 2⁴ below this bound.
pub const MAX_MAGNITUDE: f32 = 18_446_744_073_709_551_616.0;

/// The magnitude below which pseudo-gradients stay in the encoder's domain
/// through the collective (2⁶⁰, 2⁴ below [`MAX_MAGNITUDE`]): encode (any
/// number of rounds of error feedback) → decode → weighted sum with weights
/// in [0, 1] that add up to at most 1 → encode again → decode.
///
/// Per hop, values grow by at most 1.09×, at 4 bits with error feedback,
/// the worst codec: the residual is at most s/2 with s ≤ max|v|·(1 + 2⁻⁷)/7,
/// so max|v| ≤ max|x| / (1 − (1 + 2⁻⁷)/14) ≤ 1.078·max|x|, and a decoded
/// value is at most 7·s ≤ 1.078·(1 + 2⁻⁷)·max|x| ≤ 1.087·max|x|; a
/// weighted sum with such weights is no larger, but for f32 rounding of a
/// few 2⁻²⁴. 2⁴ of headroom covers 32 such hops; the collective has one
/// (the owner re-encodes the average). Weights beyond 1 (the decoder takes
/// up to ±2³², which only keeps every term finite) void this: the
/// collective must pass weights in [0, 1] summing to at most 1, and keep
/// its inputs below this bound (a trainer's pseudo-gradient near 2⁶⁰ is a
/// bug upstream; the encoder refuses only at [`MAX_MAGNITUDE`]).
pub const MAX_SOURCE_MAGNITUDE: f32 = 1_152_921_504_606_846_976.0;
const MAX_MAGNITUDE_BITS: u32 = 0x5F80_0000;
const MAX_MAGNITUDE_BF16: u16 = 0x5F80;

/// How a link's traffic is encoded: the sync plan's per-link `bits`,
/// `block_size`, `error_feedback` and `zstd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    pub codec: Codec,
    pub error_feedback: bool,
    pub zstd: bool,
}

impl EncoderConfig {
    /// A link's encoding from the sync plan's fields, the codec checked.
    pub fn new(
        bits: u32,
        block_size: u32,
        error_feedback: bool,
        zstd: bool,
    ) -> Result<EncoderConfig, CodecError> {
        Ok(EncoderConfig {
            codec: Codec::new(bits, block_size)?,
            error_feedback,
            zstd,
        })
    }
}

/// The input of one encode: f32 values, or bf16 values as their bit
/// patterns (`u16`, as a trainer's bf16 tensor holds them).
#[derive(Debug, Clone, Copy)]
enum Input<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

impl Input<'_> {
    fn len(&self) -> usize {
        match self {
            Input::F32(values) => values.len(),
            Input::Bf16(values) => values.len(),
        }
    }
}

/// Encodes one fragment round after round. With error feedback it keeps the
/// residual e (one f32 per element, zero at first): each round it encodes
/// v = x + e and keeps e ← v − decode(encode(v)), so what rounding drops
/// in one round is sent in a later one.
pub struct Encoder {
    config: EncoderConfig,
    elements: usize,
    /// The residual, `elements` long with error feedback, else empty.
    residual: Vec<f32>,
    /// bf16 input converted to f32, a chunk at a time.
    widened: Vec<f32>,
    /// The raw payload, when zstd compresses it into the frame.
    raw: Vec<u8>,
    compressor: Option<zstd::bulk::Compressor<'static>>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("config", &self.config)
            .field("elements", &self.elements)
            .finish_non_exhaustive()
    }
}

/// Elements converted from bf16 per chunk (a multiple of every block size
/// up to 2¹⁶ would be 2¹⁶ itself; chunks are whole blocks instead).
const WIDEN_CHUNK: usize = 1 << 14;

impl Encoder {
    /// An encoder for a fragment of `elements` elements (any number: a
    /// fragment larger than [`MAX_ELEMENTS`] is sent in ranges).
    pub fn new(config: EncoderConfig, elements: usize) -> Encoder {
        Encoder {
            config,
            elements,
            residual: if config.error_feedback {
                vec![0.0; elements]
            } else {
                Vec::new()
            },
            widened: Vec::new(),
            raw: Vec::new(),
            compressor: None,
        }
    }

    pub fn config(&self) -> EncoderConfig {
        self.config
    }

    /// Puts back a residual taken with [`Encoder::residual`] from this
    /// encoder; refused, changing nothing, when its length is not this
    /// encoder's.
    pub fn restore_residual(&mut self, saved: &[f32]) -> Result<(), EncodeError> {
        if saved.len() != self.residual.len() {
            return Err(EncodeError::FragmentLength {
                expected: self.residual.len(),
                found: saved.len(),
            });
        }
        self.residual.copy_from_slice(saved);
        Ok(())
    }

    /// Elements of the fragment.
    pub fn len(&self) -> usize {
        self.elements
    }

    pub fn is_empty(&self) -> bool {
        self.elements == 0
    }

    /// The residual carried to the next round (empty without error
    /// feedback).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Forgets the residual (after the site missed rounds and caught up).
    pub fn reset(&mut self) {
        self.residual.fill(0.0);
    }

    /// Encodes the whole fragment (at most [`MAX_ELEMENTS`]) as one frame.
    pub fn encode(&mut self, fragment: &[f32]) -> Result<Frame, EncodeError> {
        self.check_whole(fragment.len())?;
        let mut frame = Frame::new();
        self.encode_input(0, Input::F32(fragment), &mut frame)?;
        Ok(frame)
    }

    /// As [`Encoder::encode`], from bf16 values.
    pub fn encode_bf16(&mut self, fragment: &[u16]) -> Result<Frame, EncodeError> {
        self.check_whole(fragment.len())?;
        let mut frame = Frame::new();
        self.encode_input(0, Input::Bf16(fragment), &mut frame)?;
        Ok(frame)
    }

    /// Encodes elements `start..start + values.len()` of the fragment into
    /// `frame`, reusing its buffer. Blocks start at `start`.
    pub fn encode_into(
        &mut self,
        start: usize,
        values: &[f32],
        frame: &mut Frame,
    ) -> Result<(), EncodeError> {
        self.encode_input(start, Input::F32(values), frame)
    }

    /// As [`Encoder::encode_into`], returning a new frame.
    pub fn encode_range(&mut self, start: usize, values: &[f32]) -> Result<Frame, EncodeError> {
        let mut frame = Frame::new();
        self.encode_input(start, Input::F32(values), &mut frame)?;
        Ok(frame)
    }

    /// As [`Encoder::encode_into`], from bf16 values.
    pub fn encode_bf16_into(
        &mut self,
        start: usize,
        values: &[u16],
        frame: &mut Frame,
    ) -> Result<(), EncodeError> {
        self.encode_input(start, Input::Bf16(values), frame)
    }

    fn check_whole(&self, len: usize) -> Result<(), EncodeError> {
        if len != self.elements {
            return Err(EncodeError::FragmentLength {
                expected: self.elements,
                found: len,
            });
        }
        Ok(())
    }

    /// Checks everything first, so that a refused input leaves the residual
    /// as it was; then writes the payload and the header.
    fn encode_input(
        &mut self,
        start: usize,
        input: Input<'_>,
        frame: &mut Frame,
    ) -> Result<(), EncodeError> {
        let len = input.len();
        let end = start.checked_add(len).filter(|&end| end <= self.elements);
        let Some(end) = end else {
            return Err(EncodeError::Range {
                start,
                len,
                residual: self.elements,
            });
        };
        if len > MAX_ELEMENTS {
            return Err(EncodeError::ElementCount {
                found: len,
                max: MAX_ELEMENTS,
            });
        }
        let bad = match input {
            Input::F32(values) => kernels::first_at_or_above(values, MAX_MAGNITUDE_BITS),
            Input::Bf16(values) => kernels::first_bf16_at_or_above(values, MAX_MAGNITUDE_BF16),
        };
        if let Some(index) = bad {
            let value = match input {
                Input::F32(values) => values[index],
                Input::Bf16(values) => kernels::bf16_to_f32(values[index]),
            };
            return Err(EncodeError::Value {
                index: start + index,
                value,
            });
        }

        if self.config.zstd && self.compressor.is_none() {
            let compressor =
                zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(|e| EncodeError::Zstd {
                    reason: e.to_string(),
                })?;
            self.compressor = Some(compressor);
        }

        // Nothing below fails: the residual is changed only now.
        let codec = self.config.codec;
        let raw_len = codec.payload_bytes(len);
        let residual = if self.config.error_feedback {
            Some(&mut self.residual[start..end])
        } else {
            None
        };
        // Without zstd the payload is written in place, after the header.
        let bytes = &mut frame.bytes;
        bytes.clear();
        let payload = if self.config.zstd {
            self.raw.clear();
            self.raw.resize(raw_len, 0);
            &mut self.raw[..]
        } else {
            bytes.resize(HEADER_LEN + raw_len, 0);
            &mut bytes[HEADER_LEN..]
        };
        match input {
            Input::F32(values) => write_payload(codec, values, residual, payload),
            Input::Bf16(values) => {
                write_payload_bf16(codec, values, residual, payload, &mut self.widened)
            }
        }

        let mut zstd = false;
        if self.config.zstd {
            bytes.resize(HEADER_LEN, 0);
            zstd = self.compress_into(bytes);
            if !zstd {
                bytes.truncate(HEADER_LEN);
                bytes.extend_from_slice(&self.raw);
            }
        }
        let header = FrameHeader {
            codec,
            zstd,
            bf16_input: matches!(input, Input::Bf16(_)),
            element_count: len,
            payload_length: bytes.len() - HEADER_LEN,
            payload_crc32c: crc32c::crc32c(&bytes[HEADER_LEN..]),
        };
        bytes[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        Ok(())
    }

    /// Compresses `self.raw` after the header in `bytes`; false when zstd
    /// would not make it shorter, or failed (the payload is then stored
    /// raw).
    fn compress_into(&mut self, bytes: &mut Vec<u8>) -> bool {
        let raw_len = self.raw.len();
        let Some(compressor) = &mut self.compressor else {
            return false;
        };
        if raw_len == 0 {
            return false;
        }
        // Room for one byte less than the raw payload: zstd reports a
        // destination too small when it would not shrink it.
        bytes.reserve_exact(raw_len - 1);
        let mut cursor = Cursor::new(std::mem::take(bytes));
        cursor.set_position(HEADER_LEN as u64);
        let written = compressor.compress_to_buffer(&self.raw, &mut cursor);
        *bytes = cursor.into_inner();
        matches!(written, Ok(n) if n < raw_len)
    }
}

/// The payload of f32 `values`: scales, then codes.
fn write_payload(codec: Codec, values: &[f32], residual: Option<&mut [f32]>, payload: &mut [u8]) {
    let (scales, codes) = payload.split_at_mut(2 * codec.blocks(values.len()));
    write_blocks(codec, values, residual, scales, codes);
}

/// The payload of bf16 `values`, widened to f32 a chunk of whole blocks at
/// a time (the same payload their f32 values would give).
fn write_payload_bf16(
    codec: Codec,
    values: &[u16],
    mut residual: Option<&mut [f32]>,
    payload: &mut [u8],
    widened: &mut Vec<f32>,
) {
    let (scales, codes) = payload.split_at_mut(2 * codec.blocks(values.len()));
    let block = codec.block_size() as usize;
    let chunk = if block == 0 {
        WIDEN_CHUNK
    } else {
        block * (WIDEN_CHUNK / block).max(1)
    };
    let bits = codec.bits() as usize;
    for (k, part) in values.chunks(chunk).enumerate() {
        let start = k * chunk;
        let end = start + part.len();
        widened.clear();
        widened.extend(part.iter().map(|&b| kernels::bf16_to_f32(b)));
        // `start` is a multiple of the block size, which is even at 4 bits.
        let scales = &mut scales[2 * codec.blocks(start)..2 * codec.blocks(end)];
        let codes = &mut codes[start * bits / 8..(end * bits).div_ceil(8)];
        let residual = residual.as_deref_mut().map(|r| &mut r[start..end]);
        write_blocks(codec, widened, residual, scales, codes);
    }
}

/// Quantises `values` block by block: each block's scale into `scales`
/// (bf16 LE), its codes into `codes`. At 16 bits `scales` is empty and
/// `codes` receives the bf16 values.
fn write_blocks(
    codec: Codec,
    values: &[f32],
    residual: Option<&mut [f32]>,
    scales: &mut [u8],
    codes: &mut [u8],
) {
    if codec.bits() == 16 {
        match residual {
            Some(residual) => kernels::to_bf16_feedback(values, residual, codes),
            None => kernels::to_bf16(values, codes),
        }
        return;
    }
    let block = codec.block_size() as usize;
    let scales = scales.chunks_exact_mut(2);
    let codes = codes.chunks_mut(block * codec.bits() as usize / 8);
    let blocks = values.chunks(block);
    match residual {
        Some(residual) => {
            let quantise = if codec.bits() == 8 {
                kernels::quantise8_feedback
            } else {
                kernels::quantise4_feedback
            };
            for (((v, r), c), s) in blocks
                .zip(residual.chunks_mut(block))
                .zip(codes)
                .zip(scales)
            {
                s.copy_from_slice(&quantise(v, r, c).to_le_bytes());
            }
        }
        None => {
            let quantise = if codec.bits() == 8 {
                kernels::quantise8
            } else {
                kernels::quantise4
            };
            for ((v, c), s) in blocks.zip(codes).zip(scales) {
                s.copy_from_slice(&quantise(v, c).to_le_bytes());
            }
        }
    }
}
