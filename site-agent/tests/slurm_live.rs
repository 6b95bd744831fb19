//! The Slurm source against a real Slurm: munged, slurmctld and slurmd on
//! this machine, configured from `deploy/slurm/` by `.ci/start-slurm`. The
//! agent runs the real `scontrol` (with deadlines), and its inventory must be
//! what `slurm.conf`, `gres.conf` and `topology.conf` declare; the
//! expectations are read from those files here.
//!
//! Without a reachable Slurm the test says why and passes, unless
//! `LONGHAUL_REQUIRE_SLURM` is set (CI sets it, so there it must run).

use std::collections::BTreeMap;
use std::path::Path;

use longhaul_core::topology::{Fabric, FabricKind};
use longhaul_core::units::{DataRate, Duration};
use longhaul_site_agent::assignment::{MODE_PIPELINE, RankBinding, SiteAssignment};
use longhaul_site_agent::hostlist;
use longhaul_site_agent::inventory::{
    Inventory, InventoryConfig, InventoryError, SlurmConfig, source_from_config,
};
use longhaul_site_agent::render::slurm::{SlurmSubmitOptions, submit};
use longhaul_site_agent::render::{RenderOptions, write_dry_run};

const REQUIRE: &str = "LONGHAUL_REQUIRE_SLURM";

/// A node as `deploy/slurm/slurm.conf` declares it.
#[derive(Debug)]
struct Declared {
    name: String,
    /// GPU type and count from `Gres=gpu:<type>:<count>`.
    gpus: Option<(String, u32)>,
    /// Declared `State=DOWN`: never started, so never usable.
    down: bool,
    partitions: Vec<String>,
    /// The top-level switch above the node's leaf in `topology.conf`.
    building: Option<String>,
}

fn conf(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/slurm")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `Key=Value` records of a Slurm config file (keys lowercased).
fn records(text: &str) -> Vec<BTreeMap<String, String>> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            line.split_whitespace()
                .filter_map(|token| token.split_once('='))
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                .collect()
        })
        .collect()
}

fn expand(list: &str) -> Vec<String> {
    hostlist::expand(list).unwrap_or_else(|e| panic!("{e}"))
}

fn declared_nodes() -> Vec<Declared> {
    let slurm = records(&conf("slurm.conf"));
    let topology = records(&conf("topology.conf"));
    let gres = records(&conf("gres.conf"));
    let partitions: Vec<(String, String)> = slurm
        .iter()
        .filter_map(|r| Some((r.get("partitionname")?.clone(), r.get("nodes")?.clone())))
        .collect();
    let switch = |key: &str, member: &str| {
        topology.iter().find_map(|r| {
            let members = expand(r.get(key)?);
            members
                .iter()
                .any(|m| m == member)
                .then(|| r.get("switchname").cloned())?
        })
    };
    let mut nodes = Vec::new();
    for record in &slurm {
        let Some(list) = record.get("nodename") else {
            continue;
        };
        for name in expand(list) {
            let gpus = record.get("gres").and_then(|g| {
                let mut parts = g.split(':');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("gpu"), Some(gpu), Some(count)) => {
                        Some((gpu.to_string(), count.parse().expect("a GPU count")))
                    }
                    _ => None,
                }
            });
            if let Some((gpu, count)) = &gpus {
                // gres.conf must give the node as many device files as
                // slurm.conf declares GPUs, or slurmd reports fewer.
                let files: usize = gres
                    .iter()
                    .filter(|r| r.get("name").map(String::as_str) == Some("gpu"))
                    .filter(|r| r.get("type") == Some(gpu))
                    .filter(|r| r.get("nodename").is_some_and(|n| expand(n).contains(&name)))
                    .map(|r| expand(r.get("file").map_or("", String::as_str)).len())
                    .sum();
                assert_eq!(files, *count as usize, "gres.conf files for {name}");
            }
            let mut top = switch("nodes", &name);
            while let Some(parent) = top.as_deref().and_then(|leaf| switch("switches", leaf)) {
                top = Some(parent);
            }
            nodes.push(Declared {
                partitions: partitions
                    .iter()
                    .filter(|(_, members)| members == "ALL" || expand(members).contains(&name))
                    .map(|(partition, _)| partition.clone())
                    .collect(),
                name,
                gpus,
                down: record.get("state").map(String::as_str) == Some("DOWN"),
                building: top,
            });
        }
    }
    nodes
}

/// The inventory of the running Slurm, or `None` (with the reason printed)
/// when there is none and none is required.
fn live_inventory() -> Option<(Inventory, String)> {
    let mut slurm = SlurmConfig {
        timeout: Duration::from_secs(20),
        ..SlurmConfig::default()
    };
    if let Ok(scontrol) = std::env::var("LONGHAUL_SCONTROL") {
        slurm.scontrol = scontrol;
    }
    let fabric = Fabric {
        kind: FabricKind::LeafSpine,
        link_rate: DataRate::from_gbit_per_second(100),
        oversubscription: 1.0,
    };
    let config = InventoryConfig::slurm("ci", fabric, slurm);
    let source = source_from_config(&config).expect("a valid config");
    match source.discover() {
        Ok(inventory) => Some((inventory, source.describe())),
        Err(error @ InventoryError::Command { .. }) => {
            let why = format!("no reachable Slurm ({error}); start one with .ci/start-slurm");
            assert!(
                std::env::var_os(REQUIRE).is_none(),
                "{REQUIRE} is set but {why}"
            );
            println!("skipped: {why}");
            None
        }
        Err(error) => panic!("{}: {error}", source.describe()),
    }
}

