//! The planner's model: the input checked and resolved into per-link
//! figures, and the closed forms of the module documentation, shared by the
//! solver, the brute force and the plan.

use std::collections::BTreeMap;

use super::{Codec, SyncError, SyncInput};
use crate::cost::{self, Link};
use crate::limits::{MAX_SITES, quote};

/// X = max(0, T − τ·t): how long a fragment whose exchange takes `transfer`
/// seconds stalls training when it may run `overlap_steps` inner steps of
/// `inner_step` seconds behind.
pub fn exposed_seconds(transfer: f64, overlap_steps: u32, inner_step: f64) -> f64 {
    (transfer - f64::from(overlap_steps) * inner_step).max(0.0)
}

/// U = H·t / (H·t + E), as 1 / (1 + E/(H·t)): the fraction of an outer
/// step spent computing when `exposed_per_outer_step` seconds of sync are
/// not hidden. The second form never decreases as H grows, even rounded.
pub fn compute_utilisation(inner_steps: u32, inner_step: f64, exposed_per_outer_step: f64) -> f64 {
    1.0 / (1.0 + exposed_per_outer_step / (f64::from(inner_steps) * inner_step))
}

/// 2(M−1)/M × payload: what each of `sites` sends in a reduce-scatter +
/// all-gather (or a ring) of `payload` bytes.
pub fn bytes_sent_per_site(sites: usize, payload: f64) -> f64 {
    let m = sites as f64;
    2.0 * (m - 1.0) / m * payload
}

/// H × bits(sync DP) / bits(codec): how many times fewer bytes cross the
/// WAN than synchronous data parallelism over the same sites and links.
pub fn reduction_vs_sync_dp(inner_steps: u32, sync_dp_bits: u32, wire_bits: f64) -> f64 {
    f64::from(inner_steps) * f64::from(sync_dp_bits) / wire_bits
}

/// Which limit set a link's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateLimit {
    Capacity,
    Streams,
    Budget,
}

/// One WAN link between replica sites, resolved.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedLink {
    pub between: [String; 2],
    pub rtt_seconds: f64,
    pub loss: f64,
    pub rtt_measured: bool,
    pub loss_measured: bool,
    pub throughput_measured: bool,
    /// Configured figures, for the reason.
    pub configured_rtt_seconds: f64,
    pub configured_loss: f64,
    pub configured_bytes_per_second: f64,
    /// Measured throughput or configured aggregate, bytes per second.
    pub capacity_bytes_per_second: f64,
    /// What the sync gets: capacity capped by streams and budget.
    pub rate_bytes_per_second: f64,
    pub limit: RateLimit,
    pub zstd: bool,
    /// Bits per element on the wire, after zstd.
    pub wire_bits: f64,
    /// α = one-way latency; β = raw (pre-zstd) bytes moved per second.
    pub link: Link,
}

/// A collective for one fragment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Candidate {
    /// Reduce-scatter + all-gather over the full mesh.
    Direct,
    /// A ring through the sites in this order (site indices, starting at
    /// 0, second site below the last: one name per cycle).
    Ring(Vec<usize>),
}

/// The input, checked, with every figure the search needs.
#[derive(Debug)]
pub(crate) struct Model<'a> {
    pub input: &'a SyncInput,
    pub sites: usize,
    pub links: Vec<ResolvedLink>,
    /// `pair[a][b]`: index into `links` of the link between sites a and b.
    pub pair: Vec<Vec<Option<usize>>>,
    pub codec: Codec,
    pub zstd_ratio: f64,
    pub target: f64,
    pub inner_step: f64,
    pub h_min: u32,
    pub h_max: u32,
    pub p_min: u32,
    pub p_max: u32,
    pub overlap_max: u32,
}

fn finite_positive(field: &str, value: f64) -> Result<f64, SyncError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(SyncError::invalid(
            field,
            format!("must be a positive finite number, found {value}"),
        ))
    }
}

