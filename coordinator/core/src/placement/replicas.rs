//! Candidates with whole replicas per site: DiLoCo (an outer sync every H
//! steps, as the sync planner schedules it) and synchronous data
//! parallelism across sites (the whole gradient every step). Both lay a
//! site's replicas out alike; they differ in what a replica holds (DiLoCo
//! keeps its outer state, `CostParams::diloco_state_bytes_per_parameter`)
//! and in what crosses the WAN.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::rc::Rc;

use super::enumerate::{binomial, compositions, has_ring, proportional, subsets};
use super::model::Ctx;
use super::plan::CrossSiteMode;
use super::search::{
    Choice, CostedGroup, EXACT_DISTRIBUTIONS, Effort, HopBytes, Outcome, Shape, cost_group, cutoff,
    ep_label, note, offer,
};
use super::sites;
use crate::cost::{CostParams, Link, ring_reduce_scatter};
use crate::state::LinkRecord;
use crate::sync::{ShardHolders, SyncError, SyncInput, SyncPlan, plan_sync};

/// How replicas at several sites combine their gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Sync {
    /// An outer step every H inner steps.
    Diloco,
    /// A WAN all-reduce every step.
    DataParallel,
}

impl Sync {
    /// How the replicas of a plan in `mode` sync; `None` in pipeline mode.
    pub fn of(mode: CrossSiteMode) -> Option<Self> {
        match mode {
            CrossSiteMode::Diloco { .. } => Some(Self::Diloco),
            CrossSiteMode::DataParallel => Some(Self::DataParallel),
            CrossSiteMode::Pipeline => None,
        }
    }

    /// Optimiser state a replica keeps beyond synchronous training, bytes
    /// per parameter.
    pub fn extra_state(self, params: &CostParams) -> f64 {
        match self {
            Self::Diloco => params.diloco_state_bytes_per_parameter,
            Self::DataParallel => 0.0,
        }
    }

    /// What the sync moves over the WAN, as a plan says it.
    pub fn traffic(self) -> &'static str {
        match self {
            Self::Diloco => "DiLoCo outer sync (as the sync planner encodes it), amortised",
            Self::DataParallel => "gradient all-reduce every step, at the training precision",
        }
    }

    /// The kind of plan, as [`Choice::kind`] names it.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Diloco => "diloco",
            Self::DataParallel => DATA_PARALLEL,
        }
    }
}

/// The name of the kind of plan of cross-site data parallelism.
pub(crate) const DATA_PARALLEL: &str = "cross-site data-parallel";

/// The reduce-scatter and all-gather among each site's own replicas
/// around the WAN exchange (the pseudo-gradient, P elements at the
/// training precision, split over the tp·pp shard holders), on the site's
/// fabric: the slowest site's. It runs before and after the exchange and
/// is counted as exposed; the sync planner leaves it out
/// ([`crate::sync`]). Cross-site data parallelism has none beyond the
/// inner step's: the all-reduce among a site's replicas every step is
/// the reduce-scatter and all-gather around its WAN exchange. With expert
/// parallelism the experts' part is reduced among the k/ep replicas that
/// hold each of its tp·pp·ep shards.
pub(crate) fn local_reduce(
    ctx: &Ctx<'_>,
    (tp, pp, ep): (u32, u32, u32),
    subset: &[usize],
    ks: &[u64],
) -> f64 {
    let job = ctx.job;
    let element = f64::from(job.training.precision.bytes());
    let ep = u64::from(ep.max(1));
    let experts = if ep > 1 {
        crate::cost::expert_layer_parameters(job) * f64::from(job.model.layers)
    } else {
        0.0
    };
    let bytes = (job.model.parameters as f64 - experts) * element;
    let shard_holders = u64::from(tp) * u64::from(pp);
    let mut local = 0.0f64;
    for (&s, &k) in subset.iter().zip(ks) {
        let fabric = ctx.sites[s]
            .pools
            .iter()
            .map(|p| p.nic_bytes / p.oversubscription)
            .fold(f64::INFINITY, f64::min);
        let link = Link::new(ctx.params.fabric_latency_seconds, fabric);
        let dense = 2.0 * ring_reduce_scatter(k, bytes / shard_holders as f64, link);
        let sharded = if experts > 0.0 {
            2.0 * ring_reduce_scatter(
                k / ep,
                experts * element / (shard_holders * ep) as f64,
                link,
            )
        } else {
            0.0
        };
        local = local.max(dense + sharded);
    }
    local
}

