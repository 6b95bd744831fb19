//! The search over degrees, modes, site orders, stage counts, replica
//! distributions and layer splits. One enumeration serves both the solver
//! and the brute-force placer: in `Effort::Exhaustive` every layer split,
//! site sequence and replica distribution is enumerated and costed; in
//! `Effort::Solve` the split comes from the exact min-max scan, candidates are
//! pruned by a compute lower bound, and large site counts use heuristics.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::PlacementError;
use super::enumerate::{binomial, compositions, proportional, site_sequences};
use super::model::{Ctx, GroupEval, GroupFailure, GroupModel};
use super::replicas::{self, Sync};
use super::sites::{self, Budget};
use crate::cost::{self, Link};
use crate::job::ModeConstraint;
use crate::placement::plan::CrossSiteMode;
use crate::sync::SyncPlan;

/// Stage-count compositions or replica distributions enumerated exactly
/// by the solver before it falls back to a heuristic.
pub(crate) const EXACT_DISTRIBUTIONS: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effort {
    /// Branch and bound over sites, the exact split, every pruning bound.
    Solve,
    /// Every site sequence and subset, with the solver's split and its
    /// pruning of degrees and stage counts: the check of the site search.
    EverySite,
    /// Every site sequence, subset, distribution and layer split, costed.
    Exhaustive,
}

impl Effort {
    /// Whether lower bounds prune degrees, stage counts and groups.
    pub(crate) fn prunes(self) -> bool {
        self != Self::Exhaustive
    }
}

/// What one pass of the search minimises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Aim {
    /// The step time (ties: fewer GPUs).
    StepTime,
    /// Step time × GPUs, the inverse of tokens/s per GPU (ties: fewer GPUs).
    GpuSeconds,
    /// The fewest GPUs whose step is at most `threshold` seconds (ties: the
    /// shorter step).
    FewestGpus { threshold: f64 },
}

impl Aim {
    /// A plan's score: lower is better.
    pub fn score(self, total: f64, gpus: u64) -> f64 {
        match self {
            Self::StepTime => total,
            Self::GpuSeconds => total * gpus as f64,
            Self::FewestGpus { threshold } if total <= threshold => gpus as f64,
            Self::FewestGpus { .. } => f64::INFINITY,
        }
    }

    fn better(self, total: f64, gpus: u64, best: &Choice) -> bool {
        let (a, b) = (self.score(total, gpus), self.score(best.total, best.gpus()));
        a < b
            || (a == b
                && match self {
                    Self::FewestGpus { .. } => total < best.total,
                    Self::StepTime | Self::GpuSeconds => gpus < best.gpus(),
                })
    }
}

/// The degrees of one candidate and its micro-batches per replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub tp: u32,
    /// Expert parallelism (1 for a dense model); it divides each group's
    /// replicas.
    pub ep: u32,
    pub pp: u32,
    pub dp: u32,
    pub v: u32,
    pub m: u64,
}

impl Shape {
    pub fn gpus(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.dp)
    }
}

/// One costed group: its site layout, split and evaluation.
#[derive(Debug, Clone)]
pub(crate) struct CostedGroup {
    pub model: GroupModel,
    pub split: Vec<u32>,
    pub eval: GroupEval,
}

/// Bytes one outer sync moves over the WAN hop between two sites.
pub(crate) type HopBytes = ((usize, usize), f64);

/// A complete candidate plan, before it is turned into a [`super::Plan`].
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    pub tp: u32,
    pub ep: u32,
    pub pp: u32,
    pub dp: u32,
    pub v: u32,
    pub m: u64,
    pub mode: CrossSiteMode,
    pub groups: Vec<CostedGroup>,
    /// Pipeline order (pipeline mode) or outer-sync ring (DiLoCo).
    pub site_order: Vec<usize>,
    pub outer: f64,
    /// Bytes per outer step on each WAN link the outer sync uses.
    pub outer_hops: Vec<HopBytes>,
    /// The sync planner's schedule (DiLoCo only).
    pub sync: Option<Rc<SyncPlan>>,
    pub total: f64,
}

