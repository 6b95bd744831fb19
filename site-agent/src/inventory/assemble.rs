//! From placed nodes to an [`Inventory`]: scale-up domains checked for
//! consistency, identical domains folded into domain groups, every index
//! fixed by natural order, and the result checked by the core's own topology
//! rules.
//!
//! Order and ids are deterministic: buildings in natural order of their ids;
//! within a building, domains in natural order of their scheduler names (a
//! block, a clique, or the node itself); a domain group per distinct shape
//! (GPU type, nodes per domain, GPUs per node) in the order its first domain
//! appears, with the id `{gpu}-{nodes}x{gpus}` (`gb200-18x4`, `h100-1x8`);
//! domain indices in that same order within their group; nodes within a
//! domain in natural order of their names.

use std::collections::BTreeMap;

use longhaul_core::Topology;
use longhaul_core::config::{Segment, Validate, Violation};
use longhaul_core::topology::{Building, DomainGroup, Fabric, Location, Site};
use longhaul_core::units::DataRate;

use super::config::InventoryConfig;
use super::error::{InventoryError, Problem, ProblemKind};
use super::{Inventory, Node, Unmapped};
use crate::hostlist::{Names, natural_cmp, sort_natural};

/// A node a source has placed in a building and (optionally) a named
/// scale-up domain. `scheduler_domain: None` makes the node its own domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub name: String,
    pub building: String,
    pub scheduler_domain: Option<String>,
    pub gpus: u32,
    pub gpu_type: String,
    pub partitions: Vec<String>,
}

/// What a site is, beyond its nodes: from the agent's config, since no
/// scheduler knows fabrics or the campus interconnect.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteSettings {
    pub id: String,
    pub name: Option<String>,
    pub location: Option<Location>,
    pub campus_interconnect: Option<DataRate>,
    pub fabric: Option<Fabric>,
    pub building_fabrics: BTreeMap<String, Fabric>,
}

impl SiteSettings {
    pub fn from_config(config: &InventoryConfig) -> Self {
        Self {
            id: config.site.clone(),
            name: config.site_name.clone(),
            location: config.location,
            campus_interconnect: config.campus_interconnect,
            fabric: config.fabric,
            building_fabrics: config
                .buildings
                .iter()
                .map(|(id, b)| (id.clone(), b.fabric))
                .collect(),
        }
    }
}

/// One scale-up domain while it is being assembled.
struct Domain {
    key: String,
    named: bool,
    nodes: Vec<Placed>,
}

