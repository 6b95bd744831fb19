//! The cost model the placement engine optimises: compute time from FLOPs,
//! α–β communication per link class, ring and hierarchical all-reduce, the
//! 1F1B pipeline (plain and interleaved) and per-GPU memory.
//!
//! Everything is a closed form in seconds and bytes, so tests can assert it
//! exactly. The embedding and the untied LM head (`vocabulary_size` ×
//! hidden parameters each) sit on the first and last pipeline stage
//! ([`end_stage_bytes`], [`head_training_flops`]); the layers share the
//! rest evenly. The assumptions are written next to each formula; the placement
//! solver, the brute-force placer and the plan checker all call these same
//! functions, which is what makes "solver == brute force" meaningful.
//!
//! A mixture-of-experts model computes with its active parameters, holds
//! all of them with the experts split over the expert-parallel group, and
//! pays an all-to-all per layer ([`expert_all_to_all_seconds_per_layer`]).
//!
//! Deliberately conservative or absent: the data-parallel all-reduce is not
//! overlapped with the backward pass; every pipeline stage is paced by the
//! slowest one; no activation recomputation; the TP communication of the
//! LM head is not counted; DiLoCo
//! pseudo-gradients travel at the training precision, uncompressed and not
//! streamed (the sync planner, [`crate::sync`], refines that); NVLink, fabric and campus
//! latencies are single α values from [`CostParams`].

use serde::{Deserialize, Serialize};

use crate::job::JobSpec;
use crate::topology::WanLink;

/// Tunable assumptions of the cost model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostParams {
    /// Model FLOPs utilisation: the fraction of dense bf16 peak that a
    /// transformer layer achieves.
    pub mfu: f64,
    /// Fraction of HBM kept free for the allocator, fragmentation, NCCL
    /// buffers and the framework.
    pub hbm_headroom: f64,
    /// Latency (α) of one scale-up (NVLink) message.
    pub scale_up_latency_seconds: f64,
    /// Latency (α) of one message across a building fabric.
    pub fabric_latency_seconds: f64,
    /// Latency (α) of one message between buildings of a campus.
    pub campus_latency_seconds: f64,
    /// TCP/QUIC streams each GPU opens on a WAN transfer. Few streams on a
    /// lossy long link are limited by Mathis, not by the link rate.
    pub wan_streams_per_gpu: u32,
    /// Inner steps between DiLoCo outer syncs when the job sets none.
    pub default_inner_steps: u32,
    /// Largest interleaving degree (virtual stages per device) to consider.
    pub max_virtual_stages: u32,
    /// Extra state per parameter that DiLoCo keeps (fp32 anchor weights and
    /// outer momentum), sharded like the optimizer state.
    pub diloco_state_bytes_per_parameter: f64,
}

impl Default for CostParams {
    fn default() -> Self {
        Self {
            mfu: 0.4,
            hbm_headroom: 0.1,
            scale_up_latency_seconds: 2e-6,
            fabric_latency_seconds: 5e-6,
            campus_latency_seconds: 20e-6,
            wan_streams_per_gpu: 4,
            default_inner_steps: 100,
            max_virtual_stages: 2,
            diloco_state_bytes_per_parameter: 8.0,
        }
    }
}

/// One link class in the α–β model: a message of `S` bytes takes
/// `latency + S / bytes_per_second`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub latency_seconds: f64,
    pub bytes_per_second: f64,
}

impl Link {
    /// A link with no latency and infinite bandwidth: every collective on it
    /// costs zero, which is how the closed-form tests isolate one term.
    pub const FREE: Link = Link {
        latency_seconds: 0.0,
        bytes_per_second: f64::INFINITY,
    };

    pub fn new(latency_seconds: f64, bytes_per_second: f64) -> Self {
        Self {
            latency_seconds,
            bytes_per_second,
        }
    }

    /// Serialisation time of `bytes` (zero on an infinite link).
    pub fn serialisation(&self, bytes: f64) -> f64 {
        if bytes == 0.0 {
            0.0
        } else {
            bytes / self.bytes_per_second
        }
    }

    /// Point-to-point transfer time: α + S/B.
    pub fn transfer(&self, bytes: f64) -> f64 {
        self.latency_seconds + self.serialisation(bytes)
    }
}

/// Ring all-reduce of `bytes` among `n` participants:
/// t = 2(n−1)α + 2(n−1)/n · S/B. Zero for a single participant.
pub fn ring_all_reduce(n: u64, bytes: f64, link: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    // Evaluated in the order the closed form is written, so tests can
    // compare it bit for bit.
    let steps = 2.0 * (n - 1) as f64;
    steps * link.latency_seconds + steps / n as f64 * bytes / link.bytes_per_second
}

