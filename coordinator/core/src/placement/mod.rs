//! The placement engine: where each kind of parallel work of one job runs.
//!
//! [`place`] searches tensor, pipeline and data-parallel degrees, the
//! interleaving degree, the cross-site mode (one synchronous pipeline
//! across sites, DiLoCo replicas per site with an outer sync every H
//! steps, or replicas per site all-reducing every step), the site order,
//! the replica distribution and the layer split, and returns the plan with the lowest predicted step time under
//! [`crate::cost`]. [`brute_force_place`] enumerates the same space without
//! the solver's shortcuts, for tiny instances; [`validate_plan`] checks
//! every hard constraint of a plan against its inputs.
//!
//! # Model
//!
//! - All replicas share TP and PP. Micro-batches per replica
//!   m = global batch / (DP · micro-batch); in DiLoCo mode the global batch
//!   is split evenly over all replicas of all sites, so the slowest site
//!   paces the inner step.
//! - Pipeline mode: every replica follows the same stage → site map, so a
//!   stage's DP group never leaves its site and only activations cross the
//!   WAN; consecutive sites need a direct link. Interleaving is considered
//!   only inside one site (its wrap-around would cross the WAN v−1 times).
//! - DiLoCo mode: each site of a subset of at least two runs k_s whole
//!   replicas with its own layer split; the step is the slowest site's
//!   inner step t plus (local reduce + exposed sync) / H. The sync planner
//!   ([`crate::sync::plan_sync`], on the links as configured and, through
//!   [`place_measured`], as probed) decides H, fragments, overlap, codec
//!   and collective for that subset and t; its exposed time per outer step
//!   is what the WAN adds. The local reduce is the reduce-scatter and
//!   all-gather among a site's own replicas on its fabric. The plan keeps
//!   the planner's schedule (`Plan::sync`).
//! - Cross-site data-parallel mode: replicas laid out as in DiLoCo, without
//!   DiLoCo's outer state; every step all-reduces the whole gradient across
//!   the sites at the training precision. The step is the slowest site's
//!   inner step (whose in-site DP all-reduce is the reduce-scatter and
//!   all-gather around the WAN exchange) plus the WAN exchange as the sync
//!   planner costs it held to H = 1, one fragment, no overlap and no
//!   quantisation ([`crate::sync::SyncInput::sync_dp`]): the exchange is
//!   not overlapped with the backward pass, which overstates its cost
//!   where buckets would hide some of it. `constraints.cross_site_mode`
//!   restricts the search to one of DiLoCo, cross-site data parallelism, or
//!   single-site and pipeline plans.
//! - Within a site, TP groups are packed by one canonical rule: pools
//!   ordered fastest GPU first (then larger HBM, then declaration order),
//!   slots of tp GPUs inside a domain, stage after stage from one cursor.
//!   The search decides everything above this rule; the brute force does
//!   not enumerate alternative packings either.
//!
//! # Search
//!
//! Degrees are enumerated (TP: divisors of the head count within the
//! domain size and constraints; PP: every depth up to the layer count; DP:
//! every divisor the batch allows). Site sequences, DiLoCo site subsets and
//! outer-sync rings are searched by branch and bound (`sites`): a node is a
//! pipeline's site prefix or a DiLoCo subset, cut when an admissible lower
//! bound exceeds the best plan so far. A node budget bounds huge inputs;
//! once it is spent the search only dives greedily and the plan's "site
//! search" reason says how far from the optimum it may be (or "exact").
//! [`every_site_order_place`] enumerates every site order and subset
//! instead, to check the bounds. Stage counts per site and replica
//! distributions are enumerated exactly up to 4,096 possibilities, then
//! split by capacity or handed out greedily. The layer split is exact (a
//! scan over the slowest stage time with a min-max fill, see
//! `GroupModel::best_split`). Candidates are pruned only by lower
//! bounds, which never discard an optimum.
//!
mod assemble;
mod enumerate;
mod model;
mod plan;
mod recost;
mod replicas;
mod search;
mod sites;
mod validate;

use thiserror::Error;

use crate::config::Validate;
use crate::cost::CostParams;
use crate::job::{Goal, JobSpec, ModeConstraint};
use crate::state::LinkRecord;
use crate::topology::Topology;
use search::Aim;

pub use plan::{
    Binding, CrossSiteMode, Degrees, PipelineGroup, Plan, Reason, Slice, Stage, StepBreakdown,
    WanTraffic,
};
pub use recost::recost;
pub use validate::{validate_plan, validate_plan_with};

