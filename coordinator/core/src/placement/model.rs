//! The placement model shared by the solver, the brute-force placer and the
//! checker: the allowed sites and their pools of scale-up domains, the
//! canonical packer of TP groups into domains, and the cost of one group of
//! identical pipeline replicas for a given layer split.

use crate::cost::{
    self, Boundary, CostParams, Link, PipelineTime, in_flight_chunks, ring_all_reduce,
};
use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::job::JobSpec;
use crate::state::LinkRecord;
use crate::topology::{Topology, WanLink};

/// Identical scale-up domains of one GPU type in one building.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub building: usize,
    pub building_id: String,
    pub group_id: String,
    pub domains: u64,
    pub gpus_per_domain: u64,
    pub gpus_per_node: u32,
    pub flops: f64,
    pub hbm_bytes: f64,
    pub scale_up_bytes: f64,
    pub nic_bytes: f64,
    pub oversubscription: f64,
}

impl Pool {
    pub fn slots_per_domain(&self, tp: u32) -> u64 {
        self.gpus_per_domain / u64::from(tp.max(1))
    }
    pub fn slots(&self, tp: u32) -> u64 {
        self.domains * self.slots_per_domain(tp)
    }
}

/// An allowed site, its pools in packing order (fastest, then largest HBM,
/// then declaration order, so packing is deterministic).
#[derive(Debug, Clone)]
pub(crate) struct SiteModel {
    pub id: String,
    pub pools: Vec<Pool>,
    pub campus_bytes: Option<f64>,
}

impl SiteModel {
    pub fn slots(&self, tp: u32) -> u64 {
        self.pools.iter().map(|p| p.slots(tp)).sum()
    }
    pub fn gpus(&self) -> u64 {
        self.pools
            .iter()
            .map(|p| p.domains * p.gpus_per_domain)
            .sum()
    }
}

/// Consecutive slots `first..first + count` of pool `pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SliceRef {
    pub pool: usize,
    pub first: u64,
    pub count: u64,
}

/// Everything the placement search needs, derived once.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub job: &'a JobSpec,
    pub params: &'a CostParams,
    pub sites: Vec<SiteModel>,
    /// The WAN bundle between allowed sites a < b, keyed (a, b): memory
    /// grows with the links, not with the square of the sites.
    pub links: HashMap<(usize, usize), WanLink>,
    /// `neighbours[a]`: the allowed sites linked to a, ascending.
    pub neighbours: Vec<Vec<usize>>,
    pub layer_flops: f64,
    pub activation_bytes: f64,
    /// The latest probe of each WAN link, where the caller has them: the
    /// sync planner reads them beside the configured figures.
    pub measurements: &'a [LinkRecord],
}

impl<'a> Ctx<'a> {
    /// GPUs in the largest scale-up domain of any allowed site: the widest
    /// tensor-parallel group possible.
    pub fn largest_domain_gpus(&self) -> u64 {
        self.sites
            .iter()
            .flat_map(|s| &s.pools)
            .map(|p| p.gpus_per_domain)
            .max()
            .unwrap_or(0)
    }

