//! The simulator's discrete-event tier: flows over the sans-IO link model in
//! virtual time.
//!
//! Pure and seeded: no clock, no I/O, no global RNG. Every random decision is
//! the links' own ([`Link`](crate::link::Link), seeded from the run's seed),
//! so the same configuration and seed give the same report, bit for bit.
//! Every run is bounded by [`Limits`] (virtual time and events) and says
//! which bound stopped it.
//!
//! # The model
//!
//! A run is a set of [`Link`](crate::link::Link) directions and connections
//! over them. The event loop jumps to the earliest of the links'
//! `next_wakeup` and the connections' timers (retransmission timeout,
//! pacing), hands every packet due at that instant to its connection, and
//! lets the connection send. Each connection moves its share of a flow's
//! bytes as segments of `mss_bytes` payload plus `header_bytes`; the
//! receiver ACKs **every** arriving segment with an `ack_bytes` packet on the
//! reverse direction, so ACKs see propagation, serialisation, queueing and
//! loss like data. An ACK carries the cumulative ACK, the segment and
//! transmission number that triggered it (a one-block SACK) and the echoed
//! send time (a timestamp option, so every ACK is an RTT sample; RFC 6298
//! smoothing, `min_rto`, binary back-off).
//!
//! Senders ([`SenderModel`]):
//! - **Reno**: initial window `initial_window` segments, slow start (+1 per
//!   ACKed segment) up to ssthresh, then congestion avoidance (+1/cwnd per
//!   ACKed segment, one segment per RTT). A transmission is deemed lost when
//!   one sent three transmissions later has been ACKed (three duplicate
//!   ACKs, in packets; a lost retransmission is caught the same way). The
//!   first such loss among transmissions sent since the last reduction
//!   halves cwnd (ssthresh = max(cwnd/2, 2), cwnd = ssthresh): once per
//!   window. Lost segments are retransmitted first (fast retransmit) and the
//!   window counts segments in flight (not lost, not ACKed), as SACK
//!   recovery's pipe does. A timeout deems everything in flight lost, sets
//!   ssthresh = max(flight/2, 2), cwnd = 1, and doubles the timer (up to 64×).
//! - **Cubic** (RFC 9438): Reno's slow start, loss detection, recovery and
//!   timer, but a loss multiplies cwnd by β = 0.7 (ssthresh = max(0.7·cwnd,
//!   2), with fast convergence lowering W_max after a loss short of it) and
//!   congestion avoidance follows W_cubic(t) = C(t − K)³ + W_max, C = 0.4,
//!   aiming each ACK at W_cubic one smoothed RTT ahead (at most 1.5 cwnd);
//!   in the Reno-friendly region, where W_cubic is below the AIMD estimate
//!   W_est (+α = 3(1 − β)/(1 + β) per window, 1 once past the window before
//!   the loss), cwnd is W_est. A timeout sets ssthresh = max(0.7·flight, 2)
//!   and cwnd = 1. No HyStart. [`cubic_average_window`] is RFC 9438 §5.1's
//!   average window under loss, Cubic's counterpart of Mathis.
//! - **QuinnCubic**: Cubic as quinn 0.11 has it, which is what the agents'
//!   QUIC connections run: the epoch starts at the reduction, and both the
//!   curve (K = ∛(W_max·(1 − β)/C)) and the Reno-friendly estimate (from
//!   β·W_max, +α per window throughout) start as if the window had been cut
//!   from W_max. After fast convergence has put W_max below the window the
//!   loss ended, both start below the reduced window, which stays flat until
//!   they reach it: under random loss the window averages less than the
//!   RFC's. The window grows by at most one segment per ACKed one, and not
//!   at all once every segment has been sent (application-limited). It is
//!   paced as quinn paces (a token bucket of the window's share of 2 ms,
//!   10 to 256 segments, filled at 1.25 windows per smoothed RTT); the
//!   other windowed senders send what their window allows at once.
//! - **Paced**: one segment every `packet bytes / (rate / connections)`,
//!   lost segments first, no window; the same loss detection and timer.
//!
//! A flow is complete when its receiver holds every byte; its completion
//! time is that instant. [`transfer`] is one flow between two sites over N
//! connections; [`exchange`] is an outer round's fragment exchange over a
//! full mesh.
//!
//! # Simplifications
//!
//! - No handshake, no slow start after idle, no delayed ACKs, no receive
//!   window, no Nagle: a sender has data until its last segment is sent
//!   and the receiver takes all. Application-limited is only that tail,
//!   where quinn's Cubic grows no window (quinn's also stops while its
//!   application is slow to hand it data, which is not modelled).
//! - A kept connection ([`TransferConfig::warm`]) carries its window,
//!   slow-start threshold, Cubic state and RTT estimate to the next
//!   transfer, and nothing of the last one's packets; time idle between
//!   runs on quinn's Cubic clock ([`WarmConnection::after_idle`]).
//! - No fast-recovery window inflation and no proportional rate reduction:
//!   the halving is immediate and the pipe counts what is in flight.
//! - No tail-loss probe or RACK timer: a loss with fewer than three later
//!   transmissions ACKed waits for the timeout.
//! - An ACK names one segment, where SACK names up to three blocks: when an
//!   ACK is lost and an earlier hole keeps the cumulative ACK below its
//!   segment, that segment may be retransmitted spuriously, so
//!   `retransmits` can exceed the data drops by a few per cent of the ACK
//!   losses.
//! - ECN is not used (packets are not ECN-capable, so an ECN threshold
//!   drops).
//! - The outer round's phases are barriers: all-gather starts when every
//!   reduce-scatter transfer is done; each phase opens fresh connections.

