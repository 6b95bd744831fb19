//! The catch-up transfer's messages (ALPN [`ALPN`]), sans-IO. A site that
//! missed committed rounds of a job is told by the round it takes part in
//! next where to catch up (`catch_up_from_site`, `catch_up_from_round`):
//! its agent opens one stream to that site's agent, sends a **request**
//! naming the job, the round and the number of f32 values it expects (its
//! trainers' parameters and outer-optimiser state), and reads a
//! **response**: a header, then either the state in full precision or the
//! reason it was refused.
//!
//! ```text
//! request (client → server), 28 + J + S bytes
//! offset  size  field          value
//!      0     4  magic          "LHCQ"
//!      4     1  version        1
//!      5     1  job_length     J, 1..=63
//!      6     1  site_length    S, 1..=63
//!      7     1  reserved       0
//!      8     8  round          u64 LE: the state after this round
//!     16     8  elements       u64 LE: f32 values expected, 1..=MAX_STATE_ELEMENTS
//!     24     J  job            the job id, UTF-8
//!   24+J     S  site           the requester's site id (its certificate must name it)
//! 24+J+S     4  crc32c         CRC-32C of bytes 0..24+J+S
//!
//! response header (server → client), 36 bytes, then its payload
//!      0     4  magic          "LHCA"
//!      4     1  version        1
//!      5     1  status         0 the state follows, 1 refused (a reason follows)
//!      6     2  reason_length  u16 LE: 0 with a state, 1..=1024 refused
//!      8     8  round          u64 LE, the request's
//!     16     8  elements       u64 LE: the request's with a state, 0 refused
//!     24     4  payload_crc32c CRC-32C of the payload
//!     28     4  reserved       0
//!     32     4  header_crc32c  CRC-32C of bytes 0..32
//!     36        payload        elements × 4 bytes (f32 LE), or the reason (UTF-8)
//! ```
//!
//! The requester allocates from its own expectation, never from the
//! peer's word: [`decode_response_header`] refuses a state of any other
//! size than the one requested, so a peer can make it read no more than it
//! asked for. Every decoder checks its fields in order and refuses with a
//! [`CatchUpWireError`] naming the field; none panics.

use thiserror::Error;

use crate::wire::{long, word};

/// The ALPN protocol of catch-up connections.
pub const ALPN: &[u8] = b"longhaul-catchup/1";
pub const REQUEST_MAGIC: [u8; 4] = *b"LHCQ";
pub const RESPONSE_MAGIC: [u8; 4] = *b"LHCA";
pub const VERSION: u8 = 1;
/// Bytes of a request before its job id.
pub const REQUEST_FIXED_LEN: usize = 24;
/// The longest request.
pub const MAX_REQUEST_BYTES: usize = REQUEST_FIXED_LEN + MAX_JOB_BYTES + MAX_SITE_BYTES + 4;
/// Bytes of a site id at most.
pub const MAX_SITE_BYTES: usize = longhaul_core::limits::MAX_ID_LEN;
/// Bytes of a response's header.
pub const RESPONSE_HEADER_LEN: usize = 36;
/// Bytes of the job id at most (the rounds' id bound).
pub const MAX_JOB_BYTES: usize = longhaul_core::limits::MAX_ID_LEN;
/// Bytes of a refusal's reason at most.
pub const MAX_REASON_BYTES: usize = 1024;
/// The largest state a request may ask for: 2^34 f32 values (64 GiB, the
/// parameters and momentum of an 8-billion-parameter model).
pub const MAX_STATE_ELEMENTS: u64 = 1 << 34;

/// What a site asks another for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUpRequest {
    pub job: String,
    /// The site asking.
    pub site: String,
    /// The state after this round.
    pub round: u64,
    /// f32 values expected.
    pub elements: u64,
}

/// A response's header: the state follows, or a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseHeader {
    /// `elements` f32 values follow, whose bytes have CRC-32C `crc32c`.
    State {
        round: u64,
        elements: u64,
        crc32c: u32,
    },
    /// A reason of `reason_length` bytes follows, with CRC-32C `crc32c`.
    Refused {
        round: u64,
        reason_length: u16,
        crc32c: u32,
    },
}

