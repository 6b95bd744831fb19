//! Conversions between the wire messages (`longhaul.v1`) and the core
//! model, shared by everything that serves or calls the API (the
//! coordinator, the CLI, the site agent): one place for each mapping.
//!
//! Wire → core conversions check what the wire format cannot express (a
//! required message missing, an enum left unspecified, a negative distance)
//! and name the field; the core's validation then runs on the result.

use longhaul_core::job::{Batch, Constraints, Diloco, JobSpec, ModelShape, Precision, Training};
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
        diloco: nonzero(spec.inner_steps).map(Diloco::new),
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