impl Choice {
    pub fn gpus(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.dp)
    }
    /// `single-site`, `cross-site pipeline`, `diloco` or
    /// `cross-site data-parallel`.
    pub fn kind(&self) -> &'static str {
        match self.mode {
            CrossSiteMode::Diloco { .. } => Sync::Diloco.kind(),
            CrossSiteMode::DataParallel => Sync::DataParallel.kind(),
            CrossSiteMode::Pipeline if self.site_order.len() > 1 => "cross-site pipeline",
            CrossSiteMode::Pipeline => "single-site",
        }
    }
}

/// What failed along the way, to explain an infeasible job.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    pub memory: Option<(f64, String)>,
    pub gpus: Option<(u64, u64)>,
    pub capacity: Option<(u64, u64, String)>,
    pub no_link: u64,
    /// The first reason the sync planner gave for refusing a DiLoCo candidate.
    pub sync: Option<String>,
    /// A replica-per-site candidate whose sites could not each hold a whole
    /// group of expert-parallel replicas.
    pub expert_groups: Option<String>,
    /// The fewest GPUs of a set of degrees the GPU budget ruled out, and
    /// the budget.
    pub over_budget: Option<(u64, u64)>,
}

#[derive(Debug)]
pub(crate) struct Outcome {
    pub best: Option<Choice>,
    /// Best total per kind of plan, to explain the mode chosen.
    pub best_by_kind: BTreeMap<&'static str, f64>,
    pub candidates: u64,
    pub failures: Failures,
    /// The site search's nodes and what its budget left out (as scores).
    pub budget: Budget,
    pub aim: Aim,
}

impl Outcome {
    /// Keeps the bound of a node of `gpus` GPUs the budget left out.
    pub fn leave(&mut self, bound: f64, gpus: u64) {
        let score = self.aim.score(bound, gpus);
        self.budget.leave(score);
    }

    /// How much worse than the optimum the best plan's score may be; `None`
    /// when the search was exact.
    pub fn gap(&self) -> Option<f64> {
        let best = self.best.as_ref()?;
        self.budget.gap(self.aim.score(best.total, best.gpus()))
    }
}

/// The degrees the job and topology admit.
#[derive(Debug)]
pub(crate) struct Space {
    pub tps: Vec<u32>,
    /// Expert-parallel degrees: the divisors of the experts ([1] for a
    /// dense model), or the job's.
    pub eps: Vec<u32>,
    pub pps: Vec<u32>,
    pub dps: Vec<u32>,
}

