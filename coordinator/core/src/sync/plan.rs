//! The sync plan the planner emits, and the reasons it gives. It
//! serialises to JSON and back unchanged; every figure is finite.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::{Candidate, Model, RateLimit, ResolvedLink, reduction_vs_sync_dp};
use super::search::{Choice, Search};
use crate::cost;
use crate::placement::Reason;
use crate::units::{human_bytes, human_rate, human_seconds};

/// How the sites reduce each fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveKind {
    /// Reduce-scatter + all-gather over the full mesh: site i owns the
    /// i-th M-th of each fragment.
    ReduceScatterAllGather,
    /// Reduce-scatter + all-gather around a ring.
    Ring,
}

/// The collective and the order of its sites.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectivePlan {
    pub kind: CollectiveKind,
    /// Shard owners in order (the mesh) or the ring, each site once; a
    /// ring closes back to its first site.
    pub order: Vec<String>,
    /// Latency steps of one fragment's exchange: 2, or 2(M−1) on a ring.
    pub steps: u32,
}

/// When one fragment syncs within each outer step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FragmentSync {
    pub fragment: u32,
    /// Parameters `first_parameter .. first_parameter + parameters`.
    pub first_parameter: u64,
    pub parameters: u64,
    /// ⌊f·H/P⌋: the inner step (of 0..H) after which its exchange starts.
    pub sync_at_inner_step: u32,
    /// sync_at + τ: the inner step by which its reduced result is applied.
    pub apply_at_inner_step: u32,
}

/// What one WAN link carries, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkPlan {
    pub between: [String; 2],
    /// Bits per element of the codec: 16, 8 or 4.
    pub bits: u32,
    /// Elements per scale; 0 without scales.
    pub block_size: u32,
    pub error_feedback: bool,
    pub zstd: bool,
    /// Bits each parameter takes on the wire: scales included, after zstd.
    pub wire_bits_per_parameter: f64,
    /// RTT and loss the plan used: measured when a measurement exists.
    pub rtt_seconds: f64,
    pub loss: f64,
    /// True when any figure of this link came from a measurement.
    pub measured: bool,
    /// The rate the sync gets on the link, bits per second.
    pub rate_bits_per_second: f64,
    /// How long this link is busy with one fragment.
    pub transfer_seconds_per_fragment: f64,
    /// Both directions, per outer step.
    pub bytes_per_outer_step: f64,
    /// bytes_per_outer_step over the outer step's wall time, in bits/s.
    pub average_bits_per_second: f64,
    /// What synchronous data parallelism would send on it per step.
    pub sync_dp_bytes_per_step: f64,
    /// H × sync-DP bits / wire bits.
    pub reduction_vs_sync_dp: f64,
    pub reason: String,
}

/// The sync schedule of one job: see the module documentation for the
/// model behind every figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncPlan {
    /// The replica sites, as given.
    pub sites: Vec<String>,
    pub parameters: u64,
    /// H: inner steps per outer step.
    pub inner_steps: u32,
    /// P: fragments, synced at staggered offsets.
    pub fragments: u32,
    /// τ: inner steps a fragment's exchange may run behind.
    pub overlap_steps: u32,
    pub collective: CollectivePlan,
    pub schedule: Vec<FragmentSync>,
    /// The links the collective uses, in input order.
    pub links: Vec<LinkPlan>,
    pub inner_step_seconds: f64,
    /// Bytes of the largest fragment before zstd.
    pub fragment_bytes: f64,
    /// T: one fragment's exchange, paced by its slowest link.
    pub fragment_transfer_seconds: f64,
    /// max(0, T − τ·t).
    pub exposed_seconds_per_fragment: f64,
    /// P × the above.
    pub exposed_seconds_per_outer_step: f64,
    /// H·t + exposed.
    pub outer_step_seconds: f64,
    /// H·t / outer step, as a fraction.
    pub predicted_compute_utilisation: f64,
    pub target_compute_utilisation: f64,
    pub meets_target: bool,
    /// Over all links, both directions.
    pub bytes_per_outer_step: f64,
    pub bytes_per_inner_step: f64,
    /// What synchronous data parallelism would send per step on the same links.
    pub sync_dp_bytes_per_step: f64,
    pub reduction_vs_sync_dp: f64,
    /// One per decision: `inner_steps`, `fragments`, `overlap_steps`,
    /// `collective`, `codec`, `utilisation`, `reduction` (and `replan`
    /// after a re-plan).
    pub reasons: Vec<Reason>,
    /// Set when this plan replaced the job's earlier one from the
    /// trainers' measured inner step ([`super::replan_sync`]); `None` as
    /// placement planned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replanned: Option<super::Replanned>,
}

