//! The prober: one QUIC connection to a peer's [`ProbeServer`], the three
//! tests in order (RTT on an idle link first, then loss, then throughput,
//! which fills queues), then a clean close.
//!
//! [`ProbeServer`]: super::ProbeServer

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, ConnectionError, RecvStream, SendDatagramError, SendStream, VarInt};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::wire::{self, Datagram, Frame, ReadFrameError, ServerLimits, code};
use super::{Phase, ProbeError, ProbeOptions, ProbeResult, percentile};
use crate::tls::{self, AgentTls};
use longhaul_core::rng::SeedRng;

/// Bytes of one loss datagram. Small, so that the loss test stays below what
/// QUIC's congestion control allows even on a lossy long link (it would
/// otherwise pace the datagrams). Each leaves in a packet of its own (see
/// `measure_loss`), so the loss measured is per packet.
const LOSS_DATAGRAM_BYTES: usize = 32;

/// Bytes of each write of the throughput test (shared by all streams).
const SINK_CHUNK_BYTES: usize = 64 << 10;

/// Measures RTT, loss and throughput to the probe server of site `peer_site`
/// at `peer`. The server must present a certificate naming `peer_site`
/// (unless `tls` is insecure local mode); this agent presents its own.
/// Everything is bounded by `options.timeout`.
pub async fn probe(
    peer: SocketAddr,
    peer_site: &str,
    tls: &AgentTls,
    options: &ProbeOptions,
) -> Result<ProbeResult, ProbeError> {
    options.validate()?;
    let server_name = tls::site_name(peer_site)?;
    // The server never opens streams towards the prober.
    let transport = options.transport.transport_config(0, 0)?;
    let config = tls.quinn_client_config(&[wire::ALPN], transport)?;
    let bind = if peer.is_ipv4() {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
    };
    let (endpoint, _) = crate::udp::quic_endpoint(
        bind,
        None,
        options.transport.socket_buffer_bytes,
        "probe client",
    )
    .map_err(|source| ProbeError::Endpoint { addr: bind, source })?;
    let context = Context {
        peer,
        peer_site: peer_site.to_string(),
        expected_name: server_name.to_str().into_owned(),
        deadline: Instant::now() + options.timeout,
        timeout: options.timeout,
    };
    let connecting = endpoint
        .connect_with(config, peer, &context.expected_name)
        .map_err(|source| ProbeError::Connect {
            peer,
            peer_site: peer_site.to_string(),
            source,
        })?;
    let connection = context
        .bounded(Phase::Handshake, async {
            connecting
                .await
                .map_err(|error| context.handshake_error(error))
        })
        .await?;
    let result = run(&context, &connection, tls.site(), options).await;
    let reason: &[u8] = if result.is_ok() {
        b"probe done"
    } else {
        b"probe abandoned"
    };
    connection.close(VarInt::from_u32(code::DONE), reason);
    // The endpoint's driver keeps running until the close has been sent.
    result
}

/// Who is being probed, and until when.
struct Context {
    peer: SocketAddr,
    peer_site: String,
    expected_name: String,
    deadline: Instant,
    timeout: Duration,
}

impl Context {
    async fn bounded<T>(
        &self,
        phase: Phase,
        future: impl Future<Output = Result<T, ProbeError>>,
    ) -> Result<T, ProbeError> {
        match tokio::time::timeout_at(self.deadline, future).await {
            Ok(result) => result,
            Err(_) => Err(ProbeError::Timeout {
                peer: self.peer,
                peer_site: self.peer_site.clone(),
                phase,
                timeout: self.timeout,
            }),
        }
    }