/// Ring reduce-scatter (or all-gather) of `bytes` among `n`:
/// t = (n−1)α + (n−1)/n · S/B, half an all-reduce.
pub fn ring_reduce_scatter(n: u64, bytes: f64, link: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = (n - 1) as f64;
    steps * link.latency_seconds + steps / n as f64 * bytes / link.bytes_per_second
}

/// Hierarchical all-reduce: a local reduce-scatter among `local` peers, a
/// cross-group all-reduce of S/local among `groups`, a local all-gather.
pub fn hierarchical_all_reduce(
    bytes: f64,
    local: u64,
    local_link: Link,
    groups: u64,
    cross_link: Link,
) -> f64 {
    let local = local.max(1);
    2.0 * ring_reduce_scatter(local, bytes, local_link)
        + ring_all_reduce(groups, bytes / local as f64, cross_link)
}

/// Mathis et al.: a loss-limited stream achieves about MSS/RTT · 1.22/√p,
/// in bytes per second. `None` when the bound does not apply (no loss).
pub fn mathis_bytes_per_second(rtt_seconds: f64, loss: f64) -> Option<f64> {
    const MSS_BYTES: f64 = 1460.0;
    (loss > 0.0 && rtt_seconds > 0.0).then(|| MSS_BYTES / rtt_seconds * 1.22 / loss.sqrt())
}

/// The α–β view of a WAN bundle for one of `sharers` concurrent flows that
/// each open `streams` streams: α is the one-way propagation plus overhead;
/// β is the flow's fair share of the bundle, capped by what its streams can
/// carry when loss limits each one (Mathis).
pub fn wan_link(link: &WanLink, streams: u64, sharers: u64) -> Link {
    let aggregate = link.link_rate.bytes_per_second() * f64::from(link.parallel_links);
    let share = aggregate / sharers.max(1) as f64;
    let rate = loss_limited_rate(share, link.rtt_seconds(), link.loss, streams);
    Link::new(link.one_way_seconds(), rate)
}

/// What `streams` streams can carry of `bytes_per_second` at this RTT and
/// loss: the rate itself, capped by `streams` × Mathis when loss limits
/// each stream. The sync planner applies it to measured figures too.
pub fn loss_limited_rate(bytes_per_second: f64, rtt_seconds: f64, loss: f64, streams: u64) -> f64 {
    match mathis_bytes_per_second(rtt_seconds, loss) {
        Some(per_stream) => bytes_per_second.min(per_stream * streams.max(1) as f64),
        None => bytes_per_second,
    }
}

/// Training FLOPs of one transformer layer for one micro-batch, forward and
/// backward: 6 · (P/L) · b·s for the matrix multiplies (the declared
/// parameter count spread evenly over the layers, so GQA and wide MLPs are
/// honoured and embeddings are amortised) plus 12 · b·s²·h for attention
/// scores and values (forward 4bs²h, backward twice that). No recomputation.
/// A mixture-of-experts model's matrix multiplies count only the
/// parameters a token uses ([`active_layer_parameters`]).
pub fn layer_training_flops(job: &JobSpec) -> f64 {
    let m = &job.model;
    let tokens = f64::from(job.batch.micro_batch) * f64::from(m.sequence_length);
    6.0 * active_layer_parameters(job) * tokens
        + 12.0 * tokens * f64::from(m.sequence_length) * f64::from(m.hidden_size)
}

/// Bytes of one activation tensor b·s·h (what crosses a pipeline boundary
/// per micro-batch, and what a TP all-reduce moves).
pub fn activation_message_bytes(job: &JobSpec) -> f64 {
    f64::from(job.batch.micro_batch)
        * f64::from(job.model.sequence_length)
        * f64::from(job.model.hidden_size)
        * f64::from(job.training.precision.bytes())
}

/// Activations one GPU keeps per layer and in-flight micro-batch, with
/// tensor and sequence parallelism and flash attention (Korthikanti et al.
/// 2022: s·b·h·34/t bytes at 16 bits; the 5as/h score term is gone with
/// flash attention). Scaled by the element size.
///
/// Of the 34, 19 are the MLP's (a 4h-wide one). In a mixture-of-experts
/// layer that share scales with the MLP width a token passes through (its
/// active MLP parameters over a 4h MLP's 8h²), and each token's input is
/// kept once more for each of its top_k routed copies (2·k).
pub fn activation_bytes_per_layer(job: &JobSpec, tp: u32) -> f64 {
    let units = match &job.model.moe {
        None => 34.0,
        Some(moe) => {
            let m = &job.model;
            let h = f64::from(m.hidden_size);
            let heads = f64::from(m.attention_heads.max(1));
            let attention = 2.0 * h * h + 2.0 * h * h * f64::from(m.kv_heads()) / heads;
            let width = (active_layer_parameters(job) - attention).max(0.0) / (8.0 * h * h);
            15.0 + 19.0 * width + 2.0 * f64::from(moe.top_k)
        }
    };
    activation_message_bytes(job) / 2.0 * units / f64::from(tp.max(1))
}

