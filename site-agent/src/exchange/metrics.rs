//! Prometheus metrics of the exchange, per peer, through the `metrics`
//! facade (the agent binary installs the exporter). Recorded once per
//! fragment exchanged, from its [`super::ExchangeOutcome`].
//!
//! | name | type | labels |
//! |------|------|--------|
//! | `longhaul_agent_exchange_bytes_total` | counter | `peer`, `direction` (`sent`, `resent`, `received`, `duplicate`) |
//! | `longhaul_agent_exchange_refused_total` | counter | `peer` |
//! | `longhaul_agent_exchange_connections_total` | counter | `peer`, `event` (`welcomed`: streams on the pool's connections, `lost`, `handshake`: new connections) |
//! | `longhaul_agent_exchange_goodput_bps` | gauge | `peer`: bytes taken from it × 8 / the exchange's time |
//! | `longhaul_agent_exchange_fragments_total` | counter | `outcome` (`ok`, `unfinished`) |

use metrics::{counter, gauge};

use super::ExchangeOutcome;

pub const BYTES_TOTAL: &str = "longhaul_agent_exchange_bytes_total";
pub const REFUSED_TOTAL: &str = "longhaul_agent_exchange_refused_total";
pub const CONNECTIONS_TOTAL: &str = "longhaul_agent_exchange_connections_total";
pub const GOODPUT_BPS: &str = "longhaul_agent_exchange_goodput_bps";
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
            gauge!(GOODPUT_BPS, "peer" => peer).set(report.received_bytes as f64 * 8.0 / seconds);
        }
    }
    let result = if outcome.hash.is_some() {
        "ok"
    } else {
        "unfinished"
    };
    counter!(FRAGMENTS_TOTAL, "outcome" => result).increment(1);
}
