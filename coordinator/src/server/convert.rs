//! Conversions between wire messages (`longhaul.v1`) and core types, and the
//! one mapping of errors to `tonic::Status`.
//!
//! Wire → core conversions check what the wire format cannot express (a
//! required message missing, an enum left unspecified, a negative distance)
//! and name the field; the core's validation then runs on the result.

use longhaul_core::job::{Batch, Constraints, Diloco, JobSpec, ModelShape, Precision, Training};
use longhaul_core::state::{
    ApplyError, JobRecord, JobState, LinkMeasurement, LinkRecord, Liveness, Member, Placement,
    SiteRecord,
};
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Location, Site, WanLink};
use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use longhaul_proto::v1 as pb;
use tonic::Status;

use super::raft_loop::ConsensusError;

/// A field that is missing or wrong, named by its path in the request.
pub fn invalid(field: &str, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("field `{field}`: {message}"))
}

/// The service boundary's mapping of a refused command to a status.
pub fn apply_status(error: ApplyError) -> Status {
    match error {
        ApplyError::InvalidArgument { field, message } => invalid(&field, message),
        ApplyError::NotFound { field, message } => {
            Status::not_found(format!("field `{field}`: {message}"))
        }
        ApplyError::FailedPrecondition { field, message } => {
            Status::failed_precondition(format!("field `{field}`: {message}"))
        }
        ApplyError::AlreadyExists { field, message } => {
            Status::already_exists(format!("field `{field}`: {message}"))
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

fn required<'a, T>(value: &'a Option<T>, field: &str) -> Result<&'a T, Status> {
    value.as_ref().ok_or_else(|| invalid(field, "is required"))
}

pub fn site_from_wire(site: &pb::Site, field: &str) -> Result<Site, Status> {
    let buildings = site
        .buildings
        .iter()
        .enumerate()
        .map(|(b, building)| {
            let path = format!("{field}.buildings[{b}]");
            let fabric = required(&building.fabric, &format!("{path}.fabric"))?;
            let kind = match pb::FabricKind::try_from(fabric.kind) {
                Ok(pb::FabricKind::LeafSpine) => FabricKind::LeafSpine,
                Ok(pb::FabricKind::RailAligned) => FabricKind::RailAligned,
                _ => {
                    return Err(invalid(
                        &format!("{path}.fabric.kind"),
                        "must be LEAF_SPINE or RAIL_ALIGNED",
                    ));
                }
            };
            Ok(Building {
                id: building.id.clone(),
                fabric: Fabric {
                    kind,
                    link_rate: DataRate::from_bits_per_second(fabric.link_bps),
                    oversubscription: if fabric.oversubscription == 0.0 {
                        1.0
                    } else {
                        fabric.oversubscription
                    },
                },
                domains: building
                    .domains
                    .iter()
                    .map(|d| DomainGroup {
                        id: d.id.clone(),
                        count: d.count,
                        nodes_per_domain: d.nodes_per_domain,
                        gpus_per_node: d.gpus_per_node,
                        gpu: d.gpu_type.clone(),
                    })
                    .collect(),
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(Site {
        id: site.id.clone(),
        name: (!site.name.is_empty()).then(|| site.name.clone()),
        location: site.location.map(|l| Location {
            latitude: l.latitude_deg,
            longitude: l.longitude_deg,
        }),
        campus_interconnect: (site.campus_interconnect_bps > 0)
            .then(|| DataRate::from_bits_per_second(site.campus_interconnect_bps)),
        buildings,
    })
}

pub fn site_to_wire(site: &Site) -> pb::Site {
    pb::Site {
        id: site.id.clone(),
        name: site.name.clone().unwrap_or_default(),
        location: site.location.map(|l| pb::Location {
            latitude_deg: l.latitude,
            longitude_deg: l.longitude,
        }),
        buildings: site
            .buildings
            .iter()
            .map(|b| pb::Building {
                id: b.id.clone(),
                fabric: Some(pb::Fabric {
                    kind: match b.fabric.kind {
                        FabricKind::LeafSpine => pb::FabricKind::LeafSpine,
                        FabricKind::RailAligned => pb::FabricKind::RailAligned,
                    } as i32,
                    link_bps: b.fabric.link_rate.bits_per_second(),
                    oversubscription: b.fabric.oversubscription,
                }),
                domains: b
                    .domains
                    .iter()
                    .map(|d| pb::DomainGroup {
                        id: d.id.clone(),
                        count: d.count,
                        nodes_per_domain: d.nodes_per_domain,
                        gpus_per_node: d.gpus_per_node,
                        gpu_type: d.gpu.clone(),
                    })
                    .collect(),
            })
            .collect(),
        campus_interconnect_bps: site
            .campus_interconnect
            .map_or(0, DataRate::bits_per_second),
    }
}

pub fn link_from_wire(link: &pb::WanLink, field: &str) -> Result<WanLink, Status> {
    let distance = Distance::from_km(link.distance_km).ok_or_else(|| {
        invalid(
            &format!("{field}.distance_km"),
            format!(
                "must be a distance of at least 0 km, found {}",
                link.distance_km
            ),
        )
    })?;
    Ok(WanLink {
        between: [link.site_a.clone(), link.site_b.clone()],
        distance,
        overhead: Duration::from_nanos(link.overhead_ns),
        parallel_links: link.parallel_links,
        link_rate: DataRate::from_bits_per_second(link.link_bps),
        loss: link.loss_rate,
        buffer: (link.buffer_bytes > 0).then(|| ByteSize::from_bytes(link.buffer_bytes)),
    })
}

pub fn link_to_wire(link: &WanLink) -> pb::WanLink {
    pb::WanLink {
        site_a: link.between[0].clone(),
        site_b: link.between[1].clone(),
        distance_km: link.distance.km(),
        overhead_ns: link.overhead.as_nanos(),
        parallel_links: link.parallel_links,
        link_bps: link.link_rate.bits_per_second(),
        loss_rate: link.loss,
        buffer_bytes: link.buffer.map_or(0, ByteSize::bytes),
    }
}

pub fn job_from_wire(spec: &pb::JobSpec, field: &str) -> Result<JobSpec, Status> {
    let model = required(&spec.model, &format!("{field}.model"))?;
    let precision = match pb::Precision::try_from(spec.precision) {
        Ok(pb::Precision::Unspecified | pb::Precision::Bf16) => Precision::Bf16,
        Ok(pb::Precision::Fp8) => Precision::Fp8,
        Ok(pb::Precision::Fp32) => Precision::Fp32,
        Err(_) => {
            return Err(invalid(
                &format!("{field}.precision"),
                format!("unknown precision {}", spec.precision),
            ));
        }
    };
    let constraints = spec.constraints.clone().unwrap_or_default();
    let nonzero = |v: u32| (v != 0).then_some(v);
    Ok(JobSpec {
        name: spec.name.clone(),
        model: ModelShape {
            parameters: model.parameters,
            layers: model.layers,
            hidden_size: model.hidden_size,
            attention_heads: model.attention_heads,
            sequence_length: model.sequence_length,
            vocabulary_size: nonzero(model.vocabulary_size),
        },
        batch: Batch {
            global_batch: spec.global_batch,
            micro_batch: spec.micro_batch,
        },
        training: Training {
            precision,
            optimizer_state_bytes_per_parameter: if spec.optimizer_state_bytes_per_parameter == 0.0
            {
                Training::default().optimizer_state_bytes_per_parameter
            } else {
                spec.optimizer_state_bytes_per_parameter
            },
        },
        constraints: Constraints {
            allowed_sites: constraints.allowed_sites,
            max_tensor_parallel: nonzero(constraints.max_tensor_parallel),
            tensor_parallel: nonzero(constraints.tensor_parallel),
            pipeline_parallel: nonzero(constraints.pipeline_parallel),
            data_parallel: nonzero(constraints.data_parallel),
        },
        diloco: nonzero(spec.inner_steps).map(|inner_steps| Diloco { inner_steps }),
    })
}

pub fn job_to_wire(spec: &JobSpec) -> pb::JobSpec {
    let c = &spec.constraints;
    pb::JobSpec {
        name: spec.name.clone(),
        model: Some(pb::ModelShape {
            parameters: spec.model.parameters,
            layers: spec.model.layers,
            hidden_size: spec.model.hidden_size,
            attention_heads: spec.model.attention_heads,
            sequence_length: spec.model.sequence_length,
            vocabulary_size: spec.model.vocabulary_size.unwrap_or(0),
        }),
        global_batch: spec.batch.global_batch,
        micro_batch: spec.batch.micro_batch,
        precision: match spec.training.precision {
            Precision::Bf16 => pb::Precision::Bf16,
            Precision::Fp8 => pb::Precision::Fp8,
            Precision::Fp32 => pb::Precision::Fp32,
        } as i32,
        optimizer_state_bytes_per_parameter: spec.training.optimizer_state_bytes_per_parameter,
        constraints: Some(pb::JobConstraints {
            allowed_sites: c.allowed_sites.clone(),
            max_tensor_parallel: c.max_tensor_parallel.unwrap_or(0),
            tensor_parallel: c.tensor_parallel.unwrap_or(0),
            pipeline_parallel: c.pipeline_parallel.unwrap_or(0),
            data_parallel: c.data_parallel.unwrap_or(0),
        }),
        inner_steps: spec.diloco.as_ref().map_or(0, |d| d.inner_steps),
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
        Placement::Placed { plan_json } => (
            serde_json::from_str::<longhaul_core::placement::Plan>(plan_json)
                .ok()
                .and_then(|plan| plan_to_wire(&plan).ok())
                .or_else(|| {
                    Some(pb::Plan {
                        canonical_json: plan_json.clone(),
                        ..pb::Plan::default()
                    })
                }),
            String::new(),
        ),
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

/// A plan as the API returns it; `canonical_json` replays exactly.
pub fn plan_to_wire(plan: &longhaul_core::placement::Plan) -> Result<pb::Plan, Status> {
    use longhaul_core::placement::CrossSiteMode;
    let nanos = |seconds: f64| (seconds * 1e9).round().max(0.0) as u64;
    let (mode, inner_steps) = match plan.mode {
        CrossSiteMode::Pipeline => ("synchronous", 0),
        CrossSiteMode::Diloco { inner_steps } => ("diloco", inner_steps),
    };
    let step = &plan.step;
    Ok(pb::Plan {
        tensor_parallel: plan.degrees.tensor_parallel,
        pipeline_parallel: plan.degrees.pipeline_parallel,
        data_parallel: plan.degrees.data_parallel,
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
