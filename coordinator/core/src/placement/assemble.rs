//! Turns the search's best choice into a [`Plan`] with its reasons.

use std::collections::BTreeMap;

use super::model::Ctx;
use super::plan::{
    CrossSiteMode, Degrees, PipelineGroup, Plan, Reason, Slice, Stage, StepBreakdown, WanTraffic,
};
use super::replicas::{DATA_PARALLEL, Sync, subset_links};
use super::search::{Choice, Outcome};
use crate::job::{Goal, ModeConstraint};
use crate::topology::Topology;
use crate::units::{human_bytes, human_seconds};

pub(crate) fn plan(
    ctx: &Ctx<'_>,
    topology: &Topology,
    choice: &Choice,
    outcome: &Outcome,
    runner_up: Option<&Choice>,
) -> Plan {
    let job = ctx.job;
    let mut groups = Vec::with_capacity(choice.groups.len());
    let mut first_replica = 0u32;
    let mut min_slack = f64::INFINITY;
    for group in &choice.groups {
        let mut stages = Vec::with_capacity(group.split.len());
        let mut first_layer = 0u32;
        for (j, stage) in group.model.stages.iter().enumerate() {
            let site = &ctx.sites[stage.site];
            let slices = stage
                .slices
                .iter()
                .map(|s| {
                    let pool = &site.pools[s.pool];
                    Slice {
                        building: pool.building_id.clone(),
                        domain_group: pool.group_id.clone(),
                        first_slot: s.first,
                        tp_groups: s.count,
                        slots_per_domain: pool.slots_per_domain(choice.tp),
                        gpus_per_node: pool.gpus_per_node,
                    }
                })
                .collect();
            let memory = group.eval.memory[j];
            let slack = stage.usable_hbm - memory;
            min_slack = min_slack.min(slack);
            stages.push(Stage {
                first_layer,
                layers: group.split[j],
                site: site.id.clone(),
                slices,
                memory_bytes_per_gpu: memory,
                memory_slack_bytes: slack,
            });
            first_layer += group.split[j];
        }
        let replicas = u32::try_from(group.model.replicas).unwrap_or(u32::MAX);
        groups.push(PipelineGroup {
            first_replica,
            replicas,
            stages,
            step_seconds: group.eval.total,
        });
        first_replica += replicas;
    }

    // The slowest group sets the inner step; its breakdown is the plan's.
    let slowest = choice
        .groups
        .iter()
        .max_by(|a, b| a.eval.total.total_cmp(&b.eval.total))
        .map(|g| &g.eval);
    let inner_steps = match choice.mode {
        CrossSiteMode::Diloco { inner_steps } => inner_steps,
        CrossSiteMode::Pipeline | CrossSiteMode::DataParallel => 1,
    };
    let amortised = if choice.outer > 0.0 {
        choice.outer / f64::from(inner_steps)
    } else {
        0.0
    };
    let step = slowest.map_or(StepBreakdown::default(), |e| StepBreakdown {
        compute: e.compute,
        tensor_parallel: e.tensor_parallel,
        expert_parallel: e.expert_parallel,
        exposed_pipeline: e.pipeline.exposed_p2p,
        bubble: e.pipeline.bubble,
        exposed_data_parallel: e.exposed_dp,
        outer_sync_amortised: amortised,
        total: choice.total,
    });
    // `ideal` = compute + TP of the slowest stage, m times; keep the parts
    // summing to the total the search optimised.
    let wan = wan_traffic(ctx, choice, inner_steps);
    let site_names: Vec<String> = choice
        .site_order
        .iter()
        .map(|&s| ctx.sites[s].id.clone())
        .collect();
    let mut reasons = reasons(ctx, choice, outcome, &site_names, &groups, min_slack);
    reasons.insert(0, objective_reason(ctx, choice, runner_up));
    let mut plan = Plan {
        job: job.name.clone(),
        topology: topology.name.clone(),
        mode: choice.mode,
        degrees: Degrees {
            tensor_parallel: choice.tp,
            pipeline_parallel: choice.pp,
            data_parallel: choice.dp,
            virtual_stages: choice.v,
            micro_batches: choice.m,
            micro_batch_size: job.batch.micro_batch,
            expert_parallel: choice.ep,
        },
        parallel_order: "tp-pp-dp".to_string(),
        site_order: site_names,
        groups,
        step,
        outer_sync_seconds: choice.outer,
        wan,
        min_memory_slack_bytes: min_slack,
        reasons,
        // Only DiLoCo has outer rounds to schedule.
        sync: match choice.mode {
            CrossSiteMode::Diloco { .. } => choice.sync.as_deref().cloned(),
            CrossSiteMode::Pipeline | CrossSiteMode::DataParallel => None,
        },
    };
    if let Some(why) = sync_dp_reason(ctx, choice, &plan) {
        plan.reasons.push(why);
    }
    plan
}

