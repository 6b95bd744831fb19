//! One connection: a sender (Reno-like AIMD, Cubic or paced) and its
//! receiver.
//!
//! Segments are numbered from 0. Every transmission, first or retransmitted,
//! gets the next transmission number; the receiver ACKs every arrival with
//! the segment, its transmission number, the echoed send time and the
//! cumulative ACK. The sender deems a transmission lost when one sent
//! [`DUPLICATE_THRESHOLD`] transmissions after it has been ACKed (the packet
//! form of three duplicate ACKs, which also catches a lost retransmission),
//! or when the retransmission timer fires.

use std::collections::VecDeque;

use longhaul_core::units::Duration;

use super::TcpParams;
use super::cubic::Cubic;
use super::engine::{Fabric, Payload};

/// Transmissions ACKed after a missing one before it is deemed lost.
pub(crate) const DUPLICATE_THRESHOLD: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    Unsent,
    InFlight,
    Lost,
    Acked,
}

/// How a windowed sender grows its window in congestion avoidance and how
/// far it lowers it on a loss.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Growth {
    /// +1/cwnd per ACKed segment, halved on a loss.
    Reno,
    /// RFC 9438's cubic curve, × 0.7 on a loss.
    Cubic(Cubic),
}

/// How the sender decides when to send.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Control {
    Window {
        /// Congestion window, segments.
        cwnd: f64,
        ssthresh: f64,
        /// Losses of transmissions numbered below this belong to a window
        /// already reduced for; ACKs of them do not grow the window.
        recovery_end: u64,
        growth: Growth,
    },
    Paced {
        interval_ns: u64,
        next_send_ns: u64,
    },
}

impl Control {
    /// A window grown by quinn's Cubic: paced as quinn paces, and not
    /// grown while the sender has nothing to send.
    fn is_quinns(&self) -> bool {
        matches!(
            self,
            Control::Window { growth: Growth::Cubic(cubic), .. } if cubic.is_quinns()
        )
    }
}

/// What a connection carries from one transfer to its next when it is
/// kept open between them, as the agents' pooled QUIC connections are: its
/// window, slow-start threshold and Cubic state, and its RTT estimate
/// (the transfer's own segments, in flight or not, are not carried: it
/// ended with every byte received). From [`TransferReport::warm`], for
/// [`TransferConfig::warm`].
///
/// [`TransferReport::warm`]: super::TransferReport::warm
/// [`TransferConfig::warm`]: super::TransferConfig::warm
#[derive(Debug, Clone, PartialEq)]
pub struct WarmConnection {
    pub(crate) sender: super::SenderModel,
    control: Control,
    srtt_ns: Option<f64>,
    rttvar_ns: f64,
    rto_ns: u64,
}

impl WarmConnection {
    /// The congestion window, segments (`None` for a paced sender).
    pub fn cwnd(&self) -> Option<f64> {
        match &self.control {
            Control::Window { cwnd, .. } => Some(*cwnd),
            Control::Paced { .. } => None,
        }
    }

    /// The same connection after `idle` with nothing to send: the window
    /// is kept, with no slow start after idle (quinn has none), and only
    /// quinn's Cubic clock moves (its curve and estimate are functions of
    /// the time since the reduction; RFC 9438's, as Linux's, leaves idle
    /// time out).
    pub fn after_idle(mut self, idle: Duration) -> Self {
        if let Control::Window {
            growth: Growth::Cubic(cubic),
            ..
        } = &mut self.control
        {
            cubic.idle(idle.as_nanos());
        }
        self
    }
}

#[derive(Debug)]
pub(crate) struct Connection {
    pub flow: usize,
    data_link: usize,
    ack_link: usize,
    segments: u32,
    mss: u32,
    last_payload: u32,
    header_bytes: u64,
    ack_bytes: u64,
    min_rto_ns: u64,
    max_rto_ns: u64,
    control: Control,
    // Sender.
    state: Vec<Segment>,
    latest_transmission: Vec<u64>,
    next_new: u32,
    acked_below: u32,
    acked_count: u32,
    in_flight: u32,
    retransmit: VecDeque<u32>,
    /// Transmissions not yet ACKed or deemed lost, in order (stale entries
    /// are skipped when they reach the front).
    outstanding: VecDeque<(u64, u32)>,
    next_transmission: u64,
    highest_acked_transmission: Option<u64>,
    srtt_ns: Option<f64>,
    rttvar_ns: f64,
    rto_ns: u64,
    backoff: u64,
    rto_deadline_ns: Option<u64>,
    /// The time of this connection's live timer entry in the queue.
    pub timer_armed_ns: Option<u64>,
    pub packets_sent: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    // Receiver.
    received: Vec<bool>,
    received_below: u32,
    received_count: u32,
    pub completed_ns: Option<u64>,
    /// quinn's pacer, for its Cubic.
    pacer: Option<Pacer>,
}

