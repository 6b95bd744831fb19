//! Rendering assignments into Slurm batch scripts and Kubernetes JobSets.
//!
//! - golden files (`tests/render-fixtures/`, rewrite with `LONGHAUL_BLESS=1`)
//!   for a two-site pipeline plan of the real placement engine and for a
//!   hand-built NVL72 case;
//! - invariants a bug would break: every rank once in the rank table, the
//!   node count, the hostlist expanding back to the nodes, the manifests
//!   parsing as YAML with the right pods;
//! - errors that name the rank or field, and dry runs that write nothing
//!   when they fail;
//! - `submit` against small executables standing in for sbatch's process
//!   behaviour (exit status, stderr, hanging); the live test against a real
//!   slurmctld is `render_slurm_live.rs`.

#![allow(clippy::unwrap_used, reason = "helpers of tests fail by panicking")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhaul_core::placement::{self, Plan};
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Site};
use longhaul_core::units::DataRate;
use longhaul_core::{JobSpec, Topology};
use longhaul_site_agent::assignment::{RankBinding, SiteAssignment};
use longhaul_site_agent::hostlist;
use longhaul_site_agent::inventory::{Inventory, Node};
use longhaul_site_agent::render::slurm::{self, ScriptPaths, SlurmSubmitOptions};
use longhaul_site_agent::render::{
    self, RenderError, RenderOptions, SlurmTopology, Target, kubernetes,
};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use yaml_rust2::{Yaml, YamlLoader};

// ---------------------------------------------------------------------------
// Helpers

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/render-fixtures")
        .join(name)
}

/// Compares `actual` with the golden file `name`, or rewrites the file when
/// `LONGHAUL_BLESS=1`.
fn check_golden(name: &str, actual: &str) {
    let path = fixture_path(name);
    if std::env::var("LONGHAUL_BLESS").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with LONGHAUL_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(e, a)| e != a)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the rendering at line {}:\n  expected: {:?}\n  actual:   {:?}\n\
             run with LONGHAUL_BLESS=1 to accept the new rendering",
            path.display(),
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

/// Expands a Slurm hostlist expression with the inventory's expander (the
/// one that reads Slurm's own output), so a compressed list must round-trip
/// through the same parser the agent uses on the scheduler's answers.
fn expand(list: &str) -> Vec<String> {
    hostlist::expand(list).unwrap_or_else(|e| panic!("{list}: {e}"))
}

