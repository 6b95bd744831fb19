//! The probe server: echoes pings, counts loss datagrams and sink bytes for
//! other sites' agents, within limits.
//!
//! Each connection is one probe session. The client's certificate is
//! verified against the CA during the handshake (rustls); after the client's
//! Hello the server checks that the certificate names the site the client
//! claims, and refuses it otherwise. Every session is bounded: a connection
//! limit (excess handshakes are refused), a duration (the connection is
//! closed when it is reached), a byte budget for sink streams (streams are
//! stopped), a stream limit (QUIC flow control) and a loss-test size. A
//! malformed frame on the control stream closes the connection with a reason;
//! a malformed sink stream is stopped; a malformed datagram is ignored.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, ConnectionError, RecvStream, VarInt};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::wire::{self, Datagram, Frame, ReadFrameError, ServerLimits, code};
use super::{ProbeError, QuicTuning};
use crate::data_endpoint::{Pending, Source};
use crate::tls::{self, AgentTls};

/// What a probe server allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeServerOptions {
    /// Probe sessions at once; more are refused. Default 16.
    pub max_connections: usize,
    /// Longest session, handshake included. Default 60 s.
    pub max_probe_duration: Duration,
    /// Sink bytes accepted per session. Default 16 GiB (10 Gbit/s for ~14 s).
    pub max_bytes: u64,
    /// Sink streams a client may have open at once. Default 64.
    pub max_streams: u32,
    /// Largest loss test. Default 100 000 datagrams.
    pub max_loss_datagrams: u32,
    pub transport: QuicTuning,
}

impl Default for ProbeServerOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            max_probe_duration: Duration::from_secs(60),
            max_bytes: 16 << 30,
            max_streams: 64,
            max_loss_datagrams: 100_000,
            transport: QuicTuning::default(),
        }
    }
}

impl ProbeServerOptions {
    /// Checks the options; errors name the field.
    pub fn validate(&self) -> Result<(), ProbeError> {
        let invalid = |field: &'static str, message: String| {
            Err(ProbeError::InvalidOptions { field, message })
        };
        if !(1..=10_000).contains(&self.max_connections) {
            return invalid(
                "max_connections",
                format!(
                    "is {}; it must be between 1 and 10000",
                    self.max_connections
                ),
            );
        }
        if self.max_probe_duration < Duration::from_millis(100)
            || self.max_probe_duration > Duration::from_secs(3600)
        {
            return invalid(
                "max_probe_duration",
                format!(
                    "is {:?}; it must be between 100 ms and 1 h",
                    self.max_probe_duration
                ),
            );
        }
        if self.max_bytes == 0 {
            return invalid("max_bytes", "must be positive".to_string());
        }
        if !(1..=1024).contains(&self.max_streams) {
            return invalid(
                "max_streams",
                format!("is {}; it must be between 1 and 1024", self.max_streams),
            );
        }
        if self.max_loss_datagrams > 10_000_000 {
            return invalid(
                "max_loss_datagrams",
                format!(
                    "is {}; it must be at most 10000000",
                    self.max_loss_datagrams
                ),
            );
        }
        self.transport.validate()
    }

    fn limits(&self) -> ServerLimits {
        ServerLimits {
            max_loss_datagrams: self.max_loss_datagrams,
            max_streams: self.max_streams,
            max_duration_ms: self
                .max_probe_duration
                .as_millis()
                .try_into()
                .unwrap_or(u64::MAX),
            max_bytes: self.max_bytes,
        }
    }
}

/// One finished probe session, as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub remote: SocketAddr,
    /// The site the client said it was, once it said so.
    pub peer_site: Option<String>,
    /// Whether the client's certificate was checked to name `peer_site`
    /// (false in insecure local mode and for refused clients).
    pub verified: bool,
    /// Why the session failed; `None` for a probe that ran to its end.
    pub error: Option<String>,
}

/// Sessions remembered by [`ProbeServer::recent_sessions`].
const RECENT_SESSIONS: usize = 64;

