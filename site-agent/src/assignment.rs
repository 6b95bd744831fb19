//! What the coordinator assigned to this site for one job: which ranks run on
//! which of the site's GPUs, with the whole-job figures a launcher needs.
//!
//! A [`SiteAssignment`] is the agent's side of a placement plan. The watch
//! fills it from the wire message; [`SiteAssignment::from_plan`] derives it
//! from a core [`Plan`] (tests, dry runs). Either way it is checked with
//! [`SiteAssignment::validate`] before anything is rendered from it, so a
//! malformed message is refused with the offending field named.

use std::collections::{BTreeMap, BTreeSet};

use longhaul_core::config::{FieldPath, check_id};
use longhaul_core::placement::{CrossSiteMode, Plan};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The `mode` of a pipeline-mode assignment: one synchronous job whose
/// pipeline stages may sit in different sites.
pub const MODE_PIPELINE: &str = "pipeline";
/// The `mode` of a DiLoCo assignment: per-site replicas that average their
/// pseudo-gradients every `inner_steps` steps.
pub const MODE_DILOCO: &str = "diloco";
/// The `mode` of a cross-site data-parallel assignment: per-site replicas
/// that all-reduce the whole gradient across sites every step (the
/// training framework's own collective; no outer rounds).
pub const MODE_DATA_PARALLEL: &str = "data-parallel";

fn one() -> u32 {
    1
}

/// What one site must run for one job, as the coordinator assigned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteAssignment {
    pub job_id: String,
    pub site_id: String,
    /// Coordinator revision at which this assignment was made.
    pub revision: u64,
    /// Whole-job figures, for the launcher's environment.
    pub world_size: u64,
    pub tensor_parallel: u32,
    pub pipeline_parallel: u32,
    pub data_parallel: u32,
    /// Expert parallelism of a mixture-of-experts job: groups of this
    /// many consecutive replicas share out the experts (1: dense).
    #[serde(default = "one")]
    pub expert_parallel: u32,
    /// "pipeline", "diloco" or "data-parallel".
    pub mode: String,
    /// DiLoCo inner steps between outer syncs; 0 in the other modes.
    pub inner_steps: u32,
    /// Pipeline stages (global indices) and replicas with at least one rank here.
    pub stages: Vec<u32>,
    pub replicas: Vec<u32>,
    /// Every rank placed on this site.
    pub ranks: Vec<RankBinding>,
}

/// Where one rank runs: a GPU of a node, named by its place in the site's
/// compressed topology (the agent's inventory turns it into a host name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankBinding {
    /// Global rank, in the plan's tp-pp-dp order.
    pub rank: u64,
    pub building: String,
    pub domain_group: String,
    /// Index of the scale-up domain within its domain group.
    pub domain: u64,
    /// Index of the node within its domain.
    pub node: u64,
    /// Index of the GPU within its node.
    pub gpu: u32,
}

/// Why an assignment is malformed. Every variant names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AssignmentError {
    #[error("assignment field `{field}`: {message}")]
    InvalidId {
        field: &'static str,
        message: String,
    },
    #[error("assignment field `{field}` is 0; every parallel degree is at least 1")]
    ZeroDegree { field: &'static str },
    #[error(
        "assignment fields `tensor_parallel` × `pipeline_parallel` × `data_parallel` = \
         {tensor_parallel} × {pipeline_parallel} × {data_parallel} = {product}, \
         but `world_size` is {world_size}"
    )]
    DegreesDisagree {
        tensor_parallel: u32,
        pipeline_parallel: u32,
        data_parallel: u32,
        product: u128,
        world_size: u64,
    },
    #[error(
        "assignment field `mode` is {mode:?}; expected \"pipeline\", \"diloco\" or \
         \"data-parallel\""
    )]
    UnknownMode { mode: String },
    #[error(
        "assignment field `expert_parallel` is {expert_parallel}, which does not divide \
         `data_parallel` {data_parallel}"
    )]
    ExpertParallel {
        expert_parallel: u32,
        data_parallel: u32,
    },
    #[error(
        "assignment field `inner_steps` is {inner_steps} in {mode} mode; \
         it must be 0 in pipeline and data-parallel modes and at least 1 in diloco mode"
    )]
    InnerSteps { mode: String, inner_steps: u32 },
    #[error(
        "assignment field `ranks[{index}].rank` is {rank}, not below `world_size` {world_size}"
    )]
    RankOutOfRange {
        index: usize,
        rank: u64,
        world_size: u64,
    },
    #[error("assignment field `ranks[{index}].rank`: rank {rank} is listed twice")]
    DuplicateRank { index: usize, rank: u64 },
    #[error("assignment field `ranks[{index}].{field}` (rank {rank}) is empty")]
    EmptyRankField {
        index: usize,
        rank: u64,
        field: &'static str,
    },
    #[error(
        "assignment field `ranks[{index}].gpu`: rank {rank} and rank {other_rank} are both bound \
         to GPU {gpu} of (building {building:?}, domain group {domain_group:?}, domain {domain}, \
         node {node})"
    )]
    GpuShared {
        index: usize,
        rank: u64,
        other_rank: u64,
        building: String,
        domain_group: String,
        domain: u64,
        node: u64,
        gpu: u32,
    },
    #[error(
        "assignment field `{field}` is {listed:?} but the ranks here belong to {derived:?} \
         (rank = tp_rank + tp · (stage + pp · replica))"
    )]
    DerivedListDisagrees {
        field: &'static str,
        listed: Vec<u32>,
        derived: Vec<u32>,
    },
}

