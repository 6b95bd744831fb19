//! The emulator's metrics ([`TABLE`]), by link direction (`link`:
//! `from->to`, bounded by the scenario's links). Drops are counted as they
//! happen (in [`super::pipe`]); the other figures are the pipes' own
//! counters, copied by [`record`] from [`super::Emulator::statuses`] (the
//! `longhaul emulate` process does so every second).

use longhaul_core::telemetry::BaseUnit::{Bytes, Seconds};
use longhaul_core::telemetry::Kind::{Counter, Gauge};
use longhaul_core::telemetry::Metric;

use super::pipe::PipeStatus;

pub const DROPS_TOTAL: &str = "longhaul_emulator_drops_total";
pub const DELIVERED_PACKETS_TOTAL: &str = "longhaul_emulator_delivered_packets_total";
pub const DELIVERED_BYTES_TOTAL: &str = "longhaul_emulator_delivered_bytes_total";
pub const LATENESS_SECONDS: &str = "longhaul_emulator_lateness_seconds";
pub const QUEUE_HIGH_WATER: &str = "longhaul_emulator_queue_high_water_bytes";
pub const LINK_DOWN: &str = "longhaul_emulator_link_down";
pub const RELAY_RETRANSMISSIONS_TOTAL: &str = "longhaul_emulator_relay_retransmissions_total";

/// The emulator's metrics.
pub const TABLE: &[Metric] = &[
    Metric::labelled(
        DROPS_TOTAL,
        Counter,
        None,
        "Packets dropped on a link direction, by `cause` (`queue`: drop-tail, `loss`: random or trace loss, `down`: cut, `kernel`: the proxy socket's receive buffer overflowed).",
        &[],
    ),
    Metric::labelled(
        DELIVERED_PACKETS_TOTAL,
        Counter,
        None,
        "Packets a link direction delivered (duplicates included).",
        &[],
    ),
    Metric::labelled(
        DELIVERED_BYTES_TOTAL,
        Counter,
        Some(Bytes),
        "Bytes a link direction delivered.",
        &[],
    ),
    Metric::labelled(
        LATENESS_SECONDS,
        Gauge,
        Some(Seconds),
        "How late the emulator released packets against the link model's delivery time, since it started, by `stat` (`p50`, `p99`, `max`).",
        &[],
    ),
    Metric::labelled(
        QUEUE_HIGH_WATER,
        Gauge,
        Some(Bytes),
        "The largest backlog of a link direction's egress buffer so far.",
        &[],
    ),
    Metric::labelled(
        LINK_DOWN,
        Gauge,
        None,
        "1 while a link direction is cut, else 0.",
        &[],
    ),
    Metric::labelled(
        RELAY_RETRANSMISSIONS_TOTAL,
        Counter,
        None,
        "Chunks the proxy mode's TCP relay offered again after the link dropped them.",
        &[],
    ),
];

/// Copies the pipes' counters into the metrics.
pub fn record(statuses: &[PipeStatus]) {
    for status in statuses {
        let link = status.id();
        let label = || link.clone();
        metrics::counter!(DELIVERED_PACKETS_TOTAL, "link" => label())
            .absolute(status.stats.packets_delivered);
        metrics::counter!(DELIVERED_BYTES_TOTAL, "link" => label())
            .absolute(status.stats.bytes_delivered);
        for (stat, us) in [
            ("p50", status.lateness.p50_us),
            ("p99", status.lateness.p99_us),
            ("max", status.lateness.max_us),
        ] {
            metrics::gauge!(LATENESS_SECONDS, "link" => label(), "stat" => stat)
                .set(us as f64 / 1e6);
        }
        metrics::gauge!(QUEUE_HIGH_WATER, "link" => label())
            .set(status.stats.queue_high_water_bytes as f64);
        metrics::gauge!(LINK_DOWN, "link" => label()).set(if status.down { 1.0 } else { 0.0 });
        metrics::counter!(RELAY_RETRANSMISSIONS_TOTAL, "link" => label())
            .absolute(status.retransmissions);
        // Registered at zero, so a link without drops still shows.
        for cause in ["queue", "loss", "down", "kernel"] {
            metrics::counter!(DROPS_TOTAL, "link" => label(), "cause" => cause).increment(0);
        }
    }
}

/// Describes [`TABLE`] to the installed recorder.
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