impl Space {
    pub fn new(ctx: &Ctx<'_>) -> Result<Self, PlacementError> {
        let job = ctx.job;
        let c = &job.constraints;
        let model = &job.model;
        if ctx.sites.is_empty() {
            return Err(PlacementError::NoSites);
        }
        let largest = ctx.largest_domain_gpus();
        let limit = c.max_tensor_parallel.unwrap_or(u32::MAX);
        // Key-value heads divide the attention heads (validated), so a
        // degree that divides them divides both.
        let kv_heads = model.kv_heads();
        let tps: Vec<u32> = (1..=kv_heads)
            .filter(|t| kv_heads.is_multiple_of(*t) && model.attention_heads.is_multiple_of(*t))
            .filter(|&t| t <= limit && u64::from(t) <= largest)
            .filter(|&t| c.tensor_parallel.is_none_or(|f| f == t))
            .collect();
        if tps.is_empty() {
            return Err(PlacementError::TensorParallel {
                heads: model.attention_heads,
                kv_heads,
                largest_domain: largest,
                limit: c.tensor_parallel.or(c.max_tensor_parallel),
            });
        }
        let layers = model.layers;
        let pps: Vec<u32> = match c.pipeline_parallel {
            Some(p) if p <= layers => vec![p],
            Some(p) => {
                return Err(PlacementError::PipelineTooDeep {
                    pipeline_parallel: p,
                    layers,
                });
            }
            // Every depth; lower bounds prune the deep ones cheaply.
            None => (1..=layers).collect(),
        };
        let sequences = job.batch.global_batch / job.batch.micro_batch.max(1);
        let dps: Vec<u32> = (1..=sequences)
            .filter(|d| {
                job.batch
                    .global_batch
                    .is_multiple_of(d * job.batch.micro_batch.max(1))
            })
            .filter(|&d| c.data_parallel.is_none_or(|f| f == d))
            .collect();
        if dps.is_empty() {
            return Err(PlacementError::BatchIndivisible {
                global_batch: job.batch.global_batch,
                micro_batch: job.batch.micro_batch,
                data_parallel: c.data_parallel.unwrap_or(0),
            });
        }
        let experts = model.experts();
        let eps: Vec<u32> = (1..=experts)
            .filter(|e| experts.is_multiple_of(*e))
            .filter(|&e| c.expert_parallel.is_none_or(|f| f == e))
            .collect();
        // A data-parallel degree holds whole expert-parallel groups; ep = 1
        // divides every one, so only a fixed degree can leave none.
        if !eps.iter().any(|e| dps.iter().any(|d| d.is_multiple_of(*e))) {
            return Err(PlacementError::ExpertParallel {
                experts,
                expert_parallel: c.expert_parallel.unwrap_or(0),
            });
        }
        Ok(Self { tps, eps, pps, dps })
    }
}

