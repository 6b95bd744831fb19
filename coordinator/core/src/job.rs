//! The job model: what is trained, with which batch, and under which
//! constraints.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::config::{self, ConfigError, FieldPath, Validate, Violation, check_id};
use crate::topology::Topology;
use crate::units::DataRate;

mod moe;

pub use moe::MoeShape;

/// A training job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub model: ModelShape,
    pub batch: Batch,
    #[serde(default)]
    pub training: Training,
    #[serde(default, skip_serializing_if = "Constraints::is_empty")]
    pub constraints: Constraints,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diloco: Option<Diloco>,
    /// What placement optimises; the fastest step when absent.
    #[serde(default, skip_serializing_if = "Objective::is_default")]
    pub objective: Objective,
}

/// What placement optimises among the feasible plans (`[objective]`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Objective {
    #[serde(default)]
    pub goal: Goal,
    /// Plans using more GPUs are not considered, whatever the goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u64>,
    /// With `goal = "fewest-gpus"`: how much slower than the fastest plan
    /// the step may be, as a fraction ([`DEFAULT_WITHIN`] when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<f64>,
}

/// The slowdown `goal = "fewest-gpus"` accepts when `within` is unset.
pub const DEFAULT_WITHIN: f64 = 0.05;

impl Objective {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// `within`, or its default.
    pub fn within(&self) -> f64 {
        self.within.unwrap_or(DEFAULT_WITHIN)
    }

    /// The objective in words, as plans state it.
    pub fn describe(&self) -> String {
        let goal = match self.goal {
            Goal::StepTime => "fastest step".to_string(),
            Goal::ThroughputPerGpu => "most tokens/s per GPU".to_string(),
            Goal::FewestGpus => format!(
                "fewest GPUs within {} % of the fastest step",
                100.0 * self.within()
            ),
        };
        match self.max_gpus {
            Some(max) => format!("{goal}, at most {max} GPUs"),
            None => goal,
        }
    }

    fn problems(&self, path: &FieldPath, out: &mut Vec<Violation>) {
        if let Some(max) = self.max_gpus
            && !(1..=crate::limits::MAX_GPUS).contains(&max)
        {
            out.push(Violation::new(
                path.key("max_gpus"),
                format!(
                    "must be between 1 and {}, found {max}",
                    crate::limits::MAX_GPUS
                ),
            ));
        }
        if let Some(within) = self.within {
            if self.goal != Goal::FewestGpus {
                out.push(Violation::new(
                    path.key("within"),
                    "applies only with goal = \"fewest-gpus\"",
                ));
            } else if !(within > 0.0 && within <= 10.0) {
                out.push(Violation::new(
                    path.key("within"),
                    format!("must be a fraction in (0, 10], found {within}"),
                ));
            }
        }
    }
}

/// The measure placement minimises or maximises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    /// The shortest predicted step (ties: fewer GPUs).
    #[default]
    StepTime,
    /// The most tokens per second per GPU: the least step time × GPUs.
    ThroughputPerGpu,
    /// The fewest GPUs whose step is within `within` of the fastest plan's.
    FewestGpus,
}

impl Goal {
    /// The name used in job files and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StepTime => "step-time",
            Self::ThroughputPerGpu => "throughput-per-gpu",
            Self::FewestGpus => "fewest-gpus",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::StepTime, Self::ThroughputPerGpu, Self::FewestGpus]
            .into_iter()
            .find(|g| g.as_str() == name)
    }
}

/// The shape of a decoder-only transformer: dense, or with
/// mixture-of-experts MLPs (`[model.moe]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub parameters: u64,
    pub layers: u32,
    pub hidden_size: u32,
    pub attention_heads: u32,
    /// Key-value heads, for grouped-query attention (absent: one per
    /// attention head, as in multi-head attention). Tensor parallelism
    /// splits them too, so its degree must divide them, as Megatron-LM
    /// requires of its query groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    pub sequence_length: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary_size: Option<u32>,
    /// Mixture-of-experts MLPs; absent for a dense model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeShape>,
}