#[test]
fn inventory_from_a_running_slurm_matches_its_config() {
    let Some((inventory, source)) = live_inventory() else {
        return;
    };

    let declared = declared_nodes();
    assert!(declared.iter().any(|n| n.gpus.is_some() && !n.down));

    // Every node is mapped or unmapped, as its declaration says.
    let mut expected_groups: BTreeMap<(String, String), u32> = BTreeMap::new();
    for node in &declared {
        match (&node.gpus, node.down, &node.building) {
            (None, _, _) => assert_eq!(
                inventory.unmapped_reason(&node.name),
                Some("no GPUs (no gpu GRES)"),
                "{node:?}"
            ),
            (Some(_), true, _) => {
                let reason = inventory.unmapped_reason(&node.name).unwrap_or("");
                assert!(reason.starts_with("state DOWN"), "{node:?}: {reason:?}");
            }
            (Some((gpu, count)), false, Some(building)) => {
                let mapped = inventory
                    .node(&node.name)
                    .unwrap_or_else(|| panic!("{} is not mapped: {inventory:#?}", node.name));
                let group = format!("{gpu}-1x{count}");
                assert_eq!(mapped.building, *building);
                assert_eq!(mapped.domain_group, group);
                assert_eq!(
                    (mapped.gpus, mapped.gpu_type.as_str()),
                    (*count, gpu.as_str())
                );
                assert_eq!(mapped.partitions, node.partitions);
                assert_eq!(mapped.scheduler_domain, None);
                *expected_groups
                    .entry((building.clone(), group))
                    .or_default() += 1;
            }
            (Some(_), false, None) => panic!("{} is in no switch of topology.conf", node.name),
        }
    }
    assert_eq!(
        inventory.nodes.len() + inventory.unmapped.len(),
        declared.len()
    );

    // The compressed site: one group per building and shape.
    let groups: BTreeMap<(String, String), u32> = inventory
        .site
        .buildings
        .iter()
        .flat_map(|b| {
            b.domains
                .iter()
                .map(|g| ((b.id.clone(), g.id.clone()), g.count))
        })
        .collect();
    assert_eq!(groups, expected_groups);
    for node in &inventory.nodes {
        assert_eq!(
            inventory
                .node_at(&node.building, &node.domain_group, node.domain, node.node)
                .map(|n| n.name.as_str()),
            Some(node.name.as_str())
        );
    }
    println!(
        "{}: {} mapped node(s), {} GPU(s), unmapped: {:?}",
        source,
        inventory.nodes.len(),
        inventory.gpus(),
        inventory.unmapped
    );
}

/// Runs a Slurm client command; its stdout.
fn slurm(program: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An assignment rendered for the live inventory is a batch script the real
/// `sbatch` accepts: submitted held, checked with `scontrol`, cancelled.
#[test]
fn a_rendered_assignment_is_accepted_by_the_real_sbatch() {
    let Some((inventory, _)) = live_inventory() else {
        return;
    };
    let node = inventory.nodes.first().expect("a mapped GPU node");
    let assignment = SiteAssignment {
        job_id: "live-check".into(),
        site_id: inventory.site.id.clone(),
        revision: 1,
        world_size: u64::from(node.gpus),
        tensor_parallel: node.gpus,
        pipeline_parallel: 1,
        data_parallel: 1,
        expert_parallel: 1,
        mode: MODE_PIPELINE.into(),
        inner_steps: 0,
        stages: vec![0],
        replicas: vec![0],
        ranks: (0..node.gpus)
            .map(|gpu| RankBinding {
                rank: u64::from(gpu),
                building: node.building.clone(),
                domain_group: node.domain_group.clone(),
                domain: node.domain,
                node: node.node,
                gpu,
            })
            .collect(),
    };
    let dir = tempfile::tempdir().unwrap();
    let files = write_dry_run(
        dir.path(),
        &assignment,
        &inventory,
        &RenderOptions::default(),
    )
    .expect("rendered");
    let script = files
        .iter()
        .find(|f| f.extension().is_some_and(|e| e == "sbatch"))
        .expect("a batch script");
    let job = submit(
        script,
        &SlurmSubmitOptions {
            args: vec!["--hold".into()],
            timeout: std::time::Duration::from_secs(30),
            ..SlurmSubmitOptions::default()
        },
    )
    .expect("sbatch accepts the rendered script");
    let id = job.job_id.to_string();
    let shown = slurm("scontrol", &["-o", "show", "job", &id]);
    slurm("scancel", &[&id]);
    assert!(shown.contains("JobName=longhaul-live-check-"), "{shown}");
    assert!(
        shown.contains(&format!("ReqNodeList={}", node.name)),
        "{shown}"
    );
    assert!(shown.contains("NumNodes=1"), "{shown}");
    assert!(shown.contains("JobState=PENDING"), "{shown}");
    println!("sbatch accepted the rendered script as job {id}: {shown}");
}
