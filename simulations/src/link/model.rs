//! The link state machine: packets in through [`Link::handle_send`], out
//! through [`Link::poll_delivery`], woken by [`Link::next_wakeup`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::capacity::Capacity;
use super::config::{JitterMode, LinkConfig, LinkConfigError, LossModel};
use super::loss::{LossState, LossVerdict};
use super::rng::{self, Stream};
use longhaul_core::rng::SeedRng;

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropCause {
    /// The egress buffer was full (drop-tail), or the backlog was above the
    /// ECN threshold and the packet was not ECN-capable.
    Queue,
    /// Lost on the wire by the random loss model.
    Loss,
    /// Sent while the link was down.
    Down,
    /// Listed in the loss trace.
    Trace,
}

/// What happens to a packet, decided when it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    Dropped {
        cause: DropCause,
    },
    Delivered {
        /// When the packet's last bit arrives at the far end.
        at_ns: u64,
        /// Congestion Experienced was set on the way.
        marked_ecn: bool,
        /// When a duplicate copy arrives, if the packet is duplicated.
        duplicate_at_ns: Option<u64>,
    },
}

impl Fate {
    pub fn is_delivered(&self) -> bool {
        matches!(self, Self::Delivered { .. })
    }

    pub fn drop_cause(&self) -> Option<DropCause> {
        match self {
            Self::Dropped { cause } => Some(*cause),
            Self::Delivered { .. } => None,
        }
    }
}

/// A packet arriving at the far end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delivery {
    pub packet_id: u64,
    pub bytes: u64,
    pub at_ns: u64,
    pub marked_ecn: bool,
    /// This is the extra copy of a duplicated packet.
    pub duplicate: bool,
}

/// Drops by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    pub queue: u64,
    pub loss: u64,
    pub down: u64,
    pub trace: u64,
}

impl DropCounts {
    pub fn total(&self) -> u64 {
        self.queue + self.loss + self.down + self.trace
    }
}

/// Counters since the link was built.
///
/// `packets_in = delivered (originals) + drops + in flight` at every instant;
/// the `delivered` counters move when [`Link::poll_delivery`] hands a packet
/// out and count duplicate copies separately.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub packets_delivered: u64,
    pub bytes_delivered: u64,
    pub duplicates_delivered: u64,
    pub drops: DropCounts,
    pub ecn_marked: u64,
    /// Largest backlog of the egress buffer, bytes, just after an admission.
    pub queue_high_water_bytes: u64,
}

/// A packet waiting in the heap of packets on their way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at_ns: u64,
    /// Order of scheduling: ties in `at_ns` come out in the order scheduled.
    sequence: u64,
    packet_id: u64,
    bytes: u64,
    marked_ecn: bool,
    duplicate: bool,
}

/// One direction of a link. See the [module docs](super) for the model.
#[derive(Debug, Clone)]
pub struct Link {
    config: LinkConfig,
    seed: u64,
    one_way_ns: u64,
    buffer_bytes: u64,
    capacity: Capacity,
    loss: LossState,
    jitter_rng: SeedRng,
    duplicate_rng: SeedRng,
    /// Latest `now` seen; earlier inputs are treated as this.
    now_ns: u64,
    /// The transmitter is busy until then.
    transmitter_free_at: u64,
    /// Admitted packets whose last bit is not yet out: (finish time, bytes).
    egress: VecDeque<(u64, u64)>,
    backlog_bytes: u64,
    /// Latest delivery time handed out, for FIFO jitter.
    last_delivery_ns: u64,
    in_flight: DeliveryQueue,
    sequence: u64,
    down: bool,
    stats: LinkStats,
}