/// The WAN links among `subset` as the sync planner reads them: as
/// configured, with the latest probe of each where the caller gave one.
pub(crate) fn subset_links(ctx: &Ctx<'_>, subset: &[usize]) -> Vec<LinkRecord> {
    let mut links = Vec::new();
    for (i, &a) in subset.iter().enumerate() {
        for &b in &subset[i + 1..] {
            let Some(link) = ctx.link(a, b) else {
                continue;
            };
            let (x, y) = (&ctx.sites[a].id, &ctx.sites[b].id);
            let measured = ctx
                .measurements
                .iter()
                .find(|r| {
                    let [p, q] = &r.configured.between;
                    (p == x && q == y) || (p == y && q == x)
                })
                .and_then(|r| r.measured);
            links.push(LinkRecord {
                configured: link.clone(),
                measured,
            });
        }
    }
    links
}

/// What the sync planner decides for replicas at `subset` whose slowest
/// inner step is `inner` seconds, the fewest replicas at any of them being
/// `fewest`: DiLoCo's schedule, or the every-step exchange of cross-site
/// data parallelism ([`SyncInput::sync_dp`]).
pub(crate) fn plan_subset_sync(
    ctx: &Ctx<'_>,
    sync: Sync,
    (tp, pp): (u32, u32),
    subset: &[usize],
    inner: f64,
    fewest: u64,
) -> Result<SyncPlan, SyncError> {
    let sites = subset.iter().map(|&s| ctx.sites[s].id.clone()).collect();
    let input = SyncInput::for_replicas(
        ctx.job,
        ctx.params,
        sites,
        &subset_links(ctx, subset),
        inner,
        ShardHolders {
            tensor_parallel: tp,
            pipeline_parallel: pp,
            fewest_replicas: fewest,
        },
    );
    match sync {
        Sync::Diloco => plan_sync(&input),
        Sync::DataParallel => plan_sync(&input.sync_dp()),
    }
}

/// The exposed time one outer step (one step, for data parallelism) adds
/// to the inner step: what the WAN exchange leaves exposed, and for DiLoCo
/// the reduce among each site's own replicas around it.
pub(crate) fn outer_seconds(
    ctx: &Ctx<'_>,
    sync: Sync,
    (tp, pp, ep): (u32, u32, u32),
    subset: &[usize],
    ks: &[u64],
    planned: &SyncPlan,
) -> f64 {
    let local = match sync {
        Sync::Diloco => local_reduce(ctx, (tp, pp, ep), subset, ks),
        Sync::DataParallel => 0.0,
    };
    local + planned.exposed_seconds_per_outer_step
}

/// A lower bound on the WAN exchange of cross-site data parallelism over
/// `subset`, for any degrees and distribution: a step waits for the whole
/// exchange whatever the inner step (no overlap), and an all-reduce of G
/// bytes over M sites has every site send at least 2(M−1)/M · G, at best
/// over all its links to the others at their full capacity (the larger of
/// the configured rate and a measured throughput). `subset` is in index
/// order, as the site search visits it. The sync planner's
/// mesh (2G/M over each link) and ring (2(M−1)/M · G over one) both take at
/// least that long.
pub(crate) fn least_exchange(ctx: &Ctx<'_>, subset: &[usize]) -> f64 {
    let job = ctx.job;
    let gradient = job.model.parameters as f64 * f64::from(job.training.precision.bytes());
    let m = subset.len() as f64;
    let sent = 2.0 * (m - 1.0) / m * gradient;
    let mut least = 0.0f64;
    for &a in subset {
        let mut capacity = 0.0;
        for &b in ctx.neighbours(a) {
            if subset.binary_search(&b).is_err() {
                continue;
            }
            let Some(link) = ctx.link(a, b) else {
                continue;
            };
            let configured = link.link_rate.bytes_per_second() * f64::from(link.parallel_links);
            let measured = ctx
                .measurements
                .iter()
                .filter(|r| {
                    let [p, q] = &r.configured.between;
                    let (x, y) = (&ctx.sites[a].id, &ctx.sites[b].id);
                    (p == x && q == y) || (p == y && q == x)
                })
                .filter_map(|r| r.measured)
                .map(|m| m.throughput_bps as f64 / 8.0)
                .fold(0.0, f64::max);
            capacity += configured.max(measured);
        }
        if capacity > 0.0 {
            least = least.max(sent / capacity);
        }
    }
    // A few ulps below, so that rounding never lifts it above a time the
    // planner computes another way.
    least * (1.0 - 1e-12)
}

