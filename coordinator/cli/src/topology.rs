//! `longhaul topology check|show`.

use std::fmt::Write as _;
use std::io::Write;

use longhaul_core::Topology;
use longhaul_core::topology::TopologySummary;
use longhaul_core::units::{human_bytes, human_flops, human_rate, human_seconds};

use super::table::{Table, thousands};
use super::{DEFAULT_TOPOLOGY, DEFAULT_TOPOLOGY_NAME, Failure, FileArgs, Output, ShowArgs};

pub fn check(args: &FileArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let topology = super::load_topology(&args.file)?;
    let summary = topology.summary();
    match args.output {
        Output::Json => super::print_json(&summary, out),
        Output::Text => {
            writeln!(
                out,
                "ok: {}: topology {:?}, {} sites, {} GPUs, {} WAN links",
                args.file.display(),
                summary.name,
                summary.sites.len(),
                thousands(summary.gpus),
                summary.links.len()
            )?;
            Ok(())
        }
    }
}

pub fn show(args: &ShowArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let topology = match &args.file {
        Some(path) => super::load_topology(path)?,
        None => Topology::from_toml(DEFAULT_TOPOLOGY_NAME, DEFAULT_TOPOLOGY)?,
    };
    let summary = topology.summary();
    match args.output {
        Output::Json => super::print_json(&summary, out),
        Output::Text => {
            write!(out, "{}", render(&topology, &summary))?;
            Ok(())
        }
    }
}

/// `1 node`, `18 nodes`.
fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", thousands(count))
    }
}

/// The readable form of `topology show`: a header line, the site tree, the
/// WAN table and the bisection table.
pub fn render(topology: &Topology, summary: &TopologySummary) -> String {
    let mut out = String::new();
    let pflops: f64 = summary.sites.iter().map(|s| s.dense_bf16_pflops).sum();
    let hbm: f64 = summary.sites.iter().map(|s| s.hbm_bytes).sum();
    let _ = writeln!(
        out,
        "topology {}: {} sites, {} GPUs in {} nodes and {} scale-up domains, {} dense bf16, {} HBM",
        summary.name,
        summary.sites.len(),
        thousands(summary.gpus),
        thousands(summary.nodes),
        thousands(summary.domains),
        human_flops(pflops * 1e15),
        human_bytes(hbm),
    );

    for (site, site_summary) in topology.sites.iter().zip(&summary.sites) {
        out.push('\n');
        let label = match &site.name {
            Some(name) => format!("{} ({name})", site.id),
            None => site.id.clone(),
        };
        let _ = write!(
            out,
            "{label}: {} GPUs, {} nodes, {} domains, {}",
            thousands(site_summary.gpus),
            thousands(site_summary.nodes),
            thousands(site_summary.domains),
            human_flops(site_summary.dense_bf16_pflops * 1e15)
        );
        if let Some(rate) = site.campus_interconnect {
            let _ = write!(
                out,
                ", campus interconnect {}",
                human_rate(rate.bits_per_second() as f64)
            );
        }
        out.push('\n');
        let buildings = site.buildings.iter().zip(&site_summary.buildings);
        let last_building = site.buildings.len().saturating_sub(1);
        for (b, (building, building_summary)) in buildings.enumerate() {
            let (branch, stem) = if b == last_building {
                ("└─", "   ")
            } else {
                ("├─", "│  ")
            };
            let fabric = &building.fabric;
            let _ = writeln!(
                out,
                "{branch} {}: {} GPUs, {} nodes; {} fabric, {} per GPU, {}:1 oversubscription",
                building.id,
                thousands(building_summary.gpus),
                thousands(building_summary.nodes),
                fabric.kind.as_str(),
                human_rate(fabric.link_rate.bits_per_second() as f64),
                fabric.oversubscription
            );
            let last_group = building.domains.len().saturating_sub(1);
            for (d, group) in building.domains.iter().enumerate() {
                let branch = if d == last_group { "└─" } else { "├─" };
                let gpu = topology.gpu_type(&group.gpu);
                let gpu_text = gpu.map_or_else(
                    || group.gpu.clone(),
                    |t| {
                        format!(
                            "{} ({} HBM, {} TFLOP/s)",
                            t.name,
                            human_bytes(t.hbm.bytes() as f64),
                            t.dense_bf16.tflops()
                        )
                    },
                );
                let _ = writeln!(
                    out,
                    "{stem}{branch} {}: {} × domain of {} × {} GPUs = {} GPUs/domain, {}",
                    group.id,
                    thousands(u64::from(group.count)),
                    plural(u64::from(group.nodes_per_domain), "node"),
                    group.gpus_per_node,
                    group.gpus_per_domain(),
                    gpu_text
                );
            }
        }
    }

    if !summary.links.is_empty() {
        out.push_str("\nWAN links\n");
        let mut table = Table::new(&[
            ("link", false),
            ("distance", true),
            ("RTT", true),
            ("links × rate", true),
            ("aggregate", true),
            ("BDP/link", true),
            ("buffer/link", true),
            ("loss", true),
            ("1 stream max", true),
        ]);
        for link in &summary.links {
            let f = &link.figures;
            table.row(vec![
                format!("{} – {}", link.between[0], link.between[1]),
                format!("{} km", link.distance_km),
                human_seconds(f.rtt_seconds),
                format!(
                    "{} × {}",
                    link.parallel_links,
                    human_rate(link.link_rate_bits_per_second as f64)
                ),
                human_rate(f.aggregate_bits_per_second),
                human_bytes(f.bdp_bytes_per_link),
                format!(
                    "{} ({})",
                    human_bytes(f.buffer_bytes),
                    human_seconds(f.buffer_seconds)
                ),
                if link.loss > 0.0 {
                    format!("{}", link.loss)
                } else {
                    "0".to_string()
                },
                f.single_stream_bits_per_second
                    .map_or_else(|| "link rate".to_string(), human_rate),
            ]);
        }
        out.push_str(&table.render(2));
    }

    out.push_str("\nBisection bandwidth (one direction, across a cut into equal halves)\n");
    let mut table = Table::new(&[("level", false), ("scope", false), ("rate", true)]);
    for entry in &summary.bisection {
        table.row(vec![
            entry.level.to_string(),
            entry.scope.clone(),
            human_rate(entry.bits_per_second),
        ]);
    }
    out.push_str(&table.render(2));
    out
}