impl SyncPlan {
    /// Bits per element of the codec (the planner picks one for every
    /// link); 0 when no link is used.
    pub fn bits(&self) -> u32 {
        self.links.iter().map(|l| l.bits).max().unwrap_or(0)
    }

    /// The reason recorded for `decision`, if any.
    pub fn reason(&self, decision: &str) -> Option<&Reason> {
        self.reasons.iter().find(|r| r.decision == decision)
    }

    /// The plan of the link between `a` and `b`, in either order.
    pub fn link(&self, a: &str, b: &str) -> Option<&LinkPlan> {
        self.links.iter().find(|l| {
            (l.between[0] == a && l.between[1] == b) || (l.between[0] == b && l.between[1] == a)
        })
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.2} %", fraction * 100.0)
}

fn seconds_or_nothing(seconds: f64) -> String {
    if seconds == 0.0 {
        "nothing".to_string()
    } else {
        human_seconds(seconds)
    }
}

fn reason(decision: &str, choice: String, reason: String) -> Reason {
    Reason {
        decision: decision.to_string(),
        choice,
        reason,
    }
}

pub(crate) fn assemble(model: &Model<'_>, search: &Search<'_, '_>, choice: &Choice) -> SyncPlan {
    let input = model.input;
    let (h, p, tau) = (choice.inner_steps, choice.fragments, choice.overlap_steps);
    let t = model.inner_step;
    let outer_step_seconds = f64::from(h) * t + choice.exposed_per_outer_step;
    let codec = model.codec;
    let error_feedback = codec.bits < 16 && input.policy.error_feedback();

    // A link appears once per hop that uses it (twice only on a ring of
    // two sites, which the solver never picks: the mesh is the same).
    let mut uses: BTreeMap<usize, u32> = BTreeMap::new();
    for l in model.used_links(&choice.candidate) {
        *uses.entry(l).or_insert(0) += 1;
    }
    let links: Vec<LinkPlan> = uses
        .iter()
        .map(|(&l, &count)| {
            let link = &model.links[l];
            let times = f64::from(count);
            let bytes = times * model.link_bytes(&choice.candidate, link.wire_bits);
            let sync_dp =
                times * model.link_bytes(&choice.candidate, f64::from(input.sync_dp_bits));
            LinkPlan {
                between: link.between.clone(),
                bits: codec.bits,
                block_size: codec.block_size,
                error_feedback,
                zstd: link.zstd,
                wire_bits_per_parameter: link.wire_bits,
                rtt_seconds: link.rtt_seconds,
                loss: link.loss,
                measured: link.loss_measured,
                rate_bits_per_second: link.rate_bytes_per_second * 8.0,
                transfer_seconds_per_fragment: model.link_seconds(&choice.candidate, l, p),
                bytes_per_outer_step: bytes,
                average_bits_per_second: bytes * 8.0 / outer_step_seconds,
                sync_dp_bytes_per_step: sync_dp,
                reduction_vs_sync_dp: reduction_vs_sync_dp(h, input.sync_dp_bits, link.wire_bits),
                reason: link_reason(model, link),
            }
        })
        .collect();

    let bytes_per_outer_step: f64 = links.iter().map(|l| l.bytes_per_outer_step).sum();
    let sync_dp_bytes_per_step: f64 = links.iter().map(|l| l.sync_dp_bytes_per_step).sum();
    // Every link occurrence carries the same number of elements, so the
    // plan's wire bits are the plain mean over occurrences.
    let occurrences: Vec<f64> = uses
        .iter()
        .flat_map(|(&l, &count)| std::iter::repeat_n(model.links[l].wire_bits, count as usize))
        .collect();
    let first = occurrences
        .first()
        .copied()
        .unwrap_or(codec.bits_per_parameter());
    let wire_bits = if occurrences.iter().all(|&w| w == first) {
        first
    } else {
        occurrences.iter().sum::<f64>() / occurrences.len() as f64
    };
    let reduction = reduction_vs_sync_dp(h, input.sync_dp_bits, wire_bits);

    let n = input.parameters;
    let schedule = (0..p)
        .map(|f| {
            let start = |f: u32| (u128::from(f) * u128::from(n) / u128::from(p)) as u64;
            let (sync_at, apply_at) = stagger(f, p, h, tau);
            FragmentSync {
                fragment: f,
                first_parameter: start(f),
                parameters: start(f + 1) - start(f),
                sync_at_inner_step: sync_at,
                apply_at_inner_step: apply_at,
            }
        })
        .collect();

    let collective = match &choice.candidate {
        Candidate::Direct => CollectivePlan {
            kind: CollectiveKind::ReduceScatterAllGather,
            order: input.sites.clone(),
            steps: 2,
        },
        Candidate::Ring(order) => CollectivePlan {
            kind: CollectiveKind::Ring,
            order: order.iter().map(|&s| input.sites[s].clone()).collect(),
            steps: 2 * (model.sites as u32 - 1),
        },
    };

    let reasons = vec![
        inner_steps_reason(model, search, choice),
        fragments_reason(model, search, choice),
        overlap_reason(model, search, choice),
        collective_reason(model, search, choice, &collective),
        codec_reason(model, error_feedback),
        reason(
            "utilisation",
            percent(choice.utilisation),
            format!(
                "{} of sync exposed per outer step of {} compute ({h} × {}); target {}, {}",
                seconds_or_nothing(choice.exposed_per_outer_step),
                human_seconds(f64::from(h) * t),
                human_seconds(t),
                percent(model.target),
                if choice.meets { "met" } else { "missed" }
            ),
        ),
        reason(
            "reduction",
            format!("{reduction:.0}×"),
            format!(
                "synchronous data parallelism over the same links would send {} per step \
                 ({}-bit gradients every step); this plan sends {} per outer step of {h} steps, \
                 {} per step: H × {} / {wire_bits:.3} bits",
                human_bytes(sync_dp_bytes_per_step),
                input.sync_dp_bits,
                human_bytes(bytes_per_outer_step),
                human_bytes(bytes_per_outer_step / f64::from(h)),
                input.sync_dp_bits,
            ),
        ),
    ];

    SyncPlan {
        sites: input.sites.clone(),
        parameters: n,
        inner_steps: h,
        fragments: p,
        overlap_steps: tau,
        collective,
        schedule,
        links,
        inner_step_seconds: t,
        fragment_bytes: model.fragment_bytes(p),
        fragment_transfer_seconds: choice.transfer,
        exposed_seconds_per_fragment: choice.exposed_per_fragment,
        exposed_seconds_per_outer_step: choice.exposed_per_outer_step,
        outer_step_seconds,
        predicted_compute_utilisation: choice.utilisation,
        target_compute_utilisation: model.target,
        meets_target: choice.meets,
        bytes_per_outer_step,
        bytes_per_inner_step: bytes_per_outer_step / f64::from(h),
        sync_dp_bytes_per_step,
        reduction_vs_sync_dp: reduction,
        reasons,
        replanned: None,
    }
}

