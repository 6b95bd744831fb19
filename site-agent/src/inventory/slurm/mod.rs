//! The Slurm source: nodes, GPU GRES, partitions and the network topology
//! from a running Slurm (`scontrol`) or from recorded output.
//!
//! Mapping, per node (in natural order of names):
//!
//! 1. not in a configured partition → unmapped;
//! 2. no GPU GRES → unmapped (CPU and login nodes);
//! 3. a state that takes no work (DOWN, DRAIN, NOT_RESPONDING, ...) →
//!    unmapped with the state and Slurm's reason: the inventory is what a
//!    plan can use now, and a drained node returns at the next discovery;
//! 4. GRES count vs the node's configured TRES `gres/gpu`, mixed or unknown
//!    GPU types → problems (errors);
//! 5. the scale-up domain and building from the topology:
//!    - topology/block: a block is one scale-up domain (an NVL72 rack); its
//!      building is the one `buildings` lists it under, else
//!      `default_building`, else an error naming the block;
//!    - topology/tree: each node is its own scale-up domain (an 8-GPU HGX
//!      board); its building is the first switch from its leaf upwards that
//!      `buildings` lists, else `default_building`, else its top-level switch;
//!    - no topology: each node is its own domain in `default_building`.
//!
//!    A node in two blocks or leaf switches is an error; a node in none is
//!    unmapped. So is a node of a GPU whose NVLink reaches beyond one node
//!    (GB200) when only a tree says where it is: Slurm's tree does not say
//!    which nodes share an NVLink domain, and the agent does not guess.

pub mod gres;
pub mod nodes;
pub mod topology;

use std::collections::{BTreeMap, BTreeSet};

use super::assemble::{Placed, SiteSettings, assemble, check_duplicates};
use super::config::{InventoryConfig, SlurmConfig};
use super::error::{Problem, ProblemKind};
use super::gpu::{GpuNames, spans_nodes};
use super::{Inventory, InventoryError, InventorySource, Unmapped, command, read_file};
use crate::hostlist::{self, Names, natural_cmp};
use nodes::SlurmNode;
use topology::SlurmTopology;

/// Discovers a site's inventory from Slurm.
#[derive(Debug, Clone)]
pub struct SlurmSource {
    settings: SiteSettings,
    config: SlurmConfig,
    names: GpuNames,
}

impl SlurmSource {
    /// The source `config` describes; its `slurm` table (or the defaults).
    pub fn new(config: &InventoryConfig) -> Self {
        Self {
            settings: SiteSettings::from_config(config),
            config: config.slurm.clone().unwrap_or_default(),
            names: GpuNames::new(&config.gpu_aliases),
        }
    }

    fn timeout(&self) -> std::time::Duration {
        self.config.timeout.into()
    }

    /// Nodes from the recorded file, or from `scontrol show nodes --json`,
    /// falling back to `scontrol -o show nodes` where `scontrol` has no
    /// `--json` (Slurm before 23.02).
    pub fn read_nodes(&self) -> Result<Vec<SlurmNode>, InventoryError> {
        if let Some(path) = &self.config.nodes_json {
            return nodes::parse_json(&path.display().to_string(), &read_file(path)?);
        }
        if let Some(path) = &self.config.nodes_text {
            return nodes::parse_text(&path.display().to_string(), &read_file(path)?);
        }
        let scontrol = self.config.scontrol.as_str();
        let json_args = ["show", "nodes", "--json"];
        match command::run(scontrol, &json_args, self.timeout()) {
            Ok(text) => nodes::parse_json(&command::display(scontrol, &json_args), &text),
            Err(InventoryError::Command { stderr, .. })
                if stderr.contains("unrecognized option") && stderr.contains("--json") =>
            {
                let text_args = ["-o", "show", "nodes"];
                let text = command::run(scontrol, &text_args, self.timeout())?;
                nodes::parse_text(&command::display(scontrol, &text_args), &text)
            }
            Err(error) => Err(error),
        }
    }

    /// The topology from the recorded file (or `topology.conf`), or from
    /// `scontrol show topology`.
    pub fn read_topology(&self) -> Result<SlurmTopology, InventoryError> {
        if let Some(path) = &self.config.topology_file {
            return topology::parse(&path.display().to_string(), &read_file(path)?);
        }
        let scontrol = self.config.scontrol.as_str();
        let args = ["show", "topology"];
        let text = command::run(scontrol, &args, self.timeout())?;
        topology::parse(&command::display(scontrol, &args), &text)
    }

