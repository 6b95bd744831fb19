//! The sync planner: how the DiLoCo replica sites of one job synchronise.
//!
//! [`plan_sync`] takes a [`SyncInput`] — the replica sites of a DiLoCo plan,
//! the size of the pseudo-gradient, the predicted inner step, the WAN links
//! as configured and as measured, the codecs and the job's policy
//! ([`crate::job::Diloco`]) — and returns a [`SyncPlan`]: H, the fragments
//! and their staggered schedule, the overlap τ, the collective, the codec of
//! each link, the bytes on each link per outer step, the predicted exposed
//! time and compute utilisation, and the reduction against synchronous data
//! parallelism, each decision with its reason. It reads no clock, does no
//! I/O and draws no random numbers. [`SyncInput::from_plan`] builds the
//! input from a placement, its job and the state's link records;
//! [`brute_force_plan_sync`] enumerates the same space without the solver's
//! shortcuts, for small instances.
//!
//! # Model
//!
//! N parameters, M replica sites, inner step t seconds (the slowest site's,
//! as placement predicts it), H inner steps per outer step, P fragments,
//! overlap τ inner steps. Per WAN link l:
//!
//! - **Figures.** RTT and loss as measured when a measurement exists
//!   (`LinkMeasurement::rtt_ns` > 0), else as configured; one-way latency
//!   α_l = RTT / 2. Capacity: the measured throughput when one exists
//!   (`throughput_bps` > 0), else link rate × parallel links. The rate R_l
//!   the sync gets is the capacity, capped by the job's `link_budget` and,
//!   when loss limits each stream, by streams × Mathis
//!   ([`crate::cost::loss_limited_rate`]).
//! - **Codec.** Bits b per element: the job's `bits`, else the fewest the
//!   codecs offer (4-bit pseudo-gradients trained as well as bf16 in
//!   Streaming DiLoCo, and error feedback carries the residual). Bits on the
//!   wire before zstd: r = b + scale bits / block size. zstd with expected
//!   ratio z pays on a link when z > 1 and the compressor (C bytes/s) is
//!   faster than the link; compression is pipelined with sending, so a raw
//!   byte then takes σ_l = max(1/C, 1/(z·R_l)) seconds instead of 1/R_l, and
//!   the wire carries w_l = r / z bits per element (else w_l = r).
//! - **Fragments.** Fragment f of P holds parameters
//!   [⌊f·N/P⌋, ⌊(f+1)·N/P⌋) and starts its exchange at inner step
//!   ⌊f·H/P⌋ of each outer step (Streaming DiLoCo's staggered schedule); its
//!   result is applied τ inner steps later. P ≤ H and P·τ ≤ H, so a
//!   fragment's exchange ends before the next one starts and exchanges never
//!   share a link. Timing uses the largest fragment, F = ⌈N/P⌉·r/8 bytes.
//! - **Collective**, one fragment:
//!   reduce-scatter + all-gather over a full mesh (every site owns 1/M of
//!   the fragment; two phases, every pair exchanging F/M each way in each):
//!   T = 2 · max_l (α_l + σ_l·F/M);
//!   a ring in a given order (2(M−1) steps of F/M along each hop):
//!   T = 2 · max_hops [(M−1)·α + (M−1)/M · σ·F]
//!   ([`crate::cost::ring_reduce_scatter`] per hop). Either way every site
//!   sends 2(M−1)/M × the payload ([`bytes_sent_per_site`]).
//! - **Exposed time.** A fragment's exchange hides behind τ inner steps:
//!   X = max(0, T − τ·t) ([`exposed_seconds`]); per outer step E = P·X.
//! - **Utilisation.** U = H·t / (H·t + E), computed as 1 / (1 + E/(H·t))
//!   ([`compute_utilisation`]), which is monotone in H in floating point.
//! - **Bytes per outer step**, both directions: on each mesh link
//!   4·(N/M)·w_l/8; on each ring hop 2(M−1)/M · N·w_l/8.
//! - **Reduction** against synchronous data parallelism over the same sites
//!   and links, which sends N·b₀/8 bytes (b₀ = the training precision) the
//!   same way every inner step: H·b₀/w_l per link
//!   ([`reduction_vs_sync_dp`]), and for the plan H·b₀/w̄ with w̄ the mean
//!   wire bits over the links used (every link carries the same number of
//!   elements).
//!
//! # Choice
//!
//! Among the schedules the policy allows (H from `inner_steps` to
//! `max_inner_steps`, P from 1 to `max_fragments` or the job's `fragments`,
//! τ from 0 to `max_overlap_steps`), the planner takes, in this order:
//!
//! 1. one that meets the utilisation target; if none does, the highest
//!    predicted utilisation, at the largest H;
//! 2. the smallest H: the job's H is a training hyperparameter (its outer
//!    optimiser was tuned for it), so the planner raises it only as far as
//!    the WAN makes it;
//! 3. the smallest τ (least staleness);
//! 4. the fewest fragments (fewest rounds to coordinate);
//! 5. the fastest collective for that P, reduce-scatter + all-gather before
//!    rings, rings in lexicographic order of their sites.
//!
//! # Search
//!
//! For each P the collective is the one with the shortest fragment time;
//! for each τ the smallest H meeting the target is found by binary search
//! (U is monotone in H), or H = `max_inner_steps` when none does. Ring
//! orders are enumerated exactly up to 8 sites ((M−1)!/2 cycles), beyond
//! that from the given order and nearest-neighbour tours. The brute force
//! enumerates every H, P, τ and ring and ranks them by the same order.
//!
//! Deliberately absent: the reduce among a site's own replicas before the
//! WAN (it runs on the site's fabric, 10–100× faster, and placement costs
//! it), the coordination of each round through Raft, stragglers, and the
//! time to encode and decode (small against a WAN transfer).

