//! Placement on the shipped example topologies and jobs.

use longhaul_core::placement::{CrossSiteMode, PlacementError, Plan, place, validate_plan};
use longhaul_core::{JobSpec, Topology};

fn load(topology: &str, topology_text: &str, job: &str, job_text: &str) -> (Topology, JobSpec) {
    let t = Topology::from_toml(topology, topology_text).expect("example topology parses");
    let j = JobSpec::from_toml(job, job_text).expect("example job parses");
    (t, j)
}

fn summary(plan: &Plan) -> String {
    serde_json::to_string_pretty(&(
        &plan.mode,
        &plan.degrees,
        &plan.site_order,
        &plan.step,
        &plan.wan,
        plan.min_memory_slack_bytes,
        &plan.reasons,
    ))
    .expect("plan serialises")
}

fn check_common(topology: &Topology, job: &JobSpec, plan: &Plan) {
    validate_plan(topology, job, plan).expect("plan is valid");
    assert!(plan.reasons.len() >= 5);
    assert!(
        plan.reasons
            .iter()
            .all(|r| !r.reason.is_empty() && !r.choice.is_empty())
    );
    // Every TP group sits in one domain: all tp ranks of a group share it.
    let tp = u64::from(plan.degrees.tensor_parallel);
    let bindings: Vec<_> = plan.bindings().take(4096).collect();
    for group in bindings.chunks(tp as usize) {
        let first = &group[0];
        assert!(group.iter().all(|b| b.site == first.site
            && b.building == first.building
            && b.domain_group == first.domain_group
            && b.domain == first.domain));
    }
    let json = serde_json::to_string(plan).expect("plan serialises");
    let back: Plan = serde_json::from_str(&json).expect("plan parses back");
    assert_eq!(&back, plan);
}

#[test]
fn llama_70b_on_two_campuses_80km() {
    let (topology, job) = load(
        "two-campuses-80km.toml",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
        "llama-70b.job.toml",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    );
    let plan = place(&topology, &job).expect("feasible");
    println!("{}", summary(&plan));
    check_common(&topology, &job, &plan);
    // At 80 km (0.9 ms RTT, 6.4 Tbit/s) the model prefers one synchronous
    // pipeline whose GB200 stages sit north and H100 stages south over
    // DiLoCo; the reason names the alternatives it beat.
    assert_eq!(plan.mode, CrossSiteMode::Pipeline);
    let mode = plan.reason("mode").expect("mode reason");
    assert!(mode.reason.contains("best single-site"), "{}", mode.reason);
    assert!(mode.reason.contains("diloco"), "{}", mode.reason);
    assert_eq!(plan.step.outer_sync_amortised, 0.0);
}

#[test]
fn dense_400b_on_two_continents_uses_diloco() {
    let (topology, job) = load(
        "three-sites-two-continents.toml",
        include_str!("../../../deploy/examples/three-sites-two-continents.toml"),
        "dense-400b.job.toml",
        include_str!("../../../deploy/examples/dense-400b.job.toml"),
    );
    let plan = place(&topology, &job).expect("feasible");
    println!("{}", summary(&plan));
    check_common(&topology, &job, &plan);
    // It says what synchronous data parallelism on the same sites costs:
    // the whole bf16 gradient every step, much slower across an ocean.
    let dp = plan
        .reason("synchronous data parallelism")
        .expect("a DiLoCo plan states what sync DP would cost");
    assert!(dp.reason.contains("at 16 bits: step "), "{}", dp.reason);
    let worse: f64 = dp
        .reason
        .split(" (+")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|p| p.parse().ok())
        .expect("a positive percentage");
    assert!(worse > 50.0, "{}", dp.reason);
    assert!(matches!(
        plan.mode,
        CrossSiteMode::Diloco { inner_steps: 100 }
    ));
}

