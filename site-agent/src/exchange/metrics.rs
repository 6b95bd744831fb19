//! Prometheus metrics of the exchange, per peer, through the `metrics`
//! facade (the agent binary installs the exporter). Recorded once per
//! fragment exchanged, from its [`super::ExchangeOutcome`].
//!
//! | name | type | labels |
//! |------|------|--------|
//! | `longhaul_agent_exchange_bytes_total` | counter | `peer`, `direction` (`sent`, `resent`, `received`, `duplicate`) |
//! | `longhaul_agent_exchange_refused_total` | counter | `peer` |
//! | `longhaul_agent_exchange_connections_total` | counter | `peer`, `event` (`welcomed`: streams on the pool's connections, `lost`, `handshake`: new connections) |
//! | `longhaul_agent_exchange_goodput_bytes_per_second` | gauge | `peer`: bytes taken from it / the exchange's time |
//! | `longhaul_agent_exchange_fragments_total` | counter | `outcome` (`ok`, `unfinished`) |
//! | `longhaul_agent_exchange_rtt_seconds` | gauge | `peer`: the least smoothed RTT over the pool |
//! | `longhaul_agent_exchange_congestion_window_bytes` | gauge | `peer`: summed over the pool |
//! | `longhaul_agent_exchange_lost_packets_total` | counter | `peer`: QUIC packets declared lost |
//!
//! The last three come from quinn's path statistics of the pool's live
//! connections, sampled by [`PathSampler`]; help texts are in
//! [`crate::metrics::TABLE`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use metrics::{counter, gauge};

use super::ExchangeOutcome;

pub const BYTES_TOTAL: &str = "longhaul_agent_exchange_bytes_total";
pub const REFUSED_TOTAL: &str = "longhaul_agent_exchange_refused_total";
pub const CONNECTIONS_TOTAL: &str = "longhaul_agent_exchange_connections_total";
pub const GOODPUT: &str = "longhaul_agent_exchange_goodput_bytes_per_second";
pub const RTT_SECONDS: &str = "longhaul_agent_exchange_rtt_seconds";
pub const CONGESTION_WINDOW: &str = "longhaul_agent_exchange_congestion_window_bytes";
pub const LOST_PACKETS_TOTAL: &str = "longhaul_agent_exchange_lost_packets_total";
pub const FRAGMENTS_TOTAL: &str = "longhaul_agent_exchange_fragments_total";

pub(crate) fn record(outcome: &ExchangeOutcome) {
    for (peer, report) in &outcome.peers {
        let peer = peer.clone();
        for (direction, bytes) in [
            ("sent", report.sent_bytes),
            ("resent", report.resent_bytes),
            ("received", report.received_bytes),
            ("duplicate", report.duplicate_bytes),
        ] {
            counter!(BYTES_TOTAL, "peer" => peer.clone(), "direction" => direction)
                .increment(bytes);
        }
        counter!(REFUSED_TOTAL, "peer" => peer.clone()).increment(report.refused);
        counter!(CONNECTIONS_TOTAL, "peer" => peer.clone(), "event" => "welcomed")
            .increment(report.connections);
        counter!(CONNECTIONS_TOTAL, "peer" => peer.clone(), "event" => "handshake")
            .increment(report.handshakes);
        counter!(CONNECTIONS_TOTAL, "peer" => peer.clone(), "event" => "lost")
            .increment(report.connections_lost);
        let seconds = outcome.elapsed.as_secs_f64();
        if seconds > 0.0 {
            gauge!(GOODPUT, "peer" => peer).set(report.received_bytes as f64 / seconds);
        }
    }
    let result = if outcome.hash.is_some() {
        "ok"
    } else {
        "unfinished"
    };
    counter!(FRAGMENTS_TOTAL, "outcome" => result).increment(1);
}

/// Turns samples of the pool's path statistics into the per-peer RTT,
/// congestion-window and lost-packet metrics. Losses are counted as the
/// growth of each connection's total since the last sample, by (address,
/// slot): a new connection in a slot counts from zero when its total is
/// below the old one's, else from the old one's (an undercount, never a
/// double count); connections to an address that is no known peer's are
/// left out of the metrics, so labels stay the topology's sites.
#[derive(Debug, Default)]
pub struct PathSampler {
    lost: HashMap<(SocketAddr, u32), u64>,
}

impl PathSampler {
    /// Records one sample: `paths` as [`super::ExchangeNode::pool_paths`]
    /// gives them, `peers` the sites' data addresses.
    pub fn sample(
        &mut self,
        paths: &[(SocketAddr, u32, quinn::PathStats)],
        peers: &BTreeMap<String, SocketAddr>,
    ) {
        let sites: HashMap<SocketAddr, &str> = peers
            .iter()
            .map(|(site, addr)| (*addr, site.as_str()))
            .collect();
        let mut per_peer: BTreeMap<&str, (f64, u64, u64)> = BTreeMap::new();
        let mut lost = HashMap::with_capacity(paths.len());
        for (addr, slot, path) in paths {
            // The baseline is kept for every live connection, a peer's or
            // not, so a site that drops out of `peers` and comes back is
            // not counted again from zero.
            let before = self.lost.get(&(*addr, *slot)).copied().unwrap_or(0);
            let new_losses = path
                .lost_packets
                .checked_sub(before)
                .unwrap_or(path.lost_packets);
            lost.insert((*addr, *slot), path.lost_packets);
            let Some(&site) = sites.get(addr) else {
                continue;
            };
            let entry = per_peer.entry(site).or_insert((f64::INFINITY, 0, 0));
            entry.0 = entry.0.min(path.rtt.as_secs_f64());
            entry.1 += path.cwnd;
            entry.2 += new_losses;
        }
        self.lost = lost;
        for (site, (rtt, cwnd, losses)) in per_peer {
            gauge!(RTT_SECONDS, "peer" => site.to_string()).set(rtt);
            gauge!(CONGESTION_WINDOW, "peer" => site.to_string()).set(cwnd as f64);
            counter!(LOST_PACKETS_TOTAL, "peer" => site.to_string()).increment(losses);
        }
    }
}