/// quinn 0.11's pacer (`quinn-proto`'s `connection/pacing.rs`), in
/// segments: a token bucket filled at 1.25 windows per smoothed RTT, its
/// capacity the window's share of 2 ms (10 to 256 segments); once empty,
/// it waits until it is full again. No pacing before the first RTT sample.
#[derive(Debug, Clone, Default)]
struct Pacer {
    capacity: f64,
    tokens: f64,
    window: f64,
    prev_ns: u64,
    /// When the bucket is full again, while it holds the sender back.
    next_ns: Option<u64>,
}

impl Pacer {
    /// Whether a segment may go at `now_ns`; if not, `next_ns` says when.
    fn allows(&mut self, window: f64, srtt_ns: f64, now_ns: u64) -> bool {
        if srtt_ns <= 0.0 {
            return true;
        }
        if window != self.window {
            self.fit(window, srtt_ns);
        }
        if self.tokens < 1.0 {
            let elapsed = now_ns.saturating_sub(self.prev_ns) as f64;
            self.tokens = (self.tokens + window * 1.25 * elapsed / srtt_ns).min(self.capacity);
            self.prev_ns = now_ns;
        }
        if self.tokens >= 1.0 {
            self.next_ns = None;
            return true;
        }
        let wait = (self.capacity - self.tokens) * srtt_ns / (window * 1.25);
        self.next_ns = Some(now_ns.saturating_add(wait.ceil().max(1.0) as u64));
        false
    }

    /// The capacity for `window` at `srtt_ns`, the tokens within it.
    fn fit(&mut self, window: f64, srtt_ns: f64) {
        if srtt_ns > 0.0 {
            self.capacity = (window * 2e6 / srtt_ns).clamp(10.0, 256.0);
        }
        self.tokens = self.tokens.min(self.capacity);
        self.window = window;
    }

    fn sent(&mut self) {
        self.tokens -= 1.0;
    }

    /// A transfer starts at `now_ns` after idle, with `window` at
    /// `srtt_ns`: the bucket has refilled.
    fn refill(&mut self, window: f64, srtt_ns: f64, now_ns: u64) {
        self.fit(window, srtt_ns);
        self.tokens = self.capacity;
        self.prev_ns = now_ns;
        self.next_ns = None;
    }
}

impl Connection {
    /// A connection that will move `bytes` (≥ 1) from the end of `data_link`
    /// to the other, ACKs coming back on `ack_link`, starting at `now_ns`.
    pub fn new(
        flow: usize,
        data_link: usize,
        ack_link: usize,
        bytes: u64,
        tcp: &TcpParams,
        control: Control,
        segments: u32,
    ) -> Self {
        let mss = tcp.mss_bytes;
        let paced = control.is_quinns();
        let last_payload = (bytes - u64::from(segments - 1) * u64::from(mss)) as u32;
        let n = segments as usize;
        Self {
            flow,
            data_link,
            ack_link,
            segments,
            mss,
            last_payload,
            header_bytes: u64::from(tcp.header_bytes),
            ack_bytes: u64::from(tcp.ack_bytes),
            min_rto_ns: tcp.min_rto.as_nanos(),
            max_rto_ns: tcp.max_rto.as_nanos().max(tcp.min_rto.as_nanos()),
            control,
            state: vec![Segment::Unsent; n],
            latest_transmission: vec![0; n],
            next_new: 0,
            acked_below: 0,
            acked_count: 0,
            in_flight: 0,
            retransmit: VecDeque::new(),
            outstanding: VecDeque::new(),
            next_transmission: 0,
            highest_acked_transmission: None,
            srtt_ns: None,
            rttvar_ns: 0.0,
            rto_ns: tcp.initial_rto.as_nanos().max(1),
            backoff: 1,
            rto_deadline_ns: None,
            timer_armed_ns: None,
            packets_sent: 0,
            retransmits: 0,
            timeouts: 0,
            received: vec![false; n],
            received_below: 0,
            received_count: 0,
            completed_ns: None,
            pacer: paced.then(|| Pacer {
                tokens: 10.0,
                capacity: 10.0,
                ..Pacer::default()
            }),
        }
    }

