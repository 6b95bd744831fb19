//! The solver and the brute force over H, P, τ and the collective.

use std::cmp::Ordering;

use super::SyncError;
use super::model::{Candidate, Model, compute_utilisation, exposed_seconds};

/// Ring orders are enumerated exactly up to this many sites.
pub(crate) const EXACT_RING_SITES: usize = 8;

/// One schedule and its predicted cost.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Choice {
    pub inner_steps: u32,
    pub fragments: u32,
    pub overlap_steps: u32,
    pub candidate: Candidate,
    /// T: one fragment's exchange.
    pub transfer: f64,
    /// X = max(0, T − τ·t).
    pub exposed_per_fragment: f64,
    /// E = P·X.
    pub exposed_per_outer_step: f64,
    pub utilisation: f64,
    pub meets: bool,
}

impl Choice {
    fn new(
        model: &Model<'_>,
        inner_steps: u32,
        fragments: u32,
        overlap_steps: u32,
        candidate: Candidate,
        transfer: f64,
    ) -> Self {
        let exposed_per_fragment = exposed_seconds(transfer, overlap_steps, model.inner_step);
        let exposed_per_outer_step = f64::from(fragments) * exposed_per_fragment;
        let utilisation =
            compute_utilisation(inner_steps, model.inner_step, exposed_per_outer_step);
        Self {
            inner_steps,
            fragments,
            overlap_steps,
            candidate,
            transfer,
            exposed_per_fragment,
            exposed_per_outer_step,
            utilisation,
            meets: utilisation >= model.target,
        }
    }

    /// The module's order: `Less` when `self` is the better schedule.
    pub fn rank(&self, other: &Self) -> Ordering {
        other
            .meets
            .cmp(&self.meets)
            .then_with(|| {
                if self.meets {
                    self.inner_steps.cmp(&other.inner_steps)
                } else {
                    other
                        .utilisation
                        .total_cmp(&self.utilisation)
                        .then(other.inner_steps.cmp(&self.inner_steps))
                }
            })
            .then(self.overlap_steps.cmp(&other.overlap_steps))
            .then(self.fragments.cmp(&other.fragments))
            .then(self.transfer.total_cmp(&other.transfer))
            .then_with(|| self.candidate.cmp(&other.candidate))
    }
}

fn offer(best: &mut Option<Choice>, choice: Choice) {
    if best
        .as_ref()
        .is_none_or(|b| choice.rank(b) == Ordering::Less)
    {
        *best = Some(choice);
    }
}

/// The collectives the solver considers, with the links each one uses.
#[derive(Debug)]
pub(crate) struct Search<'m, 'a> {
    model: &'m Model<'a>,
    /// Sorted: the mesh first, then rings in lexicographic order.
    pub candidates: Vec<Candidate>,
    hops: Vec<Vec<usize>>,
}

impl<'m, 'a> Search<'m, 'a> {
    /// Every collective the links allow: the mesh when it is complete, and
    /// ring orders (exactly up to [`EXACT_RING_SITES`] sites, else the given
    /// order and nearest-neighbour tours).
    pub fn new(model: &'m Model<'a>) -> Result<Self, SyncError> {
        let mut candidates = Vec::new();
        if model.full_mesh() {
            candidates.push(Candidate::Direct);
        }
        if model.sites >= 3 {
            if model.sites <= EXACT_RING_SITES {
                let mut order = vec![0];
                exact_rings(model, &mut order, &mut candidates);
            } else {
                heuristic_rings(model, &mut candidates);
            }
        }
        candidates.sort();
        candidates.dedup();
        if candidates.is_empty() {
            return Err(SyncError::NoCollective(describe_missing(model)));
        }
        let hops = candidates.iter().map(|c| model.used_links(c)).collect();
        Ok(Self {
            model,
            candidates,
            hops,
        })
    }

