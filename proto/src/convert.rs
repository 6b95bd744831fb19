//! Conversions between the wire messages (`longhaul.v1`) and the core
//! model, shared by everything that serves or calls the API (the
//! coordinator, the CLI, the site agent): one place for each mapping.
//!
//! Wire → core conversions check what the wire format cannot express (a
//! required message missing, an enum left unspecified, a negative distance)
//! and name the field; the core's validation then runs on the result.

use longhaul_core::job::{
    Batch, Constraints, Diloco, Goal, JobSpec, ModeConstraint, ModelShape, MoeShape, Objective,
    Precision, Training,
};
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Location, Site, WanLink};
use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use tonic::Status;

use crate::v1 as pb;

/// A field that is missing or wrong, named by its path in the request.
/// The message is cut to `longhaul_core::limits::MAX_MESSAGE_BYTES`: it travels in a response
/// header, whose limits are far smaller than a value a client may have sent.
pub fn invalid(field: &str, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(longhaul_core::limits::shorten(format!(
        "field `{field}`: {message}"
    )))
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
                    .map(domain_group_from_wire)
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

/// A domain group; the core's site validation checks its figures.
pub fn domain_group_from_wire(d: &pb::DomainGroup) -> DomainGroup {
    DomainGroup {
        id: d.id.clone(),
        count: d.count,
        nodes_per_domain: d.nodes_per_domain,
        gpus_per_node: d.gpus_per_node,
        gpu: d.gpu_type.clone(),
    }
}

pub fn domain_group_to_wire(d: &DomainGroup) -> pb::DomainGroup {
    pb::DomainGroup {
        id: d.id.clone(),
        count: d.count,
        nodes_per_domain: d.nodes_per_domain,
        gpus_per_node: d.gpus_per_node,
        gpu_type: d.gpu.clone(),
    }
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
                domains: b.domains.iter().map(domain_group_to_wire).collect(),
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
            kv_heads: nonzero(model.kv_heads),
            moe: model.moe.as_ref().map(|moe| MoeShape {
                experts: moe.experts,
                top_k: moe.top_k,
                active_parameters: moe.active_parameters,
            }),
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
            expert_parallel: nonzero(constraints.expert_parallel),
            cross_site_mode: match constraints.cross_site_mode.as_str() {
                "" => None,
                name => Some(ModeConstraint::parse(name).ok_or_else(|| {
                    invalid(
                        &format!("{field}.constraints.cross_site_mode"),
                        format!(
                            "unknown mode {}: expected \"diloco\", \"pipeline\", \"data-parallel\" or empty",
                            longhaul_core::limits::quote(name)
                        ),
                    )
                })?),
            },
        },
        diloco: diloco_from_wire(spec.inner_steps, spec.diloco_policy.as_ref(), field)?,
        objective: objective_from_wire(spec.objective.as_ref(), field)?,
    })
}

fn objective_from_wire(
    objective: Option<&pb::Objective>,
    field: &str,
) -> Result<Objective, Status> {
    let Some(objective) = objective else {
        return Ok(Objective::default());
    };
    let goal = match objective.goal.as_str() {
        "" => Goal::StepTime,
        name => Goal::parse(name).ok_or_else(|| {
            invalid(
                &format!("{field}.objective.goal"),
                format!(
                    "unknown goal {}: expected \"step-time\", \"throughput-per-gpu\", \"fewest-gpus\" or empty",
                    longhaul_core::limits::quote(name)
                ),
            )
        })?,
    };
    Ok(Objective {
        goal,
        max_gpus: (objective.max_gpus != 0).then_some(objective.max_gpus),
        within: (objective.within != 0.0).then_some(objective.within),
    })
}

fn objective_to_wire(objective: &Objective) -> Option<pb::Objective> {
    (!objective.is_default()).then(|| pb::Objective {
        goal: objective.goal.as_str().to_string(),
        max_gpus: objective.max_gpus.unwrap_or(0),
        within: objective.within.unwrap_or(0.0),
    })
}

fn diloco_from_wire(
    inner_steps: u32,
    policy: Option<&pb::DilocoPolicy>,
    field: &str,
) -> Result<Option<Diloco>, Status> {
    let Some(policy) = policy else {
        return Ok((inner_steps != 0).then(|| Diloco::new(inner_steps)));
    };
    if inner_steps == 0 {
        return Err(invalid(
            &format!("{field}.diloco_policy"),
            format!("needs `{field}.inner_steps` (H) to be set"),
        ));
    }
    Ok(Some(Diloco {
        max_inner_steps: policy.max_inner_steps,
        target_compute_utilisation: policy.target_compute_utilisation,
        max_exposed_communication_fraction: policy.max_exposed_communication_fraction,
        fragments: policy.fragments,
        max_fragments: policy.max_fragments,
        max_overlap_steps: policy.max_overlap_steps,
        bits: policy.bits,
        error_feedback: policy.error_feedback,
        link_budget: policy
            .link_budget_bits_per_second
            .map(DataRate::from_bits_per_second),
        zstd_ratio: policy.zstd_ratio,
        ..Diloco::new(inner_steps)
    }))
}

