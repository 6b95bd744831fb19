//! The job model: what is trained, with which batch, and under which
//! constraints.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::config::{self, ConfigError, FieldPath, Validate, Violation, check_id};
use crate::topology::Topology;

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
}

/// The shape of a dense decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub parameters: u64,
    pub layers: u32,
    pub hidden_size: u32,
    pub attention_heads: u32,
    pub sequence_length: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary_size: Option<u32>,
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
}

impl Constraints {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// DiLoCo-style cross-site synchronisation settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Diloco {
    /// Inner steps between outer synchronisations (H).
    pub inner_steps: u32,
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

impl Validate for JobSpec {
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
            && !m.attention_heads.is_multiple_of(tp)
        {
            out.push(Violation::new(
                constraints.key("tensor_parallel"),
                format!(
                    "tensor-parallel degree {tp} does not divide {} attention heads",
                    m.attention_heads
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
            positive(
                root.key("diloco").key("inner_steps"),
                diloco.inner_steps.into(),
                &mut out,
            );
        }
        out
    }
}