impl Link {
    /// Validates `config` and builds the link at virtual time 0. `seed` fixes
    /// every random decision.
    pub fn new(config: LinkConfig, seed: u64) -> Result<Self, LinkConfigError> {
        config.validate()?;
        Ok(Self {
            seed,
            one_way_ns: config.one_way_ns(),
            buffer_bytes: config.buffer_bytes(),
            capacity: Capacity::new(&config),
            loss: LossState::new(&config.loss, seed),
            jitter_rng: rng::stream(seed, Stream::Jitter),
            duplicate_rng: rng::stream(seed, Stream::Duplicate),
            now_ns: 0,
            transmitter_free_at: 0,
            egress: VecDeque::new(),
            backlog_bytes: 0,
            last_delivery_ns: 0,
            in_flight: DeliveryQueue::default(),
            sequence: 0,
            down: false,
            stats: LinkStats::default(),
            config,
        })
    }

    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// The egress buffer size in force, bytes.
    pub fn buffer_bytes(&self) -> u64 {
        self.buffer_bytes
    }

    /// Propagation plus fixed overhead, ns.
    pub fn one_way_ns(&self) -> u64 {
        self.one_way_ns
    }

    /// Bytes admitted to the egress buffer whose last bit had not left by the
    /// latest `now` seen.
    pub fn backlog_bytes(&self) -> u64 {
        self.backlog_bytes
    }

    /// The earliest time from `now_ns` on at which `bytes` more would fit
    /// in the egress buffer (`now_ns` itself if they fit now); `None` if
    /// they never would (more than the whole buffer). Changes nothing: a
    /// sender that paces itself against the queue asks this.
    pub fn fits_at(&self, now_ns: u64, bytes: u64) -> Option<u64> {
        if bytes > self.buffer_bytes {
            return None;
        }
        let now = now_ns.max(self.now_ns);
        let mut backlog = self.backlog_bytes;
        let mut at = now;
        for &(finish, leaving) in &self.egress {
            if finish > now && backlog.saturating_add(bytes) <= self.buffer_bytes {
                break;
            }
            backlog = backlog.saturating_sub(leaving);
            at = at.max(finish);
        }
        Some(at)
    }

    /// Packets (and duplicate copies) scheduled but not yet polled.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Takes the link down by hand: packets sent until [`Link::set_up`] are
    /// dropped with [`DropCause::Down`]. Packets already accepted keep their
    /// fate.
    pub fn set_down(&mut self, now_ns: u64) {
        self.advance(now_ns);
        self.down = true;
    }

    pub fn set_up(&mut self, now_ns: u64) {
        self.advance(now_ns);
        self.down = false;
    }

    /// Down by hand or inside a scheduled outage, at the latest `now` seen.
    pub fn is_down(&self) -> bool {
        let now = self.now_ns;
        let outages = &self.config.outages;
        // Outages are sorted and disjoint: the only candidate is the first
        // one that has not ended.
        let first_open = outages.partition_point(|o| o.until.as_nanos() <= now);
        self.down
            || outages
                .get(first_open)
                .is_some_and(|o| o.from.as_nanos() <= now)
    }

    /// Changes the line rate from `now_ns` on, overriding the rest of the
    /// schedule; a packet already being serialised keeps its rate. Ignored
    /// (returns false) on a trace-driven link or for a zero rate.
    pub fn set_rate(&mut self, now_ns: u64, bits_per_second: u64) -> bool {
        self.advance(now_ns);
        if bits_per_second == 0 || self.config.delivery_trace.is_some() {
            return false;
        }
        self.capacity.set_rate(bits_per_second);
        true
    }

    /// Changes the fixed one-way overhead (added to propagation) from `now_ns`
    /// on, as a route change would: packets already on their way keep their
    /// arrival time, so lowering the delay lets later packets overtake them.
    /// The buffer size in force does not change.
    pub fn set_overhead(
        &mut self,
        now_ns: u64,
        overhead: longhaul_core::units::Duration,
    ) -> Result<(), LinkConfigError> {
        self.advance(now_ns);
        let mut candidate = self.config.clone();
        candidate.overhead = overhead;
        candidate.validate()?;
        self.one_way_ns = candidate.one_way_ns();
        self.config = candidate;
        Ok(())
    }