/// Why a job cannot be placed, with the numbers that show by how much.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PlacementError {
    #[error("job is invalid: {0}")]
    InvalidJob(String),
    #[error("no allowed site has a usable scale-up domain")]
    NoSites,
    #[error(
        "no tensor-parallel degree divides {heads} attention heads and {kv_heads} key-value \
         heads and fits a scale-up domain (largest allowed domain {largest_domain} GPUs, limit \
         {limit:?})"
    )]
    TensorParallel {
        heads: u32,
        kv_heads: u32,
        largest_domain: u64,
        limit: Option<u32>,
    },
    #[error(
        "expert-parallel degree {expert_parallel} does not divide the {experts} experts, or no \
         admissible data-parallel degree holds whole groups of it"
    )]
    ExpertParallel { experts: u32, expert_parallel: u32 },
    #[error("pipeline-parallel degree {pipeline_parallel} exceeds the {layers} layers")]
    PipelineTooDeep { pipeline_parallel: u32, layers: u32 },
    #[error(
        "global batch {global_batch} is not divisible by data-parallel degree × micro-batch \
         ({data_parallel} × {micro_batch})"
    )]
    BatchIndivisible {
        global_batch: u32,
        micro_batch: u32,
        data_parallel: u32,
    },
    #[error(
        "the smallest admissible plan needs {needed} GPUs but the allowed sites have {available}"
    )]
    NotEnoughGpus { needed: u64, available: u64 },
    #[error(
        "memory does not fit: the closest candidate ({candidate}) needs {gib:.1} GiB \
         ({short_bytes:.0} bytes) more per GPU than HBM minus headroom",
        gib = .short_bytes / 1_073_741_824.0
    )]
    OutOfMemory { short_bytes: f64, candidate: String },
    #[error(
        "not enough scale-up slots: {candidate} needs {needed_slots} TP groups, {free_slots} fit"
    )]
    Capacity {
        needed_slots: u64,
        free_slots: u64,
        candidate: String,
    },
    #[error("no feasible plan: {0}")]
    NoFeasiblePlan(String),
    #[error("too large for brute force: {0}")]
    TooLarge(String),
    #[error(
        "{sites} allowed sites with a usable scale-up domain; placement searches at most \
         {limit}: narrow constraints.allowed_sites"
    )]
    TooManySites { sites: usize, limit: usize },
}

/// Allowed sites (with a usable scale-up domain) placement searches at
/// most: beyond, the site search's per-node work (linear in the sites, for
/// every set of degrees) no longer finishes in minutes.
pub const MAX_PLACEMENT_SITES: usize = 256;

/// Places `job` on `topology` with the default cost assumptions.
pub fn place(topology: &Topology, job: &JobSpec) -> Result<Plan, PlacementError> {
    place_with(topology, job, &CostParams::default())
}

/// Places `job` on `topology`: the best plan for the job's objective (by
/// default the lowest predicted step time, ties broken towards fewer
/// GPUs), further ties going to the first found in search order (TP
/// descending, PP ascending, DP descending, interleaving, then the site
/// search's best-bound-first order), so the same inputs always give the
/// same plan.
pub fn place_with(
    topology: &Topology,
    job: &JobSpec,
    params: &CostParams,
) -> Result<Plan, PlacementError> {
    run(topology, job, params, &[], search::Effort::Solve)
}

/// [`place_with`], the sync planner of DiLoCo candidates reading the latest
/// probe of each link from `links` (the coordinator's link records) beside
/// the configured figures. The topology's links stay what placement costs
/// pipelines with.
pub fn place_measured(
    topology: &Topology,
    job: &JobSpec,
    params: &CostParams,
    links: &[LinkRecord],
) -> Result<Plan, PlacementError> {
    run(topology, job, params, links, search::Effort::Solve)
}

/// Places a tiny job by enumerating every degree, site order, stage count,
/// replica distribution and layer split in the same cost model. Refuses
/// instances beyond 12 GPUs, 3 sites or 12 layers.
pub fn brute_force_place(
    topology: &Topology,
    job: &JobSpec,
    params: &CostParams,
) -> Result<Plan, PlacementError> {
    let (gpus, sites, layers) = (topology.gpus(), topology.sites.len(), job.model.layers);
    if gpus > 12 || sites > 3 || layers > 12 {
        return Err(PlacementError::TooLarge(format!(
            "{gpus} GPUs, {sites} sites, {layers} layers (limits 12, 3, 12)"
        )));
    }
    run(topology, job, params, &[], search::Effort::Exhaustive)
}

/// Places a small job by the solver with every site sequence and DiLoCo
/// subset enumerated instead of the branch and bound over sites: the check
/// that the bounds of the site search never cut an optimum. Refuses more
/// than 8 sites.
pub fn every_site_order_place(
    topology: &Topology,
    job: &JobSpec,
    params: &CostParams,
) -> Result<Plan, PlacementError> {
    let sites = topology.sites.len();
    if sites > 8 {
        return Err(PlacementError::TooLarge(format!("{sites} sites (limit 8)")));
    }
    run(topology, job, params, &[], search::Effort::EverySite)
}

