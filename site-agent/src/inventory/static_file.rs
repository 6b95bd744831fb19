//! The static source: one site of a topology file, with its domain groups
//! expanded into nodes named
//! `{site}-{building}-{group}-{domain:03}-{node:02}` (domain and node
//! indices from 0). The file is parsed and validated by the core, so it is
//! the same format and the same rules as `deploy/examples/*.toml`.

use std::path::PathBuf;

use longhaul_core::Topology;

use super::{Inventory, InventoryError, InventorySource, Node, read_file};

/// Reads a topology file and takes one site from it.
#[derive(Debug, Clone)]
pub struct StaticSource {
    pub file: PathBuf,
    pub site: String,
}

impl InventorySource for StaticSource {
    fn describe(&self) -> String {
        format!(
            "static topology {} (site {})",
            self.file.display(),
            self.site
        )
    }

    fn discover(&self) -> Result<Inventory, InventoryError> {
        let text = read_file(&self.file)?;
        let file = self.file.display().to_string();
        let topology = Topology::from_toml(&file, &text)?;
        let site =
            topology
                .site(&self.site)
                .cloned()
                .ok_or_else(|| InventoryError::SiteNotFound {
                    file: file.clone(),
                    site: self.site.clone(),
                    available: format!(
                        "sites {}",
                        topology
                            .sites
                            .iter()
                            .map(|s| format!("{:?}", s.id))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })?;
        Ok(Inventory {
            nodes: expand(&site),
            site,
            unmapped: Vec::new(),
        })
    }
}

/// Every node of a site, in (building, group, domain, node) order.
pub fn expand(site: &longhaul_core::topology::Site) -> Vec<Node> {
    let mut nodes = Vec::new();
    for building in &site.buildings {
        for group in &building.domains {
            for domain in 0..u64::from(group.count) {
                let domain_name = format!("{}-{}-{}-{domain:03}", site.id, building.id, group.id);
                for node in 0..u64::from(group.nodes_per_domain) {
                    nodes.push(Node {
                        name: format!("{domain_name}-{node:02}"),
                        building: building.id.clone(),
                        domain_group: group.id.clone(),
                        domain,
                        node,
                        scheduler_domain: (group.nodes_per_domain > 1).then(|| domain_name.clone()),
                        gpus: group.gpus_per_node,
                        gpu_type: group.gpu.clone(),
                        partitions: Vec::new(),
                    });
                }
            }
        }
    }
    nodes
}
