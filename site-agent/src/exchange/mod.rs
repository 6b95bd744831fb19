//! The data plane between agents: pseudo-gradient fragments exchanged over
//! QUIC (mTLS with the agents' site certificates), by the collective of
//! `longhaul_exchange` (its plan, state machines, wire messages and
//! acknowledged ranges; this module only moves their bytes).
//!
//! - [`ExchangeNode`] — one QUIC endpoint per agent (server and client on
//!   one UDP socket from [`crate::udp::quic_endpoint`]): it answers peers'
//!   connections and runs [`ExchangeNode::exchange`], one fragment of one
//!   round, to completion, to its deadline, or until a peer is found dead.
//! - A **pool** of [`ExchangeOptions::connections_per_peer`] connections to
//!   each peer, each with its own congestion controller (several are what
//!   beat random loss on a long link: streams of one connection share one
//!   controller), each carrying one bidirectional stream: hello, the
//!   receiver's replayed acks and welcome, then data one way and acks the
//!   other. Chunks are handed to whichever connection is free
//!   ([`longhaul_exchange::Outbox`]), spread: one with chunks in flight
//!   takes another only when every live connection has some, and within
//!   its cap: what its own congestion window carries in three round
//!   trips, at least two chunks, at most its share of
//!   [`ExchangeOptions::pool_in_flight_bytes`]. Without the spreading, the
//!   first connection whose send buffer had room took every chunk of a
//!   fragment and the rest of the pool idled; without the window, most of
//!   a small fragment was queued on each connection at once and the
//!   fragment waited for the slowest.
//!   The connections stay open after a
//!   fragment (keep-alives hold them) and carry the next fragment's
//!   streams, so a congestion window grown on one fragment serves the
//!   next rather than starting again from slow start.
//! - **Resumption**: a receiver records what it holds
//!   ([`longhaul_exchange::AckLedger`]) and replays those acks to a sender
//!   that connects again, before welcoming it; the sender sends nothing
//!   the receiver holds. A welcome names the receiver's incarnation: a
//!   restarted receiver holds nothing, so acks of its previous incarnation
//!   are forgotten and those chunks sent again.
//! - **Refusal**: a message that does not decode, or a certificate that
//!   does not name the site the hello claims, closes its connection (a
//!   peer that frames wrongly cannot be trusted on its other streams); a
//!   hello for a fragment or plan this node is not exchanging, or a
//!   message out of place, ends only its stream, with a refusal naming the
//!   reason, so the pooled connection keeps carrying the peer's other
//!   fragments; a decoded chunk that the plan or the codec refuses is
//!   answered with a refusal naming the reason, counted, and never reaches
//!   a sum.
//! - **Deadlines**: every handshake, hello and welcome has
//!   [`ExchangeOptions::handshake_timeout`]; a connection with no packet
//!   for [`ExchangeOptions::idle_timeout`] is dropped; a peer with no
//!   working connection for [`ExchangeOptions::peer_timeout`] is reported
//!   dead ([`ExchangeOutcome::dead`]), so the round can exclude it and
//!   plan again; and the whole exchange has its deadline.
//!
//! **Sizing** from the link (rate R bits/s, round trip RTT): BDP = R/8 ×
//! RTT bytes; every connection's receive windows (connection and stream)
//! and send window are 2 × BDP (DATA-PATH: one connection must be able to
//! carry the link alone while its peers back off; windows are limits, not
//! allocations), at least 64 KiB; the UDP socket buffers are max(BDP,
//! 32 MiB, the agent's default) within [`crate::probe::SOCKET_BUFFER_RANGE`]
//! (the kernel caps them at `rmem_max` without `CAP_NET_ADMIN`): one
//! socket takes every connection of the pool, and on a loaded host a
//! reader late by tens of milliseconds must lose nothing (4 MiB halved the
//! pool's goodput in `examples/exchange_bulk.rs`); a new connection
//! assumes the link's RTT. **Congestion control** ([`Congestion`]): quinn's
//! Cubic by default; on a link the job owns, [`crate::congestion`]'s
//! dedicated-link controller holds each connection's share of 1.25 × BDP
//! through random loss (`examples/exchange_bulk.rs --congestion
//! dedicated`). **Pacing** ([`ExchangeOptions::pacing_bytes_per_second`]):
//! for a dedicated link, the sender spaces its writes to each peer at the
//! planner's rate, across the pool.
//!
//! Per-peer Prometheus metrics (bytes, refusals, connections, goodput):
//! [`metrics`].
//!
//! The hook into the running agent (not wired yet): the round watcher,
//! on an `OpenRound` naming this site, builds the plan from the round's
//! participants and exclusions, [`longhaul_exchange::LinkCodecs::from_round`]
//! from its `links`, and calls [`ExchangeNode::exchange`] per fragment with
//! the trainer's pseudo-gradient; it reports `ReportContributed` once its
//! chunks are acknowledged, `ReportApplied` with the hash, and asks for the
//! exclusion of the sites the outcome names unfinished.