    /// Maps Slurm's nodes and topology into an inventory.
    pub fn map(
        &self,
        nodes: Vec<SlurmNode>,
        topology: &SlurmTopology,
    ) -> Result<Inventory, InventoryError> {
        let mut problems = Vec::new();
        let mut unmapped = Vec::new();
        let mut placed = Vec::new();
        check_duplicates(
            nodes.iter().map(|n| n.name.as_str()),
            "Slurm's node list",
            &mut problems,
        );
        let locator = Locator::new(topology, &self.config, &mut problems);
        let wanted: BTreeSet<&str> = self.config.partitions.iter().map(String::as_str).collect();

        let mut nodes = nodes;
        nodes.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        nodes.dedup_by(|a, b| a.name == b.name);
        for node in nodes {
            if !wanted.is_empty() && !node.partitions.iter().any(|p| wanted.contains(p.as_str())) {
                unmapped.push(Unmapped {
                    object: node.name,
                    reason: format!(
                        "in partitions [{}], none of the configured [{}]",
                        node.partitions.join(", "),
                        self.config.partitions.join(", ")
                    ),
                });
                continue;
            }
            let gres = match gres::parse_gpu_gres(&node.gres) {
                Ok(Some(gres)) => gres,
                Ok(None) => {
                    unmapped.push(Unmapped {
                        object: node.name,
                        reason: "no GPUs (no gpu GRES)".to_string(),
                    });
                    continue;
                }
                Err(message) => {
                    problems.push(Problem::new(node.name, ProblemKind::Unreadable, message));
                    continue;
                }
            };
            if let Some(reason) = node.unusable_reason() {
                unmapped.push(Unmapped {
                    object: node.name,
                    reason,
                });
                continue;
            }
            let Some(gpu_type) = self.gpu_type(&node, &gres, &mut problems) else {
                continue;
            };
            let Ok(gpus) = u32::try_from(gres.count) else {
                problems.push(Problem::new(
                    node.name.clone(),
                    ProblemKind::Unreadable,
                    format!("GRES {:?} declares {} GPUs", node.gres, gres.count),
                ));
                continue;
            };
            match locator.locate(&node.name) {
                Location::Placed { building, domain } => {
                    if domain.is_none() && spans_nodes(&gpu_type) {
                        unmapped.push(Unmapped {
                            object: node.name,
                            reason: format!(
                                "{gpu_type} NVLink domains span nodes, and {} does not say which nodes share one (use topology/block)",
                                locator.describe()
                            ),
                        });
                        continue;
                    }
                    placed.push(Placed {
                        name: node.name,
                        building,
                        scheduler_domain: domain,
                        gpus,
                        gpu_type,
                        partitions: node.partitions,
                    });
                }
                Location::Missing(reason) => unmapped.push(Unmapped {
                    object: node.name,
                    reason,
                }),
                Location::Reported => {}
            }
        }
        assemble(&self.settings, &self.describe(), placed, unmapped, problems)
    }

    /// The catalogue GPU type of a node, checking its GRES against its TRES.
    /// Problems are pushed and `None` returned when it has none.
    fn gpu_type(
        &self,
        node: &SlurmNode,
        gres: &gres::GpuGres,
        problems: &mut Vec<Problem>,
    ) -> Option<String> {
        let mut ok = true;
        if let Some(tres) = &node.tres {
            match gres::tres_gpu_count(tres) {
                Ok(Some(count)) if count != gres.count => {
                    problems.push(Problem::new(
                        node.name.clone(),
                        ProblemKind::GpuCountMismatch,
                        format!(
                            "node {} declares {} GPUs in GRES {:?} but {count} in its configured TRES (gres/gpu={count})",
                            node.name, gres.count, node.gres
                        ),
                    ));
                    ok = false;
                }
                Ok(_) => {}
                Err(message) => {
                    problems.push(Problem::new(
                        node.name.clone(),
                        ProblemKind::Unreadable,
                        message,
                    ));
                    ok = false;
                }
            }
        }
        let gpu_type = match gres.types.as_slice() {
            [Some(name)] => match self.names.resolve(name) {
                Some(gpu) => Some(gpu.to_string()),
                None => {
                    problems.push(Problem::new(
                        node.name.clone(),
                        ProblemKind::UnknownGpuType,
                        format!(
                            "node {}: {}",
                            node.name,
                            self.names.unknown(name, &format!("GRES {:?}", node.gres))
                        ),
                    ));
                    None
                }
            },
            [None] => match &self.config.untyped_gpu {
                Some(name) => self.names.resolve(name).map(str::to_string),
                None => {
                    problems.push(Problem::new(
                        node.name.clone(),
                        ProblemKind::UnknownGpuType,
                        format!(
                            "node {}: GRES {:?} gives no GPU type; declare it (gpu:h100:8) or set `inventory.slurm.untyped_gpu`",
                            node.name, node.gres
                        ),
                    ));
                    None
                }
            },
            types => {
                let names: Vec<String> = types
                    .iter()
                    .map(|t| t.clone().unwrap_or_else(|| "(untyped)".to_string()))
                    .collect();
                problems.push(Problem::new(
                    node.name.clone(),
                    ProblemKind::MixedGpuTypes,
                    format!(
                        "node {} has GPUs of several types ({}) in GRES {:?}; a scale-up domain has one GPU type",
                        node.name,
                        names.join(", "),
                        node.gres
                    ),
                ));
                None
            }
        };
        gpu_type.filter(|_| ok)
    }
}