impl ResponseHeader {
    /// The header of a state response: `payload` (the state's bytes,
    /// f32 LE) after `round`.
    pub fn state(round: u64, payload: &[u8]) -> ResponseHeader {
        ResponseHeader::State {
            round,
            elements: payload.len() as u64 / 4,
            crc32c: crc32c::crc32c(payload),
        }
    }

    /// Bytes of the payload after the header.
    pub fn payload_bytes(&self) -> u64 {
        match self {
            ResponseHeader::State { elements, .. } => elements * 4,
            ResponseHeader::Refused { reason_length, .. } => u64::from(*reason_length),
        }
    }

    pub fn crc32c(&self) -> u32 {
        match self {
            ResponseHeader::State { crc32c, .. } | ResponseHeader::Refused { crc32c, .. } => {
                *crc32c
            }
        }
    }
}

/// Why bytes are not a catch-up message. Each names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CatchUpWireError {
    #[error("{message}: truncated: {found} bytes, {needed} needed")]
    Truncated {
        message: &'static str,
        needed: usize,
        found: usize,
    },
    #[error("request: {found} bytes given, its job_length makes it {expected}")]
    TrailingBytes { expected: usize, found: usize },
    #[error("magic: expected {expected:?}, found {found:02x?}")]
    Magic {
        expected: &'static str,
        found: [u8; 4],
    },
    #[error("version: {found} is not supported (this side speaks version {VERSION})")]
    Version { found: u8 },
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("{field}: the message says {expected:#010x}, its bytes give {computed:#010x}")]
    Checksum {
        field: &'static str,
        expected: u32,
        computed: u32,
    },
}

fn field(field: &'static str, reason: impl Into<String>) -> CatchUpWireError {
    CatchUpWireError::Field {
        field,
        reason: reason.into(),
    }
}

/// The first `len` bytes of a message (`message`) once they are there
/// with `magic` (`magic_name`) and [`VERSION`].
fn preamble<'a>(
    bytes: &'a [u8],
    len: usize,
    message: &'static str,
    magic: [u8; 4],
    magic_name: &'static str,
) -> Result<&'a [u8], CatchUpWireError> {
    let head = bytes.get(..len).ok_or(CatchUpWireError::Truncated {
        message,
        needed: len,
        found: bytes.len(),
    })?;
    let found = [head[0], head[1], head[2], head[3]];
    if found != magic {
        return Err(CatchUpWireError::Magic {
            expected: magic_name,
            found,
        });
    }
    if head[4] != VERSION {
        return Err(CatchUpWireError::Version { found: head[4] });
    }
    Ok(head)
}

fn check_job(job: &str) -> Result<(), CatchUpWireError> {
    if job.is_empty() || job.len() > MAX_JOB_BYTES {
        return Err(field(
            "job_length",
            format!("{} bytes, must be between 1 and {MAX_JOB_BYTES}", job.len()),
        ));
    }
    Ok(())
}

fn check_site(site: &str) -> Result<(), CatchUpWireError> {
    crate::plan::check_site_id(site).map_err(|error| match error {
        crate::PlanError::SiteId { reason, .. } => field("site", reason),
        other => field("site", other.to_string()),
    })
}

fn check_elements(elements: u64) -> Result<(), CatchUpWireError> {
    if !(1..=MAX_STATE_ELEMENTS).contains(&elements) {
        return Err(field(
            "elements",
            format!("{elements}, must be between 1 and {MAX_STATE_ELEMENTS}"),
        ));
    }
    Ok(())
}