impl<'a> Model<'a> {
    /// Checks `input` and resolves it; every error names the field.
    pub fn new(input: &'a SyncInput) -> Result<Self, SyncError> {
        if input.parameters == 0 {
            return Err(SyncError::invalid(
                "parameters",
                "must be at least 1, found 0",
            ));
        }
        let inner_step = finite_positive("inner_step_seconds", input.inner_step_seconds)?;
        if !(1..=64).contains(&input.sync_dp_bits) {
            return Err(SyncError::invalid(
                "sync_dp_bits",
                format!("must be within [1, 64], found {}", input.sync_dp_bits),
            ));
        }
        if input.streams_per_link == 0 {
            return Err(SyncError::invalid(
                "streams_per_link",
                "must be at least 1, found 0",
            ));
        }
        let compressor = finite_positive("zstd_bytes_per_second", input.zstd_bytes_per_second)?;

        let sites = input.sites.len();
        if sites < 2 {
            return Err(SyncError::invalid(
                "sites",
                format!("a DiLoCo sync needs at least 2 replica sites, found {sites}"),
            ));
        }
        if sites > MAX_SITES {
            return Err(SyncError::invalid(
                "sites",
                format!("at most {MAX_SITES} sites, found {sites}"),
            ));
        }
        let mut index = BTreeMap::new();
        for (i, site) in input.sites.iter().enumerate() {
            if site.is_empty() {
                return Err(SyncError::invalid(
                    format!("sites[{i}]"),
                    "must not be empty",
                ));
            }
            if index.insert(site.as_str(), i).is_some() {
                return Err(SyncError::invalid(
                    format!("sites[{i}]"),
                    format!("site {} is listed twice", quote(site)),
                ));
            }
        }

        let policy = &input.policy;
        if let Some((field, message)) = policy.problems().into_iter().next() {
            return Err(SyncError::invalid(format!("policy.{field}"), message));
        }
        let codec = choose_codec(input)?;
        let zstd_ratio = policy.zstd_ratio.unwrap_or(codec.zstd_ratio);
        let budget = policy.link_budget.map(|b| b.bytes_per_second());

        let mut pair = vec![vec![None; sites]; sites];
        let mut links = Vec::with_capacity(input.links.len());
        for (i, record) in input.links.iter().enumerate() {
            let field = |rest: &str| format!("links[{i}].{rest}");
            let configured = &record.configured;
            let mut ends = [0usize; 2];
            for (e, end) in configured.between.iter().enumerate() {
                ends[e] = *index.get(end.as_str()).ok_or_else(|| {
                    SyncError::invalid(
                        field(&format!("configured.between[{e}]")),
                        format!("site {} is not one of the replica sites", quote(end)),
                    )
                })?;
            }
            let (a, b) = (ends[0].min(ends[1]), ends[0].max(ends[1]));
            if a == b {
                return Err(SyncError::invalid(
                    field("configured.between"),
                    "a link must join two different sites",
                ));
            }
            if pair[a][b].is_some() {
                return Err(SyncError::invalid(
                    field("configured.between"),
                    format!(
                        "a second link between {} and {}",
                        quote(&input.sites[a]),
                        quote(&input.sites[b])
                    ),
                ));
            }
            if configured.link_rate.bits_per_second() == 0 || configured.parallel_links == 0 {
                return Err(SyncError::invalid(
                    field("configured.link_rate"),
                    "the link has no capacity (rate or parallel_links is 0)",
                ));
            }
            if !(configured.loss.is_finite() && (0.0..1.0).contains(&configured.loss)) {
                return Err(SyncError::invalid(
                    field("configured.loss"),
                    format!("must be a probability in [0, 1), found {}", configured.loss),
                ));
            }
            let configured_rtt = configured.rtt_seconds();
            if !configured_rtt.is_finite() {
                return Err(SyncError::invalid(
                    field("configured.distance"),
                    "the configured RTT is not finite",
                ));
            }
            let configured_rate =
                configured.link_rate.bytes_per_second() * f64::from(configured.parallel_links);
            let measured = record.measured;
            let rtt_measured = measured.is_some_and(|m| m.rtt_ns > 0);
            let throughput_measured = measured.is_some_and(|m| m.throughput_bps > 0);
            let rtt_seconds = match measured {
                Some(m) if m.rtt_ns > 0 => m.rtt_ns as f64 / 1e9,
                _ => configured_rtt,
            };
            let loss = match measured {
                Some(m) => {
                    if !(m.loss_rate.is_finite() && (0.0..1.0).contains(&m.loss_rate)) {
                        return Err(SyncError::invalid(
                            field("measured.loss_rate"),
                            format!(
                                "must be a probability in [0, 1) for a link that carries anything, found {}",
                                m.loss_rate
                            ),
                        ));
                    }
                    m.loss_rate
                }
                None => configured.loss,
            };
            let capacity = match measured {
                Some(m) if m.throughput_bps > 0 => m.throughput_bps as f64 / 8.0,
                _ => configured_rate,
            };
            let by_streams =
                cost::loss_limited_rate(capacity, rtt_seconds, loss, input.streams_per_link);
            let (mut rate, mut limit) = if by_streams < capacity {
                (by_streams, RateLimit::Streams)
            } else {
                (capacity, RateLimit::Capacity)
            };
            if let Some(budget) = budget
                && budget < rate
            {
                rate = budget;
                limit = RateLimit::Budget;
            }
            // zstd is pipelined with sending: it pays when it shrinks the
            // data and compresses faster than the link sends.
            let zstd = zstd_ratio > 1.0 && compressor > rate;
            let raw_bytes_per_second = if zstd {
                1.0 / (1.0 / compressor).max(1.0 / (zstd_ratio * rate))
            } else {
                rate
            };
            let raw_bits = codec.bits_per_parameter();
            pair[a][b] = Some(links.len());
            pair[b][a] = Some(links.len());
            links.push(ResolvedLink {
                between: [input.sites[a].clone(), input.sites[b].clone()],
                rtt_seconds,
                loss,
                rtt_measured,
                loss_measured: measured.is_some(),
                throughput_measured,
                configured_rtt_seconds: configured_rtt,
                configured_loss: configured.loss,
                configured_bytes_per_second: configured_rate,
                capacity_bytes_per_second: capacity,
                rate_bytes_per_second: rate,
                limit,
                zstd,
                wire_bits: if zstd {
                    raw_bits / zstd_ratio
                } else {
                    raw_bits
                },
                link: Link::new(rtt_seconds / 2.0, raw_bytes_per_second),
            });
        }

        let h_min = policy.inner_steps;
        let h_max = policy.max_inner_steps();
        let fragment_cap = u32::try_from(input.parameters).unwrap_or(u32::MAX);
        let (p_min, p_max) = match policy.fragments {
            Some(p) => {
                if u64::from(p) > input.parameters {
                    return Err(SyncError::invalid(
                        "policy.fragments",
                        format!(
                            "{p} fragments of a pseudo-gradient of {} parameters",
                            input.parameters
                        ),
                    ));
                }
                (p, p)
            }
            None => (
                1,
                policy.max_fragments().min(h_max).min(fragment_cap).max(1),
            ),
        };
        Ok(Self {
            input,
            sites,
            links,
            pair,
            codec,
            zstd_ratio,
            target: policy.target_compute_utilisation(),
            inner_step,
            h_min,
            h_max,
            p_min,
            p_max,
            overlap_max: policy.max_overlap_steps(),
        })
    }

