//! The solver's site search: which sites a pipeline runs through and in
//! which order, and which sites host DiLoCo replicas.
//!
//! Both are depth-first branch and bound. A node is a pipeline's prefix (its
//! sites in order) or a DiLoCo subset, and its bound holds for it and for
//! every node below it, so a node whose bound exceeds the best plan so far
//! is cut with everything it leads to and nothing optimal is lost:
//!
//! - pipeline prefix P: the pipeline scale (m + (p−1)/v) times the layers
//!   (plus the LM head, in layers of the stage that runs it) over the
//!   fastest speed the stages could have (one stage on each site of P, the
//!   other p − |P| on the fastest slots of any site in P's connected
//!   component), plus twice the activation latency of P's WAN hops (paid on
//!   the first forward and the last backward, see
//!   [`super::model::GroupModel::lower_bound`]);
//! - DiLoCo subset S: the compute floor of its slowest site (its most
//!   loaded stage, or every layer and the head over its p stages), which
//!   paces every inner step; adding a site never lowers it, and the outer
//!   sync only adds.
//!
//! A site whose HBM cannot hold the least any stage of these degrees needs
//! takes no stage.
//!
//! Children are visited best bound first, so the first plans found are good
//! and cut the most. A budget of nodes ([`Budget`]) keeps huge inputs
//! bounded: once it is spent, every root is still tried but each node below
//! follows only its best child (a greedy dive), and the bounds of the
//! children left out are kept, so the plan can say how far from the optimum
//! it may be.

use super::model::{Ctx, SiteModel};
use super::search::{
    Outcome, Shape, cutoff, site_head_layers, site_head_seconds, site_layer_floor,
};
use crate::cost;

/// Site-search nodes the solver expands in all before it only dives; sized
/// so the 64-site benchmark stays within its time aim.
pub(crate) const NODE_BUDGET: u64 = 200_000;

/// Nodes one search (one set of degrees, one mode) may expand before it
/// only dives, so that no set of degrees spends the budget of the others.
pub(crate) const NODES_PER_SEARCH: u64 = 4_000;

/// Groups (a site layout of one set of degrees, split and costed) the
/// solver costs in all; past it, degrees not yet explored are left out
/// with their bound.
pub(crate) const EVALUATION_BUDGET: u64 = 1_000_000;

/// Nodes expanded, the budget, and the least bound of any node the budget
/// left unexplored.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub nodes: u64,
    pub limit: u64,
    /// Nodes of the search under way, and its limit.
    here: u64,
    per_search: u64,
    /// As a score of the pass's aim; `f64::INFINITY` while nothing was
    /// left out.
    pub open_bound: f64,
    /// Whether the ring check answered each DiLoCo subset: it depends only
    /// on the subset, and every set of degrees asks again.
    pub rings: std::collections::HashMap<Vec<usize>, bool>,
    /// Set when every site order and subset was enumerated instead.
    pub enumerated: bool,
    /// Groups costed so far.
    pub evaluations: u64,
}

impl Budget {
    pub fn new(limit: u64, per_search: u64) -> Self {
        Self {
            nodes: 0,
            limit,
            here: 0,
            per_search,
            open_bound: f64::INFINITY,
            rings: std::collections::HashMap::new(),
            enumerated: false,
            evaluations: 0,
        }
    }

    /// Whether the solver has costed all the groups it may.
    pub fn evaluations_spent(&self) -> bool {
        self.evaluations > EVALUATION_BUDGET
    }

    /// Starts the count of one search.
    fn start(&mut self) {
        self.here = 0;
    }

    /// Counts a node; false once the budget is spent.
    fn spend(&mut self) -> bool {
        self.nodes += 1;
        self.here += 1;
        self.nodes <= self.limit && self.here <= self.per_search && !self.evaluations_spent()
    }

    /// Keeps the score bound of a node left out.
    pub fn leave(&mut self, bound: f64) {
        self.open_bound = self.open_bound.min(bound);
    }

    /// How much worse than the optimum a plan of `score` may be: `None`
    /// when the search was exact (nothing left out could beat it).
    pub fn gap(&self, score: f64) -> Option<f64> {
        (self.open_bound < score).then(|| score / self.open_bound.max(f64::MIN_POSITIVE) - 1.0)
    }
}

/// Sites `0..n` ordered by `key` ascending, ties by index, without those
/// `usable` rejects.
fn ordered(n: usize, key: &[f64], usable: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).filter(|&s| usable(s)).collect();
    order.sort_by(|&x, &y| key[x].total_cmp(&key[y]).then(x.cmp(&y)));
    order
}

