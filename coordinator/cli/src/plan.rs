//! `longhaul plan`: place a job on a topology without a running coordinator
//! and print the plan (tree and step-time breakdown) or its JSON.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use longhaul_core::placement::{CrossSiteMode, Plan, place};
use longhaul_core::units::{human_bytes, human_seconds};
use longhaul_core::{JobSpec, Topology};

use super::table::{Table, thousands};
use super::{DEFAULT_TOPOLOGY, DEFAULT_TOPOLOGY_NAME, Failure, Output, load_topology, read};

/// The job planned when `plan` is given no job file.
pub const DEFAULT_JOB_NAME: &str = "llama-70b (bundled)";
pub const DEFAULT_JOB: &str = include_str!("../../../deploy/examples/llama-70b.job.toml");

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The topology file; the bundled two-campuses-80km example when omitted.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    /// The job file; the bundled llama-70b example when omitted.
    #[arg(long)]
    pub job: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// The topology and job files of a what-if (the bundled examples when
/// omitted), parsed and checked against each other.
pub fn load_inputs(
    topology: Option<&PathBuf>,
    job: Option<&PathBuf>,
) -> Result<(Topology, JobSpec), Failure> {
    let topology = match topology {
        Some(path) => load_topology(path)?,
        None => Topology::from_toml(DEFAULT_TOPOLOGY_NAME, DEFAULT_TOPOLOGY)?,
    };
    let (job_name, job_text) = match job {
        Some(path) => (path.display().to_string(), read(path)?),
        None => (DEFAULT_JOB_NAME.to_string(), DEFAULT_JOB.to_string()),
    };
    let job = JobSpec::from_toml(&job_name, &job_text)?;
    let violations = job.violations_against(&topology);
    if !violations.is_empty() {
        return Err(longhaul_core::config::violations_in(&job_name, &job_text, violations).into());
    }
    Ok((topology, job))
}

/// Places `job` on `topology`, or says why it cannot be placed.
pub fn place_job(topology: &Topology, job: &JobSpec) -> Result<Plan, Failure> {
    place(topology, job).map_err(|error| {
        Failure::Unsatisfiable(anyhow::anyhow!(
            "job {:?} cannot be placed on {:?}: {error}",
            job.name,
            topology.name
        ))
    })
}

pub fn plan(args: &PlanArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let (topology, job) = load_inputs(args.topology.as_ref(), args.job.as_ref())?;
    let plan = place_job(&topology, &job)?;
    match args.output {
        Output::Json => super::print_json(&plan, out),
        Output::Text => {
            write!(out, "{}", render(&plan))?;
            Ok(())
        }
    }
}

fn mode(plan: &Plan) -> String {
    match plan.mode {
        CrossSiteMode::Pipeline if plan.site_order.len() > 1 => {
            "pipeline stages across sites".to_string()
        }
        CrossSiteMode::Pipeline => "one site".to_string(),
        CrossSiteMode::Diloco { inner_steps } => {
            format!("DiLoCo replicas per site, outer sync every {inner_steps} steps")
        }
        CrossSiteMode::DataParallel => {
            "replicas per site, the gradient all-reduced across sites every step".to_string()
        }
    }
}

