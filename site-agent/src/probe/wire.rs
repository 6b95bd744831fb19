//! The probe protocol on the wire (ALPN [`ALPN`]).
//!
//! One QUIC connection per probe, opened by the prober (client):
//!
//! 1. The client opens one bidirectional *control* stream and sends
//!    [`Frame::Hello`] with the site it speaks for; the server checks that the
//!    client's certificate names that site, then answers [`Frame::Welcome`]
//!    with its own site and limits.
//! 2. RTT: [`Datagram::Ping`]s, which the server returns as
//!    [`Datagram::Pong`]s unchanged but for the tag.
//! 3. Loss: numbered [`Datagram::Loss`]es; then [`Frame::LossDone`] on the
//!    control stream, answered by [`Frame::LossReport`] (which arrived).
//! 4. Throughput: unidirectional *sink* streams, each starting with
//!    [`SINK_STREAM_TAG`] and then bytes the server counts; the client resets
//!    them when its time is up and sends [`Frame::ThroughputDone`], answered by
//!    [`Frame::ThroughputReport`].
//! 5. The client closes the connection with [`code::DONE`].
//!
//! Control frames are a big-endian `u32` body length and a body that starts
//! with a tag byte; strings are a `u16` length and UTF-8. Integers are
//! big-endian. A frame that does not decode ends the session: the server
//! closes the connection with [`code::PROTOCOL`] and a reason saying what was
//! wrong.

use quinn::{RecvStream, SendStream};

/// The ALPN protocol of probe connections.
pub const ALPN: &[u8] = b"longhaul-probe/1";

/// The first byte of every sink stream.
pub const SINK_STREAM_TAG: u8 = 0x53;

/// Longest control frame body accepted from a client (a Hello with the
/// longest site name, or a small request).
pub const MAX_CLIENT_FRAME: usize = 1024;

/// Application error codes, for closing connections and streams.
pub mod code {
    /// The probe finished normally.
    pub const DONE: u32 = 0;
    /// A malformed or unexpected frame.
    pub const PROTOCOL: u32 = 1;
    /// The client's certificate does not name the site it claims to be.
    pub const WRONG_SITE: u32 = 2;
    /// A server limit (duration, bytes) was reached.
    pub const LIMIT: u32 = 3;
    /// The server is shutting down.
    pub const SHUTDOWN: u32 = 4;
    /// The client ended a sink stream because the throughput test is over.
    pub const SINK_DONE: u32 = 5;
}

/// What a probe server allows one connection, sent in [`Frame::Welcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub max_loss_datagrams: u32,
    pub max_streams: u32,
    pub max_duration_ms: u64,
    pub max_bytes: u64,
}

/// A control-stream frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Client → server, first: the site the client speaks for.
    Hello { site: String },
    /// Server → client: the server's site and limits.
    Welcome { site: String, limits: ServerLimits },
    /// Client → server: all `sent` loss datagrams (sequence `0..sent`) are out.
    LossDone { sent: u32 },
    /// Server → client: which of `0..sent` arrived; bit `i % 8` of byte
    /// `i / 8` is datagram `i`.
    LossReport {
        sent: u32,
        received: u32,
        arrived: Vec<u8>,
    },
    /// Client → server: the throughput test is over.
    ThroughputDone,
    /// Server → client: stream bytes received on sink streams, how many sink
    /// streams there were, and nanoseconds from the first to the last byte.
    ThroughputReport {
        bytes: u64,
        streams: u32,
        span_ns: u64,
    },
}

const TAG_HELLO: u8 = 1;
const TAG_WELCOME: u8 = 2;
const TAG_LOSS_DONE: u8 = 3;
const TAG_LOSS_REPORT: u8 = 4;
const TAG_THROUGHPUT_DONE: u8 = 5;
const TAG_THROUGHPUT_REPORT: u8 = 6;

/// A datagram of the RTT and loss tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datagram {
    /// Client → server: echo this back.
    Ping { sequence: u32, sent_ns: u64 },
    /// Server → client: the ping, returned.
    Pong { sequence: u32, sent_ns: u64 },
    /// Client → server: one datagram of the loss test.
    Loss { sequence: u32 },
}

