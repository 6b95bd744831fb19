//! Placement solver wall time on synthetic topologies of 1,024, 32,768 and
//! ~100,000 GPUs, then ~100,000 GPUs over 32 and 64 fully meshed sites and
//! 128 sites without WAN links, and a 671B mixture of experts on the
//! 16-site topology. Run with
//! `cargo bench -p longhaul-core --bench placement`. Prints wall time per
//! solve, the process's peak resident memory (VmHWM, Linux only) after each
//! size, and whether the site search was exact or how far from the optimum
//! its plan may be.

use std::time::Instant;

use longhaul_core::job::JobSpec;
use longhaul_core::placement::{place, validate_plan};
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Site, Topology, WanLink};
use longhaul_core::units::{DataRate, Distance, Duration};

/// `sites` sites on a line 100 km apart, fully meshed, alternating a
/// newer and an older site with about `gpus_per_site` GPUs each: B200 and
/// H100 HGX boards, or (with `nvl72`) GB200 NVL72 racks and H100 boards.
fn topology(sites: usize, gpus_per_site: u32, nvl72: bool) -> Topology {
    meshed(sites, gpus_per_site, nvl72, true)
}

/// [`topology`], with or without its WAN links.
fn meshed(sites: usize, gpus_per_site: u32, nvl72: bool, linked: bool) -> Topology {
    let site = |i: usize| {
        let (group, nodes, per_node, gpu, count) = match (i % 2, nvl72) {
            (0, true) => ("nvl72", 18, 4, "gb200", gpus_per_site.div_ceil(72)),
            (0, false) => ("hgx", 1, 8, "b200", gpus_per_site.div_ceil(8)),
            _ => ("hgx", 1, 8, "h100", gpus_per_site.div_ceil(8)),
        };
        Site {
            id: format!("site{i}"),
            name: None,
            location: None,
            campus_interconnect: None,
            buildings: vec![Building {
                id: "hall".to_string(),
                fabric: Fabric {
                    kind: FabricKind::RailAligned,
                    link_rate: DataRate::from_gbit_per_second(400),
                    oversubscription: 1.0,
                },
                domains: vec![DomainGroup {
                    id: group.to_string(),
                    count,
                    nodes_per_domain: nodes,
                    gpus_per_node: per_node,
                    gpu: gpu.to_string(),
                }],
            }],
        }
    };
    let mut links = Vec::new();
    for a in (0..sites).filter(|_| linked) {
        for b in a + 1..sites {
            let km = 100.0 * (b - a) as f64 + 50.0;
            links.push(WanLink {
                between: [format!("site{a}"), format!("site{b}")],
                distance: Distance::from_km(km).unwrap_or_default(),
                overhead: Duration::from_micros(50),
                parallel_links: 8,
                link_rate: DataRate::from_gbit_per_second(400),
                loss: if km > 500.0 { 1e-5 } else { 0.0 },
                buffer: None,
            });
        }
    }
    Topology {
        name: format!("{sites}-sites"),
        gpu_types: Vec::new(),
        sites: (0..sites).map(site).collect(),
        links,
    }
}

fn job(text: &str, file: &str) -> JobSpec {
    match JobSpec::from_toml(file, text) {
        Ok(mut job) => {
            job.constraints.allowed_sites.clear();
            job
        }
        Err(error) => panic!("example job does not parse: {error}"),
    }
}

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "n/a".to_string())
}

fn main() {
    let llama = job(
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
        "llama-70b.job.toml",
    );
    let dense = job(
        include_str!("../../../deploy/examples/dense-400b.job.toml"),
        "dense-400b.job.toml",
    );
    // The 671B mixture of experts with its degrees free (TP up to 8): the
    // expert-parallel degree multiplies the degrees searched by the 9
    // divisors of its 256 experts.
    let mut moe = job(
        include_str!("../../../deploy/examples/moe-671b.job.toml"),
        "moe-671b.job.toml",
    );
    moe.constraints.tensor_parallel = None;
    moe.constraints.pipeline_parallel = None;
    moe.constraints.max_tensor_parallel = Some(8);
    let cases = [
        ("1,024 GPUs / 4 sites", topology(4, 256, false), &llama),
        ("32,768 GPUs / 8 sites", topology(8, 4096, false), &dense),
        ("~100,000 GPUs / 16 sites", topology(16, 6250, true), &dense),
        (
            "~100,000 GPUs / 16 sites, 671B MoE",
            topology(16, 6250, true),
            &moe,
        ),
        ("~100,000 GPUs / 32 sites", topology(32, 3125, true), &dense),
        ("~100,000 GPUs / 64 sites", topology(64, 1563, true), &dense),
        (
            "128 sites, no WAN links",
            meshed(128, 256, false, false),
            &llama,
        ),
    ];
    for (name, topology, job) in cases {
        let start = Instant::now();
        let result = place(&topology, job);
        let elapsed = start.elapsed();
        match result {
            Ok(plan) => {
                let valid = validate_plan(&topology, job, &plan).is_ok();
                let search = plan
                    .reason("site search")
                    .map_or(String::new(), |r| r.choice.clone());
                println!(
                    "{name} ({} GPUs): {:.3} s, peak RSS {}; {} tp={} pp={} dp={} ep={} on {:?}, step {:.3} s, site search {search}, valid {valid}",
                    topology.gpus(),
                    elapsed.as_secs_f64(),
                    peak_rss(),
                    plan.reason("mode").map_or("", |r| r.choice.as_str()),
                    plan.degrees.tensor_parallel,
                    plan.degrees.pipeline_parallel,
                    plan.degrees.data_parallel,
                    plan.degrees.expert_parallel,
                    plan.site_order,
                    plan.step.total
                );
            }
            Err(error) => println!("{name}: {:.3} s, no plan: {error}", elapsed.as_secs_f64()),
        }
    }
}