#[test]
fn llama_70b_without_model_parallelism_is_rejected_with_the_memory_shortfall() {
    let (topology, mut job) = load(
        "two-campuses-80km.toml",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
        "llama-70b.job.toml",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    );
    job.constraints.tensor_parallel = Some(1);
    job.constraints.pipeline_parallel = Some(1);
    let error = place(&topology, &job).expect_err("70B of state cannot fit one GPU");
    match &error {
        PlacementError::OutOfMemory {
            short_bytes,
            candidate,
        } => {
            // Weights and gradients alone are 4 bytes × 70.6e9 parameters.
            assert!(*short_bytes > 200e9, "{error}");
            assert!(candidate.contains("tp=1 pp=1"), "{error}");
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    println!("{error}");
}

/// The 70B job on the hyperscale example under each objective: the
/// fastest plan uses the most GPUs; `fewest-gpus` stays within its slowdown
/// on fewer; `throughput-per-gpu` gets the most tokens per GPU; a GPU
/// budget is never exceeded; each plan states its objective and the
/// runner-up it rejected.
#[test]
fn each_objective_on_the_hyperscale_example_gets_what_it_asks() {
    use longhaul_core::job::{Goal, Objective};
    let (topology, job) = load(
        "hyperscale-plus-two.toml",
        include_str!("../../../deploy/examples/hyperscale-plus-two.toml"),
        "llama-70b.job.toml",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    );
    let with = |objective: Objective| {
        let mut job = job.clone();
        job.objective = objective;
        let plan = place(&topology, &job).expect("feasible");
        check_common(&topology, &job, &plan);
        let stated = plan.reason("objective").expect("the objective is stated");
        assert_eq!(stated.choice, objective.describe());
        assert!(stated.reason.contains("GPUs"), "{}", stated.reason);
        plan
    };
    let per_gpu = |p: &Plan| 1.0 / (p.step.total * p.gpus() as f64);
    let fastest = with(Objective::default());
    let fewest = with(Objective {
        goal: Goal::FewestGpus,
        within: Some(0.05),
        max_gpus: None,
    });
    let efficient = with(Objective {
        goal: Goal::ThroughputPerGpu,
        ..Objective::default()
    });
    let budget = with(Objective {
        max_gpus: Some(20_000),
        ..Objective::default()
    });
    for (name, p) in [
        ("fewest", &fewest),
        ("efficient", &efficient),
        ("budget", &budget),
    ] {
        assert!(p.step.total >= fastest.step.total * (1.0 - 1e-12), "{name}");
        assert!(p.gpus() < fastest.gpus(), "{name}: {} GPUs", p.gpus());
    }
    assert!(fewest.step.total <= fastest.step.total * 1.05);
    assert!(budget.gpus() <= 20_000);
    for p in [&fastest, &fewest, &budget] {
        assert!(per_gpu(&efficient) >= per_gpu(p) * (1.0 - 1e-12));
    }
    let rejected = &fastest.reason("objective").expect("stated").reason;
    assert!(
        rejected.contains("rejected the fewest-GPU plan within 5 % of this step"),
        "{rejected}"
    );
}

/// The shipped mixture-of-experts examples: the 671B one shards its experts and every
/// expert-parallel group of every stage sits in one site, on the three-continent topology
/// too, where DiLoCo spreads replicas over sites.
#[test]
fn the_moe_examples_place_their_expert_groups_inside_a_site() {
    let moe = include_str!("../../../deploy/examples/moe-671b.job.toml");
    for (name, text) in [
        (
            "hyperscale-plus-two.toml",
            include_str!("../../../deploy/examples/hyperscale-plus-two.toml"),
        ),
        (
            "three-sites-two-continents.toml",
            include_str!("../../../deploy/examples/three-sites-two-continents.toml"),
        ),
    ] {
        let (topology, job) = load(name, text, "moe-671b.job.toml", moe);
        let plan = place(&topology, &job).expect("feasible");
        check_common(&topology, &job, &plan);
        let d = plan.degrees;
        let ep = u64::from(d.expert_parallel);
        assert!(ep > 1, "{name}: {:#?}", plan.reasons);
        assert!(plan.step.expert_parallel > 0.0);
        let (tp, pp) = (u64::from(d.tensor_parallel), u64::from(d.pipeline_parallel));
        let mut site_of = std::collections::BTreeMap::new();
        for b in plan.bindings() {
            let (stage, replica) = ((b.rank / tp) % pp, b.rank / (tp * pp));
            let group = (stage, replica / ep);
            let site = site_of.entry(group).or_insert_with(|| b.site.clone());
            assert_eq!(*site, b.site, "{name}: expert group {group:?} spans sites");
        }
    }
    let (topology, job) = load(
        "hyperscale-plus-two.toml",
        include_str!("../../../deploy/examples/hyperscale-plus-two.toml"),
        "mixtral-8x22b.job.toml",
        include_str!("../../../deploy/examples/mixtral-8x22b.job.toml"),
    );
    let plan = place(&topology, &job).expect("feasible");
    check_common(&topology, &job, &plan);
    assert!(plan.reason("expert parallelism").is_some());
}