    pub fn new(topology: &'a Topology, job: &'a JobSpec, params: &'a CostParams) -> Self {
        let allowed = |id: &str| {
            job.constraints.allowed_sites.is_empty()
                || job.constraints.allowed_sites.iter().any(|s| s == id)
        };
        let sites: Vec<SiteModel> = topology
            .sites
            .iter()
            .filter(|s| allowed(&s.id))
            .map(|site| {
                let mut pools = Vec::new();
                for (b, building) in site.buildings.iter().enumerate() {
                    for group in &building.domains {
                        // An unknown GPU type is a topology error the config
                        // layer reports; here the pool is simply unusable.
                        let Some(gpu) = topology.gpu_type(&group.gpu) else {
                            continue;
                        };
                        pools.push(Pool {
                            building: b,
                            building_id: building.id.clone(),
                            group_id: group.id.clone(),
                            domains: u64::from(group.count),
                            gpus_per_domain: group.gpus_per_domain(),
                            gpus_per_node: group.gpus_per_node,
                            flops: gpu.dense_bf16.flops(),
                            hbm_bytes: gpu.hbm.bytes() as f64,
                            scale_up_bytes: gpu.scale_up.bytes_per_second(),
                            nic_bytes: building.fabric.link_rate.bytes_per_second(),
                            oversubscription: building.fabric.oversubscription.max(1.0),
                        });
                    }
                }
                // Stable sort keeps declaration order among equal pools.
                pools.sort_by(|x, y| {
                    y.flops
                        .total_cmp(&x.flops)
                        .then(y.hbm_bytes.total_cmp(&x.hbm_bytes))
                });
                SiteModel {
                    id: site.id.clone(),
                    pools,
                    campus_bytes: site.campus_interconnect.map(|r| r.bytes_per_second()),
                }
            })
            .filter(|s| !s.pools.is_empty())
            .collect();
        let index: HashMap<&str, usize> = sites
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .collect();
        let mut links = HashMap::new();
        let mut neighbours = vec![Vec::new(); sites.len()];
        for link in &topology.links {
            let [a, b] = &link.between;
            let (Some(&a), Some(&b)) = (index.get(a.as_str()), index.get(b.as_str())) else {
                continue;
            };
            if a == b {
                continue;
            }
            // The first entry for a pair is the one `Topology::link` finds.
            if let Entry::Vacant(slot) = links.entry((a.min(b), a.max(b))) {
                slot.insert(link.clone());
                neighbours[a].push(b);
                neighbours[b].push(a);
            }
        }
        for list in &mut neighbours {
            list.sort_unstable();
        }
        Self {
            job,
            params,
            sites,
            links,
            neighbours,
            layer_flops: cost::layer_training_flops(job),
            activation_bytes: cost::activation_message_bytes(job),
            measurements: &[],
        }
    }

    /// The same context, with the latest probes of the WAN links.
    pub fn with_measurements(self, measurements: &'a [LinkRecord]) -> Self {
        Self {
            measurements,
            ..self
        }
    }

    pub fn link(&self, a: usize, b: usize) -> Option<&WanLink> {
        self.links.get(&(a.min(b), a.max(b)))
    }

    /// The allowed sites linked to `site`, ascending.
    pub fn neighbours(&self, site: usize) -> &[usize] {
        self.neighbours.get(site).map_or(&[], Vec::as_slice)
    }

    /// Packs `demands[i]` TP groups for each stage `i` into the site's
    /// domains, stage after stage from one cursor, so a stage's replicas
    /// sit together (short DP rings) and neighbouring stages are adjacent.
    /// `None` when the site has too few slots.
    pub fn pack(&self, site: usize, tp: u32, demands: &[u64]) -> Option<Vec<Vec<SliceRef>>> {
        let pools = &self.sites.get(site)?.pools;
        let (mut pool, mut used) = (0usize, 0u64);
        let mut out = Vec::with_capacity(demands.len());
        for &demand in demands {
            let mut slices = Vec::new();
            let mut left = demand;
            while left > 0 {
                let free = pools.get(pool)?.slots(tp) - used;
                if free == 0 {
                    pool += 1;
                    used = 0;
                    continue;
                }
                let take = free.min(left);
                slices.push(SliceRef {
                    pool,
                    first: used,
                    count: take,
                });
                used += take;
                left -= take;
            }
            out.push(slices);
        }
        Some(out)
    }
}