pub const DATAGRAM_PING: u8 = 1;
pub const DATAGRAM_PONG: u8 = 2;
pub const DATAGRAM_LOSS: u8 = 3;

/// Bytes of a ping or pong.
pub const PING_LEN: usize = 13;
/// Bytes of a loss datagram's header; the rest is padding.
pub const LOSS_HEADER_LEN: usize = 5;

/// Why bytes from a peer do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{what} is truncated: needs {needed} more bytes, has {available}")]
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("{what} has {extra} unexpected trailing bytes")]
    Trailing { what: &'static str, extra: usize },
    #[error("unknown {what} tag {tag:#04x}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("{what} is {len} bytes, more than the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{what} is not UTF-8")]
    NotUtf8 { what: &'static str },
    #[error("{what}: {message}")]
    Invalid { what: &'static str, message: String },
}

impl Frame {
    /// The frame's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "Hello",
            Self::Welcome { .. } => "Welcome",
            Self::LossDone { .. } => "LossDone",
            Self::LossReport { .. } => "LossReport",
            Self::ThroughputDone => "ThroughputDone",
            Self::ThroughputReport { .. } => "ThroughputReport",
        }
    }

    /// The body (tag and fields), without the length prefix.
    pub fn encode_body(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::Hello { site } => {
                out.push(TAG_HELLO);
                put_string(&mut out, site);
            }
            Self::Welcome { site, limits } => {
                out.push(TAG_WELCOME);
                put_string(&mut out, site);
                out.extend_from_slice(&limits.max_loss_datagrams.to_be_bytes());
                out.extend_from_slice(&limits.max_streams.to_be_bytes());
                out.extend_from_slice(&limits.max_duration_ms.to_be_bytes());
                out.extend_from_slice(&limits.max_bytes.to_be_bytes());
            }
            Self::LossDone { sent } => {
                out.push(TAG_LOSS_DONE);
                out.extend_from_slice(&sent.to_be_bytes());
            }
            Self::LossReport {
                sent,
                received,
                arrived,
            } => {
                out.push(TAG_LOSS_REPORT);
                out.extend_from_slice(&sent.to_be_bytes());
                out.extend_from_slice(&received.to_be_bytes());
                out.extend_from_slice(arrived);
            }
            Self::ThroughputDone => out.push(TAG_THROUGHPUT_DONE),
            Self::ThroughputReport {
                bytes,
                streams,
                span_ns,
            } => {
                out.push(TAG_THROUGHPUT_REPORT);
                out.extend_from_slice(&bytes.to_be_bytes());
                out.extend_from_slice(&streams.to_be_bytes());
                out.extend_from_slice(&span_ns.to_be_bytes());
            }
        }
        out
    }

    /// The frame with its length prefix.
    pub fn encode(&self) -> Vec<u8> {
        let body = self.encode_body();
        let mut out = Vec::with_capacity(4 + body.len());
        // Bodies are far below 4 GiB (a loss report of u32::MAX datagrams is 512 MiB).
        out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a body (tag and fields), checking every length.
    pub fn decode_body(body: &[u8]) -> Result<Self, WireError> {
        let mut reader = Reader::new(body);
        let tag = reader.u8("control frame")?;
        let frame = match tag {
            TAG_HELLO => Self::Hello {
                site: reader.string("Hello site")?,
            },
            TAG_WELCOME => Self::Welcome {
                site: reader.string("Welcome site")?,
                limits: ServerLimits {
                    max_loss_datagrams: reader.u32("Welcome limits")?,
                    max_streams: reader.u32("Welcome limits")?,
                    max_duration_ms: reader.u64("Welcome limits")?,
                    max_bytes: reader.u64("Welcome limits")?,
                },
            },
            TAG_LOSS_DONE => Self::LossDone {
                sent: reader.u32("LossDone")?,
            },
            TAG_LOSS_REPORT => {
                let sent = reader.u32("LossReport")?;
                let received = reader.u32("LossReport")?;
                let bitmap_len = bitmap_len(sent);
                let arrived = reader.take("LossReport bitmap", bitmap_len)?.to_vec();
                let counted: u32 = arrived.iter().map(|b| b.count_ones()).sum();
                if counted != received {
                    return Err(WireError::Invalid {
                        what: "LossReport",
                        message: format!(
                            "says {received} datagrams arrived but its bitmap has {counted}"
                        ),
                    });
                }
                if received > sent {
                    return Err(WireError::Invalid {
                        what: "LossReport",
                        message: format!("{received} datagrams arrived of only {sent} sent"),
                    });
                }
                Self::LossReport {
                    sent,
                    received,
                    arrived,
                }
            }
            TAG_THROUGHPUT_DONE => Self::ThroughputDone,
            TAG_THROUGHPUT_REPORT => Self::ThroughputReport {
                bytes: reader.u64("ThroughputReport")?,
                streams: reader.u32("ThroughputReport")?,
                span_ns: reader.u64("ThroughputReport")?,
            },
            tag => {
                return Err(WireError::UnknownTag {
                    what: "control frame",
                    tag,
                });
            }
        };
        reader.finish(frame.name())?;
        Ok(frame)
    }
}