    /// A windowed sender at its initial window, in slow start.
    pub fn window(tcp: &TcpParams, growth: Growth) -> Control {
        Control::Window {
            cwnd: f64::from(tcp.initial_window),
            ssthresh: f64::INFINITY,
            recovery_end: 0,
            growth,
        }
    }

    /// What the connection carries to its next transfer, at `now_ns`.
    pub fn warm(&self, sender: super::SenderModel, now_ns: u64) -> WarmConnection {
        let mut control = self.control.clone();
        if let Control::Window {
            growth,
            recovery_end,
            ..
        } = &mut control
        {
            if let Growth::Cubic(cubic) = growth {
                cubic.suspend(now_ns);
            }
            // The next transfer numbers its transmissions from 0.
            *recovery_end = 0;
        }
        WarmConnection {
            sender,
            control,
            srtt_ns: self.srtt_ns,
            rttvar_ns: self.rttvar_ns,
            rto_ns: self.rto_ns,
        }
    }

    /// Takes up `warm`'s state in place of a new connection's, before
    /// [`Connection::start`] at `now_ns`.
    pub fn resume(&mut self, warm: &WarmConnection, now_ns: u64) {
        let mut control = warm.control.clone();
        match &mut control {
            Control::Window {
                growth: Growth::Cubic(cubic),
                ..
            } => cubic.resume(now_ns),
            Control::Window { .. } => {}
            // A paced sender keeps its own schedule.
            Control::Paced { .. } => return,
        }
        self.control = control;
        self.srtt_ns = warm.srtt_ns;
        self.rttvar_ns = warm.rttvar_ns;
        self.rto_ns = warm.rto_ns;
        if let (Some(pacer), Control::Window { cwnd, .. }) = (&mut self.pacer, &self.control) {
            pacer.refill(*cwnd, warm.srtt_ns.unwrap_or(0.0), now_ns);
        }
    }

    /// Payload bytes the receiver holds.
    pub fn received_bytes(&self) -> u64 {
        let full = u64::from(self.received_count) * u64::from(self.mss);
        if self.segments > 0 && self.received[self.segments as usize - 1] {
            full - u64::from(self.mss) + u64::from(self.last_payload)
        } else {
            full
        }
    }

    fn segment_payload(&self, segment: u32) -> u64 {
        if segment + 1 == self.segments {
            u64::from(self.last_payload)
        } else {
            u64::from(self.mss)
        }
    }

    fn sender_done(&self) -> bool {
        self.acked_count == self.segments
    }

    /// Starts sending at the fabric's current time.
    pub fn start(&mut self, index: u32, fabric: &mut Fabric) {
        let now = fabric.now_ns();
        if let Control::Paced { next_send_ns, .. } = &mut self.control {
            *next_send_ns = now;
        }
        self.try_send(index, fabric);
        self.rearm(index, fabric);
    }

    /// The timer entry at `at_ns` is the live one.
    pub fn timer_live(&self, at_ns: u64) -> bool {
        self.timer_armed_ns == Some(at_ns)
    }

    pub fn on_timer(&mut self, index: u32, fabric: &mut Fabric) {
        self.timer_armed_ns = None;
        let now = fabric.now_ns();
        if self.in_flight > 0 && self.rto_deadline_ns.is_some_and(|t| t <= now) {
            self.on_timeout(now);
        }
        self.try_send(index, fabric);
        self.rearm(index, fabric);
    }

    /// A retransmission timeout: everything in flight is deemed lost, the
    /// window collapses to one segment, the timer backs off.
    fn on_timeout(&mut self, now: u64) {
        self.timeouts += 1;
        let flight = f64::from(self.in_flight);
        while let Some((transmission, segment)) = self.outstanding.pop_front() {
            let s = segment as usize;
            if self.state[s] == Segment::InFlight && self.latest_transmission[s] == transmission {
                self.state[s] = Segment::Lost;
                self.retransmit.push_back(segment);
            }
        }
        self.in_flight = 0;
        if let Control::Window {
            cwnd,
            ssthresh,
            recovery_end,
            growth,
        } = &mut self.control
        {
            *ssthresh = match growth {
                Growth::Reno => (flight / 2.0).max(2.0),
                Growth::Cubic(cubic) => cubic.on_timeout(flight),
            };
            *cwnd = 1.0;
            *recovery_end = self.next_transmission;
        }
        self.backoff = (self.backoff * 2).min(64);
        self.rto_deadline_ns = Some(now.saturating_add(self.current_rto()));
    }