    /// The link between sites `a` and `b`.
    pub fn link(&self, a: usize, b: usize) -> Option<&ResolvedLink> {
        self.links.get((*self.pair.get(a)?.get(b)?)?)
    }

    /// True when every pair of sites has a link.
    pub fn full_mesh(&self) -> bool {
        self.links.len() == self.sites * (self.sites - 1) / 2
    }

    /// F: bytes of the largest of `fragments` fragments before zstd.
    pub fn fragment_bytes(&self, fragments: u32) -> f64 {
        self.input.parameters.div_ceil(u64::from(fragments.max(1))) as f64
            * self.codec.bits_per_parameter()
            / 8.0
    }

    /// The hops of a ring, as link indices; `None` when one is missing.
    pub fn ring_hops(&self, order: &[usize]) -> Option<Vec<usize>> {
        (0..order.len())
            .map(|i| self.pair[order[i]][order[(i + 1) % order.len()]])
            .collect()
    }

    /// The seconds link `l` is busy with one fragment of `fragments` under
    /// `candidate`: 2·(α + σ·F/M) on a mesh link, 2·[(M−1)α + (M−1)/M·σ·F]
    /// on a ring hop.
    pub fn link_seconds(&self, candidate: &Candidate, l: usize, fragments: u32) -> f64 {
        let bytes = self.fragment_bytes(fragments);
        let link = self.links[l].link;
        match candidate {
            Candidate::Direct => 2.0 * link.transfer(bytes / self.sites as f64),
            Candidate::Ring(_) => 2.0 * cost::ring_reduce_scatter(self.sites as u64, bytes, link),
        }
    }