fn two_campuses_plan() -> Plan {
    let topology = Topology::from_toml(
        "two-campuses-80km.toml",
        include_str!("../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    let job = JobSpec::from_toml(
        "llama-70b.job.toml",
        include_str!("../../deploy/examples/llama-70b.job.toml"),
    )
    .unwrap();
    placement::place(&topology, &job).unwrap()
}

fn topology_site(id: &str) -> Site {
    let topology = Topology::from_toml(
        "two-campuses-80km.toml",
        include_str!("../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    topology.site(id).unwrap().clone()
}

/// Every node of `site`'s domain groups, named by `name(building, group,
/// domain, node)`, as an inventory source would list them.
fn inventory_of(
    site: Site,
    name: impl Fn(&str, &str, u64, u64) -> String,
    scheduler_domain: impl Fn(&str, u64) -> Option<String>,
    partitions: &[&str],
) -> Inventory {
    let mut nodes = Vec::new();
    for building in &site.buildings {
        for group in &building.domains {
            for domain in 0..u64::from(group.count) {
                for node in 0..u64::from(group.nodes_per_domain) {
                    nodes.push(Node {
                        name: name(&building.id, &group.id, domain, node),
                        building: building.id.clone(),
                        domain_group: group.id.clone(),
                        domain,
                        node,
                        scheduler_domain: scheduler_domain(&building.id, domain),
                        gpus: group.gpus_per_node,
                        gpu_type: group.gpu.clone(),
                        partitions: partitions.iter().map(|p| p.to_string()).collect(),
                    });
                }
            }
        }
    }
    Inventory {
        site,
        nodes,
        unmapped: Vec::new(),
    }
}

/// North: NVL72 racks, nodes numbered through each building
/// (`n1gpu001`..`n1gpu288`), each rack a Slurm block.
fn north_inventory() -> Inventory {
    inventory_of(
        topology_site("north"),
        |building, _, domain, node| format!("{building}gpu{:03}", domain * 18 + node + 1),
        |building, domain| Some(format!("{building}-rack{domain:02}")),
        &["gb200", "all"],
    )
}

/// South: single-node HGX domains `s1-hgx001`.. with server 101 missing
/// from the numbering (retired), so the hostlist has a gap.
fn south_inventory() -> Inventory {
    inventory_of(
        topology_site("south"),
        |_, _, domain, _| format!("s1-hgx{:03}", domain + 1 + u64::from(domain >= 100)),
        |_, _| None,
        &["h100", "all"],
    )
}

fn paths_for(a: &SiteAssignment) -> (String, String) {
    (
        format!("/shared/longhaul/{}-r{}.ranks", a.job_id, a.revision),
        format!("/shared/longhaul/{}-r{}.hosts", a.job_id, a.revision),
    )
}

fn render_slurm(a: &SiteAssignment, inventory: &Inventory, options: &RenderOptions) -> String {
    let (rank_table, host_file) = paths_for(a);
    slurm::render(
        a,
        inventory,
        options,
        &ScriptPaths {
            rank_table: &rank_table,
            host_file: &host_file,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn kubernetes_options() -> RenderOptions {
    let mut options = RenderOptions {
        command: "python -u pretrain_gpt.py --tensor-model-parallel-size \"$LONGHAUL_TP\" \
                  --pipeline-model-parallel-size \"$LONGHAUL_PP\""
            .to_string(),
        targets: vec![Target::Slurm, Target::Kubernetes],
        ..RenderOptions::default()
    };
    options.slurm.account = Some("ml-research".into());
    options.slurm.time_limit = Some("2-00:00:00".into());
    options.kubernetes.namespace = "training".into();
    options.kubernetes.queue_name = Some("gpu-queue".into());
    options.kubernetes.image = Some("registry.example/llm/trainer:2026.11".into());
    options.kubernetes.block_label = Some("cloud.provider.com/topology-block".into());
    options
}

/// The value of `#SBATCH --<option>=`.
fn sbatch_option<'a>(script: &'a str, option: &str) -> Option<&'a str> {
    let prefix = format!("#SBATCH --{option}=");
    script.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// Rank-table rows as (rank, node, gpu), checking the header.
fn rows(table: &str) -> Vec<(u64, String, u32)> {
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("# longhaul rank table"));
    lines
        .map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            assert_eq!(fields.len(), 3, "row {l:?}");
            (
                fields[0].parse().unwrap(),
                fields[1].to_string(),
                fields[2].parse().unwrap(),
            )
        })
        .collect()
}

/// Checks a rendered site against its assignment: every rank exactly once,
/// on the inventory node and GPU its binding names; the script's node
/// count and hostlist match the rank table's nodes; the host file follows
/// the rank table.
fn check_slurm_invariants(a: &SiteAssignment, inventory: &Inventory, script: &str) {
    let resolved = render::resolve(a, inventory).unwrap();
    let table = rows(&resolved.rank_table());
    assert_eq!(table.len(), a.ranks.len());
    let by_rank: BTreeMap<u64, (String, u32)> = table
        .iter()
        .map(|(rank, node, gpu)| (*rank, (node.clone(), *gpu)))
        .collect();
    assert_eq!(by_rank.len(), table.len(), "a rank appears twice");
    for binding in &a.ranks {
        let node = inventory
            .node_at(
                &binding.building,
                &binding.domain_group,
                binding.domain,
                binding.node,
            )
            .unwrap();
        assert_eq!(
            by_rank.get(&binding.rank),
            Some(&(node.name.clone(), binding.gpu)),
            "rank {}",
            binding.rank
        );
    }
    let nodes: BTreeSet<&str> = table.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(
        sbatch_option(script, "nodes"),
        Some(nodes.len().to_string().as_str())
    );
    let expanded = expand(sbatch_option(script, "nodelist").unwrap());
    assert_eq!(expanded.len(), nodes.len(), "a node is listed twice");
    assert_eq!(
        expanded.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        nodes
    );
    let hosts: Vec<&str> = table.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(resolved.host_file().lines().collect::<Vec<_>>(), hosts);
    assert!(script.contains(&format!("srun --ntasks={} ", a.ranks.len())));
}

fn parse_yaml(text: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(text).unwrap_or_else(|e| panic!("invalid YAML: {e}\n{text}"))
}

fn yaml_strings(value: &Yaml) -> Vec<String> {
    value
        .as_vec()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Checks the ConfigMap and JobSet: they parse; the ConfigMap holds the
/// rank table; every assigned node gets exactly one pod slot, pinned to it,
/// asking for as many GPUs as it has ranks; the env describes the job.
fn check_kubernetes_invariants(a: &SiteAssignment, inventory: &Inventory, manifest: &str) {
    let resolved = render::resolve(a, inventory).unwrap();
    let docs = parse_yaml(manifest);
    assert_eq!(docs.len(), 2);
    let (config_map, jobset) = (&docs[0], &docs[1]);
    assert_eq!(config_map["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(
        config_map["data"]["ranks"].as_str(),
        Some(resolved.rank_table().as_str())
    );
    assert_eq!(
        jobset["apiVersion"].as_str(),
        Some("jobset.x-k8s.io/v1alpha2")
    );
    let name = jobset["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        config_map["metadata"]["name"].as_str(),
        Some(format!("{name}-ranks").as_str())
    );

    let ranks_per_node: BTreeMap<&str, usize> = resolved
        .nodes
        .iter()
        .map(|n| (n.node.name.as_str(), n.ranks.len()))
        .collect();
    let mut pinned = BTreeSet::new();
    for job in jobset["spec"]["replicatedJobs"].as_vec().unwrap() {
        assert_eq!(job["replicas"].as_i64(), Some(1));
        let spec = &job["template"]["spec"];
        let pod = &spec["template"]["spec"];
        let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        let expression = &terms[0]["matchExpressions"][0];
        assert_eq!(expression["key"].as_str(), Some("kubernetes.io/hostname"));
        let hosts = yaml_strings(&expression["values"]);
        assert_eq!(spec["parallelism"].as_i64(), Some(hosts.len() as i64));
        assert_eq!(spec["completions"].as_i64(), Some(hosts.len() as i64));
        let container = &pod["containers"][0];
        let gpus = container["resources"]["limits"]["nvidia.com/gpu"]
            .as_i64()
            .unwrap();
        let env: BTreeMap<&str, &Yaml> = container["env"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e))
            .collect();
        assert_eq!(
            env["LONGHAUL_RANKS_PER_POD"]["value"].as_str(),
            Some(gpus.to_string().as_str())
        );
        assert_eq!(
            env["LONGHAUL_WORLD_SIZE"]["value"].as_str(),
            Some(a.world_size.to_string().as_str())
        );
        assert_eq!(
            env["LONGHAUL_NODE"]["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            Some("spec.nodeName")
        );
        for host in hosts {
            assert_eq!(ranks_per_node[host.as_str()] as i64, gpus, "{host}");
            assert!(pinned.insert(host.clone()), "{host} pinned twice");
        }
    }
    assert_eq!(
        pinned.iter().map(String::as_str).collect::<Vec<_>>(),
        ranks_per_node.keys().copied().collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------
// The two-campus pipeline plan

#[test]
fn two_campus_plan_splits_into_site_assignments_that_cover_every_rank_once() {
    let plan = two_campuses_plan();
    let north = SiteAssignment::from_plan(&plan, "north", 7);
    let south = SiteAssignment::from_plan(&plan, "south", 7);
    north.validate().unwrap();
    south.validate().unwrap();
    assert_eq!(north.mode, "pipeline");
    assert_eq!(north.world_size, plan.gpus());
    let mut ranks: Vec<u64> = north
        .ranks
        .iter()
        .chain(&south.ranks)
        .map(|b| b.rank)
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..plan.gpus()).collect::<Vec<_>>());
    // Pipeline mode: the sites split the stages and share every replica.
    let stages: BTreeSet<u32> = north.stages.iter().chain(&south.stages).copied().collect();
    assert_eq!(stages.len(), north.stages.len() + south.stages.len());
    assert_eq!(stages.len() as u32, plan.degrees.pipeline_parallel);
    assert_eq!(north.replicas, south.replicas);
    assert_eq!(north.replicas.len() as u32, plan.degrees.data_parallel);
}

#[test]
fn north_sbatch_for_the_two_campus_plan() {
    let plan = two_campuses_plan();
    let a = SiteAssignment::from_plan(&plan, "north", 7);
    let inventory = north_inventory();
    let script = render_slurm(&a, &inventory, &kubernetes_options());
    check_golden("two-campuses-north.sbatch", &script);
    check_slurm_invariants(&a, &inventory, &script);
    // NVL72 racks: the job's nodes come in whole racks of 18.
    assert_eq!(sbatch_option(&script, "segment"), Some("18"));
    assert_eq!(sbatch_option(&script, "partition"), Some("all,gb200"));
    assert_eq!(sbatch_option(&script, "gpus-per-node"), Some("4"));
    assert!(script.contains("export MASTER_ADDR='n1gpu001'"));
}

#[test]
fn south_sbatch_and_jobset_for_the_two_campus_plan() {
    let plan = two_campuses_plan();
    let a = SiteAssignment::from_plan(&plan, "south", 7);
    let inventory = south_inventory();
    let options = kubernetes_options();
    let script = render_slurm(&a, &inventory, &options);
    check_golden("two-campuses-south.sbatch", &script);
    check_slurm_invariants(&a, &inventory, &script);
    // Single-node domains: no segment; rank 0 is in the north.
    assert_eq!(sbatch_option(&script, "segment"), None);
    assert!(!script.contains("MASTER_ADDR="));
    assert_eq!(sbatch_option(&script, "gpus-per-node"), Some("8"));

    let manifest = kubernetes::render(&a, &inventory, &options).unwrap();
    check_golden("two-campuses-south.jobset.yaml", &manifest);
    check_kubernetes_invariants(&a, &inventory, &manifest);
    let jobset = &parse_yaml(&manifest)[1];
    let jobs = jobset["spec"]["replicatedJobs"].as_vec().unwrap();
    assert_eq!(jobs.len(), 1, "one group of single-node domains");
    let annotations = &jobs[0]["template"]["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["kueue.x-k8s.io/podset-preferred-topology"].as_str(),
        Some("cloud.provider.com/topology-block")
    );
    assert!(annotations["kueue.x-k8s.io/podset-required-topology"].is_badvalue());
}

#[test]
fn north_jobset_has_one_replicated_job_per_rack_required_in_its_clique() {
    let plan = two_campuses_plan();
    let a = SiteAssignment::from_plan(&plan, "north", 7);
    let inventory = north_inventory();
    let manifest = kubernetes::render(&a, &inventory, &kubernetes_options()).unwrap();
    check_kubernetes_invariants(&a, &inventory, &manifest);
    let jobset = &parse_yaml(&manifest)[1];
    assert_eq!(
        jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].as_str(),
        Some("gpu-queue")
    );
    let jobs = jobset["spec"]["replicatedJobs"].as_vec().unwrap();
    assert_eq!(jobs.len(), 32);
    let mut racks = BTreeSet::new();
    for (k, job) in jobs.iter().enumerate() {
        assert_eq!(job["name"].as_str(), Some(format!("d{k}").as_str()));
        assert_eq!(job["template"]["spec"]["parallelism"].as_i64(), Some(18));
        let pod = &job["template"]["spec"]["template"];
        assert_eq!(
            pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"].as_str(),
            Some("nvidia.com/gpu.clique")
        );
        let rack = job["template"]["metadata"]["annotations"]["longhaul/scheduler-domain"]
            .as_str()
            .unwrap();
        assert!(racks.insert(rack.to_string()), "rack {rack} twice");
    }
}

// ---------------------------------------------------------------------------
// NVL72 blocks, used in half racks

/// Four GB200 NVL72 racks; this site runs a job with TP 4 (one node), PP 2
/// and DP 9: stage 0 of every replica on nodes 0-8 of rack 0, stage 1 on
/// nodes 0-8 of rack 3 (racks 1 and 2 are busy).
fn nvl72_case() -> (SiteAssignment, Inventory) {
    let site = Site {
        id: "west".into(),
        name: None,
        location: None,
        campus_interconnect: None,
        buildings: vec![Building {
            id: "w1".into(),
            fabric: Fabric {
                kind: FabricKind::RailAligned,
                link_rate: "400 Gbit/s".parse::<DataRate>().unwrap(),
                oversubscription: 1.0,
            },
            domains: vec![DomainGroup {
                id: "nvl72".into(),
                count: 4,
                nodes_per_domain: 18,
                gpus_per_node: 4,
                gpu: "gb200".into(),
            }],
        }],
    };
    let inventory = inventory_of(
        site,
        |_, _, domain, node| format!("gb-r{:02}-n{:02}", domain + 1, node + 1),
        |_, domain| Some(format!("block{:02}", domain + 1)),
        &["gb200"],
    );
    let mut ranks = Vec::new();
    for replica in 0..9u64 {
        for stage in 0..2u64 {
            for tp_rank in 0..4u64 {
                ranks.push(RankBinding {
                    rank: tp_rank + 4 * (stage + 2 * replica),
                    building: "w1".into(),
                    domain_group: "nvl72".into(),
                    domain: if stage == 0 { 0 } else { 3 },
                    node: replica,
                    gpu: tp_rank as u32,
                });
            }
        }
    }
    let assignment = SiteAssignment {
        job_id: "moe-small".into(),
        site_id: "west".into(),
        revision: 42,
        world_size: 72,
        tensor_parallel: 4,
        pipeline_parallel: 2,
        data_parallel: 9,
        expert_parallel: 1,
        mode: "pipeline".into(),
        inner_steps: 0,
        stages: vec![0, 1],
        replicas: (0..9).collect(),
        ranks,
    };
    (assignment, inventory)
}

#[test]
fn nvl72_half_racks_render_with_a_segment_per_half_rack() {
    let (a, inventory) = nvl72_case();
    a.validate().unwrap();
    let options = kubernetes_options();
    let script = render_slurm(&a, &inventory, &options);
    check_golden("nvl72.sbatch", &script);
    check_slurm_invariants(&a, &inventory, &script);
    assert_eq!(
        sbatch_option(&script, "nodelist"),
        Some("gb-r01-n[01-09],gb-r04-n[01-09]")
    );
    assert_eq!(sbatch_option(&script, "segment"), Some("9"));
    assert_eq!(sbatch_option(&script, "partition"), Some("gb200"));

    let resolved = render::resolve(&a, &inventory).unwrap();
    check_golden("nvl72.ranks", &resolved.rank_table());

    let manifest = kubernetes::render(&a, &inventory, &options).unwrap();
    check_golden("nvl72.jobset.yaml", &manifest);
    check_kubernetes_invariants(&a, &inventory, &manifest);
}

#[test]
fn slurm_topology_choice_follows_the_option() {
    let (a, inventory) = nvl72_case();
    let with = |topology| {
        let mut options = RenderOptions::default();
        options.slurm.topology = topology;
        render_slurm(&a, &inventory, &options)
    };
    assert_eq!(
        sbatch_option(&with(SlurmTopology::Block), "segment"),
        Some("9")
    );
    assert_eq!(sbatch_option(&with(SlurmTopology::Flat), "segment"), None);
    let tree = with(SlurmTopology::Tree);
    assert_eq!(sbatch_option(&tree, "segment"), None);
    // Two blocks named by the inventory: two leaf switches' worth.
    assert_eq!(sbatch_option(&tree, "switches"), Some("2"));

    // Racks used unevenly (9 and 6 nodes): segments of their gcd, 3.
    let mut uneven = a.clone();
    uneven.data_parallel = 6;
    uneven.world_size = 48;
    uneven.replicas = (0..6).collect();
    uneven.ranks.retain(|b| b.rank < 48);
    let mut moved = uneven.clone();
    for b in &mut moved.ranks {
        if b.domain == 0 && b.node >= 3 {
            b.domain = 1;
        }
    }
    let script = render_slurm(&moved, &inventory, &RenderOptions::default());
    assert_eq!(sbatch_option(&script, "segment"), Some("3"));
    check_slurm_invariants(&moved, &inventory, &script);
}

#[test]
fn unevenly_filled_nodes_get_the_largest_count_and_their_own_replicated_job() {
    // TP 2, PP 1, DP 7 in rack 1: two TP groups per node on nodes 1-3, one
    // on node 4, which keeps GPUs 2 and 3 free.
    let (mut a, inventory) = nvl72_case();
    a.tensor_parallel = 2;
    a.pipeline_parallel = 1;
    a.data_parallel = 7;
    a.world_size = 14;
    a.stages = vec![0];
    a.replicas = (0..7).collect();
    a.ranks = (0..14u64)
        .map(|rank| {
            let replica = rank / 2;
            RankBinding {
                rank,
                building: "w1".into(),
                domain_group: "nvl72".into(),
                domain: 0,
                node: replica / 2,
                gpu: ((replica % 2) * 2 + rank % 2) as u32,
            }
        })
        .collect();
    a.validate().unwrap();
    let options = kubernetes_options();
    let script = render_slurm(&a, &inventory, &options);
    check_slurm_invariants(&a, &inventory, &script);
    assert_eq!(sbatch_option(&script, "gpus-per-node"), Some("4"));
    assert_eq!(sbatch_option(&script, "segment"), Some("4"));
    assert!(script.contains("# Nodes carry different numbers of ranks"));
    let manifest = kubernetes::render(&a, &inventory, &options).unwrap();
    check_kubernetes_invariants(&a, &inventory, &manifest);
    let jobset = &parse_yaml(&manifest)[1];
    let jobs = jobset["spec"]["replicatedJobs"].as_vec().unwrap();
    assert_eq!(
        jobs.len(),
        2,
        "the half-used node gets its own pod template"
    );
}

// ---------------------------------------------------------------------------
// The launchers, run by bash as srun and the pods would run them

/// Runs `script` under `bash -c` with `env`, returning (success, stdout,
/// stderr).
fn run_bash(script: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    let output = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn every_slurm_task_runs_its_own_rank_on_its_own_node() {
    let (a, inventory) = nvl72_case();
    let resolved = render::resolve(&a, &inventory).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let table_path = dir.path().join("ranks");
    std::fs::write(&table_path, resolved.rank_table()).unwrap();
    let table = table_path.to_str().unwrap();
    let command = "echo \"$RANK $LONGHAUL_NODE $LOCAL_RANK\"";
    let host_file = resolved.host_file();
    let hosts: Vec<&str> = host_file.lines().collect();
    let mut seen = Vec::new();
    // srun's arbitrary distribution puts task i on line i of the host file.
    for (task, host) in hosts.iter().enumerate() {
        let task = task.to_string();
        let (ok, stdout, stderr) = run_bash(
            slurm::TASK_LAUNCHER,
            &[
                ("SLURM_PROCID", &task),
                ("SLURMD_NODENAME", host),
                ("LONGHAUL_RANK_TABLE", table),
                ("LONGHAUL_COMMAND", command),
            ],
        );
        assert!(ok, "task {task}: {stderr}");
        seen.push(stdout);
    }
    let expected: Vec<String> = rows(&resolved.rank_table())
        .into_iter()
        .map(|(rank, node, gpu)| format!("{rank} {node} {gpu}\n"))
        .collect();
    assert_eq!(seen, expected);

    // A task on the wrong node, or beyond the table, stops with a reason.
    let (ok, _, stderr) = run_bash(
        slurm::TASK_LAUNCHER,
        &[
            ("SLURM_PROCID", "0"),
            ("SLURMD_NODENAME", "gb-r04-n01"),
            ("LONGHAUL_RANK_TABLE", table),
            ("LONGHAUL_COMMAND", command),
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("task 0 runs on gb-r04-n01 but rank 0 is bound to gb-r01-n01"),
        "{stderr}"
    );
    let beyond = hosts.len().to_string();
    let (ok, _, stderr) = run_bash(
        slurm::TASK_LAUNCHER,
        &[
            ("SLURM_PROCID", &beyond),
            ("SLURMD_NODENAME", "gb-r01-n01"),
            ("LONGHAUL_RANK_TABLE", table),
            ("LONGHAUL_COMMAND", command),
        ],
    );
    assert!(!ok);
    assert!(stderr.contains("no rank-table row for task 72"), "{stderr}");
}

#[test]
fn every_pod_runs_the_ranks_of_its_node_and_fails_with_any_of_them() {
    let (a, inventory) = nvl72_case();
    let resolved = render::resolve(&a, &inventory).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let table_path = dir.path().join("ranks");
    std::fs::write(&table_path, resolved.rank_table()).unwrap();
    let table = table_path.to_str().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let out_dir = out.to_str().unwrap();
    let command = "echo \"$LONGHAUL_NODE $LOCAL_RANK\" > \"$OUT/$RANK\"";
    // The pods run at once, as they would (each polls its ranks every second).
    let pods: Vec<_> = resolved
        .nodes
        .iter()
        .map(|placed| {
            let child = std::process::Command::new("bash")
                .arg("-c")
                .arg(kubernetes::POD_LAUNCHER)
                .env("LONGHAUL_NODE", &placed.node.name)
                .env("LONGHAUL_RANKS_PER_POD", placed.ranks.len().to_string())
                .env("LONGHAUL_RANK_TABLE", table)
                .env("LONGHAUL_COMMAND", command)
                .env("OUT", out_dir)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (placed.node.name.clone(), child)
        })
        .collect();
    for (node, child) in pods {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{node}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for (rank, node, gpu) in rows(&resolved.rank_table()) {
        let written = std::fs::read_to_string(out.join(rank.to_string())).unwrap();
        assert_eq!(written, format!("{node} {gpu}\n"), "rank {rank}");
    }
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), a.ranks.len());

    // A pod on a node the table does not expect, or with a failing rank.
    let (ok, _, stderr) = run_bash(
        kubernetes::POD_LAUNCHER,
        &[
            ("LONGHAUL_NODE", "gb-r02-n01"),
            ("LONGHAUL_RANKS_PER_POD", "4"),
            ("LONGHAUL_RANK_TABLE", table),
            ("LONGHAUL_COMMAND", "true"),
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("node gb-r02-n01 has 0 ranks in the rank table, expected 4"),
        "{stderr}"
    );
    let started = Instant::now();
    let (ok, _, _) = run_bash(
        kubernetes::POD_LAUNCHER,
        &[
            ("LONGHAUL_NODE", "gb-r01-n01"),
            ("LONGHAUL_RANKS_PER_POD", "4"),
            ("LONGHAUL_RANK_TABLE", table),
            // Rank 1 fails at once; the others would run for a minute.
            (
                "LONGHAUL_COMMAND",
                "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60",
            ),
        ],
    );
    assert!(!ok);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the other ranks were not stopped"
    );
}

// ---------------------------------------------------------------------------
// Hostlists

#[test]
fn hostlists_of_the_fixtures_expand_back() {
    let inventory = south_inventory();
    let names: Vec<&str> = inventory.nodes.iter().map(|n| n.name.as_str()).collect();
    let compressed = hostlist::compress(names.iter().copied());
    assert_eq!(compressed, "s1-hgx[001-100,102-257]");
    assert_eq!(expand(&compressed), names);
}

/// Host names from a few prefixes and numbers written at a few widths,
/// including ones that must not share a range (`n9`, `n09`, `n010`).
fn host_name() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["n", "gpu-", "r1-n", "x", "r10n"]),
        0u64..130,
        prop::sample::select(vec![0usize, 1, 2, 3]),
    )
        .prop_map(|(prefix, number, width)| format!("{prefix}{number:0width$}"))
}

proptest! {
    // A fixed seed keeps the test deterministic; 512 cases cover the widths
    // and prefixes many times over.
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x6c6f_6e67),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn compressed_hostlists_expand_to_the_same_hosts(
        names in prop::collection::vec(host_name(), 0..60)
    ) {
        let compressed = hostlist::compress(names.iter().map(String::as_str));
        let expanded = expand(&compressed);
        let unique: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        prop_assert_eq!(expanded.len(), unique.len(), "{} from {:?}", compressed, names);
        prop_assert_eq!(
            expanded.iter().map(String::as_str).collect::<BTreeSet<_>>(),
            unique
        );
        // Compressing the expansion gives the same expression back.
        prop_assert_eq!(hostlist::compress(expanded.iter().map(String::as_str)), compressed);
    }
}