    fn current_rto(&self) -> u64 {
        self.rto_ns
            .saturating_mul(self.backoff)
            .clamp(self.min_rto_ns, self.max_rto_ns)
    }

    fn rearm(&mut self, index: u32, fabric: &mut Fabric) {
        if self.sender_done() {
            return;
        }
        let mut wake = None;
        if self.in_flight > 0 {
            wake = self.rto_deadline_ns;
        }
        if let Control::Paced { next_send_ns, .. } = self.control
            && self.has_something_to_send()
        {
            wake = Some(wake.map_or(next_send_ns, |t: u64| t.min(next_send_ns)));
        }
        // A pacer's wake-up in the past is stale: the window, not the
        // pacer, holds the sender back, and an ACK will move it.
        if let Some(next) = self.pacer.as_ref().and_then(|p| p.next_ns)
            && next > fabric.now_ns()
            && self.has_something_to_send()
        {
            wake = Some(wake.map_or(next, |t: u64| t.min(next)));
        }
        if let Some(at) = wake {
            let mut armed = self.timer_armed_ns;
            fabric.arm_timer(index, at.max(fabric.now_ns()), &mut armed);
            self.timer_armed_ns = armed;
        }
    }

    fn has_something_to_send(&mut self) -> bool {
        while let Some(&segment) = self.retransmit.front() {
            if self.state[segment as usize] == Segment::Lost {
                return true;
            }
            self.retransmit.pop_front();
        }
        self.next_new < self.segments
    }

    /// The next segment to put on the wire: a lost one first, else a new one.
    fn pick(&mut self) -> Option<u32> {
        if !self.has_something_to_send() {
            return None;
        }
        if let Some(segment) = self.retransmit.pop_front() {
            self.retransmits += 1;
            return Some(segment);
        }
        let segment = self.next_new;
        self.next_new += 1;
        Some(segment)
    }

    fn transmit(&mut self, index: u32, segment: u32, fabric: &mut Fabric) {
        let now = fabric.now_ns();
        let transmission = self.next_transmission;
        self.next_transmission += 1;
        let s = segment as usize;
        self.state[s] = Segment::InFlight;
        self.latest_transmission[s] = transmission;
        self.in_flight += 1;
        self.outstanding.push_back((transmission, segment));
        self.packets_sent += 1;
        if self.rto_deadline_ns.is_none() {
            self.rto_deadline_ns = Some(now.saturating_add(self.current_rto()));
        }
        let bytes = self.segment_payload(segment) + self.header_bytes;
        fabric.send(
            self.data_link,
            index,
            Payload::Data {
                segment,
                transmission,
                sent_ns: now,
            },
            bytes,
        );
    }

    fn try_send(&mut self, index: u32, fabric: &mut Fabric) {
        let now = fabric.now_ns();
        match self.control {
            Control::Window { cwnd, .. } => {
                let window = cwnd.max(1.0) as u32;
                let srtt_ns = self.srtt_ns.unwrap_or(0.0);
                while self.in_flight < window {
                    if let Some(pacer) = &mut self.pacer
                        && !pacer.allows(cwnd.max(1.0), srtt_ns, now)
                    {
                        break;
                    }
                    let Some(segment) = self.pick() else { break };
                    self.transmit(index, segment, fabric);
                    if let Some(pacer) = &mut self.pacer {
                        pacer.sent();
                    }
                }
            }
            Control::Paced {
                interval_ns,
                next_send_ns,
            } => {
                if next_send_ns <= now
                    && let Some(segment) = self.pick()
                {
                    self.transmit(index, segment, fabric);
                    if let Control::Paced { next_send_ns, .. } = &mut self.control {
                        // From the scheduled time, not from `now`, so the
                        // rate holds whatever the order of events at a tick.
                        *next_send_ns = next_send_ns.saturating_add(interval_ns).max(now);
                    }
                }
            }
        }
    }

    /// A data segment arrives at the receiver: record it, ACK it.
    pub fn on_data(
        &mut self,
        index: u32,
        segment: u32,
        transmission: u64,
        sent_ns: u64,
        fabric: &mut Fabric,
    ) {
        let s = segment as usize;
        if s < self.received.len() && !self.received[s] {
            self.received[s] = true;
            self.received_count += 1;
            while (self.received_below as usize) < self.received.len()
                && self.received[self.received_below as usize]
            {
                self.received_below += 1;
            }
            if self.received_count == self.segments {
                self.completed_ns = Some(fabric.now_ns());
            }
        }
        fabric.send(
            self.ack_link,
            index,
            Payload::Ack {
                segment,
                transmission,
                echo_ns: sent_ns,
                cumulative: self.received_below,
            },
            self.ack_bytes,
        );
    }

