//! The codec's errors: one variant per thing that can be wrong, each naming
//! the field or the element.

use thiserror::Error;

/// A codec that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    #[error("bits: must be 16, 8 or 4, found {bits}")]
    Bits { bits: u32 },
    #[error("block_size: {reason}, found {block_size} (a {bits}-bit codec)")]
    BlockSize {
        bits: u32,
        block_size: u32,
        reason: &'static str,
    },
}

/// Why a fragment was not encoded. The encoder's residual is unchanged.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EncodeError {
    #[error(
        "element {index}: {value} is not finite or not below 2^64 in magnitude; a pseudo-gradient this large is a bug upstream"
    )]
    Value { index: usize, value: f32 },
    #[error("fragment: {found} elements, the encoder's residual holds {expected}")]
    FragmentLength { expected: usize, found: usize },
    #[error(
        "range: elements {start}..{start}+{len} do not lie within the encoder's {residual} elements"
    )]
    Range {
        start: usize,
        len: usize,
        residual: usize,
    },
    #[error("element count: {found} elements in one frame, at most {max}")]
    ElementCount { found: usize, max: usize },
    #[error("zstd: {reason}")]
    Zstd { reason: String },
}

/// Why a frame was refused. Nothing was written to the accumulator.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DecodeError {
    #[error("frame: truncated in the {field}: {found} bytes, {needed} needed")]
    Truncated {
        field: &'static str,
        needed: usize,
        found: usize,
    },
    #[error("magic: expected \"LHPG\", found {found:02x?}")]
    Magic { found: [u8; 4] },
    #[error("version: {found} is not supported (this decoder reads version {supported})")]
    Version { found: u8, supported: u8 },
    #[error("header checksum: the header says {expected:#010x}, its bytes give {computed:#010x}")]
    HeaderChecksum { expected: u32, computed: u32 },
    #[error("bits: unknown codec of {found} bits (16, 8 or 4)")]
    Bits { found: u8 },
    #[error("flags: unknown flag bits {found:#04x}")]
    Flags { found: u8 },
    #[error("reserved: must be 0, found {found}")]
    Reserved { found: u8 },
    #[error("block size: {reason}, found {found} (a {bits}-bit frame)")]
    BlockSize {
        bits: u8,
        found: u32,
        reason: &'static str,
    },
    #[error("element count: {found} elements, at most {max} in one frame")]
    ElementCount { found: u32, max: usize },
    #[error("payload length: {found} bytes, {expected}")]
    PayloadLength { expected: String, found: u32 },
    #[error("frame length: the header makes it {expected} bytes, {found} were given")]
    FrameLength { expected: usize, found: usize },
    #[error(
        "payload checksum: the header says {expected:#010x}, the payload gives {computed:#010x}"
    )]
    PayloadChecksum { expected: u32, computed: u32 },
    #[error("zstd: {reason}")]
    Zstd { reason: String },
    #[error("zstd: the payload decompresses to {found} bytes, {expected} expected")]
    DecompressedLength { expected: usize, found: usize },
    #[error(
        "scale of block {block}: bf16 bits {bits:#06x} are not 0 or a normal finite scale in (0, 2^65)"
    )]
    Scale { block: usize, bits: u16 },
    #[error("element {index}: code {code} is never sent (codes are -{levels}..={levels})")]
    Code { index: usize, code: i8, levels: u32 },
    #[error(
        "element {index}: code {code} under block {block}'s scale 0 (such a block is all zeros)"
    )]
    ZeroScaleCode {
        block: usize,
        index: usize,
        code: i8,
    },
    #[error("element {index}: bf16 bits {bits:#06x} are not a finite value below 2^65")]
    Value { index: usize, bits: u16 },
    #[error("padding: the unused high nibble of the last byte must be 0, found {found:#x}")]
    Padding { found: u8 },
    #[error("accumulator: holds {accumulator} elements, the frame {frame}")]
    AccumulatorLength { frame: usize, accumulator: usize },
    #[error("weight: {weight} is not a finite weight within [-2^32, 2^32]")]
    Weight { weight: f32 },
}

/// Why a reduction was refused. The output is unchanged.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ReduceError {
    #[error("contributions: at least one is needed")]
    Empty,
    #[error("site {site:?}: contributes twice")]
    DuplicateSite { site: String },
    #[error("site {site:?}: {source}")]
    Frame {
        site: String,
        #[source]
        source: DecodeError,
    },
}
