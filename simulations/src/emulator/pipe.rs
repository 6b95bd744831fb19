//! One direction of one emulated link in real time: a [`Link`] behind a
//! mutex, fed by the proxies, and one release thread that sleeps until the
//! link's next wake-up and hands out every packet that is due.
//!
//! # Why a thread, not a tokio task
//!
//! tokio's timer has a resolution of one millisecond, so a release task
//! sleeping on it would be up to a millisecond late on every wake-up; at
//! 1 Gbit/s that is 80 full-size packets released in a burst. A parked OS
//! thread (`park_timeout`, a futex with a timeout) wakes within tens of
//! microseconds. There is still exactly one release loop per link direction
//! and never a timer per packet: senders only unpark the thread when a new
//! packet is due before the time it sleeps until.
//!
//! # Lateness
//!
//! Each release batch reads the clock once; a packet's lateness is that time
//! minus its computed arrival time, recorded in a [`LatenessHistogram`].

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::Thread;

use longhaul_core::units::Duration;
use tokio::sync::mpsc::UnboundedSender;

use super::EmulatorError;
use super::clock::Clock;
use super::ip;
use super::lateness::{LatenessHistogram, LatenessSummary};
use super::socket;
use crate::link::{DropCause, Fate, Link, LinkConfigError, LinkStats, LossModel};

/// Retransmission timeout floor for TCP chunks: loopback RTTs are tiny, and
/// a real stack does not retransmit faster than about this either.
const MIN_RETRANSMIT_NS: u64 = 1_000_000;
/// Retransmission backoff cap, so a healed link resumes within this.
const MAX_RETRANSMIT_NS: u64 = 200_000_000;
/// Most bytes the TCP relay reads, and offers, at once: 16 segments.
pub const TCP_READ_BYTES: usize = 16 * super::tcp::TCP_CHUNK_BYTES;

/// Where the packet-level mode writes a released IP packet: the TUN device
/// of the destination site's namespace.
pub trait PacketSink: std::fmt::Debug + Send + Sync {
    /// Hands one IP packet to the destination host's kernel.
    fn send_packet(&self, packet: &[u8]) -> std::io::Result<()>;
}

/// What a packet carries and where it goes when released.
#[derive(Debug)]
pub enum Payload {
    /// An IP packet of the packet-level mode, written to `sink` (gone if
    /// the sink is). Lost packets are gone: the end hosts' TCP recovers.
    /// An ECN-capable packet the link marks gets Congestion Experienced
    /// in its header.
    Packet {
        sink: Weak<dyn PacketSink>,
        data: Vec<u8>,
    },
    /// A UDP datagram, sent on `socket` (to `to`, or to the socket's
    /// connected peer). Lost datagrams are gone.
    Datagram {
        socket: Arc<UdpSocket>,
        to: Option<SocketAddr>,
        data: Vec<u8>,
    },
    /// A piece of a TCP byte stream, handed to the connection's writer with
    /// its sequence number. Dropped chunks are retransmitted, never lost.
    Chunk {
        writer: UnboundedSender<(u64, Vec<u8>)>,
        sequence: u64,
        data: Vec<u8>,
    },
}

impl Payload {
    fn len(&self) -> u64 {
        match self {
            Self::Datagram { data, .. } | Self::Chunk { data, .. } | Self::Packet { data, .. } => {
                data.len() as u64
            }
        }
    }

    /// Whether the link may mark the packet rather than drop it: an IP
    /// packet with ECT(0) or ECT(1). Datagrams and chunks are offered as
    /// not ECN-capable, since the proxies do not read ECN bits.
    fn ecn_capable(&self) -> bool {
        match self {
            Self::Packet { data, .. } => ip::ecn_capable(data),
            Self::Datagram { .. } | Self::Chunk { .. } => false,
        }
    }

    fn mark_congestion(&mut self) {
        if let Self::Packet { data, .. } = self {
            ip::set_congestion_experienced(data);
        }
    }

    fn copy(&self) -> Self {
        match self {
            Self::Datagram { socket, to, data } => Self::Datagram {
                socket: Arc::clone(socket),
                to: *to,
                data: data.clone(),
            },
            Self::Chunk {
                writer,
                sequence,
                data,
            } => Self::Chunk {
                writer: writer.clone(),
                sequence: *sequence,
                data: data.clone(),
            },
            Self::Packet { sink, data } => Self::Packet {
                sink: Weak::clone(sink),
                data: data.clone(),
            },
        }
    }