impl InventorySource for SlurmSource {
    fn describe(&self) -> String {
        let nodes = match (&self.config.nodes_json, &self.config.nodes_text) {
            (Some(path), _) | (None, Some(path)) => format!("nodes {}", path.display()),
            (None, None) => format!("`{} show nodes`", self.config.scontrol),
        };
        let topology = match &self.config.topology_file {
            Some(path) => format!("topology {}", path.display()),
            None => format!("`{} show topology`", self.config.scontrol),
        };
        format!("slurm ({nodes}, {topology})")
    }

    fn discover(&self) -> Result<Inventory, InventoryError> {
        let nodes = self.read_nodes()?;
        let topology = self.read_topology()?;
        self.map(nodes, &topology)
    }
}

/// Where a node is.
enum Location {
    Placed {
        building: String,
        domain: Option<String>,
    },
    /// In no block or leaf switch; the reason says which.
    Missing(String),
    /// Not placeable for a reason already reported as a problem (in two
    /// blocks, a block in no building).
    Reported,
}

/// Node → building and scale-up domain, from the topology and the config.
enum Locator {
    Tree {
        leaf_of: BTreeMap<String, String>,
        building_of_leaf: BTreeMap<String, String>,
        conflicts: BTreeSet<String>,
    },
    Block {
        block_of: BTreeMap<String, String>,
        building_of_block: BTreeMap<String, String>,
        conflicts: BTreeSet<String>,
    },
    Flat {
        building: Option<String>,
    },
}

impl Locator {
    fn new(topology: &SlurmTopology, config: &SlurmConfig, problems: &mut Vec<Problem>) -> Self {
        // Switch or block name → building, from `buildings`. Lists that do
        // not expand are refused by config validation.
        let mut listed: BTreeMap<String, String> = BTreeMap::new();
        for (building, list) in &config.buildings {
            for name in hostlist::expand(list).unwrap_or_default() {
                listed.insert(name, building.clone());
            }
        }
        if !topology.blocks.is_empty() {
            let groups = topology.blocks.iter().map(|b| (b.name.as_str(), &b.nodes));
            let (block_of, conflicts) = members(groups, "blocks", problems);
            let mut building_of_block = BTreeMap::new();
            for block in &topology.blocks {
                let building = listed.get(&block.name).or(config.default_building.as_ref());
                match building {
                    Some(building) => {
                        building_of_block.insert(block.name.clone(), building.clone());
                    }
                    None => problems.push(Problem::new(
                        block.name.clone(),
                        ProblemKind::Building,
                        format!(
                            "block {} is in no building: list it under `inventory.slurm.buildings` or set `inventory.slurm.default_building`",
                            block.name
                        ),
                    )),
                }
            }
            return Self::Block {
                block_of,
                building_of_block,
                conflicts,
            };
        }
        if !topology.switches.is_empty() {
            let leaves = topology.switches.iter().filter(|s| s.switches.is_empty());
            let groups = leaves.clone().map(|s| (s.name.as_str(), &s.nodes));
            let (leaf_of, conflicts) = members(groups, "leaf switches", problems);
            let parents = parents(topology, problems);
            let building_of_leaf = leaves
                .filter_map(|leaf| {
                    let chain = chain(&leaf.name, &parents, problems)?;
                    let building = chain
                        .iter()
                        .find_map(|s| listed.get(s))
                        .or(config.default_building.as_ref())
                        .cloned()
                        .or_else(|| chain.last().cloned())?;
                    Some((leaf.name.clone(), building))
                })
                .collect();
            return Self::Tree {
                leaf_of,
                building_of_leaf,
                conflicts,
            };
        }
        if config.default_building.is_none() {
            problems.push(Problem::new(
                "topology",
                ProblemKind::Building,
                "Slurm shows no switches or blocks (topology/none): set `inventory.slurm.default_building` to put every node in one building",
            ));
        }
        Self::Flat {
            building: config.default_building.clone(),
        }
    }