/// Runs the search.
pub(crate) fn search(ctx: &Ctx<'_>, space: &Space, effort: Effort, aim: Aim) -> Outcome {
    let mut out = Outcome {
        best: None,
        best_by_kind: BTreeMap::new(),
        candidates: 0,
        failures: Failures::default(),
        budget: Budget::new(sites::NODE_BUDGET, sites::NODES_PER_SEARCH),
        aim,
    };
    out.budget.enumerated = effort != Effort::Solve;

    let max_gpus = ctx.job.objective.max_gpus.unwrap_or(u64::MAX);
    let available: u64 = ctx.sites.iter().map(|s| s.gpus()).sum();
    let layers = ctx.job.model.layers;
    let micro = u64::from(ctx.job.batch.micro_batch.max(1));
    let max_v = ctx.params.max_virtual_stages.max(1);
    let (pipelines, syncs): (bool, &[Sync]) = match ctx.job.constraints.cross_site_mode {
        None => (true, &[Sync::Diloco, Sync::DataParallel]),
        Some(ModeConstraint::Pipeline) => (true, &[]),
        Some(ModeConstraint::Diloco) => (false, &[Sync::Diloco]),
        Some(ModeConstraint::DataParallel) => (false, &[Sync::DataParallel]),
    };
    // Widest TP and DP first: they usually fit and run fast, so the
    // incumbent is good early and the lower bounds prune the rest.
    for &tp in space.tps.iter().rev() {
        let fastest_layer = fastest_layer_seconds(ctx, tp);
        let largest_hbm = ctx
            .sites
            .iter()
            .flat_map(|s| &s.pools)
            .filter(|p| p.gpus_per_domain >= u64::from(tp))
            .map(|p| p.hbm_bytes * (1.0 - ctx.params.hbm_headroom))
            .fold(0.0, f64::max);
        for &pp in &space.pps {
            for &dp in space.dps.iter().rev() {
                let gpus = u64::from(tp) * u64::from(pp) * u64::from(dp);
                if gpus > available {
                    let better = out.failures.gpus.is_none_or(|(needed, _)| gpus < needed);
                    if better {
                        out.failures.gpus = Some((gpus, available));
                    }
                    continue;
                }
                if gpus > max_gpus {
                    let fewer = out
                        .failures
                        .over_budget
                        .is_none_or(|(least, _)| gpus < least);
                    if fewer {
                        out.failures.over_budget = Some((gpus, max_gpus));
                    }
                    continue;
                }
                if cutoff(&out, gpus) < 0.0 {
                    continue;
                }
                let m = u64::from(ctx.job.batch.global_batch) / (u64::from(dp) * micro);
                // Expert parallelism shares out a stage's replicas.
                let mut eps: Vec<u32> = space
                    .eps
                    .iter()
                    .copied()
                    .filter(|&e| dp.is_multiple_of(e))
                    .collect();
                if effort.prunes() {
                    // The most loaded stage holds at least ⌈L/p⌉ layers of
                    // state (sharded at best dp ways, the experts ep ways)
                    // and one chunk of activations; if even that overflows
                    // the largest HBM, no layout of these degrees fits.
                    // One stage is both ends and holds the embedding and
                    // the LM head too.
                    let layers_here = f64::from(layers.div_ceil(pp));
                    let ends = if pp == 1 {
                        cost::end_stage_bytes(ctx.job, tp, u64::from(dp), 0.0, (true, true))
                    } else {
                        0.0
                    };
                    let activations =
                        cost::activation_bytes_per_layer(ctx.job, tp) / f64::from(max_v);
                    let least = |ep: u32| {
                        let state =
                            cost::state_bytes_per_layer(ctx.job, tp, ep, u64::from(dp), 0.0);
                        layers_here * (state + activations) + ends
                    };
                    // The widest degree holds the least.
                    if let Some(&widest) = eps.last()
                        && least(widest) > largest_hbm
                    {
                        note(
                            &mut out,
                            GroupFailure::Memory {
                                short_bytes: least(widest) - largest_hbm,
                            },
                            || format!("tp={tp} pp={pp} dp={dp}, any layout"),
                        );
                        continue;
                    }
                    eps.retain(|&ep| least(ep) <= largest_hbm);
                }
                // Widest expert parallelism first, like TP and DP.
                for &ep in eps.iter().rev() {
                    // Every layer of the most loaded stage pays its compute,
                    // TP and the least all-to-all ep can cost, every
                    // micro-batch and the fill and drain.
                    let layer = fastest_layer + all_to_all_floor(ctx, tp, ep);
                    let per_stage = f64::from(layers.div_ceil(pp)) * layer;
                    let bound = (m as f64 + f64::from(pp - 1) / f64::from(max_v)) * per_stage;
                    if effort.prunes() && bound > cutoff(&out, gpus) {
                        continue;
                    }
                    // Past the budget of groups costed, the degrees still
                    // unexplored are left out with their bound (once an
                    // incumbent exists, so that a plan is always found).
                    if effort == Effort::Solve
                        && out.best.is_some()
                        && out.budget.evaluations_spent()
                    {
                        out.leave(bound, gpus);
                        continue;
                    }
                    for v in 1..=max_v {
                        // Interleaving needs whole chunks per stage, m
                        // divisible by p (Megatron's schedule), and stays
                        // inside one site: its wrap-around would cross the
                        // WAN v−1 extra times.
                        if v > 1
                            && (pp < 2 || !layers.is_multiple_of(pp * v) || m % u64::from(pp) != 0)
                        {
                            continue;
                        }
                        let shape = Shape {
                            tp,
                            ep,
                            pp,
                            dp,
                            v,
                            m,
                        };
                        if pipelines {
                            pipeline_candidates(ctx, effort, shape, &mut out);
                        }
                        replicas::candidates(ctx, effort, shape, syncs, &mut out);
                    }
                }
            }
        }
    }
    out
}

/// The least expert-parallel all-to-all per layer and micro-batch any
/// stage of `tp` and `ep` can pay, anywhere.
fn all_to_all_floor(ctx: &Ctx<'_>, tp: u32, ep: u32) -> f64 {
    (0..ctx.sites.len())
        .map(|s| site_all_to_all_floor(ctx, s, tp, ep))
        .fold(f64::INFINITY, f64::min)
}