impl SiteAssignment {
    /// The assignment a watch message carries for `site_id`, checked with
    /// [`SiteAssignment::validate`].
    pub fn from_wire(
        message: &longhaul_proto::v1::Assignment,
        site_id: &str,
    ) -> Result<SiteAssignment, AssignmentError> {
        let assignment = SiteAssignment {
            job_id: message.job_id.clone(),
            site_id: site_id.to_string(),
            revision: message.revision,
            world_size: message.world_size,
            tensor_parallel: message.tensor_parallel,
            pipeline_parallel: message.pipeline_parallel,
            data_parallel: message.data_parallel,
            expert_parallel: message.expert_parallel.max(1),
            mode: message.mode.clone(),
            inner_steps: message.sync.as_ref().map_or(0, |s| s.inner_steps),
            stages: message.stages.clone(),
            replicas: message.replicas.clone(),
            ranks: message
                .ranks
                .iter()
                .map(|r| RankBinding {
                    rank: r.rank,
                    building: r.building_id.clone(),
                    domain_group: r.domain_id.clone(),
                    domain: r.domain,
                    node: u64::from(r.node),
                    gpu: r.gpu,
                })
                .collect(),
        };
        assignment.validate()?;
        Ok(assignment)
    }

    /// The part of `plan` that runs on `site_id`, as of coordinator
    /// `revision`. Ranks are in rank order; stages and replicas are the
    /// sorted indices that have at least one rank on the site.
    pub fn from_plan(plan: &Plan, site_id: &str, revision: u64) -> SiteAssignment {
        let degrees = plan.degrees;
        let (mode, inner_steps) = match plan.mode {
            CrossSiteMode::Pipeline => (MODE_PIPELINE, 0),
            CrossSiteMode::Diloco { inner_steps } => (MODE_DILOCO, inner_steps),
            CrossSiteMode::DataParallel => (MODE_DATA_PARALLEL, 0),
        };
        let ranks: Vec<RankBinding> = plan
            .bindings()
            .filter(|b| b.site == site_id)
            .map(|b| RankBinding {
                rank: b.rank,
                building: b.building,
                domain_group: b.domain_group,
                domain: b.domain,
                node: b.node,
                gpu: b.gpu,
            })
            .collect();
        let (stages, replicas) =
            stages_and_replicas(&ranks, degrees.tensor_parallel, degrees.pipeline_parallel);
        SiteAssignment {
            job_id: plan.job.clone(),
            site_id: site_id.to_string(),
            revision,
            world_size: plan.gpus(),
            tensor_parallel: degrees.tensor_parallel,
            pipeline_parallel: degrees.pipeline_parallel,
            data_parallel: degrees.data_parallel,
            expert_parallel: degrees.expert_parallel,
            mode: mode.to_string(),
            inner_steps,
            stages,
            replicas,
            ranks,
        }
    }

