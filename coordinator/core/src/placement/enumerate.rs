//! Enumeration helpers of the search: compositions, every site sequence
//! and DiLoCo subset (for the checks of the branch and bound in
//! [`super::sites`]), and whether a subset's outer sync has a ring.

use super::model::Ctx;

/// All ways to write `total` as `parts` positive integers with part i at
/// most `caps[i]`, in lexicographic order.
pub(crate) fn compositions(total: u32, parts: u32, caps: &[u32]) -> Vec<Vec<u32>> {
    fn go(left: u32, i: usize, caps: &[u32], cur: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
        let remaining = caps.len() - i;
        if remaining == 1 {
            if left >= 1 && left <= caps[i] {
                cur.push(left);
                out.push(cur.clone());
                cur.pop();
            }
            return;
        }
        let max_here = caps[i].min(left.saturating_sub(remaining as u32 - 1));
        for c in 1..=max_here {
            cur.push(c);
            go(left - c, i + 1, caps, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    if parts == 0 || total < parts || caps.len() != parts as usize {
        return out;
    }
    go(total, 0, caps, &mut Vec::new(), &mut out);
    out
}

/// C(n, k), saturating.
pub(crate) fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n.saturating_sub(k));
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Splits `total` into parts proportional to `weights` (largest remainder,
/// each at least 1 and at most its cap); `None` when the caps do not allow.
pub(crate) fn proportional(total: u32, weights: &[f64], caps: &[u32]) -> Option<Vec<u32>> {
    let sum: f64 = weights.iter().sum();
    let n = weights.len() as u32;
    if total < n || caps.iter().map(|&c| u64::from(c)).sum::<u64>() < u64::from(total) {
        return None;
    }
    let spare = f64::from(total - n);
    let mut parts: Vec<u32> = weights
        .iter()
        .zip(caps)
        .map(|(w, &c)| (1 + (spare * w / sum).floor() as u32).min(c))
        .collect();
    let mut given: u32 = parts.iter().sum();
    let mut i = 0usize;
    while given < total && i < 64 * parts.len() {
        let j = i % parts.len();
        if parts[j] < caps[j] {
            parts[j] += 1;
            given += 1;
        }
        i += 1;
    }
    (given == total).then_some(parts)
}

/// Every ordered sequence of distinct, WAN-linked sites a pipeline of up
/// to `max_len` stages may follow, shortest first.
pub(crate) fn site_sequences(ctx: &Ctx<'_>, max_len: usize) -> Vec<Vec<usize>> {
    let n = ctx.sites.len();
    let mut out: Vec<Vec<usize>> = (0..n).map(|s| vec![s]).collect();
    let mut frontier = out.clone();
    for _ in 1..max_len.min(n) {
        let mut next = Vec::new();
        for seq in &frontier {
            let last = seq[seq.len() - 1];
            for &s in ctx.neighbours(last) {
                if !seq.contains(&s) {
                    let mut longer = seq.clone();
                    longer.push(s);
                    next.push(longer);
                }
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}

/// Steps of the ring search before [`has_ring`] leaves the question to the
/// sync planner, which refuses a subset it finds no collective for.
const RING_STEPS: u64 = 10_000;

/// Whether the outer sync can run over `subset`: its sites are fully
/// meshed, or some ring through all of them has every hop linked. A search
/// too long to finish answers yes, and the sync planner decides.
pub(crate) fn has_ring(ctx: &Ctx<'_>, subset: &[usize]) -> bool {
    let linked = |a: usize, b: usize| ctx.link(a, b).is_some();
    let mesh = subset
        .iter()
        .enumerate()
        .all(|(i, &a)| subset[i + 1..].iter().all(|&b| linked(a, b)));
    if mesh {
        return true;
    }
    if subset.len() <= 3 {
        return false;
    }
    fn extend(
        ring: &mut Vec<usize>,
        rest: &mut Vec<usize>,
        linked: &dyn Fn(usize, usize) -> bool,
        steps: &mut u64,
    ) -> bool {
        *steps += 1;
        if *steps > RING_STEPS {
            return true;
        }
        let last = ring[ring.len() - 1];
        if rest.is_empty() {
            return linked(last, ring[0]);
        }
        for i in 0..rest.len() {
            let s = rest[i];
            if linked(last, s) {
                rest.swap_remove(i);
                ring.push(s);
                if extend(ring, rest, linked, steps) {
                    return true;
                }
                ring.pop();
                rest.push(s);
                let end = rest.len() - 1;
                rest.swap(i, end);
            }
        }
        false
    }
    let mut ring = vec![subset[0]];
    let mut rest = subset[1..].to_vec();
    extend(&mut ring, &mut rest, &linked, &mut 0)
}

/// Every site subset of at least two sites, for DiLoCo.
pub(crate) fn subsets(ctx: &Ctx<'_>) -> Vec<Vec<usize>> {
    let n = ctx.sites.len().min(31);
    (1u32..(1 << n))
        .filter(|mask| mask.count_ones() >= 2)
        .map(|mask| (0..n).filter(|&s| mask & (1 << s) != 0).collect())
        .collect()
}
