//! An independent check of every hard constraint of a plan against the
//! topology and job it claims to place. It recomputes from the plan's own
//! fields; it never trusts the plan's predictions.

use std::collections::BTreeMap;

use super::plan::{CrossSiteMode, Plan};
use super::replicas::Sync;
use crate::cost::{self, CostParams};
use crate::job::JobSpec;
use crate::topology::Topology;

/// Checks `plan` with the default cost assumptions.
pub fn validate_plan(topology: &Topology, job: &JobSpec, plan: &Plan) -> Result<(), Vec<String>> {
    validate_plan_with(topology, job, plan, &CostParams::default())
}

/// Checks every hard constraint: degrees divide what they must and honour
/// the job's constraints; groups cover every replica and stages every
/// layer; each TP group lies inside one scale-up domain of an allowed site;
/// no GPU is used twice; consecutive pipeline sites are linked; DiLoCo
/// groups stay in one site each; expert parallelism divides the experts
/// and every group's replicas; every stage's memory fits.
pub fn validate_plan_with(
    topology: &Topology,
    job: &JobSpec,
    plan: &Plan,
    params: &CostParams,
) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    let d = &plan.degrees;
    let c = &job.constraints;
    let model = &job.model;
    let (tp, pp, dp, v) = (
        d.tensor_parallel,
        d.pipeline_parallel,
        d.data_parallel,
        d.virtual_stages,
    );
    if tp == 0 || pp == 0 || dp == 0 || v == 0 {
        return Err(vec![format!(
            "degrees must be positive, found tp={tp} pp={pp} dp={dp} v={v}"
        )]);
    }
    if !model.attention_heads.is_multiple_of(tp) {
        errors.push(format!(
            "tp {tp} does not divide {} attention heads",
            model.attention_heads
        ));
    }
    if !model.kv_heads().is_multiple_of(tp) {
        errors.push(format!(
            "tp {tp} does not divide {} key-value heads",
            model.kv_heads()
        ));
    }
    if c.max_tensor_parallel.is_some_and(|max| tp > max) {
        errors.push(format!(
            "tp {tp} exceeds max_tensor_parallel {:?}",
            c.max_tensor_parallel
        ));
    }
    let ep = d.expert_parallel;
    if ep == 0 || !model.experts().is_multiple_of(ep) {
        errors.push(format!(
            "ep {ep} does not divide the {} expert(s)",
            model.experts()
        ));
    }
    for (name, fixed, actual) in [
        (
            "expert_parallel",
            c.expert_parallel.filter(|_| model.moe.is_some()),
            ep,
        ),
        ("tensor_parallel", c.tensor_parallel, tp),
        ("pipeline_parallel", c.pipeline_parallel, pp),
        ("data_parallel", c.data_parallel, dp),
    ] {
        if fixed.is_some_and(|f| f != actual) {
            errors.push(format!(
                "constraint {name} = {fixed:?} but the plan uses {actual}"
            ));
        }
    }
    if pp > model.layers {
        errors.push(format!("pp {pp} exceeds {} layers", model.layers));
    }
    let per_step = u64::from(dp) * u64::from(job.batch.micro_batch);
    if per_step == 0 || u64::from(job.batch.global_batch) % per_step != 0 {
        errors.push(format!(
            "global batch {} is not divisible by dp {dp} × micro-batch {}",
            job.batch.global_batch, job.batch.micro_batch
        ));
    } else if u64::from(job.batch.global_batch) / per_step != d.micro_batches {
        errors.push(format!(
            "micro-batch count {} should be global batch / (dp · micro-batch)",
            d.micro_batches
        ));
    }
    if d.micro_batch_size != job.batch.micro_batch {
        errors.push(format!(
            "micro-batch size {} differs from the job's {}",
            d.micro_batch_size, job.batch.micro_batch
        ));
    }

    let allowed = |id: &str| c.allowed_sites.is_empty() || c.allowed_sites.iter().any(|s| s == id);
    let mut next_replica = 0u32;
    let mut used: BTreeMap<(String, String, String), Vec<(u64, u64)>> = BTreeMap::new();
    let mut group_sites = Vec::new();
    for (g, group) in plan.groups.iter().enumerate() {
        if group.first_replica != next_replica {
            errors.push(format!(
                "group {g} starts at replica {} instead of {next_replica}",
                group.first_replica
            ));
        }
        next_replica = group.first_replica.saturating_add(group.replicas);
        if ep > 0 && !group.replicas.is_multiple_of(ep) {
            errors.push(format!(
                "group {g}: {} replicas are not whole expert-parallel groups of {ep}",
                group.replicas
            ));
        }
        if group.stages.len() != pp as usize {
            errors.push(format!(
                "group {g} has {} stages, pp is {pp}",
                group.stages.len()
            ));
        }
        let mut next_layer = 0u32;
        for (j, stage) in group.stages.iter().enumerate() {
            let at = format!("group {g} stage {j}");
            if stage.first_layer != next_layer || stage.layers == 0 {
                errors.push(format!(
                    "{at}: layers {}+{} leave a gap or overlap",
                    stage.first_layer, stage.layers
                ));
            }
            if stage.layers % v != 0 {
                errors.push(format!(
                    "{at}: {} layers are not whole chunks of v={v}",
                    stage.layers
                ));
            }
            next_layer = stage.first_layer.saturating_add(stage.layers);
            if !allowed(&stage.site) {
                errors.push(format!("{at}: site {:?} is not allowed", stage.site));
            }
            let Some(site) = topology.site(&stage.site) else {
                errors.push(format!("{at}: unknown site {:?}", stage.site));
                continue;
            };
            let groups_placed: u64 = stage.slices.iter().map(|s| s.tp_groups).sum();
            if groups_placed != u64::from(group.replicas) {
                errors.push(format!(
                    "{at}: {groups_placed} TP groups placed for {} replicas",
                    group.replicas
                ));
            }
            let mut hbm = f64::INFINITY;
            for slice in &stage.slices {
                let found = site
                    .buildings
                    .iter()
                    .find(|b| b.id == slice.building)
                    .and_then(|b| b.domains.iter().find(|d| d.id == slice.domain_group));
                let Some(domains) = found else {
                    errors.push(format!(
                        "{at}: unknown domain group {}/{}",
                        slice.building, slice.domain_group
                    ));
                    continue;
                };
                let per_domain = domains.gpus_per_domain();
                if u64::from(tp) > per_domain {
                    errors.push(format!(
                        "{at}: TP group of {tp} cannot fit a {per_domain}-GPU domain of {}/{}",
                        slice.building, slice.domain_group
                    ));
                    continue;
                }
                let spd = per_domain / u64::from(tp);
                if slice.slots_per_domain != spd || slice.gpus_per_node != domains.gpus_per_node {
                    errors.push(format!(
                        "{at}: slice geometry disagrees with {}/{}",
                        slice.building, slice.domain_group
                    ));
                }
                let end = slice.first_slot.saturating_add(slice.tp_groups);
                if end > u64::from(domains.count) * spd {
                    errors.push(format!(
                        "{at}: slots {}..{end} exceed the {} slots of {}/{}",
                        slice.first_slot,
                        u64::from(domains.count) * spd,
                        slice.building,
                        slice.domain_group
                    ));
                }
                used.entry((
                    stage.site.clone(),
                    slice.building.clone(),
                    slice.domain_group.clone(),
                ))
                .or_default()
                .push((slice.first_slot, end));
                if let Some(gpu) = topology.gpu_type(&domains.gpu) {
                    hbm = hbm.min(gpu.hbm.bytes() as f64);
                }
            }
            // Memory, recomputed from the cost model.
            let extra = Sync::of(plan.mode).map_or(0.0, |s| s.extra_state(params));
            let chunks = cost::in_flight_chunks(j as u32, pp, d.micro_batches, v);
            let layers = f64::from(stage.layers);
            let replicas = u64::from(group.replicas);
            let ends = (j == 0, j + 1 == group.stages.len());
            let memory = layers * cost::state_bytes_per_layer(job, tp, ep, replicas, extra)
                + cost::activation_bytes_per_layer(job, tp) * chunks as f64 * layers / f64::from(v)
                + cost::end_stage_bytes(job, tp, replicas, extra, ends);
            let usable = hbm * (1.0 - params.hbm_headroom);
            if memory > usable * (1.0 + 1e-9) {
                errors.push(format!(
                    "{at}: needs {memory:.0} bytes per GPU, {usable:.0} usable"
                ));
            }
        }
        if next_layer != model.layers {
            errors.push(format!(
                "group {g}: stages cover {next_layer} of {} layers",
                model.layers
            ));
        }
        let sites: Vec<&str> = group.stages.iter().map(|s| s.site.as_str()).collect();
        for pair in sites.windows(2) {
            if pair[0] != pair[1] && topology.link(pair[0], pair[1]).is_none() {
                errors.push(format!(
                    "group {g}: stages cross from {} to {} without a WAN link",
                    pair[0], pair[1]
                ));
            }
        }
        group_sites.push(sites);
    }
    if next_replica != dp {
        errors.push(format!("groups hold {next_replica} replicas, dp is {dp}"));
    }
    match plan.mode {
        CrossSiteMode::Pipeline if plan.groups.len() != 1 => {
            errors.push(format!(
                "pipeline mode needs one group, found {}",
                plan.groups.len()
            ));
        }
        CrossSiteMode::Diloco { inner_steps } => {
            if inner_steps == 0 {
                errors.push("DiLoCo needs at least one inner step".to_string());
            }
            if let Some(sync) = &plan.sync {
                if sync.inner_steps != inner_steps {
                    errors.push(format!(
                        "the sync schedule's H is {}, the mode's {inner_steps}",
                        sync.inner_steps
                    ));
                }
                let mut planned = sync.sites.clone();
                let mut placed = plan.site_order.clone();
                planned.sort();
                placed.sort();
                if planned != placed {
                    errors.push(format!(
                        "the sync schedule covers sites {:?}, the plan's replicas sit at {:?}",
                        sync.sites, plan.site_order
                    ));
                }
            }
            replicas_per_site(&group_sites, "DiLoCo", &mut errors);
        }
        CrossSiteMode::DataParallel => {
            replicas_per_site(&group_sites, "data-parallel", &mut errors);
            if group_sites.len() < 2 {
                errors.push(format!(
                    "cross-site data parallelism needs two or more sites, found {}",
                    group_sites.len()
                ));
            }
        }
        CrossSiteMode::Pipeline => {}
    }
    if !matches!(plan.mode, CrossSiteMode::Diloco { .. }) && plan.sync.is_some() {
        errors.push("only DiLoCo has an outer sync, but a sync schedule is attached".into());
    }
    for ((site, building, group), mut ranges) in used {
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            if pair[1].0 < pair[0].1 {
                errors.push(format!(
                    "{site}/{building}/{group}: slots {:?} and {:?} overlap",
                    pair[0], pair[1]
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Each group of a replicas-per-site plan sits in one site, one group per
/// site.
fn replicas_per_site(group_sites: &[Vec<&str>], mode: &str, errors: &mut Vec<String>) {
    let mut seen = Vec::new();
    for (g, sites) in group_sites.iter().enumerate() {
        if sites.windows(2).any(|w| w[0] != w[1]) {
            errors.push(format!("{mode} group {g} spans sites {sites:?}"));
        }
        if let Some(site) = sites.first() {
            if seen.contains(site) {
                errors.push(format!("{mode} site {site} has two groups"));
            }
            seen.push(site);
        }
    }
}