    /// Checks the assignment on its own (the inventory checks, such as a GPU
    /// index beyond its node's count, happen when it is rendered). The first
    /// problem found is returned, naming its field.
    pub fn validate(&self) -> Result<(), AssignmentError> {
        for (field, id) in [("job_id", &self.job_id), ("site_id", &self.site_id)] {
            let mut violations = Vec::new();
            check_id(&FieldPath::root().key(field), id, &mut violations);
            if let Some(violation) = violations.into_iter().next() {
                return Err(AssignmentError::InvalidId {
                    field,
                    message: violation.message,
                });
            }
        }
        for (field, value) in [
            ("tensor_parallel", self.tensor_parallel),
            ("pipeline_parallel", self.pipeline_parallel),
            ("data_parallel", self.data_parallel),
            ("expert_parallel", self.expert_parallel),
        ] {
            if value == 0 {
                return Err(AssignmentError::ZeroDegree { field });
            }
        }
        if !self.data_parallel.is_multiple_of(self.expert_parallel) {
            return Err(AssignmentError::ExpertParallel {
                expert_parallel: self.expert_parallel,
                data_parallel: self.data_parallel,
            });
        }
        let product = u128::from(self.tensor_parallel)
            * u128::from(self.pipeline_parallel)
            * u128::from(self.data_parallel);
        if product != u128::from(self.world_size) {
            return Err(AssignmentError::DegreesDisagree {
                tensor_parallel: self.tensor_parallel,
                pipeline_parallel: self.pipeline_parallel,
                data_parallel: self.data_parallel,
                product,
                world_size: self.world_size,
            });
        }
        let inner_steps_ok = match self.mode.as_str() {
            MODE_PIPELINE | MODE_DATA_PARALLEL => self.inner_steps == 0,
            MODE_DILOCO => self.inner_steps > 0,
            _ => {
                return Err(AssignmentError::UnknownMode {
                    mode: self.mode.clone(),
                });
            }
        };
        if !inner_steps_ok {
            return Err(AssignmentError::InnerSteps {
                mode: self.mode.clone(),
                inner_steps: self.inner_steps,
            });
        }
        self.validate_ranks()?;
        let (stages, replicas) =
            stages_and_replicas(&self.ranks, self.tensor_parallel, self.pipeline_parallel);
        for (field, listed, derived) in [
            ("stages", &self.stages, stages),
            ("replicas", &self.replicas, replicas),
        ] {
            let listed_set: BTreeSet<u32> = listed.iter().copied().collect();
            // A list with duplicates or out of order is as suspicious as a
            // wrong one: the wire type promises sorted, distinct indices.
            if listed_set.len() != listed.len()
                || !listed.is_sorted()
                || listed_set.into_iter().ne(derived.iter().copied())
            {
                return Err(AssignmentError::DerivedListDisagrees {
                    field,
                    listed: listed.clone(),
                    derived,
                });
            }
        }
        Ok(())
    }

    fn validate_ranks(&self) -> Result<(), AssignmentError> {
        let mut seen_ranks = BTreeSet::new();
        let mut gpus: BTreeMap<(&str, &str, u64, u64, u32), u64> = BTreeMap::new();
        for (index, binding) in self.ranks.iter().enumerate() {
            let rank = binding.rank;
            if rank >= self.world_size {
                return Err(AssignmentError::RankOutOfRange {
                    index,
                    rank,
                    world_size: self.world_size,
                });
            }
            if !seen_ranks.insert(rank) {
                return Err(AssignmentError::DuplicateRank { index, rank });
            }
            for (field, value) in [
                ("building", &binding.building),
                ("domain_group", &binding.domain_group),
            ] {
                if value.is_empty() {
                    return Err(AssignmentError::EmptyRankField { index, rank, field });
                }
            }
            let key = (
                binding.building.as_str(),
                binding.domain_group.as_str(),
                binding.domain,
                binding.node,
                binding.gpu,
            );
            if let Some(&other_rank) = gpus.get(&key) {
                return Err(AssignmentError::GpuShared {
                    index,
                    rank,
                    other_rank,
                    building: binding.building.clone(),
                    domain_group: binding.domain_group.clone(),
                    domain: binding.domain,
                    node: binding.node,
                    gpu: binding.gpu,
                });
            }
            gpus.insert(key, rank);
        }
        Ok(())
    }
}