/// For a DiLoCo plan, what synchronous data parallelism on the same replica
/// sites would cost ([`crate::sync::plan_sync_dp`]): the mode DiLoCo beat.
fn sync_dp_reason(ctx: &Ctx<'_>, choice: &Choice, plan: &Plan) -> Option<Reason> {
    let CrossSiteMode::Diloco { inner_steps } = choice.mode else {
        return None;
    };
    let placed = choice.sync.as_ref()?;
    let links = subset_links(ctx, &choice.site_order);
    let reason = match crate::sync::plan_sync_dp(plan, ctx.job, &links, ctx.params) {
        Ok(dp) => {
            // As the search costs cross-site data parallelism: the inner
            // step, and the WAN exchange of every step.
            let inner = choice.total - choice.outer / f64::from(inner_steps);
            let step = inner + dp.exposed_seconds_per_outer_step;
            format!(
                "the same replicas with the whole gradient exchanged every step at {} bits: \
                 step {} ({:+.1} % against this plan), {} over the WAN per step against {} \
                 amortised here",
                ctx.job.training.precision.bytes() * 8,
                human_seconds(step),
                100.0 * (step / choice.total - 1.0),
                human_bytes(dp.bytes_per_outer_step),
                human_bytes(placed.bytes_per_outer_step / f64::from(inner_steps)),
            )
        }
        Err(error) => format!("could not be costed on these sites: {error}"),
    };
    Some(self::reason(
        "synchronous data parallelism",
        "not chosen".to_string(),
        reason,
    ))
}

