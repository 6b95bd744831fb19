//! `longhaul sync`: the sync planner's schedule of a DiLoCo job.
//!
//! `sync plan` is a what-if on files (no coordinator): it places the job
//! and prints how its replica sites would synchronise (H, fragments,
//! overlap, codec and bytes per link, predicted utilisation, reduction
//! against synchronous data parallelism), each decision with its reason.
//! `sync show` asks a running coordinator for a stored job's schedule.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use longhaul_core::job::ModeConstraint;
use longhaul_core::placement::{CrossSiteMode, Plan};
use longhaul_core::sync::{CollectiveKind, SyncPlan};
use longhaul_core::units::{human_bytes, human_rate, human_seconds};
use longhaul_proto::v1 as pb;

use super::plan::{load_inputs, place_job};
use super::remote::{Remote, call, runtime};
use super::table::Table;
use super::{Failure, Output, print_json};

#[derive(Debug, Subcommand)]
pub enum SyncCommand {
    /// Plan the outer sync of a job on a topology (no coordinator needed):
    /// H, fragments, overlap, codec per link, WAN bytes per outer step,
    /// predicted compute utilisation and the reduction against synchronous
    /// data parallelism, each with its reason. A job that placement would
    /// not run as DiLoCo is planned as its best DiLoCo placement, and the
    /// output says so.
    Plan(SyncPlanArgs),
    /// The sync schedule of a job stored in a running coordinator.
    Show {
        #[command(flatten)]
        remote: Remote,
        /// The job's id.
        job: String,
    },
}