/// Every plan of these degrees with replicas per site worth costing, for
/// each of `syncs`: site subsets from the branch and bound
/// ([`sites::replica_subsets`]), or all of them.
pub(crate) fn candidates(
    ctx: &Ctx<'_>,
    effort: Effort,
    shape: Shape,
    syncs: &[Sync],
    out: &mut Outcome,
) {
    if ctx.sites.len() < 2 || shape.dp < 2 || syncs.is_empty() {
        return;
    }
    if shape.dp / shape.ep.max(1) < 2 {
        out.failures.expert_groups.get_or_insert_with(|| {
            format!(
                "{} replicas in groups of ep={} cannot give two sites a whole group each",
                shape.dp, shape.ep
            )
        });
        return;
    }
    let mut memo = Memo::new(ctx.sites.len());
    let mut each = |out: &mut Outcome, subset: &[usize]| {
        let ring = match out.budget.rings.get(subset) {
            Some(&known) => known,
            None => {
                let found = has_ring(ctx, subset);
                out.budget.rings.insert(subset.to_vec(), found);
                found
            }
        };
        if !ring {
            out.failures.no_link += 1;
            return;
        }
        for &sync in syncs {
            subset_candidates(ctx, effort, shape, sync, subset, &mut memo, out);
        }
    };
    if effort == Effort::Solve {
        // The bound's memory filter holds for the lightest replica.
        let extra = syncs
            .iter()
            .map(|s| s.extra_state(ctx.params))
            .fold(f64::INFINITY, f64::min);
        sites::replica_subsets(ctx, shape, extra, out, &mut each);
    } else {
        for subset in subsets(ctx) {
            if subset.len() as u32 <= shape.dp {
                each(out, &subset);
            }
        }
        // (Subsets of more sites than groups of ep are refused, and noted,
        // by `subset_candidates`.)
    }
}

/// What candidates of one set of degrees share: each site's inner step for
/// k replicas (it depends only on the site, k and what a replica holds).
/// A dense table, `groups[sync][site][k]` (`None`: not costed yet; `Some(None)`:
/// infeasible or pruned): the distributions of a subset look it up far more
/// often than they cost a group.
struct Memo {
    groups: [Vec<Vec<Option<Known>>>; 2],
}

/// A site group as costed: `None` when infeasible or cut.
type Known = Option<Rc<CostedGroup>>;

impl Memo {
    fn new(sites: usize) -> Self {
        Self {
            groups: [vec![Vec::new(); sites], vec![Vec::new(); sites]],
        }
    }

    fn site_group(
        &mut self,
        ctx: &Ctx<'_>,
        effort: Effort,
        (shape, sync): (Shape, Sync),
        (s, k): (usize, u64),
        out: &mut Outcome,
    ) -> Option<Rc<CostedGroup>> {
        let Shape {
            tp,
            ep,
            pp,
            dp,
            v,
            m,
        } = shape;
        let per_k = &mut self.groups[sync as usize][s];
        let at = usize::try_from(k).unwrap_or(usize::MAX);
        if let Some(Some(known)) = per_k.get(at) {
            return known.clone();
        }
        let limit = cutoff(out, shape.gpus());
        let extra = sync.extra_state(ctx.params);
        if per_k.len() <= at {
            per_k.resize(at + 1, None);
        }
        per_k[at]
            .get_or_insert_with(|| {
                out.budget.evaluations += 1;
                match cost_group(ctx, effort, (tp, ep, v, m, k), &[(s, pp)], extra, limit) {
                    Ok(g) => Some(Rc::new(g)),
                    Err(f) => {
                        note(out, f, || {
                            format!(
                                "tp={tp}{} pp={pp} dp={dp} v={v} {}, {k} replicas at {}",
                                ep_label(ep),
                                sync.kind(),
                                ctx.sites[s].id
                            )
                        });
                        None
                    }
                }
            })
            .clone()
    }
}

