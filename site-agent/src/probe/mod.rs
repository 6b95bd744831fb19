//! Link probes: the agent measures round-trip time, loss and achievable
//! throughput to other sites' agents over QUIC, authenticated both ways.
//!
//! - [`ProbeServer`] answers probes from other sites' agents.
//! - [`probe`] measures one peer: RTT from echoed datagrams, loss from
//!   numbered datagrams the server reports back, throughput from parallel
//!   streams the server counts (the protocol is in [`wire`]).
//! - [`ProbeScheduler`] probes a set of peers every interval and on demand,
//!   keeps the latest report per peer, sends every report on a channel (for
//!   the agent to pass to the coordinator) and records [`metrics`].
//! - [`QuicTuning`] sizes QUIC's windows for long fat links.
//!
//! Every random choice (ping send-time jitter, payload bytes) comes from
//! [`ProbeOptions::seed`]; the scheduler derives one seed per probe from its
//! own and reports it.

mod client;
pub mod metrics;
mod scheduler;
mod server;
mod transport;
pub mod wire;

use std::net::SocketAddr;
use std::time::Duration;

pub use client::probe;
pub use scheduler::{
    ProbeFailure, ProbePeer, ProbeReport, ProbeScheduler, SchedulerOptions, probe_seed,
};
pub use server::{ProbeServer, ProbeServerOptions, SessionRecord};
pub use transport::{DEFAULT_SOCKET_BUFFER_BYTES, QuicController, QuicTuning, SOCKET_BUFFER_RANGE};

use crate::tls::TlsError;

/// How one probe runs. The defaults take about 1.7 s on an idle link and
/// are sized to be cheap enough to run every minute.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOptions {
    /// Echoed datagrams for the RTT figures. Default 20; at least 1.
    pub pings: u32,
    /// Time between pings (each moved by up to ±10% at random). Default 10 ms.
    pub ping_interval: Duration,
    /// Datagrams of the loss test; 0 skips it. Default 500.
    pub loss_datagrams: u32,
    /// Rate the loss datagrams are sent at. Default 1000 per second.
    pub loss_rate_pps: u32,
    /// How long the throughput test writes; zero skips it. Default 1 s.
    pub throughput_duration: Duration,
    /// Parallel streams of the throughput test. Default 8.
    pub throughput_streams: u32,
    /// Bound on the whole probe, handshake included. Default 10 s; must
    /// exceed the probe's own schedule (pings, loss and throughput times).
    pub timeout: Duration,
    /// Seed of the ping jitter and payload bytes. Default 0.
    pub seed: u64,
    pub transport: QuicTuning,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            pings: 20,
            ping_interval: Duration::from_millis(10),
            loss_datagrams: 500,
            loss_rate_pps: 1000,
            throughput_duration: Duration::from_secs(1),
            throughput_streams: 8,
            timeout: Duration::from_secs(10),
            seed: 0,
            transport: QuicTuning::default(),
        }
    }
}

/// Upper bounds that keep a typo from becoming a day-long probe.
const MAX_PINGS: u32 = 100_000;
const MAX_LOSS_DATAGRAMS: u32 = 10_000_000;
const MAX_STREAMS: u32 = 1024;
const MAX_PROBE_TIME: Duration = Duration::from_secs(3600);

impl ProbeOptions {
    /// Time the probe spends by its own schedule, without waiting for
    /// answers: pings, loss datagrams and the throughput test.
    pub fn schedule(&self) -> Duration {
        let loss = if self.loss_datagrams == 0 || self.loss_rate_pps == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(f64::from(self.loss_datagrams) / f64::from(self.loss_rate_pps))
        };
        self.ping_interval
            .saturating_mul(self.pings)
            .saturating_add(loss)
            .saturating_add(self.throughput_duration)
    }

    /// Checks the options; errors name the field.
    pub fn validate(&self) -> Result<(), ProbeError> {
        let invalid = |field: &'static str, message: String| {
            Err(ProbeError::InvalidOptions { field, message })
        };
        if !(1..=MAX_PINGS).contains(&self.pings) {
            return invalid(
                "pings",
                format!("is {}; it must be between 1 and {MAX_PINGS}", self.pings),
            );
        }
        if self.ping_interval < Duration::from_millis(1)
            || self.ping_interval > Duration::from_secs(10)
        {
            return invalid(
                "ping_interval",
                format!(
                    "is {:?}; it must be between 1 ms and 10 s",
                    self.ping_interval
                ),
            );
        }
        if self.loss_datagrams > MAX_LOSS_DATAGRAMS {
            return invalid(
                "loss_datagrams",
                format!(
                    "is {}; it must be at most {MAX_LOSS_DATAGRAMS}",
                    self.loss_datagrams
                ),
            );
        }
        if self.loss_datagrams > 0 && !(1..=1_000_000).contains(&self.loss_rate_pps) {
            return invalid(
                "loss_rate_pps",
                format!(
                    "is {}; it must be between 1 and 1000000 datagrams per second",
                    self.loss_rate_pps
                ),
            );
        }
        if !self.throughput_duration.is_zero()
            && !(1..=MAX_STREAMS).contains(&self.throughput_streams)
        {
            return invalid(
                "throughput_streams",
                format!(
                    "is {}; it must be between 1 and {MAX_STREAMS}",
                    self.throughput_streams
                ),
            );
        }
        if self.timeout.is_zero() || self.timeout > MAX_PROBE_TIME {
            return invalid(
                "timeout",
                format!("is {:?}; it must be positive and at most 1 h", self.timeout),
            );
        }
        let schedule = self.schedule();
        if self.timeout <= schedule {
            return invalid(
                "timeout",
                format!(
                    "is {:?}, not longer than the probe's own schedule of {schedule:?} \
                     (pings × ping_interval + loss_datagrams / loss_rate_pps + throughput_duration)",
                    self.timeout
                ),
            );
        }
        self.transport.validate()
    }
}