/// When fragment `fragment` of `fragments` syncs within an outer step of
/// `inner_steps` with overlap `overlap_steps` (Streaming DiLoCo's
/// stagger): its exchange starts after inner step ⌊f·H/P⌋ and its result
/// is applied τ steps later.
pub fn stagger(fragment: u32, fragments: u32, inner_steps: u32, overlap_steps: u32) -> (u32, u32) {
    let sync_at =
        (u64::from(fragment) * u64::from(inner_steps) / u64::from(fragments.max(1))) as u32;
    (sync_at, sync_at.saturating_add(overlap_steps))
}

/// The best utilisation any admissible (P, τ) reaches at H = `h`; `None`
/// when no P fits in `h` inner steps.
fn best_utilisation_at(model: &Model<'_>, search: &Search<'_, '_>, h: u32) -> Option<f64> {
    let mut best: Option<f64> = None;
    for p in model.p_min..=model.p_max.min(h) {
        for tau in 0..=model.overlap_max {
            if p * tau > h {
                break;
            }
            let u = search.choice(h, p, tau).utilisation;
            best = Some(best.map_or(u, |b| b.max(u)));
        }
    }
    best
}

fn inner_steps_reason(model: &Model<'_>, search: &Search<'_, '_>, choice: &Choice) -> Reason {
    let h = choice.inner_steps;
    let target = percent(model.target);
    let predicted = percent(choice.utilisation);
    let text = if !choice.meets {
        format!(
            "the most the job allows (max_inner_steps {}), and still the target {target} is \
             missed: predicted {predicted}. Raise max_inner_steps, lower the target, allow \
             more overlap, or give the sync more of the links",
            model.h_max
        )
    } else if model.h_min == model.h_max {
        format!(
            "fixed by the job (inner_steps = max_inner_steps); predicted {predicted} meets \
             the target {target}"
        )
    } else if h == model.h_min {
        format!(
            "the job's inner_steps: at it the sync is hidden enough (predicted {predicted}, \
             target {target}), so H is not raised"
        )
    } else {
        let at_job = match best_utilisation_at(model, search, model.h_min) {
            Some(u) => format!(
                "at {} the best schedule reaches {}",
                model.h_min,
                percent(u)
            ),
            None => format!(
                "{} fragments do not fit in {} inner steps",
                model.p_min, model.h_min
            ),
        };
        format!(
            "raised from the job's inner_steps {}: the smallest H that meets the target \
             {target} ({at_job}); the job allows up to {}",
            model.h_min, model.h_max
        )
    };
    reason("inner_steps", h.to_string(), text)
}