/// The request's bytes; refuses what [`decode_request`] would.
pub fn encode_request(request: &CatchUpRequest) -> Result<Vec<u8>, CatchUpWireError> {
    check_job(&request.job)?;
    check_site(&request.site)?;
    check_elements(request.elements)?;
    let (job, site) = (request.job.as_bytes(), request.site.as_bytes());
    let mut out = Vec::with_capacity(REQUEST_FIXED_LEN + job.len() + site.len() + 4);
    out.extend_from_slice(&REQUEST_MAGIC);
    out.push(VERSION);
    out.push(job.len() as u8);
    out.push(site.len() as u8);
    out.push(0);
    out.extend_from_slice(&request.round.to_le_bytes());
    out.extend_from_slice(&request.elements.to_le_bytes());
    out.extend_from_slice(job);
    out.extend_from_slice(site);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// The whole request's length from its first [`REQUEST_FIXED_LEN`] bytes
/// (at most [`MAX_REQUEST_BYTES`]).
pub fn request_length(fixed: &[u8]) -> Result<usize, CatchUpWireError> {
    let fixed = preamble(fixed, REQUEST_FIXED_LEN, "request", REQUEST_MAGIC, "LHCQ")?;
    let job_length = fixed[5] as usize;
    if job_length == 0 || job_length > MAX_JOB_BYTES {
        return Err(field(
            "job_length",
            format!("{job_length}, must be between 1 and {MAX_JOB_BYTES}"),
        ));
    }
    let site_length = fixed[6] as usize;
    if site_length == 0 || site_length > MAX_SITE_BYTES {
        return Err(field(
            "site_length",
            format!("{site_length}, must be between 1 and {MAX_SITE_BYTES}"),
        ));
    }
    if fixed[7] != 0 {
        return Err(field("reserved", "must be 0"));
    }
    check_elements(long(fixed, 16))?;
    Ok(REQUEST_FIXED_LEN + job_length + site_length + 4)
}

/// Decodes one whole request (exactly: no bytes after it).
pub fn decode_request(bytes: &[u8]) -> Result<CatchUpRequest, CatchUpWireError> {
    let total = request_length(bytes)?;
    if bytes.len() < total {
        return Err(CatchUpWireError::Truncated {
            message: "request",
            needed: total,
            found: bytes.len(),
        });
    }
    if bytes.len() > total {
        return Err(CatchUpWireError::TrailingBytes {
            expected: total,
            found: bytes.len(),
        });
    }
    let expected = word(bytes, total - 4);
    let computed = crc32c::crc32c(&bytes[..total - 4]);
    if expected != computed {
        return Err(CatchUpWireError::Checksum {
            field: "crc32c",
            expected,
            computed,
        });
    }
    let job_end = REQUEST_FIXED_LEN + bytes[5] as usize;
    let job = std::str::from_utf8(&bytes[REQUEST_FIXED_LEN..job_end])
        .map_err(|_| field("job", "not UTF-8"))?;
    let site =
        std::str::from_utf8(&bytes[job_end..total - 4]).map_err(|_| field("site", "not UTF-8"))?;
    check_site(site)?;
    Ok(CatchUpRequest {
        job: job.to_string(),
        site: site.to_string(),
        round: long(bytes, 8),
        elements: long(bytes, 16),
    })
}

/// The response header's bytes; refuses what [`decode_response_header`]
/// would refuse of any request.
pub fn encode_response_header(
    header: &ResponseHeader,
) -> Result<[u8; RESPONSE_HEADER_LEN], CatchUpWireError> {
    match *header {
        ResponseHeader::State {
            round,
            elements,
            crc32c,
        } => {
            check_elements(elements)?;
            Ok(header_bytes(0, 0, round, elements, crc32c))
        }
        ResponseHeader::Refused {
            round,
            reason_length,
            crc32c,
        } => {
            if !(1..=MAX_REASON_BYTES).contains(&usize::from(reason_length)) {
                return Err(field(
                    "reason_length",
                    format!("{reason_length}, must be between 1 and {MAX_REASON_BYTES}"),
                ));
            }
            Ok(header_bytes(1, reason_length, round, 0, crc32c))
        }
    }
}

/// A response header's bytes, sealed with its CRC (fields unchecked).
fn header_bytes(
    status: u8,
    reason_length: u16,
    round: u64,
    elements: u64,
    payload_crc32c: u32,
) -> [u8; RESPONSE_HEADER_LEN] {
    let mut out = [0u8; RESPONSE_HEADER_LEN];
    out[0..4].copy_from_slice(&RESPONSE_MAGIC);
    out[4] = VERSION;
    out[5] = status;
    out[6..8].copy_from_slice(&reason_length.to_le_bytes());
    out[8..16].copy_from_slice(&round.to_le_bytes());
    out[16..24].copy_from_slice(&elements.to_le_bytes());
    out[24..28].copy_from_slice(&payload_crc32c.to_le_bytes());
    let crc = crc32c::crc32c(&out[..32]);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
    out
}

/// A refusal's header and reason (shortened to [`MAX_REASON_BYTES`] at a
/// character boundary; an empty reason says so).
pub fn refusal(round: u64, reason: &str) -> ([u8; RESPONSE_HEADER_LEN], Vec<u8>) {
    let mut reason = if reason.is_empty() { "refused" } else { reason };
    if reason.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason = &reason[..end];
    }
    let bytes = reason.as_bytes().to_vec();
    // 1..=MAX_REASON_BYTES bytes, as a refusal must hold.
    let header = header_bytes(1, bytes.len() as u16, round, 0, crc32c::crc32c(&bytes));
    (header, bytes)
}