mod io;
pub mod metrics;
mod node;
mod outcome;
mod sender;
mod state;

use std::collections::BTreeMap;
use std::time::Duration;

pub(crate) use node::MAX_FRAGMENTS_AT_ONCE;
pub use node::{ExchangeNode, FragmentRequest};

use crate::probe::{DEFAULT_SOCKET_BUFFER_BYTES, QuicController, QuicTuning, SOCKET_BUFFER_RANGE};

/// Application error codes for closing exchange connections and stopping
/// their streams.
pub mod code {
    /// The exchange is over.
    pub const DONE: u32 = 0;
    /// A message that does not decode, or one out of place.
    pub const PROTOCOL: u32 = 1;
    /// The client's certificate does not name the site it claims.
    pub const WRONG_SITE: u32 = 2;
    /// The hello names a fragment this node is not exchanging, or another
    /// plan.
    pub const UNKNOWN: u32 = 3;
}

/// How an exchange runs. The defaults suit the benchmark link
/// (1 Gbit/s, 50 ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeOptions {
    /// Connections per peer, 1..=64. Default 4.
    pub connections_per_peer: u32,
    /// The link's rate in bits per second, for the windows. Default 1 Gbit/s.
    pub link_rate_bits_per_second: u64,
    /// The link's round trip. Default 50 ms.
    pub link_rtt: Duration,
    /// Bytes per second to each peer at most (a dedicated link's planned
    /// rate); `None` leaves the rate to congestion control. Default `None`.
    pub pacing_bytes_per_second: Option<u64>,
    /// Bound on a handshake, and on the hello and welcome. Default 5 s.
    pub handshake_timeout: Duration,
    /// A connection silent this long is dropped. Default 10 s.
    pub idle_timeout: Duration,
    /// Keep-alive interval on a connection. Default 1 s.
    pub keep_alive_interval: Duration,
    /// A peer with no working connection this long is reported dead.
    /// Default 15 s.
    pub peer_timeout: Duration,
    /// First wait before reconnecting, doubled up to 2 s. Default 100 ms.
    pub reconnect_backoff: Duration,
    /// This node's incarnation, sent in every welcome; `None` takes the
    /// clock's nanoseconds at bind.
    pub incarnation: Option<u64>,
    /// The connections' congestion controller. Default Cubic.
    pub congestion: Congestion,
}

/// Which congestion controller the pool's connections run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Congestion {
    /// quinn's Cubic: backs off on every loss; right on a shared path.
    #[default]
    Cubic,
    /// For a link the job owns ([`crate::congestion`]): each connection
    /// holds its share of 1.25 × BDP through random loss.
    Dedicated,
    /// quinn's NewReno: halves its window on every loss and grows it by
    /// one packet a round trip, slower than Cubic on a long link. For
    /// evaluation (README, the `exchange_bulk` section).
    NewReno,
    /// quinn's BBR, which quinn marks experimental: paces at the rate it
    /// measures and does not back off on a random loss. It takes nearly
    /// all of a link from a competing Cubic flow: only for links the job
    /// has to itself (README, the `exchange_bulk` section).
    Bbr,
}

impl Default for ExchangeOptions {
    fn default() -> Self {
        Self {
            connections_per_peer: 4,
            link_rate_bits_per_second: 1_000_000_000,
            link_rtt: Duration::from_millis(50),
            pacing_bytes_per_second: None,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
            keep_alive_interval: Duration::from_secs(1),
            peer_timeout: Duration::from_secs(15),
            reconnect_backoff: Duration::from_millis(100),
            incarnation: None,
            congestion: Congestion::Cubic,
        }
    }
}

/// Most connections per peer.
pub const MAX_CONNECTIONS_PER_PEER: u32 = 64;

impl ExchangeOptions {
    /// The bandwidth-delay product of the link, bytes.
    pub fn bdp_bytes(&self) -> u64 {
        let bytes = self.link_rate_bits_per_second as f64 / 8.0 * self.link_rtt.as_secs_f64();
        bytes.min(u64::MAX as f64) as u64
    }

