//! Prometheus metrics of the link probes, through the `metrics` facade (the
//! agent binary installs the exporter).
//!
//! | name | type | labels |
//! |------|------|--------|
//! | `longhaul_agent_probe_rtt_seconds` | gauge | `peer`, `stat` (`min`, `p50`, `p99`) |
//! | `longhaul_agent_probe_loss_ratio` | gauge | `peer` |
//! | `longhaul_agent_probe_throughput_bytes_per_second` | gauge | `peer` |
//! | `longhaul_agent_probes_total` | counter | `peer`, `outcome` (`ok` or [`ProbeError::outcome`]) |
//! | `longhaul_agent_probe_sessions_total` | counter | `peer` (verified site or `unverified`), `outcome` |
//! | `longhaul_agent_tls_insecure` | gauge | set to 1 by [`AgentTls::insecure_local`] |
//!
//! Gauges hold the latest successful probe; a failed probe only counts.
//! Their help text is in [`crate::metrics::TABLE`].
//!
//! [`ProbeError::outcome`]: super::ProbeError::outcome
//! [`AgentTls::insecure_local`]: crate::tls::AgentTls::insecure_local

use metrics::{counter, gauge};

use super::ProbeResult;

pub const RTT_SECONDS: &str = "longhaul_agent_probe_rtt_seconds";
pub const LOSS_RATIO: &str = "longhaul_agent_probe_loss_ratio";
pub const THROUGHPUT: &str = "longhaul_agent_probe_throughput_bytes_per_second";
pub const PROBES_TOTAL: &str = "longhaul_agent_probes_total";
pub const SESSIONS_TOTAL: &str = "longhaul_agent_probe_sessions_total";

/// Records one probe of `peer`: the figures if it succeeded, and the count.
pub fn record_probe(peer: &str, outcome: Result<&ProbeResult, &'static str>) {
    let label = match outcome {
        Ok(result) => {
            for (stat, ns) in [
                ("min", result.rtt_min_ns),
                ("p50", result.rtt_p50_ns),
                ("p99", result.rtt_p99_ns),
            ] {
                gauge!(RTT_SECONDS, "peer" => peer.to_string(), "stat" => stat)
                    .set(ns as f64 / 1e9);
            }
            if result.sent > 0 {
                gauge!(LOSS_RATIO, "peer" => peer.to_string()).set(result.loss_rate);
            }
            if result.duration_ns > 0 {
                gauge!(THROUGHPUT, "peer" => peer.to_string()).set(result.throughput_bps / 8.0);
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
