//! The exchange's messages on the wire (ALPN [`ALPN`]): a 48-byte fixed
//! header, the job id, a checksum of both, then a payload.
//!
//! ```text
//! offset  size  field            value
//!      0     4  magic            "LHXF"
//!      4     1  version          1
//!      5     1  kind             1 hello, 2 welcome, 3 data, 4 ack, 5 refused
//!      6     1  phase            0 reduce-scatter (a contribution), 1 all-gather (an average)
//!      7     1  job_length       J, 1..=63
//!      8     8  round            u64 LE
//!     16     4  fragment         u32 LE
//!     20     4  shard            u32 LE
//!     24     4  plan             u32 LE, the plan's digest (CollectivePlan::digest)
//!     28     8  offset           u64 LE, first element of the chunk in the fragment
//!     36     4  length           u32 LE, elements of the chunk: 1..=2^24 (data, ack, refused), else 0
//!     40     4  payload_length   u32 LE, bytes after the header (bounds below)
//!     44     4  payload_crc32c   u32 LE, CRC-32C of the payload
//!     48     J  job              the job id, UTF-8
//!   48+J     4  header_crc32c    u32 LE, CRC-32C of bytes 0..48+J
//!   52+J        payload
//! ```
//!
//! Payloads: **hello** (client → server, first on a stream; it names the
//! job, round, fragment and plan the connection serves) the sender's site
//! id, 1..=63 bytes; **welcome** (server → client, once the server has
//! replayed its acks, see [`crate::ranges`]) the receiver's incarnation, 8
//! bytes (u64 LE: a sender whose acks came from another incarnation
//! forgets them, since a restarted receiver holds nothing); **data** one codec frame
//! of `length` elements, 28..=28 + 2·`length` bytes (the codec's header
//! plus at most 2 bytes per element, the bound of every codec); **ack**
//! (server → client: the chunk is held) none; **refused** (server →
//! client: the data frame with these fields was not taken) a UTF-8
//! reason of at most [`MAX_REASON_BYTES`].
//!
//! So no message exceeds [`MAX_MESSAGE_BYTES`] (52 + 63 + 28 + 2²⁵ bytes),
//! and [`message_length`] bounds a message from its first 48 bytes, before
//! anything is allocated for the rest. [`decode`] checks every field in
//! order and refuses truncated input, a wrong checksum, an unknown version
//! or kind and every size out of bounds with a [`WireError`] naming the
//! field; it never panics.

use thiserror::Error;

use crate::plan::{MAX_CHUNK_ELEMENTS, PlanError, check_site_id};

/// The ALPN protocol of exchange connections.
pub const ALPN: &[u8] = b"longhaul-exchange/1";

pub const MAGIC: [u8; 4] = *b"LHXF";
pub const VERSION: u8 = 1;
/// Bytes before the job id.
pub const FIXED_LEN: usize = 48;
/// Bytes of the job id at most (the rounds' id bound).
pub const MAX_JOB_BYTES: usize = longhaul_core::limits::MAX_ID_LEN;
/// Bytes of a refusal's reason at most.
pub const MAX_REASON_BYTES: usize = 1024;
/// The codec frame's header.
const CODEC_HEADER: usize = longhaul_codec::frame::HEADER_LEN;
/// The largest message: a data frame of the most elements, the longest job.
pub const MAX_MESSAGE_BYTES: usize =
    FIXED_LEN + MAX_JOB_BYTES + 4 + CODEC_HEADER + 2 * MAX_CHUNK_ELEMENTS as usize;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Hello = 1,
    Welcome = 2,
    Data = 3,
    Ack = 4,
    Refused = 5,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Data,
            4 => Kind::Ack,
            5 => Kind::Refused,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Welcome => "welcome",
            Kind::Data => "data",
            Kind::Ack => "ack",
            Kind::Refused => "refused",
        }
    }

    /// Whether the message names a chunk (length 1..=2²⁴).
    fn names_chunk(self) -> bool {
        matches!(self, Kind::Data | Kind::Ack | Kind::Refused)
    }
}

pub use crate::plan::Phase;

/// Which chunk of which transfer: what data, acks and refusals name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId {
    pub phase: Phase,
    pub fragment: u32,
    pub shard: u32,
    pub offset: u64,
    pub length: u32,
}

/// A message's header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub job: String,
    pub round: u64,
    pub plan: u32,
    /// The chunk; all zero (reduce-scatter, fragment 0, …) for hello and
    /// welcome.
    pub chunk: ChunkId,
}

/// A decoded message; the payload is borrowed from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub header: Header,
    pub payload: &'a [u8],
}

