//! A plan's predictions on other WAN links, its layout unchanged.
//!
//! [`recost`] keeps what a plan decided (degrees, sites, stages, layer
//! split, replicas per site) and recomputes, with the same cost model the
//! search used, what depends on the WAN: in pipeline mode every stage
//! boundary (activations and their gradients cross the links as they are
//! now), in DiLoCo mode the outer sync (the sync planner is run again, so
//! H, fragments, overlap and codec are what it would choose on these
//! links). Nothing inside a site depends on the WAN, so a DiLoCo group's
//! inner step and its local reduce are as placed. The simulator's
//! analytical tier sweeps distance, rate and loss this way without
//! searching again at every point; re-costing a plan on the topology it was
//! placed on reproduces its predictions exactly (tested).

use super::PlacementError;
use super::model::{Ctx, GroupModel};
use super::plan::{CrossSiteMode, Plan, WanTraffic};
use super::replicas::{Sync, outer_seconds, plan_subset_sync};
use crate::cost::CostParams;
use crate::job::JobSpec;
use crate::sync::SyncPlan;
use crate::topology::Topology;

/// `plan` with its step, outer sync and WAN traffic as predicted on
/// `topology`, which must hold the plan's sites with the same GPUs (only
/// links may differ).
pub fn recost(
    topology: &Topology,
    job: &JobSpec,
    params: &CostParams,
    plan: &Plan,
) -> Result<Plan, PlacementError> {
    let ctx = Ctx::new(topology, job, params);
    let index = |id: &str| {
        ctx.sites.iter().position(|s| s.id == id).ok_or_else(|| {
            PlacementError::InvalidJob(format!(
                "the plan uses site {id:?}, which the topology does not hold (or has no usable GPUs)"
            ))
        })
    };
    let ep = plan.degrees.expert_parallel;
    if let Some(group) = plan.groups.iter().find(|g| ep == 0 || g.replicas % ep != 0) {
        return Err(PlacementError::InvalidJob(format!(
            "the plan's expert-parallel degree {ep} does not divide the {} replicas of its group \
             at replica {}",
            group.replicas, group.first_replica
        )));
    }
    let mut out = plan.clone();
    match plan.mode {
        CrossSiteMode::Pipeline => {
            let d = &plan.degrees;
            let mut slowest: Option<(f64, super::model::GroupEval)> = None;
            for (g, group) in plan.groups.iter().enumerate() {
                // Consecutive stages in one site, as the search laid them out.
                let mut runs: Vec<(usize, u32)> = Vec::new();
                for stage in &group.stages {
                    let site = index(&stage.site)?;
                    match runs.last_mut() {
                        Some((last, count)) if *last == site => *count += 1,
                        _ => runs.push((site, 1)),
                    }
                }
                let model = GroupModel::build(
                    &ctx,
                    d.tensor_parallel,
                    d.expert_parallel,
                    d.virtual_stages,
                    d.micro_batches,
                    u64::from(group.replicas),
                    &runs,
                    0.0,
                )
                .map_err(|failure| {
                    PlacementError::NoFeasiblePlan(format!(
                        "the plan's group {g} cannot be laid out on this topology: {failure:?}"
                    ))
                })?;
                let layers: Vec<u32> = group.stages.iter().map(|s| s.layers).collect();
                let eval = model.evaluate(&layers).map_err(|failure| {
                    PlacementError::NoFeasiblePlan(format!("group {g}: {failure:?}"))
                })?;
                out.groups[g].step_seconds = eval.total;
                if slowest.as_ref().is_none_or(|(t, _)| eval.total > *t) {
                    slowest = Some((eval.total, eval));
                }
            }
            if let Some((total, e)) = slowest {
                out.step.compute = e.compute;
                out.step.tensor_parallel = e.tensor_parallel;
                out.step.expert_parallel = e.expert_parallel;
                out.step.exposed_pipeline = e.pipeline.exposed_p2p;
                out.step.bubble = e.pipeline.bubble;
                out.step.exposed_data_parallel = e.exposed_dp;
                out.step.outer_sync_amortised = 0.0;
                out.step.total = total;
            }
        }
        CrossSiteMode::Diloco { .. } | CrossSiteMode::DataParallel => {
            let d = &plan.degrees;
            let mut subset = Vec::with_capacity(plan.groups.len());
            let mut ks = Vec::with_capacity(plan.groups.len());
            for group in &plan.groups {
                let site = group.stages.first().map(|s| s.site.as_str()).unwrap_or("");
                subset.push(index(site)?);
                ks.push(u64::from(group.replicas));
            }
            let inner = plan
                .groups
                .iter()
                .map(|g| g.step_seconds)
                .fold(0.0, f64::max);
            let fewest = ks.iter().copied().min().unwrap_or(1);
            let degrees = (d.tensor_parallel, d.pipeline_parallel);
            let sync = Sync::of(plan.mode).unwrap_or(Sync::Diloco);
            let schedule =
                plan_subset_sync(&ctx, sync, degrees, &subset, inner, fewest).map_err(|e| {
                    PlacementError::NoFeasiblePlan(format!("the sync planner refused: {e}"))
                })?;
            let shape = (degrees.0, degrees.1, d.expert_parallel);
            let outer = outer_seconds(&ctx, sync, shape, &subset, &ks, &schedule);
            out.site_order = schedule.collective.order.clone();
            // Cross-site data parallelism syncs every step.
            let h = match sync {
                Sync::Diloco => schedule.inner_steps,
                Sync::DataParallel => 1,
            };
            out.outer_sync_seconds = outer;
            out.step.outer_sync_amortised = outer / f64::from(h);
            out.step.total = inner + outer / f64::from(h);
            out.wan = wan_of(&schedule, h, sync.traffic());
            if sync == Sync::Diloco {
                out.mode = CrossSiteMode::Diloco { inner_steps: h };
                out.sync = Some(schedule);
            }
        }
    }
    Ok(out)
}

/// The WAN traffic per (inner) step of a schedule whose outer step comes
/// every `h` steps.
fn wan_of(schedule: &SyncPlan, h: u32, what: &str) -> Vec<WanTraffic> {
    schedule
        .links
        .iter()
        .map(|l| WanTraffic {
            between: l.between.clone(),
            bytes_per_step: l.bytes_per_outer_step / f64::from(h),
            what: what.to_string(),
        })
        .collect()
}
