//! What other commands do to open rounds, in their own revision: a site
//! marked down, a job cancelled or placed again.

use super::{Exclusion, ExclusionReason, RoundOutcome, RoundRecord, round_change};
use crate::placement::CrossSiteMode;
use crate::state::{Change, ClusterState, Placement};

/// The end time of what a command that carries `at_unix_ms` does to `round`:
/// its time, never before the round opened; commands logged before they
/// carried one (0) end it at its opening time, the one time every replica
/// knows for it (an end time of 0 reads as "still open" on the wire).
fn end_time(round: &RoundRecord, at_unix_ms: u64) -> u64 {
    at_unix_ms.max(round.opened_at_unix_ms)
}

impl ClusterState {
    /// The site's exclusion from every open round it counts in, for the
    /// apply of `MarkSiteDown`.
    pub(in crate::state) fn exclude_down_site(
        &self,
        site_id: &str,
        reason: &str,
        at_unix_ms: u64,
        revision: u64,
    ) -> Vec<Change> {
        self.open_rounds()
            .filter(|r| r.counted().any(|p| p.site == site_id))
            .map(|r| {
                let mut record = r.clone();
                record.exclude(
                    site_id,
                    Exclusion {
                        reason: ExclusionReason::SiteDown,
                        message: reason.to_string(),
                        at_unix_ms,
                        revision,
                    },
                );
                round_change(record)
            })
            .collect()
    }

    /// The abort of the job's open round, for the apply of `CancelJob`, at
    /// the command's time ([`end_time`]).
    pub(in crate::state) fn abort_for_cancel(
        &self,
        job_id: &str,
        at_unix_ms: u64,
        revision: u64,
    ) -> Vec<Change> {
        self.open_round(job_id)
            .map(|r| {
                let mut record = r.clone();
                record.outcome = RoundOutcome::Aborted {
                    reason: "the job was cancelled".to_string(),
                    at_unix_ms: end_time(r, at_unix_ms),
                    revision,
                };
                record.revision = revision;
                round_change(record)
            })
            .into_iter()
            .collect()
    }

    /// The changes a new placement of `job_id` makes to its open round, for
    /// the apply of `SetPlacement` (as `MarkSiteDown` does for a site, in the
    /// same revision, so no report counts past the re-placement): the round
    /// is aborted when the job is no longer placed as DiLoCo replicas, and
    /// otherwise its participants outside the new plan are excluded, at the
    /// command's time ([`end_time`]).
    pub(in crate::state) fn apply_placement_to_round(
        &self,
        job_id: &str,
        placement: &Placement,
        at_unix_ms: u64,
        revision: u64,
    ) -> Vec<Change> {
        let Some(open) = self.open_round(job_id) else {
            return Vec::new();
        };
        let at_unix_ms = end_time(open, at_unix_ms);
        let mut record = open.clone();
        record.revision = revision;
        match placement.plan() {
            Some(plan) if matches!(plan.mode, CrossSiteMode::Diloco { .. }) => {
                let left: Vec<String> = record
                    .counted()
                    .filter(|p| !plan.site_order.contains(&p.site))
                    .map(|p| p.site.clone())
                    .collect();
                if left.is_empty() {
                    return Vec::new();
                }
                for p in &mut record.participants {
                    if left.contains(&p.site) {
                        p.excluded = Some(Exclusion {
                            reason: ExclusionReason::LeftPlan,
                            message: "the job was re-placed without this site".to_string(),
                            at_unix_ms,
                            revision,
                        });
                    }
                }
                record.settle(revision, at_unix_ms);
            }
            _ => {
                record.outcome = RoundOutcome::Aborted {
                    reason: format!(
                        "job {job_id:?} is no longer placed as DiLoCo replicas (re-placed: {})",
                        placement_name(placement)
                    ),
                    at_unix_ms,
                    revision,
                };
            }
        }
        vec![round_change(record)]
    }
}

fn placement_name(placement: &Placement) -> &'static str {
    match placement {
        Placement::Placed { .. } => "placed in another mode",
        Placement::Infeasible { .. } => "infeasible",
        Placement::Pending => "pending",
    }
}