/// The least expert-parallel all-to-all per layer and micro-batch a stage
/// of `tp` and `ep` at `site` can pay: a group of ep replicas fits a
/// scale-up domain only where a domain holds ep TP groups, else it crosses
/// the fabric (or the slower campus link); each pool at the faster of the
/// classes it may use and the least latency, the least over the pools.
/// (A stage runs at its slowest pool's rate, so never below this.)
pub(crate) fn site_all_to_all_floor(ctx: &Ctx<'_>, site: usize, tp: u32, ep: u32) -> f64 {
    if ep <= 1 || ctx.job.model.moe.is_none() {
        return 0.0;
    }
    let params = ctx.params;
    let latency = params
        .fabric_latency_seconds
        .min(params.campus_latency_seconds);
    ctx.sites[site]
        .pools
        .iter()
        .filter(|p| p.gpus_per_domain >= u64::from(tp))
        .map(|p| {
            let fabric = p.nic_bytes / p.oversubscription;
            let link = if p.slots_per_domain(tp) >= u64::from(ep) {
                Link::new(
                    latency.min(params.scale_up_latency_seconds),
                    fabric.max(p.scale_up_bytes),
                )
            } else {
                Link::new(latency, fabric)
            };
            cost::expert_all_to_all_seconds_per_layer(ctx.job, tp, ep, link)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The least time per layer and micro-batch a stage of `shape`'s TP and
/// expert parallelism at `site` can take: [`site_layer_seconds`] and the
/// least all-to-all.
pub(crate) fn site_layer_floor(ctx: &Ctx<'_>, site: usize, shape: Shape) -> f64 {
    site_layer_seconds(ctx, site, shape.tp) + site_all_to_all_floor(ctx, site, shape.tp, shape.ep)
}

fn fastest_layer_seconds(ctx: &Ctx<'_>, tp: u32) -> f64 {
    (0..ctx.sites.len())
        .map(|s| site_layer_seconds(ctx, s, tp))
        .fold(f64::INFINITY, f64::min)
}

/// The least time per layer and micro-batch any stage at `site` can take:
/// a stage runs at its slowest pool's flops and scale-up rate, so it is
/// never faster than the site's best pool.
pub(crate) fn site_layer_seconds(ctx: &Ctx<'_>, site: usize, tp: u32) -> f64 {
    least_over_pools(ctx, site, tp, |pool| pool.layer_seconds)
}

/// The least time the LM head adds to the last stage at `site` per
/// micro-batch: its FLOPs at the site's fastest pool.
pub(crate) fn site_head_seconds(ctx: &Ctx<'_>, site: usize, tp: u32) -> f64 {
    least_over_pools(ctx, site, tp, |pool| pool.head_seconds)
}

/// The least the LM head adds to a last stage at `site`, in that stage's
/// own layers: head / per-layer time is H / (f · (L_f + c·tp·mfu)) for a
/// stage of the slowest flops f and slowest TP rate c of its pools, never
/// below that of the pool with the slowest TP rate, so the least over the
/// pools bounds it.
pub(crate) fn site_head_layers(ctx: &Ctx<'_>, site: usize, tp: u32) -> f64 {
    least_over_pools(ctx, site, tp, |pool| pool.head_seconds / pool.layer_seconds)
}

/// A stage's times on one pool at TP degree `tp`, per micro-batch.
struct PoolTimes {
    /// One layer: compute and TP communication.
    layer_seconds: f64,
    /// The LM head's compute.
    head_seconds: f64,
}

/// The least of `figure` over the pools of `site` whose domains hold a TP
/// group of `tp` (infinite when none does).
fn least_over_pools(
    ctx: &Ctx<'_>,
    site: usize,
    tp: u32,
    figure: impl Fn(&PoolTimes) -> f64,
) -> f64 {
    let head = cost::head_training_flops(ctx.job);
    ctx.sites[site]
        .pools
        .iter()
        .filter(|p| p.gpus_per_domain >= u64::from(tp))
        .map(|p| {
            let compute = f64::from(tp) * p.flops * ctx.params.mfu;
            let link = Link::new(ctx.params.scale_up_latency_seconds, p.scale_up_bytes);
            figure(&PoolTimes {
                layer_seconds: ctx.layer_flops / compute
                    + cost::tp_seconds_per_layer(ctx.job, tp, link),
                head_seconds: head / compute,
            })
        })
        .fold(f64::INFINITY, f64::min)
}

/// The step time a candidate of `gpus` GPUs must not exceed to matter
/// (negative: no step time would do).
pub(crate) fn cutoff(out: &Outcome, gpus: u64) -> f64 {
    let Some(best) = &out.best else {
        return match out.aim {
            Aim::FewestGpus { threshold } => threshold,
            Aim::StepTime | Aim::GpuSeconds => f64::INFINITY,
        };
    };
    match out.aim {
        Aim::StepTime => best.total,
        // With a relative slack of a few ulps: the quotient may round below
        // the step of a plan that ties the incumbent's score on fewer GPUs.
        Aim::GpuSeconds => best.total * best.gpus() as f64 / gpus.max(1) as f64 * (1.0 + 1e-12),
        Aim::FewestGpus { threshold } if best.total > threshold || gpus < best.gpus() => threshold,
        Aim::FewestGpus { .. } if gpus == best.gpus() => best.total,
        Aim::FewestGpus { .. } => -1.0,
    }
}

/// Records a candidate's total and keeps it if it beats the best so far
/// under the pass's aim (ties as [`Aim`] says, then the earlier candidate).
/// The choice is only built when kept: most candidates lose.
pub(crate) fn offer(
    out: &mut Outcome,
    kind: &'static str,
    total: f64,
    gpus: u64,
    build: impl FnOnce() -> Choice,
) {
    out.candidates += 1;
    let entry = out.best_by_kind.entry(kind).or_insert(f64::INFINITY);
    *entry = entry.min(total);
    let better = match &out.best {
        None => true,
        Some(best) => out.aim.better(total, gpus, best),
    };
    if better {
        out.best = Some(build());
    }
}

pub(crate) fn note(out: &mut Outcome, failure: GroupFailure, what: impl FnOnce() -> String) {
    match failure {
        GroupFailure::Memory { short_bytes } => {
            if out
                .failures
                .memory
                .as_ref()
                .is_none_or(|(s, _)| short_bytes < *s)
            {
                out.failures.memory = Some((short_bytes, what()));
            }
        }
        GroupFailure::Capacity {
            needed_slots,
            free_slots,
        } => {
            if out.failures.capacity.is_none() {
                out.failures.capacity = Some((needed_slots, free_slots, what()));
            }
        }
        GroupFailure::NoLink => out.failures.no_link += 1,
        GroupFailure::Pruned => {}
    }
}

/// Builds and splits one group.
pub(crate) fn cost_group(
    ctx: &Ctx<'_>,
    effort: Effort,
    (tp, ep, v, m, replicas): (u32, u32, u32, u64, u64),
    sites: &[(usize, u32)],
    extra_state: f64,
    cutoff: f64,
) -> Result<CostedGroup, GroupFailure> {
    let model = GroupModel::build(ctx, tp, ep, v, m, replicas, sites, extra_state)?;
    let layers = ctx.job.model.layers;
    if effort.prunes() && model.lower_bound(layers) > cutoff {
        return Err(GroupFailure::Pruned);
    }
    let (split, eval) = match effort {
        Effort::Solve | Effort::EverySite => model.best_split(layers)?,
        Effort::Exhaustive => exhaustive_split(&model, layers)?,
    };
    Ok(CostedGroup { model, split, eval })
}

/// Every split into contiguous ranges of whole chunks, costed.
fn exhaustive_split(
    model: &GroupModel,
    layers: u32,
) -> Result<(Vec<u32>, GroupEval), GroupFailure> {
    let v = model.v.max(1);
    let p = model.p();
    let mut best: Option<(Vec<u32>, GroupEval)> = None;
    let mut least_short = f64::INFINITY;
    for units in compositions(layers / v, p, &vec![u32::MAX; p as usize]) {
        let split: Vec<u32> = units.iter().map(|u| u * v).collect();
        match model.evaluate(&split) {
            Ok(eval) => {
                if best.as_ref().is_none_or(|(_, e)| eval.total < e.total) {
                    best = Some((split, eval));
                }
            }
            Err(GroupFailure::Memory { short_bytes }) => least_short = least_short.min(short_bytes),
            Err(other) => return Err(other),
        }
    }
    best.ok_or(GroupFailure::Memory {
        short_bytes: least_short,
    })
}

/// Every pipeline of these degrees worth costing: site sequences from the
/// branch and bound ([`sites::pipeline_sequences`]), or all of them.
fn pipeline_candidates(ctx: &Ctx<'_>, effort: Effort, shape: Shape, out: &mut Outcome) {
    let mut each =
        |out: &mut Outcome, seq: &[usize]| pipeline_sequence(ctx, effort, shape, seq, out);
    if effort == Effort::Solve {
        sites::pipeline_sequences(ctx, shape, out, &mut each);
    } else {
        for seq in site_sequences(ctx, shape.pp as usize) {
            each(out, &seq);
        }
    }
}

/// Costs every stage count of a pipeline along `seq`.
fn pipeline_sequence(
    ctx: &Ctx<'_>,
    effort: Effort,
    shape: Shape,
    seq: &[usize],
    out: &mut Outcome,
) {
    let Shape {
        tp,
        ep,
        pp,
        dp,
        v,
        m,
    } = shape;
    let replicas = u64::from(dp);
    if v > 1 && seq.len() > 1 {
        return;
    }
    let caps: Vec<u32> = seq
        .iter()
        .map(|&s| u32::try_from(ctx.sites[s].slots(tp) / replicas).unwrap_or(u32::MAX))
        .collect();
    let k = seq.len() as u64;
    let counts = if effort == Effort::Exhaustive
        || binomial(u64::from(pp) - 1, k - 1) <= EXACT_DISTRIBUTIONS
    {
        compositions(pp, seq.len() as u32, &caps)
    } else {
        let weights: Vec<f64> = seq.iter().map(|&s| ctx.sites[s].slots(tp) as f64).collect();
        proportional(pp, &weights, &caps).into_iter().collect()
    };
    if counts.is_empty() {
        note(
            out,
            GroupFailure::Capacity {
                needed_slots: u64::from(pp) * replicas,
                free_slots: caps.iter().map(|&c| u64::from(c) * replicas).sum(),
            },
            || format!("tp={tp} pp={pp} dp={dp} on {}", names(ctx, seq)),
        );
    }
    let floors: Vec<f64> = seq
        .iter()
        .map(|&s| site_layer_floor(ctx, s, shape))
        .collect();
    let gpus = shape.gpus();
    let kind = if seq.len() > 1 {
        "cross-site pipeline"
    } else {
        "single-site"
    };
    for count in counts {
        // Skip, before packing, layouts whose continuous balance
        // L / Σ(c_s / a_s) already loses to the best plan.
        if effort.prunes() {
            let speed: f64 = count
                .iter()
                .zip(&floors)
                .map(|(&c, a)| f64::from(c) / a)
                .sum();
            let x = f64::from(ctx.job.model.layers) / speed;
            let bound = (m as f64 + f64::from(pp - 1) / f64::from(v)) * x;
            if bound > cutoff(out, gpus) {
                continue;
            }
        }
        let sites: Vec<(usize, u32)> = seq.iter().copied().zip(count).collect();
        let limit = cutoff(out, gpus);
        out.budget.evaluations += 1;
        match cost_group(ctx, effort, (tp, ep, v, m, replicas), &sites, 0.0, limit) {
            Ok(group) => offer(out, kind, group.eval.total, gpus, || Choice {
                tp,
                ep,
                pp,
                dp,
                v,
                m,
                mode: CrossSiteMode::Pipeline,
                total: group.eval.total,
                groups: vec![group],
                site_order: seq.to_vec(),
                outer: 0.0,
                outer_hops: Vec::new(),
                sync: None,
            }),
            Err(failure) => note(out, failure, || {
                format!(
                    "tp={tp}{} pp={pp} dp={dp} v={v} pipeline over {}",
                    ep_label(ep),
                    names(ctx, seq)
                )
            }),
        }
    }
}

/// ` ep=N` for expert parallelism, nothing for none.
pub(crate) fn ep_label(ep: u32) -> String {
    if ep > 1 {
        format!(" ep={ep}")
    } else {
        String::new()
    }
}

fn names(ctx: &Ctx<'_>, sites: &[usize]) -> String {
    sites
        .iter()
        .map(|&s| ctx.sites[s].id.as_str())
        .collect::<Vec<_>>()
        .join("→")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostParams;
    use crate::job::JobSpec;
    use crate::topology::Topology;

    const TOPOLOGY: &str = r#"
name = "split-check"
gpu_types = [{ name = "slow", hbm = "24 GiB", dense_bf16 = "300 TFLOP/s", scale_up = "400 Gbit/s", max_domain_gpus = 8 }]
[[sites]]
id = "fast"
[[sites.buildings]]
id = "f1"
fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s" }
domains = [{ id = "d", count = 4, nodes_per_domain = 1, gpus_per_node = 8, gpu = "b200" }]
[[sites]]
id = "slow"
[[sites.buildings]]
id = "s1"
fabric = { kind = "leaf-spine", link_rate = "200 Gbit/s", oversubscription = 2.0 }
domains = [{ id = "d", count = 4, nodes_per_domain = 1, gpus_per_node = 8, gpu = "slow" }]
[[links]]
between = ["fast", "slow"]
distance = "300 km"
link_rate = "100 Gbit/s"
loss = 0.0001
"#;

    const JOB: &str = r#"
name = "split-check"
[model]
parameters = 20_000_000_000
layers = 24
hidden_size = 4096
attention_heads = 32
sequence_length = 4096
[batch]
global_batch = 32
micro_batch = 1
"#;

    /// The exact min-max scan of `best_split` equals enumerating all
    /// C(23, 3) splits, on stages of different speeds, memory and DP links
    /// across a WAN boundary, at sizes the public brute force refuses.
    #[test]
    fn best_split_equals_every_split_enumerated() {
        let topology = Topology::from_toml("t.toml", TOPOLOGY).expect("topology");
        let job = JobSpec::from_toml("j.toml", JOB).expect("job");
        let params = CostParams::default();
        let ctx = Ctx::new(&topology, &job, &params);
        let mut checked = 0;
        for (tp, replicas, layout) in [
            (4u32, 2u64, vec![(0usize, 2u32), (1, 2)]),
            (4, 2, vec![(1, 3), (0, 1)]),
            (8, 1, vec![(1, 1), (0, 3)]),
            (2, 4, vec![(0, 4)]),
            (8, 1, vec![(0, 1), (1, 3)]),
        ] {
            let shape = (tp, 1, 1, 32 / replicas, replicas);
            let solved = cost_group(&ctx, Effort::Solve, shape, &layout, 0.0, f64::INFINITY);
            let brute = cost_group(&ctx, Effort::Exhaustive, shape, &layout, 0.0, f64::INFINITY);
            match (solved, brute) {
                (Ok(s), Ok(b)) => {
                    let (x, y) = (s.eval.total, b.eval.total);
                    assert!(
                        (x - y).abs() <= 1e-12 * x.max(y),
                        "tp={tp} {layout:?}: {x} vs {y}"
                    );
                    checked += 1;
                }
                (Err(_), Err(_)) => {}
                (s, b) => panic!(
                    "tp={tp} {layout:?}: {:?} vs {:?}",
                    s.map(|g| g.split),
                    b.map(|g| g.split)
                ),
            }
        }
        assert!(checked >= 4, "only {checked} layouts were feasible");
    }
}
