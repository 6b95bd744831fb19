//! Prometheus metrics of the link probes, through the `metrics` facade (the
//! agent binary installs the exporter).
//!
//! | name | type | labels |
//! |------|------|--------|
//! | `longhaul_agent_probe_rtt_seconds` | gauge | `peer`, `quantile` (`0`, `0.5`, `0.99`) |
//! | `longhaul_agent_probe_loss_ratio` | gauge | `peer` |
//! | `longhaul_agent_probe_throughput_bps` | gauge | `peer` |
//! | `longhaul_agent_probes_total` | counter | `peer`, `outcome` (`ok` or [`ProbeError::outcome`]) |
//! | `longhaul_agent_probe_sessions_total` | counter | `peer` (verified site or `unverified`), `outcome` |
//! | `longhaul_agent_tls_insecure` | gauge | set to 1 by [`AgentTls::insecure_local`] |
//!
//! Gauges hold the latest successful probe; a failed probe only counts.
//!
//! [`ProbeError::outcome`]: super::ProbeError::outcome
//! [`AgentTls::insecure_local`]: crate::tls::AgentTls::insecure_local

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};

use super::ProbeResult;

pub const RTT_SECONDS: &str = "longhaul_agent_probe_rtt_seconds";
pub const LOSS_RATIO: &str = "longhaul_agent_probe_loss_ratio";
pub const THROUGHPUT_BPS: &str = "longhaul_agent_probe_throughput_bps";
pub const PROBES_TOTAL: &str = "longhaul_agent_probes_total";
pub const SESSIONS_TOTAL: &str = "longhaul_agent_probe_sessions_total";

/// Registers the descriptions (help text and units) with the installed
/// recorder; call once after installing it.
pub fn describe() {
    describe_gauge!(
        RTT_SECONDS,
        Unit::Seconds,
        "Round-trip time to a peer site's agent from the latest probe (min, median, p99)."
    );
    describe_gauge!(
        LOSS_RATIO,
        "Share of the latest probe's loss-test datagrams that did not reach the peer."
    );
    describe_gauge!(
        THROUGHPUT_BPS,
        "Stream throughput to the peer in bits per second from the latest probe."
    );
    describe_counter!(PROBES_TOTAL, "Probes of peer sites, by outcome.");
    describe_counter!(
        SESSIONS_TOTAL,
        "Probe sessions this agent's probe server served, by dialling site and outcome."
    );
}

/// Records one probe of `peer`: the figures if it succeeded, and the count.
pub fn record_probe(peer: &str, outcome: Result<&ProbeResult, &'static str>) {
    let label = match outcome {
        Ok(result) => {
            for (quantile, ns) in [
                ("0", result.rtt_min_ns),
                ("0.5", result.rtt_p50_ns),
                ("0.99", result.rtt_p99_ns),
            ] {
                gauge!(RTT_SECONDS, "peer" => peer.to_string(), "quantile" => quantile)
                    .set(ns as f64 / 1e9);
            }
            if result.sent > 0 {
                gauge!(LOSS_RATIO, "peer" => peer.to_string()).set(result.loss_rate);
            }
            if result.duration_ns > 0 {
                gauge!(THROUGHPUT_BPS, "peer" => peer.to_string()).set(result.throughput_bps);
            }
            "ok"
        }
        Err(label) => label,
    };
    counter!(PROBES_TOTAL, "peer" => peer.to_string(), "outcome" => label).increment(1);
}

pub(crate) fn record_session(peer: &str, outcome: &'static str) {
    counter!(SESSIONS_TOTAL, "peer" => peer.to_string(), "outcome" => outcome).increment(1);
}
