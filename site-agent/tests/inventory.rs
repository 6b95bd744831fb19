//! Inventory sources against recorded scheduler output (`tests/fixtures/`,
//! made by `fixtures/generate.py`, plus real Slurm 22.05 output recorded on
//! the CI machine) and the example topologies. The live Slurm test is
//! `slurm_live.rs`.
//!
//! Modules: `slurm` (block and tree layouts, both output formats, the
//! command path), `kubernetes`, `bad_inventory` (every error names its
//! node), `static_source`, `config`.

use std::path::{Path, PathBuf};

use longhaul_core::topology::{Fabric, FabricKind};
use longhaul_core::units::DataRate;
use longhaul_site_agent::inventory::{
    Inventory, InventoryConfig, InventoryError, ProblemKind, source_from_config,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn rail_aligned() -> Fabric {
    Fabric {
        kind: FabricKind::RailAligned,
        link_rate: DataRate::from_gbit_per_second(400),
        oversubscription: 1.0,
    }
}

/// Parses an `[inventory]` table with paths relative to the fixtures, and
/// discovers.
fn discover_toml(toml: &str) -> Result<Inventory, InventoryError> {
    let mut config = InventoryConfig::from_toml("test.toml", toml)
        .unwrap_or_else(|e| panic!("config does not parse: {e}"));
    config.resolve_paths(&fixtures());
    source_from_config(&config)?.discover()
}

/// (group id, count, nodes per domain, GPUs per node, GPU) of a building.
fn groups(inventory: &Inventory, building: &str) -> Vec<(String, u32, u32, u32, String)> {
    let building = inventory
        .site
        .buildings
        .iter()
        .find(|b| b.id == building)
        .unwrap_or_else(|| panic!("no building {building}"));
    building
        .domains
        .iter()
        .map(|g| {
            (
                g.id.clone(),
                g.count,
                g.nodes_per_domain,
                g.gpus_per_node,
                g.gpu.clone(),
            )
        })
        .collect()
}

fn group(
    id: &str,
    count: u32,
    nodes: u32,
    gpus: u32,
    gpu: &str,
) -> (String, u32, u32, u32, String) {
    (id.to_string(), count, nodes, gpus, gpu.to_string())
}

fn building_ids(inventory: &Inventory) -> Vec<&str> {
    inventory
        .site
        .buildings
        .iter()
        .map(|b| b.id.as_str())
        .collect()
}

fn unmapped(inventory: &Inventory) -> Vec<(&str, &str)> {
    inventory
        .unmapped
        .iter()
        .map(|u| (u.object.as_str(), u.reason.as_str()))
        .collect()
}

fn node_name<'a>(inventory: &'a Inventory, at: (&str, &str, u64, u64)) -> Option<&'a str> {
    inventory
        .node_at(at.0, at.1, at.2, at.3)
        .map(|n| n.name.as_str())
}

/// (object, kind) of every problem of an `Invalid` error.
fn problems(error: &InventoryError) -> Vec<(&str, ProblemKind)> {
    assert!(
        matches!(error, InventoryError::Invalid { .. }),
        "expected problems, got: {error}"
    );
    error
        .problems()
        .iter()
        .map(|p| (p.object.as_str(), p.kind))
        .collect()
}

/// Writes files into a fresh directory.
fn temp_files(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("a writable temporary directory");
    }
    dir
}

/// Makes a file executable and returns its path as a command.
fn executable(path: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .expect("a file in a temporary directory");
    path.display().to_string()
}

mod slurm {
    use super::*;

    const GB200: &str = r#"
        [inventory]
        source = "slurm"
        site = "north"
        campus_interconnect = "25.6 Tbit/s"
        fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
        [inventory.slurm]
        nodes_json = "slurm-gb200-nodes.json"
        topology_file = "slurm-gb200-topology.conf"
        buildings = { dh1 = "block[1-8]", dh2 = "block[9-16]" }
    "#;