/// Builds the inventory, or reports every problem found (those passed in by
/// the source and those found here).
pub fn assemble(
    settings: &SiteSettings,
    source_name: &str,
    placed: Vec<Placed>,
    mut unmapped: Vec<Unmapped>,
    mut problems: Vec<Problem>,
) -> Result<Inventory, InventoryError> {
    unmapped.sort_by(|a, b| natural_cmp(&a.object, &b.object));

    // Nodes by scale-up domain.
    // Keyed by (named, key) so a block never merges with a node of the same name.
    let mut by_domain: BTreeMap<(bool, String), Domain> = BTreeMap::new();
    for node in placed {
        let (key, named) = match &node.scheduler_domain {
            Some(domain) => (domain.clone(), true),
            None => (node.name.clone(), false),
        };
        by_domain
            .entry((named, key.clone()))
            .or_insert_with(|| Domain {
                key,
                named,
                nodes: Vec::new(),
            })
            .nodes
            .push(node);
    }
    // Inconsistent domains are reported and left out, so that the folding
    // and the model checks below still run and every problem is reported
    // in one go.
    let mut domains: Vec<Domain> = by_domain.into_values().collect();
    for domain in &mut domains {
        domain.nodes.sort_by(|a, b| natural_cmp(&a.name, &b.name));
    }
    domains.retain(|domain| check_domain(domain, &mut problems));
    if domains.is_empty() {
        if !problems.is_empty() {
            return Err(invalid(source_name, problems));
        }
        return Err(InventoryError::Empty {
            source_name: source_name.to_string(),
            unmapped,
        });
    }
    domains.sort_by(|a, b| natural_cmp(&a.key, &b.key));

    // Domains by building (a domain's nodes share one building: checked).
    let mut building_ids: Vec<String> = Vec::new();
    let mut by_building: BTreeMap<String, Vec<Domain>> = BTreeMap::new();
    for domain in domains {
        let building = domain.nodes[0].building.clone();
        if !by_building.contains_key(&building) {
            building_ids.push(building.clone());
        }
        by_building.entry(building).or_default().push(domain);
    }
    sort_natural(&mut building_ids);
    let building_count = building_ids.len();

    let mut buildings = Vec::new();
    let mut nodes = Vec::new();
    // Scheduler names of each group's domains, for messages about a group.
    let mut group_domains: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for building_id in building_ids {
        let fabric = settings
            .building_fabrics
            .get(&building_id)
            .copied()
            .or(settings.fabric);
        let domains = by_building.remove(&building_id).unwrap_or_default();
        let mut groups: Vec<DomainGroup> = Vec::new();
        for domain in domains {
            let first = &domain.nodes[0];
            let nodes_per_domain = u32::try_from(domain.nodes.len()).unwrap_or(u32::MAX);
            let id = format!("{}-{}x{}", first.gpu_type, nodes_per_domain, first.gpus);
            let group = match groups.iter().position(|g| g.id == id) {
                Some(i) => &mut groups[i],
                None => {
                    groups.push(DomainGroup {
                        id: id.clone(),
                        count: 0,
                        nodes_per_domain,
                        gpus_per_node: first.gpus,
                        gpu: first.gpu_type.clone(),
                    });
                    let last = groups.len() - 1;
                    &mut groups[last]
                }
            };
            let index = u64::from(group.count);
            group.count += 1;
            let scheduler_domain = domain.named.then(|| domain.key.clone());
            group_domains
                .entry((building_id.clone(), id.clone()))
                .or_default()
                .push(domain.key.clone());
            for (n, placed) in domain.nodes.into_iter().enumerate() {
                nodes.push(Node {
                    name: placed.name,
                    building: building_id.clone(),
                    domain_group: id.clone(),
                    domain: index,
                    node: n as u64,
                    scheduler_domain: scheduler_domain.clone(),
                    gpus: placed.gpus,
                    gpu_type: placed.gpu_type,
                    partitions: placed.partitions,
                });
            }
        }
        match fabric {
            Some(fabric) => buildings.push(Building {
                id: building_id,
                fabric,
                domains: groups,
            }),
            None => problems.push(Problem::new(
                building_id.clone(),
                ProblemKind::Building,
                format!(
                    "building {building_id:?} has no fabric: set `inventory.fabric` or \
                     `inventory.buildings.{building_id}.fabric` (schedulers do not know fabrics)"
                ),
            )),
        }
    }
    // Without a fabric a building is left out of the site; the model checks
    // would then report the gap again, in the core's words.
    let fabric_missing = buildings.len() < building_count;

    let site = Site {
        id: settings.id.clone(),
        name: settings.name.clone(),
        location: settings.location,
        campus_interconnect: settings.campus_interconnect,
        buildings,
    };
    if !fabric_missing {
        check_model(&site, &group_domains, &nodes, &mut problems);
    }
    if !problems.is_empty() {
        return Err(invalid(source_name, problems));
    }
    Ok(Inventory {
        site,
        nodes,
        unmapped,
    })
}

/// The nodes of one domain must share a building, a GPU type and a GPU
/// count. The most common shape wins (ties: the first node's); every node
/// that differs is named. True when the domain is consistent.
fn check_domain(domain: &Domain, problems: &mut Vec<Problem>) -> bool {
    let first = &domain.nodes[0];
    if let Some(other) = domain.nodes.iter().find(|n| n.building != first.building) {
        problems.push(Problem::new(
            domain.key.clone(),
            ProblemKind::DomainSpansBuildings,
            format!(
                "scale-up domain {:?} spans buildings: node {} is in {:?}, node {} in {:?}",
                domain.key, first.name, first.building, other.name, other.building
            ),
        ));
        return false;
    }
    let mut shapes: Vec<((&str, u32), usize)> = Vec::new();
    for node in &domain.nodes {
        let shape = (node.gpu_type.as_str(), node.gpus);
        match shapes.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, count)) => *count += 1,
            None => shapes.push((shape, 1)),
        }
    }
    let Some(&((gpu_type, gpus), agreeing)) = shapes.iter().rev().max_by_key(|(_, count)| *count)
    else {
        return false;
    };
    let mut consistent = true;
    for node in &domain.nodes {
        if (node.gpu_type.as_str(), node.gpus) != (gpu_type, gpus) {
            consistent = false;
            problems.push(Problem::new(
                node.name.clone(),
                ProblemKind::DomainMismatch,
                format!(
                    "node {} has {} × {} GPUs but {} other node(s) of scale-up domain {:?} have {} × {}",
                    node.name, node.gpus, node.gpu_type, agreeing, domain.key, gpus, gpu_type
                ),
            ));
        }
    }
    consistent
}