    /// Replaces the loss model from now on; the loss RNG stream continues.
    pub fn set_loss(&mut self, model: LossModel) -> Result<(), LinkConfigError> {
        let mut candidate = self.config.clone();
        candidate.loss = model;
        candidate.validate()?;
        self.loss.set_model(&candidate.loss);
        self.config = candidate;
        Ok(())
    }

    /// Offers a packet of `bytes` to the link at `now_ns` and returns its
    /// fate. Delivered packets also come out of [`Link::poll_delivery`].
    /// Time never goes backwards: a `now_ns` earlier than one already seen
    /// is taken as the latest seen.
    ///
    /// In order: down → drop (`Down`); the buffer drains what has left by
    /// `now`; backlog + bytes > buffer → drop (`Queue`); backlog + bytes > K
    /// → mark if ECN-capable, else drop (`Queue`); the packet is serialised;
    /// the loss trace or model may lose it on the wire (`Trace`, `Loss`),
    /// after it used its buffer space and serialisation time; jitter and
    /// duplication apply to what is delivered.
    pub fn handle_send(
        &mut self,
        now_ns: u64,
        packet_id: u64,
        bytes: u64,
        ecn_capable: bool,
    ) -> Fate {
        self.advance(now_ns);
        let now = self.now_ns;
        let index = self.stats.packets_in;
        self.stats.packets_in += 1;
        self.stats.bytes_in = self.stats.bytes_in.saturating_add(bytes);

        if self.is_down() {
            return self.drop(DropCause::Down);
        }
        let backlog_after = self.backlog_bytes.saturating_add(bytes);
        if backlog_after > self.buffer_bytes {
            return self.drop(DropCause::Queue);
        }
        let mut marked_ecn = false;
        if let Some(threshold) = self.config.ecn_threshold
            && backlog_after > threshold.bytes()
        {
            if !ecn_capable {
                return self.drop(DropCause::Queue);
            }
            marked_ecn = true;
            self.stats.ecn_marked += 1;
        }

        let wire_bytes = bytes.saturating_add(self.config.per_packet_overhead.bytes());
        let finish = self
            .capacity
            .finish(now, self.transmitter_free_at, wire_bytes);
        self.transmitter_free_at = finish;
        self.egress.push_back((finish, bytes));
        self.backlog_bytes = backlog_after;
        self.stats.queue_high_water_bytes = self.stats.queue_high_water_bytes.max(backlog_after);

        match self.loss.decide(index) {
            LossVerdict::Kept => {}
            LossVerdict::Random => return self.drop(DropCause::Loss),
            LossVerdict::Trace => return self.drop(DropCause::Trace),
        }

        let arrival = finish.saturating_add(self.one_way_ns);
        let at_ns = self.jittered(arrival);
        self.schedule(at_ns, packet_id, bytes, marked_ecn, false);
        // No draw when duplication is off: the stream is duplication's own,
        // so skipping it changes no other decision.
        let duplicate = self.config.duplicate > 0.0;
        let duplicate_at_ns = if duplicate && self.duplicate_rng.chance(self.config.duplicate) {
            let at = self.jittered(arrival);
            self.schedule(at, packet_id, bytes, marked_ecn, true);
            Some(at)
        } else {
            None
        };
        Fate::Delivered {
            at_ns,
            marked_ecn,
            duplicate_at_ns,
        }
    }

    /// The next packet that has arrived by `now_ns`, earliest first (ties in
    /// the order they were scheduled).
    pub fn poll_delivery(&mut self, now_ns: u64) -> Option<Delivery> {
        self.advance(now_ns);
        if self
            .in_flight
            .peek()
            .is_none_or(|next| next.at_ns > self.now_ns)
        {
            return None;
        }
        let next = self.in_flight.pop()?;
        if next.duplicate {
            self.stats.duplicates_delivered += 1;
        } else {
            self.stats.packets_delivered += 1;
            self.stats.bytes_delivered = self.stats.bytes_delivered.saturating_add(next.bytes);
        }
        Some(Delivery {
            packet_id: next.packet_id,
            bytes: next.bytes,
            at_ns: next.at_ns,
            marked_ecn: next.marked_ecn,
            duplicate: next.duplicate,
        })
    }