/// One stage's constants: its cost per layer and memory per layer.
#[derive(Debug, Clone)]
pub(crate) struct StageModel {
    pub site: usize,
    pub slices: Vec<SliceRef>,
    pub compute_per_layer: f64,
    pub tp_per_layer: f64,
    pub usable_hbm: f64,
    pub state_per_layer: f64,
    pub activation_per_layer: f64,
    pub in_flight: u64,
    pub dp: DpCollective,
    /// Gradient bytes per layer all-reduced over all the stage's replicas
    /// (a mixture-of-experts layer's dense part) ...
    pub grad_bytes_per_layer: f64,
    /// ... and over the replicas / ep that hold the same experts.
    pub expert_grad_bytes_per_layer: f64,
    /// The expert-parallel degree and its all-to-all per layer and
    /// micro-batch (zero for a dense model).
    pub ep: u32,
    pub ep_per_layer: f64,
    /// What an end stage adds beyond its layers (zero elsewhere): the LM
    /// head's compute on the last, the embedding's and the head's memory
    /// and gradients ([`cost::end_stage_bytes`]).
    pub end_seconds: f64,
    pub end_bytes: f64,
    pub end_grad_bytes: f64,
}

/// A group of `replicas` identical pipelines whose stages are laid out along
/// `sites` (site, stage count), with everything but the layer split fixed.
#[derive(Debug, Clone)]
pub(crate) struct GroupModel {
    pub v: u32,
    pub m: u64,
    pub replicas: u64,
    pub stages: Vec<StageModel>,
    pub boundaries: Vec<Boundary>,
    /// For each boundary that crosses the WAN, the two sites.
    pub wan_boundaries: Vec<(usize, usize)>,
}

/// The cost of a group for one layer split.
#[derive(Debug, Clone)]
pub(crate) struct GroupEval {
    pub pipeline: PipelineTime,
    pub compute: f64,
    pub tensor_parallel: f64,
    /// The slowest stage's expert-parallel all-to-all, every micro-batch.
    pub expert_parallel: f64,
    pub exposed_dp: f64,
    pub total: f64,
    pub memory: Vec<f64>,
}

/// Why a group cannot be built or split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum GroupFailure {
    Capacity {
        needed_slots: u64,
        free_slots: u64,
    },
    NoLink,
    Memory {
        short_bytes: f64,
    },
    /// Cannot beat the best plan found so far (not a failure).
    Pruned,
}

