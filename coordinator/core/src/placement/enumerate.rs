//! Enumeration helpers of the search: compositions, site sequences,
//! outer-sync rings and DiLoCo site subsets, exact up to
//! [`EXACT_SITES`] sites and heuristic beyond.

use super::model::Ctx;
use super::search::Effort;

/// Sites up to which site orders and subsets are enumerated exactly.
pub(crate) const EXACT_SITES: usize = 6;

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

/// Ordered sequences of distinct, WAN-linked sites a pipeline may follow.
pub(crate) fn site_sequences(ctx: &Ctx<'_>, effort: Effort, max_len: usize) -> Vec<Vec<usize>> {
    let n = ctx.sites.len();
    let mut out: Vec<Vec<usize>> = (0..n).map(|s| vec![s]).collect();
    if effort == Effort::Exhaustive || n <= EXACT_SITES {
        let mut frontier = out.clone();
        for _ in 1..max_len.min(n) {
            let mut next = Vec::new();
            for seq in &frontier {
                let last = seq[seq.len() - 1];
                for s in 0..n {
                    if !seq.contains(&s) && ctx.link(last, s).is_some() {
                        let mut longer = seq.clone();
                        longer.push(s);
                        next.push(longer);
                    }
                }
            }
            out.extend(next.iter().cloned());
            frontier = next;
        }
    } else {
        // Beyond six sites: from each start, extend to the nearest linked
        // site (lowest RTT), keeping every prefix up to four sites.
        for start in 0..n {
            let mut seq = vec![start];
            while seq.len() < max_len.min(4) {
                let last = seq[seq.len() - 1];
                let next = (0..n)
                    .filter(|s| !seq.contains(s))
                    .filter_map(|s| ctx.link(last, s).map(|l| (s, l.rtt_seconds())))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                let Some((s, _)) = next else { break };
                seq.push(s);
                out.push(seq.clone());
            }
        }
    }
    out
}

/// Rings through `subset` whose consecutive sites are linked: every ring
/// for up to six sites (one per rotation and direction), else the
/// nearest-neighbour tour.
pub(crate) fn rings(ctx: &Ctx<'_>, subset: &[usize], effort: Effort) -> Vec<Vec<usize>> {
    let closes = |ring: &[usize]| {
        (0..ring.len()).all(|i| ctx.link(ring[i], ring[(i + 1) % ring.len()]).is_some())
    };
    if subset.len() <= 3 {
        return if closes(subset) {
            vec![subset.to_vec()]
        } else {
            Vec::new()
        };
    }
    if effort == Effort::Exhaustive || subset.len() <= EXACT_SITES {
        let mut out = Vec::new();
        let rest: Vec<usize> = subset[1..].to_vec();
        permute(&rest, &mut Vec::new(), &mut |perm| {
            if perm[0] < perm[perm.len() - 1] {
                let mut ring = vec![subset[0]];
                ring.extend_from_slice(perm);
                if closes(&ring) {
                    out.push(ring);
                }
            }
        });
        return out;
    }
    let mut ring = vec![subset[0]];
    while ring.len() < subset.len() {
        let last = ring[ring.len() - 1];
        let next = subset
            .iter()
            .copied()
            .filter(|s| !ring.contains(s))
            .min_by(|&a, &b| {
                let rtt = |s| ctx.link(last, s).map_or(f64::INFINITY, |l| l.rtt_seconds());
                rtt(a).total_cmp(&rtt(b))
            });
        match next {
            Some(s) => ring.push(s),
            None => break,
        }
    }
    if closes(&ring) {
        vec![ring]
    } else {
        Vec::new()
    }
}

fn permute(rest: &[usize], cur: &mut Vec<usize>, f: &mut impl FnMut(&[usize])) {
    if cur.len() == rest.len() {
        f(cur);
        return;
    }
    for &s in rest {
        if !cur.contains(&s) {
            cur.push(s);
            permute(rest, cur, f);
            cur.pop();
        }
    }
}

/// Site subsets of at least two sites that DiLoCo may use.
pub(crate) fn subsets(ctx: &Ctx<'_>, effort: Effort, tp: u32) -> Vec<Vec<usize>> {
    let n = ctx.sites.len();
    if effort == Effort::Exhaustive || n <= EXACT_SITES {
        return (1u32..(1 << n))
            .filter(|mask| mask.count_ones() >= 2)
            .map(|mask| (0..n).filter(|&s| mask & (1 << s) != 0).collect())
            .collect();
    }
    // Beyond six sites: every prefix of the sites ordered fastest GPU first
    // (replicas hold equal batches, so the slowest site paces the rest),
    // then most TP slots, then topology order.
    let fastest = |s: usize| ctx.sites[s].pools.first().map_or(0.0, |p| p.flops);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        fastest(b)
            .total_cmp(&fastest(a))
            .then(ctx.sites[b].slots(tp).cmp(&ctx.sites[a].slots(tp)))
    });
    (2..=n)
        .map(|k| {
            let mut s = order[..k].to_vec();
            s.sort_unstable();
            s
        })
        .collect()
}