mod connection;
mod cubic;
mod engine;
mod flow;
mod queue;

pub use connection::WarmConnection;
pub use cubic::cubic_average_window;

pub use flow::{
    ExchangeConfig, ExchangeReport, Outcome, TransferConfig, TransferReport, exchange, transfer,
};

use longhaul_core::units::Duration;

use crate::link::LinkConfigError;

/// How the senders of a flow decide when to send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SenderModel {
    /// Reno-like AIMD (see the module docs).
    Reno,
    /// Cubic (RFC 9438): the same slow start, loss detection and recovery
    /// as Reno, the window × 0.7 on a loss and grown along the cubic curve,
    /// never below the Reno-friendly estimate (see the module docs).
    Cubic,
    /// quinn 0.11's Cubic, which the agents' connections run: the same,
    /// but its curve and its Reno-friendly estimate start from β·W_max at
    /// the reduction, and the estimate grows by 0.53 segments per window
    /// throughout (see `cubic.rs`). After a loss that came before the
    /// window was back at W_max, the window waits for them.
    QuinnCubic,
    /// A fixed rate in bits per second of packets on the wire (payload and
    /// header), shared evenly by the flow's connections, for dedicated links.
    Paced { bits_per_second: u64 },
}

/// Segment sizes and timers of every connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TcpParams {
    /// Payload bytes per segment.
    pub mss_bytes: u32,
    /// IP and transport header bytes added to every data segment.
    pub header_bytes: u32,
    /// Bytes of one ACK packet on the wire.
    pub ack_bytes: u32,
    /// Segments a Reno sender may send before its first ACK (RFC 6928: 10).
    pub initial_window: u32,
    pub min_rto: Duration,
    /// Before the first RTT sample (RFC 6298: 1 s).
    pub initial_rto: Duration,
    pub max_rto: Duration,
}

impl Default for TcpParams {
    fn default() -> Self {
        Self {
            mss_bytes: 1460,
            header_bytes: 40,
            ack_bytes: 64,
            initial_window: 10,
            min_rto: Duration::from_millis(200),
            initial_rto: Duration::from_secs(1),
            max_rto: Duration::from_secs(60),
        }
    }
}

impl TcpParams {
    /// Bytes of a full data segment on the wire.
    pub fn packet_bytes(&self) -> u64 {
        u64::from(self.mss_bytes) + u64::from(self.header_bytes)
    }

    fn validate(&self) -> Result<(), DesError> {
        if self.mss_bytes == 0 {
            return Err(DesError::Zero { field: "mss_bytes" });
        }
        if self.ack_bytes == 0 {
            return Err(DesError::Zero { field: "ack_bytes" });
        }
        if self.initial_window == 0 {
            return Err(DesError::Zero {
                field: "initial_window",
            });
        }
        if self.min_rto.as_nanos() == 0 {
            return Err(DesError::Zero { field: "min_rto" });
        }
        Ok(())
    }
}

/// Bounds on one run; whichever is reached first stops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_virtual_time: Duration,
    pub max_events: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_virtual_time: Duration::from_secs(3600),
            max_events: 1_000_000_000,
        }
    }
}

/// A configuration the simulator refuses, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DesError {
    #[error("`{field}` must be positive, found 0")]
    Zero { field: &'static str },
    #[error("`sites` must be at least 2 for an exchange, found {found}")]
    TooFewSites { found: u32 },
    #[error("`sites` = {found} is more than the {max} sites an exchange simulates")]
    TooManySites { found: u32, max: u32 },
    #[error(
        "`{field}` = {bytes} bytes over {connections} connection(s) is more than {max} segments per connection"
    )]
    TooManySegments {
        field: &'static str,
        bytes: u64,
        connections: u32,
        max: u64,
    },
    #[error("`warm`: {message}")]
    Warm { message: String },
    #[error("`{field}`: {source}")]
    Link {
        field: &'static str,
        #[source]
        source: LinkConfigError,
    },
}