    /// Bytes the pool to one peer may have in flight (chunks handed to
    /// its connections and not yet acknowledged), shared by its live
    /// connections: four BDPs, so that a connection whose stream waits
    /// out a loss's recovery (every later chunk on it held until the
    /// retransmission arrives) or a path longer than `link_rtt` still
    /// leaves the pool enough to fill the link. Each connection's share is
    /// the most it is given; its own congestion window sets what it is
    /// given below that (`sender::connection_cap`).
    pub fn pool_in_flight_bytes(&self) -> u64 {
        self.bdp_bytes().saturating_mul(4).max(1)
    }

    /// The QUIC settings of every connection (see the module docs).
    pub fn tuning(&self) -> QuicTuning {
        let bdp = self.bdp_bytes();
        let socket = (bdp.max(DEFAULT_SOCKET_BUFFER_BYTES as u64) as usize)
            .clamp(*SOCKET_BUFFER_RANGE.start(), *SOCKET_BUFFER_RANGE.end());
        QuicTuning {
            target_bdp_bytes: bdp.saturating_mul(2).clamp(64 << 10, 4 << 30),
            keep_alive_interval: self.keep_alive_interval,
            idle_timeout: self.idle_timeout,
            socket_buffer_bytes: socket,
            initial_rtt: Some(self.link_rtt),
            controller: match self.congestion {
                Congestion::Cubic => QuicController::Cubic,
                Congestion::NewReno => QuicController::NewReno,
                Congestion::Bbr => QuicController::Bbr,
                Congestion::Dedicated => QuicController::Dedicated {
                    window: (bdp.saturating_mul(5) / 4)
                        .div_ceil(u64::from(self.connections_per_peer.max(1))),
                },
            },
            ..QuicTuning::default()
        }
    }

    /// Checks the options; errors name the field.
    pub fn validate(&self) -> Result<(), ExchangeError> {
        let invalid = |field: &'static str, message: String| {
            Err(ExchangeError::InvalidOptions { field, message })
        };
        if !(1..=MAX_CONNECTIONS_PER_PEER).contains(&self.connections_per_peer) {
            return invalid(
                "connections_per_peer",
                format!(
                    "is {}; it must be between 1 and {MAX_CONNECTIONS_PER_PEER}",
                    self.connections_per_peer
                ),
            );
        }
        if self.link_rate_bits_per_second < 1_000_000 {
            return invalid(
                "link_rate_bits_per_second",
                format!("is {}; at least 1 Mbit/s", self.link_rate_bits_per_second),
            );
        }
        if self.pacing_bytes_per_second.is_some_and(|rate| rate < 1024) {
            return invalid(
                "pacing_bytes_per_second",
                "must be at least 1024 when set".to_string(),
            );
        }
        for (field, value) in [
            ("handshake_timeout", self.handshake_timeout),
            ("peer_timeout", self.peer_timeout),
            ("reconnect_backoff", self.reconnect_backoff),
        ] {
            if value.is_zero() || value > Duration::from_secs(3600) {
                return invalid(field, format!("is {value:?}; between 0 and 1 h"));
            }
        }
        self.tuning()
            .validate()
            .map_err(|error| ExchangeError::InvalidOptions {
                field: "transport",
                message: error.to_string(),
            })
    }
}

/// What one peer's part of an exchange came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerReport {
    /// Data messages and bytes this node sent the peer, and bytes it sent
    /// again after a connection was lost.
    pub sent_messages: u64,
    pub sent_bytes: u64,
    pub resent_bytes: u64,
    /// The most bytes one connection of the pool had in flight to the
    /// peer at once, and how many connections carried chunks to it.
    pub peak_connection_in_flight_bytes: u64,
    pub connections_used: u64,
    /// Data bytes received from the peer and taken, and bytes of chunks
    /// received again that this node already held (acknowledged again,
    /// changing nothing).
    pub received_bytes: u64,
    pub duplicate_bytes: u64,
    /// Messages from the peer refused (by the plan or the codec), and
    /// refusals the peer sent back.
    pub refused: u64,
    pub refusals_received: u64,
    /// Streams welcomed by the peer (a connection of the pool, new or kept
    /// from an earlier fragment), and those lost before the end.
    pub connections: u64,
    pub connections_lost: u64,
    /// New connections made to the peer (the rest were the pool's, kept
    /// from an earlier fragment).
    pub handshakes: u64,
    /// Whether the peer acknowledged every chunk sent to it and sent every
    /// chunk this node needed from it.
    pub finished: bool,
    /// The last failure seen, if any.
    pub last_error: Option<String>,
}