    /// Hands the payload on; false if the host could not send it.
    fn release(self) -> bool {
        match self {
            Self::Datagram { socket, to, data } => {
                let sent = match to {
                    Some(to) => socket.send_to(&data, to),
                    None => socket.send(&data),
                };
                sent.is_ok()
            }
            // A closed writer means the connection is gone: nothing to do.
            Self::Chunk {
                writer,
                sequence,
                data,
            } => {
                let _ = writer.send((sequence, data));
                true
            }
            Self::Packet { sink, data } => sink
                .upgrade()
                .is_some_and(|sink| sink.send_packet(&data).is_ok()),
        }
    }
}

/// A change of a link direction's parameters; `None` keeps a field.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkChange {
    pub rate_bits_per_second: Option<u64>,
    /// Bernoulli loss probability; 0 turns loss off.
    pub loss: Option<f64>,
    /// One-way delay added to the configured overhead.
    pub extra_delay_ns: Option<u64>,
}

impl LinkChange {
    pub fn is_empty(&self) -> bool {
        self.rate_bits_per_second.is_none() && self.loss.is_none() && self.extra_delay_ns.is_none()
    }
}

/// A snapshot of one link direction: parameters in force and counters.
#[derive(Debug, Clone, PartialEq)]
pub struct PipeStatus {
    pub from: String,
    pub to: String,
    pub seed: u64,
    pub rate_bits_per_second: u64,
    pub one_way_ns: u64,
    pub extra_delay_ns: u64,
    pub loss: f64,
    /// Maximum jitter, if any.
    pub jitter_ns: Option<u64>,
    pub buffer_bytes: u64,
    pub down: bool,
    pub stats: LinkStats,
    pub retransmissions: u64,
    /// Released datagrams the host failed to send.
    pub host_drops: u64,
    /// Datagrams the kernel dropped at the proxy socket that feeds this
    /// direction, before the proxy read them (a full receive buffer, as
    /// `SO_RXQ_OVFL` reports it): lost, and not by the link model.
    pub kernel_drops: u64,
    pub lateness: LatenessSummary,
}

impl PipeStatus {
    /// `from->to`.
    pub fn id(&self) -> String {
        format!("{}->{}", self.from, self.to)
    }
}

#[derive(Debug)]
struct Pending {
    payload: Payload,
    /// Deliveries still expected: 2 for a duplicated packet.
    copies: u8,
}

#[derive(Debug)]
struct Retransmit {
    payload: Payload,
    attempt: u32,
}

#[derive(Debug)]
struct PipeState {
    link: Link,
    base_overhead_ns: u64,
    extra_delay_ns: u64,
    rate_bits_per_second: u64,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    /// (due time, id) → chunk to offer again.
    retransmits: BTreeMap<(u64, u64), Retransmit>,
    lateness: LatenessHistogram,
    retransmissions: u64,
    host_drops: u64,
    kernel_drops: u64,
    /// The release thread sleeps until then (`u64::MAX`: until unparked).
    sleeping_until: u64,
    shutdown: bool,
}

impl PipeState {
    /// Offers a payload to the link at `now`; returns the time by which the
    /// release thread must next look (a delivery or a retransmission).
    fn offer(&mut self, now: u64, mut payload: Payload, attempt: u32) -> (Fate, Option<u64>) {
        let id = self.next_id;
        self.next_id += 1;
        let fate = self
            .link
            .handle_send(now, id, payload.len(), payload.ecn_capable());
        match fate {
            Fate::Delivered {
                at_ns,
                duplicate_at_ns,
                marked_ecn,
            } => {
                if marked_ecn {
                    payload.mark_congestion();
                }
                let copies = if duplicate_at_ns.is_some() { 2 } else { 1 };
                self.pending.insert(id, Pending { payload, copies });
                let earliest = duplicate_at_ns.map_or(at_ns, |dup| dup.min(at_ns));
                (fate, Some(earliest))
            }
            Fate::Dropped { .. } => match payload {
                Payload::Datagram { .. } | Payload::Packet { .. } => (fate, None),
                Payload::Chunk { .. } => {
                    let due = now.saturating_add(self.retransmit_timeout(attempt));
                    self.retransmits
                        .insert((due, id), Retransmit { payload, attempt });
                    (fate, Some(due))
                }
            },
        }
    }