/// Why bytes are not a message. Each names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("message: truncated in the {field}: {found} bytes, {needed} needed")]
    Truncated {
        field: &'static str,
        needed: usize,
        found: usize,
    },
    #[error("message: {found} bytes given, the header makes it {expected}")]
    TrailingBytes { expected: usize, found: usize },
    #[error("magic: expected \"LHXF\", found {found:02x?}")]
    Magic { found: [u8; 4] },
    #[error("version: {found} is not supported (this side speaks version {supported})")]
    Version { found: u8, supported: u8 },
    #[error("kind: {found} is not a message kind (1..=5)")]
    Kind { found: u8 },
    #[error("phase: {found} is not 0 (reduce-scatter) or 1 (all-gather)")]
    Phase { found: u8 },
    #[error("job_length: {found}, must be between 1 and {max}")]
    JobLength { found: u8, max: usize },
    #[error("job: {reason}")]
    Job { reason: String },
    #[error("length: {found} elements in a {kind} message, {expected}")]
    Length {
        kind: &'static str,
        found: u32,
        expected: String,
    },
    #[error("payload_length: {found} bytes in a {kind} message, {expected}")]
    PayloadLength {
        kind: &'static str,
        found: u32,
        expected: String,
    },
    #[error("header_crc32c: the message says {expected:#010x}, its header gives {computed:#010x}")]
    HeaderChecksum { expected: u32, computed: u32 },
    #[error(
        "payload_crc32c: the message says {expected:#010x}, its payload gives {computed:#010x}"
    )]
    PayloadChecksum { expected: u32, computed: u32 },
    #[error("payload: {reason}")]
    Payload { reason: String },
}

/// The u32 LE at `at` (the caller checked the length).
pub(crate) fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The u64 LE at `at` (the caller checked the length).
pub(crate) fn long(bytes: &[u8], at: usize) -> u64 {
    let mut out = [0; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(out)
}

/// The bounds of `payload_length` for a message of `kind` and `length`.
fn payload_bounds(kind: Kind, length: u32) -> (usize, usize) {
    match kind {
        Kind::Hello => (1, MAX_JOB_BYTES),
        Kind::Welcome => (8, 8),
        Kind::Ack => (0, 0),
        Kind::Data => (CODEC_HEADER, CODEC_HEADER + 2 * length as usize),
        Kind::Refused => (0, MAX_REASON_BYTES),
    }
}

/// Checks the fixed header's fields (not yet its checksum, which covers the
/// job id too) and returns the whole message's length: at most
/// [`MAX_MESSAGE_BYTES`], so a reader may allocate it.
pub fn message_length(fixed: &[u8]) -> Result<usize, WireError> {
    let fixed = fixed.get(..FIXED_LEN).ok_or(WireError::Truncated {
        field: "fixed header",
        needed: FIXED_LEN,
        found: fixed.len(),
    })?;
    let magic = [fixed[0], fixed[1], fixed[2], fixed[3]];
    if magic != MAGIC {
        return Err(WireError::Magic { found: magic });
    }
    if fixed[4] != VERSION {
        return Err(WireError::Version {
            found: fixed[4],
            supported: VERSION,
        });
    }
    let kind = Kind::from_byte(fixed[5]).ok_or(WireError::Kind { found: fixed[5] })?;
    if fixed[6] > 1 {
        return Err(WireError::Phase { found: fixed[6] });
    }
    let job_length = fixed[7];
    if job_length == 0 || job_length as usize > MAX_JOB_BYTES {
        return Err(WireError::JobLength {
            found: job_length,
            max: MAX_JOB_BYTES,
        });
    }
    let length = word(fixed, 36);
    let length_ok = if kind.names_chunk() {
        (1..=MAX_CHUNK_ELEMENTS).contains(&length)
    } else {
        length == 0
    };
    if !length_ok {
        let expected = if kind.names_chunk() {
            format!("must be between 1 and {MAX_CHUNK_ELEMENTS}")
        } else {
            "must be 0".to_string()
        };
        return Err(WireError::Length {
            kind: kind.name(),
            found: length,
            expected,
        });
    }
    let payload_length = word(fixed, 40);
    let (low, high) = payload_bounds(kind, length);
    if !(low..=high).contains(&(payload_length as usize)) {
        return Err(WireError::PayloadLength {
            kind: kind.name(),
            found: payload_length,
            expected: format!("must be between {low} and {high}"),
        });
    }
    Ok(FIXED_LEN + job_length as usize + 4 + payload_length as usize)
}

/// Decodes one whole message (exactly: no bytes after it).
pub fn decode(bytes: &[u8]) -> Result<Message<'_>, WireError> {
    let total = message_length(bytes)?;
    let job_length = bytes[7] as usize;
    let header_end = FIXED_LEN + job_length + 4;
    if bytes.len() < header_end {
        return Err(WireError::Truncated {
            field: "job and header checksum",
            needed: header_end,
            found: bytes.len(),
        });
    }
    let expected = word(bytes, FIXED_LEN + job_length);
    let computed = crc32c::crc32c(&bytes[..FIXED_LEN + job_length]);
    if expected != computed {
        return Err(WireError::HeaderChecksum { expected, computed });
    }
    if bytes.len() < total {
        return Err(WireError::Truncated {
            field: "payload",
            needed: total,
            found: bytes.len(),
        });
    }
    if bytes.len() > total {
        return Err(WireError::TrailingBytes {
            expected: total,
            found: bytes.len(),
        });
    }
    let payload = &bytes[header_end..];
    let expected = word(bytes, 44);
    let computed = crc32c::crc32c(payload);
    if expected != computed {
        return Err(WireError::PayloadChecksum { expected, computed });
    }
    let job = std::str::from_utf8(&bytes[FIXED_LEN..FIXED_LEN + job_length])
        .map_err(|_| WireError::Job {
            reason: "not UTF-8".to_string(),
        })?
        .to_string();
    let kind = Kind::from_byte(bytes[5]).ok_or(WireError::Kind { found: bytes[5] })?;
    match kind {
        Kind::Hello => {
            let site = std::str::from_utf8(payload).map_err(|_| WireError::Payload {
                reason: "the hello's site id is not UTF-8".to_string(),
            })?;
            check_site_id(site).map_err(|error| WireError::Payload {
                reason: match error {
                    PlanError::SiteId { reason, .. } => format!("the hello's site id is {reason}"),
                    other => other.to_string(),
                },
            })?;
        }
        Kind::Refused if std::str::from_utf8(payload).is_err() => {
            return Err(WireError::Payload {
                reason: "the refusal's reason is not UTF-8".to_string(),
            });
        }
        _ => {}
    }
    let phase = if bytes[6] == 0 {
        Phase::ReduceScatter
    } else {
        Phase::AllGather
    };
    Ok(Message {
        header: Header {
            kind,
            job,
            round: long(bytes, 8),
            plan: word(bytes, 24),
            chunk: ChunkId {
                phase,
                fragment: word(bytes, 16),
                shard: word(bytes, 20),
                offset: long(bytes, 28),
                length: word(bytes, 36),
            },
        },
        payload,
    })
}