impl GroupModel {
    /// Builds the group or says which constraint fails. `extra_state` is the
    /// DiLoCo state per parameter (0 in pipeline mode); `ep` divides
    /// `replicas`.
    #[allow(clippy::too_many_arguments)] // reason: the group's degrees, each named.
    pub fn build(
        ctx: &Ctx<'_>,
        tp: u32,
        ep: u32,
        v: u32,
        m: u64,
        replicas: u64,
        sites: &[(usize, u32)],
        extra_state: f64,
    ) -> Result<Self, GroupFailure> {
        let p: u32 = sites.iter().map(|&(_, c)| c).sum();
        let mut stages = Vec::with_capacity(p as usize);
        for &(site, count) in sites {
            let demands = vec![replicas; count as usize];
            let packed = ctx.pack(site, tp, &demands).ok_or(GroupFailure::Capacity {
                needed_slots: replicas * u64::from(count),
                free_slots: ctx.sites.get(site).map_or(0, |s| s.slots(tp)),
            })?;
            for slices in packed {
                let index = stages.len() as u32;
                stages.push(stage_model(
                    ctx,
                    site,
                    slices,
                    (tp, ep),
                    p,
                    index,
                    m,
                    v,
                    replicas,
                    extra_state,
                ));
            }
        }
        let mut boundaries = Vec::new();
        let mut wan_boundaries = Vec::new();
        for pair in stages.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let link = if a.site == b.site {
                in_site_p2p_link(ctx, a, b, tp, replicas)
            } else {
                let wan = ctx.link(a.site, b.site).ok_or(GroupFailure::NoLink)?;
                wan_boundaries.push((a.site, b.site));
                let streams = u64::from(tp) * u64::from(ctx.params.wan_streams_per_gpu);
                cost::wan_link(wan, streams, replicas)
            };
            boundaries.push(Boundary {
                latency_seconds: link.transfer(ctx.activation_bytes),
                serialisation_seconds: link.serialisation(ctx.activation_bytes),
            });
        }
        Ok(Self {
            v,
            m,
            replicas,
            stages,
            boundaries,
            wan_boundaries,
        })
    }

    pub fn p(&self) -> u32 {
        self.stages.len() as u32
    }

    pub fn stage_seconds(&self, j: usize, layers: u32) -> f64 {
        let s = &self.stages[j];
        f64::from(layers) * self.slope(j) + s.end_seconds
    }

    /// Seconds per layer of stage `j` (its time less the end stage's part).
    fn slope(&self, j: usize) -> f64 {
        let s = &self.stages[j];
        s.compute_per_layer + s.tp_per_layer + s.ep_per_layer
    }

    /// Stage `j`'s data-parallel all-reduce: the dense gradients over all
    /// its replicas, then a mixture-of-experts layer's expert gradients
    /// over the replicas / ep that hold the same experts.
    pub fn dp_seconds(&self, j: usize, layers: u32) -> f64 {
        let s = &self.stages[j];
        let bytes = f64::from(layers) * s.grad_bytes_per_layer + s.end_grad_bytes;
        let dense = s.dp.all_reduce(self.replicas, bytes);
        let ep = u64::from(s.ep.max(1));
        let holders = self.replicas / ep;
        // With one holder per expert shard there is nothing to reduce.
        if s.expert_grad_bytes_per_layer == 0.0 || holders <= 1 {
            return dense;
        }
        let experts = f64::from(layers) * s.expert_grad_bytes_per_layer;
        dense + s.dp.strided(ep, self.replicas).all_reduce(holders, experts)
    }

    pub fn memory(&self, j: usize, layers: u32) -> f64 {
        let s = &self.stages[j];
        f64::from(layers) * s.state_per_layer
            + s.activation_per_layer * s.in_flight as f64 * f64::from(layers) / f64::from(self.v)
            + s.end_bytes
    }

    /// The least slowest-stage time X that can hold `units` chunks of `v`
    /// layers: Σ_j (X − end_j) / (v · slope_j) ≥ units.
    fn balance(&self, units: f64, v: f64) -> f64 {
        let (mut inverse, mut offset) = (0.0, 0.0);
        for j in 0..self.stages.len() {
            let per_unit = v * self.slope(j);
            inverse += 1.0 / per_unit;
            offset += self.stages[j].end_seconds / per_unit;
        }
        (units + offset) / inverse
    }

    /// The cost of the split `layers` (one count per stage), or by how much
    /// memory it overflows.
    pub fn evaluate(&self, layers: &[u32]) -> Result<GroupEval, GroupFailure> {
        let mut memory = Vec::with_capacity(layers.len());
        let mut worst = f64::NEG_INFINITY;
        for (j, &l) in layers.iter().enumerate() {
            let used = self.memory(j, l);
            worst = worst.max(used - self.stages[j].usable_hbm);
            memory.push(used);
        }
        if worst > 0.0 {
            return Err(GroupFailure::Memory { short_bytes: worst });
        }
        let times: Vec<f64> = (0..layers.len())
            .map(|j| self.stage_seconds(j, layers[j]))
            .collect();
        let pipeline = cost::pipeline_time(&times, self.m, self.v, &self.boundaries);
        let slowest =
            (0..times.len()).fold(0, |best, j| if times[j] > times[best] { j } else { best });
        let s = &self.stages[slowest];
        let l = f64::from(layers[slowest]);
        let exposed_dp = (0..layers.len())
            .map(|j| self.dp_seconds(j, layers[j]))
            .fold(0.0, f64::max);
        let m = self.m as f64;
        Ok(GroupEval {
            pipeline,
            compute: m * (l * s.compute_per_layer + s.end_seconds),
            tensor_parallel: m * l * s.tp_per_layer,
            expert_parallel: m * l * s.ep_per_layer,
            exposed_dp,
            total: pipeline.total + exposed_dp,
            memory,
        })
    }

    /// A lower bound on any split's total: the slowest stage is at least
    /// the continuous balance (L + Σ e_j/a_j) / Σ(1/a_j) (a_j seconds per
    /// layer, e_j an end stage's extra), every boundary's latency is paid on
    /// the first forward and last backward.
    pub fn lower_bound(&self, total_layers: u32) -> f64 {
        let p = self.stages.len();
        let v = f64::from(self.v.max(1));
        let x = self.balance(f64::from(total_layers), 1.0);
        let latency: f64 = self.boundaries.iter().map(|b| b.latency_seconds).sum();
        (self.m as f64 + (p as f64 - 1.0) / v) * x + 2.0 * v * latency
    }

    /// The most units (chunks of v layers) stage `j` can take with its time
    /// at most `x` and its memory within HBM, capped at `limit`. Division
    /// gives the estimate; the exact predicates settle rounding.
    fn cap(limit: u32, fits: impl Fn(u32) -> bool, estimate: f64) -> u32 {
        let mut u = if estimate.is_finite() {
            estimate.clamp(0.0, f64::from(limit)) as u32
        } else {
            limit
        };
        while u < limit && fits(u + 1) {
            u += 1;
        }
        while u > 0 && !fits(u) {
            u -= 1;
        }
        u
    }

    fn time_cap(&self, j: usize, x: f64, memory_cap: u32) -> u32 {
        let v = self.v.max(1);
        let per_unit = f64::from(v) * self.slope(j);
        let estimate = if per_unit > 0.0 {
            (x - self.stages[j].end_seconds) / per_unit
        } else {
            f64::INFINITY
        };
        Self::cap(memory_cap, |u| self.stage_seconds(j, u * v) <= x, estimate)
    }

    /// The split that minimises [`GroupModel::evaluate`], exactly.
    ///
    /// The total is increasing in the slowest stage time X and
    /// non-decreasing in the slowest DP all-reduce Y. For each candidate X
    /// (some stage's time at some layer count, ascending), every stage is
    /// capped at the layers that keep it within X and within memory, and a
    /// greedy fill minimises Y under those caps (adding a unit to the stage
    /// whose all-reduce stays smallest is optimal for a min-max of increasing
    /// functions). The optimum is reached at its own X, so scanning all X is
    /// exact; the scan starts at the first X whose caps hold every layer
    /// (feasibility is monotone in X) and stops once the bound for X exceeds
    /// the best found.
    pub fn best_split(&self, total_layers: u32) -> Result<(Vec<u32>, GroupEval), GroupFailure> {
        let p = self.stages.len();
        let v = self.v.max(1);
        if p == 0 || !total_layers.is_multiple_of(v) || ((total_layers / v) as usize) < p {
            return Err(GroupFailure::Memory {
                short_bytes: f64::INFINITY,
            });
        }
        let units = total_layers / v;
        let limit = units - (p as u32 - 1);
        let memory_cap: Vec<u32> = (0..p)
            .map(|j| {
                let fixed = self.memory(j, 0);
                let per_unit = self.memory(j, v) - fixed;
                let room = self.stages[j].usable_hbm;
                let estimate = if per_unit > 0.0 {
                    (room - fixed) / per_unit
                } else {
                    f64::INFINITY
                };
                Self::cap(limit, |u| self.memory(j, u * v) <= room, estimate)
            })
            .collect();
        let holds = |caps: &[u32]| {
            caps.iter().all(|&c| c > 0)
                && caps.iter().map(|&c| u64::from(c)).sum::<u64>() >= u64::from(units)
        };
        if !holds(&memory_cap) {
            return Err(GroupFailure::Memory {
                short_bytes: self.memory_shortfall(units),
            });
        }
        let fill = |caps: &[u32]| -> Option<Vec<u32>> {
            let mut split = vec![1u32; p];
            for _ in 0..(units as usize - p) {
                let mut pick: Option<(usize, f64)> = None;
                for j in 0..p {
                    if split[j] < caps[j] {
                        let y = self.dp_seconds(j, (split[j] + 1) * v);
                        if pick.is_none_or(|(_, best)| y < best) {
                            pick = Some((j, y));
                        }
                    }
                }
                let (j, _) = pick?;
                split[j] += 1;
            }
            Some(split.into_iter().map(|u| u * v).collect())
        };
        let unbounded = fill(&memory_cap).ok_or(GroupFailure::Memory { short_bytes: 0.0 })?;
        let y_floor = (0..p)
            .map(|j| self.dp_seconds(j, unbounded[j]))
            .fold(0.0, f64::max);
        let latency: f64 = self.boundaries.iter().map(|b| b.latency_seconds).sum();
        let scale = self.m as f64 + (p as f64 - 1.0) / f64::from(v);
        // Stages with the same time per unit and end-stage extra yield the
        // same candidates, and no X below the continuous balance can hold
        // every layer.
        let mut per_unit: Vec<(f64, f64, usize, u32)> = (0..p)
            .map(|j| (self.slope(j), self.stages[j].end_seconds, j, memory_cap[j]))
            .collect();
        per_unit.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.total_cmp(&b.1))
                .then(b.3.cmp(&a.3))
        });
        per_unit.dedup_by(|later, earlier| later.0 == earlier.0 && later.1 == earlier.1);
        let x_floor = self.balance(f64::from(units), f64::from(v)) * (1.0 - 1e-9);
        let mut candidates: Vec<f64> = per_unit
            .iter()
            .flat_map(|&(_, _, j, cap)| (1..=cap).map(move |u| (j, u)))
            .map(|(j, u)| self.stage_seconds(j, u * v))
            .filter(|&x| x >= x_floor)
            .collect();
        candidates.sort_by(f64::total_cmp);
        candidates.dedup();
        let caps_at =
            |x: f64| -> Vec<u32> { (0..p).map(|j| self.time_cap(j, x, memory_cap[j])).collect() };
        // First candidate whose caps hold every unit (binary search).
        let (mut lo, mut hi) = (0usize, candidates.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if holds(&caps_at(candidates[mid])) {
                hi = mid
            } else {
                lo = mid + 1
            }
        }
        let mut best: Option<(Vec<u32>, GroupEval)> = None;
        for &x in &candidates[lo..] {
            let bound = scale * x + 2.0 * f64::from(v) * latency + y_floor;
            if best.as_ref().is_some_and(|(_, e)| bound > e.total) {
                break;
            }
            let caps = caps_at(x);
            let Some(split) = fill(&caps) else { continue };
            if let Ok(eval) = self.evaluate(&split)
                && best.as_ref().is_none_or(|(_, e)| eval.total < e.total)
            {
                best = Some((split, eval));
            }
        }
        best.ok_or(GroupFailure::Memory { short_bytes: 0.0 })
    }

    /// How much more memory per GPU the most loaded stage of an even split
    /// would need: the figure an infeasible job is reported with. (Cheap on
    /// purpose; it runs for every rejected candidate.)
    fn memory_shortfall(&self, units: u32) -> f64 {
        let p = self.stages.len() as u32;
        let v = self.v.max(1);
        let even = units.div_ceil(p.max(1)) * v;
        (0..self.stages.len())
            .map(|j| self.memory(j, even) - self.stages[j].usable_hbm)
            .fold(0.0, f64::max)
    }
}

