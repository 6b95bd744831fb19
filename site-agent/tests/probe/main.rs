//! Link probes over real QUIC on loopback, with certificates made by a test
//! CA. One binary.
//!
//! Modules:
//! - `mtls`: a probe between two sites; certificates naming the wrong site
//!   or signed by another CA are refused, with errors that say so; PEM files
//!   are checked at load; insecure local mode works and warns;
//! - `hostile`: clients that lie about their site, send malformed frames or
//!   streams, overstay or exceed the server's limits;
//! - `emulated`: RTT, loss and throughput through the emulator's UDP proxy,
//!   against the link's configured delay, loss and rate;
//! - `scheduler`: rounds on start and on demand, reports, failures, metrics.
//!
//! Timing checks have a hard lower bound (the emulated delay) and a generous
//! upper bound for a slow shared machine. Every test that runs a probe takes
//! the `timing` lock, so that no throughput test steals the CPU from a test
//! that measures time.

// clippy's allow-unwrap-in-tests does not reach through #[tokio::test] and
// helpers; a failed unwrap is how a test fails.
#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

mod emulated;
mod hostile;
mod mtls;
mod scheduler;

use std::net::SocketAddr;
use std::time::Duration;

use longhaul_site_agent::probe::{ProbeOptions, ProbeServer, ProbeServerOptions};
use longhaul_site_agent::tls::AgentTls;

#[path = "../support/pki.rs"]
mod pki;
pub use pki::{Leaf, Pki};

static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serialises the tests that measure time.
pub async fn timing() -> tokio::sync::MutexGuard<'static, ()> {
    TIMING.lock().await
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A probe server for `tls`'s site on loopback.
pub async fn server(tls: &AgentTls, options: ProbeServerOptions) -> ProbeServer {
    ProbeServer::bind(loopback(), tls, options).await.unwrap()
}

/// Probe options small enough for tests: 10 pings, 200 loss datagrams at
/// 2000/s, 300 ms of throughput on 4 streams, 30 s timeout.
pub fn quick_options(seed: u64) -> ProbeOptions {
    ProbeOptions {
        pings: 10,
        ping_interval: Duration::from_millis(5),
        loss_datagrams: 200,
        loss_rate_pps: 2000,
        throughput_duration: Duration::from_millis(300),
        throughput_streams: 4,
        timeout: Duration::from_secs(30),
        seed,
        ..ProbeOptions::default()
    }
}

/// Fails a test that would otherwise hang.
pub async fn bounded<F: Future>(seconds: u64, future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(seconds), future)
        .await
        .expect("test took too long")
}