/// Expert-parallel all-to-all per layer and micro-batch: the dispatch and
/// the combine, forward and backward (four), each moving the top_k routed
/// copies of the tp-th share of the micro-batch's tokens that a GPU holds
/// among the `ep` GPUs of its expert-parallel group, exposed like the TP
/// collectives, with perfectly balanced routing (no capacity overflow).
/// Zero for a dense model or ep = 1.
pub fn expert_all_to_all_seconds_per_layer(job: &JobSpec, tp: u32, ep: u32, link: Link) -> f64 {
    let Some(moe) = &job.model.moe else {
        return 0.0;
    };
    let bytes = f64::from(moe.top_k) * activation_message_bytes(job) / f64::from(tp.max(1));
    4.0 * all_to_all(u64::from(ep), bytes, link)
}

/// All-to-all among `n` peers, each sending `bytes` spread evenly over
/// them: t = (n−1)α + (n−1)/n · S/B (the 1/n it keeps does not move).
pub fn all_to_all(n: u64, bytes: f64, link: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = (n - 1) as f64;
    steps * link.latency_seconds + steps / n as f64 * bytes / link.bytes_per_second
}

/// Tensor-parallel communication per layer and micro-batch: four
/// all-reduces of b·s·h (two forward, two backward), exposed, on the
/// scale-up link. Zero for t = 1.
pub fn tp_seconds_per_layer(job: &JobSpec, tp: u32, scale_up: Link) -> f64 {
    4.0 * ring_all_reduce(u64::from(tp), activation_message_bytes(job), scale_up)
}

/// Micro-batch chunks whose activations stage `stage` of `p` holds at peak.
/// 1F1B: min(m, p − stage). Interleaved with v chunks per device (Megatron's
/// warm-up): min(m·v, 2(p − stage − 1) + (v − 1)p + 1); each chunk is 1/v of
/// the stage's layers.
pub fn in_flight_chunks(stage: u32, p: u32, m: u64, v: u32) -> u64 {
    let (stage, p, v) = (u64::from(stage), u64::from(p), u64::from(v.max(1)));
    if v == 1 {
        m.min(p.saturating_sub(stage))
    } else {
        (m * v).min(2 * p.saturating_sub(stage + 1) + (v - 1) * p + 1)
    }
}

/// Bytes of model state one GPU holds per layer: bf16 (or the job's
/// precision) weights and gradients split by tensor parallelism, and the
/// optimizer (plus DiLoCo) state additionally sharded across the stage's
/// data-parallel group (ZeRO-1 / distributed optimizer).
///
/// A mixture-of-experts layer's experts are also split `ep` ways (expert
/// parallelism over the stage's replicas); their optimizer state is
/// sharded over the dp_shard / ep replicas that hold the same experts,
/// which leaves it at the same bytes per GPU as a dense parameter's.
pub fn state_bytes_per_layer(
    job: &JobSpec,
    tp: u32,
    ep: u32,
    dp_shard: u64,
    extra_per_param: f64,
) -> f64 {
    let experts = expert_layer_parameters(job);
    let element = f64::from(job.training.precision.bytes());
    state_bytes(job, layer_parameters(job), tp, dp_shard, extra_per_param)
        - experts / f64::from(tp.max(1)) * 2.0 * element * (1.0 - 1.0 / f64::from(ep.max(1)))
}

/// Weights, gradients and optimizer state of `parameters` parameters on
/// one GPU: split over tp, the optimizer state (and `extra_per_param`)
/// sharded dp_shard ways.
fn state_bytes(
    job: &JobSpec,
    parameters: f64,
    tp: u32,
    dp_shard: u64,
    extra_per_param: f64,
) -> f64 {
    let element = f64::from(job.training.precision.bytes());
    let sharded = job.training.optimizer_state_bytes_per_parameter + extra_per_param;
    parameters / f64::from(tp.max(1)) * (2.0 * element + sharded / dp_shard.max(1) as f64)
}