#[allow(clippy::too_many_arguments)] // reason: one stage's inputs, named at the single call site.
fn stage_model(
    ctx: &Ctx<'_>,
    site: usize,
    slices: Vec<SliceRef>,
    (tp, ep): (u32, u32),
    p: u32,
    index: u32,
    m: u64,
    v: u32,
    replicas: u64,
    extra_state: f64,
) -> StageModel {
    let pools = &ctx.sites[site].pools;
    let used = || slices.iter().map(|s| &pools[s.pool]);
    let flops = used().map(|p| p.flops).fold(f64::INFINITY, f64::min);
    let hbm = used().map(|p| p.hbm_bytes).fold(f64::INFINITY, f64::min);
    let scale_up = used()
        .map(|p| p.scale_up_bytes)
        .fold(f64::INFINITY, f64::min);
    let job = ctx.job;
    let params = ctx.params;
    let tp_link = Link::new(params.scale_up_latency_seconds, scale_up);
    let ends = (index == 0, index + 1 == p);
    let element = f64::from(job.training.precision.bytes());
    let end_parameters =
        cost::embedding_parameters(job) * f64::from(u8::from(ends.0) + u8::from(ends.1));
    // Without expert parallelism the experts' gradients join the dense
    // all-reduce (one collective, one latency).
    let ep = ep.max(1);
    let experts = if ep > 1 {
        cost::expert_layer_parameters(job)
    } else {
        0.0
    };
    StageModel {
        end_seconds: if ends.1 {
            cost::head_training_flops(job) / (f64::from(tp) * flops * params.mfu)
        } else {
            0.0
        },
        end_bytes: cost::end_stage_bytes(job, tp, replicas, extra_state, ends),
        end_grad_bytes: end_parameters / f64::from(tp) * element,
        site,
        compute_per_layer: ctx.layer_flops / (f64::from(tp) * flops * params.mfu),
        tp_per_layer: cost::tp_seconds_per_layer(job, tp, tp_link),
        usable_hbm: hbm * (1.0 - params.hbm_headroom),
        state_per_layer: cost::state_bytes_per_layer(job, tp, ep, replicas, extra_state),
        activation_per_layer: cost::activation_bytes_per_layer(job, tp),
        in_flight: in_flight_chunks(index, p, m, v),
        dp: dp_collective(ctx, site, &slices, tp, tp_link),
        grad_bytes_per_layer: (cost::layer_parameters(job) - experts) / f64::from(tp) * element,
        expert_grad_bytes_per_layer: experts / (f64::from(tp) * f64::from(ep)) * element,
        ep,
        ep_per_layer: cost::expert_all_to_all_seconds_per_layer(
            job,
            tp,
            ep,
            ep_link(ctx, site, &slices, (tp, ep), replicas, tp_link),
        ),
        slices,
    }
}