    #[test]
    fn gb200_blocks_fold_into_nvl72_groups_per_building() {
        let inventory = discover_toml(GB200).unwrap();
        assert_eq!(building_ids(&inventory), ["dh1", "dh2"]);
        // block3 lost a drained tray, block12 a draining and a dead one.
        assert_eq!(
            groups(&inventory, "dh1"),
            [
                group("gb200-18x4", 7, 18, 4, "gb200"),
                group("gb200-17x4", 1, 17, 4, "gb200"),
            ]
        );
        assert_eq!(
            groups(&inventory, "dh2"),
            [
                group("gb200-18x4", 7, 18, 4, "gb200"),
                group("gb200-16x4", 1, 16, 4, "gb200"),
            ]
        );
        assert_eq!(inventory.nodes.len(), 285);
        assert_eq!(inventory.gpus(), 1140);
        assert_eq!(inventory.site.gpus(), 1140);
        assert_eq!(
            unmapped(&inventory),
            [
                ("cpu01", "no GPUs (no gpu GRES)"),
                ("cpu02", "no GPUs (no gpu GRES)"),
                ("cpu03", "no GPUs (no gpu GRES)"),
                ("cpu04", "no GPUs (no gpu GRES)"),
                (
                    "gb-r03-n07",
                    "state IDLE+DRAIN: Xid 79: GPU has fallen off the bus"
                ),
                (
                    "gb-r12-n01",
                    "state MIXED+DRAIN: NVLink errors, replace tray after jobs"
                ),
                ("gb-r12-n18", "state DOWN+NOT_RESPONDING: Not responding"),
                ("gb-spare01", "in no block of the topology"),
            ]
        );
    }

    #[test]
    fn gb200_rank_bindings_map_back_to_host_names() {
        let inventory = discover_toml(GB200).unwrap();
        // Blocks in natural order: block9, block10, block11, block13, ...
        assert_eq!(
            node_name(&inventory, ("dh2", "gb200-18x4", 1, 0)),
            Some("gb-r10-n01")
        );
        assert_eq!(
            node_name(&inventory, ("dh2", "gb200-18x4", 3, 17)),
            Some("gb-r13-n18")
        );
        // The drained n07 leaves a gap that the indices close.
        assert_eq!(
            node_name(&inventory, ("dh1", "gb200-17x4", 0, 6)),
            Some("gb-r03-n08")
        );
        assert_eq!(node_name(&inventory, ("dh1", "gb200-17x4", 1, 0)), None);
        let node = inventory.node("gb-r12-n02").unwrap();
        assert_eq!(
            (
                node.building.as_str(),
                node.domain_group.as_str(),
                node.domain,
                node.node
            ),
            ("dh2", "gb200-16x4", 0, 0)
        );
        assert_eq!(node.scheduler_domain.as_deref(), Some("block12"));
        assert_eq!(node.partitions, ["gpu", "all"]);
        assert_eq!((node.gpus, node.gpu_type.as_str()), (4, "gb200"));
        // Nodes are listed in (building, group, domain, node) order.
        let first: Vec<&str> = inventory.nodes[..2]
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(first, ["gb-r01-n01", "gb-r01-n02"]);
    }

    #[test]
    fn discovery_is_deterministic() {
        assert_eq!(discover_toml(GB200).unwrap(), discover_toml(GB200).unwrap());
    }

    #[test]
    fn one_default_building_needs_no_interconnect() {
        let inventory = discover_toml(
            r#"
            [inventory]
            source = "slurm"
            site = "north"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            [inventory.slurm]
            nodes_json = "slurm-gb200-nodes.json"
            topology_file = "slurm-gb200-topology.conf"
            default_building = "main"
            "#,
        )
        .unwrap();
        assert_eq!(
            groups(&inventory, "main"),
            [
                group("gb200-18x4", 14, 18, 4, "gb200"),
                group("gb200-17x4", 1, 17, 4, "gb200"),
                group("gb200-16x4", 1, 16, 4, "gb200"),
            ]
        );
    }

    #[test]
    fn nodes_outside_the_configured_partitions_are_unmapped() {
        let error = discover_toml(
            r#"
            [inventory]
            source = "slurm"
            site = "north"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            [inventory.slurm]
            nodes_json = "slurm-gb200-nodes.json"
            topology_file = "slurm-gb200-topology.conf"
            default_building = "main"
            partitions = ["cpu"]
            "#,
        )
        .unwrap_err();
        let InventoryError::Empty { unmapped, .. } = &error else {
            panic!("expected an empty inventory, got {error}");
        };
        assert_eq!(unmapped.len(), 293);
        assert_eq!(unmapped[0].reason, "no GPUs (no gpu GRES)");
        assert_eq!(
            unmapped[4].reason,
            "in partitions [gpu, all], none of the configured [cpu]"
        );
        assert!(error.to_string().contains("no usable GPU node"), "{error}");
    }