/// What one probe measured.
///
/// RTT figures come from echoed datagrams (nearest-rank percentiles of
/// `samples` round trips). Loss is the share of the loss test's datagrams
/// (`sent`) that did not reach the server; QUIC's congestion control may
/// pace them below `loss_rate_pps` on a lossy link, which lengthens the test
/// but does not change the count, and they are never dropped inside the
/// sender. `sent == 0` means the loss test was skipped. Throughput is what
/// the server received on the parallel streams (`bytes`) over the time from
/// its first to its last byte (`duration_ns`); 0 when skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeResult {
    pub rtt_min_ns: u64,
    pub rtt_p50_ns: u64,
    pub rtt_p99_ns: u64,
    /// Pings echoed (of `ProbeOptions::pings`).
    pub samples: u32,
    pub loss_rate: f64,
    pub sent: u32,
    pub received: u32,
    /// Bits per second of stream payload.
    pub throughput_bps: f64,
    pub bytes: u64,
    pub duration_ns: u64,
}

/// The step of a probe an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Handshake,
    Hello,
    Rtt,
    Loss,
    Throughput,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Handshake => "the handshake",
            Self::Hello => "the hello exchange",
            Self::Rtt => "the RTT test",
            Self::Loss => "the loss test",
            Self::Throughput => "the throughput test",
        })
    }
}

/// Why a probe, or a probe server, failed. Messages name the peer site and
/// address, the step and the cause.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("probe option `{field}` {message}")]
    InvalidOptions {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot open a QUIC endpoint on {addr}: {source}")]
    Endpoint {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot dial site {peer_site:?} at {peer}: {source}")]
    Connect {
        peer: SocketAddr,
        peer_site: String,
        #[source]
        source: quinn::ConnectError,
    },
    #[error(
        "TLS handshake with site {peer_site:?} at {peer} failed (a certificate naming {expected_name} was expected): {reason}"
    )]
    Handshake {
        peer: SocketAddr,
        peer_site: String,
        expected_name: String,
        reason: String,
    },
    #[error("site {peer_site:?} at {peer} refused the probe: {reason}")]
    Refused {
        peer: SocketAddr,
        peer_site: String,
        reason: String,
    },
    #[error("probe of site {peer_site:?} at {peer} lost its connection during {phase}: {source}")]
    Connection {
        peer: SocketAddr,
        peer_site: String,
        phase: Phase,
        #[source]
        source: quinn::ConnectionError,
    },
    #[error("site {peer_site:?} at {peer} broke the probe protocol during {phase}: {message}")]
    Protocol {
        peer: SocketAddr,
        peer_site: String,
        phase: Phase,
        message: String,
    },
    #[error("probe of site {peer_site:?} at {peer} timed out during {phase} (timeout {timeout:?})")]
    Timeout {
        peer: SocketAddr,
        peer_site: String,
        phase: Phase,
        timeout: Duration,
    },
    #[error("site {peer_site:?} at {peer} echoed none of {pings} pings")]
    NoEcho {
        peer: SocketAddr,
        peer_site: String,
        pings: u32,
    },
    #[error(
        "probe of site {peer_site:?}: {what} is {requested}, more than its probe server allows ({limit})"
    )]
    PeerLimit {
        peer_site: String,
        /// The option, or "the schedule" (milliseconds of pings, loss and
        /// throughput tests, against the server's longest session).
        what: &'static str,
        requested: u64,
        limit: u64,
    },
    #[error("{0}")]
    Scheduler(String),
}

impl ProbeError {
    /// A short label for the `outcome` of `longhaul_agent_probes_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::InvalidOptions { .. } | Self::PeerLimit { .. } => "invalid_options",
            Self::Tls(_) => "tls_config",
            Self::Endpoint { .. } | Self::Connect { .. } | Self::Scheduler(_) => "error",
            Self::Handshake { .. } => "handshake_failed",
            Self::Refused { .. } => "refused",
            Self::Connection { .. } => "connection_lost",
            Self::Protocol { .. } => "protocol_error",
            Self::Timeout { .. } => "timeout",
            Self::NoEcho { .. } => "no_echo",
        }
    }
}

/// Nearest-rank percentile `q` (0..=1) of sorted values.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_fit_their_timeout() {
        let options = ProbeOptions::default();
        options.validate().unwrap();
        assert_eq!(options.schedule(), Duration::from_millis(1700));
    }

    #[test]
    fn bad_options_name_the_field() {
        let check = |options: ProbeOptions, field: &str| {
            let error = options.validate().unwrap_err().to_string();
            assert!(error.contains(&format!("`{field}`")), "{error}");
        };
        check(
            ProbeOptions {
                pings: 0,
                ..Default::default()
            },
            "pings",
        );
        check(
            ProbeOptions {
                loss_rate_pps: 0,
                ..Default::default()
            },
            "loss_rate_pps",
        );
        check(
            ProbeOptions {
                throughput_streams: 0,
                ..Default::default()
            },
            "throughput_streams",
        );
        check(
            ProbeOptions {
                timeout: Duration::from_secs(1),
                ..Default::default()
            },
            "timeout",
        );
        // Skipped tests need no rate or streams.
        ProbeOptions {
            loss_datagrams: 0,
            loss_rate_pps: 0,
            throughput_duration: Duration::ZERO,
            throughput_streams: 0,
            ..Default::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.5), 50);
        assert_eq!(percentile(&values, 0.99), 99);
        assert_eq!(percentile(&values, 0.0), 1);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