impl ModelShape {
    /// Key-value heads: `kv_heads`, or one per attention head.
    pub fn kv_heads(&self) -> u32 {
        self.kv_heads.unwrap_or(self.attention_heads)
    }

    /// Routed experts per layer (1 for a dense model).
    pub fn experts(&self) -> u32 {
        self.moe.as_ref().map_or(1, |m| m.experts)
    }
}

/// Batch sizes, in sequences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// Sequences per optimizer step, across all data-parallel replicas.
    pub global_batch: u32,
    /// Sequences per micro-batch on one pipeline.
    pub micro_batch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Bf16,
    Fp8,
    Fp32,
}

impl Precision {
    /// Bytes per weight, gradient and activation element.
    pub fn bytes(self) -> u32 {
        match self {
            Self::Fp8 => 1,
            Self::Bf16 => 2,
            Self::Fp32 => 4,
        }
    }
}

/// Numeric format and optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Training {
    #[serde(default = "default_precision")]
    pub precision: Precision,
    /// Optimizer state per parameter: 12 for Adam with fp32 master weights
    /// and two fp32 moments.
    #[serde(default = "default_optimizer_bytes")]
    pub optimizer_state_bytes_per_parameter: f64,
}

fn default_precision() -> Precision {
    Precision::Bf16
}

fn default_optimizer_bytes() -> f64 {
    12.0
}

impl Default for Training {
    fn default() -> Self {
        Self {
            precision: default_precision(),
            optimizer_state_bytes_per_parameter: default_optimizer_bytes(),
        }
    }
}

/// Optional limits on placement. Unset degrees are chosen by the planner.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_sites: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tensor_parallel: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_parallel: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<u32>,
    /// The expert-parallel degree of a mixture-of-experts model: how many
    /// of a stage's replicas share out its experts. Chosen by placement
    /// when unset; it must divide `experts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_parallel: Option<u32>,
    /// How replicas at different sites may cooperate; placement chooses
    /// when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_site_mode: Option<ModeConstraint>,
}

/// A job's constraint on the cross-site mode placement may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeConstraint {
    /// DiLoCo replicas at two or more sites, nothing else.
    Diloco,
    /// Never replicas per site: one site, or pipeline stages across sites.
    Pipeline,
    /// Synchronous data parallelism across two or more sites: replicas per
    /// site, the whole gradient all-reduced across the WAN every step.
    DataParallel,
}

impl ModeConstraint {
    /// The name used in job files and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Diloco => "diloco",
            Self::Pipeline => "pipeline",
            Self::DataParallel => "data-parallel",
        }
    }

    /// Parses [`ModeConstraint::as_str`]'s names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "diloco" => Some(Self::Diloco),
            "pipeline" => Some(Self::Pipeline),
            "data-parallel" => Some(Self::DataParallel),
            _ => None,
        }
    }
}