    fn handshake_error(&self, error: ConnectionError) -> ProbeError {
        match error {
            ConnectionError::ConnectionClosed(ref close)
                if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
            {
                self.refused("its probe server is at its connection limit or shutting down")
            }
            ConnectionError::ApplicationClosed(close) => {
                self.refused(&String::from_utf8_lossy(&close.reason))
            }
            // Our verifier rejected the server (TransportError), or the server
            // rejected us with a TLS alert (ConnectionClosed).
            ConnectionError::TransportError(_) | ConnectionError::ConnectionClosed(_) => {
                ProbeError::Handshake {
                    peer: self.peer,
                    peer_site: self.peer_site.clone(),
                    expected_name: self.expected_name.clone(),
                    reason: error.to_string(),
                }
            }
            other => self.lost(Phase::Handshake, other),
        }
    }

    fn refused(&self, reason: &str) -> ProbeError {
        ProbeError::Refused {
            peer: self.peer,
            peer_site: self.peer_site.clone(),
            reason: reason.to_string(),
        }
    }

    /// The connection ended: the server closing it deliberately (with a
    /// reason) is a refusal; a TLS alert (the server rejecting this agent's
    /// certificate, which in TLS 1.3 it does after the client thinks the
    /// handshake is done) a failed handshake; anything else a lost connection.
    fn lost(&self, phase: Phase, error: ConnectionError) -> ProbeError {
        match error {
            ConnectionError::ApplicationClosed(close) => {
                self.refused(&String::from_utf8_lossy(&close.reason))
            }
            ConnectionError::ConnectionClosed(ref close)
                if u64::from(close.error_code) & !0xff == 0x100 =>
            {
                ProbeError::Handshake {
                    peer: self.peer,
                    peer_site: self.peer_site.clone(),
                    expected_name: self.expected_name.clone(),
                    reason: format!("the server rejected this agent's certificate: {error}"),
                }
            }
            source => ProbeError::Connection {
                peer: self.peer,
                peer_site: self.peer_site.clone(),
                phase,
                source,
            },
        }
    }

    fn protocol(&self, phase: Phase, message: impl Into<String>) -> ProbeError {
        ProbeError::Protocol {
            peer: self.peer,
            peer_site: self.peer_site.clone(),
            phase,
            message: message.into(),
        }
    }

    fn write_error(&self, phase: Phase, error: quinn::WriteError) -> ProbeError {
        match error {
            quinn::WriteError::ConnectionLost(error) => self.lost(phase, error),
            other => self.protocol(phase, format!("the control stream failed: {other}")),
        }
    }

    fn read_error(&self, phase: Phase, error: ReadFrameError) -> ProbeError {
        match error {
            ReadFrameError::Read(quinn::ReadError::ConnectionLost(error)) => {
                self.lost(phase, error)
            }
            other => self.protocol(phase, other.to_string()),
        }
    }

    fn datagram_error(&self, phase: Phase, error: SendDatagramError) -> ProbeError {
        match error {
            SendDatagramError::ConnectionLost(error) => self.lost(phase, error),
            other => self.protocol(phase, format!("cannot send a datagram: {other}")),
        }
    }

    /// Sends `frame` and reads the answer, of at most `max_body` bytes.
    async fn exchange(
        &self,
        phase: Phase,
        control: &mut Control,
        frame: &Frame,
        max_body: usize,
    ) -> Result<Frame, ProbeError> {
        wire::write_frame(&mut control.send, frame)
            .await
            .map_err(|error| self.write_error(phase, error))?;
        match wire::read_frame(&mut control.recv, max_body).await {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(self.protocol(
                phase,
                format!(
                    "the server ended the control stream instead of answering {}",
                    frame.name()
                ),
            )),
            Err(error) => Err(self.read_error(phase, error)),
        }
    }
}

struct Control {
    send: SendStream,
    recv: RecvStream,
}