/// The readable form of a plan.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let d = &plan.degrees;
    let _ = writeln!(
        out,
        "plan for {} on {}: {}\n  tp={} pp={} dp={}{}{} = {} GPUs, {} micro-batches of {}, order {}",
        plan.job,
        plan.topology,
        mode(plan),
        d.tensor_parallel,
        d.pipeline_parallel,
        d.data_parallel,
        if d.expert_parallel > 1 {
            format!(" (experts over ep={})", d.expert_parallel)
        } else {
            String::new()
        },
        if d.virtual_stages > 1 {
            format!(" (interleaved ×{})", d.virtual_stages)
        } else {
            String::new()
        },
        thousands(plan.gpus()),
        d.micro_batches,
        d.micro_batch_size,
        plan.parallel_order,
    );
    let _ = writeln!(
        out,
        "  sites along the pipeline: {}",
        plan.site_order.join(" → ")
    );

    let s = &plan.step;
    let _ = writeln!(out, "\npredicted step time {}", human_seconds(s.total));
    let mut table = Table::new(&[("part", false), ("time", true), ("share", true)]);
    let sync_part = match plan.mode {
        CrossSiteMode::DataParallel => "WAN all-reduce",
        CrossSiteMode::Pipeline | CrossSiteMode::Diloco { .. } => "outer sync (amortised)",
    };
    for (name, value) in [
        ("compute", s.compute),
        ("tensor parallel", s.tensor_parallel),
        ("expert all-to-all", s.expert_parallel),
        ("exposed pipeline", s.exposed_pipeline),
        ("bubble", s.bubble),
        ("exposed data parallel", s.exposed_data_parallel),
        (sync_part, s.outer_sync_amortised),
    ] {
        // A dense model has no all-to-all; its row would only say so.
        if name == "expert all-to-all" && value == 0.0 {
            continue;
        }
        let share = if s.total > 0.0 {
            value / s.total * 100.0
        } else {
            0.0
        };
        table.row(vec![
            name.into(),
            human_seconds(value),
            format!("{share:.1}%"),
        ]);
    }
    table.row(vec!["total".into(), human_seconds(s.total), "100%".into()]);
    out.push_str(&table.render(2));
    if let Some(sync) = &plan.sync {
        let _ = writeln!(
            out,
            "  outer sync (the sync planner's; `longhaul sync plan` for all of it): every {} \
             steps, {} fragment(s), overlap {} step(s), {}-bit; {} of each outer step exposed, \
             predicted compute utilisation {:.2} %",
            sync.inner_steps,
            sync.fragments,
            sync.overlap_steps,
            sync.bits(),
            human_seconds(plan.outer_sync_seconds),
            sync.predicted_compute_utilisation * 100.0
        );
    } else if plan.mode == CrossSiteMode::DataParallel {
        let _ = writeln!(
            out,
            "  every step all-reduces the whole gradient across the sites at the training \
             precision: {} of each step waits for it",
            human_seconds(plan.outer_sync_seconds)
        );
    } else if plan.outer_sync_seconds > 0.0 {
        let _ = writeln!(
            out,
            "  one outer sync takes {}",
            human_seconds(plan.outer_sync_seconds)
        );
    }

    out.push_str("\npipelines\n");
    let groups = plan.groups.len();
    for (g, group) in plan.groups.iter().enumerate() {
        let (branch, stem) = if g + 1 == groups {
            ("└─", "   ")
        } else {
            ("├─", "│  ")
        };
        let last = group.first_replica + group.replicas.saturating_sub(1);
        let _ = writeln!(
            out,
            "{branch} replicas {}–{last} ({}), inner step {}",
            group.first_replica,
            group.replicas,
            human_seconds(group.step_seconds)
        );
        let stages = group.stages.len();
        for (i, stage) in group.stages.iter().enumerate() {
            let twig = if i + 1 == stages { "└─" } else { "├─" };
            let places: Vec<String> = stage
                .slices
                .iter()
                .map(|slice| {
                    format!(
                        "{}/{} ×{}",
                        slice.building, slice.domain_group, slice.tp_groups
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "{stem}{twig} stage {i}: layers {}–{} at {} [{}], {} per GPU, {} slack",
                stage.first_layer,
                stage.first_layer + stage.layers.saturating_sub(1),
                stage.site,
                places.join(", "),
                human_bytes(stage.memory_bytes_per_gpu),
                human_bytes(stage.memory_slack_bytes),
            );
        }
    }

    if !plan.wan.is_empty() {
        out.push_str("\nWAN traffic per step\n");
        let mut table = Table::new(&[("link", false), ("bytes", true), ("what", false)]);
        for traffic in &plan.wan {
            table.row(vec![
                format!("{} – {}", traffic.between[0], traffic.between[1]),
                human_bytes(traffic.bytes_per_step),
                traffic.what.clone(),
            ]);
        }
        out.push_str(&table.render(2));
    }
    let _ = writeln!(
        out,
        "\nminimum memory slack per GPU: {}",
        human_bytes(plan.min_memory_slack_bytes)
    );

    out.push_str("\nwhy\n");
    for reason in &plan.reasons {
        let _ = writeln!(
            out,
            "  {}: {} — {}",
            reason.decision, reason.choice, reason.reason
        );
    }
    out
}