/// Runs the core's topology validation on the site (as a one-site topology)
/// and turns its violations into problems that name the building, the
/// domain group, its scheduler domains and a node.
fn check_model(
    site: &Site,
    group_domains: &BTreeMap<(String, String), Vec<String>>,
    nodes: &[Node],
    problems: &mut Vec<Problem>,
) {
    let topology = Topology {
        name: format!("inventory of {}", site.id),
        gpu_types: Vec::new(),
        sites: vec![site.clone()],
        links: Vec::new(),
    };
    for Violation { path, message } in topology.violations() {
        let (mut building, mut group) = (None, None);
        let mut segments = path.segments().iter().peekable();
        while let Some(segment) = segments.next() {
            if let (Segment::Key(key), Some(Segment::Index(i))) = (segment, segments.peek()) {
                match key.as_str() {
                    "buildings" => building = site.buildings.get(*i),
                    "domains" => group = building.and_then(|b| b.domains.get(*i)),
                    _ => {}
                }
            }
        }
        let problem = match (building, group) {
            (Some(building), Some(group)) => {
                let key = (building.id.clone(), group.id.clone());
                let names = group_domains.get(&key).map(Vec::as_slice).unwrap_or(&[]);
                let first_node = nodes
                    .iter()
                    .find(|n| n.building == building.id && n.domain_group == group.id)
                    .map(|n| n.name.as_str())
                    .unwrap_or("?");
                Problem::new(
                    names.first().cloned().unwrap_or_else(|| group.id.clone()),
                    ProblemKind::ModelRule,
                    format!(
                        "scale-up domain(s) {} (building {}, group {}, first node {}): {}",
                        Names(names),
                        building.id,
                        group.id,
                        first_node,
                        message
                    ),
                )
            }
            (Some(building), None) => {
                let kind = if path.to_string().ends_with(".id") {
                    ProblemKind::Building
                } else {
                    ProblemKind::ModelRule
                };
                let first_node = nodes
                    .iter()
                    .find(|n| n.building == building.id)
                    .map(|n| n.name.as_str())
                    .unwrap_or("?");
                Problem::new(
                    building.id.clone(),
                    kind,
                    format!(
                        "building {:?} (first node {first_node}): {message} (building ids come from the scheduler; map them with the source's `buildings` setting)",
                        building.id
                    ),
                )
            }
            _ => Problem::new(
                site.id.clone(),
                ProblemKind::ModelRule,
                format!(
                    "site {:?} ({path}): {message}; set it in `[inventory]`",
                    site.id
                ),
            ),
        };
        problems.push(problem);
    }
}

fn invalid(source_name: &str, mut problems: Vec<Problem>) -> InventoryError {
    problems.sort_by(|a, b| {
        natural_cmp(&a.object, &b.object)
            .then(a.kind.cmp(&b.kind))
            .then(a.message.cmp(&b.message))
    });
    problems.dedup();
    InventoryError::Invalid {
        source_name: source_name.to_string(),
        problems,
    }
}

