//! The frame: a 28-byte header, then the payload.
//!
//! ```text
//! offset  size  field            value
//!      0     4  magic            "LHPG"
//!      4     1  version          1
//!      5     1  bits             16, 8 or 4
//!      6     1  flags            bit 0: payload is zstd-compressed
//!                                bit 1: encoded from bf16 input (informational)
//!                                other bits 0
//!      7     1  reserved         0
//!      8     4  block_size       u32 LE; 0 for 16 bits, 2..=65536 (even for 4 bits)
//!     12     4  element_count    u32 LE; 0..=2^24
//!     16     4  payload_length   u32 LE; bytes that follow the header
//!     20     4  payload_crc32c   u32 LE; CRC-32C of those bytes, as stored
//!     24     4  header_crc32c    u32 LE; CRC-32C of bytes 0..24
//!     28        payload
//! ```
//!
//! The payload before zstd, for n elements in blocks of B:
//! 8 and 4 bits — ⌈n/B⌉ scales (bf16 LE), then the codes, one byte per
//! element at 8 bits (two's complement), two per byte at 4 bits (the even
//! element in the low nibble, an odd last element's high nibble 0);
//! 16 bits — n bf16 values (LE). With the zstd flag the payload is one zstd
//! frame of exactly that, and strictly shorter than it (the encoder stores
//! the payload raw when zstd would not shrink it). The checksum covers the
//! payload as stored, so corruption is caught before decompression.

use crate::codec::{Codec, MAX_ELEMENTS};
use crate::error::{CodecError, DecodeError};

pub const MAGIC: [u8; 4] = *b"LHPG";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 28;
pub const FLAG_ZSTD: u8 = 1;
pub const FLAG_BF16_INPUT: u8 = 2;
const KNOWN_FLAGS: u8 = FLAG_ZSTD | FLAG_BF16_INPUT;

/// A frame's header, as read (and checked) from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub codec: Codec,
    pub zstd: bool,
    pub bf16_input: bool,
    pub element_count: usize,
    /// Bytes of the payload as stored (compressed when `zstd`).
    pub payload_length: usize,
    pub payload_crc32c: u32,
}

impl FrameHeader {
    pub(crate) fn flags(&self) -> u8 {
        (if self.zstd { FLAG_ZSTD } else { 0 })
            | (if self.bf16_input { FLAG_BF16_INPUT } else { 0 })
    }

    /// The header's 28 bytes, its checksum included.
    pub(crate) fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut out = [0; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.codec.bits() as u8;
        out[6] = self.flags();
        out[7] = 0;
        out[8..12].copy_from_slice(&self.codec.block_size().to_le_bytes());
        out[12..16].copy_from_slice(&(self.element_count as u32).to_le_bytes());
        out[16..20].copy_from_slice(&(self.payload_length as u32).to_le_bytes());
        out[20..24].copy_from_slice(&self.payload_crc32c.to_le_bytes());
        let crc = crc32c::crc32c(&out[..24]);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads and checks the header of `frame` — at least 28 bytes, then
    /// the header's checksum, then its fields in order — and the frame's
    /// length against it, and returns the header with the payload as stored. The
    /// payload's checksum is checked too; its contents (scales, values) are
    /// the decoder's to check.
    pub fn parse(frame: &[u8]) -> Result<(FrameHeader, &[u8]), DecodeError> {
        let truncated = |field, needed| DecodeError::Truncated {
            field,
            needed,
            found: frame.len(),
        };
        // The whole header and its checksum first: a bit flipped in transit
        // is reported as that, not as whichever field it landed in.
        let header = frame
            .get(..HEADER_LEN)
            .ok_or_else(|| truncated("header", HEADER_LEN))?;
        let word = |at: usize| {
            u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let expected = word(24);
        let computed = crc32c::crc32c(&header[..24]);
        if expected != computed {
            return Err(DecodeError::HeaderChecksum { expected, computed });
        }
        let magic = [header[0], header[1], header[2], header[3]];
        if magic != MAGIC {
            return Err(DecodeError::Magic { found: magic });
        }
        let version = header[4];
        if version != VERSION {
            return Err(DecodeError::Version {
                found: version,
                supported: VERSION,
            });
        }
        let (bits, flags, reserved) = (header[5], header[6], header[7]);
        if ![16, 8, 4].contains(&bits) {
            return Err(DecodeError::Bits { found: bits });
        }
        if flags & !KNOWN_FLAGS != 0 {
            return Err(DecodeError::Flags { found: flags });
        }
        if reserved != 0 {
            return Err(DecodeError::Reserved { found: reserved });
        }
        let block_size = word(8);
        let codec = Codec::new(u32::from(bits), block_size).map_err(|error| match error {
            CodecError::BlockSize { reason, .. } => DecodeError::BlockSize {
                bits,
                found: block_size,
                reason,
            },
            CodecError::Bits { .. } => DecodeError::Bits { found: bits },
        })?;
        let count = word(12);
        if count as usize > MAX_ELEMENTS {
            return Err(DecodeError::ElementCount {
                found: count,
                max: MAX_ELEMENTS,
            });
        }
        let element_count = count as usize;
        let zstd = flags & FLAG_ZSTD != 0;
        let raw = codec.payload_bytes(element_count);
        let stored = word(16);
        let payload_length = stored as usize;
        if !zstd && payload_length != raw {
            return Err(DecodeError::PayloadLength {
                expected: format!("{raw} expected for {element_count} elements"),
                found: stored,
            });
        }
        if zstd && payload_length >= raw {
            return Err(DecodeError::PayloadLength {
                expected: format!("fewer than the {raw} it decompresses to expected with zstd"),
                found: stored,
            });
        }
        // payload_length ≤ raw ≤ MAX_PAYLOAD_BYTES (2^25, every codec's
        // payload at MAX_ELEMENTS is at most 2 bytes per element): the sum
        // is at most 28 + 2^25, no overflow.
        let total = HEADER_LEN + payload_length;
        if frame.len() != total {
            return Err(DecodeError::FrameLength {
                expected: total,
                found: frame.len(),
            });
        }
        let payload = &frame[HEADER_LEN..];
        let expected = word(20);
        let computed = crc32c::crc32c(payload);
        if expected != computed {
            return Err(DecodeError::PayloadChecksum { expected, computed });
        }
        Ok((
            FrameHeader {
                codec,
                zstd,
                bf16_input: flags & FLAG_BF16_INPUT != 0,
                element_count,
                payload_length,
                payload_crc32c: expected,
            },
            payload,
        ))
    }
}

/// An encoded frame: header and payload in one buffer, ready to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    pub(crate) bytes: Vec<u8>,
}

impl Frame {
    /// An empty frame, to pass to [`crate::Encoder::encode_into`] and reuse.
    pub fn new() -> Frame {
        Frame::default()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}
