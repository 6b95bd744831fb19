//! Every metric a coordinator replica exports ([`TABLE`]): the daemon
//! describes them to the Prometheus exporter when it installs it
//! ([`longhaul_core::telemetry::describe`]). A metric recorded anywhere in
//! this crate has its row here; `coordinator/cli/tests/system/metrics.rs` runs
//! `promtool check metrics` on a running replica's `/metrics`, and the
//! Grafana dashboard under `deploy/grafana/` queries only names from the
//! tables.

use longhaul_core::telemetry::BaseUnit::{Bytes, Seconds};
use longhaul_core::telemetry::Kind::{Counter, Gauge, Histogram};
use longhaul_core::telemetry::Metric;

/// Site liveness as the `longhaul_sites` gauge labels it.
pub const SITE_STATES: [&str; 2] = ["up", "down"];

/// The coordinator's metrics.
pub const TABLE: &[Metric] = &[
    // Consensus.
    Metric::plain(
        "longhaul_raft_term",
        Gauge,
        None,
        "The replica's current Raft term.",
    ),
    Metric::plain(
        "longhaul_raft_is_leader",
        Gauge,
        None,
        "1 while this replica is the Raft leader, else 0.",
    ),
    Metric::plain(
        "longhaul_raft_commit_index",
        Gauge,
        None,
        "The highest log index this replica knows committed.",
    ),
    Metric::plain(
        "longhaul_raft_applied_index",
        Gauge,
        None,
        "The highest log index this replica applied to its state machine; commit index minus this is its applied lag.",
    ),
    Metric::plain(
        "longhaul_leader_changes_total",
        Counter,
        None,
        "Leader changes this replica saw.",
    ),
    Metric::plain(
        "longhaul_raft_entries_appended_total",
        Counter,
        None,
        "Log entries this replica appended to its log.",
    ),
    Metric::plain(
        "longhaul_raft_entries_applied_total",
        Counter,
        None,
        "Committed log entries this replica applied.",
    ),
    Metric::plain(
        "longhaul_snapshots_created_total",
        Counter,
        None,
        "Snapshots of the state machine this replica made.",
    ),
    Metric::plain(
        "longhaul_snapshots_installed_total",
        Counter,
        None,
        "Snapshots from the leader this replica installed.",
    ),
    Metric::plain(
        "longhaul_ready_seconds",
        Histogram,
        Some(Seconds),
        "Time to handle one Raft ready (persist, send, apply).",
    ),
    Metric::plain(
        "longhaul_commit_latency_seconds",
        Histogram,
        Some(Seconds),
        "Time from proposing a command on this replica to its apply.",
    ),
    Metric::plain(
        "longhaul_proposals_committed_total",
        Counter,
        None,
        "Commands proposed on this replica and applied.",
    ),
    Metric::labelled(
        "longhaul_proposals_failed_total",
        Counter,
        None,
        "Commands proposed on this replica that did not apply, by reason.",
        &[
            &[("reason", "timed_out")],
            &[("reason", "rejected")],
            &[("reason", "leader_changed")],
        ],
    ),
    Metric::plain(
        "longhaul_reads_expired_total",
        Counter,
        None,
        "Linearizable reads that timed out waiting for their read index.",
    ),
    // Storage.
    Metric::plain(
        "longhaul_fsync_seconds",
        Histogram,
        Some(Seconds),
        "Time of one fsync of the write-ahead log.",
    ),
    Metric::plain(
        "longhaul_log_segments_total",
        Counter,
        None,
        "Write-ahead log segments opened.",
    ),
    Metric::plain(
        "longhaul_log_torn_tails_total",
        Counter,
        None,
        "Torn records found (and cut) at the tail of the write-ahead log on open.",
    ),
    Metric::plain(
        "longhaul_log_compaction_seconds",
        Histogram,
        Some(Seconds),
        "Time to compact the log up to a snapshot.",
    ),
    Metric::plain(
        "longhaul_state_sync_seconds",
        Histogram,
        Some(Seconds),
        "Time to commit and fsync the applied state.",
    ),
    Metric::plain(
        "longhaul_deferred_commit_seconds",
        Histogram,
        Some(Seconds),
        "Time of a deferred commit of the applied state.",
    ),
    Metric::plain(
        "longhaul_apply_seconds",
        Histogram,
        Some(Seconds),
        "Time to apply one committed command to the state machine.",
    ),
    Metric::plain(
        "longhaul_snapshot_serialize_seconds",
        Histogram,
        Some(Seconds),
        "Time to serialise the state machine for a snapshot.",
    ),
    // The API boundary.
    Metric::labelled(
        "longhaul_requests_refused_total",
        Counter,
        None,
        "Requests refused at the authorization boundary, by reason.",
        &[&[("reason", "authorization")]],
    ),
    Metric::labelled(
        "longhaul_agent_requests_refused_total",
        Counter,
        None,
        "Site-agent requests refused because the caller's certificate does not name the site, by reason.",
        &[&[("reason", "identity")]],
    ),
    // Sites and leases.
    Metric::labelled(
        "longhaul_sites",
        Gauge,
        None,
        "Registered sites by liveness (`up`, `down`), as this replica's state has them.",
        &[&[("state", "up")], &[("state", "down")]],
    ),
    Metric::plain(
        "longhaul_site_registrations_total",
        Counter,
        None,
        "Site registrations this replica served.",
    ),
    Metric::plain(
        "longhaul_leases_held",
        Gauge,
        None,
        "Site leases this replica tracks as leader.",
    ),
    Metric::plain(
        "longhaul_lease_renewals_total",
        Counter,
        None,
        "Lease renewals this replica confirmed.",
    ),
    Metric::plain(
        "longhaul_lease_renewals_unconfirmed_total",
        Counter,
        None,
        "Lease renewals this replica could not confirm (no quorum in time).",
    ),
    Metric::plain(
        "longhaul_lease_expiries_total",
        Counter,
        None,
        "Leases that expired, marking their site down (leader only).",
    ),
    // Placement.
    Metric::labelled(
        "longhaul_replans_total",
        Counter,
        None,
        "Jobs re-placed after a site changed liveness or leadership moved, by outcome (`applied`, `refused`, `failed`; leader only).",
        &[
            &[("outcome", "applied")],
            &[("outcome", "refused")],
            &[("outcome", "failed")],
        ],
    ),
    // Outer rounds.
    Metric::plain(
        "longhaul_rounds_opened_total",
        Counter,
        None,
        "Outer rounds opened.",
    ),
    Metric::labelled(
        "longhaul_rounds_ended_total",
        Counter,
        None,
        "Outer rounds ended, by outcome (`committed`, `aborted`).",
        &[&[("outcome", "committed")], &[("outcome", "aborted")]],
    ),
    Metric::labelled(
        "longhaul_round_exclusions_total",
        Counter,
        None,
        "Sites excluded from an outer round, by reason.",
        &[
            &[("reason", "deadline_missed")],
            &[("reason", "site_down")],
            &[("reason", "left_plan")],
            &[("reason", "sat_out")],
        ],
    ),
    Metric::labelled(
        "longhaul_round_duration_seconds",
        Histogram,
        Some(Seconds),
        "Time from an outer round's opening to its end, by outcome.",
        &[&[("outcome", "committed")], &[("outcome", "aborted")]],
    ),
    Metric::labelled(
        "longhaul_sync_planned_bytes",
        Gauge,
        Some(Bytes),
        "WAN bytes the sync schedules of the placed jobs plan per outer step on a link (both directions), by link (`a<->b`, sites in name order; 0 on a link no plan uses); set by the leader when it opens a round (a former leader's figure stays: read the leader's).",
        &[],
    ),
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_follows_the_conventions() {
        longhaul_core::telemetry::check_table(super::TABLE).unwrap();
    }
}