    /// max(RTT, 1 ms), doubled per earlier attempt, at most 200 ms.
    fn retransmit_timeout(&self, attempt: u32) -> u64 {
        let rtt = self
            .link
            .one_way_ns()
            .saturating_mul(2)
            .max(MIN_RETRANSMIT_NS);
        rtt.saturating_mul(1 << attempt.min(16))
            .min(MAX_RETRANSMIT_NS.max(rtt))
    }

    fn next_event(&self) -> Option<u64> {
        let retransmit = self.retransmits.keys().next().map(|(due, _)| *due);
        match (self.link.next_wakeup(), retransmit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One direction of an emulated link, with its release thread.
#[derive(Debug)]
pub struct Pipe {
    from: String,
    to: String,
    clock: Clock,
    state: Mutex<PipeState>,
    thread: OnceLock<Thread>,
}

impl Pipe {
    /// Builds the direction and starts its release thread.
    pub fn start(
        from: &str,
        to: &str,
        link: Link,
        clock: Clock,
    ) -> Result<Arc<Self>, EmulatorError> {
        let rate_bits_per_second = link.config().nominal_bits_per_second();
        let base_overhead_ns = link.config().overhead.as_nanos();
        let pipe = Arc::new(Self {
            from: from.to_string(),
            to: to.to_string(),
            clock,
            state: Mutex::new(PipeState {
                link,
                base_overhead_ns,
                extra_delay_ns: 0,
                rate_bits_per_second,
                pending: HashMap::new(),
                next_id: 0,
                retransmits: BTreeMap::new(),
                lateness: LatenessHistogram::new(),
                retransmissions: 0,
                host_drops: 0,
                kernel_drops: 0,
                sleeping_until: u64::MAX,
                shutdown: false,
            }),
            thread: OnceLock::new(),
        });
        let runner = Arc::clone(&pipe);
        let handle = std::thread::Builder::new()
            .name(format!("release {from}->{to}"))
            .spawn(move || runner.release_loop())
            .map_err(|source| EmulatorError::Io {
                what: format!("cannot start the release thread of {from}->{to}"),
                source,
            })?;
        let _ = pipe.thread.set(handle.thread().clone());
        Ok(pipe)
    }

    pub fn from_site(&self) -> &str {
        &self.from
    }

    pub fn to_site(&self) -> &str {
        &self.to
    }

    /// `from->to`.
    pub fn id(&self) -> String {
        format!("{}->{}", self.from, self.to)
    }

    fn lock(&self) -> MutexGuard<'_, PipeState> {
        // The state stays consistent across a panic in another holder: every
        // update is a single assignment or insertion.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    /// Offers a packet now; the release thread sends it when it arrives.
    pub fn send(&self, payload: Payload) -> Fate {
        let now = self.clock.now_ns();
        let mut state = self.lock();
        let (fate, due) = state.offer(now, payload, 0);
        let wake = due.is_some_and(|due| due < state.sleeping_until);
        drop(state);
        if wake {
            self.wake();
        }
        fate
    }

    /// Offers several packets now under one lock, with at most one wake-up
    /// of the release thread: how the proxies pass on what one read gave.
    pub fn send_batch(&self, payloads: impl IntoIterator<Item = Payload>) {
        let now = self.clock.now_ns();
        let mut state = self.lock();
        let mut earliest = u64::MAX;
        let mut dropped = DropTally::default();
        for payload in payloads {
            let (fate, due) = state.offer(now, payload, 0);
            dropped.add(&fate);
            if let Some(due) = due {
                earliest = earliest.min(due);
            }
        }
        let wake = earliest < state.sleeping_until;
        drop(state);
        if wake {
            self.wake();
        }
        dropped.record(&self.id());
    }

    /// Counts datagrams the kernel dropped at the socket that feeds this
    /// direction (reported by the proxy that reads it).
    pub fn count_kernel_drops(&self, count: u64) {
        if count == 0 {
            return;
        }
        self.lock().kernel_drops += count;
        let link = self.id();
        tracing::debug!(%link, count, "the kernel dropped datagrams at a proxy socket");
        metrics::counter!(super::metrics::DROPS_TOTAL, "link" => link, "cause" => "kernel")
            .increment(count);
    }

    /// The socket buffer the proxy sockets feeding or fed by this
    /// direction ask for ([`socket::socket_buffer_bytes`] of its rate,
    /// round trip and egress buffer as configured now).
    pub fn socket_buffer_bytes(&self) -> usize {
        let state = self.lock();
        socket::socket_buffer_bytes(
            state.rate_bits_per_second,
            state.link.one_way_ns().saturating_mul(2),
            state.link.buffer_bytes(),
        )
    }

    /// Bytes a TCP connection may have offered but not yet delivered: what
    /// the link holds, the buffer plus rate × one-way delay (a chunk's
    /// credit comes back when the far side writes it, one way later), and
    /// at least one read of the relay ([`TCP_READ_BYTES`]) so it always
    /// makes progress.
    pub fn tcp_window_bytes(&self) -> u32 {
        let state = self.lock();
        let one_way_ns = u128::from(state.link.one_way_ns());
        let on_the_wire = u128::from(state.rate_bits_per_second) * one_way_ns / 8 / 1_000_000_000;
        let window = on_the_wire + u128::from(state.link.buffer_bytes());
        u32::try_from(window.max(TCP_READ_BYTES as u128)).unwrap_or(u32::MAX >> 1)
    }

    /// When `bytes` more would fit in this direction's egress queue, as a
    /// wait from now (zero if they fit now); `None` if they never would.
    /// The TCP relay waits this long before it offers a segment, so it does
    /// not overflow a shallow buffer with its own bursts.
    pub fn wait_for_room(&self, bytes: u64) -> Option<std::time::Duration> {
        let now = self.clock.now_ns();
        let at = self.lock().link.fits_at(now, bytes)?;
        Some(std::time::Duration::from_nanos(at.saturating_sub(now)))
    }

    /// Checks a change without applying it.
    pub fn check(&self, change: &LinkChange) -> Result<(), EmulatorError> {
        let state = self.lock();
        let mut candidate = state.link.config().clone();
        if let Some(loss) = change.loss {
            candidate.loss = loss_model(loss);
        }
        if let Some(extra) = change.extra_delay_ns {
            candidate.overhead = Duration::from_nanos(state.base_overhead_ns.saturating_add(extra));
        }
        if change.rate_bits_per_second == Some(0) {
            return Err(EmulatorError::InvalidArgument {
                field: "rate_bits_per_second",
                message: "must be a positive rate, found 0".to_string(),
            });
        }
        candidate
            .validate()
            .map_err(|source| change_error(change, source))
    }

    /// Applies a change from now on. Check it first with [`Pipe::check`].
    pub fn apply(&self, change: &LinkChange) -> Result<(), EmulatorError> {
        self.check(change)?;
        let now = self.clock.now_ns();
        let mut state = self.lock();
        if let Some(rate) = change.rate_bits_per_second
            && state.link.set_rate(now, rate)
        {
            state.rate_bits_per_second = rate;
        }
        if let Some(loss) = change.loss {
            state
                .link
                .set_loss(loss_model(loss))
                .map_err(|source| change_error(change, source))?;
        }
        if let Some(extra) = change.extra_delay_ns {
            let overhead = Duration::from_nanos(state.base_overhead_ns.saturating_add(extra));
            state
                .link
                .set_overhead(now, overhead)
                .map_err(|source| change_error(change, source))?;
            state.extra_delay_ns = extra;
        }
        tracing::info!(link = %self.id(), ?change, "link changed");
        Ok(())
    }

    /// Cuts (`down`) or heals this direction.
    pub fn set_down(&self, down: bool) {
        let now = self.clock.now_ns();
        let mut state = self.lock();
        if down {
            state.link.set_down(now);
        } else {
            state.link.set_up(now);
        }
        tracing::info!(link = %self.id(), down, "link state changed");
    }

    pub fn status(&self) -> PipeStatus {
        let state = self.lock();
        PipeStatus {
            from: self.from.clone(),
            to: self.to.clone(),
            seed: state.link.seed(),
            rate_bits_per_second: state.rate_bits_per_second,
            one_way_ns: state.link.one_way_ns(),
            extra_delay_ns: state.extra_delay_ns,
            loss: state.link.config().loss.stationary_loss().unwrap_or(0.0),
            jitter_ns: state.link.config().jitter.map(|j| j.max.as_nanos()),
            buffer_bytes: state.link.buffer_bytes(),
            down: state.link.is_down(),
            stats: state.link.stats(),
            retransmissions: state.retransmissions,
            host_drops: state.host_drops,
            kernel_drops: state.kernel_drops,
            lateness: state.lateness.summary(),
        }
    }

    /// Stops the release thread; packets not yet released are dropped.
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.wake();
    }

    fn release_loop(&self) {
        let mut due = Vec::new();
        let mut host_drops = 0;
        loop {
            let now;
            let next;
            {
                let mut state = self.lock();
                state.host_drops += host_drops;
                host_drops = 0;
                if state.shutdown {
                    return;
                }
                now = self.clock.now_ns();
                while let Some(entry) = state.retransmits.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let retransmit = entry.remove();
                    state.retransmissions += 1;
                    state.offer(now, retransmit.payload, retransmit.attempt + 1);
                }
                while let Some(delivery) = state.link.poll_delivery(now) {
                    state
                        .lateness
                        .record(now.saturating_sub(delivery.at_ns) / 1_000);
                    let payload = match state.pending.get_mut(&delivery.packet_id) {
                        Some(pending) if pending.copies > 1 => {
                            pending.copies -= 1;
                            Some(pending.payload.copy())
                        }
                        Some(_) => state
                            .pending
                            .remove(&delivery.packet_id)
                            .map(|pending| pending.payload),
                        None => None,
                    };
                    due.extend(payload);
                }
                next = state.next_event();
                state.sleeping_until = next.unwrap_or(u64::MAX);
            }
            host_drops += release_all(&mut due);
            match next.and_then(|at| self.clock.instant(at)) {
                Some(at) => {
                    let wait = at.saturating_duration_since(std::time::Instant::now());
                    if !wait.is_zero() {
                        std::thread::park_timeout(wait);
                    }
                }
                None if next.is_none() => std::thread::park(),
                // A wake-up beyond what `Instant` holds: sleep in long naps.
                None => std::thread::park_timeout(std::time::Duration::from_secs(3600)),
            }
        }
    }
}

/// Releases every due payload, datagrams for one socket in one batch (runs
/// of consecutive datagrams, so the order is kept); returns how many
/// datagrams the host refused.
fn release_all(due: &mut Vec<Payload>) -> u64 {
    let mut refused = 0;
    let mut run: Vec<(Option<SocketAddr>, Vec<u8>)> = Vec::new();
    let mut run_socket: Option<Arc<UdpSocket>> = None;
    let flush = |socket: &Option<Arc<UdpSocket>>, run: &mut Vec<(Option<SocketAddr>, Vec<u8>)>| {
        let Some(socket) = socket else { return 0 };
        let datagrams: Vec<(Option<SocketAddr>, &[u8])> = run
            .iter()
            .map(|(to, data)| (*to, data.as_slice()))
            .collect();
        let refused = socket::send_batch(socket, &datagrams);
        run.clear();
        refused
    };
    for payload in due.drain(..) {
        match payload {
            Payload::Datagram { socket, to, data } => {
                if run_socket
                    .as_ref()
                    .is_some_and(|current| !Arc::ptr_eq(current, &socket))
                {
                    refused += flush(&run_socket, &mut run);
                }
                run_socket = Some(socket);
                run.push((to, data));
            }
            other @ (Payload::Chunk { .. } | Payload::Packet { .. }) => {
                refused += flush(&run_socket, &mut run);
                if !other.release() {
                    refused += 1;
                }
            }
        }
    }
    refused + flush(&run_socket, &mut run)
}

/// Drops of one batch by cause, for the metrics (recorded after the lock
/// is released).
#[derive(Debug, Default)]
struct DropTally {
    queue: u64,
    loss: u64,
    down: u64,
}

impl DropTally {
    fn add(&mut self, fate: &Fate) {
        if let Fate::Dropped { cause } = fate {
            match cause {
                DropCause::Loss | DropCause::Trace => self.loss += 1,
                DropCause::Down => self.down += 1,
                DropCause::Queue => self.queue += 1,
            }
        }
    }

    fn record(&self, link: &str) {
        for (cause, count) in [
            ("queue", self.queue),
            ("loss", self.loss),
            ("down", self.down),
        ] {
            if count > 0 {
                metrics::counter!(super::metrics::DROPS_TOTAL, "link" => link.to_string(), "cause" => cause)
                    .increment(count);
            }
        }
    }
}

fn loss_model(loss: f64) -> LossModel {
    if loss == 0.0 {
        LossModel::None
    } else {
        LossModel::Bernoulli { p: loss }
    }
}

/// Names the request field behind a link configuration error.
fn change_error(change: &LinkChange, source: LinkConfigError) -> EmulatorError {
    let field = match &source {
        LinkConfigError::Probability { .. } => "loss",
        LinkConfigError::TooLong { .. } => "extra_delay_ns",
        _ if change.loss.is_some() => "loss",
        _ => "extra_delay_ns",
    };
    EmulatorError::InvalidArgument {
        field,
        message: source.to_string(),
    }
}