/// Parameters of the token embedding, and as many again of the untied LM
/// head: vocabulary × hidden. Zero without `vocabulary_size`, and zero when
/// the two would hold half the model's parameters or more (such a count
/// cannot include them; it is then read as the layers' alone).
pub fn embedding_parameters(job: &JobSpec) -> f64 {
    let m = &job.model;
    let embedding = f64::from(m.vocabulary_size.unwrap_or(0)) * f64::from(m.hidden_size);
    if 2.0 * embedding < 0.5 * m.parameters as f64 {
        embedding
    } else {
        0.0
    }
}

/// Parameters of one transformer layer: what the embedding and the LM head
/// leave, over the layers.
pub fn layer_parameters(job: &JobSpec) -> f64 {
    let m = &job.model;
    (m.parameters as f64 - 2.0 * embedding_parameters(job)) / f64::from(m.layers.max(1))
}

/// Parameters of one layer a token uses: all of them in a dense model; in
/// a mixture-of-experts one what `active_parameters` leaves after the
/// embedding and the LM head, over the layers (never more than the layer
/// holds).
pub fn active_layer_parameters(job: &JobSpec) -> f64 {
    let m = &job.model;
    match &m.moe {
        None => layer_parameters(job),
        Some(moe) => ((moe.active_parameters as f64 - 2.0 * embedding_parameters(job))
            / f64::from(m.layers.max(1)))
        .clamp(0.0, layer_parameters(job)),
    }
}

/// Parameters of one layer's routed experts (zero in a dense model): with
/// X of them and D dense, D + X is the layer and D + X·k/E what a token
/// uses, so X = (layer − active) · E / (E − k), at most the layer.
pub fn expert_layer_parameters(job: &JobSpec) -> f64 {
    let Some(moe) = &job.model.moe else {
        return 0.0;
    };
    let (e, k) = (f64::from(moe.experts), f64::from(moe.top_k));
    if e <= k {
        return 0.0;
    }
    let layer = layer_parameters(job);
    ((layer - active_layer_parameters(job)) * e / (e - k)).clamp(0.0, layer)
}

/// Training FLOPs of the LM head per micro-batch (forward and backward:
/// 6 per parameter and token). The embedding lookup costs next to none.
pub fn head_training_flops(job: &JobSpec) -> f64 {
    let tokens = f64::from(job.batch.micro_batch) * f64::from(job.model.sequence_length);
    6.0 * embedding_parameters(job) * tokens
}

/// Bytes per GPU the end stages hold beyond their layers, split over tp
/// (vocabulary-parallel, as Megatron-LM does): the first stage the
/// embedding's state, the last the LM head's state and one micro-batch of
/// fp32 logits. A stage that is both holds both.
pub fn end_stage_bytes(
    job: &JobSpec,
    tp: u32,
    dp_shard: u64,
    extra_per_param: f64,
    (first, last): (bool, bool),
) -> f64 {
    let embedding = embedding_parameters(job);
    if embedding == 0.0 {
        return 0.0;
    }
    let state = state_bytes(job, embedding, tp, dp_shard, extra_per_param);
    let m = &job.model;
    let logits = f64::from(job.batch.micro_batch)
        * f64::from(m.sequence_length)
        * f64::from(m.vocabulary_size.unwrap_or(0))
        * 4.0
        / f64::from(tp.max(1));
    f64::from(u8::from(first)) * state + f64::from(u8::from(last)) * (state + logits)
}

/// The cost of one pipeline boundary for one micro-batch in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Boundary {
    /// α + S/B: what the first forward and last backward wait for.
    pub latency_seconds: f64,
    /// S/B: how long the boundary is busy per micro-batch and direction.
    pub serialisation_seconds: f64,
}

/// A pipeline's predicted time, split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PipelineTime {
    /// m · t_max: every micro-batch through the slowest stage.
    pub ideal: f64,
    /// (p−1)/v · t_max: fill and drain. Bubble fraction = (p−1)/(v·m).
    pub bubble: f64,
    /// Pipeline communication not hidden behind compute.
    pub exposed_p2p: f64,
    pub total: f64,
}