/// The per-GPU fabric rate (NIC over oversubscription) of the slowest of
/// `pools`: what a collective or transfer over all of them runs at.
fn slowest_fabric<'p>(pools: impl Iterator<Item = &'p Pool>) -> f64 {
    pools
        .map(|p| p.nic_bytes / p.oversubscription)
        .fold(f64::INFINITY, f64::min)
}

/// How a stage's data-parallel gradients are all-reduced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum DpCollective {
    /// One ring on one link class.
    Ring(Link),
    /// Across buildings: reduce-scatter among the `local` replicas of each
    /// building on its fabric, all-reduce of S/local among `buildings` on
    /// the campus interconnect, all-gather locally.
    Hierarchical {
        local: u64,
        local_link: Link,
        buildings: u64,
        cross_link: Link,
    },
}

impl DpCollective {
    /// The collective among every `stride`-th of `replicas` replicas (those
    /// holding the same experts): the same links; of the most loaded
    /// building's `local` replicas at most ⌈local/stride⌉ are among them,
    /// and they sit in at most replicas/stride buildings.
    pub fn strided(&self, stride: u64, replicas: u64) -> Self {
        let stride = stride.max(1);
        match *self {
            Self::Hierarchical {
                local,
                local_link,
                buildings,
                cross_link,
            } => Self::Hierarchical {
                local: local.div_ceil(stride).max(1),
                local_link,
                buildings: buildings.min((replicas / stride).max(1)),
                cross_link,
            },
            ring => ring,
        }
    }