impl Constraints {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// DiLoCo-style cross-site synchronisation settings: H, and the policy the
/// sync planner ([`crate::sync`]) follows. Every field but `inner_steps` is
/// optional; a job file that sets only `inner_steps` keeps its meaning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Diloco {
    /// Inner steps between outer synchronisations (H) the job trains with.
    /// Placement costs it; the sync planner keeps it unless the WAN cannot
    /// meet the utilisation target at it, and then raises H no further
    /// than `max_inner_steps`.
    pub inner_steps: u32,
    /// The largest H the planner may choose. Default: four times
    /// `inner_steps`; set it to `inner_steps` to fix H.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inner_steps: Option<u32>,
    /// Fraction of wall time the GPUs should spend computing rather than
    /// waiting for the sync, in (0, 1]. Default 0.95.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_compute_utilisation: Option<f64>,
    /// The same target said the other way round: at most this fraction of
    /// wall time waiting for the sync, in [0, 1). Set this or
    /// `target_compute_utilisation`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_exposed_communication_fraction: Option<f64>,
    /// A fixed number of fragments (Streaming DiLoCo's P); chosen by the
    /// planner when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<u32>,
    /// The most fragments the planner may choose. Default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fragments: Option<u32>,
    /// The most inner steps a fragment's exchange may run behind (τ).
    /// Default 5, the range Streaming DiLoCo trained with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_overlap_steps: Option<u32>,
    /// Fixed bits per pseudo-gradient element on every link: 16, 8 or 4.
    /// When unset the planner uses the fewest its codecs offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<u32>,
    /// Carry each outer step's quantisation residual into the next one.
    /// Default true; it has no effect at 16 bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_feedback: Option<bool>,
    /// The most of each WAN link the sync may use (it is paced at this
    /// rate). Default: the whole link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_budget: Option<DataRate>,
    /// The compression ratio zstd is expected to reach on the encoded
    /// pseudo-gradient, at least 1.0. Default: the codec catalogue's (1.0,
    /// nothing gained on quantised data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zstd_ratio: Option<f64>,
}

/// The utilisation the sync planner aims at when the job names none.
pub const DEFAULT_TARGET_COMPUTE_UTILISATION: f64 = 0.95;
/// `max_inner_steps` when unset, as a multiple of `inner_steps`.
pub const DEFAULT_MAX_INNER_STEPS_FACTOR: u32 = 4;
/// `max_fragments` when unset.
pub const DEFAULT_MAX_FRAGMENTS: u32 = 64;
/// `max_overlap_steps` when unset.
pub const DEFAULT_MAX_OVERLAP_STEPS: u32 = 5;
/// Bounds that keep the planner's search small (it is linear in both).
pub const MAX_FRAGMENTS: u32 = 1024;
pub const MAX_OVERLAP_STEPS: u32 = 64;

impl Diloco {
    /// Settings with H = `inner_steps` and every policy field unset.
    pub fn new(inner_steps: u32) -> Self {
        Self {
            inner_steps,
            max_inner_steps: None,
            target_compute_utilisation: None,
            max_exposed_communication_fraction: None,
            fragments: None,
            max_fragments: None,
            max_overlap_steps: None,
            bits: None,
            error_feedback: None,
            link_budget: None,
            zstd_ratio: None,
        }
    }

    /// The largest H the planner may choose.
    pub fn max_inner_steps(&self) -> u32 {
        self.max_inner_steps.unwrap_or_else(|| {
            self.inner_steps
                .saturating_mul(DEFAULT_MAX_INNER_STEPS_FACTOR)
        })
    }

    /// The utilisation target, from whichever of the two fields is set.
    pub fn target_compute_utilisation(&self) -> f64 {
        match (
            self.target_compute_utilisation,
            self.max_exposed_communication_fraction,
        ) {
            (Some(target), _) => target,
            (None, Some(exposed)) => 1.0 - exposed,
            (None, None) => DEFAULT_TARGET_COMPUTE_UTILISATION,
        }
    }

    pub fn max_fragments(&self) -> u32 {
        self.max_fragments.unwrap_or(DEFAULT_MAX_FRAGMENTS)
    }

    pub fn max_overlap_steps(&self) -> u32 {
        self.max_overlap_steps.unwrap_or(DEFAULT_MAX_OVERLAP_STEPS)
    }

    pub fn error_feedback(&self) -> bool {
        self.error_feedback.unwrap_or(true)
    }