/// Bytes of a loss bitmap for `sent` datagrams.
pub fn bitmap_len(sent: u32) -> usize {
    (sent as usize).div_ceil(8)
}

impl Datagram {
    /// Encodes a ping or pong exactly; a loss datagram padded with `padding`
    /// after its header.
    pub fn encode(&self, padding: &[u8]) -> Vec<u8> {
        match *self {
            Self::Ping { sequence, sent_ns } | Self::Pong { sequence, sent_ns } => {
                let tag = if matches!(self, Self::Ping { .. }) {
                    DATAGRAM_PING
                } else {
                    DATAGRAM_PONG
                };
                let mut out = Vec::with_capacity(PING_LEN);
                out.push(tag);
                out.extend_from_slice(&sequence.to_be_bytes());
                out.extend_from_slice(&sent_ns.to_be_bytes());
                out
            }
            Self::Loss { sequence } => {
                let mut out = Vec::with_capacity(LOSS_HEADER_LEN + padding.len());
                out.push(DATAGRAM_LOSS);
                out.extend_from_slice(&sequence.to_be_bytes());
                out.extend_from_slice(padding);
                out
            }
        }
    }

    /// Decodes a datagram; a loss datagram's padding is ignored.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut reader = Reader::new(bytes);
        match reader.u8("datagram")? {
            tag @ (DATAGRAM_PING | DATAGRAM_PONG) => {
                let sequence = reader.u32("ping datagram")?;
                let sent_ns = reader.u64("ping datagram")?;
                reader.finish("ping datagram")?;
                Ok(if tag == DATAGRAM_PING {
                    Self::Ping { sequence, sent_ns }
                } else {
                    Self::Pong { sequence, sent_ns }
                })
            }
            DATAGRAM_LOSS => Ok(Self::Loss {
                sequence: reader.u32("loss datagram")?,
            }),
            tag => Err(WireError::UnknownTag {
                what: "datagram",
                tag,
            }),
        }
    }
}

/// Writes one frame on a control stream.
pub async fn write_frame(send: &mut SendStream, frame: &Frame) -> Result<(), quinn::WriteError> {
    send.write_all(&frame.encode()).await
}

/// Why the next frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadFrameError {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Read(#[from] quinn::ReadError),
    #[error("the stream ended inside a frame")]
    EndedInsideFrame,
}

/// Reads the next frame of at most `max_body` bytes; `None` when the stream
/// ended cleanly between frames.
pub async fn read_frame(
    recv: &mut RecvStream,
    max_body: usize,
) -> Result<Option<Frame>, ReadFrameError> {
    let mut length = [0u8; 4];
    if !read_exact_or_end(recv, &mut length).await? {
        return Ok(None);
    }
    let len = u32::from_be_bytes(length) as usize;
    if len > max_body {
        return Err(WireError::TooLong {
            what: "control frame",
            len,
            max: max_body,
        }
        .into());
    }
    let mut body = vec![0u8; len];
    if !read_exact_or_end(recv, &mut body).await? && len > 0 {
        return Err(ReadFrameError::EndedInsideFrame);
    }
    Ok(Some(Frame::decode_body(&body)?))
}