fn fragments_reason(model: &Model<'_>, search: &Search<'_, '_>, choice: &Choice) -> Reason {
    let (h, p, tau) = (choice.inner_steps, choice.fragments, choice.overlap_steps);
    let what = if p == 1 {
        format!(
            "the whole pseudo-gradient ({}) is exchanged at once after inner step 0, in {}",
            human_bytes(model.fragment_bytes(p)),
            human_seconds(choice.transfer)
        )
    } else {
        format!(
            "fragments of up to {} each take {} to exchange; fragment f starts after inner \
             step ⌊f·{h}/{p}⌋, one every {:.1} steps",
            human_bytes(model.fragment_bytes(p)),
            human_seconds(choice.transfer),
            f64::from(h) / f64::from(p)
        )
    };
    let why = if model.p_min == model.p_max {
        format!("fixed by the job (fragments = {p})")
    } else if !choice.meets {
        format!("the count that gets closest to the target at H = {h} and τ = {tau}")
    } else if p == model.p_min {
        "the fewest possible: more fragments are not needed to meet the target".to_string()
    } else {
        let fewer = search.choice(h, p - 1, tau);
        format!(
            "the fewest that meet the target at H = {h} and τ = {tau} (with {} the predicted \
             utilisation is {})",
            p - 1,
            percent(fewer.utilisation)
        )
    };
    reason("fragments", p.to_string(), format!("{why}; {what}"))
}

fn overlap_reason(model: &Model<'_>, search: &Search<'_, '_>, choice: &Choice) -> Reason {
    let (h, p, tau) = (choice.inner_steps, choice.fragments, choice.overlap_steps);
    let t = model.inner_step;
    let hidden = format!(
        "each exchange of {} hides behind {tau} × {} of compute, exposing {}",
        human_seconds(choice.transfer),
        human_seconds(t),
        seconds_or_nothing(choice.exposed_per_fragment)
    );
    let why = if !choice.meets {
        format!(
            "the overlap that gets closest to the target (the job allows up to {})",
            model.overlap_max
        )
    } else if tau == 0 {
        "no overlap needed: training waits for each exchange and still meets the target".to_string()
    } else {
        let less = search.choice(h, p, tau - 1);
        format!(
            "the least staleness that meets the target (with τ = {} the predicted utilisation \
             is {})",
            tau - 1,
            percent(less.utilisation)
        )
    };
    reason("overlap_steps", tau.to_string(), format!("{why}; {hidden}"))
}