/// The result of one fragment's exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeOutcome {
    /// The reduced fragment and its hash, when every chunk arrived and the
    /// exchange ended without a failure (`reason` is `None`).
    pub result: Option<Vec<f32>>,
    pub hash: Option<String>,
    /// Per peer.
    pub peers: BTreeMap<String, PeerReport>,
    /// The peers that did not finish (some only because of another).
    pub unfinished: Vec<String>,
    /// Of those, the ones with no working connection when the exchange
    /// ended: the sites the round should exclude before it plans the
    /// fragment again.
    pub dead: Vec<String>,
    /// Why the exchange ended without a result (a dead peer, the deadline).
    pub reason: Option<String>,
    pub elapsed: Duration,
    /// When the exchange passed its milestones, from its start.
    pub phases: Phases,
}

/// When a fragment's exchange passed its milestones at this node, from the
/// start of the attempt (zero for one passed in an earlier attempt, whose
/// re-encoding then counts toward the next milestone; `None` for one not
/// reached by the attempt's end): what its time is made of. A site whose
/// shard is empty (fewer elements than live sites) has it reduced when
/// encoded, before any data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Its contributions encoded and queued for the peers (the codec's
    /// time, before the first byte can leave).
    pub encoded: Option<Duration>,
    /// The first data message from a peer taken.
    pub first_data: Option<Duration>,
    /// This node's shard reduced from every live site's contribution.
    pub reduced: Option<Duration>,
    /// Every shard's average held: the result (the last acks follow).
    pub assembled: Option<Duration>,
}

/// Why an exchange could not run. Errors of peers are not here: they end
/// in [`ExchangeOutcome::unfinished`].
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("exchange options: {field}: {message}")]
    InvalidOptions {
        field: &'static str,
        message: String,
    },
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot bind the exchange endpoint on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("site {site:?} is not a live site of the fragment's plan")]
    NotLive { site: String },
    #[error("peer {site:?}: no address given")]
    NoAddress { site: String },
    #[error("job {job:?} round {round} fragment {fragment}: already being exchanged on this node")]
    Busy {
        job: String,
        round: u64,
        fragment: u32,
    },
    #[error("{0}")]
    Collective(#[from] longhaul_exchange::CollectiveError),
    #[error("the average of a reduced chunk cannot be sent: {reason}")]
    Average { reason: String },
    #[error("{0}")]
    Message(#[from] longhaul_exchange::wire::EncodeMessageError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_buffers_follow_the_link_and_bad_options_name_the_field() {
        let options = ExchangeOptions::default();
        // 1 Gbit/s × 50 ms.
        assert_eq!(options.bdp_bytes(), 6_250_000);
        let tuning = options.tuning();
        assert_eq!(tuning.target_bdp_bytes, 12_500_000);
        assert_eq!(tuning.socket_buffer_bytes, DEFAULT_SOCKET_BUFFER_BYTES);
        assert_eq!(tuning.initial_rtt, Some(Duration::from_millis(50)));
        options.validate().unwrap();
        // 10 Gbit/s × 100 ms: the socket buffer is one BDP.
        let long = ExchangeOptions {
            link_rate_bits_per_second: 10_000_000_000,
            link_rtt: Duration::from_millis(100),
            ..ExchangeOptions::default()
        };
        assert_eq!(long.tuning().socket_buffer_bytes, 125_000_000);
        for (options, field) in [
            (
                ExchangeOptions {
                    connections_per_peer: 0,
                    ..ExchangeOptions::default()
                },
                "connections_per_peer",
            ),
            (
                ExchangeOptions {
                    pacing_bytes_per_second: Some(1),
                    ..ExchangeOptions::default()
                },
                "pacing_bytes_per_second",
            ),
            (
                ExchangeOptions {
                    link_rtt: Duration::from_secs(60),
                    ..ExchangeOptions::default()
                },
                "initial_rtt",
            ),
            (
                ExchangeOptions {
                    peer_timeout: Duration::ZERO,
                    ..ExchangeOptions::default()
                },
                "peer_timeout",
            ),
        ] {
            let error = options.validate().unwrap_err().to_string();
            assert!(error.contains(field), "{error} should name {field}");
        }
    }
}