    /// The fastest collective for `fragments` fragments and its T; ties go
    /// to the earlier candidate.
    pub fn fastest(&self, fragments: u32) -> (usize, f64) {
        let model = self.model;
        let per_link = |candidate: &Candidate| -> Vec<f64> {
            (0..model.links.len())
                .map(|l| model.link_seconds(candidate, l, fragments))
                .collect()
        };
        let direct = per_link(&Candidate::Direct);
        let ring = per_link(&Candidate::Ring(Vec::new()));
        let mut best = (0, f64::INFINITY);
        for (i, candidate) in self.candidates.iter().enumerate() {
            let seconds = match candidate {
                Candidate::Direct => &direct,
                Candidate::Ring(_) => &ring,
            };
            let transfer = self.hops[i].iter().map(|&l| seconds[l]).fold(0.0, f64::max);
            if transfer < best.1 {
                best = (i, transfer);
            }
        }
        best
    }

    /// The schedule (H, P, τ) with the fastest collective for P.
    pub fn choice(&self, inner_steps: u32, fragments: u32, overlap_steps: u32) -> Choice {
        let (i, transfer) = self.fastest(fragments);
        Choice::new(
            self.model,
            inner_steps,
            fragments,
            overlap_steps,
            self.candidates[i].clone(),
            transfer,
        )
    }