/// Longest wait for the client's close after it ended the control stream.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A running probe server; stops when dropped.
#[derive(Debug)]
pub struct ProbeServer {
    local_addr: SocketAddr,
    site: String,
    endpoint: quinn::Endpoint,
    /// Whether stopping closes the endpoint (not a shared one).
    owns_endpoint: bool,
    recent: Arc<Mutex<VecDeque<SessionRecord>>>,
    task: JoinHandle<()>,
}

struct Shared {
    site: String,
    insecure: bool,
    options: ProbeServerOptions,
    recent: Arc<Mutex<VecDeque<SessionRecord>>>,
}

impl ProbeServer {
    /// Binds `addr` (UDP) and serves probes as the agent of `tls.site()`.
    pub async fn bind(
        addr: SocketAddr,
        tls: &AgentTls,
        options: ProbeServerOptions,
    ) -> Result<Self, ProbeError> {
        options.validate()?;
        // Clients open one control stream and up to max_streams sink streams.
        let transport = options.transport.transport_config(options.max_streams, 1)?;
        let config = tls.quinn_server_config(&[wire::ALPN], transport)?;
        let (endpoint, buffers) = crate::udp::quic_endpoint(
            addr,
            Some(config),
            options.transport.socket_buffer_bytes,
            "probe server",
        )
        .map_err(|source| ProbeError::Endpoint { addr, source })?;
        tracing::info!(
            socket_receive_buffer = buffers.receive,
            socket_send_buffer = buffers.send,
            "probe server socket"
        );
        let mut server =
            Self::on_endpoint(endpoint.clone(), Source::Endpoint(endpoint), tls, options)?;
        server.owns_endpoint = true;
        Ok(server)
    }

