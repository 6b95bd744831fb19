//! `ReplanSync`: a placed DiLoCo job's sync schedule replaced between two
//! rounds by one planned at its trainers' measured inner step.

use crate::placement::{CrossSiteMode, Plan};
use crate::state::{ApplyError, Change, ClusterState, JobRecord, Placement};
use crate::sync::SyncPlan;

impl ClusterState {
    /// The job's record with `sync` as its schedule, if the job is placed
    /// as DiLoCo replicas, no round of it is open, its latest round is
    /// still `after_round`, and `sync` keeps the sites and the fragments
    /// (each one's parameter range) of the schedule in force.
    pub(in crate::state) fn check_replan_sync(
        &self,
        job_id: &str,
        after_round: u64,
        sync: &SyncPlan,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let (job, plan) = self.diloco_plan(job_id, "sync schedule")?;
        let latest = self.latest_round(job_id);
        if let Some(open) = latest.filter(|r| r.is_open()) {
            return Err(ApplyError::precondition(
                "after_round",
                format!(
                    "round {} of job {job_id:?} is open; a sync schedule is replaced only between rounds",
                    open.round
                ),
            ));
        }
        let latest = latest.map_or(0, |r| r.round);
        if latest != after_round {
            return Err(ApplyError::precondition(
                "after_round",
                format!(
                    "the re-plan was made after round {after_round}, but the job's latest round is {latest}"
                ),
            ));
        }
        check_sync(plan, job.spec.model.parameters, sync)?;
        let mut next: Plan = plan.clone();
        next.mode = CrossSiteMode::Diloco {
            inner_steps: sync.inner_steps,
        };
        next.sync = Some(sync.clone());
        Ok(vec![Change::Job {
            record: JobRecord {
                placement: Placement::Placed {
                    plan: Box::new(next),
                },
                revision,
                ..job.clone()
            },
        }])
    }
}

/// `sync` as a replacement of `plan`'s schedule (a job of `parameters`):
/// the same sites and fragments, H at least 1, P·τ at most H, one schedule
/// entry per fragment.
fn check_sync(plan: &Plan, parameters: u64, sync: &SyncPlan) -> Result<(), ApplyError> {
    if sync.sites != plan.site_order {
        return Err(ApplyError::invalid(
            "sync.sites",
            format!(
                "{:?} are not the plan's replica sites {:?}",
                sync.sites, plan.site_order
            ),
        ));
    }
    if sync.inner_steps == 0 {
        return Err(ApplyError::invalid(
            "sync.inner_steps",
            "must be at least 1",
        ));
    }
    if u64::from(sync.fragments) * u64::from(sync.overlap_steps) > u64::from(sync.inner_steps) {
        return Err(ApplyError::invalid(
            "sync.overlap_steps",
            format!(
                "{} fragments × τ {} exceed H {}",
                sync.fragments, sync.overlap_steps, sync.inner_steps
            ),
        ));
    }
    if sync.schedule.len() != sync.fragments as usize {
        return Err(ApplyError::invalid(
            "sync.schedule",
            format!(
                "has {} entries for {} fragments",
                sync.schedule.len(),
                sync.fragments
            ),
        ));
    }
    let ranges = |s: &SyncPlan| -> Vec<(u64, u64)> {
        s.schedule
            .iter()
            .map(|f| (f.first_parameter, f.parameters))
            .collect()
    };
    let before = match &plan.sync {
        Some(current) => ranges(current),
        // A plan stored before placement ran the planner syncs one
        // fragment of every parameter.
        None => vec![(0, parameters)],
    };
    if ranges(sync) != before {
        return Err(ApplyError::invalid(
            "sync.schedule",
            "changes the fragments' parameter ranges; a re-plan keeps them (rounds hand them over)",
        ));
    }
    Ok(())
}
