//! The Kubernetes source: nodes and their labels from a node list
//! (`kubectl get nodes -o json`, run with a deadline, or a recorded file).
//!
//! What each node contributes:
//!
//! - GPUs: the `nvidia.com/gpu.count` label (GPU feature discovery) and the
//!   `nvidia.com/gpu` capacity (device plugin); when both are given they must
//!   agree. A node with neither is unmapped (CPU and control-plane nodes).
//! - GPU type: `nvidia.com/gpu.product` (`NVIDIA-H100-80GB-HBM3`,
//!   `NVIDIA-GB200`) through the alias table; missing or unknown is an error.
//! - Scale-up domain: `nvidia.com/gpu.clique` (`<clusterUUID>.<cliqueId>`,
//!   one NVLink partition of a GB200 rack); else the configured
//!   `domain_label`; else the node itself when its GPU's NVLink stays inside
//!   a node (HGX). A GB200 node with neither label is unmapped: its domain is
//!   unknown and the agent does not guess it.
//! - Building: the `building_label` value (default
//!   `topology.kubernetes.io/zone`), through `buildings` when configured;
//!   else `default_building`; else unmapped.
//! - Not Ready or cordoned (`spec.unschedulable`) → unmapped with why.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::assemble::{Placed, SiteSettings, assemble, check_duplicates};
use super::config::{InventoryConfig, KubernetesConfig};
use super::error::{Problem, ProblemKind};
use super::gpu::{GpuNames, spans_nodes};
use super::{Inventory, InventoryError, InventorySource, Unmapped, command, read_file};
use crate::hostlist::natural_cmp;

pub const GPU_COUNT_LABEL: &str = "nvidia.com/gpu.count";
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
pub const GPU_CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Discovers a site's inventory from Kubernetes.
#[derive(Debug, Clone)]
pub struct KubernetesSource {
    settings: SiteSettings,
    config: KubernetesConfig,
    names: GpuNames,
}

/// The parts of a `v1.NodeList` the inventory reads.
#[derive(Debug, Deserialize)]
pub struct NodeList {
    pub items: Vec<KubeNode>,
}

#[derive(Debug, Deserialize)]
pub struct KubeNode {
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
    #[serde(default)]
    pub status: Status,
}

#[derive(Debug, Deserialize)]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    pub unschedulable: bool,
}

#[derive(Debug, Default, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub capacity: BTreeMap<String, String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Deserialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// Reads a node list.
pub fn parse_node_list(what: &str, text: &str) -> Result<NodeList, InventoryError> {
    serde_json::from_str(text).map_err(|e| InventoryError::Malformed {
        what: what.to_string(),
        message: format!("not a Kubernetes node list (`kubectl get nodes -o json`): {e}"),
    })
}

impl KubernetesSource {
    pub fn new(config: &InventoryConfig) -> Self {
        Self {
            settings: SiteSettings::from_config(config),
            config: config.kubernetes.clone().unwrap_or_default(),
            names: GpuNames::new(&config.gpu_aliases),
        }
    }

    fn kubectl_args(&self) -> Vec<&str> {
        self.config
            .kubectl_args
            .iter()
            .map(String::as_str)
            .chain(["get", "nodes", "-o", "json"])
            .collect()
    }

    /// The node list, from the recorded file or from `kubectl`.
    pub fn read_nodes(&self) -> Result<NodeList, InventoryError> {
        if let Some(path) = &self.config.nodes_json {
            return parse_node_list(&path.display().to_string(), &read_file(path)?);
        }
        let args = self.kubectl_args();
        let timeout: std::time::Duration = self.config.timeout.into();
        let text = command::run(&self.config.kubectl, &args, timeout)?;
        parse_node_list(&command::display(&self.config.kubectl, &args), &text)
    }

    /// Maps a node list into an inventory.
    pub fn map(&self, list: NodeList) -> Result<Inventory, InventoryError> {
        let mut problems = Vec::new();
        let mut unmapped = Vec::new();
        let mut placed = Vec::new();
        check_duplicates(
            list.items.iter().map(|n| n.metadata.name.as_str()),
            "the node list",
            &mut problems,
        );
        let building_of_value: BTreeMap<&str, &str> = self
            .config
            .buildings
            .iter()
            .flat_map(|(building, values)| {
                values.iter().map(move |v| (v.as_str(), building.as_str()))
            })
            .collect();

        let mut items = list.items;
        items.sort_by(|a, b| natural_cmp(&a.metadata.name, &b.metadata.name));
        let mut seen = BTreeSet::new();
        for node in items {
            let name = node.metadata.name.clone();
            if !seen.insert(name.clone()) {
                continue;
            }
            match self.place(&node, &building_of_value, &mut problems) {
                Ok(Some(p)) => placed.push(p),
                Ok(None) => {}
                Err(reason) => unmapped.push(Unmapped {
                    object: name,
                    reason,
                }),
            }
        }
        assemble(&self.settings, &self.describe(), placed, unmapped, problems)
    }