mod input;
mod model;
mod plan;
mod replan;
mod search;
#[cfg(test)]
mod tests;

use thiserror::Error;

use crate::cost::CostParams;
use crate::job::JobSpec;
use crate::placement::Plan;
use crate::state::LinkRecord;

pub use input::{Codec, ShardHolders, SyncInput, ZSTD_BYTES_PER_SECOND_PER_CORE, configured_links};
pub use model::{bytes_sent_per_site, compute_utilisation, exposed_seconds, reduction_vs_sync_dp};
pub use plan::{CollectiveKind, CollectivePlan, FragmentSync, LinkPlan, SyncPlan, stagger};
pub use replan::{Replanned, needs_replan, replan_sync};

/// Why no sync plan can be made, naming the input field at fault.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SyncError {
    /// A field of the input is out of range, missing or inconsistent.
    #[error("`{field}`: {message}")]
    Invalid { field: String, message: String },
    /// The placement is not in DiLoCo mode, so nothing syncs across sites.
    #[error("job {job:?} is not placed in DiLoCo mode: only DiLoCo replicas sync across sites")]
    NotDiloco { job: String },
    /// The links do not connect the sites by a full mesh or a ring.
    #[error("no collective reaches every site: {0}")]
    NoCollective(String),
    /// The brute force refuses instances beyond its limits.
    #[error("too large for brute force: {0}")]
    TooLarge(String),
}

impl SyncError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Plans the sync of `input`: see the module's documentation for the model
/// and the order in which candidates are ranked.
pub fn plan_sync(input: &SyncInput) -> Result<SyncPlan, SyncError> {
    let model = model::Model::new(input)?;
    let search = search::Search::new(&model)?;
    let choice = search.solve()?;
    Ok(plan::assemble(&model, &search, &choice))
}

/// Synchronous data parallelism on a DiLoCo plan's layout: the same
/// replicas exchanging the whole gradient every step
/// ([`SyncInput::sync_dp`]). Its exposed time is what every step waits for.
pub fn plan_sync_dp(
    plan: &Plan,
    job: &JobSpec,
    links: &[LinkRecord],
    params: &CostParams,
) -> Result<SyncPlan, SyncError> {
    plan_sync(&SyncInput::from_plan(plan, job, links, params)?.sync_dp())
}

/// Plans the sync of a small instance by enumerating every H, P, τ and
/// collective (every ring order), ranked as [`plan_sync`] ranks them.
/// Refuses more than 5 sites, an H range wider than 400, more than 32
/// fragments or an overlap above 8.
pub fn brute_force_plan_sync(input: &SyncInput) -> Result<SyncPlan, SyncError> {
    let model = model::Model::new(input)?;
    let search = search::Search::new(&model)?;
    let choice = search::brute_force(&model)?;
    Ok(plan::assemble(&model, &search, &choice))
}

/// The sync schedule of a placed DiLoCo job: the one placement costed the
/// plan with ([`Plan::sync`]), or, for a plan stored before placement ran
/// the planner, the planner's answer for it from `links` now.
pub fn schedule_of(
    plan: &Plan,
    job: &JobSpec,
    links: &[LinkRecord],
    params: &CostParams,
) -> Result<SyncPlan, SyncError> {
    match &plan.sync {
        Some(sync) => Ok(sync.clone()),
        None => plan_sync(&SyncInput::from_plan(plan, job, links, params)?),
    }
}