async fn run(
    context: &Context,
    connection: &Connection,
    own_site: &str,
    options: &ProbeOptions,
) -> Result<ProbeResult, ProbeError> {
    let mut rng = SeedRng::new(options.seed);
    let mut control = context
        .bounded(Phase::Hello, hello(context, connection, own_site, options))
        .await?;
    let rtt = context
        .bounded(
            Phase::Rtt,
            measure_rtt(context, connection, options, &mut rng),
        )
        .await?;
    let (sent, received) = context
        .bounded(
            Phase::Loss,
            measure_loss(context, connection, &mut control, options, &mut rng, &rtt),
        )
        .await?;
    let (bytes, duration_ns) = context
        .bounded(
            Phase::Throughput,
            measure_throughput(context, connection, &mut control, options, &mut rng),
        )
        .await?;
    let _ = control.send.finish();
    let throughput_bps = if duration_ns == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / (duration_ns as f64 / 1e9)
    };
    Ok(ProbeResult {
        rtt_min_ns: rtt.min_ns,
        rtt_p50_ns: rtt.p50_ns,
        rtt_p99_ns: rtt.p99_ns,
        samples: rtt.samples,
        loss_rate: if sent == 0 {
            0.0
        } else {
            f64::from(sent - received) / f64::from(sent)
        },
        sent,
        received,
        throughput_bps,
        bytes,
        duration_ns,
    })
}

/// Opens the control stream, says which site this agent is, and checks the
/// server's answer: its site, and that its limits admit `options`.
async fn hello(
    context: &Context,
    connection: &Connection,
    own_site: &str,
    options: &ProbeOptions,
) -> Result<Control, ProbeError> {
    let (send, recv) = connection
        .open_bi()
        .await
        .map_err(|error| context.lost(Phase::Hello, error))?;
    let mut control = Control { send, recv };
    let hello = Frame::Hello {
        site: own_site.to_string(),
    };
    let answer = context
        .exchange(Phase::Hello, &mut control, &hello, wire::MAX_CLIENT_FRAME)
        .await?;
    let (site, limits) = match answer {
        Frame::Welcome { site, limits } => (site, limits),
        other => {
            return Err(context.protocol(
                Phase::Hello,
                format!("answered Hello with {}, not Welcome", other.name()),
            ));
        }
    };
    if site != context.peer_site {
        return Err(context.protocol(Phase::Hello, format!("the server says it is site {site:?}")));
    }
    check_limits(context, options, &limits)?;
    Ok(control)
}

fn check_limits(
    context: &Context,
    options: &ProbeOptions,
    limits: &ServerLimits,
) -> Result<(), ProbeError> {
    let exceeds = |what: &'static str, requested: u64, limit: u64| {
        if requested > limit {
            Err(ProbeError::PeerLimit {
                peer_site: context.peer_site.clone(),
                what,
                requested,
                limit,
            })
        } else {
            Ok(())
        }
    };
    exceeds(
        "`loss_datagrams`",
        u64::from(options.loss_datagrams),
        u64::from(limits.max_loss_datagrams),
    )?;
    if !options.throughput_duration.is_zero() {
        exceeds(
            "`throughput_streams`",
            u64::from(options.throughput_streams),
            u64::from(limits.max_streams),
        )?;
    }
    exceeds(
        "the schedule (ms of pings, loss and throughput tests)",
        options
            .schedule()
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX),
        limits.max_duration_ms,
    )
}

struct Rtt {
    min_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    samples: u32,
}

