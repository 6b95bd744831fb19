//! The sans-IO network link model shared by the emulator and the simulator.
//!
//! A [`Link`] is one direction of one link, a state machine in virtual time:
//! the caller passes `now` (integer nanoseconds since the link's origin) into
//! every call, and all randomness comes from a ChaCha8 generator keyed by the
//! seed given to [`Link::new`]. The same configuration, seed and calls give
//! bit-identical fates. Nothing here reads a clock, sleeps or touches a
//! socket: a real-time proxy maps wall-clock time to `now` and sleeps until
//! [`Link::next_wakeup`]; a discrete-event simulator jumps to it.
//!
//! # The model
//!
//! A packet sent at `now` goes through, in order:
//!
//! 1. **Down**: dropped ([`DropCause::Down`]) while the link is down by hand
//!    ([`Link::set_down`]) or inside a configured outage.
//! 2. **Egress buffer**, limited in bytes (default one bandwidth-delay
//!    product). A packet occupies it from admission until its last bit has
//!    been serialised. Drop-tail: a packet is dropped ([`DropCause::Queue`])
//!    if `backlog + bytes > buffer`. With an ECN threshold K, a packet with
//!    `backlog + bytes > K` is marked if ECN-capable and dropped if not.
//! 3. **Serialisation**, FIFO, at the rate in force when the first bit goes
//!    out, over `bytes + per_packet_overhead`; or on a mahimahi trace.
//! 4. **Loss on the wire** (Bernoulli, Gilbert-Elliott, or a trace of packet
//!    indices): a lost packet has used its buffer space and line time.
//! 5. **Propagation**: `distance × fibre_delay_per_km + overhead`.
//! 6. **Jitter**, uniform in `[0, max]`, either keeping FIFO order or letting
//!    packets overtake; then **duplication** of delivered packets (the copy
//!    takes no line time and gets its own jitter draw).
//!
//! # Rounding rules (all times are `u64` nanoseconds)
//!
//! - serialisation = `ceil((bytes + per_packet_overhead) × 8 × 10⁹ / rate)`;
//! - propagation = `round(distance_km × fibre_delay_per_km_ns)`, halves away
//!   from zero;
//! - delivery = `start + serialisation + propagation + overhead (+ jitter)`,
//!   with `start = max(now, previous packet's finish)`, so the queueing delay
//!   is `start - now`, exact;
//! - the default buffer is `floor(rate × RTT / 8)` bytes, at least 1500.
//!
//! Fates are decided when a packet is sent: later changes (down, rate, loss)
//! apply to later packets. Time never goes backwards: a `now` earlier than
//! one already seen is taken as the latest seen.

mod capacity;
mod config;
mod loss;
mod model;
mod rng;

pub use config::{
    DeliveryTrace, Jitter, JitterMode, LinkConfig, LinkConfigError, LossModel,
    MAHIMAHI_OPPORTUNITY_BYTES, MIN_DEFAULT_BUFFER_BYTES, Outage, RateChange,
};
pub use model::{Delivery, DropCause, DropCounts, Fate, Link, LinkStats};

/// Both directions between two endpoints, with their own seeds.
#[derive(Debug, Clone)]
pub struct DuplexLink {
    pub a_to_b: Link,
    pub b_to_a: Link,
}

impl DuplexLink {
    /// Two directions from one configuration. The reverse direction's seed is
    /// `seed ^ 0x9E37_79B9_7F4A_7C15` so the directions draw independently.
    pub fn symmetric(config: LinkConfig, seed: u64) -> Result<Self, LinkConfigError> {
        Ok(Self {
            a_to_b: Link::new(config.clone(), seed)?,
            b_to_a: Link::new(config, seed ^ 0x9E37_79B9_7F4A_7C15)?,
        })
    }

    /// Cuts both directions (see [`partition`]).
    pub fn partition(&mut self, now_ns: u64) {
        partition([&mut self.a_to_b, &mut self.b_to_a], now_ns);
    }

    pub fn heal(&mut self, now_ns: u64) {
        heal([&mut self.a_to_b, &mut self.b_to_a], now_ns);
    }
}

/// Takes every link down at `now_ns`, e.g. all links of a site to isolate it.
pub fn partition<'a>(links: impl IntoIterator<Item = &'a mut Link>, now_ns: u64) {
    for link in links {
        link.set_down(now_ns);
    }
}

/// Brings every link back up at `now_ns`.
pub fn heal<'a>(links: impl IntoIterator<Item = &'a mut Link>, now_ns: u64) {
    for link in links {
        link.set_up(now_ns);
    }
}