/// Why a message cannot be encoded: a field out of the bounds the decoder
/// enforces (nothing is written).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot encode a {kind} message: {reason}")]
pub struct EncodeMessageError {
    pub kind: &'static str,
    pub reason: String,
}

/// Appends the message to `out`. Checks what the decoder would refuse.
pub fn encode(
    header: &Header,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), EncodeMessageError> {
    let refuse = |reason: String| EncodeMessageError {
        kind: header.kind.name(),
        reason,
    };
    let job = header.job.as_bytes();
    if job.is_empty() || job.len() > MAX_JOB_BYTES {
        return Err(refuse(format!(
            "job: {} bytes, 1..={MAX_JOB_BYTES}",
            job.len()
        )));
    }
    if header.kind == Kind::Hello {
        let site = std::str::from_utf8(payload).unwrap_or("");
        check_site_id(site).map_err(|error| refuse(error.to_string()))?;
    }
    let mut fixed = [0u8; FIXED_LEN];
    fixed[0..4].copy_from_slice(&MAGIC);
    fixed[4] = VERSION;
    fixed[5] = header.kind as u8;
    fixed[6] = match header.chunk.phase {
        Phase::ReduceScatter => 0,
        Phase::AllGather => 1,
    };
    fixed[7] = job.len() as u8;
    fixed[8..16].copy_from_slice(&header.round.to_le_bytes());
    fixed[16..20].copy_from_slice(&header.chunk.fragment.to_le_bytes());
    fixed[20..24].copy_from_slice(&header.chunk.shard.to_le_bytes());
    fixed[24..28].copy_from_slice(&header.plan.to_le_bytes());
    fixed[28..36].copy_from_slice(&header.chunk.offset.to_le_bytes());
    fixed[36..40].copy_from_slice(&header.chunk.length.to_le_bytes());
    let payload_length = u32::try_from(payload.len())
        .map_err(|_| refuse(format!("payload: {} bytes", payload.len())))?;
    fixed[40..44].copy_from_slice(&payload_length.to_le_bytes());
    fixed[44..48].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    message_length(&fixed).map_err(|error| refuse(error.to_string()))?;
    let start = out.len();
    out.reserve(FIXED_LEN + job.len() + 4 + payload.len());
    out.extend_from_slice(&fixed);
    out.extend_from_slice(job);
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// [`encode`] into a new buffer.
pub fn encode_to_vec(header: &Header, payload: &[u8]) -> Result<Vec<u8>, EncodeMessageError> {
    let mut out = Vec::new();
    encode(header, payload, &mut out)?;
    Ok(out)
}