    /// The links `candidate` uses.
    pub fn used_links(&self, candidate: &Candidate) -> Vec<usize> {
        match candidate {
            Candidate::Direct => (0..self.links.len()).collect(),
            Candidate::Ring(order) => self.ring_hops(order).unwrap_or_default(),
        }
    }

    /// T: one fragment's exchange, paced by the slowest link it uses.
    pub fn fragment_seconds(&self, candidate: &Candidate, fragments: u32) -> f64 {
        self.used_links(candidate)
            .into_iter()
            .map(|l| self.link_seconds(candidate, l, fragments))
            .fold(0.0, f64::max)
    }

    /// Bytes one link carries per outer step under `candidate`, both
    /// directions, at `bits` per element: 4·(N/M)·bits/8 on the mesh,
    /// 2(M−1)/M·N·bits/8 on a ring hop.
    pub fn link_bytes(&self, candidate: &Candidate, bits: f64) -> f64 {
        let n = self.input.parameters as f64;
        let m = self.sites as f64;
        match candidate {
            Candidate::Direct => 4.0 * (n / m) * bits / 8.0,
            Candidate::Ring(_) => bytes_sent_per_site(self.sites, n * bits / 8.0),
        }
    }
}

/// The codec the job fixes, else the one with the fewest bits.
fn choose_codec(input: &SyncInput) -> Result<Codec, SyncError> {
    if input.codecs.is_empty() {
        return Err(SyncError::invalid("codecs", "at least one codec is needed"));
    }
    let mut seen = Vec::new();
    for (i, codec) in input.codecs.iter().enumerate() {
        let field = |rest: &str| format!("codecs[{i}].{rest}");
        // The baseline of synchronous data parallelism
        // (`SyncInput::sync_dp`): the training precision as it is, whatever
        // its width, as the one codec of an every-step exchange without
        // error feedback. A DiLoCo input keeps to 16, 8 and 4 bits.
        let baseline = codec.bits == input.sync_dp_bits
            && codec.block_size == 0
            && input.codecs.len() == 1
            && input.policy.max_inner_steps == Some(1)
            && input.policy.error_feedback == Some(false);
        if ![4, 8, 16].contains(&codec.bits) && !baseline {
            return Err(SyncError::invalid(
                field("bits"),
                format!(
                    "must be 16, 8 or 4 (or the training precision's {} bits without blocks), \
                     found {}",
                    input.sync_dp_bits, codec.bits
                ),
            ));
        }
        if seen.contains(&codec.bits) {
            return Err(SyncError::invalid(
                field("bits"),
                format!("a second codec of {} bits", codec.bits),
            ));
        }
        seen.push(codec.bits);
        if codec.bits < 16 && codec.block_size == 0 && !baseline {
            return Err(SyncError::invalid(
                field("block_size"),
                format!(
                    "a {}-bit codec needs blocks of at least 1 element",
                    codec.bits
                ),
            ));
        }
        if codec.block_size == 0 && codec.scale_bits != 0 {
            return Err(SyncError::invalid(
                field("scale_bits"),
                "scales need blocks: set block_size or make scale_bits 0",
            ));
        }
        if codec.scale_bits > 64 {
            return Err(SyncError::invalid(
                field("scale_bits"),
                format!("must be at most 64, found {}", codec.scale_bits),
            ));
        }
        if !(codec.zstd_ratio.is_finite() && (1.0..=100.0).contains(&codec.zstd_ratio)) {
            return Err(SyncError::invalid(
                field("zstd_ratio"),
                format!(
                    "must be a ratio within [1, 100] (1.0: zstd gains nothing), found {}",
                    codec.zstd_ratio
                ),
            ));
        }
    }
    match input.policy.bits {
        Some(bits) => input
            .codecs
            .iter()
            .find(|c| c.bits == bits)
            .copied()
            .ok_or_else(|| {
                SyncError::invalid(
                    "policy.bits",
                    format!("no {bits}-bit codec is available (codecs offer {seen:?})"),
                )
            }),
        None => input
            .codecs
            .iter()
            .copied()
            .min_by_key(|c| c.bits)
            .ok_or_else(|| SyncError::invalid("codecs", "at least one codec is needed")),
    }
}
