//! Re-planning a placed job's sync from the inner step its trainers
//! measure.
//!
//! Placement plans the sync from the inner step it predicts for the
//! hardware it costed; the trainers that run are often not that hardware
//! (a slower input pipeline, a smaller GPU, a CPU in a rehearsal). Once
//! they have measured their step, the round driver plans the sync again
//! at the measured step ([`replan_sync`]) when it is more than a factor
//! off the one the schedule assumed ([`needs_replan`]). H and τ follow
//! the measurement; the fragments and the codec stay: a fragment's
//! parameter range is what a site's trainer and agent hand each other in
//! every round, and a re-plan must not change it while rounds run.

use serde::{Deserialize, Serialize};

use super::{SyncError, SyncInput, SyncPlan, plan_sync, schedule_of};
use crate::cost::CostParams;
use crate::job::JobSpec;
use crate::placement::{Plan, Reason};
use crate::state::LinkRecord;
use crate::units::human_seconds;

/// What a re-plan replaced, kept with the plan it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replanned {
    /// The job's latest round when the re-plan was made (0: none yet).
    /// The trainers are already in the inner steps of the round after it,
    /// on the schedule before: the new one is theirs from the round after
    /// that (the rounds record which H each ran, `RoundRecord`).
    pub after_round: u64,
    /// The inner step the schedule before assumed, seconds (placement's
    /// prediction, or an earlier measurement).
    pub previous_inner_step_seconds: f64,
    /// H and τ of the schedule before.
    pub previous_inner_steps: u32,
    pub previous_overlap_steps: u32,
}

/// Whether `measured_seconds` (the slowest inner step the trainers
/// measured) is more than `factor` times off the inner step `sync` was
/// planned at, either way. A factor below 1 (or not finite) never asks;
/// nor does a measurement that is not a positive finite number.
pub fn needs_replan(sync: &SyncPlan, measured_seconds: f64, factor: f64) -> bool {
    let usable = factor.is_finite() && factor >= 1.0;
    if !(usable && measured_seconds.is_finite() && measured_seconds > 0.0) {
        return false;
    }
    let planned = sync.inner_step_seconds;
    if !(planned.is_finite() && planned > 0.0) {
        return true;
    }
    let ratio = measured_seconds / planned;
    ratio > factor || ratio * factor < 1.0
}

/// The sync of the placed DiLoCo job `plan` planned again at the inner
/// step its trainers measured, `measured_seconds`, with the links as they
/// are now (measured figures included) and the job's policy, but the
/// fragments and the codec bits of the schedule in force (see the module
/// docs); `after_round` is the job's latest round. The plan carries a
/// `replan` reason and what it replaced ([`SyncPlan::replanned`]).
pub fn replan_sync(
    plan: &Plan,
    job: &JobSpec,
    links: &[LinkRecord],
    params: &CostParams,
    measured_seconds: f64,
    after_round: u64,
) -> Result<SyncPlan, SyncError> {
    if !(measured_seconds.is_finite() && measured_seconds > 0.0) {
        return Err(SyncError::invalid(
            "inner_step_seconds",
            format!(
                "the measured inner step must be a positive number of seconds, found {measured_seconds}"
            ),
        ));
    }
    let current = schedule_of(plan, job, links, params)?;
    let mut input = SyncInput::from_plan(plan, job, links, params)?;
    input.inner_step_seconds = measured_seconds;
    input.policy.fragments = Some(current.fragments);
    let bits = current.bits();
    if matches!(bits, 4 | 8 | 16) {
        input.policy.bits = Some(bits);
    }
    let mut next = plan_sync(&input)?;
    next.reasons.push(Reason {
        decision: "replan".to_string(),
        choice: format!("after round {after_round}"),
        reason: format!(
            "the trainers measured an inner step of {} against the {} the schedule assumed: H {} → {}, τ {} → {}, from round {} (the round after {after_round} runs on the schedule before, whose inner steps had begun); {} fragment(s) and {}-bit codes kept, since a fragment's parameter range must not change while rounds run",
            human_seconds(measured_seconds),
            human_seconds(current.inner_step_seconds),
            current.inner_steps,
            next.inner_steps,
            current.overlap_steps,
            next.overlap_steps,
            after_round + 2,
            next.fragments,
            next.bits(),
        ),
    });
    next.replanned = Some(Replanned {
        after_round,
        previous_inner_step_seconds: current.inner_step_seconds,
        previous_inner_steps: current.inner_steps,
        previous_overlap_steps: current.overlap_steps,
    });
    Ok(next)
}
