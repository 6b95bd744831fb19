//! Tests of the discrete-event tier, one binary.
//!
//! Modules:
//! - `fidelity`: against the closed forms (exact times on a free link,
//!   Mathis, N streams, drop-tail below the BDP, the paced sender at its
//!   rate, the fragment exchange);
//! - `cubic`: the Cubic sender against Reno and RFC 9438 (a loss-free link
//!   with half a BDP of buffer, random loss at a long and a short RTT,
//!   seeds);
//! - `published`: the analytic tier against INTELLECT-1's published
//!   compute utilisation in three geographic settings;
//! - `determinism`: seeds;
//! - `config`: refused configurations and bounded runs;
//! - `warm`: connections kept from one transfer to the next, and quinn's
//!   Cubic against the RFC's.
//!
//! Every run is seeded; a failing assertion prints the seed and the report.
//! The bounds hold for the fixed seeds; `LONGHAUL_SEED=n` adds n to every
//! seed, to see how far other seeds move the figures.

mod config;
mod cubic;
mod determinism;
mod fidelity;
mod published;
mod warm;

use longhaul_core::units::{ByteSize, DataRate, Distance};
use longhaul_simulations::des::{SenderModel, TransferConfig, TransferReport, transfer};
use longhaul_simulations::link::{LinkConfig, LossModel};

/// The test's fixed seed, shifted by `LONGHAUL_SEED` when it is set.
pub fn test_seed(fixed: u64) -> u64 {
    std::env::var("LONGHAUL_SEED")
        .ok()
        .and_then(|value| value.parse::<u64>().ok())
        .map_or(fixed, |shift| fixed.wrapping_add(shift))
}

/// A link of `mbit_per_second` whose propagation RTT is `rtt_ms` (fibre at
/// 5 µs/km), with Bernoulli loss `loss` in each direction.
pub fn link(mbit_per_second: u64, rtt_ms: f64, loss: f64) -> LinkConfig {
    let km = rtt_ms / 2.0 * 200.0;
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(mbit_per_second * 1_000_000),
        Distance::from_km(km).expect("a valid distance"),
    );
    if loss > 0.0 {
        config.loss = LossModel::Bernoulli { p: loss };
    }
    config
}

/// The same link with an egress buffer of `bytes`.
pub fn with_buffer(mut config: LinkConfig, bytes: u64) -> LinkConfig {
    config.buffer = Some(ByteSize::from_bytes(bytes));
    config
}

/// Runs a transfer, panicking with the seed on a refused configuration.
pub fn run(
    link: LinkConfig,
    bytes: u64,
    connections: u32,
    sender: SenderModel,
    seed: u64,
) -> TransferReport {
    let config = TransferConfig::new(link, bytes, connections, sender, seed);
    match transfer(&config) {
        Ok(report) => report,
        Err(error) => panic!("seed {seed}: {error}"),
    }
}
