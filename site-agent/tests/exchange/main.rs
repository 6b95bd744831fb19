//! The data plane over real QUIC on loopback, mTLS with a test CA's site
//! certificates. One binary.
//!
//! Modules:
//! - `collective`: three sites exchange a fragment and every hash is the
//!   in-memory reference's; an excluded site is left out and the average
//!   re-weighted;
//! - `faults`: a peer that never comes up is reported and the round goes
//!   on without it; a sender killed mid-fragment and restarted resumes
//!   without the receiver getting anything it held; corrupted messages are
//!   refused and never reach the sum; a refused stream leaves the pooled
//!   connection to the peer's other streams; a fragment tried again under
//!   the same plan resumes, with a peer that came up late;
//! - `emulated`: through the emulator's UDP proxy, a link cut mid-fragment
//!   and healed: the connections die and come back, and nothing the
//!   receiver held is sent to it again; the dedicated-link controller
//!   carries a fragment through 2 % random loss.
//!
//! - `catchup`: the catch-up transfer over mTLS: only the certificate of
//!   the site a request names fetches the state.
//!
//! No timing assertions: every await is bounded, and seeds are printed.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

mod catchup;
mod collective;
mod emulated;
mod faults;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use longhaul_core::rng::SeedRng;
use longhaul_exchange::{CollectivePlan, Contributor, LinkCodecs, reduce_in_memory};
use longhaul_site_agent::exchange::{
    ExchangeNode, ExchangeOptions, ExchangeOutcome, FragmentRequest,
};

#[path = "../support/pki.rs"]
mod pki;
pub use pki::Pki;

pub const JOB: &str = "job-1";

/// Options for loopback on a loaded machine: a pool of 3, short timeouts.
pub fn options(incarnation: u64) -> ExchangeOptions {
    ExchangeOptions {
        connections_per_peer: 3,
        link_rate_bits_per_second: 1_000_000_000,
        link_rtt: Duration::from_millis(1),
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        keep_alive_interval: Duration::from_secs(1),
        peer_timeout: Duration::from_secs(20),
        reconnect_backoff: Duration::from_millis(50),
        incarnation: Some(incarnation),
        ..ExchangeOptions::default()
    }
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Seeded fragments, one per site; `scale` per site.
pub fn fragments(seed: u64, sites: &[(&str, f32)], n: usize) -> BTreeMap<String, Vec<f32>> {
    println!("fragments: seed {seed}, {n} elements");
    let mut rng = SeedRng::new(seed);
    sites
        .iter()
        .map(|(site, scale)| {
            let values = (0..n)
                .map(|_| (rng.uniform(-1.0, 1.0) as f32) * scale)
                .collect();
            (site.to_string(), values)
        })
        .collect()
}

/// The hash every live site must report.
pub fn reference_hash(
    plan: &CollectivePlan,
    codecs: &LinkCodecs,
    fragments: &BTreeMap<String, Vec<f32>>,
) -> String {
    longhaul_codec::fragment_hash(&reduce_in_memory(plan, codecs, fragments).unwrap())
}

/// Runs `node`'s part of fragment 0 with a fresh contributor.
pub async fn run(
    node: &ExchangeNode,
    plan: &CollectivePlan,
    codecs: &LinkCodecs,
    values: &[f32],
    peers: &BTreeMap<String, SocketAddr>,
    deadline: Duration,
) -> ExchangeOutcome {
    run_fragment(node, (plan, codecs, 0), values, peers, deadline).await
}

/// [`run`] for `fragment` of round 1.
pub async fn run_fragment(
    node: &ExchangeNode,
    (plan, codecs, fragment): (&CollectivePlan, &LinkCodecs, u32),
    values: &[f32],
    peers: &BTreeMap<String, SocketAddr>,
    deadline: Duration,
) -> ExchangeOutcome {
    let mut contributor = Contributor::new(plan.elements());
    let request = FragmentRequest {
        job: JOB,
        round: 1,
        fragment,
        plan,
        codecs,
        contributor: &mut contributor,
        values,
        peers,
        deadline,
    };
    bounded(deadline.as_secs() + 30, node.exchange(request))
        .await
        .unwrap()
}

/// Fails a test that would otherwise hang.
pub async fn bounded<F: Future>(seconds: u64, future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(seconds), future)
        .await
        .expect("test took too long")
}