fn wan_traffic(ctx: &Ctx<'_>, choice: &Choice, inner_steps: u32) -> Vec<WanTraffic> {
    let mut by_pair: BTreeMap<(usize, usize), (f64, &'static str)> = BTreeMap::new();
    let key = |a: usize, b: usize| if a <= b { (a, b) } else { (b, a) };
    for group in &choice.groups {
        for &(a, b) in &group.model.wan_boundaries {
            // Activations forward and gradients backward, per micro-batch
            // and replica.
            let bytes = 2.0 * ctx.activation_bytes * choice.m as f64 * group.model.replicas as f64;
            by_pair
                .entry(key(a, b))
                .or_insert((0.0, "pipeline activations and gradients"))
                .0 += bytes;
        }
    }
    // A pipeline has no outer hops.
    let what = Sync::of(choice.mode).unwrap_or(Sync::Diloco).traffic();
    for &((a, b), bytes) in &choice.outer_hops {
        by_pair.entry(key(a, b)).or_insert((0.0, what)).0 += bytes / f64::from(inner_steps);
    }
    by_pair
        .into_iter()
        .map(|((a, b), (bytes, what))| WanTraffic {
            between: [ctx.sites[a].id.clone(), ctx.sites[b].id.clone()],
            bytes_per_step: bytes,
            what: what.to_string(),
        })
        .collect()
}

/// Tokens per second per GPU of a plan.
fn tokens_per_gpu_second(ctx: &Ctx<'_>, choice: &Choice) -> f64 {
    let tokens = f64::from(ctx.job.batch.global_batch) * f64::from(ctx.job.model.sequence_length);
    tokens / (choice.total * choice.gpus().max(1) as f64)
}

/// What the plan optimised, and the best plan of the other measure that it
/// rejected.
fn objective_reason(ctx: &Ctx<'_>, choice: &Choice, runner_up: Option<&Choice>) -> Reason {
    let objective = &ctx.job.objective;
    let describe = |c: &Choice| {
        format!(
            "{} on {} GPUs, {:.0} tokens/s per GPU",
            human_seconds(c.total),
            c.gpus(),
            tokens_per_gpu_second(ctx, c)
        )
    };
    let chosen = describe(choice);
    let why = match (objective.goal, runner_up) {
        (_, None) => format!("{chosen}; no other plan to compare"),
        (Goal::StepTime, Some(other)) if other.gpus() >= choice.gpus() => format!(
            "{chosen}; no plan within {} % of this step uses fewer GPUs",
            100.0 * crate::job::DEFAULT_WITHIN
        ),
        (Goal::StepTime, Some(other)) => format!(
            "{chosen}; rejected the fewest-GPU plan within {} % of this step, {} ({:+.1} % \
             step, {:.2}× the GPUs): set [objective] goal = \"fewest-gpus\" (or \
             \"throughput-per-gpu\") to prefer such plans",
            100.0 * crate::job::DEFAULT_WITHIN,
            describe(other),
            100.0 * (other.total / choice.total - 1.0),
            other.gpus() as f64 / choice.gpus() as f64
        ),
        (_, Some(other)) if other.gpus() <= choice.gpus() => {
            format!("{chosen}; it is also the fastest plan")
        }
        (_, Some(other)) => format!(
            "{chosen} ({:+.1} % step against the fastest); rejected the fastest plan, {}, which \
             needs {:.2}× the GPUs",
            100.0 * (choice.total / other.total - 1.0),
            describe(other),
            other.gpus() as f64 / choice.gpus() as f64
        ),
    };
    reason("objective", objective.describe(), why)
}

fn reason(decision: &str, choice: String, reason: String) -> Reason {
    Reason {
        decision: decision.to_string(),
        choice,
        reason,
    }
}

fn reasons(
    ctx: &Ctx<'_>,
    choice: &Choice,
    outcome: &Outcome,
    sites: &[String],
    groups: &[PipelineGroup],
    min_slack: f64,
) -> Vec<Reason> {
    let job = ctx.job;
    let kind = choice.kind();
    let alternatives: Vec<String> = outcome
        .best_by_kind
        .iter()
        .filter(|(k, _)| **k != kind)
        .map(|(k, t)| format!("best {k} plan {}", human_seconds(*t)))
        .collect();
    // Kinds the search considered but never costed were infeasible or cut
    // by a lower bound that already lost to the chosen plan.
    let multi_site = ctx.sites.len() >= 2;
    let allowed = |mode: ModeConstraint| job.constraints.cross_site_mode.is_none_or(|m| m == mode);
    let replicated = multi_site && choice.dp >= 2;
    let mut alternatives = alternatives;
    for (considered, other) in [
        (allowed(ModeConstraint::Pipeline), "single-site"),
        (
            multi_site && allowed(ModeConstraint::Pipeline),
            "cross-site pipeline",
        ),
        (replicated && allowed(ModeConstraint::Diloco), "diloco"),
        (
            replicated && allowed(ModeConstraint::DataParallel),
            DATA_PARALLEL,
        ),
    ] {
        if considered && other != kind && !outcome.best_by_kind.contains_key(other) {
            alternatives.push(format!(
                "every {other} candidate was infeasible or provably slower"
            ));
        }
    }
    let alternatives = if alternatives.is_empty() {
        "no other kind of plan applies".to_string()
    } else {
        alternatives.join(", ")
    };
    let mode_reason = match choice.mode {
        CrossSiteMode::Diloco { inner_steps } => format!(
            "replicas train per site and sync every {inner_steps} steps (the sync planner's H): \
             {} of each outer step's sync is exposed ({} per step amortised), cheaper than \
             crossing the WAN every step; {alternatives}",
            human_seconds(choice.outer),
            human_seconds(choice.outer / f64::from(inner_steps))
        ),
        CrossSiteMode::DataParallel => format!(
            "replicas train per site and all-reduce the whole gradient across the WAN every \
             step, the synchronous algorithm: {} of each step waits for it; {alternatives}",
            human_seconds(choice.outer),
        ),
        CrossSiteMode::Pipeline if sites.len() > 1 => format!(
            "stages span {} with only activations crossing the WAN each micro-batch, each \
             stage's data-parallel group stays in its site; {alternatives}",
            sites.join("→")
        ),
        CrossSiteMode::Pipeline => format!(
            "the whole job fits in {} and no cross-site plan predicts a shorter step; \
             {alternatives}",
            sites.join("")
        ),
    };
    let largest_domain = ctx.largest_domain_gpus();
    let splits: Vec<String> = groups
        .iter()
        .map(|g| {
            let layers: Vec<String> = g.stages.iter().map(|s| s.layers.to_string()).collect();
            {
                let mut sites: Vec<&str> = Vec::new();
                for stage in &g.stages {
                    if sites.last() != Some(&stage.site.as_str()) {
                        sites.push(&stage.site);
                    }
                }
                format!(
                    "{} replica(s) on {}: [{}]",
                    g.replicas,
                    sites.join("→"),
                    layers.join(", ")
                )
            }
        })
        .collect();
    let experts = job.model.moe.as_ref().map(|moe| {
        let all_to_all = choice
            .groups
            .iter()
            .map(|g| g.eval.expert_parallel)
            .fold(0.0, f64::max);
        let (e, k, ep) = (moe.experts, moe.top_k, choice.ep);
        let searched = if job.constraints.expert_parallel.is_some() {
            "as constraints.expert_parallel fixes".to_string()
        } else {
            format!(
                "every degree dividing {e} and the replicas was searched (costed, or cut by a \
                 bound), and none predicted a better plan for the objective"
            )
        };
        let why = if ep > 1 {
            format!(
                "each group of {ep} consecutive replicas of a stage shares out the {e} experts \
                 ({} each, top-{k} routing) inside one site, which holds the experts' weights and \
                 gradients {ep} times fewer and shrinks their all-reduce; its all-to-all costs {} \
                 per step on the slowest stage; {searched}",
                e / ep,
                human_seconds(all_to_all),
            )
        } else {
            format!(
                "every replica holds all {e} experts (top-{k} routing), so no all-to-all; \
                 {searched}"
            )
        };
        reason("expert parallelism", format!("ep={ep}"), why)
    });
    let mut out = vec![
        reason("mode", kind.to_string(), mode_reason),
        reason(
            "degrees",
            format!("tp={} pp={} dp={}", choice.tp, choice.pp, choice.dp),
            format!(
                "best for the objective (step {}) of {} feasible candidates; TP {} divides {} \
                 and stays inside one scale-up domain (largest {} GPUs) so its collectives ride \
                 NVLink",
                human_seconds(choice.total),
                outcome.candidates,
                choice.tp,
                match job.model.kv_heads {
                    Some(kv) if kv != job.model.attention_heads => format!(
                        "{kv} key-value heads (of {} attention heads)",
                        job.model.attention_heads
                    ),
                    _ => format!("{} heads", job.model.attention_heads),
                },
                largest_domain
            ),
        ),
        reason(
            "micro-batches",
            format!("{} of {}", choice.m, job.batch.micro_batch),
            format!(
                "global batch {} / (dp {} × micro-batch {}); bubble (p−1)/(v·m) = {:.3}",
                job.batch.global_batch,
                choice.dp,
                job.batch.micro_batch,
                f64::from(choice.pp - 1) / (f64::from(choice.v) * choice.m as f64)
            ),
        ),
        reason(
            "interleaving",
            format!("v={}", choice.v),
            if choice.v > 1 {
                "interleaved stages shrink the bubble more than they add memory and p2p".to_string()
            } else {
                "plain 1F1B: interleaving did not predict a shorter step, needs m divisible by p, \
                 or the pipeline crosses sites"
                    .to_string()
            },
        ),
        reason(
            "layer split",
            splits.join("; "),
            "contiguous layer ranges minimising the slowest stage (compute + TP) and the slowest \
             DP all-reduce, within each stage's memory"
                .to_string(),
        ),
        reason(
            "site order",
            sites.join("→"),
            match choice.mode {
                CrossSiteMode::Diloco { .. } | CrossSiteMode::DataParallel => {
                    choice.sync.as_ref().map_or_else(
                        || "the outer sync's collective".to_string(),
                        |sync| {
                            sync.reason("collective")
                                .map_or("the sync planner's collective", |r| r.reason.as_str())
                                .to_string()
                        },
                    )
                }
                CrossSiteMode::Pipeline => {
                    "pipeline order with consecutive sites linked, chosen by predicted step time"
                        .to_string()
                }
            },
        ),
        reason(
            "site search",
            match outcome.gap() {
                None => "exact".to_string(),
                Some(gap) => format!("within {:.1} % of the optimum", 100.0 * gap),
            },
            match outcome.gap() {
                None if outcome.budget.enumerated => {
                    "every site order and subset enumerated, without the branch and bound"
                        .to_string()
                }
                None => format!(
                    "branch and bound over site orders and subsets ({} nodes): every plan it cut \
                     had a lower bound above this one's step",
                    outcome.budget.nodes
                ),
                Some(_) => format!(
                    "the search's budget ({} site-search nodes, {} per set of degrees, {} groups \
                     costed) ran out before the branch and bound finished, so the rest was \
                     searched greedily; the gap is this plan's objective against the best bound \
                     of any plan left unexplored",
                    outcome.budget.limit,
                    super::sites::NODES_PER_SEARCH,
                    super::sites::EVALUATION_BUDGET,
                ),
            },
        ),
        reason(
            "packing",
            "fastest pools first, stage after stage".to_string(),
            format!(
                "each TP group takes {} GPUs of one scale-up domain, never two; a stage's replicas \
                 sit together to keep its DP ring short and neighbouring stages are adjacent; min \
                 memory slack {} per GPU",
                choice.tp,
                human_bytes(min_slack)
            ),
        ),
    ];
    // After the degrees.
    if let Some(experts) = experts {
        out.insert(2, experts);
    }
    out
}
