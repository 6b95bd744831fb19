//! What the sync planner plans from, and how to build it from a placement.

use serde::{Deserialize, Serialize};

use super::SyncError;
use crate::cost::CostParams;
use crate::job::{Diloco, JobSpec};
use crate::placement::{CrossSiteMode, Plan};
use crate::state::LinkRecord;
use crate::topology::Topology;

/// zstd level 1 compresses about 0.5 GB/s on one core (`DATA-PATH.md`).
pub const ZSTD_BYTES_PER_SECOND_PER_CORE: f64 = 0.5e9;

/// Everything the planner needs. Build it with [`SyncInput::from_plan`], or
/// by hand for a what-if.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncInput {
    /// Elements of the pseudo-gradient: the model's parameters.
    pub parameters: u64,
    /// Predicted inner step of the slowest replica site, seconds.
    pub inner_step_seconds: f64,
    /// Bits per element synchronous data parallelism would send (the
    /// training precision): the baseline of `reduction_vs_sync_dp`.
    pub sync_dp_bits: u32,
    /// The replica sites, in the placement's ring order.
    pub sites: Vec<String>,
    /// WAN links between replica sites: configured, and measured when the
    /// agents' probes have reported.
    pub links: Vec<LinkRecord>,
    /// Streams the sync opens on each link: every shard holder of a site
    /// opens its own, and loss caps each one (Mathis).
    pub streams_per_link: u64,
    /// The codecs available, at most one per bit width.
    pub codecs: Vec<Codec>,
    /// How fast one site can zstd-compress the traffic of one link, bytes
    /// per second.
    pub zstd_bytes_per_second: f64,
    /// The job's DiLoCo settings: H and the planner's policy.
    pub policy: Diloco,
}

/// One way to encode a pseudo-gradient for the WAN.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Codec {
    /// Bits per element: 16 (bf16), 8 or 4.
    pub bits: u32,
    /// Elements sharing one scale; 0 when there are no scales (bf16).
    pub block_size: u32,
    /// Bits of each block's scale.
    pub scale_bits: u32,
    /// The compression ratio zstd is expected to reach on this codec's
    /// output (1.0: nothing gained).
    pub zstd_ratio: f64,
}

impl Codec {
    /// Bits each element takes on the wire before zstd, scales included.
    pub fn bits_per_parameter(&self) -> f64 {
        if self.block_size == 0 {
            f64::from(self.bits)
        } else {
            f64::from(self.bits) + f64::from(self.scale_bits) / f64::from(self.block_size)
        }
    }

    /// The built-in codecs: bf16 as is; 8-bit absmax in blocks of 256 and
    /// 4-bit in blocks of 64, each block with a 16-bit scale. zstd is
    /// expected to gain nothing (a quick test measured 1.11 on int8 and
    /// 1.33 on int4; a job that has measured its data says so with
    /// `zstd_ratio`).
    pub fn standard() -> Vec<Codec> {
        vec![
            Codec {
                bits: 16,
                block_size: 0,
                scale_bits: 0,
                zstd_ratio: 1.0,
            },
            Codec {
                bits: 8,
                block_size: 256,
                scale_bits: 16,
                zstd_ratio: 1.0,
            },
            Codec {
                bits: 4,
                block_size: 64,
                scale_bits: 16,
                zstd_ratio: 1.0,
            },
        ]
    }
}

/// The links of `topology` as configured, none measured: the input of a
/// what-if without a coordinator.
pub fn configured_links(topology: &Topology) -> Vec<LinkRecord> {
    topology
        .links
        .iter()
        .map(|link| LinkRecord {
            configured: link.clone(),
            measured: None,
        })
        .collect()
}