/// The connected component of each site over the WAN links, numbered by
/// its least site.
fn components(ctx: &Ctx<'_>) -> Vec<usize> {
    let n = ctx.sites.len();
    let mut component = vec![usize::MAX; n];
    for start in 0..n {
        if component[start] != usize::MAX {
            continue;
        }
        component[start] = start;
        let mut stack = vec![start];
        while let Some(s) = stack.pop() {
            for &t in ctx.neighbours(s) {
                if component[t] == usize::MAX {
                    component[t] = start;
                    stack.push(t);
                }
            }
        }
    }
    component
}

/// The most HBM a GPU of `site` that can take part in TP groups of `tp`
/// leaves usable.
fn largest_hbm(ctx: &Ctx<'_>, site: usize, tp: u32) -> f64 {
    ctx.sites[site]
        .pools
        .iter()
        .filter(|p| p.gpus_per_domain >= u64::from(tp))
        .map(|p| p.hbm_bytes * (1.0 - ctx.params.hbm_headroom))
        .fold(0.0, f64::max)
}

/// Whether two sites are alike in everything a plan on one of them reads.
fn alike(a: &SiteModel, b: &SiteModel) -> bool {
    a.campus_bytes == b.campus_bytes
        && a.pools.len() == b.pools.len()
        && a.pools.iter().zip(&b.pools).all(|(x, y)| {
            (x.domains, x.gpus_per_domain, x.gpus_per_node, x.building)
                == (y.domains, y.gpus_per_domain, y.gpus_per_node, y.building)
                && (
                    x.flops,
                    x.hbm_bytes,
                    x.scale_up_bytes,
                    x.nic_bytes,
                    x.oversubscription,
                ) == (
                    y.flops,
                    y.hbm_bytes,
                    y.scale_up_bytes,
                    y.nic_bytes,
                    y.oversubscription,
                )
        })
}

/// Visits, best bound first, every pipeline site sequence that could beat
/// the best plan so far, calling `visit` on each (the caller costs its
/// stage counts).
pub(crate) fn pipeline_sequences(
    ctx: &Ctx<'_>,
    shape: Shape,
    out: &mut Outcome,
    visit: &mut dyn FnMut(&mut Outcome, &[usize]),
) {
    let n = ctx.sites.len();
    let replicas = u64::from(shape.dp);
    let pp = shape.pp;
    let speed_of: Vec<f64> = (0..n).map(|s| site_layer_floor(ctx, s, shape)).collect();
    // A stage holds at least one chunk of v layers and one micro-batch of
    // its activations; a site whose HBM cannot even hold that takes none.
    let v = f64::from(shape.v.max(1));
    let least = v * cost::state_bytes_per_layer(ctx.job, shape.tp, shape.ep, replicas, 0.0)
        + cost::activation_bytes_per_layer(ctx.job, shape.tp);
    let cap: Vec<u32> = (0..n)
        .map(|s| {
            if largest_hbm(ctx, s, shape.tp) < least {
                return 0;
            }
            u32::try_from(ctx.sites[s].slots(shape.tp) / replicas).map_or(pp, |c| c.min(pp))
        })
        .collect();
    let by_speed = ordered(n, &speed_of, |s| cap[s] > 0 && speed_of[s].is_finite());
    let component = components(ctx);
    // The LM head sits on some stage, at the least as many layers' worth
    // of time as at any usable site. With an all-to-all in every layer's
    // floor, head / (compute + TP) may overstate it (a stage's all-to-all
    // may be slower than its floor, and the head is then fewer of its
    // layers); zero is safe, if loose.
    let head_layers = if shape.ep > 1 {
        0.0
    } else {
        by_speed
            .iter()
            .map(|&s| site_head_layers(ctx, s, shape.tp))
            .fold(f64::INFINITY, f64::min)
    };
    let search = PipelineSearch {
        ctx,
        shape,
        speed_of,
        cap,
        by_speed,
        component,
        head_layers: if head_layers.is_finite() {
            head_layers
        } else {
            0.0
        },
        streams: u64::from(shape.tp) * u64::from(ctx.params.wan_streams_per_gpu),
        scale: shape.m as f64 + f64::from(pp - 1) / f64::from(shape.v.max(1)),
    };
    out.budget.start();
    let mut in_prefix = vec![false; n];
    // Sites without links and with the same pools give the same plans: one
    // of each kind is a root.
    let mut lone_kinds: Vec<&SiteModel> = Vec::new();
    let roots: Vec<(f64, usize, f64)> = search
        .by_speed
        .iter()
        .filter(|&&s| {
            if !ctx.neighbours(s).is_empty() {
                return true;
            }
            let site = &ctx.sites[s];
            let seen = lone_kinds.iter().any(|k| alike(k, site));
            if !seen {
                lone_kinds.push(site);
            }
            !seen
        })
        .map(|&s| {
            in_prefix[s] = true;
            let bound = search.bound(&[s], &in_prefix, 0.0);
            in_prefix[s] = false;
            (bound, s, 0.0)
        })
        .collect();
    search.descend(roots, &mut Vec::new(), &mut in_prefix, out, visit);
}