/// Sends `options.pings` ping datagrams `ping_interval` apart (±10% at
/// random) and times their echoes; waits for stragglers up to three times
/// the slowest echo seen (at least 50 ms, at most 1 s).
async fn measure_rtt(
    context: &Context,
    connection: &Connection,
    options: &ProbeOptions,
    rng: &mut SeedRng,
) -> Result<Rtt, ProbeError> {
    let pings = options.pings;
    let interval = options.ping_interval;
    let origin = Instant::now();
    let mut sent_ns: Vec<Option<u64>> = vec![None; pings as usize];
    let mut echoed = vec![false; pings as usize];
    let mut samples: Vec<u64> = Vec::with_capacity(pings as usize);
    let mut next: u32 = 0;
    let mut next_at = origin;
    let mut drain_until: Option<Instant> = None;
    while samples.len() < pings as usize {
        if next == pings && drain_until.is_none() {
            let slowest = samples.iter().copied().max().unwrap_or(0);
            let wait = Duration::from_nanos(slowest.saturating_mul(3))
                .clamp(Duration::from_millis(50), Duration::from_secs(1));
            drain_until = Some(Instant::now() + wait);
        }
        tokio::select! {
            _ = sleep_until(next_at), if next < pings => {
                let now_ns = nanos_since(origin);
                let ping = Datagram::Ping { sequence: next, sent_ns: now_ns }.encode(&[]);
                connection
                    .send_datagram_wait(Bytes::from(ping))
                    .await
                    .map_err(|error| context.datagram_error(Phase::Rtt, error))?;
                sent_ns[next as usize] = Some(now_ns);
                next += 1;
                let jitter = interval.as_secs_f64() * (rng.unit() * 0.2 - 0.1);
                let planned = interval.as_secs_f64() * f64::from(next) + jitter;
                next_at = origin + Duration::from_secs_f64(planned.max(0.0));
            }
            _ = sleep_until(drain_until.unwrap_or(origin)), if drain_until.is_some() => break,
            datagram = connection.read_datagram() => {
                let datagram = datagram.map_err(|error| context.lost(Phase::Rtt, error))?;
                let Ok(Datagram::Pong { sequence, sent_ns: echoed_ns }) = Datagram::decode(&datagram)
                else {
                    tracing::debug!(peer = %context.peer, "ignored a datagram that is not a pong");
                    continue;
                };
                let index = sequence as usize;
                // Only an echo of a ping we sent, once, with its own timestamp.
                if sent_ns.get(index).copied().flatten() == Some(echoed_ns) && !echoed[index] {
                    echoed[index] = true;
                    samples.push(nanos_since(origin).saturating_sub(echoed_ns));
                }
            }
        }
    }
    if samples.is_empty() {
        return Err(ProbeError::NoEcho {
            peer: context.peer,
            peer_site: context.peer_site.clone(),
            pings,
        });
    }
    samples.sort_unstable();
    Ok(Rtt {
        min_ns: samples[0],
        p50_ns: percentile(&samples, 0.5),
        p99_ns: percentile(&samples, 0.99),
        max_ns: samples[samples.len() - 1],
        samples: samples.len() as u32,
    })
}

/// Sends the loss datagrams on schedule, waits until they have all left and
/// had time to arrive, and asks the server which did. Returns (sent, received).
async fn measure_loss(
    context: &Context,
    connection: &Connection,
    control: &mut Control,
    options: &ProbeOptions,
    rng: &mut SeedRng,
    rtt: &Rtt,
) -> Result<(u32, u32), ProbeError> {
    let count = options.loss_datagrams;
    if count == 0 {
        return Ok((0, 0));
    }
    let padding = rng.bytes(LOSS_DATAGRAM_BYTES - wire::LOSS_HEADER_LEN);
    // The free space of quinn's datagram buffer when it is empty (quinn
    // reserves some), to know below when every datagram has left.
    let empty_buffer_space = connection.datagram_send_buffer_space();
    let origin = Instant::now();
    let period = 1.0 / f64::from(options.loss_rate_pps);
    let started = std::time::Instant::now();
    for sequence in 0..count {
        let due = origin + Duration::from_secs_f64(period * f64::from(sequence));
        sleep_until(due).await;
        let datagram = Datagram::Loss { sequence }.encode(&padding);
        connection
            .send_datagram_wait(Bytes::from(datagram))
            .await
            .map_err(|error| context.datagram_error(Phase::Loss, error))?;
        // Two datagrams queued together would leave in one packet and be
        // lost together, which would make the count's variance that of half
        // as many datagrams. Wait until this one has left quinn's buffer
        // (congestion control may hold it back for a while).
        wait_until_sent(connection, empty_buffer_space).await;
    }
    let sending = started.elapsed();
    let achieved = f64::from(count) / sending.as_secs_f64().max(1e-9);
    if achieved < 0.5 * f64::from(options.loss_rate_pps) {
        tracing::debug!(
            peer = %context.peer,
            achieved_pps = achieved,
            requested_pps = options.loss_rate_pps,
            "loss datagrams were paced below the requested rate"
        );
    }
    // All have left; one more slowest round trip for the last to arrive.
    tokio::time::sleep(Duration::from_nanos(rtt.max_ns).max(Duration::from_millis(10))).await;

    let max_body = 16 + wire::bitmap_len(count);
    let answer = context
        .exchange(
            Phase::Loss,
            control,
            &Frame::LossDone { sent: count },
            max_body,
        )
        .await?;
    match answer {
        Frame::LossReport { sent, received, .. } if sent == count => Ok((sent, received)),
        Frame::LossReport { sent, .. } => Err(context.protocol(
            Phase::Loss,
            format!("reported on {sent} datagrams, not the {count} sent"),
        )),
        other => Err(context.protocol(
            Phase::Loss,
            format!("answered LossDone with {}, not LossReport", other.name()),
        )),
    }
}