    const H100: &str = r#"
        [inventory]
        source = "slurm"
        site = "south"
        campus_interconnect = "12.8 Tbit/s"
        fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
        buildings.b.fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s", oversubscription = 2.0 }
        [inventory.slurm]
        nodes_text = "slurm-h100-nodes.txt"
        topology_file = "slurm-h100-topology.txt"
        buildings = { a = "hall-a", b = "hall-b" }
    "#;

    #[test]
    fn h100_tree_nodes_are_their_own_domains_in_the_mapped_halls() {
        let inventory = discover_toml(H100).unwrap();
        assert_eq!(building_ids(&inventory), ["a", "b"]);
        assert_eq!(
            groups(&inventory, "a"),
            [group("h100-1x8", 127, 1, 8, "h100")]
        );
        assert_eq!(
            groups(&inventory, "b"),
            [group("h100-1x8", 127, 1, 8, "h100")]
        );
        assert_eq!(inventory.site.buildings[0].fabric, rail_aligned());
        assert_eq!(
            inventory.site.buildings[1].fabric.kind,
            FabricKind::LeafSpine
        );
        assert_eq!(inventory.site.buildings[1].fabric.oversubscription, 2.0);
        assert_eq!(inventory.nodes.len(), 254);
        assert_eq!(inventory.gpus(), 2032);
        assert_eq!(
            unmapped(&inventory),
            [
                (
                    "h100-a017",
                    "state IDLE+DRAIN: ECC errors on GPU 3 [root@2025-03-02T10:14:55]"
                ),
                (
                    "h100-b100",
                    "state DOWN+NOT_RESPONDING: Not responding [slurm@2025-03-03T04:00:12]"
                ),
                ("h100-b129", "in no leaf switch of the topology"),
                ("login1", "no GPUs (no gpu GRES)"),
                ("login2", "no GPUs (no gpu GRES)"),
            ]
        );
        assert_eq!(
            node_name(&inventory, ("a", "h100-1x8", 15, 0)),
            Some("h100-a016")
        );
        assert_eq!(
            node_name(&inventory, ("a", "h100-1x8", 16, 0)),
            Some("h100-a018")
        );
        assert_eq!(
            node_name(&inventory, ("b", "h100-1x8", 126, 0)),
            Some("h100-b128")
        );
        assert_eq!(inventory.node("h100-a001").unwrap().scheduler_domain, None);
    }

    #[test]
    fn without_a_building_map_the_top_level_switch_is_the_building() {
        let inventory = discover_toml(
            r#"
            [inventory]
            source = "slurm"
            site = "south"
            fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s" }
            [inventory.slurm]
            nodes_text = "slurm-h100-nodes.txt"
            topology_file = "slurm-h100-topology.txt"
            "#,
        )
        .unwrap();
        assert_eq!(
            groups(&inventory, "core"),
            [group("h100-1x8", 254, 1, 8, "h100")]
        );
    }

