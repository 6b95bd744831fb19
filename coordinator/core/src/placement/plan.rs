//! The plan the placement engine emits. It serialises to JSON and back
//! unchanged, and it is compact: a 100k-GPU plan stores one slice list per
//! pipeline stage, from which every rank's GPU is enumerated on demand.

use serde::{Deserialize, Serialize};

use crate::sync::SyncPlan;

/// How replicas in different sites cooperate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CrossSiteMode {
    /// One synchronous job: pipeline stages may sit in different sites,
    /// each stage's data-parallel group stays in one site.
    Pipeline,
    /// Each participating site trains its own replicas; sites average their
    /// pseudo-gradients every `inner_steps` steps.
    Diloco { inner_steps: u32 },
    /// Synchronous data parallelism across sites: each participating site
    /// holds whole replicas (laid out as in DiLoCo), and every step
    /// all-reduces the whole gradient across the WAN. The exact algorithm,
    /// and no outer rounds.
    DataParallel,
}

impl CrossSiteMode {
    /// Whether each participating site holds whole replicas of its own
    /// (DiLoCo, cross-site data parallelism), rather than one pipeline
    /// spanning the sites.
    pub fn replicas_per_site(&self) -> bool {
        matches!(self, Self::Diloco { .. } | Self::DataParallel)
    }
}

/// Parallel degrees of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degrees {
    pub tensor_parallel: u32,
    pub pipeline_parallel: u32,
    /// Total replicas, across all sites.
    pub data_parallel: u32,
    /// Interleaved virtual stages per device (1 is plain 1F1B).
    pub virtual_stages: u32,
    /// Micro-batches per replica per step: global batch / (DP · micro-batch).
    pub micro_batches: u64,
    pub micro_batch_size: u32,
    /// Expert parallelism of a mixture-of-experts model: each group of
    /// this many consecutive replicas of a stage shares out its experts
    /// (1, and absent from JSON, for a dense model). It divides every
    /// group's replicas, so it never spans sites.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub expert_parallel: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Degrees {
    pub fn gpus(&self) -> u64 {
        u64::from(self.tensor_parallel)
            * u64::from(self.pipeline_parallel)
            * u64::from(self.data_parallel)
    }
}

/// A run of consecutive tensor-parallel slots in one domain group. Slot `k`
/// of the group is domain `k / slots_per_domain`, GPUs
/// `(k % slots_per_domain) · tp ..` within it, so a TP group never leaves a
/// domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub building: String,
    pub domain_group: String,
    pub first_slot: u64,
    pub tp_groups: u64,
    pub slots_per_domain: u64,
    pub gpus_per_node: u32,
}

/// One pipeline stage of a group of identical replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub first_layer: u32,
    pub layers: u32,
    pub site: String,
    /// Where the stage's TP groups sit, replica `r` of the group taking the
    /// r-th slot across the slices in order.
    pub slices: Vec<Slice>,
    pub memory_bytes_per_gpu: f64,
    pub memory_slack_bytes: f64,
}

/// Replicas that share one stage layout (in DiLoCo mode, one per site).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineGroup {
    pub first_replica: u32,
    pub replicas: u32,
    pub stages: Vec<Stage>,
    /// Predicted inner step time of this group alone.
    pub step_seconds: f64,
}

/// Predicted time of one (inner) step, in seconds. `total` is the sum of
/// the other fields.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StepBreakdown {
    pub compute: f64,
    pub tensor_parallel: f64,
    /// The expert-parallel all-to-all (zero, and absent from JSON, for a
    /// dense model).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expert_parallel: f64,
    pub exposed_pipeline: f64,
    pub bubble: f64,
    pub exposed_data_parallel: f64,
    /// One outer sync divided by the inner steps between syncs (cross-site
    /// data parallelism: the WAN all-reduce of every step).
    pub outer_sync_amortised: f64,
    pub total: f64,
}

/// Traffic one WAN bundle carries per (inner) step, both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WanTraffic {
    pub between: [String; 2],
    pub bytes_per_step: f64,
    pub what: String,
}

/// A decision and why it was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub decision: String,
    pub choice: String,
    pub reason: String,
}

/// The placement of one job on one topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub job: String,
    pub topology: String,
    pub mode: CrossSiteMode,
    pub degrees: Degrees,
    /// Megatron's rank order, fastest-varying first.
    pub parallel_order: String,
    /// Sites along the pipeline (pipeline mode) or around the outer-sync
    /// ring (DiLoCo).
    pub site_order: Vec<String>,
    pub groups: Vec<PipelineGroup>,
    pub step: StepBreakdown,
    /// The exposed part of one DiLoCo outer step's sync (the sync
    /// planner's exposed WAN time plus the reduce among each site's own
    /// replicas), not amortised; in cross-site data parallelism, the WAN
    /// all-reduce every step waits for; zero in pipeline mode.
    pub outer_sync_seconds: f64,
    pub wan: Vec<WanTraffic>,
    pub min_memory_slack_bytes: f64,
    pub reasons: Vec<Reason>,
    /// The sync planner's schedule placement costed the plan with (DiLoCo
    /// only; H in `mode` is its `inner_steps`), from the links as
    /// configured. Plans stored before the planner existed have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncPlan>,
}

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub rank: u64,
    pub site: String,
    pub building: String,
    pub domain_group: String,
    pub domain: u64,
    pub node: u64,
    pub gpu: u32,
}

impl Plan {
    pub fn gpus(&self) -> u64 {
        self.degrees.gpus()
    }

    /// The GPU of `rank` in "tp-pp-dp" order:
    /// rank = tp_rank + tp · (stage + pp · replica).
    pub fn binding(&self, rank: u64) -> Option<Binding> {
        let tp = u64::from(self.degrees.tensor_parallel);
        let pp = u64::from(self.degrees.pipeline_parallel);
        if tp == 0 || pp == 0 {
            // A plan read from outside may be malformed; it has no ranks.
            return None;
        }
        let tp_rank = rank % tp;
        let stage = usize::try_from((rank / tp) % pp).ok()?;
        let replica = rank / (tp * pp);
        let group = self.groups.iter().find(|g| {
            let first = u64::from(g.first_replica);
            (first..first + u64::from(g.replicas)).contains(&replica)
        })?;
        let stage_plan = group.stages.get(stage)?;
        let mut local = replica - u64::from(group.first_replica);
        for slice in &stage_plan.slices {
            if local < slice.tp_groups {
                let slot = slice.first_slot + local;
                let spd = slice.slots_per_domain.max(1);
                let gpu_in_domain = (slot % spd) * tp + tp_rank;
                let per_node = u64::from(slice.gpus_per_node.max(1));
                return Some(Binding {
                    rank,
                    site: stage_plan.site.clone(),
                    building: slice.building.clone(),
                    domain_group: slice.domain_group.clone(),
                    domain: slot / spd,
                    node: gpu_in_domain / per_node,
                    gpu: u32::try_from(gpu_in_domain % per_node).ok()?,
                });
            }
            local -= slice.tp_groups;
        }
        None
    }

    /// Every rank's binding, lazily.
    pub fn bindings(&self) -> impl Iterator<Item = Binding> + '_ {
        (0..self.gpus()).filter_map(|rank| self.binding(rank))
    }

    /// The reason recorded for `decision`, if any.
    pub fn reason(&self, decision: &str) -> Option<&Reason> {
        self.reasons.iter().find(|r| r.decision == decision)
    }
}