/// Decodes the header of the response to `request`: a state must be the
/// round and the size requested.
pub fn decode_response_header(
    bytes: &[u8],
    request: &CatchUpRequest,
) -> Result<ResponseHeader, CatchUpWireError> {
    let bytes = preamble(
        bytes,
        RESPONSE_HEADER_LEN,
        "response header",
        RESPONSE_MAGIC,
        "LHCA",
    )?;
    let expected = word(bytes, 32);
    let computed = crc32c::crc32c(&bytes[..32]);
    if expected != computed {
        return Err(CatchUpWireError::Checksum {
            field: "header_crc32c",
            expected,
            computed,
        });
    }
    if word(bytes, 28) != 0 {
        return Err(field("reserved", "must be 0"));
    }
    let round = long(bytes, 8);
    if round != request.round {
        return Err(field(
            "round",
            format!("{round}, the request asked for {}", request.round),
        ));
    }
    let reason_length = u16::from_le_bytes([bytes[6], bytes[7]]);
    let elements = long(bytes, 16);
    let crc32c = word(bytes, 24);
    match bytes[5] {
        0 => {
            if reason_length != 0 {
                return Err(field("reason_length", "must be 0 with a state"));
            }
            if elements != request.elements {
                return Err(field(
                    "elements",
                    format!("{elements}, the request asked for {}", request.elements),
                ));
            }
            Ok(ResponseHeader::State {
                round,
                elements,
                crc32c,
            })
        }
        1 => {
            if elements != 0 {
                return Err(field("elements", "must be 0 in a refusal"));
            }
            if !(1..=MAX_REASON_BYTES).contains(&usize::from(reason_length)) {
                return Err(field(
                    "reason_length",
                    format!("{reason_length}, must be between 1 and {MAX_REASON_BYTES}"),
                ));
            }
            Ok(ResponseHeader::Refused {
                round,
                reason_length,
                crc32c,
            })
        }
        status => Err(field(
            "status",
            format!("{status} is not 0 (state) or 1 (refused)"),
        )),
    }
}

/// Checks a payload read after `header` against its checksum.
pub fn check_payload(header: &ResponseHeader, payload: &[u8]) -> Result<(), CatchUpWireError> {
    if payload.len() as u64 != header.payload_bytes() {
        return Err(CatchUpWireError::Truncated {
            message: "payload",
            needed: header.payload_bytes() as usize,
            found: payload.len(),
        });
    }
    let computed = crc32c::crc32c(payload);
    if computed != header.crc32c() {
        return Err(CatchUpWireError::Checksum {
            field: "payload_crc32c",
            expected: header.crc32c(),
            computed,
        });
    }
    if matches!(header, ResponseHeader::Refused { .. }) && std::str::from_utf8(payload).is_err() {
        return Err(field("reason", "not UTF-8"));
    }
    Ok(())
}
