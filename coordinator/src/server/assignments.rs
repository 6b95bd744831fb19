//! What each site must run, derived from the stored plans.
//!
//! An assignment is a view of a job record, never stored on its own: the
//! ranks a plan binds to one site, the stages and replicas they belong to,
//! and the sync schedule. A job change at revision R yields, for every
//! site, either that site's new assignment or a removal; agents drop
//! removals of jobs they never had.

use longhaul_core::placement::{CrossSiteMode, Plan};
use longhaul_core::state::{JobRecord, JobState};
use longhaul_proto::v1 as pb;

/// The stored plan of a placed job.
pub fn plan_of(job: &JobRecord) -> Option<&Plan> {
    match job.state {
        JobState::Placed => job.placement.plan(),
        _ => None,
    }
}

/// The outer-synchronisation schedule of a DiLoCo plan; `None` for a
/// cross-site pipeline, which has no outer rounds.
///
/// The schedule is what the plan decided: H inner steps between outer
/// steps, the whole pseudo-gradient as one fragment, uncompressed
/// (`codec_bits` 0). Streaming fragments, codecs and the rounds' progress
/// belong to the sync planner, which this coordinator does not have yet.
pub fn sync_schedule(job_id: &str, plan: &Plan) -> Option<pb::SyncSchedule> {
    match plan.mode {
        CrossSiteMode::Pipeline => None,
        CrossSiteMode::Diloco { inner_steps } => Some(pb::SyncSchedule {
            job_id: job_id.to_string(),
            inner_steps,
            fragments: 1,
            codec_bits: 0,
            current_round: None,
        }),
    }
}

/// `site`'s part of `job` as of `revision`: its ranks, or a removal when
/// the job is not (or no longer) placed there.
pub fn assignment_for(job: &JobRecord, site: &str, revision: u64) -> pb::Assignment {
    let removed = pb::Assignment {
        revision,
        job_id: job.id.clone(),
        removed: true,
        ..pb::Assignment::default()
    };
    let Some(plan) = plan_of(job) else {
        return removed;
    };
    let tp = u64::from(plan.degrees.tensor_parallel.max(1));
    let pp = u64::from(plan.degrees.pipeline_parallel.max(1));
    let mut stages = std::collections::BTreeSet::new();
    let mut replicas = std::collections::BTreeSet::new();
    let ranks: Vec<pb::RankBinding> = plan
        .bindings()
        .filter(|b| b.site == site)
        .map(|b| {
            stages.insert(((b.rank / tp) % pp) as u32);
            replicas.insert((b.rank / (tp * pp)) as u32);
            pb::RankBinding {
                rank: b.rank,
                building_id: b.building,
                domain_id: b.domain_group,
                node: u32::try_from(b.node).unwrap_or(u32::MAX),
                gpu: b.gpu,
                domain: b.domain,
            }
        })
        .collect();
    if ranks.is_empty() {
        return removed;
    }
    pb::Assignment {
        revision,
        job_id: job.id.clone(),
        stages: stages.into_iter().collect(),
        replicas: replicas.into_iter().collect(),
        ranks,
        sync: sync_schedule(&job.id, plan),
        removed: false,
        sync_point: false,
        world_size: plan.gpus(),
        tensor_parallel: plan.degrees.tensor_parallel,
        pipeline_parallel: plan.degrees.pipeline_parallel,
        data_parallel: plan.degrees.data_parallel,
        mode: match plan.mode {
            CrossSiteMode::Pipeline => "pipeline".to_string(),
            CrossSiteMode::Diloco { .. } => "diloco".to_string(),
        },
    }
}