    /// Serves probes from `source`, on `endpoint` (shared, see
    /// [`crate::data_endpoint`]: this server then leaves the endpoint open
    /// when it stops).
    pub(crate) fn on_endpoint(
        endpoint: quinn::Endpoint,
        source: Source,
        tls: &AgentTls,
        options: ProbeServerOptions,
    ) -> Result<Self, ProbeError> {
        options.validate()?;
        let addr_error = |source| ProbeError::Endpoint {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        };
        let local_addr = endpoint.local_addr().map_err(addr_error)?;
        let recent = Arc::new(Mutex::new(VecDeque::new()));
        let shared = Arc::new(Shared {
            site: tls.site().to_string(),
            insecure: tls.is_insecure(),
            options,
            recent: Arc::clone(&recent),
        });
        tracing::info!(
            %local_addr,
            site = tls.site(),
            insecure = tls.is_insecure(),
            "probe server listening"
        );
        let task = tokio::spawn(accept_loop(source, shared));
        Ok(Self {
            local_addr,
            site: tls.site().to_string(),
            endpoint,
            owns_endpoint: false,
            recent,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The site this server answers for.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// The last sessions (up to 64), oldest first.
    pub fn recent_sessions(&self) -> Vec<SessionRecord> {
        lock(&self.recent).iter().cloned().collect()
    }

    /// Closes every session with [`code::SHUTDOWN`] and waits (at most 2 s)
    /// for the closes to be sent; on an endpoint it shares (left open),
    /// its sessions end with the server's task, their connections dropped
    /// without a code.
    pub async fn shutdown(self) {
        self.task.abort();
        if self.owns_endpoint {
            self.endpoint.close(
                VarInt::from_u32(code::SHUTDOWN),
                b"probe server shutting down",
            );
            let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
        }
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.task.abort();
        if self.owns_endpoint {
            self.endpoint.close(
                VarInt::from_u32(code::SHUTDOWN),
                b"probe server shutting down",
            );
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The data behind these locks stays consistent at every step.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(source: Source, shared: Arc<Shared>) {
    let limit = shared.options.max_connections;
    let serving = Arc::clone(&shared);
    source
        .serve_each(
            limit,
            move |incoming| {
                let shared = Arc::clone(&serving);
                async move { serve(incoming, &shared).await }
            },
            |incoming| {
                tracing::warn!(
                    remote = %incoming.remote_address(),
                    limit,
                    "probe refused: too many probe sessions at once"
                );
                super::metrics::record_session("unknown", "refused_busy");
            },
        )
        .await;
}

/// Why a session ended early.
enum SessionError {
    /// The client broke the protocol; closed with [`code::PROTOCOL`].
    Protocol(String),
    /// The client is not the site it claims; closed with [`code::WRONG_SITE`].
    WrongSite(String),
    /// The connection ended under us.
    Lost(ConnectionError),
}

async fn serve(incoming: Pending, shared: &Shared) {
    let remote = incoming.remote_address();
    let deadline = Instant::now() + shared.options.max_probe_duration;
    let mut record = SessionRecord {
        remote,
        peer_site: None,
        verified: false,
        error: None,
    };
    let outcome = serve_session(incoming, shared, deadline, &mut record).await;
    record.error = outcome.err();
    let label = match (&record.peer_site, record.verified) {
        (Some(site), true) => site.as_str(),
        _ => "unverified",
    };
    match &record.error {
        None => {
            tracing::debug!(%remote, peer_site = ?record.peer_site, verified = record.verified, "probe session done");
            super::metrics::record_session(label, "ok");
        }
        Some(error) => {
            tracing::info!(%remote, peer_site = ?record.peer_site, verified = record.verified, %error, "probe session failed");
            super::metrics::record_session(label, "error");
        }
    }
    let mut recent = lock(&shared.recent);
    if recent.len() == RECENT_SESSIONS {
        recent.pop_front();
    }
    recent.push_back(record);
}

/// Runs one session to its end; the error says why it failed.
async fn serve_session(
    incoming: Pending,
    shared: &Shared,
    deadline: Instant,
    record: &mut SessionRecord,
) -> Result<(), String> {
    let limit = shared.options.max_probe_duration;
    let connecting = incoming
        .accept()
        .map_err(|error| format!("handshake failed: {error}"))?;
    let connection = match tokio::time::timeout_at(deadline, connecting).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => return Err(format!("handshake failed: {error}")),
        Err(_) => return Err(format!("handshake not done within {limit:?}")),
    };
    let result = tokio::time::timeout_at(deadline, run_session(&connection, shared, record)).await;
    let (close_code, message) = match result {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(SessionError::Lost(error))) => return Err(format!("connection lost: {error}")),
        Ok(Err(SessionError::Protocol(message))) => (code::PROTOCOL, message),
        Ok(Err(SessionError::WrongSite(message))) => (code::WRONG_SITE, message),
        Err(_) => (
            code::LIMIT,
            format!("the probe took longer than this server's limit of {limit:?}"),
        ),
    };
    connection.close(VarInt::from_u32(close_code), message.as_bytes());
    Err(message)
}

async fn run_session(
    connection: &Connection,
    shared: &Shared,
    record: &mut SessionRecord,
) -> Result<(), SessionError> {
    let (mut send, mut recv) = connection.accept_bi().await.map_err(SessionError::Lost)?;
    let site = match wire::read_frame(&mut recv, wire::MAX_CLIENT_FRAME).await {
        Ok(Some(Frame::Hello { site })) => site,
        Ok(Some(other)) => {
            return Err(SessionError::Protocol(format!(
                "expected Hello first, got {}",
                other.name()
            )));
        }
        Ok(None) => {
            return Err(SessionError::Protocol(
                "the control stream ended before Hello".to_string(),
            ));
        }
        Err(error) => return Err(read_error(error)),
    };
    record.peer_site = Some(site.clone());
    record.verified = check_site(connection, shared, &site)?;

    let welcome = Frame::Welcome {
        site: shared.site.clone(),
        limits: shared.options.limits(),
    };
    wire::write_frame(&mut send, &welcome)
        .await
        .map_err(write_error)?;

    let loss = Arc::new(Mutex::new(LossState::default()));
    let sink = Arc::new(Mutex::new(SinkState::default()));
    // Dropping the set at the end of the session aborts the helpers.
    let mut helpers = JoinSet::new();
    helpers.spawn(serve_datagrams(
        connection.clone(),
        Arc::clone(&loss),
        shared.options.max_loss_datagrams,
    ));
    helpers.spawn(accept_sinks(
        connection.clone(),
        Arc::clone(&sink),
        shared.options.max_bytes,
    ));

    loop {
        let frame = match wire::read_frame(&mut recv, wire::MAX_CLIENT_FRAME).await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                // The client is done; give its close a moment to arrive.
                let _ = send.finish();
                let _ = tokio::time::timeout(CLOSE_GRACE, connection.closed()).await;
                return Ok(());
            }
            Err(ReadFrameError::Read(quinn::ReadError::ConnectionLost(
                ConnectionError::ApplicationClosed(close),
            ))) if close.error_code == VarInt::from_u32(code::DONE) => return Ok(()),
            Err(error) => return Err(read_error(error)),
        };
        let answer = match frame {
            Frame::LossDone { sent } => {
                if sent > shared.options.max_loss_datagrams {
                    return Err(SessionError::Protocol(format!(
                        "LossDone for {sent} datagrams, more than the limit of {}",
                        shared.options.max_loss_datagrams
                    )));
                }
                // Let datagrams that arrived with the frame be counted.
                tokio::time::sleep(Duration::from_millis(10)).await;
                lock(&loss).report(sent)
            }
            Frame::ThroughputDone => lock(&sink).report(),
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected {} frame from a client",
                    other.name()
                )));
            }
        };
        wire::write_frame(&mut send, &answer)
            .await
            .map_err(write_error)?;
    }
}