    /// `Ok(Some)` placed, `Ok(None)` when problems were pushed, `Err(reason)`
    /// when the node is left unmapped.
    fn place(
        &self,
        node: &KubeNode,
        building_of_value: &BTreeMap<&str, &str>,
        problems: &mut Vec<Problem>,
    ) -> Result<Option<Placed>, String> {
        let name = &node.metadata.name;
        let labels = &node.metadata.labels;
        let count = |value: Option<&String>, what: &str, problems: &mut Vec<Problem>| {
            value.and_then(|v| match v.trim().parse::<u32>() {
                Ok(count) => Some(count),
                Err(_) => {
                    problems.push(Problem::new(
                        name.clone(),
                        ProblemKind::Unreadable,
                        format!("node {name}: {what} {v:?} is not a GPU count"),
                    ));
                    None
                }
            })
        };
        let problems_before = problems.len();
        let label_count = count(labels.get(GPU_COUNT_LABEL), GPU_COUNT_LABEL, problems);
        let capacity = count(
            node.status.capacity.get(GPU_RESOURCE),
            "capacity nvidia.com/gpu",
            problems,
        );
        if problems.len() > problems_before {
            return Ok(None);
        }
        if label_count.unwrap_or(0) == 0 && capacity.unwrap_or(0) == 0 {
            return Err(format!(
                "no GPUs (no {GPU_RESOURCE} capacity or {GPU_COUNT_LABEL} label)"
            ));
        }

        let ready = node.status.conditions.iter().find(|c| c.kind == "Ready");
        match ready {
            Some(c) if c.status == "True" => {}
            Some(c) => {
                return Err(format!(
                    "not Ready (Ready={}{})",
                    c.status,
                    c.reason
                        .as_deref()
                        .map(|r| format!(", {r}"))
                        .unwrap_or_default()
                ));
            }
            None => return Err("no Ready condition in its status".to_string()),
        }
        if node.spec.unschedulable {
            return Err("cordoned (spec.unschedulable)".to_string());
        }

        let gpus = label_count.or(capacity).unwrap_or(0);
        let mut ok = true;
        if let (Some(label), Some(capacity)) = (label_count, capacity)
            && label != capacity
        {
            problems.push(Problem::new(
                name.clone(),
                ProblemKind::GpuCountMismatch,
                format!(
                    "node {name}: label {GPU_COUNT_LABEL}={label} but capacity {GPU_RESOURCE}={capacity}"
                ),
            ));
            ok = false;
        }
        let gpu_type = match labels.get(GPU_PRODUCT_LABEL) {
            Some(product) => match self.names.resolve(product) {
                Some(gpu) => Some(gpu.to_string()),
                None => {
                    problems.push(Problem::new(
                        name.clone(),
                        ProblemKind::UnknownGpuType,
                        format!(
                            "node {name}: {}",
                            self.names
                                .unknown(product, &format!("label {GPU_PRODUCT_LABEL}"))
                        ),
                    ));
                    None
                }
            },
            None => {
                problems.push(Problem::new(
                    name.clone(),
                    ProblemKind::UnknownGpuType,
                    format!(
                        "node {name} has {gpus} GPUs but no {GPU_PRODUCT_LABEL} label (is GPU feature discovery running?)"
                    ),
                ));
                None
            }
        };
        let Some(gpu_type) = gpu_type.filter(|_| ok) else {
            return Ok(None);
        };

        let building = match labels.get(&self.config.building_label) {
            Some(value) => building_of_value
                .get(value.as_str())
                .map_or_else(|| value.clone(), |b| b.to_string()),
            None => match &self.config.default_building {
                Some(building) => building.clone(),
                None => {
                    return Err(format!(
                        "no {} label and no `inventory.kubernetes.default_building`",
                        self.config.building_label
                    ));
                }
            },
        };

        let domain = labels.get(GPU_CLIQUE_LABEL).or_else(|| {
            self.config
                .domain_label
                .as_ref()
                .and_then(|label| labels.get(label))
        });
        if domain.is_none() && spans_nodes(&gpu_type) {
            return Err(format!(
                "{gpu_type} NVLink domains span nodes, and the node has no {GPU_CLIQUE_LABEL}{} label to say which",
                self.config
                    .domain_label
                    .as_ref()
                    .map(|l| format!(" or {l}"))
                    .unwrap_or_default()
            ));
        }
        let partitions = self
            .config
            .pool_label
            .as_ref()
            .and_then(|label| labels.get(label))
            .map(|pool| vec![pool.clone()])
            .unwrap_or_default();
        Ok(Some(Placed {
            name: name.clone(),
            building,
            scheduler_domain: domain.cloned(),
            gpus,
            gpu_type,
            partitions,
        }))
    }
}

impl InventorySource for KubernetesSource {
    fn describe(&self) -> String {
        match &self.config.nodes_json {
            Some(path) => format!("kubernetes (node list {})", path.display()),
            None => format!(
                "kubernetes (`{}`)",
                command::display(&self.config.kubectl, &self.kubectl_args())
            ),
        }
    }

    fn discover(&self) -> Result<Inventory, InventoryError> {
        let list = self.read_nodes()?;
        self.map(list)
    }
}