    /// Real output of Slurm 22.05 (`scontrol -o show nodes`, `sinfo --json`,
    /// `scontrol show topology`) recorded from the deploy/slurm setup.
    #[test]
    fn recorded_slurm_22_05_text_and_json_agree() {
        let config = |nodes: &str| {
            format!(
                r#"
                [inventory]
                source = "slurm"
                site = "ci"
                fabric = {{ kind = "leaf-spine", link_rate = "100 Gbit/s" }}
                [inventory.slurm]
                {nodes}
                topology_file = "slurm-22.05-topology.txt"
                "#
            )
        };
        let text = discover_toml(&config(r#"nodes_text = "slurm-22.05-nodes.txt""#)).unwrap();
        let json = discover_toml(&config(r#"nodes_json = "slurm-22.05-sinfo.json""#)).unwrap();
        assert_eq!(
            groups(&text, "hall-a"),
            [group("h100-1x4", 1, 1, 4, "h100")]
        );
        assert_eq!(
            node_name(&text, ("hall-a", "h100-1x4", 0, 0)),
            Some("lh-gpu01")
        );
        assert_eq!(
            unmapped(&text),
            [
                ("lh-cpu01", "no GPUs (no gpu GRES)"),
                ("lh-gpu02", "state DOWN+NOT_RESPONDING")
            ]
        );
        assert_eq!(text, json);
    }

    #[test]
    fn gb200_trays_in_a_tree_are_unmapped_not_guessed() {
        let dir = temp_files(&[
            (
                "nodes.txt",
                "NodeName=gb1 Gres=gpu:gb200:4 State=IDLE\nNodeName=gb2 Gres=gpu:gb200:4 State=IDLE\n",
            ),
            ("topology.conf", "SwitchName=leaf1 Nodes=gb[1-2]\n"),
        ]);
        let mut config = InventoryConfig::slurm("north", rail_aligned(), Default::default());
        if let Some(slurm) = &mut config.slurm {
            slurm.nodes_text = Some(dir.path().join("nodes.txt"));
            slurm.topology_file = Some(dir.path().join("topology.conf"));
        }
        let error = source_from_config(&config).unwrap().discover().unwrap_err();
        let InventoryError::Empty { unmapped, .. } = &error else {
            panic!("expected an empty inventory, got {error}");
        };
        assert_eq!(unmapped.len(), 2);
        assert!(
            unmapped[0].reason.contains("use topology/block"),
            "{}",
            unmapped[0].reason
        );
    }

    /// A stand-in `scontrol` that behaves like 22.05's (no `--json`) and
    /// prints recorded output: the fallback to the text format.
    #[test]
    fn scontrol_without_json_falls_back_to_the_one_line_format() {
        let nodes = fixtures().join("slurm-22.05-nodes.txt");
        let topology = fixtures().join("slurm-22.05-topology.txt");
        let script = format!(
            "#!/bin/sh\ncase \"$*\" in\n\
             'show nodes --json') echo \"scontrol: unrecognized option '--json'\" >&2; exit 1 ;;\n\
             '-o show nodes') cat '{}' ;;\n\
             'show topology') cat '{}' ;;\n\
             *) echo \"unexpected: $*\" >&2; exit 2 ;;\nesac\n",
            nodes.display(),
            topology.display()
        );
        let dir = temp_files(&[("scontrol", &script)]);
        let scontrol = executable(&dir.path().join("scontrol"));
        let mut config = InventoryConfig::slurm("ci", rail_aligned(), Default::default());
        if let Some(slurm) = &mut config.slurm {
            slurm.scontrol = scontrol;
        }
        let inventory = source_from_config(&config).unwrap().discover().unwrap();
        assert_eq!(
            node_name(&inventory, ("hall-a", "h100-1x4", 0, 0)),
            Some("lh-gpu01")
        );
    }

    #[test]
    fn a_hanging_scontrol_is_killed_at_the_timeout() {
        let dir = temp_files(&[(
            "scontrol",
            "#!/bin/sh\necho 'contacting controller' >&2\nexec sleep 30\n",
        )]);
        let scontrol = executable(&dir.path().join("scontrol"));
        let config = InventoryConfig::from_toml(
            "agent.toml",
            &format!(
                r#"
                [inventory]
                source = "slurm"
                site = "north"
                fabric = {{ kind = "rail-aligned", link_rate = "400 Gbit/s" }}
                slurm = {{ scontrol = "{scontrol}", timeout = "300 ms" }}
                "#
            ),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let error = source_from_config(&config).unwrap().discover().unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        let text = error.to_string();
        assert!(
            text.contains("show nodes --json` timed out after 0.3 s"),
            "{text}"
        );
        assert!(text.contains("stderr: contacting controller"), "{text}");
    }

    #[test]
    fn a_missing_recording_names_the_file() {
        let mut config = InventoryConfig::slurm("north", rail_aligned(), Default::default());
        if let Some(slurm) = &mut config.slurm {
            slurm.nodes_json = Some(fixtures().join("no-such-file.json"));
        }
        let error = source_from_config(&config).unwrap().discover().unwrap_err();
        assert!(
            matches!(error, InventoryError::Read { ref path, .. } if path.ends_with("no-such-file.json")),
            "{error}"
        );
    }
}

mod kubernetes {
    use super::*;

    const GB200: &str = r#"
        [inventory]
        source = "kubernetes"
        site = "east"
        campus_interconnect = "25.6 Tbit/s"
        fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
        [inventory.kubernetes]
        nodes_json = "kubernetes-gb200-nodes.json"
        pool_label = "node-pool"
    "#;

    #[test]
    fn gb200_cliques_fold_into_nvl72_groups_per_zone() {
        let inventory = discover_toml(GB200).unwrap();
        assert_eq!(building_ids(&inventory), ["hall-1", "hall-2"]);
        // Cliques in natural order of their labels; rack 4 lost a NotReady
        // tray, racks 10 and 13 an unlabelled and a cordoned one.
        assert_eq!(
            groups(&inventory, "hall-1"),
            [
                group("gb200-18x4", 7, 18, 4, "gb200"),
                group("gb200-17x4", 1, 17, 4, "gb200"),
            ]
        );
        assert_eq!(
            groups(&inventory, "hall-2"),
            [
                group("gb200-18x4", 6, 18, 4, "gb200"),
                group("gb200-17x4", 2, 17, 4, "gb200"),
                group("h100-1x8", 8, 1, 8, "h100"),
            ]
        );
        assert_eq!(inventory.nodes.len(), 293);
        assert_eq!(inventory.gpus(), 1204);
        let reasons = unmapped(&inventory);
        assert_eq!(reasons.len(), 12);
        let no_gpus = "no GPUs (no nvidia.com/gpu capacity or nvidia.com/gpu.count label)";
        for (object, reason) in &reasons[..3] {
            assert!(
                object.starts_with("cp-") && *reason == no_gpus,
                "{object}: {reason}"
            );
        }
        assert_eq!(
            &reasons[3..6],
            [("cpu-1", no_gpus), ("cpu-2", no_gpus), ("cpu-3", no_gpus)]
        );
        assert_eq!(
            &reasons[9..],
            [
                (
                    "gb200-r04-t09",
                    "not Ready (Ready=Unknown, NodeStatusUnknown)"
                ),
                (
                    "gb200-r10-t05",
                    "gb200 NVLink domains span nodes, and the node has no nvidia.com/gpu.clique label to say which"
                ),
                ("gb200-r13-t01", "cordoned (spec.unschedulable)"),
            ]
        );
    }

    #[test]
    fn gb200_rank_bindings_map_back_to_node_names() {
        let inventory = discover_toml(GB200).unwrap();
        assert_eq!(
            node_name(&inventory, ("hall-1", "gb200-18x4", 0, 0)),
            Some("gb200-r02-t01")
        );
        // Rack 10 without its unlabelled t05.
        assert_eq!(
            node_name(&inventory, ("hall-2", "gb200-17x4", 1, 4)),
            Some("gb200-r10-t06")
        );
        assert_eq!(
            node_name(&inventory, ("hall-2", "h100-1x8", 7, 0)),
            Some("h100-8")
        );
        let node = inventory.node("gb200-r01-t01").unwrap();
        assert_eq!(
            node.scheduler_domain.as_deref(),
            Some("d4f88ecf-d533-6c6e-062c-5f40215f1af3.1")
        );
        assert_eq!(node.partitions, ["gb200"]);
    }

    #[test]
    fn zones_map_to_configured_buildings() {
        let inventory = discover_toml(
            r#"
            [inventory]
            source = "kubernetes"
            site = "east"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            [inventory.kubernetes]
            nodes_json = "kubernetes-gb200-nodes.json"
            buildings = { campus = ["hall-1", "hall-2"] }
            "#,
        )
        .unwrap();
        assert_eq!(
            groups(&inventory, "campus"),
            [
                group("gb200-18x4", 13, 18, 4, "gb200"),
                group("gb200-17x4", 3, 17, 4, "gb200"),
                group("h100-1x8", 8, 1, 8, "h100"),
            ]
        );
    }

    /// A stand-in `kubectl` that prints the recorded node list: the command
    /// path with extra arguments.
    #[test]
    fn kubectl_is_run_with_the_configured_arguments() {
        let list = fixtures().join("kubernetes-gb200-nodes.json");
        let script = format!(
            "#!/bin/sh\n[ \"$*\" = '--context prod get nodes -o json' ] || {{ echo \"unexpected: $*\" >&2; exit 2; }}\ncat '{}'\n",
            list.display()
        );
        let dir = temp_files(&[("kubectl", &script)]);
        let kubectl = executable(&dir.path().join("kubectl"));
        let mut config = InventoryConfig::kubernetes("east", rail_aligned(), Default::default());
        config.campus_interconnect = Some(DataRate::from_gbit_per_second(25_600));
        if let Some(kubernetes) = &mut config.kubernetes {
            kubernetes.kubectl = kubectl;
            kubernetes.kubectl_args = vec!["--context".to_string(), "prod".to_string()];
        }
        let source = source_from_config(&config).unwrap();
        assert!(
            source
                .describe()
                .contains("--context prod get nodes -o json")
        );
        assert_eq!(source.discover().unwrap().nodes.len(), 293);
    }
}

mod bad_inventory {
    use super::*;

    #[test]
    fn slurm_errors_name_every_bad_node_at_once() {
        let error = discover_toml(
            r#"
            [inventory]
            source = "slurm"
            site = "north"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            [inventory.slurm]
            nodes_json = "slurm-bad-nodes.json"
            topology_file = "slurm-bad-topology.conf"
            default_building = "dh1"
            "#,
        )
        .unwrap_err();
        assert_eq!(
            problems(&error),
            [
                ("bad-r01-n02", ProblemKind::GpuCountMismatch),
                ("bad-r01-n03", ProblemKind::InTwoDomains),
                ("bad-r01-n04", ProblemKind::UnknownGpuType),
                ("bad-r02-n02", ProblemKind::DuplicateNode),
                ("bad-r02-n04", ProblemKind::DomainMismatch),
            ]
        );
        for problem in error.problems() {
            assert!(problem.message.contains(&problem.object), "{problem}");
        }
        let text = error.to_string();
        for expected in [
            "has 5 problem(s)",
            "declares 4 GPUs in GRES \"gpu:gb200:4(S:0-1)\" but 2 in its configured TRES",
            "node bad-r01-n03 is in 2 blocks: block1, block2",
            "unknown GPU type \"b300\"",
            "node bad-r02-n02 appears 2 times",
            "node bad-r02-n04 has 2 × gb200 GPUs but 3 other node(s) of scale-up domain \"block2\" have 4 × gb200",
        ] {
            assert!(text.contains(expected), "{expected:?} not in:\n{text}");
        }
    }

    #[test]
    fn kubernetes_errors_name_every_bad_node_at_once() {
        let error = discover_toml(
            r#"
            [inventory]
            source = "kubernetes"
            site = "east"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            campus_interconnect = "1 Tbit/s"
            [inventory.kubernetes]
            nodes_json = "kubernetes-bad-nodes.json"
            "#,
        )
        .unwrap_err();
        assert_eq!(
            problems(&error),
            [
                (
                    "c0ffee00-0000-4000-8000-000000000001.1",
                    ProblemKind::DomainSpansBuildings
                ),
                ("k-gb-01", ProblemKind::GpuCountMismatch),
                ("k-gb-02", ProblemKind::UnknownGpuType),
                ("k-gb-03", ProblemKind::UnknownGpuType),
                ("k-gb-07", ProblemKind::DuplicateNode),
                ("k-gb-08", ProblemKind::Unreadable),
            ]
        );
        let text = error.to_string();
        for expected in [
            "node k-gb-04 is in \"hall-1\", node k-gb-06 in \"hall-2\"",
            "k-gb-01: node k-gb-01: label nvidia.com/gpu.count=4 but capacity nvidia.com/gpu=2",
            "unknown GPU type \"NVIDIA-B300\"",
            "node k-gb-03 has 4 GPUs but no nvidia.com/gpu.product label",
            "nvidia.com/gpu.count \"four\" is not a GPU count",
        ] {
            assert!(text.contains(expected), "{expected:?} not in:\n{text}");
        }
    }

    /// The core's own rule: an H100 domain cannot exceed NVLink's 8 GPUs.
    #[test]
    fn a_domain_beyond_nvlink_reach_is_refused_by_the_core_rules() {
        let dir = temp_files(&[
            (
                "nodes.txt",
                "NodeName=hgx1 Gres=gpu:h100:8 State=IDLE\nNodeName=hgx2 Gres=gpu:h100:8 State=IDLE\n",
            ),
            ("topology.conf", "BlockName=rack7 Nodes=hgx[1-2]\n"),
        ]);
        let mut config = InventoryConfig::slurm("north", rail_aligned(), Default::default());
        if let Some(slurm) = &mut config.slurm {
            slurm.nodes_text = Some(dir.path().join("nodes.txt"));
            slurm.topology_file = Some(dir.path().join("topology.conf"));
            slurm.default_building = Some("dh1".to_string());
        }
        let error = source_from_config(&config).unwrap().discover().unwrap_err();
        assert_eq!(problems(&error), [("rack7", ProblemKind::ModelRule)]);
        let message = &error.problems()[0].message;
        assert!(message.contains("first node hgx1"), "{message}");
        assert!(
            message.contains("16 GPUs exceeds the scale-up reach of \"h100\" (8 GPUs)"),
            "{message}"
        );
    }

    #[test]
    fn site_level_gaps_are_named() {
        // Two zones, no campus interconnect, and a zone that is no id.
        let node = |name: &str, zone: &str| {
            format!(
                r#"{{"metadata": {{"name": "{name}", "labels": {{"topology.kubernetes.io/zone": "{zone}",
                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}}}},
                   "status": {{"capacity": {{"nvidia.com/gpu": "8"}},
                   "conditions": [{{"type": "Ready", "status": "True"}}]}}}}"#
            )
        };
        let list = format!(
            r#"{{"items": [{}, {}]}}"#,
            node("h1", "hall-1"),
            node("h2", "Hall_2")
        );
        let dir = temp_files(&[("nodes.json", &list)]);
        let mut config = InventoryConfig::kubernetes("east", rail_aligned(), Default::default());
        if let Some(kubernetes) = &mut config.kubernetes {
            kubernetes.nodes_json = Some(dir.path().join("nodes.json"));
        }
        let error = source_from_config(&config).unwrap().discover().unwrap_err();
        assert_eq!(
            problems(&error),
            [
                ("Hall_2", ProblemKind::Building),
                ("east", ProblemKind::ModelRule),
            ]
        );
        let text = error.to_string();
        assert!(text.contains("no `campus_interconnect`"), "{text}");
        assert!(
            text.contains("building \"Hall_2\" (first node h2): invalid id"),
            "{text}"
        );
    }
}