    fn locate(&self, node: &str) -> Location {
        match self {
            Self::Tree {
                leaf_of,
                building_of_leaf,
                conflicts,
            } => {
                if conflicts.contains(node) {
                    return Location::Reported;
                }
                match leaf_of
                    .get(node)
                    .and_then(|leaf| building_of_leaf.get(leaf))
                {
                    Some(building) => Location::Placed {
                        building: building.clone(),
                        domain: None,
                    },
                    None => Location::Missing("in no leaf switch of the topology".to_string()),
                }
            }
            Self::Block {
                block_of,
                building_of_block,
                conflicts,
            } => {
                if conflicts.contains(node) {
                    return Location::Reported;
                }
                match block_of.get(node) {
                    Some(block) => match building_of_block.get(block) {
                        Some(building) => Location::Placed {
                            building: building.clone(),
                            domain: Some(block.clone()),
                        },
                        None => Location::Reported,
                    },
                    None => Location::Missing("in no block of the topology".to_string()),
                }
            }
            Self::Flat { building } => match building {
                Some(building) => Location::Placed {
                    building: building.clone(),
                    domain: None,
                },
                None => Location::Reported,
            },
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Self::Tree { .. } => "topology/tree",
            Self::Block { .. } => "topology/block",
            Self::Flat { .. } => "a cluster without topology",
        }
    }
}

/// Node → its group (block or leaf switch); nodes in two groups are
/// problems and returned as conflicts.
fn members<'a>(
    groups: impl Iterator<Item = (&'a str, &'a Vec<String>)>,
    what: &str,
    problems: &mut Vec<Problem>,
) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (group, nodes) in groups {
        for node in nodes {
            let groups = found.entry(node.clone()).or_default();
            if !groups.iter().any(|g| g == group) {
                groups.push(group.to_string());
            }
        }
    }
    let mut member_of = BTreeMap::new();
    let mut conflicts = BTreeSet::new();
    for (node, groups) in found {
        if groups.len() > 1 {
            problems.push(Problem::new(
                node.clone(),
                ProblemKind::InTwoDomains,
                format!(
                    "node {node} is in {} {what}: {}",
                    groups.len(),
                    Names(&groups)
                ),
            ));
            conflicts.insert(node);
        } else if let Some(group) = groups.into_iter().next() {
            member_of.insert(node, group);
        }
    }
    (member_of, conflicts)
}

/// Switch → parent switch. A switch under two others, or a child that is
/// not declared, is a problem.
fn parents(topology: &SlurmTopology, problems: &mut Vec<Problem>) -> BTreeMap<String, String> {
    let declared: BTreeSet<&str> = topology.switches.iter().map(|s| s.name.as_str()).collect();
    let mut parents: BTreeMap<String, String> = BTreeMap::new();
    for switch in &topology.switches {
        for child in &switch.switches {
            if !declared.contains(child.as_str()) {
                problems.push(Problem::new(
                    switch.name.clone(),
                    ProblemKind::Unreadable,
                    format!(
                        "switch {} lists switch {child}, which is not declared",
                        switch.name
                    ),
                ));
            } else if let Some(first) = parents.insert(child.clone(), switch.name.clone()) {
                problems.push(Problem::new(
                    child.clone(),
                    ProblemKind::Unreadable,
                    format!(
                        "switch {child} is under two switches: {first} and {}",
                        switch.name
                    ),
                ));
            }
        }
    }
    parents
}

/// A leaf and its ancestors up to the top-level switch; `None` (and a
/// problem) on a cycle.
fn chain(
    leaf: &str,
    parents: &BTreeMap<String, String>,
    problems: &mut Vec<Problem>,
) -> Option<Vec<String>> {
    let mut chain = vec![leaf.to_string()];
    let mut current = leaf;
    while let Some(parent) = parents.get(current) {
        if chain.contains(parent) {
            problems.push(Problem::new(
                parent.clone(),
                ProblemKind::Unreadable,
                format!("the switch hierarchy has a cycle through {parent}"),
            ));
            return None;
        }
        chain.push(parent.clone());
        current = parent;
    }
    Some(chain)
}
