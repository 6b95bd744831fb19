//! longhaul's test kit: what tests of more than one piece share, kept out of
//! the production crates (the daemons never link it).
//!
//! - [`free_addr`]: loopback ports below the ephemeral range.
//! - [`eventually`]: a bounded retry.
//! - [`seed`]: a test's seed from `LONGHAUL_SEED`, printed so it replays.
//! - [`TestCa`]: a certificate authority made for one test.
//! - [`replicas`]: coordinator replica configs with fast timers, clients.
//! - [`faults`]: seeded fault rules on raft messages (`Faults`), judged by
//!   the real gRPC transport and by the virtual-time network alike.
//! - [`cluster`]: one cluster abstraction (`FaultCluster`) over the
//!   virtual-time cluster and replicas over real gRPC; [`scenarios`]: fault
//!   scenarios written once over it.
//! - [`KillOnDrop`]: child processes that cannot outlive the test (the one
//!   helper the rehearsal uses too, from the coordinator crate).
//!
//! Helpers panic on failure, as test helpers do.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

mod ca;
pub mod cluster;
mod ports;
pub mod replicas;
pub mod scenarios;
mod wait;

pub use ca::TestCa;
pub use longhaul_coordinator::consensus::faults;
pub use longhaul_coordinator::process::{KillOnDrop, append_log};
pub use ports::free_addr;
pub use replicas::{client, fast_node, leader_of, replica_configs, small_job};
pub use wait::eventually;

/// The seed of a seeded test: `LONGHAUL_SEED` if set, else `default`;
/// printed with the way to replay it.
pub fn seed(test: &str, default: u64) -> u64 {
    let seed = std::env::var("LONGHAUL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("{test}: seed {seed} (replay with LONGHAUL_SEED={seed})");
    seed
}
