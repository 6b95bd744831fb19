//! A site's inventory: every node the local scheduler knows, where it sits
//! (building, scale-up domain) and its GPUs, plus what could not be mapped.
//!
//! Sources (static file, Slurm, Kubernetes) all produce an [`Inventory`].
//! The coordinator only ever sees the compressed [`Site`] (identical domains
//! folded into domain groups); the node list stays in the agent, which needs
//! it to turn a rank binding (building, domain group, domain index, node
//! index) back into a host name when it renders an assignment.

use longhaul_core::topology::Site;

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