    /// The fastest candidate of the other kind than `candidate` for
    /// `fragments`, and its T: what the collective's reason compares with.
    pub fn alternative(&self, candidate: &Candidate, fragments: u32) -> Option<(Candidate, f64)> {
        let direct = matches!(candidate, Candidate::Direct);
        self.candidates
            .iter()
            .filter(|c| matches!(c, Candidate::Direct) != direct)
            .map(|c| (c.clone(), self.model.fragment_seconds(c, fragments)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
    }

    /// The best schedule under the module's order.
    ///
    /// For each P the collective is the fastest (a slower one is never
    /// better: U falls as T grows). For each τ the smallest admissible H is
    /// max(`inner_steps`, P, P·τ); U is monotone in H, so the smallest H
    /// that meets the target is found by binary search, and when
    /// `max_inner_steps` misses it, that is the best this (P, τ) can do.
    pub fn solve(&self) -> Result<Choice, SyncError> {
        let model = self.model;
        let mut best = None;
        for fragments in model.p_min..=model.p_max {
            let (i, transfer) = self.fastest(fragments);
            for overlap in 0..=model.overlap_max {
                let lowest = model
                    .h_min
                    .max(fragments)
                    .max(fragments.saturating_mul(overlap));
                if lowest > model.h_max {
                    break;
                }
                let at = |h: u32| {
                    Choice::new(
                        model,
                        h,
                        fragments,
                        overlap,
                        self.candidates[i].clone(),
                        transfer,
                    )
                };
                let first = at(lowest);
                if first.meets {
                    offer(&mut best, first);
                    continue;
                }
                let last = at(model.h_max);
                if !last.meets {
                    offer(&mut best, last);
                    continue;
                }
                // at(lo) misses, at(hi) meets.
                let (mut lo, mut hi) = (lowest, model.h_max);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if at(mid).meets {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                offer(&mut best, at(hi));
            }
        }
        best.ok_or_else(|| {
            SyncError::invalid(
                "policy.fragments",
                "no number of fragments fits in at most max_inner_steps inner steps",
            )
        })
    }
}

/// Every H, P, τ and ring order (both directions, every rotation named by
/// its canonical form), ranked by [`Choice::rank`]; see
/// [`super::brute_force_plan_sync`] for its limits.
pub(crate) fn brute_force(model: &Model<'_>) -> Result<Choice, SyncError> {
    if model.sites > 5
        || model.h_max - model.h_min > 400
        || model.p_max > 32
        || model.overlap_max > 8
    {
        return Err(SyncError::TooLarge(format!(
            "{} sites, H in [{}, {}], up to {} fragments, overlap up to {} (limits 5, 400 wide, 32, 8)",
            model.sites, model.h_min, model.h_max, model.p_max, model.overlap_max
        )));
    }
    let mut candidates = Vec::new();
    if model.full_mesh() {
        candidates.push(Candidate::Direct);
    }
    let mut rest: Vec<usize> = (1..model.sites).collect();
    permutations(&mut rest, 0, &mut |tail| {
        let order: Vec<usize> = std::iter::once(0).chain(tail.iter().copied()).collect();
        if model.ring_hops(&order).is_some() {
            candidates.push(Candidate::Ring(canonical(&order)));
        }
    });
    if candidates.is_empty() {
        return Err(SyncError::NoCollective(describe_missing(model)));
    }
    let mut best = None;
    for h in model.h_min..=model.h_max {
        for p in model.p_min..=model.p_max.min(h) {
            for tau in 0..=model.overlap_max {
                if p * tau > h {
                    continue;
                }
                for candidate in &candidates {
                    let transfer = model.fragment_seconds(candidate, p);
                    offer(
                        &mut best,
                        Choice::new(model, h, p, tau, candidate.clone(), transfer),
                    );
                }
            }
        }
    }
    best.ok_or_else(|| {
        SyncError::invalid(
            "policy.fragments",
            "no number of fragments fits in at most max_inner_steps inner steps",
        )
    })
}

/// Visits every permutation of `items[k..]`, by swaps.
fn permutations(items: &mut Vec<usize>, k: usize, visit: &mut impl FnMut(&[usize])) {
    if k == items.len() {
        visit(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, visit);
        items.swap(k, i);
    }
}

/// The name of a cycle: rotated to start at site 0, and turned so that
/// the second site is below the last.
pub(crate) fn canonical(order: &[usize]) -> Vec<usize> {
    let Some(start) = order.iter().position(|&s| s == 0) else {
        return order.to_vec();
    };
    let mut out: Vec<usize> = order[start..]
        .iter()
        .chain(&order[..start])
        .copied()
        .collect();
    if out.len() > 2 && out[1] > out[out.len() - 1] {
        out[1..].reverse();
    }
    out
}

/// Cycles through every site starting at 0, in lexicographic order, each
/// once (second site below the last), every hop linked.
fn exact_rings(model: &Model<'_>, order: &mut Vec<usize>, out: &mut Vec<Candidate>) {
    let m = model.sites;
    if order.len() == m {
        let last = order[m - 1];
        if order[1] < last && model.link(last, 0).is_some() {
            out.push(Candidate::Ring(order.clone()));
        }
        return;
    }
    let here = order[order.len() - 1];
    for next in 1..m {
        if order.contains(&next) || model.link(here, next).is_none() {
            continue;
        }
        order.push(next);
        exact_rings(model, order, out);
        order.pop();
    }
}

/// Beyond [`EXACT_RING_SITES`]: the sites in their given order (the
/// placement's ring), and from every start the tour that always takes the
/// cheapest link to an unvisited site, costed at the fewest and at the
/// most fragments (latency- and bandwidth-bound).
fn heuristic_rings(model: &Model<'_>, out: &mut Vec<Candidate>) {
    let m = model.sites;
    let given: Vec<usize> = (0..m).collect();
    if model.ring_hops(&given).is_some() {
        out.push(Candidate::Ring(canonical(&given)));
    }
    let ring = Candidate::Ring(Vec::new());
    for fragments in [model.p_min, model.p_max] {
        let cost: Vec<f64> = (0..model.links.len())
            .map(|l| model.link_seconds(&ring, l, fragments))
            .collect();
        for start in 0..m {
            let mut order = vec![start];
            let mut visited = vec![false; m];
            visited[start] = true;
            while order.len() < m {
                let here = order[order.len() - 1];
                let next = (0..m)
                    .filter(|&s| !visited[s])
                    .filter_map(|s| model.pair[here][s].map(|l| (s, cost[l])))
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                let Some((next, _)) = next else { break };
                visited[next] = true;
                order.push(next);
            }
            if order.len() == m && model.ring_hops(&order).is_some() {
                out.push(Candidate::Ring(canonical(&order)));
            }
        }
    }
}

/// The site pairs without a link, for an error that says what to add.
fn describe_missing(model: &Model<'_>) -> String {
    let sites = &model.input.sites;
    let missing: Vec<String> = (0..model.sites)
        .flat_map(|a| (a + 1..model.sites).map(move |b| (a, b)))
        .filter(|&(a, b)| model.link(a, b).is_none())
        .map(|(a, b)| format!("{}–{}", sites[a], sites[b]))
        .collect();
    let how = if model.sites <= EXACT_RING_SITES {
        "no ring through every site exists either"
    } else {
        "and no ring through every site was found"
    };
    format!(
        "the mesh lacks {} link{} ({}); {how}",
        missing.len(),
        if missing.len() == 1 { "" } else { "s" },
        missing.join(", ")
    )
}