/// Fills `buffer`; `false` if the stream ended before the first byte.
async fn read_exact_or_end(
    recv: &mut RecvStream,
    buffer: &mut [u8],
) -> Result<bool, ReadFrameError> {
    let mut filled = 0;
    while filled < buffer.len() {
        match recv.read(&mut buffer[filled..]).await? {
            Some(n) => filled += n,
            None if filled == 0 => return Ok(false),
            None => return Err(ReadFrameError::EndedInsideFrame),
        }
    }
    Ok(true)
}

fn put_string(out: &mut Vec<u8>, value: &str) {
    // Site names are DNS labels, far shorter than 64 KiB; cut rather than panic.
    let bytes = &value.as_bytes()[..value.len().min(usize::from(u16::MAX))];
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Reads fields off a byte slice, with errors naming the frame.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < n {
            return Err(WireError::Truncated {
                what,
                needed: n,
                available: self.bytes.len(),
            });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(what, N)?);
        Ok(array)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &'static str) -> Result<String, WireError> {
        let len = usize::from(self.u16(what)?);
        let bytes = self.take(what, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::NotUtf8 { what })
    }

    fn finish(&self, what: &'static str) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing {
                what,
                extra: self.bytes.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Hello {
                site: "north".to_string(),
            },
            Frame::Welcome {
                site: "south".to_string(),
                limits: ServerLimits {
                    max_loss_datagrams: 7,
                    max_streams: 8,
                    max_duration_ms: 9,
                    max_bytes: 10,
                },
            },
            Frame::LossDone { sent: 11 },
            Frame::LossReport {
                sent: 11,
                received: 3,
                arrived: vec![0b0000_0111, 0],
            },
            Frame::ThroughputDone,
            Frame::ThroughputReport {
                bytes: 1 << 40,
                streams: 4,
                span_ns: 123,
            },
        ];
        for frame in frames {
            let encoded = frame.encode();
            assert_eq!(encoded.len(), 4 + frame.encode_body().len());
            assert_eq!(Frame::decode_body(&encoded[4..]), Ok(frame));
        }
    }

    #[test]
    fn bad_frames_are_named_errors() {
        assert_eq!(
            Frame::decode_body(&[0x7f]),
            Err(WireError::UnknownTag {
                what: "control frame",
                tag: 0x7f
            })
        );
        assert!(matches!(
            Frame::decode_body(&[]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            Frame::decode_body(&[TAG_HELLO, 0, 5, b'a']),
            Err(WireError::Truncated {
                what: "Hello site",
                ..
            })
        ));
        assert!(matches!(
            Frame::decode_body(&[TAG_THROUGHPUT_DONE, 1]),
            Err(WireError::Trailing { extra: 1, .. })
        ));
        assert!(matches!(
            Frame::decode_body(&[TAG_HELLO, 0, 1, 0xff]),
            Err(WireError::NotUtf8 { .. })
        ));
        // A report whose count disagrees with its bitmap.
        let lying = Frame::LossReport {
            sent: 8,
            received: 8,
            arrived: vec![1],
        };
        let error = Frame::decode_body(&lying.encode_body()).unwrap_err();
        assert!(error.to_string().contains("bitmap has 1"), "{error}");
    }

    #[test]
    fn datagrams_round_trip_and_reject_garbage() {
        let ping = Datagram::Ping {
            sequence: 3,
            sent_ns: 99,
        };
        assert_eq!(Datagram::decode(&ping.encode(&[])), Ok(ping));
        let loss = Datagram::Loss { sequence: 42 };
        assert_eq!(Datagram::decode(&loss.encode(&[1, 2, 3])), Ok(loss));
        assert!(Datagram::decode(&[]).is_err());
        assert!(Datagram::decode(&[9, 0, 0, 0, 0]).is_err());
        assert!(Datagram::decode(&[DATAGRAM_PING, 0, 0]).is_err());
    }
}