fn run(
    topology: &Topology,
    job: &JobSpec,
    params: &CostParams,
    links: &[LinkRecord],
    effort: search::Effort,
) -> Result<Plan, PlacementError> {
    let mut problems: Vec<String> = job
        .violations()
        .into_iter()
        .chain(job.violations_against(topology))
        .map(|v| format!("{}: {}", v.path, v.message))
        .collect();
    if !(params.mfu > 0.0 && params.mfu <= 1.0) {
        problems.push(format!(
            "cost parameter mfu must be in (0, 1], found {}",
            params.mfu
        ));
    }
    if !(0.0..1.0).contains(&params.hbm_headroom) {
        problems.push(format!(
            "hbm_headroom must be in [0, 1), found {}",
            params.hbm_headroom
        ));
    }
    if !problems.is_empty() {
        return Err(PlacementError::InvalidJob(problems.join("; ")));
    }
    let ctx = model::Ctx::new(topology, job, params).with_measurements(links);
    if ctx.sites.len() > MAX_PLACEMENT_SITES {
        return Err(PlacementError::TooManySites {
            sites: ctx.sites.len(),
            limit: MAX_PLACEMENT_SITES,
        });
    }
    let space = search::Space::new(&ctx)?;
    // The fastest plan first: the default objective's answer, and the
    // measure of the others (the runner-up they rejected, and the step
    // `fewest-gpus` must stay within). The fastest plan's runner-up is the
    // one with the fewest GPUs within the default slowdown.
    let fastest = search::search(&ctx, &space, effort, Aim::StepTime);
    let (outcome, runner_up) = match (job.objective.goal, &fastest.best) {
        (_, None) => (fastest, None),
        (Goal::StepTime, Some(quickest)) => {
            // The runner-up: the fewest GPUs within the default slowdown.
            let threshold = quickest.total * (1.0 + crate::job::DEFAULT_WITHIN);
            let fewest = search::search(&ctx, &space, effort, Aim::FewestGpus { threshold });
            let within = fewest.best.filter(|b| b.total <= threshold);
            (fastest, within)
        }
        (Goal::ThroughputPerGpu, Some(quickest)) => {
            let quickest = quickest.clone();
            let efficient = search::search(&ctx, &space, effort, Aim::GpuSeconds);
            if efficient.best.is_some() {
                (efficient, Some(quickest))
            } else {
                (fastest, None)
            }
        }
        (Goal::FewestGpus, Some(quickest)) => {
            let quickest = quickest.clone();
            let threshold = quickest.total * (1.0 + job.objective.within());
            let fewest = search::search(&ctx, &space, effort, Aim::FewestGpus { threshold });
            match &fewest.best {
                Some(best) if best.total <= threshold => (fewest, Some(quickest)),
                _ => (fastest, None),
            }
        }
    };
    match &outcome.best {
        Some(choice) => Ok(assemble::plan(
            &ctx,
            topology,
            choice,
            &outcome,
            runner_up.as_ref(),
        )),
        None if ctx.sites.len() < 2
            && matches!(
                job.constraints.cross_site_mode,
                Some(ModeConstraint::Diloco | ModeConstraint::DataParallel)
            ) =>
        {
            Err(PlacementError::NoFeasiblePlan(format!(
                "constraints.cross_site_mode is \"{}\" but only {} allowed site has a usable \
                 scale-up domain; replicas at several sites need two or more",
                job.constraints
                    .cross_site_mode
                    .map_or("", ModeConstraint::as_str),
                ctx.sites.len()
            )))
        }
        None => Err(explain(outcome.failures)),
    }
}

fn explain(mut f: search::Failures) -> PlacementError {
    let Some((least, max)) = f.over_budget.take() else {
        return explain_within(f);
    };
    let within = match explain_within(f) {
        PlacementError::NoFeasiblePlan(why) => why,
        other => other.to_string(),
    };
    PlacementError::NoFeasiblePlan(format!(
        "within objective.max_gpus ({max} GPUs): {within}; the smallest set of degrees above \
         it needs {least} GPUs"
    ))
}

fn explain_within(f: search::Failures) -> PlacementError {
    if let Some((short_bytes, candidate)) = f.memory {
        return PlacementError::OutOfMemory {
            short_bytes,
            candidate,
        };
    }
    if let Some((needed_slots, free_slots, candidate)) = f.capacity {
        return PlacementError::Capacity {
            needed_slots,
            free_slots,
            candidate,
        };
    }
    if let Some((needed, available)) = f.gpus {
        return PlacementError::NotEnoughGpus { needed, available };
    }
    let sync = f
        .sync
        .map(|why| format!("; the sync planner refused a cross-site sync: {why}"))
        .unwrap_or_default()
        + &f.expert_groups
            .map(|why| format!("; {why}"))
            .unwrap_or_default();
    PlacementError::NoFeasiblePlan(format!(
        "every candidate was rejected ({} needed a WAN link that does not exist{sync})",
        f.no_link
    ))
}