/// Checks that the client's certificate names `site`; returns whether it
/// was checked (not in insecure local mode).
fn check_site(connection: &Connection, shared: &Shared, site: &str) -> Result<bool, SessionError> {
    tls::site_name(site).map_err(|error| SessionError::WrongSite(error.to_string()))?;
    if shared.insecure {
        return Ok(false);
    }
    tls::check_peer_site(connection, site).map_err(|error| {
        tracing::warn!(remote = %connection.remote_address(), claimed_site = site, %error, "probe client refused");
        SessionError::WrongSite(error)
    })?;
    Ok(true)
}

fn read_error(error: ReadFrameError) -> SessionError {
    match error {
        ReadFrameError::Read(quinn::ReadError::ConnectionLost(error)) => SessionError::Lost(error),
        other => SessionError::Protocol(format!("bad control frame: {other}")),
    }
}

fn write_error(error: quinn::WriteError) -> SessionError {
    match error {
        quinn::WriteError::ConnectionLost(error) => SessionError::Lost(error),
        other => SessionError::Protocol(format!("the control stream failed: {other}")),
    }
}

/// Which loss datagrams arrived, as a bitmap (allocated on the first one).
#[derive(Debug, Default)]
struct LossState {
    arrived: Vec<u8>,
}

impl LossState {
    fn record(&mut self, sequence: u32, max: u32) {
        if sequence >= max {
            return;
        }
        if self.arrived.is_empty() {
            self.arrived = vec![0; wire::bitmap_len(max)];
        }
        let index = sequence as usize;
        if let Some(byte) = self.arrived.get_mut(index / 8) {
            *byte |= 1 << (index % 8);
        }
    }

    /// The report for datagrams `0..sent`; the test starts over.
    fn report(&mut self, sent: u32) -> Frame {
        let len = wire::bitmap_len(sent);
        let mut arrived = vec![0u8; len];
        let available = len.min(self.arrived.len());
        arrived[..available].copy_from_slice(&self.arrived[..available]);
        let tail_bits = sent % 8;
        if tail_bits != 0
            && let Some(last) = arrived.last_mut()
        {
            *last &= (1u8 << tail_bits) - 1;
        }
        let received = arrived.iter().map(|b| b.count_ones()).sum();
        self.arrived.clear();
        Frame::LossReport {
            sent,
            received,
            arrived,
        }
    }
}

