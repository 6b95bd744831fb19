//! The coordinator's side of the wire: its records as messages, and the one
//! mapping of errors to `tonic::Status`. The model conversions shared with
//! the agent and the CLI (sites, links, jobs) live in
//! `longhaul_proto::convert` and are re-exported here.

use longhaul_core::limits::shorten;
use longhaul_core::state::{
    ApplyError, JobRecord, JobState, LinkMeasurement, LinkRecord, Liveness, Member, Placement,
    SiteRecord,
};
use longhaul_proto::v1 as pb;
use tonic::Status;

use super::raft_loop::ConsensusError;
pub use longhaul_proto::convert::*;

/// The service boundary's mapping of a refused command to a status.
pub fn apply_status(error: ApplyError) -> Status {
    let text = |field: String, message: String| shorten(format!("field `{field}`: {message}"));
    match error {
        ApplyError::InvalidArgument { field, message } => invalid(&field, message),
        ApplyError::NotFound { field, message } => Status::not_found(text(field, message)),
        ApplyError::FailedPrecondition { field, message } => {
            Status::failed_precondition(text(field, message))
        }
        ApplyError::AlreadyExists { field, message } => {
            Status::already_exists(text(field, message))
        }
    }
}

impl From<ConsensusError> for Status {
    fn from(error: ConsensusError) -> Self {
        match error {
            ConsensusError::Rejected(message) => Status::internal(message),
            other => Status::unavailable(other.to_string()),
        }
    }
}

pub fn site_status(record: &SiteRecord) -> pb::SiteStatus {
    pb::SiteStatus {
        site: Some(site_to_wire(&record.site)),
        state: match record.liveness {
            Liveness::Up => pb::SiteState::Up,
            Liveness::Down => pb::SiteState::Down,
        } as i32,
        state_revision: record.liveness_revision,
        gpus: record.site.gpus(),
        state_reason: record.liveness_reason.clone(),
        changed_at_unix_ms: record.changed_at_unix_ms,
        data_address: record.data_address.clone(),
        lease_ttl_ms: record.lease_ttl_ms,
    }
}

pub fn link_status(record: &LinkRecord) -> pb::LinkStatus {
    pb::LinkStatus {
        configured: Some(link_to_wire(&record.configured)),
        measured: record.measured.map(measurement_to_wire),
    }
}

pub fn measurement_to_wire(m: LinkMeasurement) -> pb::LinkMeasurement {
    pb::LinkMeasurement {
        rtt_ns: m.rtt_ns,
        loss_rate: m.loss_rate,
        throughput_bps: m.throughput_bps,
        measured_at_unix_ms: m.measured_at_unix_ms,
    }
}

pub fn job(record: &JobRecord) -> pb::Job {
    let (plan, infeasible_reason) = match &record.placement {
        Placement::Placed { plan } => (plan_to_wire(plan).ok(), String::new()),
        Placement::Infeasible { reason } => (None, reason.clone()),
        Placement::Pending => (None, String::new()),
    };
    pb::Job {
        id: record.id.clone(),
        spec: Some(job_to_wire(&record.spec)),
        state: match record.state {
            JobState::Placed => pb::JobState::Placed,
            JobState::Infeasible => pb::JobState::Infeasible,
            JobState::Cancelled => pb::JobState::Cancelled,
            JobState::Pending => pb::JobState::Pending,
        } as i32,
        plan,
        infeasible_reason,
        revision: record.revision,
    }
}

pub fn member(member: &Member, learners: &[u64]) -> pb::Member {
    pb::Member {
        id: member.id,
        name: member.name.clone(),
        peer_url: member.peer_url.clone(),
        client_url: member.client_url.clone(),
        is_learner: learners.contains(&member.id),
    }
}

/// A non-negative figure as a whole number, rounded (saturating `as`: a
/// negative or NaN figure becomes 0, an enormous one `u64::MAX`).
pub fn whole(value: f64) -> u64 {
    value.round().max(0.0) as u64
}

/// Seconds as whole nanoseconds, as [`whole`].
pub fn nanos(seconds: f64) -> u64 {
    whole(seconds * 1e9)
}

/// A plan as the API returns it; `canonical_json` replays exactly.
pub fn plan_to_wire(plan: &longhaul_core::placement::Plan) -> Result<pb::Plan, Status> {
    use longhaul_core::placement::CrossSiteMode;
    let (mode, inner_steps) = match plan.mode {
        CrossSiteMode::Pipeline => ("synchronous", 0),
        CrossSiteMode::Diloco { inner_steps } => ("diloco", inner_steps),
        CrossSiteMode::DataParallel => ("data-parallel", 0),
    };
    let step = &plan.step;
    Ok(pb::Plan {
        tensor_parallel: plan.degrees.tensor_parallel,
        pipeline_parallel: plan.degrees.pipeline_parallel,
        data_parallel: plan.degrees.data_parallel,
        expert_parallel: plan.degrees.expert_parallel,
        micro_batches: u32::try_from(plan.degrees.micro_batches).unwrap_or(u32::MAX),
        cross_site_mode: mode.to_string(),
        inner_steps,
        stages: plan
            .groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| {
                group
                    .stages
                    .iter()
                    .enumerate()
                    .map(move |(i, stage)| pb::StageAssignment {
                        stage: i as u32,
                        site_id: stage.site.clone(),
                        first_layer: stage.first_layer,
                        last_layer: stage.first_layer + stage.layers.saturating_sub(1),
                        group: g as u32,
                        first_replica: group.first_replica,
                        replicas: group.replicas,
                    })
            })
            .collect(),
        predicted_step: Some(pb::StepTimeBreakdown {
            compute_ns: nanos(step.compute),
            tensor_parallel_ns: nanos(step.tensor_parallel),
            expert_parallel_ns: nanos(step.expert_parallel),
            exposed_pipeline_ns: nanos(step.exposed_pipeline),
            bubble_ns: nanos(step.bubble),
            exposed_data_parallel_ns: nanos(step.exposed_data_parallel),
            amortised_outer_sync_ns: nanos(step.outer_sync_amortised),
            total_ns: nanos(step.total),
        }),
        wan_traffic: plan
            .wan
            .iter()
            .map(|w| pb::LinkTraffic {
                site_a: w.between[0].clone(),
                site_b: w.between[1].clone(),
                bytes_per_step: w.bytes_per_step.round().max(0.0) as u64,
            })
            .collect(),
        min_memory_slack_bytes: plan.min_memory_slack_bytes.max(0.0) as u64,
        parallel_order: plan.parallel_order.clone(),
        reasons: plan
            .reasons
            .iter()
            .map(|r| format!("{}: {} — {}", r.decision, r.choice, r.reason))
            .collect(),
        canonical_json: serde_json::to_string(plan)
            .map_err(|e| Status::internal(format!("plan serialization: {e}")))?,
    })
}