/// Costs every replica distribution over `subset` (whose links hold a
/// ring) with `sync`.
fn subset_candidates(
    ctx: &Ctx<'_>,
    effort: Effort,
    shape: Shape,
    sync: Sync,
    subset: &[usize],
    memo: &mut Memo,
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
    let least_exchange = match sync {
        Sync::DataParallel if effort.prunes() => least_exchange(ctx, subset),
        Sync::DataParallel | Sync::Diloco => 0.0,
    };
    // Every distribution's inner step is at least the slowest site's floor.
    if effort.prunes() && least_exchange > 0.0 {
        let floor = subset
            .iter()
            .map(|&s| sites::replica_floor(ctx, shape, s))
            .fold(0.0, f64::max);
        if floor + least_exchange > cutoff(out, shape.gpus()) {
            return;
        }
    }
    // Replicas are handed out in units of ep: a site holds whole
    // expert-parallel groups, so every site has all the experts.
    let unit = ep.max(1);
    let units = dp / unit;
    if units < subset.len() as u32 {
        out.failures.expert_groups.get_or_insert_with(|| {
            format!(
                "{dp} replicas in groups of ep={ep} cannot give each of {} sites a whole group",
                subset.len()
            )
        });
        return;
    }
    let caps: Vec<u32> = subset
        .iter()
        .map(|&s| {
            let room = ctx.sites[s].slots(tp) / u64::from(pp) / u64::from(unit);
            u32::try_from(room).unwrap_or(u32::MAX)
        })
        .collect();
    let exact = effort == Effort::Exhaustive
        || binomial(u64::from(units) - 1, subset.len() as u64 - 1) <= EXACT_DISTRIBUTIONS;
    let distributions = if exact {
        compositions(units, subset.len() as u32, &caps)
    } else {
        greedy_distribution(units, subset, &caps, &mut |s, k| {
            memo.site_group(ctx, effort, (shape, sync), (s, k * u64::from(unit)), out)
                .map(|g| g.eval.total)
        })
        .into_iter()
        .collect()
    };
    // The sync planner's decision per inner step and fewest replicas: the
    // distributions over this subset that agree on those share it.
    let mut planned: BTreeMap<(u64, u64), Result<Rc<SyncPlan>, SyncError>> = BTreeMap::new();
    for ks in distributions {
        let ks: Vec<u64> = ks
            .into_iter()
            .map(|k| u64::from(k) * u64::from(unit))
            .collect();
        // The slowest site's inner step, given up on as soon as it (with
        // the exchange's bound) loses: the later sites' groups need not be
        // costed for this distribution then.
        let limit = if effort.prunes() {
            cutoff(out, shape.gpus())
        } else {
            f64::INFINITY
        };
        let mut groups = Vec::with_capacity(subset.len());
        let mut inner = 0.0f64;
        for (&s, &k) in subset.iter().zip(&ks) {
            let Some(g) = memo.site_group(ctx, effort, (shape, sync), (s, k), out) else {
                break;
            };
            inner = inner.max(g.eval.total);
            if inner + least_exchange > limit {
                break;
            }
            groups.push(g);
        }
        if groups.len() != subset.len() {
            continue;
        }
        let fewest = ks.iter().copied().min().unwrap_or(1);
        let schedule = planned
            .entry((inner.to_bits(), fewest))
            .or_insert_with(|| {
                plan_subset_sync(ctx, sync, (tp, pp), subset, inner, fewest).map(Rc::new)
            })
            .clone();
        let schedule = match schedule {
            Ok(schedule) => schedule,
            Err(error) => {
                out.failures.sync.get_or_insert_with(|| error.to_string());
                continue;
            }
        };
        let index = |id: &str| subset.iter().copied().find(|&s| ctx.sites[s].id == id);
        let ring: Option<Vec<usize>> = schedule
            .collective
            .order
            .iter()
            .map(|id| index(id))
            .collect();
        let hops: Option<Vec<HopBytes>> = schedule
            .links
            .iter()
            .map(|l| {
                Some((
                    (index(&l.between[0])?, index(&l.between[1])?),
                    l.bytes_per_outer_step,
                ))
            })
            .collect();
        let (Some(ring), Some(hops)) = (ring, hops) else {
            continue;
        };
        let h = schedule.inner_steps;
        let outer = outer_seconds(ctx, sync, (tp, pp, ep), subset, &ks, &schedule);
        let total = inner + outer / f64::from(h);
        offer(out, sync.kind(), total, shape.gpus(), || Choice {
            tp,
            ep,
            pp,
            dp,
            v,
            m,
            mode: match sync {
                Sync::Diloco => CrossSiteMode::Diloco { inner_steps: h },
                Sync::DataParallel => CrossSiteMode::DataParallel,
            },
            groups: groups.iter().map(|g| CostedGroup::clone(g)).collect(),
            site_order: ring,
            outer,
            outer_hops: hops,
            sync: Some(schedule),
            total,
        });
    }
}