    /// When [`Link::poll_delivery`] next has something: the earliest arrival
    /// of a packet on its way. Sending can only add later events, so a driver
    /// sleeps until this time or the next send, whichever comes first.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.in_flight.peek().map(|next| next.at_ns)
    }

    fn advance(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        while let Some(&(finish, bytes)) = self.egress.front() {
            if finish > self.now_ns {
                break;
            }
            self.egress.pop_front();
            // Saturating: a backlog near u64::MAX saturates on the way in.
            self.backlog_bytes = self.backlog_bytes.saturating_sub(bytes);
        }
    }

    fn drop(&mut self, cause: DropCause) -> Fate {
        let counter = match cause {
            DropCause::Queue => &mut self.stats.drops.queue,
            DropCause::Loss => &mut self.stats.drops.loss,
            DropCause::Down => &mut self.stats.drops.down,
            DropCause::Trace => &mut self.stats.drops.trace,
        };
        *counter += 1;
        Fate::Dropped { cause }
    }

    /// Adds a jitter draw to `arrival`; in FIFO mode never earlier than the
    /// latest delivery already scheduled. Without jitter nothing is drawn, and
    /// arrivals are already in order.
    fn jittered(&mut self, arrival: u64) -> u64 {
        let Some(jitter) = self.config.jitter else {
            return arrival;
        };
        let at = arrival.saturating_add(self.jitter_rng.up_to(jitter.max.as_nanos()));
        match jitter.mode {
            JitterMode::Reorder => at,
            JitterMode::Fifo => {
                let at = at.max(self.last_delivery_ns);
                self.last_delivery_ns = at;
                at
            }
        }
    }

    fn schedule(&mut self, at_ns: u64, packet_id: u64, bytes: u64, marked: bool, dup: bool) {
        self.in_flight.push(InFlight {
            at_ns,
            sequence: self.sequence,
            packet_id,
            bytes,
            marked_ecn: marked,
            duplicate: dup,
        });
        self.sequence += 1;
    }
}

/// Packets on their way, earliest first, ties in scheduling order.
///
/// Without reordering jitter, arrivals are scheduled in time order, so they
/// go to a FIFO in O(1); only a packet scheduled earlier than the latest one
/// (reordering jitter) goes to the heap. Popping takes the smaller head.
#[derive(Debug, Clone, Default)]
struct DeliveryQueue {
    in_order: VecDeque<InFlight>,
    overtaking: BinaryHeap<Reverse<InFlight>>,
}

impl DeliveryQueue {
    fn len(&self) -> usize {
        self.in_order.len() + self.overtaking.len()
    }

    fn push(&mut self, packet: InFlight) {
        if self
            .in_order
            .back()
            .is_none_or(|last| last.at_ns <= packet.at_ns)
        {
            self.in_order.push_back(packet);
        } else {
            self.overtaking.push(Reverse(packet));
        }
    }

    fn peek(&self) -> Option<&InFlight> {
        match (self.in_order.front(), self.overtaking.peek()) {
            (Some(a), Some(Reverse(b))) => Some(if b < a { b } else { a }),
            (a, b) => a.or(b.map(|Reverse(b)| b)),
        }
    }

    fn pop(&mut self) -> Option<InFlight> {
        let from_heap = match (self.in_order.front(), self.overtaking.peek()) {
            (Some(a), Some(Reverse(b))) => b < a,
            (None, Some(_)) => true,
            _ => false,
        };
        if from_heap {
            self.overtaking.pop().map(|Reverse(packet)| packet)
        } else {
            self.in_order.pop_front()
        }
    }
}