mod static_source {
    use super::*;

    fn example(site: &str) -> Result<Inventory, InventoryError> {
        let file =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/two-campuses-80km.toml");
        source_from_config(&InventoryConfig::static_file(site, file))?.discover()
    }

    #[test]
    fn nodes_are_named_after_their_place() {
        let inventory = example("north").unwrap();
        assert_eq!(inventory.nodes.len(), 2 * 16 * 18);
        assert_eq!(inventory.gpus(), inventory.site.gpus());
        assert!(inventory.unmapped.is_empty());
        let node = inventory.node_at("n2", "nvl72", 15, 17).unwrap();
        assert_eq!(node.name, "north-n2-nvl72-015-17");
        assert_eq!(node.scheduler_domain.as_deref(), Some("north-n2-nvl72-015"));
        let south = example("south").unwrap();
        assert_eq!(south.nodes.len(), 256);
        assert_eq!(south.nodes[255].name, "south-s1-hgx-255-00");
        assert_eq!(south.nodes[255].scheduler_domain, None);
    }

    #[test]
    fn the_site_is_the_file_s_own() {
        let file =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/two-campuses-80km.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let topology = longhaul_core::Topology::from_toml("example", &text).unwrap();
        assert_eq!(
            Some(&example("north").unwrap().site),
            topology.site("north")
        );
    }