/// Writes on `throughput_streams` sink streams for `throughput_duration`,
/// resets them, and asks the server what it received. Returns (bytes,
/// nanoseconds from the first to the last byte at the server).
async fn measure_throughput(
    context: &Context,
    connection: &Connection,
    control: &mut Control,
    options: &ProbeOptions,
    rng: &mut SeedRng,
) -> Result<(u64, u64), ProbeError> {
    if options.throughput_duration.is_zero() {
        return Ok((0, 0));
    }
    let chunk = Bytes::from(rng.bytes(SINK_CHUNK_BYTES));
    let end = Instant::now() + options.throughput_duration;
    // Dropping the set (on timeout) aborts the writers.
    let mut writers = JoinSet::new();
    for _ in 0..options.throughput_streams {
        writers.spawn(write_sink(connection.clone(), chunk.clone(), end));
    }
    while let Some(joined) = writers.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(context.lost(Phase::Throughput, error)),
            Err(error) => {
                return Err(context.protocol(
                    Phase::Throughput,
                    format!("a stream writer failed: {error}"),
                ));
            }
        }
    }
    let answer = context
        .exchange(
            Phase::Throughput,
            control,
            &Frame::ThroughputDone,
            wire::MAX_CLIENT_FRAME,
        )
        .await?;
    match answer {
        Frame::ThroughputReport { bytes, span_ns, .. } => Ok((bytes, span_ns)),
        other => Err(context.protocol(
            Phase::Throughput,
            format!(
                "answered ThroughputDone with {}, not ThroughputReport",
                other.name()
            ),
        )),
    }
}

/// One sink stream: the tag, then `chunk` again and again until `end`. The
/// server stopping the stream (its byte limit) ends it early; only losing the
/// connection is an error.
async fn write_sink(
    connection: Connection,
    chunk: Bytes,
    end: Instant,
) -> Result<(), ConnectionError> {
    let mut send = tokio::select! {
        opened = connection.open_uni() => opened?,
        _ = sleep_until(end) => return Ok(()),
    };
    let mut result = Ok(());
    let mut first = Some(Bytes::from_static(&[wire::SINK_STREAM_TAG]));
    loop {
        let next = first.take().unwrap_or_else(|| chunk.clone());
        tokio::select! {
            written = send.write_chunk(next) => match written {
                Ok(()) => {}
                Err(quinn::WriteError::ConnectionLost(error)) => {
                    result = Err(error);
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "sink stream ended early");
                    break;
                }
            },
            _ = sleep_until(end) => break,
        }
    }
    // Unsent data is discarded: the test is over.
    let _ = send.reset(VarInt::from_u32(code::SINK_DONE));
    result
}

/// Waits until quinn's datagram buffer is empty again: a few yields to the
/// connection's driver, then millisecond sleeps.
async fn wait_until_sent(connection: &Connection, empty_buffer_space: usize) {
    let mut yields = 0;
    while connection.datagram_send_buffer_space() < empty_buffer_space {
        if yields < 32 {
            yields += 1;
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn nanos_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
