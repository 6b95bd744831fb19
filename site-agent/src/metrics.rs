//! Every metric a site agent exports ([`TABLE`]): the daemon describes them
//! to the Prometheus exporter when it installs it ([`describe`]). The probe
//! and exchange modules name theirs by constant ([`crate::probe::metrics`],
//! [`crate::exchange::metrics`]); the rest are recorded where they happen.
//! `peer` labels are site ids, bounded by the topology.

use longhaul_core::telemetry::BaseUnit::{Bytes, BytesPerSecond, Seconds};
use longhaul_core::telemetry::Kind::{Counter, Gauge, Histogram};
use longhaul_core::telemetry::Metric;

use crate::exchange::metrics as exchange;
use crate::probe::metrics as probe;

/// The site agent's metrics.
pub const TABLE: &[Metric] = &[
    // The control-plane session.
    Metric::plain(
        "longhaul_agent_registrations_total",
        Counter,
        None,
        "Registrations of this site with the coordinator.",
    ),
    Metric::plain(
        "longhaul_agent_lease_renewals_total",
        Counter,
        None,
        "Lease renewals of this site's lease.",
    ),
    Metric::plain(
        "longhaul_agent_reconnects_total",
        Counter,
        None,
        "Reconnections to the coordinator after a session was lost.",
    ),
    Metric::plain(
        "longhaul_agent_inventory_deltas_total",
        Counter,
        None,
        "Inventory changes reported to the coordinator.",
    ),
    Metric::plain(
        "longhaul_agent_assignment_errors_total",
        Counter,
        None,
        "Assignments the agent could not render or submit.",
    ),
    Metric::plain(
        "longhaul_agent_last_revision",
        Gauge,
        None,
        "The coordinator revision of the last assignment change this agent saw.",
    ),
    Metric::plain(
        "longhaul_agent_tls_insecure",
        Gauge,
        None,
        "1 when the agent runs without mTLS (a throw-away certificate), else 0.",
    ),
    // Link probes.
    Metric::labelled(
        probe::RTT_SECONDS,
        Gauge,
        Some(Seconds),
        "Round-trip time to a peer site's agent from the latest probe, by peer and `stat` (`min`, `p50`, `p99`).",
        &[],
    ),
    Metric::labelled(
        probe::LOSS_RATIO,
        Gauge,
        None,
        "Share of the latest probe's loss-test datagrams that did not reach the peer.",
        &[],
    ),
    Metric::labelled(
        probe::THROUGHPUT,
        Gauge,
        Some(BytesPerSecond),
        "Stream throughput to the peer from the latest probe.",
        &[],
    ),
    Metric::labelled(
        probe::PROBES_TOTAL,
        Counter,
        None,
        "Probes of peer sites, by peer and outcome.",
        &[],
    ),
    Metric::labelled(
        probe::SESSIONS_TOTAL,
        Counter,
        None,
        "Probe sessions this agent's probe server served, by dialling site and outcome.",
        &[],
    ),
    // The pseudo-gradient exchange.
    Metric::labelled(
        exchange::BYTES_TOTAL,
        Counter,
        Some(Bytes),
        "Exchange payload bytes per peer, by `direction` (`sent`, `resent` after a lost connection, `received`, `duplicate`).",
        &[],
    ),
    Metric::labelled(
        exchange::REFUSED_TOTAL,
        Counter,
        None,
        "Exchange messages from a peer refused (by the plan or the codec).",
        &[],
    ),
    Metric::labelled(
        exchange::CONNECTIONS_TOTAL,
        Counter,
        None,
        "Exchange connections per peer, by `event` (`welcomed` streams, `handshake`: new connections, `lost`).",
        &[],
    ),
    Metric::labelled(
        exchange::GOODPUT,
        Gauge,
        Some(BytesPerSecond),
        "Payload bytes taken from a peer over the last fragment exchange's time.",
        &[],
    ),
    Metric::labelled(
        exchange::FRAGMENTS_TOTAL,
        Counter,
        None,
        "Fragment exchanges, by outcome (`ok`, `unfinished`).",
        &[&[("outcome", "ok")], &[("outcome", "unfinished")]],
    ),
    Metric::labelled(
        exchange::RTT_SECONDS,
        Gauge,
        Some(Seconds),
        "Smoothed RTT of the exchange's QUIC connections to a peer (the least over the pool).",
        &[],
    ),
    Metric::labelled(
        exchange::CONGESTION_WINDOW,
        Gauge,
        Some(Bytes),
        "Congestion windows of the exchange's QUIC connections to a peer, summed over the pool.",
        &[],
    ),
    Metric::labelled(
        exchange::LOST_PACKETS_TOTAL,
        Counter,
        None,
        "QUIC packets of the exchange's connections to a peer declared lost (and so retransmitted).",
        &[],
    ),
    // Outer rounds.
    Metric::plain(
        "longhaul_agent_fragments_applied_total",
        Counter,
        None,
        "Fragments of outer rounds this site exchanged and reported applied.",
    ),
    Metric::plain(
        "longhaul_agent_fragments_failed_total",
        Counter,
        None,
        "Fragments of outer rounds this site could not exchange.",
    ),
    Metric::plain(
        "longhaul_agent_fragment_exchange_seconds",
        Histogram,
        Some(Seconds),
        "Time of one fragment's exchange, start to reduced result.",
    ),
    Metric::plain(
        "longhaul_agent_catch_ups_total",
        Counter,
        None,
        "Catch-up states this site fetched from another site for its trainers (it missed a committed round).",
    ),
    Metric::plain(
        "longhaul_agent_catch_ups_failed_total",
        Counter,
        None,
        "Catch-ups that fetched no state before their round ended (the trainers sat the round out).",
    ),
    Metric::plain(
        "longhaul_agent_rounds_sat_out_total",
        Counter,
        None,
        "Rounds this site left at once (LeaveRound) after its catch-up failed, so the others need not wait for its deadline.",
    ),
    // The local trainer API.
    Metric::plain(
        "longhaul_trainer_sessions",
        Gauge,
        None,
        "Trainer ranks joined to this agent.",
    ),
    Metric::plain(
        "longhaul_trainer_sessions_expired_total",
        Counter,
        None,
        "Trainer sessions released because the trainer went silent past its TTL.",
    ),
    Metric::plain(
        "longhaul_trainer_step_seconds",
        Histogram,
        Some(Seconds),
        "Inner-step times the trainers report.",
    ),
    Metric::plain(
        "longhaul_trainer_submitted_bytes_total",
        Counter,
        Some(Bytes),
        "Pseudo-gradient bytes trainers submitted through shared memory.",
    ),
    Metric::plain(
        "longhaul_trainer_states_published_total",
        Counter,
        None,
        "Trainer states (anchor and outer momentum) published for a site catching up from this one.",
    ),
];

/// Describes [`TABLE`] to the installed recorder; call once after
/// installing it.
pub fn describe() {
    longhaul_core::telemetry::describe(TABLE);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_follows_the_conventions() {
        longhaul_core::telemetry::check_table(super::TABLE).unwrap();
    }
}