    /// Every problem with these settings, as (field, message), in field
    /// order. Job validation reports them under `diloco.`; the sync
    /// planner under `policy.`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut push = |field, message: String| out.push((field, message));
        // `inner_steps` keeps exactly the rule it had: `apply` validates
        // logged jobs, and a new rule on an old field would refuse on
        // replay what an older release accepted. The other fields are new.
        if self.inner_steps == 0 {
            push("inner_steps", "must be at least 1, found 0".into());
        }
        if let Some(max) = self.max_inner_steps
            && max < self.inner_steps
        {
            push(
                "max_inner_steps",
                format!(
                    "must be at least inner_steps ({}), found {max}",
                    self.inner_steps
                ),
            );
        }
        if let Some(target) = self.target_compute_utilisation
            && !(target.is_finite() && target > 0.0 && target <= 1.0)
        {
            push(
                "target_compute_utilisation",
                format!("must be a fraction in (0, 1] (write 95% as 0.95), found {target}"),
            );
        }
        if let Some(exposed) = self.max_exposed_communication_fraction {
            if !(exposed.is_finite() && (0.0..1.0).contains(&exposed)) {
                push(
                    "max_exposed_communication_fraction",
                    format!("must be a fraction in [0, 1) (write 5% as 0.05), found {exposed}"),
                );
            } else if self.target_compute_utilisation.is_some() {
                push(
                    "max_exposed_communication_fraction",
                    "set either this or target_compute_utilisation, not both".into(),
                );
            }
        }
        if let Some(max) = self.max_fragments
            && !(1..=MAX_FRAGMENTS).contains(&max)
        {
            push(
                "max_fragments",
                format!("must be within [1, {MAX_FRAGMENTS}], found {max}"),
            );
        }
        if let Some(fragments) = self.fragments {
            let limit = self.max_fragments.unwrap_or(MAX_FRAGMENTS);
            if fragments == 0 || fragments > limit {
                push(
                    "fragments",
                    format!("must be within [1, {limit}], found {fragments}"),
                );
            } else if fragments > self.max_inner_steps() {
                push(
                    "fragments",
                    format!(
                        "{fragments} fragments cannot each sync once in at most {} inner steps",
                        self.max_inner_steps()
                    ),
                );
            }
        }
        if let Some(overlap) = self.max_overlap_steps
            && overlap > MAX_OVERLAP_STEPS
        {
            push(
                "max_overlap_steps",
                format!("must be at most {MAX_OVERLAP_STEPS}, found {overlap}"),
            );
        }
        if let Some(bits) = self.bits
            && ![4, 8, 16].contains(&bits)
        {
            push("bits", format!("must be 16, 8 or 4, found {bits}"));
        }
        if self.link_budget.is_some_and(|b| b.bits_per_second() == 0) {
            push(
                "link_budget",
                "must be a positive data rate, found 0".into(),
            );
        }
        if let Some(ratio) = self.zstd_ratio
            && !(ratio.is_finite() && (1.0..=100.0).contains(&ratio))
        {
            push(
                "zstd_ratio",
                format!("must be a ratio within [1, 100] (1.0: zstd gains nothing), found {ratio}"),
            );
        }
        out
    }
}