fn diloco_to_wire(diloco: &Diloco) -> Option<pb::DilocoPolicy> {
    let policy = pb::DilocoPolicy {
        max_inner_steps: diloco.max_inner_steps,
        target_compute_utilisation: diloco.target_compute_utilisation,
        max_exposed_communication_fraction: diloco.max_exposed_communication_fraction,
        fragments: diloco.fragments,
        max_fragments: diloco.max_fragments,
        max_overlap_steps: diloco.max_overlap_steps,
        bits: diloco.bits,
        error_feedback: diloco.error_feedback,
        link_budget_bits_per_second: diloco.link_budget.map(DataRate::bits_per_second),
        zstd_ratio: diloco.zstd_ratio,
    };
    (policy != pb::DilocoPolicy::default()).then_some(policy)
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
            kv_heads: spec.model.kv_heads.unwrap_or(0),
            moe: spec.model.moe.as_ref().map(|moe| pb::MoeShape {
                experts: moe.experts,
                top_k: moe.top_k,
                active_parameters: moe.active_parameters,
            }),
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
            expert_parallel: c.expert_parallel.unwrap_or(0),
            cross_site_mode: c
                .cross_site_mode
                .map_or_else(String::new, |m| m.as_str().to_string()),
        }),
        inner_steps: spec.diloco.as_ref().map_or(0, |d| d.inner_steps),
        diloco_policy: spec.diloco.as_ref().and_then(diloco_to_wire),
        objective: objective_to_wire(&spec.objective),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
name = "j"
[model]
parameters = 1_000_000_000
layers = 16
hidden_size = 2048
attention_heads = 16
sequence_length = 4096
[model.moe]
experts = 8
top_k = 2
active_parameters = 400_000_000
[batch]
global_batch = 64
micro_batch = 1
[constraints]
cross_site_mode = "diloco"
expert_parallel = 4
[diloco]
inner_steps = 100
max_inner_steps = 300
max_exposed_communication_fraction = 0.02
fragments = 4
max_overlap_steps = 2
bits = 8
error_feedback = false
link_budget = "40 Gbit/s"
zstd_ratio = 1.2
[objective]
goal = "fewest-gpus"
within = 0.1
max_gpus = 4096
"#;

    #[test]
    fn a_job_with_its_experts_whole_diloco_policy_and_mode_crosses_the_wire_unchanged() {
        let job = JobSpec::from_toml("j.toml", JOB).expect("parses");
        let wire = job_to_wire(&job);
        assert_eq!(
            wire.constraints
                .as_ref()
                .map(|c| c.cross_site_mode.as_str()),
            Some("diloco")
        );
        assert_eq!(job_from_wire(&wire, "spec").expect("converts back"), job);
        // Only H set: no policy message, and back to the same job.
        let mut plain = job.clone();
        plain.diloco = Some(Diloco::new(100));
        plain.constraints.cross_site_mode = None;
        let wire = job_to_wire(&plain);
        assert_eq!(wire.diloco_policy, None);
        assert_eq!(job_from_wire(&wire, "spec").expect("converts back"), plain);
    }

    #[test]
    fn an_unknown_mode_or_a_policy_without_h_is_refused_naming_the_field() {
        let job = JobSpec::from_toml("j.toml", JOB).expect("parses");
        let mut wire = job_to_wire(&job);
        if let Some(c) = wire.constraints.as_mut() {
            c.cross_site_mode = "ring".into();
        }
        let error = job_from_wire(&wire, "spec").expect_err("refused");
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(
            error.message().contains("spec.constraints.cross_site_mode"),
            "{}",
            error.message()
        );
        let mut wire = job_to_wire(&job);
        wire.inner_steps = 0;
        let error = job_from_wire(&wire, "spec").expect_err("refused");
        assert!(
            error.message().contains("spec.diloco_policy"),
            "{}",
            error.message()
        );
        let mut wire = job_to_wire(&job);
        if let Some(o) = wire.objective.as_mut() {
            o.goal = "cheapest".into();
        }
        let error = job_from_wire(&wire, "spec").expect_err("refused");
        assert!(
            error.message().contains("spec.objective.goal"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn a_job_objective_crosses_the_wire_and_the_default_sends_nothing() {
        let job = JobSpec::from_toml("j.toml", JOB).expect("parses");
        assert_eq!(job.objective.goal, Goal::FewestGpus);
        let wire = job_to_wire(&job);
        assert_eq!(
            wire.objective.as_ref().map(|o| o.goal.as_str()),
            Some("fewest-gpus")
        );
        assert_eq!(job_from_wire(&wire, "spec").expect("converts back"), job);
        let mut plain = job.clone();
        plain.objective = Objective::default();
        let wire = job_to_wire(&plain);
        assert_eq!(wire.objective, None);
        assert_eq!(job_from_wire(&wire, "spec").expect("converts back"), plain);
    }
}
