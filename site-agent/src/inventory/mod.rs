//! A site's inventory: every node the local scheduler knows, where it sits
//! (building, scale-up domain) and its GPUs, plus what could not be mapped.
//!
//! Sources (static file, Slurm, Kubernetes) all produce an [`Inventory`]
//! through one trait, [`InventorySource`]; [`source_from_config`] builds the
//! one an `[inventory]` config table ([`InventoryConfig`]) names.
//! The coordinator only ever sees the compressed [`Site`] (identical domains
//! folded into domain groups); the node list stays in the agent, which needs
//! it to turn a rank binding (building, domain group, domain index, node
//! index) back into a host name when it renders an assignment.
//!
//! What no scheduler knows comes from the config: fabric kind, link rate and
//! oversubscription (a default and per-building overrides), the campus
//! interconnect, and which switches, blocks or zones form a building.
//!
//! Module map: `config` (the `[inventory]` table), `error` (problems that
//! name the node), `assemble` (folding into domain groups, the core's
//! validation), `static_file`, `slurm` (nodes, GRES, topology), `kubernetes`,
//! `hostlist` (Slurm host lists), `order` (natural order), `gpu` (GPU name
//! aliases), `command` (scheduler commands with a deadline).

mod assemble;
mod command;
pub mod config;
mod error;
pub mod gpu;
pub mod kubernetes;
pub mod slurm;
mod static_file;

use std::path::Path;

use longhaul_core::topology::Site;

pub use config::{
    BuildingConfig, InventoryConfig, KubernetesConfig, SlurmConfig, SourceKind, StaticConfig,
};
pub use error::{InventoryError, Problem, ProblemKind};
pub use kubernetes::KubernetesSource;
pub use slurm::SlurmSource;
pub use static_file::StaticSource;

/// Where an inventory comes from. Discovery is synchronous: sources read
/// files or run a scheduler command with a deadline.
pub trait InventorySource: std::fmt::Debug + Send + Sync {
    /// What the source reads, for logs and errors (`slurm (`scontrol show
    /// nodes`, ...)`).
    fn describe(&self) -> String;

    /// Reads the scheduler's view and maps it. On error nothing is returned:
    /// a bad inventory is never half-registered.
    fn discover(&self) -> Result<Inventory, InventoryError>;
}

/// The source an `[inventory]` table describes, after checking the table.
pub fn source_from_config(
    config: &InventoryConfig,
) -> Result<Box<dyn InventorySource>, InventoryError> {
    use longhaul_core::config::Validate;
    let violations = config.violations();
    if !violations.is_empty() {
        return Err(InventoryError::Config { violations });
    }
    Ok(match config.source {
        SourceKind::Static => {
            let file = config
                .static_file
                .as_ref()
                .map(|s| s.file.clone())
                .unwrap_or_default();
            Box::new(StaticSource {
                file,
                site: config.site.clone(),
            })
        }
        SourceKind::Slurm => Box::new(SlurmSource::new(config)),
        SourceKind::Kubernetes => Box::new(KubernetesSource::new(config)),
    })
}

/// Reads a whole file as UTF-8.
fn read_file(path: &Path) -> Result<String, InventoryError> {
    std::fs::read_to_string(path).map_err(|source| InventoryError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// One node as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The scheduler's name for the node (Slurm NodeName, Kubernetes node name).
    pub name: String,
    /// The building (data hall) the node is in.
    pub building: String,
    /// The domain group of the compressed [`Site`] the node's domain folds into.
    pub domain_group: String,
    /// Index of the node's scale-up domain within its domain group.
    pub domain: u64,
    /// Index of the node within its domain.
    pub node: u64,
    /// The scheduler's name for the node's scale-up domain (Slurm block or
    /// leaf switch, Kubernetes `nvidia.com/gpu.clique` value); used in
    /// rendered constraints. `None` when the domain is the node itself.
    pub scheduler_domain: Option<String>,
    /// GPUs on the node.
    pub gpus: u32,
    /// Built-in or declared GPU type name (`h100`, `gb200`, ...).
    pub gpu_type: String,
    /// Partitions (Slurm) or node pools (Kubernetes) the node belongs to.
    pub partitions: Vec<String>,
}

/// Something the source reported that the agent could not place in the
/// topology model, with why. Reported, never guessed around silently.
///
/// Unmapped, not errors: nodes without GPUs (CPU, login, control-plane
/// nodes), nodes that take no work now (Slurm DOWN/DRAIN/NOT_RESPONDING,
/// Kubernetes not Ready or cordoned; they return at the next discovery),
/// nodes outside the configured partitions, in no block or leaf switch, or
/// without a building, and multi-node NVLink nodes whose domain the
/// scheduler does not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmapped {
    /// The node (or other object) concerned.
    pub object: String,
    pub reason: String,
}

/// A site's inventory as discovered from one source.
#[derive(Debug, Clone, PartialEq)]
pub struct Inventory {
    /// The compressed model registered with the coordinator.
    pub site: Site,
    /// Every mapped node, ordered by (building, domain group, domain, node).
    pub nodes: Vec<Node>,
    /// What was seen but left out.
    pub unmapped: Vec<Unmapped>,
}

impl Inventory {
    /// GPUs on mapped nodes (equal to the site's GPU count).
    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }

    /// The node with this scheduler name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The reason a node was left unmapped, if it was.
    pub fn unmapped_reason(&self, object: &str) -> Option<&str> {
        self.unmapped
            .iter()
            .find(|u| u.object == object)
            .map(|u| u.reason.as_str())
    }

    /// The node a rank binding points at.
    pub fn node_at(
        &self,
        building: &str,
        domain_group: &str,
        domain: u64,
        node: u64,
    ) -> Option<&Node> {
        self.nodes.iter().find(|n| {
            n.building == building
                && n.domain_group == domain_group
                && n.domain == domain
                && n.node == node
        })
    }
}