    fn mark_acked(&mut self, segment: u32) -> bool {
        let s = segment as usize;
        match self.state.get(s) {
            Some(Segment::InFlight) => self.in_flight -= 1,
            Some(Segment::Lost) | Some(Segment::Unsent) => {}
            Some(Segment::Acked) | None => return false,
        }
        self.state[s] = Segment::Acked;
        self.acked_count += 1;
        true
    }

    /// RFC 6298's estimator, in nanoseconds.
    fn sample_rtt(&mut self, sample_ns: f64) {
        match self.srtt_ns {
            None => {
                self.srtt_ns = Some(sample_ns);
                self.rttvar_ns = sample_ns / 2.0;
            }
            Some(srtt) => {
                self.rttvar_ns = 0.75 * self.rttvar_ns + 0.25 * (srtt - sample_ns).abs();
                self.srtt_ns = Some(0.875 * srtt + 0.125 * sample_ns);
            }
        }
        let srtt = self.srtt_ns.unwrap_or(sample_ns);
        self.rto_ns = (srtt + 4.0 * self.rttvar_ns).max(1.0) as u64;
    }

    /// An ACK arrives at the sender.
    pub fn on_ack(
        &mut self,
        index: u32,
        segment: u32,
        transmission: u64,
        echo_ns: u64,
        cumulative: u32,
        fabric: &mut Fabric,
    ) {
        if self.sender_done() {
            return;
        }
        let now = fabric.now_ns();
        self.sample_rtt(now.saturating_sub(echo_ns) as f64);
        self.highest_acked_transmission = Some(
            self.highest_acked_transmission
                .map_or(transmission, |t| t.max(transmission)),
        );
        let mut newly_acked = u32::from(self.mark_acked(segment));
        let cumulative = cumulative.min(self.segments);
        while self.acked_below < cumulative {
            newly_acked += u32::from(self.mark_acked(self.acked_below));
            self.acked_below += 1;
        }
        while (self.acked_below as usize) < self.state.len()
            && self.state[self.acked_below as usize] == Segment::Acked
        {
            self.acked_below += 1;
        }

        // Loss detection: a transmission with three later ones ACKed.
        let highest = self.highest_acked_transmission.unwrap_or(0);
        let mut lost_window_start = None;
        while let Some(&(sent, segment)) = self.outstanding.front() {
            let s = segment as usize;
            let live = self.state[s] == Segment::InFlight && self.latest_transmission[s] == sent;
            if !live {
                self.outstanding.pop_front();
                continue;
            }
            if sent + DUPLICATE_THRESHOLD > highest {
                break;
            }
            self.outstanding.pop_front();
            self.state[s] = Segment::Lost;
            self.in_flight -= 1;
            self.retransmit.push_back(segment);
            lost_window_start.get_or_insert(sent);
        }

        let srtt_ns = self.srtt_ns.unwrap_or(0.0);
        // quinn grows no window on an ACK while the connection is
        // application-limited: here, with every segment sent and nothing
        // to retransmit (the transfer's tail).
        let quinns_idle = self.control.is_quinns() && !self.has_something_to_send();
        if let Control::Window {
            cwnd,
            ssthresh,
            recovery_end,
            growth,
        } = &mut self.control
        {
            if let Some(lost) = lost_window_start
                && lost >= *recovery_end
            {
                // Reduce once per window: the first loss of transmissions
                // sent after the last reduction.
                *ssthresh = match growth {
                    Growth::Reno => (*cwnd / 2.0).max(2.0),
                    Growth::Cubic(cubic) => cubic.on_congestion(*cwnd, now),
                };
                *cwnd = *ssthresh;
                *recovery_end = self.next_transmission;
            } else if transmission >= *recovery_end && !quinns_idle {
                for _ in 0..newly_acked {
                    if *cwnd < *ssthresh {
                        *cwnd += 1.0;
                    } else {
                        match growth {
                            Growth::Reno => *cwnd += 1.0 / *cwnd,
                            Growth::Cubic(cubic) => *cwnd = cubic.grow(*cwnd, now, srtt_ns),
                        }
                    }
                }
            }
        }

        if newly_acked > 0 {
            self.backoff = 1;
            self.rto_deadline_ns = Some(now.saturating_add(self.current_rto()));
        }
        if self.sender_done() {
            self.rto_deadline_ns = None;
            return;
        }
        self.try_send(index, fabric);
        self.rearm(index, fabric);
    }
}