fn collective_reason(
    model: &Model<'_>,
    search: &Search<'_, '_>,
    choice: &Choice,
    collective: &CollectivePlan,
) -> Reason {
    let m = model.sites;
    let share = 2.0 * (m as f64 - 1.0) / m as f64;
    let what = match collective.kind {
        CollectiveKind::ReduceScatterAllGather => {
            "reduce-scatter + all-gather over the full mesh".to_string()
        }
        CollectiveKind::Ring => format!(
            "ring {} → {}",
            collective.order.join(" → "),
            collective.order[0]
        ),
    };
    let alternative = match search.alternative(&choice.candidate, choice.fragments) {
        Some((Candidate::Direct, seconds)) => format!(
            "reduce-scatter + all-gather over the mesh would take {}",
            human_seconds(seconds)
        ),
        Some((Candidate::Ring(order), seconds)) => format!(
            "the best ring ({}) would take {}",
            order
                .iter()
                .map(|&s| model.input.sites[s].as_str())
                .collect::<Vec<_>>()
                .join(" → "),
            human_seconds(seconds)
        ),
        None if m == 2 => "with two sites a ring is the same exchange".to_string(),
        None if matches!(choice.candidate, Candidate::Ring(_)) => {
            "the mesh is incomplete, so a ring is the only choice".to_string()
        }
        None => "no ring through every site exists".to_string(),
    };
    reason(
        "collective",
        what,
        format!(
            "each site sends 2(M−1)/M = {share:.2} × the payload per outer step in {} latency \
             steps; a fragment takes {}; {alternative}",
            collective.steps,
            human_seconds(choice.transfer)
        ),
    )
}

fn codec_reason(model: &Model<'_>, error_feedback: bool) -> Reason {
    let codec = model.codec;
    let why = if model.input.policy.bits.is_some() {
        format!("fixed by the job (bits = {})", codec.bits)
    } else {
        "the fewest bits the codecs offer: 4-bit pseudo-gradients trained as well as bf16 in \
         Streaming DiLoCo, so fewer bytes cost no quality there"
            .to_string()
    };
    let blocks = if codec.block_size == 0 {
        "no scales".to_string()
    } else {
        format!(
            "blocks of {} with a {}-bit scale ({:.4} bits per parameter)",
            codec.block_size,
            codec.scale_bits,
            codec.bits_per_parameter()
        )
    };
    let feedback = if codec.bits >= 16 {
        "no error feedback (nothing is quantised beyond bf16)"
    } else if error_feedback {
        "error feedback carries each outer step's quantisation residual into the next"
    } else {
        "error feedback off, as the job asks"
    };
    reason(
        "codec",
        format!("{}-bit on every link", codec.bits),
        format!("{why}; {blocks}; {feedback}; zstd per link, see each link"),
    )
}

fn link_reason(model: &Model<'_>, link: &ResolvedLink) -> String {
    let source = |measured: bool| if measured { "measured" } else { "configured" };
    let mut figures = format!(
        "RTT {} {}, loss {} {}, capacity {} {}",
        human_seconds(link.rtt_seconds),
        source(link.rtt_measured),
        link.loss,
        source(link.loss_measured),
        human_rate(link.capacity_bytes_per_second * 8.0),
        source(link.throughput_measured)
    );
    if link.loss_measured {
        figures += &format!(
            " (the measurement is preferred; configured: RTT {}, loss {}, {})",
            human_seconds(link.configured_rtt_seconds),
            link.configured_loss,
            human_rate(link.configured_bytes_per_second * 8.0)
        );
    } else {
        figures += " (no measurement yet)";
    }
    let rate = human_rate(link.rate_bytes_per_second * 8.0);
    let limit = match link.limit {
        RateLimit::Capacity => format!("the sync gets the link's {rate}"),
        RateLimit::Streams => {
            let per_stream =
                cost::mathis_bytes_per_second(link.rtt_seconds, link.loss).unwrap_or(0.0) * 8.0;
            format!(
                "loss limits each of {} streams to {} (Mathis), {rate} in all",
                model.input.streams_per_link,
                human_rate(per_stream)
            )
        }
        RateLimit::Budget => format!("paced at the job's link_budget, {rate}"),
    };
    let compressor = human_rate(model.input.zstd_bytes_per_second * 8.0);
    let zstd = if link.zstd {
        format!(
            "zstd on: the link ({rate}) is slower than compression ({compressor}) and the \
             expected ratio {:.2} cuts the wire to {:.3} bits per parameter",
            model.zstd_ratio, link.wire_bits
        )
    } else if model.zstd_ratio <= 1.0 {
        format!(
            "zstd off: the expected ratio {:.2} gains nothing on this data",
            model.zstd_ratio
        )
    } else {
        format!("zstd off: compression ({compressor}) is no faster than the link ({rate})")
    };
    format!("{figures}; {limit}; {zstd}")
}