/// The sorted pipeline stages and replicas that `ranks` belong to, from
/// rank = tp_rank + tp · (stage + pp · replica). Indices that do not fit a
/// `u32` are left out; validation rejects such ranks first.
fn stages_and_replicas(
    ranks: &[RankBinding],
    tensor_parallel: u32,
    pipeline_parallel: u32,
) -> (Vec<u32>, Vec<u32>) {
    let tp = u64::from(tensor_parallel.max(1));
    let pp = u64::from(pipeline_parallel.max(1));
    let mut stages = BTreeSet::new();
    let mut replicas = BTreeSet::new();
    for binding in ranks {
        let stage_and_replica = binding.rank / tp;
        if let Ok(stage) = u32::try_from(stage_and_replica % pp) {
            stages.insert(stage);
        }
        if let Ok(replica) = u32::try_from(stage_and_replica / pp) {
            replicas.insert(replica);
        }
    }
    (stages.into_iter().collect(), replicas.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(rank: u64, domain: u64, node: u64, gpu: u32) -> RankBinding {
        RankBinding {
            rank,
            building: "b1".into(),
            domain_group: "hgx".into(),
            domain,
            node,
            gpu,
        }
    }

    /// tp 2, pp 2, dp 2: this site holds stage 1 of both replicas.
    fn assignment() -> SiteAssignment {
        SiteAssignment {
            job_id: "job".into(),
            site_id: "south".into(),
            revision: 3,
            world_size: 8,
            tensor_parallel: 2,
            pipeline_parallel: 2,
            data_parallel: 2,
            expert_parallel: 1,
            mode: "pipeline".into(),
            inner_steps: 0,
            stages: vec![1],
            replicas: vec![0, 1],
            ranks: vec![
                binding(2, 0, 0, 0),
                binding(3, 0, 0, 1),
                binding(6, 1, 0, 0),
                binding(7, 1, 0, 1),
            ],
        }
    }

    fn check(change: impl FnOnce(&mut SiteAssignment), expected: &str) {
        let mut a = assignment();
        change(&mut a);
        let err = a.validate().expect_err("the change must be refused");
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn a_consistent_assignment_is_valid() {
        assert_eq!(assignment().validate(), Ok(()));
        let mut data_parallel = assignment();
        data_parallel.mode = MODE_DATA_PARALLEL.into();
        assert_eq!(data_parallel.validate(), Ok(()));
    }

    #[test]
    fn each_malformation_names_its_field() {
        check(
            |a| a.job_id.clear(),
            "assignment field `job_id`: invalid id \"\": expected 1 to 63 characters of a-z, \
             0-9, '-' or '_', starting with a letter or digit",
        );
        check(
            |a| a.site_id = "South Campus".into(),
            "assignment field `site_id`: invalid id \"South Campus\": expected 1 to 63 \
             characters of a-z, 0-9, '-' or '_', starting with a letter or digit",
        );
        check(
            |a| a.data_parallel = 0,
            "assignment field `data_parallel` is 0; every parallel degree is at least 1",
        );
        check(
            |a| a.world_size = 16,
            "assignment fields `tensor_parallel` × `pipeline_parallel` × `data_parallel` = \
             2 × 2 × 2 = 8, but `world_size` is 16",
        );
        check(
            |a| a.mode = "async".into(),
            "assignment field `mode` is \"async\"; expected \"pipeline\", \"diloco\" or \
             \"data-parallel\"",
        );
        check(
            |a| a.inner_steps = 10,
            "assignment field `inner_steps` is 10 in pipeline mode; it must be 0 in pipeline \
             and data-parallel modes and at least 1 in diloco mode",
        );
        check(
            |a| a.mode = "diloco".into(),
            "assignment field `inner_steps` is 0 in diloco mode; it must be 0 in pipeline and \
             data-parallel modes and at least 1 in diloco mode",
        );
        check(
            |a| {
                a.mode = "data-parallel".into();
                a.inner_steps = 1;
            },
            "assignment field `inner_steps` is 1 in data-parallel mode; it must be 0 in \
             pipeline and data-parallel modes and at least 1 in diloco mode",
        );
        check(
            |a| a.ranks[3].rank = 8,
            "assignment field `ranks[3].rank` is 8, not below `world_size` 8",
        );
        check(
            |a| a.ranks[2].rank = 3,
            "assignment field `ranks[2].rank`: rank 3 is listed twice",
        );
        check(
            |a| a.ranks[1].domain_group.clear(),
            "assignment field `ranks[1].domain_group` (rank 3) is empty",
        );
        check(
            |a| a.ranks[1].gpu = 0,
            "assignment field `ranks[1].gpu`: rank 3 and rank 2 are both bound to GPU 0 of \
             (building \"b1\", domain group \"hgx\", domain 0, node 0)",
        );
        check(
            |a| a.stages = vec![0, 1],
            "assignment field `stages` is [0, 1] but the ranks here belong to [1] \
             (rank = tp_rank + tp · (stage + pp · replica))",
        );
        check(
            |a| a.expert_parallel = 0,
            "assignment field `expert_parallel` is 0; every parallel degree is at least 1",
        );
        check(
            |a| a.expert_parallel = 3,
            "assignment field `expert_parallel` is 3, which does not divide `data_parallel` 2",
        );
        check(
            |a| a.replicas = vec![1, 0],
            "assignment field `replicas` is [1, 0] but the ranks here belong to [0, 1] \
             (rank = tp_rank + tp · (stage + pp · replica))",
        );
    }

    #[test]
    fn degrees_whose_product_overflows_u64_are_refused_not_wrapped() {
        let mut a = assignment();
        a.tensor_parallel = u32::MAX;
        a.pipeline_parallel = u32::MAX;
        a.data_parallel = u32::MAX;
        a.world_size = u64::MAX;
        assert!(matches!(
            a.validate(),
            Err(AssignmentError::DegreesDisagree { .. })
        ));
    }

    #[test]
    fn an_assignment_round_trips_through_json_and_refuses_unknown_fields() {
        let a = assignment();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<SiteAssignment>(&json).unwrap(), a);
        let extra = json.replacen('{', "{\"colour\":\"red\",", 1);
        let err = serde_json::from_str::<SiteAssignment>(&extra).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }
}