#[derive(Debug, Args)]
pub struct SyncPlanArgs {
    /// The topology file; the bundled two-campuses-80km example when omitted.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    /// The job file; the bundled llama-70b example when omitted.
    #[arg(long)]
    pub job: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

pub fn sync(command: SyncCommand, out: &mut dyn Write) -> Result<(), Failure> {
    match command {
        SyncCommand::Plan(args) => plan(&args, out),
        SyncCommand::Show { remote, job } => show(&remote, &job, out),
    }
}

/// What `sync plan` planned: the placement it planned for, and why that one.
struct WhatIf {
    plan: Plan,
    /// Set when the job's own best placement is not DiLoCo: its mode and
    /// predicted step.
    preferred: Option<(String, f64)>,
}

fn what_if(args: &SyncPlanArgs) -> Result<WhatIf, Failure> {
    let (topology, job) = load_inputs(args.topology.as_ref(), args.job.as_ref())?;
    let best = place_job(&topology, &job)?;
    if best.sync.is_some() {
        return Ok(WhatIf {
            plan: best,
            preferred: None,
        });
    }
    if let Some(mode @ (ModeConstraint::Pipeline | ModeConstraint::DataParallel)) =
        job.constraints.cross_site_mode
    {
        return Err(anyhow::anyhow!(
            "job {:?} sets constraints.cross_site_mode = \"{}\": it has no outer sync to plan",
            job.name,
            mode.as_str()
        )
        .into());
    }
    let mode = match best.mode {
        CrossSiteMode::Pipeline if best.site_order.len() > 1 => "a cross-site pipeline",
        CrossSiteMode::DataParallel => "cross-site data parallelism",
        _ => "one site",
    };
    let mut as_diloco = job.clone();
    as_diloco.constraints.cross_site_mode = Some(ModeConstraint::Diloco);
    let plan = place_job(&topology, &as_diloco)?;
    Ok(WhatIf {
        plan,
        preferred: Some((mode.to_string(), best.step.total)),
    })
}

fn plan(args: &SyncPlanArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let what_if = what_if(args)?;
    let plan = &what_if.plan;
    let Some(sync) = &plan.sync else {
        return Err(anyhow::anyhow!("placement returned a DiLoCo plan without a schedule").into());
    };
    match args.output {
        Output::Json => {
            let mut doc = serde_json::to_value(sync).map_err(anyhow::Error::from)?;
            if let Some(fields) = doc.as_object_mut() {
                fields.insert("job".into(), plan.job.clone().into());
                fields.insert("topology".into(), plan.topology.clone().into());
                fields.insert("predicted_step_seconds".into(), plan.step.total.into());
                fields.insert(
                    "placement_preferred".into(),
                    match &what_if.preferred {
                        Some((mode, step)) => serde_json::json!({
                            "mode": mode,
                            "predicted_step_seconds": step,
                        }),
                        None => serde_json::Value::Null,
                    },
                );
            }
            print_json(&doc, out)
        }
        Output::Text => {
            let mut text = format!(
                "sync plan for {} on {}: DiLoCo replicas at {}\n",
                plan.job,
                plan.topology,
                plan.site_order.join(", ")
            );
            if let Some((mode, step)) = &what_if.preferred {
                let _ = writeln!(
                    text,
                    "  note: placement prefers {mode} for this job (predicted step {}); this is \
                     its best DiLoCo placement (predicted step {}), as with \
                     constraints.cross_site_mode = \"diloco\"",
                    human_seconds(*step),
                    human_seconds(plan.step.total)
                );
            }
            text.push_str(&render(sync));
            write!(out, "{text}")?;
            Ok(())
        }
    }
}

fn show(remote: &Remote, job: &str, out: &mut dyn Write) -> Result<(), Failure> {
    let allow_stale = remote.stale;
    let response = runtime()?.block_on(call(remote, |mut c| {
        let request = pb::GetSyncScheduleRequest {
            job_id: job.to_string(),
            allow_stale,
        };
        async move { c.get_sync_schedule(request).await }
    }))?;
    let revision = response.header.unwrap_or_default().revision;
    let schedule = response.schedule.unwrap_or_default();
    let sync: Option<SyncPlan> = if schedule.planned {
        Some(serde_json::from_str(&schedule.canonical_json).map_err(|e| {
            anyhow::anyhow!("the coordinator's schedule of {job:?} does not parse: {e}")
        })?)
    } else {
        None
    };
    match remote.output {
        Output::Json => {
            let mut doc = match &sync {
                Some(sync) => serde_json::to_value(sync).map_err(anyhow::Error::from)?,
                None => serde_json::json!({
                    "inner_steps": schedule.inner_steps,
                    "fragments": schedule.fragments,
                }),
            };
            if let Some(fields) = doc.as_object_mut() {
                fields.insert("job".into(), job.into());
                fields.insert("revision".into(), revision.into());
                fields.insert("planned".into(), schedule.planned.into());
            }
            print_json(&doc, out)
        }
        Output::Text => {
            let mut text = format!("sync schedule of job {job:?} at revision {revision}\n");
            match &sync {
                Some(sync) => text.push_str(&render(sync)),
                None => {
                    let _ = writeln!(
                        text,
                        "  every {} steps, the whole pseudo-gradient at the training precision \
                         (placed before the sync planner existed; re-submit to plan it)",
                        schedule.inner_steps
                    );
                }
            }
            write!(out, "{text}")?;
            Ok(())
        }
    }
}

/// The readable form of a sync plan.
pub fn render(sync: &SyncPlan) -> String {
    let mut out = String::new();
    let collective = match sync.collective.kind {
        CollectiveKind::ReduceScatterAllGather => "reduce-scatter + all-gather over the full mesh",
        CollectiveKind::Ring => "ring",
    };
    let _ = writeln!(
        out,
        "  H = {} inner steps of {}, P = {} fragment(s), overlap τ = {} step(s), {} ({})",
        sync.inner_steps,
        human_seconds(sync.inner_step_seconds),
        sync.fragments,
        sync.overlap_steps,
        collective,
        sync.collective.order.join(" → ")
    );
    let _ = writeln!(
        out,
        "  predicted compute utilisation {:.2} % (target {:.2} %{}); {} of sync exposed per outer \
         step of {}",
        sync.predicted_compute_utilisation * 100.0,
        sync.target_compute_utilisation * 100.0,
        if sync.meets_target {
            ", met"
        } else {
            ", NOT met"
        },
        human_seconds(sync.exposed_seconds_per_outer_step),
        human_seconds(sync.outer_step_seconds)
    );
    let _ = writeln!(
        out,
        "  WAN bytes per outer step {} ({} per inner step); reduction against synchronous data \
         parallelism {:.0}×",
        human_bytes(sync.bytes_per_outer_step),
        human_bytes(sync.bytes_per_inner_step),
        sync.reduction_vs_sync_dp
    );

    out.push_str("\nlinks\n");
    let mut table = Table::new(&[
        ("link", false),
        ("bits", true),
        ("block", true),
        ("zstd", false),
        ("rate", true),
        ("RTT", true),
        ("per fragment", true),
        ("bytes/outer step", true),
        ("reduction", true),
        ("figures", false),
    ]);
    for link in &sync.links {
        table.row(vec![
            format!("{} – {}", link.between[0], link.between[1]),
            link.bits.to_string(),
            link.block_size.to_string(),
            if link.zstd { "yes" } else { "no" }.into(),
            human_rate(link.rate_bits_per_second),
            human_seconds(link.rtt_seconds),
            human_seconds(link.transfer_seconds_per_fragment),
            human_bytes(link.bytes_per_outer_step),
            format!("{:.0}×", link.reduction_vs_sync_dp),
            if link.measured {
                "measured"
            } else {
                "configured"
            }
            .into(),
        ]);
    }
    out.push_str(&table.render(2));

    out.push_str("\nfragments (inner step after which each starts, and by which it applies)\n");
    let shown: Vec<usize> = if sync.schedule.len() <= 8 {
        (0..sync.schedule.len()).collect()
    } else {
        vec![0, 1, 2, sync.schedule.len() - 2, sync.schedule.len() - 1]
    };
    let mut last = None;
    for i in shown {
        if last.is_some_and(|l| i > l + 1) {
            let _ = writeln!(out, "  …");
        }
        let f = &sync.schedule[i];
        let _ = writeln!(
            out,
            "  fragment {}: parameters {}…{} ({}), starts after step {}, applied by step {}",
            f.fragment,
            f.first_parameter,
            f.first_parameter + f.parameters.saturating_sub(1),
            human_count(f.parameters),
            f.sync_at_inner_step,
            f.apply_at_inner_step
        );
        last = Some(i);
    }

    out.push_str("\nwhy\n");
    for reason in &sync.reasons {
        let _ = writeln!(
            out,
            "  {}: {} — {}",
            reason.decision, reason.choice, reason.reason
        );
    }
    for link in &sync.links {
        let _ = writeln!(
            out,
            "  link {} – {}: {}",
            link.between[0], link.between[1], link.reason
        );
    }
    out
}

/// A parameter count in the units model sizes are quoted in.
fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} M", n / 1e6)
    } else {
        format!("{n:.0}")
    }
}