/// Reports names seen more than once, each once.
pub fn check_duplicates<'a>(
    names: impl IntoIterator<Item = &'a str>,
    what: &str,
    problems: &mut Vec<Problem>,
) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for name in names {
        *seen.entry(name).or_default() += 1;
    }
    for (name, count) in seen {
        if count > 1 {
            problems.push(Problem::new(
                name,
                ProblemKind::DuplicateNode,
                format!("node {name} appears {count} times in {what}"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_core::topology::FabricKind;

    fn settings() -> SiteSettings {
        SiteSettings {
            id: "north".to_string(),
            name: None,
            location: None,
            campus_interconnect: None,
            fabric: Some(Fabric {
                kind: FabricKind::RailAligned,
                link_rate: DataRate::from_gbit_per_second(400),
                oversubscription: 1.0,
            }),
            building_fabrics: BTreeMap::new(),
        }
    }

    fn node(name: &str, domain: Option<&str>, gpus: u32, gpu: &str) -> Placed {
        Placed {
            name: name.to_string(),
            building: "dh1".to_string(),
            scheduler_domain: domain.map(str::to_string),
            gpus,
            gpu_type: gpu.to_string(),
            partitions: Vec::new(),
        }
    }

    #[test]
    fn identical_domains_fold_in_natural_order() {
        let placed = vec![
            node("n10", None, 8, "h100"),
            node("n2", None, 8, "h100"),
            node("b10-1", Some("block10"), 4, "gb200"),
            node("b10-2", Some("block10"), 4, "gb200"),
            node("b9-2", Some("block9"), 4, "gb200"),
            node("b9-1", Some("block9"), 4, "gb200"),
        ];
        let inventory = assemble(&settings(), "test", placed, Vec::new(), Vec::new()).unwrap();
        let groups = &inventory.site.buildings[0].domains;
        let shapes: Vec<(&str, u32)> = groups.iter().map(|g| (g.id.as_str(), g.count)).collect();
        assert_eq!(shapes, [("gb200-2x4", 2), ("h100-1x8", 2)]);
        let order: Vec<(&str, u64, u64)> = inventory
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.domain, n.node))
            .collect();
        assert_eq!(
            order,
            [
                ("b9-1", 0, 0),
                ("b9-2", 0, 1),
                ("b10-1", 1, 0),
                ("b10-2", 1, 1),
                ("n2", 0, 0),
                ("n10", 1, 0)
            ]
        );
        assert_eq!(
            inventory
                .node_at("dh1", "gb200-2x4", 1, 0)
                .map(|n| n.name.as_str()),
            Some("b10-1")
        );
    }

    #[test]
    fn a_node_unlike_its_domain_is_named() {
        let placed = vec![
            node("a1", Some("rack1"), 4, "gb200"),
            node("a2", Some("rack1"), 2, "gb200"),
            node("a3", Some("rack1"), 4, "gb200"),
        ];
        let error = assemble(&settings(), "test", placed, Vec::new(), Vec::new()).unwrap_err();
        let problems = error.problems();
        assert_eq!(problems.len(), 1, "{error}");
        assert_eq!(problems[0].object, "a2");
        assert_eq!(problems[0].kind, ProblemKind::DomainMismatch);
        assert!(problems[0].message.contains("2 other node(s)"), "{error}");
    }

    #[test]
    fn the_core_rules_apply_to_the_folded_site() {
        // Two 8-GPU H100 nodes in one named domain: 16 GPUs, beyond NVLink's 8.
        let placed = vec![
            node("h1", Some("hgx-pair"), 8, "h100"),
            node("h2", Some("hgx-pair"), 8, "h100"),
        ];
        let error = assemble(&settings(), "test", placed, Vec::new(), Vec::new()).unwrap_err();
        let problems = error.problems();
        assert_eq!(problems.len(), 1, "{error}");
        assert_eq!(problems[0].object, "hgx-pair");
        assert_eq!(problems[0].kind, ProblemKind::ModelRule);
        assert!(problems[0].message.contains("first node h1"), "{error}");
        assert!(problems[0].message.contains("scale-up reach"), "{error}");
    }

    #[test]
    fn problems_of_every_stage_are_reported_together() {
        let placed = vec![
            node("a1", Some("rack1"), 4, "gb200"),
            node("a2", Some("rack1"), 2, "gb200"),
            node("h1", Some("hgx-pair"), 8, "h100"),
            node("h2", Some("hgx-pair"), 8, "h100"),
        ];
        let earlier = vec![Problem::new(
            "x1",
            ProblemKind::UnknownGpuType,
            "from the source",
        )];
        let error = assemble(&settings(), "test", placed.clone(), Vec::new(), earlier).unwrap_err();
        let found: Vec<(&str, ProblemKind)> = error
            .problems()
            .iter()
            .map(|p| (p.object.as_str(), p.kind))
            .collect();
        assert_eq!(
            found,
            [
                ("a2", ProblemKind::DomainMismatch),
                ("hgx-pair", ProblemKind::ModelRule),
                ("x1", ProblemKind::UnknownGpuType),
            ]
        );

        let mut no_fabric = settings();
        no_fabric.fabric = None;
        let error = assemble(&no_fabric, "test", placed, Vec::new(), Vec::new()).unwrap_err();
        let found: Vec<(&str, ProblemKind)> = error
            .problems()
            .iter()
            .map(|p| (p.object.as_str(), p.kind))
            .collect();
        assert_eq!(
            found,
            [
                ("a2", ProblemKind::DomainMismatch),
                ("dh1", ProblemKind::Building),
            ]
        );
    }

    #[test]
    fn a_building_without_fabric_is_named() {
        let mut settings = settings();
        settings.fabric = None;
        let error = assemble(
            &settings,
            "test",
            vec![node("n1", None, 8, "h100")],
            Vec::new(),
            Vec::new(),
        )
        .unwrap_err();
        assert_eq!(error.problems()[0].object, "dh1");
        assert_eq!(error.problems()[0].kind, ProblemKind::Building);
    }
}