impl JobSpec {
    /// Parses and validates a job file's contents.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigError> {
        config::parse(file, text)
    }

    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Weights, gradients and optimizer state of the whole model, in bytes,
    /// before any sharding.
    pub fn model_state_bytes(&self) -> f64 {
        let p = self.model.parameters as f64;
        let element = f64::from(self.training.precision.bytes());
        p * (2.0 * element + self.training.optimizer_state_bytes_per_parameter)
    }

    /// The job as it can be placed on `topology` when that is the part of a
    /// larger one that is up now: allowed sites that are not in it (down,
    /// not registered) are dropped. Fails when the job allowed some sites
    /// and none of them is there, rather than widening to every site.
    pub fn restricted_to(&self, topology: &Topology) -> Result<JobSpec, String> {
        let allowed = &self.constraints.allowed_sites;
        if allowed.is_empty() {
            return Ok(self.clone());
        }
        let present: Vec<String> = allowed
            .iter()
            .filter(|s| topology.site(s).is_some())
            .cloned()
            .collect();
        if present.is_empty() {
            return Err(format!(
                "none of the job's allowed sites ({}) is up",
                allowed.join(", ")
            ));
        }
        let mut job = self.clone();
        job.constraints.allowed_sites = present;
        Ok(job)
    }

    /// Problems that appear only against a particular topology: allowed
    /// sites that do not exist, a fixed tensor-parallel degree larger than
    /// every scale-up domain, more GPUs asked for than exist.
    pub fn violations_against(&self, topology: &Topology) -> Vec<Violation> {
        let mut out = Vec::new();
        let constraints = FieldPath::root().key("constraints");
        for (i, site) in self.constraints.allowed_sites.iter().enumerate() {
            if topology.site(site).is_none() {
                out.push(Violation::new(
                    constraints.key("allowed_sites").index(i),
                    format!("unknown site {site:?} in topology {:?}", topology.name),
                ));
            }
        }
        let sites: Vec<_> = topology
            .sites
            .iter()
            .filter(|s| {
                self.constraints.allowed_sites.is_empty()
                    || self.constraints.allowed_sites.contains(&s.id)
            })
            .collect();
        let largest_domain = sites
            .iter()
            .map(|s| s.largest_domain_gpus())
            .max()
            .unwrap_or(0);
        if let Some(tp) = self.constraints.tensor_parallel
            && u64::from(tp) > largest_domain
        {
            out.push(Violation::new(
                constraints.key("tensor_parallel"),
                format!(
                    "tensor-parallel degree {tp} does not fit in a scale-up domain: the largest allowed domain has {largest_domain} GPUs"
                ),
            ));
        }
        let available: u64 = sites.iter().map(|s| s.gpus()).sum();
        let fixed = [
            self.constraints.tensor_parallel,
            self.constraints.pipeline_parallel,
            self.constraints.data_parallel,
        ];
        if let [Some(tp), Some(pp), Some(dp)] = fixed {
            let wanted = u64::from(tp) * u64::from(pp) * u64::from(dp);
            if wanted > available {
                out.push(Violation::new(
                    constraints.clone(),
                    format!("fixed degrees need {tp} × {pp} × {dp} = {wanted} GPUs but the allowed sites have {available}"),
                ));
            }
        }
        out
    }
}

fn positive(path: FieldPath, value: u64, out: &mut Vec<Violation>) {
    if value == 0 {
        out.push(Violation::new(path, "must be at least 1, found 0"));
    }
}

/// The bounds of [`crate::limits`] on a job, its fields under `path`: at
/// file read, and at admission of a submitted job (not at apply: see
/// [`crate::state`]'s admission).
pub(crate) fn job_bounds(path: &FieldPath, spec: &JobSpec, out: &mut Vec<Violation>) {
    use crate::limits::{
        MAX_GLOBAL_BATCH, MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_PARAMETERS, MAX_SEQUENCE_LENGTH,
        MAX_SITES, check_at_most, check_entries,
    };
    let sites = path.key("constraints").key("allowed_sites");
    let allowed = spec.constraints.allowed_sites.len();
    check_entries(&sites, allowed, MAX_SITES, "sites", out);
    let model = path.key("model");
    let m = &spec.model;
    let parameters = model.key("parameters");
    check_at_most(&parameters, m.parameters, MAX_PARAMETERS, "parameters", out);
    check_at_most(&model.key("layers"), m.layers, MAX_LAYERS, "layers", out);
    let hidden = model.key("hidden_size");
    check_at_most(&hidden, m.hidden_size, MAX_HIDDEN_SIZE, "", out);
    let sequence = model.key("sequence_length");
    check_at_most(
        &sequence,
        m.sequence_length,
        MAX_SEQUENCE_LENGTH,
        "tokens",
        out,
    );
    if let Some(moe) = &m.moe {
        let experts = model.key("moe").key("experts");
        check_at_most(
            &experts,
            moe.experts,
            crate::limits::MAX_EXPERTS,
            "experts",
            out,
        );
    }
    let global = path.key("batch").key("global_batch");
    let batch = spec.batch.global_batch;
    check_at_most(&global, batch, MAX_GLOBAL_BATCH, "sequences", out);
}