// ---------------------------------------------------------------------------
// Errors

fn render_err(a: &SiteAssignment, inventory: &Inventory) -> String {
    slurm::render(
        a,
        inventory,
        &RenderOptions::default(),
        &ScriptPaths {
            rank_table: "/r",
            host_file: "/h",
        },
    )
    .expect_err("rendering must fail")
    .to_string()
}

#[test]
fn a_binding_to_a_node_the_inventory_lacks_names_the_rank_and_place() {
    let (mut a, inventory) = nvl72_case();
    a.ranks[5].node = 40;
    assert_eq!(
        render_err(&a, &inventory),
        "rank 5 is bound to (building \"w1\", domain group \"nvl72\", domain 3, node 40), \
         which is not in the site's inventory"
    );
    let (mut a, inventory) = nvl72_case();
    a.ranks[0].building = "w2".into();
    assert!(render_err(&a, &inventory).starts_with("rank 0 is bound to (building \"w2\""));
}

#[test]
fn bindings_the_inventory_cannot_honour_are_refused() {
    let (mut a, mut inventory) = nvl72_case();
    inventory.nodes[0].gpus = 2;
    assert_eq!(
        render_err(&a, &inventory),
        "rank 2 is bound to GPU 2 of node \"gb-r01-n01\", which has 2 GPUs"
    );

    let (_, mut inventory) = nvl72_case();
    inventory.nodes[1].name = "gb-r01-n01".into();
    assert_eq!(
        render_err(&a, &inventory),
        "node name \"gb-r01-n01\" names two places in the inventory, (building \"w1\", domain \
         group \"nvl72\", domain 0, node 0) and (building \"w1\", domain group \"nvl72\", \
         domain 0, node 1), both with ranks (rank 8 on the second)"
    );

    let (_, mut inventory) = nvl72_case();
    let twin = Node {
        name: "gb-r01-n01-spare".into(),
        ..inventory.nodes[0].clone()
    };
    inventory.nodes.push(twin);
    assert!(
        render_err(&a, &inventory).contains("which the inventory lists twice"),
        "{}",
        render_err(&a, &inventory)
    );

    let (_, mut inventory) = nvl72_case();
    inventory.nodes[0].name = "gb[1]".into();
    assert!(render_err(&a, &inventory).starts_with("rank 0 is bound to node \"gb[1]\""));

    let (_, mut inventory) = nvl72_case();
    inventory.site.id = "east".into();
    assert_eq!(
        render_err(&a, &inventory),
        "the assignment is for site \"west\" but the inventory is of site \"east\""
    );

    let (_, inventory) = nvl72_case();
    a.ranks[3].rank = 1000;
    assert_eq!(
        render_err(&a, &inventory),
        "assignment field `ranks[3].rank` is 1000, not below `world_size` 72"
    );
}