/// Replicas (or units of them) per site minimising the slowest site's inner
/// step: start every site at one and give each further one to the site whose
/// step stays shortest (a min-max of non-decreasing functions), or split by
/// capacity when there are too many replicas to hand out one by one.
fn greedy_distribution(
    dp: u32,
    subset: &[usize],
    caps: &[u32],
    step: &mut impl FnMut(usize, u64) -> Option<f64>,
) -> Option<Vec<u32>> {
    if dp > 512 {
        let weights: Vec<f64> = caps.iter().map(|&c| f64::from(c)).collect();
        return proportional(dp, &weights, caps);
    }
    let mut ks = vec![1u32; subset.len()];
    if caps.contains(&0) {
        return None;
    }
    // Each site's step with one replica more, least first (ties: the
    // earlier site); only the site given a replica changes its entry. A
    // site whose next step is infeasible never becomes feasible again (its
    // count no longer changes), so it leaves the heap.
    let mut next = BinaryHeap::with_capacity(subset.len());
    let mut push = |i: usize, ks: &[u32], next: &mut BinaryHeap<Reverse<(Seconds, usize)>>| {
        if ks[i] < caps[i]
            && let Some(t) = step(subset[i], u64::from(ks[i]) + 1)
        {
            next.push(Reverse((Seconds(t), i)));
        }
    };
    for i in 0..subset.len() {
        push(i, &ks, &mut next);
    }
    for _ in subset.len() as u32..dp {
        let Reverse((_, i)) = next.pop()?;
        ks[i] += 1;
        push(i, &ks, &mut next);
    }
    Some(ks)
}

/// Seconds ordered by [`f64::total_cmp`], for the heap above.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seconds(f64);

impl Eq for Seconds {}

impl PartialOrd for Seconds {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Seconds {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SeedRng;

    /// The greedy's definition: every round, scan the sites for the least
    /// next step (the first of equals), give it the replica.
    fn scanned(
        dp: u32,
        caps: &[u32],
        step: &mut impl FnMut(usize, u64) -> Option<f64>,
    ) -> Option<Vec<u32>> {
        let mut ks = vec![1u32; caps.len()];
        for _ in caps.len() as u32..dp {
            let mut pick: Option<(usize, f64)> = None;
            for i in 0..caps.len() {
                if ks[i] < caps[i]
                    && let Some(t) = step(i, u64::from(ks[i]) + 1)
                    && pick.is_none_or(|(_, best)| t < best)
                {
                    pick = Some((i, t));
                }
            }
            let (i, _) = pick?;
            ks[i] += 1;
        }
        Some(ks)
    }

    #[test]
    fn the_heap_gives_the_replicas_as_the_scan_does_ties_and_infeasible_steps_included() {
        let seed = 7;
        let mut rng = SeedRng::new(seed);
        for case in 0..500 {
            let n = 2 + rng.index(6);
            let subset: Vec<usize> = (0..n).collect();
            let caps: Vec<u32> = (0..n).map(|_| 1 + rng.up_to(40) as u32).collect();
            let dp = n as u32 + rng.up_to(120) as u32;
            // Steps on a coarse grid (ties), some infeasible, not monotone.
            let table: Vec<Vec<Option<f64>>> = (0..n)
                .map(|_| {
                    (0..=41)
                        .map(|_| (!rng.chance(0.05)).then(|| rng.up_to(8) as f64))
                        .collect()
                })
                .collect();
            let mut step = |s: usize, k: u64| table[s][k as usize];
            assert_eq!(
                greedy_distribution(dp, &subset, &caps, &mut step),
                scanned(dp, &caps, &mut step),
                "seed {seed}, case {case}"
            );
        }
    }
}