struct PipelineSearch<'c, 'a> {
    ctx: &'c Ctx<'a>,
    shape: Shape,
    /// Least seconds per layer and micro-batch of a stage at each site.
    speed_of: Vec<f64>,
    /// Stages each site can hold at these degrees (at most p).
    cap: Vec<u32>,
    by_speed: Vec<usize>,
    /// The connected component of each site: a pipeline never leaves its
    /// first site's.
    component: Vec<usize>,
    /// The LM head's time on the last stage, in that stage's layers: the
    /// least over the usable sites.
    head_layers: f64,
    streams: u64,
    scale: f64,
}

impl PipelineSearch<'_, '_> {
    /// The bound of every sequence starting with `prefix` (whose sites are
    /// marked in `in_prefix` and whose WAN hops add `latency`).
    fn bound(&self, prefix: &[usize], in_prefix: &[bool], latency: f64) -> f64 {
        let pp = self.shape.pp as usize;
        if prefix.len() > pp {
            return f64::INFINITY;
        }
        let mut speed: f64 = prefix.iter().map(|&s| 1.0 / self.speed_of[s]).sum();
        let mut left = pp - prefix.len();
        let here = self.component[prefix[0]];
        for &s in &self.by_speed {
            if left == 0 {
                break;
            }
            if self.component[s] != here {
                continue;
            }
            let room = self.cap[s] as usize - usize::from(in_prefix[s]);
            let take = room.min(left);
            speed += take as f64 / self.speed_of[s];
            left -= take;
        }
        if left > 0 {
            return f64::INFINITY;
        }
        // Σ_j (X − e_j) / a_j ≥ L for stage times X, per-layer times a_j
        // and the head's e on the last stage.
        let layers = f64::from(self.ctx.job.model.layers) + self.head_layers;
        self.scale * layers / speed + 2.0 * f64::from(self.shape.v.max(1)) * latency
    }

    /// The activation latency of the WAN hop a → b.
    fn hop(&self, a: usize, b: usize) -> Option<f64> {
        let wan = self.ctx.link(a, b)?;
        let link = cost::wan_link(wan, self.streams, u64::from(self.shape.dp));
        Some(link.transfer(self.ctx.activation_bytes))
    }

    /// Explores `kids` (bound, site, prefix latency with it), best first.
    fn descend(
        &self,
        mut kids: Vec<(f64, usize, f64)>,
        prefix: &mut Vec<usize>,
        in_prefix: &mut [bool],
        out: &mut Outcome,
        visit: &mut dyn FnMut(&mut Outcome, &[usize]),
    ) {
        kids.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        let gpus = self.shape.gpus();
        // Every root is tried, budget or not: a root whose subtree fits no
        // plan (memory, say) must not hide the others.
        let roots = prefix.is_empty();
        for (i, &(bound, s, latency)) in kids.iter().enumerate() {
            if bound > cutoff(out, gpus) {
                break;
            }
            if i > 0 && !out.budget.spend() && !roots {
                out.leave(bound, gpus);
                break;
            }
            prefix.push(s);
            in_prefix[s] = true;
            self.node(prefix, in_prefix, latency, out, visit);
            in_prefix[s] = false;
            prefix.pop();
        }
    }

    fn node(
        &self,
        prefix: &mut Vec<usize>,
        in_prefix: &mut [bool],
        latency: f64,
        out: &mut Outcome,
        visit: &mut dyn FnMut(&mut Outcome, &[usize]),
    ) {
        visit(out, prefix);
        // Interleaving stays inside one site.
        if prefix.len() >= self.shape.pp as usize || self.shape.v > 1 {
            return;
        }
        let last = prefix[prefix.len() - 1];
        let mut kids = Vec::new();
        for &s in self.ctx.neighbours(last) {
            if in_prefix[s] || self.cap[s] == 0 || !self.speed_of[s].is_finite() {
                continue;
            }
            let Some(hop) = self.hop(last, s) else {
                continue;
            };
            prefix.push(s);
            in_prefix[s] = true;
            let bound = self.bound(prefix, in_prefix, latency + hop);
            in_prefix[s] = false;
            prefix.pop();
            kids.push((bound, s, latency + hop));
        }
        self.descend(kids, prefix, in_prefix, out, visit);
    }
}

