//! What each site must run, derived from the stored plans.
//!
//! An assignment is a view of a job record, never stored on its own: the
//! ranks a plan binds to one site, the stages and replicas they belong to,
//! and the sync schedule. A job change at revision R yields, for every
//! site, either that site's new assignment or a removal; agents drop
//! removals of jobs they never had.

use longhaul_core::placement::{CrossSiteMode, Plan};
use longhaul_core::sync::CollectiveKind;

use super::convert::{nanos, whole};
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
/// The schedule is the sync planner's, decided when the job was placed
/// (`Plan::sync`). A plan stored before placement ran the planner carries
/// only H: one fragment, uncompressed (`codec_bits` 0), `planned` false.
pub fn sync_schedule(job_id: &str, plan: &Plan) -> Option<pb::SyncSchedule> {
    let CrossSiteMode::Diloco { inner_steps } = plan.mode else {
        return None;
    };
    let Some(sync) = &plan.sync else {
        return Some(pb::SyncSchedule {
            job_id: job_id.to_string(),
            inner_steps,
            fragments: 1,
            ..pb::SyncSchedule::default()
        });
    };
    Some(pb::SyncSchedule {
        job_id: job_id.to_string(),
        inner_steps: sync.inner_steps,
        fragments: sync.fragments,
        codec_bits: sync.bits(),
        current_round: None,
        overlap_steps: sync.overlap_steps,
        schedule: sync
            .schedule
            .iter()
            .map(|f| pb::FragmentSchedule {
                fragment: f.fragment,
                first_parameter: f.first_parameter,
                parameters: f.parameters,
                sync_at_inner_step: f.sync_at_inner_step,
                apply_at_inner_step: f.apply_at_inner_step,
            })
            .collect(),
        collective: match sync.collective.kind {
            CollectiveKind::ReduceScatterAllGather => "reduce-scatter-all-gather",
            CollectiveKind::Ring => "ring",
        }
        .to_string(),
        collective_order: sync.collective.order.clone(),
        links: sync
            .links
            .iter()
            .map(|l| pb::LinkSchedule {
                site_a: l.between[0].clone(),
                site_b: l.between[1].clone(),
                bits: l.bits,
                block_size: l.block_size,
                error_feedback: l.error_feedback,
                zstd: l.zstd,
                bytes_per_outer_step: whole(l.bytes_per_outer_step),
                reduction_vs_sync_dp: l.reduction_vs_sync_dp,
                measured: l.measured,
                reason: l.reason.clone(),
            })
            .collect(),
        predicted_compute_utilisation: sync.predicted_compute_utilisation,
        target_compute_utilisation: sync.target_compute_utilisation,
        exposed_ns_per_outer_step: nanos(sync.exposed_seconds_per_outer_step),
        outer_step_ns: nanos(sync.outer_step_seconds),
        bytes_per_outer_step: whole(sync.bytes_per_outer_step),
        reduction_vs_sync_dp: sync.reduction_vs_sync_dp,
        reasons: sync
            .reasons
            .iter()
            .map(|r| format!("{}: {} ({})", r.decision, r.choice, r.reason))
            .collect(),
        canonical_json: serde_json::to_string(sync).unwrap_or_default(),
        planned: true,
        planned_inner_step_ns: nanos(sync.inner_step_seconds),
        replanned_after_round: sync.replanned.as_ref().map_or(0, |r| r.after_round),
    })
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
        expert_parallel: plan.degrees.expert_parallel,
        mode: match plan.mode {
            CrossSiteMode::Pipeline => "pipeline".to_string(),
            CrossSiteMode::Diloco { .. } => "diloco".to_string(),
            CrossSiteMode::DataParallel => "data-parallel".to_string(),
        },
    }
}