impl SyncInput {
    /// The input for a placed DiLoCo job: its replica sites in the plan's
    /// ring order, the slowest site's inner step, the links among those
    /// sites from `links` (the state's records, measured figures included;
    /// others are ignored), streams and compression cores from the shard
    /// holders (TP × PP × the fewest replicas at any site, as placement
    /// costs the outer sync), the standard codecs and the job's
    /// `[diloco]` settings (H = `params.default_inner_steps` when it has
    /// none).
    pub fn from_plan(
        plan: &Plan,
        job: &JobSpec,
        links: &[LinkRecord],
        params: &CostParams,
    ) -> Result<Self, SyncError> {
        if !matches!(plan.mode, CrossSiteMode::Diloco { .. }) {
            return Err(SyncError::NotDiloco {
                job: plan.job.clone(),
            });
        }
        let inner_step_seconds = plan
            .groups
            .iter()
            .map(|g| g.step_seconds)
            .fold(0.0, f64::max);
        let fewest_replicas = plan
            .groups
            .iter()
            .map(|g| u64::from(g.replicas))
            .min()
            .unwrap_or(1);
        Ok(Self::for_replicas(
            job,
            params,
            plan.site_order.clone(),
            links,
            inner_step_seconds,
            ShardHolders {
                tensor_parallel: plan.degrees.tensor_parallel,
                pipeline_parallel: plan.degrees.pipeline_parallel,
                fewest_replicas,
            },
        ))
    }

    /// The input for DiLoCo replicas of `job` at `sites` (in ring order)
    /// whose slowest inner step is `inner_step_seconds`: the links among
    /// those sites from `links` (others are ignored), streams and
    /// compression cores from the shard holders, the standard codecs and
    /// the job's `[diloco]` settings (H = `params.default_inner_steps` when
    /// it has none). Placement costs each of its DiLoCo candidates with it;
    /// [`SyncInput::from_plan`] builds it from the plan placement chose.
    pub fn for_replicas(
        job: &JobSpec,
        params: &CostParams,
        sites: Vec<String>,
        links: &[LinkRecord],
        inner_step_seconds: f64,
        holders: ShardHolders,
    ) -> Self {
        let shard_holders = holders.count();
        let joins = |link: &LinkRecord| {
            link.configured
                .between
                .iter()
                .all(|end| sites.iter().any(|s| s == end))
        };
        Self {
            parameters: job.model.parameters,
            inner_step_seconds,
            sync_dp_bits: job.training.precision.bytes() * 8,
            links: links.iter().filter(|l| joins(l)).cloned().collect(),
            sites,
            streams_per_link: shard_holders * u64::from(params.wan_streams_per_gpu.max(1)),
            codecs: Codec::standard(),
            zstd_bytes_per_second: shard_holders as f64 * ZSTD_BYTES_PER_SECOND_PER_CORE,
            policy: job
                .diloco
                .clone()
                .unwrap_or_else(|| Diloco::new(params.default_inner_steps)),
        }
    }
}

impl SyncInput {
    /// The same replicas in synchronous data parallelism: the whole
    /// gradient exchanged every step at the training precision, i.e. the
    /// planner held to H = 1, one fragment, τ = 0 and no quantisation, on
    /// the same collective and loss-limited rates DiLoCo's sync is costed
    /// with, and the job's link budget. Placement costs cross-site data
    /// parallelism with it.
    pub fn sync_dp(mut self) -> Self {
        let bits = self.sync_dp_bits;
        self.codecs = vec![Codec {
            bits,
            block_size: 0,
            scale_bits: 0,
            zstd_ratio: 1.0,
        }];
        self.policy = Diloco {
            max_inner_steps: Some(1),
            fragments: Some(1),
            max_overlap_steps: Some(0),
            // The one codec: a fixed width would have to be 16, 8 or 4.
            bits: None,
            error_feedback: Some(false),
            link_budget: self.policy.link_budget,
            ..Diloco::new(1)
        };
        self
    }
}

/// Who exchanges a site's pseudo-gradient over the WAN: every GPU of one
/// replica holds a shard (TP × PP of them) and each replica of the site
/// holds a copy, so the shards of the site with the fewest replicas open
/// the fewest streams and compress on the fewest cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHolders {
    pub tensor_parallel: u32,
    pub pipeline_parallel: u32,
    /// Replicas at the site that has the fewest.
    pub fewest_replicas: u64,
}

impl ShardHolders {
    /// TP × PP × the fewest replicas, at least 1.
    pub fn count(&self) -> u64 {
        u64::from(self.tensor_parallel.max(1))
            * u64::from(self.pipeline_parallel.max(1))
            * self.fewest_replicas.max(1)
    }
}