    #[test]
    fn a_missing_site_or_a_bad_file_is_named() {
        let error = example("west").unwrap_err();
        assert!(
            error.to_string().contains("site \"west\" is not in")
                && error.to_string().contains("\"north\", \"south\""),
            "{error}"
        );
        let dir = temp_files(&[(
            "bad.toml",
            "name = \"x\"\n[[sites]]\nid = \"Bad Id\"\nbuildings = []\n",
        )]);
        let config = InventoryConfig::static_file("x", dir.path().join("bad.toml"));
        let error = source_from_config(&config).unwrap().discover().unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, InventoryError::TopologyFile(_)), "{text}");
        assert!(
            text.contains("bad.toml:3:6: field `sites[0].id`: invalid id"),
            "{text}"
        );
    }
}

mod config {
    use super::*;

    fn issues(toml: &str) -> Vec<(String, String)> {
        let error = InventoryConfig::from_toml("agent.toml", toml).expect_err("a bad config");
        error
            .issues
            .iter()
            .map(|i| (i.path.clone(), i.message.clone()))
            .collect()
    }

    #[test]
    fn the_documented_example_parses() {
        let config = InventoryConfig::from_toml(
            "agent.toml",
            r#"
            [inventory]
            source = "slurm"
            site = "north"
            campus_interconnect = "25.6 Tbit/s"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            buildings.dh2.fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s", oversubscription = 2.0 }
            gpu_aliases = { "tesla_h100" = "h100" }

            [inventory.slurm]
            buildings = { dh1 = "block[1-8]", dh2 = "block[9-16]" }
            "#,
        )
        .unwrap();
        let slurm = config.slurm.unwrap();
        assert_eq!(slurm.scontrol, "scontrol");
        assert_eq!(slurm.timeout.as_nanos(), 30_000_000_000);
        assert_eq!(config.buildings["dh2"].fabric.oversubscription, 2.0);
    }