/// Echoes pings and records loss datagrams until the connection ends.
async fn serve_datagrams(connection: Connection, loss: Arc<Mutex<LossState>>, max: u32) {
    let mut ignored: u64 = 0;
    while let Ok(datagram) = connection.read_datagram().await {
        match Datagram::decode(&datagram) {
            Ok(Datagram::Ping { sequence, sent_ns }) => {
                let pong = Datagram::Pong { sequence, sent_ns }.encode(&[]);
                // Unreliable like the ping: if the buffer is full it is dropped.
                let _ = connection.send_datagram(Bytes::from(pong));
            }
            Ok(Datagram::Loss { sequence }) => lock(&loss).record(sequence, max),
            Ok(Datagram::Pong { .. }) | Err(_) => {
                ignored += 1;
                if ignored == 1 {
                    tracing::debug!(remote = %connection.remote_address(), "ignoring unexpected datagrams");
                }
            }
        }
    }
}

/// Sink bytes received in one session.
#[derive(Debug, Default)]
struct SinkState {
    bytes: u64,
    streams: u32,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl SinkState {
    /// Counts `len` bytes received now; returns the session's total.
    fn add(&mut self, len: usize, now: Instant) -> u64 {
        self.bytes = self.bytes.saturating_add(len as u64);
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.bytes
    }

    /// The report so far; the test starts over.
    fn report(&mut self) -> Frame {
        let span = match (self.first, self.last) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        let report = Frame::ThroughputReport {
            bytes: self.bytes,
            streams: self.streams,
            span_ns: span.as_nanos().try_into().unwrap_or(u64::MAX),
        };
        *self = Self::default();
        report
    }
}

async fn accept_sinks(connection: Connection, sink: Arc<Mutex<SinkState>>, max_bytes: u64) {
    let mut streams = JoinSet::new();
    loop {
        tokio::select! {
            accepted = connection.accept_uni() => match accepted {
                Ok(recv) => {
                    streams.spawn(read_sink(recv, Arc::clone(&sink), max_bytes));
                }
                Err(_) => break,
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    }
}

/// Counts one sink stream's bytes until it ends, is reset, or the session's
/// byte budget is spent (then the stream is stopped with [`code::LIMIT`]).
async fn read_sink(mut recv: RecvStream, sink: Arc<Mutex<SinkState>>, max_bytes: u64) {
    let mut tag = [0u8; 1];
    match recv.read_exact(&mut tag).await {
        Ok(()) if tag[0] == wire::SINK_STREAM_TAG => lock(&sink).streams += 1,
        Ok(()) => {
            tracing::debug!(tag = tag[0], "stopping a stream that is not a sink stream");
            let _ = recv.stop(VarInt::from_u32(code::PROTOCOL));
            return;
        }
        Err(_) => return,
    }
    loop {
        match recv.read_chunk(usize::MAX, false).await {
            Ok(Some(chunk)) => {
                let total = lock(&sink).add(chunk.bytes.len(), Instant::now());
                if total >= max_bytes {
                    let _ = recv.stop(VarInt::from_u32(code::LIMIT));
                    return;
                }
            }
            // Finished, reset by the client at the end of the test, or the
            // connection ended: the bytes so far are counted either way.
            Ok(None) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_reports_mask_unsent_bits_and_start_over() {
        let mut state = LossState::default();
        for sequence in [0, 2, 9, 10, 500] {
            state.record(sequence, 100);
        }
        let Frame::LossReport {
            sent,
            received,
            arrived,
        } = state.report(10)
        else {
            panic!("not a loss report");
        };
        assert_eq!((sent, received), (10, 3));
        assert_eq!(arrived, vec![0b0000_0101, 0b0000_0010]);
        assert_eq!(
            state.report(10),
            Frame::LossReport {
                sent: 10,
                received: 0,
                arrived: vec![0, 0]
            }
        );
    }

    #[test]
    fn sink_reports_span_from_first_to_last_byte() {
        let mut state = SinkState::default();
        let start = Instant::now();
        state.add(100, start);
        assert_eq!(state.add(50, start + Duration::from_millis(20)), 150);
        assert_eq!(
            state.report(),
            Frame::ThroughputReport {
                bytes: 150,
                streams: 0,
                span_ns: 20_000_000
            }
        );
    }
}