/// The least inner step a replica of `shape` at `site` can take: the
/// slowest stage holds ⌈L/p⌉ layers or more, and the p stages together
/// hold every layer and the LM head, each at the site's fastest pool.
pub(crate) fn replica_floor(ctx: &Ctx<'_>, shape: Shape, site: usize) -> f64 {
    let layers = ctx.job.model.layers;
    let scale = shape.m as f64 + f64::from(shape.pp - 1) / f64::from(shape.v.max(1));
    let per_stage = f64::from(layers.div_ceil(shape.pp));
    let a = site_layer_floor(ctx, site, shape);
    let spread =
        (f64::from(layers) * a + site_head_seconds(ctx, site, shape.tp)) / f64::from(shape.pp);
    scale * (per_stage * a).max(spread)
}

/// Visits every site subset for replicas (DiLoCo or cross-site data
/// parallelism: two sites or more, with room for dp replicas) that could
/// beat the best plan so far, slowest-site floor first, calling `visit` on
/// each with its sites in index order.
pub(crate) fn replica_subsets(
    ctx: &Ctx<'_>,
    shape: Shape,
    extra: f64,
    out: &mut Outcome,
    visit: &mut dyn FnMut(&mut Outcome, &[usize]),
) {
    let n = ctx.sites.len();
    let per_stage = f64::from(ctx.job.model.layers.div_ceil(shape.pp));
    let floor: Vec<f64> = (0..n).map(|s| replica_floor(ctx, shape, s)).collect();
    // A site's most loaded stage holds at least ⌈L/p⌉ layers of state,
    // sharded at best over every replica the site can hold, and one
    // micro-batch of activations; a site whose HBM cannot hold that hosts
    // no replica. `extra` is the least optimiser state per parameter a
    // replica of the modes searched keeps beyond synchronous training.
    let cap: Vec<u64> = (0..n)
        .map(|s| {
            // Whole expert-parallel groups only.
            let unit = u64::from(shape.ep.max(1));
            let room = ctx.sites[s].slots(shape.tp) / u64::from(shape.pp) / unit * unit;
            let least = per_stage
                * (cost::state_bytes_per_layer(ctx.job, shape.tp, shape.ep, room.max(1), extra)
                    + cost::activation_bytes_per_layer(ctx.job, shape.tp)
                        / f64::from(shape.v.max(1)));
            if largest_hbm(ctx, s, shape.tp) < least {
                0
            } else {
                room
            }
        })
        .collect();
    // A site without links is in no subset's ring.
    let order = ordered(n, &floor, |s| {
        cap[s] > 0 && floor[s].is_finite() && !ctx.neighbours(s).is_empty()
    });
    // Replicas the sites from position i on can hold, for cutting subsets
    // that can never reach dp.
    let mut room_from = vec![0u64; order.len() + 1];
    for i in (0..order.len()).rev() {
        room_from[i] = room_from[i + 1].saturating_add(cap[order[i]]);
    }
    let search = DilocoSearch {
        shape,
        floor,
        cap,
        order,
        room_from,
    };
    out.budget.start();
    search.node(0, &mut Vec::new(), 0, out, visit);
}

struct DilocoSearch {
    shape: Shape,
    floor: Vec<f64>,
    cap: Vec<u64>,
    order: Vec<usize>,
    room_from: Vec<u64>,
}

impl DilocoSearch {
    /// Visits `subset` (sites taken from `order` before position `next`)
    /// and the subsets that extend it with sites from `next` on.
    fn node(
        &self,
        next: usize,
        subset: &mut Vec<usize>,
        room: u64,
        out: &mut Outcome,
        visit: &mut dyn FnMut(&mut Outcome, &[usize]),
    ) {
        let dp = u64::from(self.shape.dp);
        if subset.len() >= 2 && room >= dp {
            let mut sites = subset.clone();
            sites.sort_unstable();
            visit(out, &sites);
        }
        // Every site holds a whole group of ep replicas.
        if subset.len() as u64 >= dp / u64::from(self.shape.ep.max(1)) {
            return;
        }
        let gpus = self.shape.gpus();
        for i in next..self.order.len() {
            // Sorted by floor: a child's bound is its own site's floor, and
            // every later child's is at least as high.
            let s = self.order[i];
            let bound = self.floor[s];
            if bound > cutoff(out, gpus) || room.saturating_add(self.room_from[i]) < dp {
                break;
            }
            // Every first site is tried, budget or not (as pipeline roots).
            if i > next && !out.budget.spend() && !subset.is_empty() {
                out.leave(bound, gpus);
                break;
            }
            subset.push(s);
            self.node(i + 1, subset, room.saturating_add(self.cap[s]), out, visit);
            subset.pop();
        }
    }
}