#[test]
fn nodes_without_a_shared_partition_need_one_configured() {
    let (a, mut inventory) = nvl72_case();
    for node in inventory.nodes.iter_mut().filter(|n| n.domain == 3) {
        node.partitions = vec!["gb200-b".into()];
    }
    assert_eq!(
        render_err(&a, &inventory),
        "no Slurm partition contains all 18 assigned nodes \
         (gb-r01-n[01-09],gb-r04-n[01-09]); set `slurm.partition`"
    );
    let mut options = RenderOptions::default();
    options.slurm.partition = Some("gb200,gb200-b".into());
    let script = render_slurm(&a, &inventory, &options);
    assert_eq!(sbatch_option(&script, "partition"), Some("gb200,gb200-b"));
}

#[test]
fn a_jobset_needs_an_image_and_short_enough_names() {
    let (mut a, inventory) = nvl72_case();
    let mut options = kubernetes_options();
    options.kubernetes.image = None;
    assert_eq!(
        kubernetes::render(&a, &inventory, &options)
            .unwrap_err()
            .to_string(),
        "option `kubernetes.image`: is required to render a JobSet (the `kubernetes` target)"
    );
    a.job_id = "a-very-long-job-name-that-someone-typed-out".into();
    let err = kubernetes::render(&a, &inventory, &kubernetes_options()).unwrap_err();
    assert!(matches!(err, RenderError::NameTooLong { .. }), "{err}");
    assert!(
        err.to_string().contains("shorten the job or site id"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// Dry runs

#[test]
fn a_dry_run_writes_every_file_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("renders");
    let (a, inventory) = nvl72_case();
    let options = kubernetes_options();
    let written = render::write_dry_run(&out, &a, &inventory, &options).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "moe-small-r42.ranks",
            "moe-small-r42.hosts",
            "moe-small-r42.sbatch",
            "moe-small-r42.jobset.yaml"
        ]
    );
    // Nothing else is left behind, temporary files included.
    let mut present: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(present, expected);

    let read = |i: usize| std::fs::read_to_string(&written[i]).unwrap();
    let resolved = render::resolve(&a, &inventory).unwrap();
    assert_eq!(read(0), resolved.rank_table());
    assert_eq!(read(1), resolved.host_file());
    let script = read(2);
    let rank_table = written[0].to_str().unwrap();
    assert!(script.contains(&format!("export LONGHAUL_RANK_TABLE='{rank_table}'")));
    assert_eq!(
        script,
        slurm::render(
            &a,
            &inventory,
            &options,
            &ScriptPaths {
                rank_table,
                host_file: written[1].to_str().unwrap(),
            }
        )
        .unwrap()
    );
    assert_eq!(
        read(3),
        kubernetes::render(&a, &inventory, &options).unwrap()
    );

    // A re-render of the same revision replaces the files in place.
    let again = render::write_dry_run(&out, &a, &inventory, &options).unwrap();
    assert_eq!(again, written);
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 4);
}