    /// The `[inventory]` example of deploy/slurm/README.md stays valid.
    #[test]
    fn the_readme_example_parses() {
        let readme = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm/README.md"),
        )
        .unwrap();
        let start = readme.find("```toml\n").unwrap() + "```toml\n".len();
        let end = start + readme[start..].find("```").unwrap();
        let config = InventoryConfig::from_toml("README.md", &readme[start..end])
            .unwrap_or_else(|e| panic!("{e}"));
        let slurm = config.slurm.unwrap();
        assert_eq!(slurm.partitions, ["gpu"]);
        assert_eq!(slurm.buildings["dh2"], "block[9-16]");
    }

    #[test]
    fn mistakes_name_the_field() {
        let found = issues("[inventory]\nsource = \"slurm\"\nsite = \"north\"\nsclurm = {}\n");
        assert_eq!(found[0].0, "inventory.sclurm");
        assert!(found[0].1.contains("unknown field `sclurm`"), "{found:?}");

        let found = issues(
            r#"
            [inventory]
            source = "slurm"
            site = "North"
            gpu_aliases = { "hopper" = "h101" }
            kubernetes = {}
            [inventory.slurm]
            nodes_json = "a.json"
            nodes_text = "a.txt"
            buildings = { dh1 = "block[1-8]", dh2 = "block[8-9" }
            timeout = "0 s"
            "#,
        );
        let paths: Vec<&str> = found.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "inventory.site",
                "inventory.gpu_aliases.hopper",
                "inventory.kubernetes",
                "inventory.slurm.nodes_text",
                "inventory.slurm.buildings.dh2",
                "inventory.slurm.timeout",
            ]
        );
    }

    #[test]
    fn static_settings_come_from_the_file() {
        let found = issues(
            r#"
            [inventory]
            source = "static"
            site = "north"
            fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
            "#,
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, "inventory.static");
        assert!(found[0].1.contains("[inventory.static]"), "{found:?}");
        assert_eq!(found[1].0, "inventory.fabric");
    }

    #[test]
    fn an_invalid_config_builds_no_source() {
        let config = InventoryConfig::static_file("Not An Id", "x.toml");
        let error = source_from_config(&config).unwrap_err();
        assert!(matches!(error, InventoryError::Config { .. }), "{error}");
        assert!(
            error.to_string().contains("field `site`: invalid id"),
            "{error}"
        );
    }
}