    pub fn all_reduce(&self, replicas: u64, bytes: f64) -> f64 {
        match *self {
            Self::Ring(link) => ring_all_reduce(replicas, bytes, link),
            Self::Hierarchical {
                local,
                local_link,
                buildings,
                cross_link,
            } => cost::hierarchical_all_reduce(bytes, local, local_link, buildings, cross_link),
        }
    }
}

/// The collective a stage's data-parallel group runs: NVLink when all its
/// TP groups share one domain, the building fabric (per-GPU NIC divided by
/// oversubscription) within a building, else hierarchical across the
/// buildings, the campus interconnect shared by the tp · local concurrent
/// cross-building rings, each crossing the cut twice. Uneven buildings are
/// costed at the most loaded one.
fn dp_collective(
    ctx: &Ctx<'_>,
    site: usize,
    slices: &[SliceRef],
    tp: u32,
    scale_up: Link,
) -> DpCollective {
    let pools = &ctx.sites[site].pools;
    let params = ctx.params;
    let one_domain = match slices {
        [only] => {
            let spd = pools[only.pool].slots_per_domain(tp).max(1);
            only.first / spd == (only.first + only.count - 1) / spd
        }
        _ => false,
    };
    if one_domain {
        return DpCollective::Ring(scale_up);
    }
    let fabric = slowest_fabric(slices.iter().map(|s| &pools[s.pool]));
    let fabric_link = Link::new(params.fabric_latency_seconds, fabric);
    let mut per_building: Vec<(usize, u64)> = Vec::new();
    for s in slices {
        let b = pools[s.pool].building;
        match per_building.iter_mut().find(|(id, _)| *id == b) {
            Some((_, n)) => *n += s.count,
            None => per_building.push((b, s.count)),
        }
    }
    if per_building.len() <= 1 {
        return DpCollective::Ring(fabric_link);
    }
    let local = per_building.iter().map(|&(_, n)| n).max().unwrap_or(1);
    let campus =
        ctx.sites[site].campus_bytes.unwrap_or(fabric) / (2.0 * f64::from(tp) * local as f64);
    DpCollective::Hierarchical {
        local,
        local_link: fabric_link,
        buildings: per_building.len() as u64,
        cross_link: Link::new(params.campus_latency_seconds, fabric.min(campus)),
    }
}