#[test]
fn a_failed_dry_run_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("renders");
    let (mut a, inventory) = nvl72_case();
    a.ranks[7].domain = 9;
    let err = render::write_dry_run(&out, &a, &inventory, &kubernetes_options()).unwrap_err();
    assert!(err.to_string().starts_with("rank 7 is bound to"), "{err}");
    assert!(!out.exists(), "the output directory was created");

    // A Kubernetes-only failure also stops the Slurm files.
    let (a, inventory) = nvl72_case();
    let mut options = kubernetes_options();
    options.kubernetes.image = None;
    std::fs::create_dir(&out).unwrap();
    let err = render::write_dry_run(&out, &a, &inventory, &options).unwrap_err();
    assert!(err.to_string().contains("kubernetes.image"), "{err}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

#[test]
fn a_dry_run_into_an_unwritable_place_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let (a, inventory) = nvl72_case();
    let err = render::write_dry_run(&file, &a, &inventory, &RenderOptions::default()).unwrap_err();
    assert!(matches!(err, RenderError::Io { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
}

// ---------------------------------------------------------------------------
// Submitting

/// An executable shell script standing in for sbatch's process behaviour.
fn fake_sbatch(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("sbatch");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn submit_passes_parsable_and_the_script_and_returns_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("args");
    let sbatch = fake_sbatch(
        dir.path(),
        &format!("echo \"$@\" > '{}'\necho '5813;north-a'", log.display()),
    );
    let job = slurm::submit(
        Path::new("/shared/job.sbatch"),
        &SlurmSubmitOptions {
            sbatch,
            args: vec!["--hold".into()],
            timeout: Duration::from_secs(20),
        },
    )
    .unwrap();
    assert_eq!(job.job_id, 5813);
    assert_eq!(job.cluster.as_deref(), Some("north-a"));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "--parsable --hold /shared/job.sbatch\n"
    );
}

#[test]
fn a_refused_submission_carries_sbatch_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let sbatch = fake_sbatch(
        dir.path(),
        "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2\nexit 1",
    );
    let err = slurm::submit(
        Path::new("job.sbatch"),
        &SlurmSubmitOptions {
            sbatch,
            ..SlurmSubmitOptions::default()
        },
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("exit status: 1"), "{message}");
    assert!(message.contains("Invalid account"), "{message}");
}

#[test]
fn a_hanging_sbatch_is_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sbatch = fake_sbatch(
        dir.path(),
        "echo 'contacting controller' >&2\nexec sleep 30",
    );
    let started = Instant::now();
    let err = slurm::submit(
        Path::new("job.sbatch"),
        &SlurmSubmitOptions {
            sbatch,
            args: Vec::new(),
            timeout: Duration::from_millis(300),
        },
    )
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(matches!(err, RenderError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("contacting controller"), "{err}");
}

#[test]
fn a_missing_sbatch_is_a_spawn_error() {
    let err = slurm::submit(
        Path::new("job.sbatch"),
        &SlurmSubmitOptions {
            sbatch: PathBuf::from("/nonexistent/sbatch"),
            ..SlurmSubmitOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("could not run /nonexistent/sbatch"),
        "{err}"
    );
}