impl Validate for JobSpec {
    fn bounds(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        job_bounds(&FieldPath::root(), self, &mut out);
        out
    }

    fn violations(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let root = FieldPath::root();
        check_id(&root.key("name"), &self.name, &mut out);

        let model = root.key("model");
        let m = &self.model;
        positive(model.key("parameters"), m.parameters, &mut out);
        positive(model.key("layers"), m.layers.into(), &mut out);
        positive(model.key("hidden_size"), m.hidden_size.into(), &mut out);
        positive(
            model.key("attention_heads"),
            m.attention_heads.into(),
            &mut out,
        );
        positive(
            model.key("sequence_length"),
            m.sequence_length.into(),
            &mut out,
        );
        if let Some(kv) = m.kv_heads {
            let path = model.key("kv_heads");
            if kv == 0 {
                out.push(Violation::new(path, "must be at least 1, found 0"));
            } else if !m.attention_heads.is_multiple_of(kv) {
                out.push(Violation::new(
                    path,
                    format!(
                        "{kv} key-value heads do not divide the {} attention heads (each key-value head serves a whole group of them)",
                        m.attention_heads
                    ),
                ));
            }
        }
        if let Some(moe) = &m.moe {
            let embeddings = crate::cost::embedding_parameters(self);
            moe::moe_problems(&model.key("moe"), m, moe, embeddings, &mut out);
        }
        if m.attention_heads > 0 && !m.hidden_size.is_multiple_of(m.attention_heads) {
            out.push(Violation::new(
                model.key("hidden_size"),
                format!(
                    "hidden size {} is not divisible by {} attention heads",
                    m.hidden_size, m.attention_heads
                ),
            ));
        }

        let batch = root.key("batch");
        positive(
            batch.key("global_batch"),
            self.batch.global_batch.into(),
            &mut out,
        );
        positive(
            batch.key("micro_batch"),
            self.batch.micro_batch.into(),
            &mut out,
        );
        if self.batch.micro_batch > 0
            && !self
                .batch
                .global_batch
                .is_multiple_of(self.batch.micro_batch)
        {
            out.push(Violation::new(
                batch.key("global_batch"),
                format!(
                    "global batch {} is not a multiple of the micro-batch {}",
                    self.batch.global_batch, self.batch.micro_batch
                ),
            ));
        }

        let bytes = self.training.optimizer_state_bytes_per_parameter;
        if !(bytes.is_finite() && (0.0..=64.0).contains(&bytes)) {
            out.push(Violation::new(
                root.key("training")
                    .key("optimizer_state_bytes_per_parameter"),
                format!("must be within [0, 64] bytes per parameter, found {bytes}"),
            ));
        }

        let constraints = root.key("constraints");
        let c = &self.constraints;
        let mut seen = BTreeSet::new();
        for (i, site) in c.allowed_sites.iter().enumerate() {
            check_id(&constraints.key("allowed_sites").index(i), site, &mut out);
            if !seen.insert(site) {
                out.push(Violation::new(
                    constraints.key("allowed_sites").index(i),
                    format!("site {} is listed twice", crate::limits::quote(site)),
                ));
            }
        }
        for (key, value) in [
            ("max_tensor_parallel", c.max_tensor_parallel),
            ("tensor_parallel", c.tensor_parallel),
            ("pipeline_parallel", c.pipeline_parallel),
            ("data_parallel", c.data_parallel),
            ("expert_parallel", c.expert_parallel),
        ] {
            if let Some(value) = value {
                positive(constraints.key(key), value.into(), &mut out);
            }
        }
        if let (Some(tp), Some(max)) = (c.tensor_parallel, c.max_tensor_parallel)
            && tp > max
        {
            out.push(Violation::new(
                constraints.key("tensor_parallel"),
                format!("tensor-parallel degree {tp} exceeds max_tensor_parallel {max}"),
            ));
        }
        if let Some(tp) = c.tensor_parallel
            && tp > 0
        {
            if !m.attention_heads.is_multiple_of(tp) {
                out.push(Violation::new(
                    constraints.key("tensor_parallel"),
                    format!(
                        "tensor-parallel degree {tp} does not divide {} attention heads",
                        m.attention_heads
                    ),
                ));
            } else if !m.kv_heads().max(1).is_multiple_of(tp) {
                out.push(Violation::new(
                    constraints.key("tensor_parallel"),
                    format!(
                        "tensor-parallel degree {tp} does not divide the {} key-value heads",
                        m.kv_heads()
                    ),
                ));
            }
        }
        if let Some(ep) = c.expert_parallel
            && ep > 0
        {
            let path = constraints.key("expert_parallel");
            moe::expert_parallel_problems(path, self, ep, &mut out);
        }
        if let Some(mode @ (ModeConstraint::Diloco | ModeConstraint::DataParallel)) =
            c.cross_site_mode
            && c.allowed_sites.len() == 1
        {
            out.push(Violation::new(
                constraints.key("cross_site_mode"),
                format!(
                    "\"{}\" needs replicas at two or more sites, but allowed_sites names one",
                    mode.as_str()
                ),
            ));
        }
        if let Some(pp) = c.pipeline_parallel
            && pp > m.layers
        {
            out.push(Violation::new(
                constraints.key("pipeline_parallel"),
                format!(
                    "pipeline-parallel degree {pp} exceeds the {} layers",
                    m.layers
                ),
            ));
        }
        if let Some(diloco) = &self.diloco {
            for (field, message) in diloco.problems() {
                out.push(Violation::new(root.key("diloco").key(field), message));
            }
        }
        self.objective.problems(&root.key("objective"), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
name = "j"
[model]
parameters = 1_000_000_000
layers = 16
hidden_size = 2048
attention_heads = 16
sequence_length = 4096
[batch]
global_batch = 64
micro_batch = 1
"#;

    fn refused(objective: &str) -> String {
        let text = format!("{JOB}[objective]\n{objective}\n");
        match JobSpec::from_toml("j.toml", &text) {
            Ok(job) => panic!("{objective:?} was accepted: {:?}", job.objective),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn an_objective_out_of_bounds_is_refused_naming_its_field() {
        for (objective, field) in [
            ("within = 0.1", "objective.within"),
            ("goal = \"fewest-gpus\"\nwithin = 0", "objective.within"),
            ("goal = \"fewest-gpus\"\nwithin = 11.0", "objective.within"),
            ("goal = \"fewest-gpus\"\nwithin = nan", "objective.within"),
            ("max_gpus = 0", "objective.max_gpus"),
            ("max_gpus = 10_000_001", "objective.max_gpus"),
            ("goal = \"cheapest\"", "goal"),
            ("budget = 4", "budget"),
        ] {
            let error = refused(objective);
            assert!(error.contains(field), "{objective:?}: {error}");
        }
    }

    #[test]
    fn an_objective_is_optional_and_reads_as_written() {
        let plain = JobSpec::from_toml("j.toml", JOB).expect("parses");
        assert!(plain.objective.is_default());
        let text = format!("{JOB}[objective]\ngoal = \"fewest-gpus\"\nmax_gpus = 512\n");
        let job = JobSpec::from_toml("j.toml", &text).expect("parses");
        assert_eq!(job.objective.goal, Goal::FewestGpus);
        assert_eq!(job.objective.max_gpus, Some(512));
        assert_eq!(job.objective.within(), DEFAULT_WITHIN);
        assert_eq!(
            job.objective.describe(),
            "fewest GPUs within 5 % of the fastest step, at most 512 GPUs"
        );
    }
}