/// 1F1B pipeline time for stages whose forward+backward time per
/// micro-batch is `stage_seconds`, with `m` micro-batches and `v` virtual
/// stages per device. Every stage is paced by the slowest one (t_max); the
/// first micro-batch crosses each boundary v times each way (latency
/// exposed), and a boundary slower than t_max throttles the steady state.
pub fn pipeline_time(
    stage_seconds: &[f64],
    m: u64,
    v: u32,
    boundaries: &[Boundary],
) -> PipelineTime {
    let p = stage_seconds.len().max(1) as f64;
    let v = f64::from(v.max(1));
    let t_max = stage_seconds.iter().copied().fold(0.0, f64::max);
    let ideal = m as f64 * t_max;
    let bubble = (p - 1.0) / v * t_max;
    let latency: f64 = boundaries.iter().map(|b| b.latency_seconds).sum();
    let slowest_link = boundaries
        .iter()
        .map(|b| b.serialisation_seconds)
        .fold(0.0, f64::max);
    let throttle = (v * slowest_link - t_max).max(0.0) * m.saturating_sub(1) as f64;
    let exposed_p2p = 2.0 * v * latency + throttle;
    PipelineTime {
        ideal,
        bubble,
        exposed_p2p,
        total: ideal + bubble + exposed_p2p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_all_reduce_matches_closed_form() {
        let link = Link::new(1e-6, 1e9);
        for n in [2u64, 3, 4, 8, 72] {
            let s = 1e8;
            let expected = 2.0 * (n - 1) as f64 * 1e-6 + 2.0 * (n - 1) as f64 / n as f64 * s / 1e9;
            assert_eq!(ring_all_reduce(n, s, link), expected);
        }
        assert_eq!(ring_all_reduce(1, 1e9, link), 0.0);
        assert_eq!(ring_all_reduce(64, 1e9, Link::FREE), 0.0);
        // Bandwidth term only: 2(n−1)/n · S/B with n = 4, S = 8, B = 2 → 6.
        assert_eq!(ring_all_reduce(4, 8.0, Link::new(0.0, 2.0)), 6.0);
        // Latency term only: 2(n−1)α with n = 5, α = 0.5 → 4.
        assert_eq!(ring_all_reduce(5, 8.0, Link::new(0.5, f64::INFINITY)), 4.0);
    }

    #[test]
    fn hierarchical_all_reduce_is_local_reduce_scatter_cross_all_reduce_local_all_gather() {
        let local = Link::new(0.0, 4.0);
        let cross = Link::new(0.0, 1.0);
        // local RS: 3/4·16/4 = 3; cross AR of 16/4 = 4 bytes among 2: 2·1/2·4 = 4; AG = 3.
        assert_eq!(hierarchical_all_reduce(16.0, 4, local, 2, cross), 10.0);
    }

    #[test]
    fn bubble_fraction_is_p_minus_one_over_m() {
        for (p, m) in [(4usize, 8u64), (8, 32), (2, 1), (16, 64)] {
            let time = pipeline_time(
                &vec![1.0; p],
                m,
                1,
                &vec![
                    Boundary {
                        latency_seconds: 0.0,
                        serialisation_seconds: 0.0
                    };
                    p - 1
                ],
            );
            assert_eq!(time.bubble / time.ideal, (p as f64 - 1.0) / m as f64);
            assert_eq!(time.total, m as f64 + p as f64 - 1.0);
            assert_eq!(time.exposed_p2p, 0.0);
        }
    }

    #[test]
    fn interleaved_bubble_fraction_is_p_minus_one_over_v_m() {
        for (p, m, v) in [(4usize, 8u64, 2u32), (8, 16, 4), (2, 4, 2)] {
            let time = pipeline_time(&vec![1.0; p], m, v, &[]);
            assert_eq!(
                time.bubble / time.ideal,
                (p as f64 - 1.0) / (f64::from(v) * m as f64)
            );
        }
    }

    #[test]
    fn a_slow_boundary_throttles_the_steady_state() {
        let slow = Boundary {
            latency_seconds: 3.0,
            serialisation_seconds: 2.0,
        };
        let time = pipeline_time(&[1.0, 1.0], 5, 1, &[slow]);
        // 2·3 latency once each way, then 4 · (2 − 1) throttle.
        assert_eq!(time.exposed_p2p, 6.0 + 4.0);
    }

    #[test]
    fn mathis_limits_a_lossy_long_link() {
        let rtt = 0.0664;
        let per_stream = mathis_bytes_per_second(rtt, 1e-4).unwrap();
        assert!((per_stream - 1460.0 / rtt * 122.0).abs() < 1e-6);
        assert_eq!(mathis_bytes_per_second(rtt, 0.0), None);
    }

    #[test]
    fn in_flight_chunks_follow_1f1b_and_interleaved_warm_up() {
        assert_eq!(in_flight_chunks(0, 4, 8, 1), 4);
        assert_eq!(in_flight_chunks(3, 4, 8, 1), 1);
        assert_eq!(in_flight_chunks(0, 4, 2, 1), 2);
        // Megatron interleaved warm-up of device 0: 2·3 + 1·4 + 1 = 11 chunks.
        assert_eq!(in_flight_chunks(0, 4, 8, 2), 11);
    }
}