/// The link a stage's expert-parallel all-to-all runs on, its groups being
/// `ep` consecutive replicas: NVLink when every group lies in one scale-up
/// domain, the building fabric when some group leaves its domain, the
/// campus interconnect (shared by all the stage's GPUs, conservatively)
/// when the stage spans buildings and a group may too.
fn ep_link(
    ctx: &Ctx<'_>,
    site: usize,
    slices: &[SliceRef],
    (tp, ep): (u32, u32),
    replicas: u64,
    scale_up: Link,
) -> Link {
    let pools = &ctx.sites[site].pools;
    let params = ctx.params;
    let ep = u64::from(ep.max(1));
    let mut before = 0u64;
    let mut in_domains = true;
    for s in slices {
        let spd = pools[s.pool].slots_per_domain(tp).max(1);
        in_domains &= [before, s.first, s.count, spd]
            .iter()
            .all(|n| n.is_multiple_of(ep));
        before += s.count;
    }
    if in_domains {
        return scale_up;
    }
    let fabric = slowest_fabric(slices.iter().map(|s| &pools[s.pool]));
    let first = slices.first().map(|s| pools[s.pool].building);
    if slices.iter().all(|s| Some(pools[s.pool].building) == first) {
        return Link::new(params.fabric_latency_seconds, fabric);
    }
    let gpus = (replicas * u64::from(tp)).max(1) as f64;
    let campus = ctx.sites[site].campus_bytes.unwrap_or(fabric) / gpus;
    Link::new(params.campus_latency_seconds, fabric.min(campus))
}

/// Point-to-point between two stages of one site: each replica's tp GPUs
/// send their share of the activation over their NICs; crossing buildings,
/// the replicas share the campus interconnect.
fn in_site_p2p_link(ctx: &Ctx<'_>, a: &StageModel, b: &StageModel, tp: u32, replicas: u64) -> Link {
    let pools = &ctx.sites[a.site].pools;
    let params = ctx.params;
    let both = || a.slices.iter().chain(&b.slices).map(|s| &pools[s.pool]);
    let nic = slowest_fabric(both());
    let per_replica = nic * f64::from(tp);
    let first = a.slices.first().map(|s| pools[s.pool].building);
    if both().all(|p| Some(p.building) == first) {
        return Link::new(params.fabric_latency_seconds, per_replica);
    }
    let campus = ctx.sites[a.site].campus_bytes.unwrap_or(per_replica) / replicas.max(1) as f64;
    Link::new(params.campus_latency_seconds, per_replica.min(campus))
}
