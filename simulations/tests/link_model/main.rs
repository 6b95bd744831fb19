//! Tests of the sans-IO link model, one binary.
//!
//! Modules:
//! - `delay`: exact delivery times, hand-computed and against an oracle;
//! - `queue`: drop-tail, default buffer, ECN marking;
//! - `loss`: Bernoulli, Gilbert-Elliott and trace loss;
//! - `jitter`: FIFO and reordering jitter, duplication;
//! - `capacity`: throughput, rate schedules, mahimahi traces;
//! - `outage`: down/up, scheduled outages, partitions;
//! - `determinism`: seeds;
//! - `config`: validation messages and TOML.
//!
//! Statistical tests use fixed seeds and bounds of 5 standard errors, so
//! they are deterministic and would fail by chance about once in 1.7 million
//! seeds.

mod capacity;
mod config;
mod delay;
mod determinism;
mod jitter;
mod loss;
mod outage;
mod queue;

use longhaul_core::units::{ByteSize, DataRate, Distance};
use longhaul_simulations::link::{Delivery, Fate, Link, LinkConfig};

/// A loss-free link of `bits_per_second` over `km` of fibre.
pub fn config(bits_per_second: u64, km: f64) -> LinkConfig {
    LinkConfig::new(
        DataRate::from_bits_per_second(bits_per_second),
        Distance::from_km(km).expect("valid distance"),
    )
}

/// A link with a buffer so large nothing is dropped by the queue.
pub fn unbounded(mut config: LinkConfig) -> LinkConfig {
    config.buffer = Some(ByteSize::from_bytes(u64::MAX / 4));
    config
}

/// One packet offered to a link.
#[derive(Debug, Clone, Copy)]
pub struct Send {
    pub at_ns: u64,
    pub bytes: u64,
    pub ecn_capable: bool,
}

/// `count` packets of `bytes`, one every `gap_ns` from 0.
pub fn train(count: u64, gap_ns: u64, bytes: u64) -> Vec<Send> {
    (0..count)
        .map(|i| Send {
            at_ns: i * gap_ns,
            bytes,
            ecn_capable: false,
        })
        .collect()
}

/// Sends every packet (ids 0, 1, ...), polling deliveries as time advances
/// and draining the link at the end. Returns the fates and the deliveries in
/// the order they came out.
pub fn drive(link: &mut Link, sends: &[Send]) -> (Vec<Fate>, Vec<Delivery>) {
    let mut fates = Vec::with_capacity(sends.len());
    let mut deliveries = Vec::new();
    for (id, send) in sends.iter().enumerate() {
        while let Some(delivery) = link.poll_delivery(send.at_ns) {
            deliveries.push(delivery);
        }
        fates.push(link.handle_send(send.at_ns, id as u64, send.bytes, send.ecn_capable));
    }
    while let Some(wakeup) = link.next_wakeup() {
        while let Some(delivery) = link.poll_delivery(wakeup) {
            deliveries.push(delivery);
        }
    }
    (fates, deliveries)
}

/// The delivery time of a delivered fate.
pub fn delivered_at(fate: &Fate) -> Option<u64> {
    match fate {
        Fate::Delivered { at_ns, .. } => Some(*at_ns),
        Fate::Dropped { .. } => None,
    }
}

/// Asserts that `observed` is within `sigmas` standard errors of `expected`.
pub fn assert_within(observed: f64, expected: f64, standard_error: f64, sigmas: f64, what: &str) {
    let bound = sigmas * standard_error;
    assert!(
        (observed - expected).abs() <= bound,
        "{what}: observed {observed}, expected {expected} ± {bound} ({sigmas} × {standard_error})"
    );
}
