//! The sync planner against brute force on random small instances, its
//! monotonicity, and its output on the shipped examples and the aim.
//!
//! Random instances come from `longhaul_core::rng::SeedRng`; a failure
//! prints the seed and the instance, which replay exactly.

use std::time::Instant;

use longhaul_core::JobSpec;
use longhaul_core::cost::CostParams;
use longhaul_core::job::Diloco;
use longhaul_core::job::ModeConstraint;
use longhaul_core::placement::{CrossSiteMode, Plan, place, place_measured, validate_plan};
use longhaul_core::rng::{SeedRng, derive};
use longhaul_core::state::{LinkMeasurement, LinkRecord};
use longhaul_core::sync::{
    Codec, SyncError, SyncInput, SyncPlan, brute_force_plan_sync, configured_links,
    exposed_seconds, plan_sync,
};
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Site, Topology, WanLink};
use longhaul_core::units::{DataRate, Distance, Duration, human_bytes, human_rate, human_seconds};

const SEED: u64 = 0x005e_ed13;

fn link(a: usize, b: usize, km: f64, gbit: u64, parallel: u32, loss: f64) -> LinkRecord {
    LinkRecord {
        configured: WanLink {
            between: [format!("s{a}"), format!("s{b}")],
            distance: Distance::from_km(km).unwrap_or_default(),
            overhead: Duration::from_micros(20),
            parallel_links: parallel,
            link_rate: DataRate::from_gbit_per_second(gbit),
            loss,
            buffer: None,
        },
        measured: None,
    }
}

/// A random instance small enough for the brute force: 2–5 sites, links
/// that may be missing, lossy or measured, a policy with narrow ranges.
fn random_input(rng: &mut SeedRng, max_sites: u64) -> SyncInput {
    let sites = rng.between(2, max_sites) as usize;
    let mut links = Vec::new();
    for a in 0..sites {
        for b in a + 1..sites {
            if sites > 2 && rng.chance(0.12) {
                continue;
            }
            let rates = [1, 10, 40, 100, 400];
            let loss = if rng.chance(0.4) {
                10f64.powf(rng.uniform(-6.0, -3.0))
            } else {
                0.0
            };
            let mut record = link(
                a,
                b,
                rng.uniform(1.0, 8000.0),
                rates[rng.index(rates.len())],
                rng.between(1, 4) as u32,
                loss,
            );
            if rng.chance(0.3) {
                record.measured = Some(LinkMeasurement {
                    rtt_ns: if rng.chance(0.8) {
                        rng.between(100_000, 150_000_000)
                    } else {
                        0
                    },
                    loss_rate: if rng.chance(0.5) {
                        10f64.powf(rng.uniform(-6.0, -3.0))
                    } else {
                        0.0
                    },
                    throughput_bps: if rng.chance(0.7) {
                        rng.between(100_000_000, 800_000_000_000)
                    } else {
                        0
                    },
                    measured_at_unix_ms: 1,
                });
            }
            links.push(record);
        }
    }
    let mut codecs = Codec::standard();
    if rng.chance(0.3) {
        for codec in &mut codecs {
            codec.zstd_ratio = rng.uniform(1.0, 1.5);
        }
    }
    let inner_steps = rng.between(1, 60) as u32;
    let mut policy = Diloco::new(inner_steps);
    policy.max_inner_steps = Some(inner_steps + rng.between(0, 40) as u32);
    policy.target_compute_utilisation = Some(if rng.chance(0.1) {
        1.0
    } else {
        rng.uniform(0.5, 0.999)
    });
    policy.max_fragments = Some(rng.between(1, 8) as u32);
    if rng.chance(0.2) {
        policy.fragments = Some(rng.between(1, 8).min(u64::from(inner_steps)) as u32);
        policy.max_fragments = None;
    }
    policy.max_overlap_steps = Some(rng.between(0, 5) as u32);
    if rng.chance(0.3) {
        policy.bits = Some([4, 8, 16][rng.index(3)]);
    }
    if rng.chance(0.2) {
        policy.link_budget = Some(DataRate::from_bits_per_second(
            rng.between(100_000_000, 100_000_000_000),
        ));
    }
    SyncInput {
        parameters: 10f64.powf(rng.uniform(6.0, 11.0)) as u64,
        inner_step_seconds: 10f64.powf(rng.uniform(-2.0, 1.0)),
        sync_dp_bits: [16, 32][rng.index(2)],
        sites: (0..sites).map(|s| format!("s{s}")).collect(),
        links,
        streams_per_link: rng.between(1, 256),
        codecs,
        zstd_bytes_per_second: 10f64.powf(rng.uniform(8.0, 11.0)),
        policy,
    }
}

#[test]
fn the_solver_agrees_with_brute_force_on_700_random_instances() {
    let (mut planned, mut refused, mut rings, mut missed, mut raised) = (0, 0, 0, 0, 0);
    for case in 0..700 {
        let seed = derive(SEED, "brute-force", case);
        let input = random_input(&mut SeedRng::new(seed), 5);
        let solved = plan_sync(&input);
        let brute = brute_force_plan_sync(&input);
        match (&solved, &brute) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "seed {seed}: {input:?}");
                planned += 1;
                rings += usize::from(a.collective.steps > 2);
                missed += usize::from(!a.meets_target);
                raised += usize::from(a.inner_steps > input.policy.inner_steps);
            }
            (Err(SyncError::NoCollective(a)), Err(SyncError::NoCollective(b))) => {
                assert_eq!(a, b);
                refused += 1;
            }
            _ => panic!("seed {seed}: solver {solved:?}, brute force {brute:?}, {input:?}"),
        }
    }
    println!(
        "{planned} planned ({rings} rings, {missed} missing the target, {raised} with H raised), \
         {refused} without a collective"
    );
    // The instances exercise every branch of the order.
    assert!(planned >= 500 && rings > 20 && missed > 20 && raised > 20);
}

fn slower(input: &mut SyncInput, l: usize, factor: f64) {
    let record = &mut input.links[l];
    match &mut record.measured {
        Some(m) if m.throughput_bps > 0 => {
            m.throughput_bps = ((m.throughput_bps as f64 * factor) as u64).max(1);
        }
        _ => {
            let rate = record.configured.link_rate.bits_per_second();
            record.configured.link_rate =
                DataRate::from_bits_per_second(((rate as f64 * factor) as u64).max(1));
        }
    }
}

fn lossier(input: &mut SyncInput, l: usize, factor: f64) {
    let record = &mut input.links[l];
    match &mut record.measured {
        Some(m) => m.loss_rate = (m.loss_rate.max(1e-7) * factor).min(0.5),
        None => record.configured.loss = (record.configured.loss.max(1e-7) * factor).min(0.5),
    }
}

fn max_bits(plan: &SyncPlan) -> u32 {
    plan.links.iter().map(|l| l.bits).max().unwrap_or(0)
}

#[test]
fn a_slower_or_lossier_link_never_gets_a_smaller_h_or_more_bits() {
    let mut checked = 0;
    let mut grew = 0;
    for case in 0..500 {
        let seed = derive(SEED, "monotone", case);
        let mut rng = SeedRng::new(seed);
        let mut input = random_input(&mut rng, 6);
        // Wider H ranges than the brute force allows.
        input.policy.max_inner_steps = Some(input.policy.inner_steps * rng.between(1, 50) as u32);
        let Ok(before) = plan_sync(&input) else {
            continue;
        };
        let mut worse = input.clone();
        let l = rng.index(worse.links.len());
        if rng.chance(0.5) {
            slower(&mut worse, l, rng.uniform(0.05, 0.95));
        } else {
            lossier(&mut worse, l, rng.uniform(1.5, 100.0));
        }
        let after = plan_sync(&worse).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(
            after.inner_steps >= before.inner_steps,
            "seed {seed}: H {} → {} on {worse:?}",
            before.inner_steps,
            after.inner_steps
        );
        assert!(max_bits(&after) <= max_bits(&before), "seed {seed}");
        assert!(after.predicted_compute_utilisation <= 1.0);
        checked += 1;
        grew += usize::from(after.inner_steps > before.inner_steps);
    }
    println!("{checked} checked, H grew in {grew}");
    assert!(checked >= 300 && grew > 20);
}

#[test]
fn more_overlap_never_increases_exposed_time() {
    let mut rng = SeedRng::new(derive(SEED, "overlap", 0));
    for _ in 0..10_000 {
        let transfer = 10f64.powf(rng.uniform(-4.0, 2.0));
        let step = 10f64.powf(rng.uniform(-3.0, 1.0));
        let tau = rng.between(0, 63) as u32;
        assert!(exposed_seconds(transfer, tau + 1, step) <= exposed_seconds(transfer, tau, step));
    }
    // The planner: with H and P fixed and an unreachable target it
    // maximises utilisation, so allowing one more step of overlap never
    // exposes more; and when the target is reachable, never needs a larger H.
    for case in 0..300 {
        let seed = derive(SEED, "overlap-plan", case);
        let mut rng = SeedRng::new(seed);
        let input = random_input(&mut rng, 4);
        let mut fixed = input.clone();
        fixed.policy.max_inner_steps = Some(fixed.policy.inner_steps);
        fixed.policy.fragments = Some(1.max(fixed.policy.inner_steps.min(4)));
        fixed.policy.max_fragments = None;
        fixed.policy.target_compute_utilisation = Some(1.0);
        let mut more = fixed.clone();
        more.policy.max_overlap_steps = Some(fixed.policy.max_overlap_steps() + 1);
        if let (Ok(a), Ok(b)) = (plan_sync(&fixed), plan_sync(&more)) {
            assert!(
                b.exposed_seconds_per_outer_step <= a.exposed_seconds_per_outer_step,
                "seed {seed}"
            );
        }
        let mut more = input.clone();
        more.policy.max_overlap_steps = Some(input.policy.max_overlap_steps() + 1);
        if let (Ok(a), Ok(b)) = (plan_sync(&input), plan_sync(&more)) {
            assert!(
                b.inner_steps <= a.inner_steps || !b.meets_target,
                "seed {seed}"
            );
        }
    }
}

#[test]
fn the_commented_policy_of_the_example_jobs_parses_when_uncommented() {
    for (file, text) in [
        (
            "llama-70b.job.toml",
            include_str!("../../../deploy/examples/llama-70b.job.toml"),
        ),
        (
            "dense-400b.job.toml",
            include_str!("../../../deploy/examples/dense-400b.job.toml"),
        ),
    ] {
        let plain = JobSpec::from_toml(file, text).unwrap_or_else(|e| panic!("{e}"));
        let uncommented: String = text
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if rest.contains(" = ") => rest,
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let full = JobSpec::from_toml(file, &uncommented).unwrap_or_else(|e| panic!("{e}"));
        let (Some(plain), Some(full)) = (plain.diloco, full.diloco) else {
            panic!("{file} has no [diloco]");
        };
        // The values written in the comments are the defaults.
        assert_eq!(full.max_inner_steps(), plain.max_inner_steps(), "{file}");
        assert_eq!(
            full.target_compute_utilisation(),
            plain.target_compute_utilisation()
        );
        assert_eq!(full.max_fragments(), plain.max_fragments());
        assert_eq!(full.max_overlap_steps(), plain.max_overlap_steps());
        assert_eq!(full.bits, Some(4));
        assert!(full.error_feedback());
    }
}

// ---- Realistic instances -------------------------------------------------

fn hgx_site(id: &str, nodes: u32, gpu: &str) -> Site {
    Site {
        id: id.to_string(),
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
                id: "hgx".to_string(),
                count: nodes,
                nodes_per_domain: 1,
                gpus_per_node: 8,
                gpu: gpu.to_string(),
            }],
        }],
    }
}

fn two_sites(nodes: u32, km: f64, gbit: u64) -> Topology {
    Topology {
        name: format!("two-sites-{km}km-{gbit}g"),
        gpu_types: Vec::new(),
        sites: vec![
            hgx_site("east", nodes, "h100"),
            hgx_site("west", nodes, "h100"),
        ],
        links: vec![WanLink {
            between: ["east".to_string(), "west".to_string()],
            distance: Distance::from_km(km).unwrap_or_default(),
            overhead: Duration::from_micros(50),
            parallel_links: 1,
            link_rate: DataRate::from_gbit_per_second(gbit),
            loss: 0.0,
            buffer: None,
        }],
    }
}

fn job_file(text: &str) -> JobSpec {
    JobSpec::from_toml("job.toml", text).unwrap_or_else(|e| panic!("{e}"))
}

/// A dense model of `billions` parameters with a Llama-like shape.
fn dense_job(billions: u64, layers: u32, hidden: u32, heads: u32, inner_steps: u32) -> JobSpec {
    job_file(&format!(
        "name = \"dense-{billions}b\"\n[model]\nparameters = {}\nlayers = {layers}\n\
         hidden_size = {hidden}\nattention_heads = {heads}\nsequence_length = 4096\n\
         [batch]\nglobal_batch = 512\nmicro_batch = 1\n[constraints]\nmax_tensor_parallel = 8\n\
         [diloco]\ninner_steps = {inner_steps}\n",
        billions * 1_000_000_000
    ))
}

/// Places `job` on `topology` and plans its sync from configured links.
fn place_and_plan(topology: &Topology, job: &JobSpec) -> SyncPlan {
    let plan = place(topology, job).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(plan.mode, CrossSiteMode::Diloco { .. }),
        "{} on {} is placed as {:?}",
        job.name,
        topology.name,
        plan.mode
    );
    let input = SyncInput::from_plan(
        &plan,
        job,
        &configured_links(topology),
        &CostParams::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let sync = plan_sync(&input).unwrap_or_else(|e| panic!("{e}"));
    check_placement_agrees(&plan, &sync);
    sync
}

/// Placement costed `plan` with the planner's schedule: the plan carries
/// it, its H is the schedule's, its step includes the schedule's exposed
/// sync amortised over H, its WAN traffic is the schedule's bytes over H,
/// and the planner asked again about the placed plan answers the same.
fn check_placement_agrees(plan: &Plan, sync: &SyncPlan) {
    assert_eq!(
        plan.sync.as_ref(),
        Some(sync),
        "placement kept another schedule"
    );
    assert_eq!(
        plan.mode,
        CrossSiteMode::Diloco {
            inner_steps: sync.inner_steps
        }
    );
    let h = f64::from(sync.inner_steps);
    assert!(plan.outer_sync_seconds >= sync.exposed_seconds_per_outer_step);
    assert!(
        (plan.step.outer_sync_amortised - plan.outer_sync_seconds / h).abs()
            <= 1e-12 * plan.step.total.max(1.0)
    );
    let slowest = plan
        .groups
        .iter()
        .map(|g| g.step_seconds)
        .fold(0.0, f64::max);
    assert_eq!(sync.inner_step_seconds, slowest);
    for link in &sync.links {
        let traffic = plan
            .wan
            .iter()
            .find(|w| {
                let mut a = w.between.clone();
                let mut b = link.between.clone();
                a.sort();
                b.sort();
                a == b
            })
            .unwrap_or_else(|| panic!("no WAN traffic on {:?}", link.between));
        let expected = link.bytes_per_outer_step / h;
        assert!((traffic.bytes_per_step - expected).abs() <= 1e-9 * expected.max(1.0));
    }
    let mut sites = plan.site_order.clone();
    let mut synced = sync.sites.clone();
    sites.sort();
    synced.sort();
    assert_eq!(sites, synced);
}

fn describe(name: &str, plan: &SyncPlan) {
    println!(
        "== {name}\nH = {}, P = {}, τ = {}, {:?} over {:?}; inner step {}, fragment {} in {}; \
         exposed {} per outer step; utilisation {:.4} (target {}); {} per outer step; \
         reduction {:.0}×",
        plan.inner_steps,
        plan.fragments,
        plan.overlap_steps,
        plan.collective.kind,
        plan.collective.order,
        human_seconds(plan.inner_step_seconds),
        human_bytes(plan.fragment_bytes),
        human_seconds(plan.fragment_transfer_seconds),
        human_seconds(plan.exposed_seconds_per_outer_step),
        plan.predicted_compute_utilisation,
        plan.target_compute_utilisation,
        human_bytes(plan.bytes_per_outer_step),
        plan.reduction_vs_sync_dp
    );
    for link in &plan.links {
        println!(
            "  {}–{}: {} bits, {} per outer step (avg {}), {:.0}×; {}",
            link.between[0],
            link.between[1],
            link.bits,
            human_bytes(link.bytes_per_outer_step),
            human_rate(link.average_bits_per_second),
            link.reduction_vs_sync_dp,
            link.reason
        );
    }
    for reason in &plan.reasons {
        println!(
            "  {}: {} — {}",
            reason.decision, reason.choice, reason.reason
        );
    }
}

#[test]
fn a_1b_to_10b_model_on_10_gbit_s_syncs_1000_times_less_at_95_percent() {
    // Two sites of 32 HGX H100 nodes, 500 km apart on one 10 Gbit/s link;
    // DiLoCo's own H = 500.
    let topology = two_sites(32, 500.0, 10);
    for job in [
        dense_job(1, 16, 2048, 16, 500),
        dense_job(3, 28, 3072, 24, 500),
        dense_job(10, 40, 5120, 40, 500),
    ] {
        let plan = place_and_plan(&topology, &job);
        describe(&job.name, &plan);
        assert!(plan.reduction_vs_sync_dp >= 1000.0, "{}", job.name);
        assert!(plan.predicted_compute_utilisation >= 0.95, "{}", job.name);
        assert!(plan.meets_target);
    }
}

#[test]
fn llama_70b_on_two_campuses_500_km_apart_at_100_gbit_s() {
    let job = job_file(include_str!("../../../deploy/examples/llama-70b.job.toml"));
    // The bundled pair of campuses (GB200 north, H100 south, 16 × 400
    // Gbit/s): placement keeps the job in one site or one synchronous
    // pipeline, so there is no outer sync to plan.
    let bundled = Topology::from_toml(
        "two-campuses-500km.toml",
        include_str!("../../../deploy/examples/two-campuses-500km.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let placed = place(&bundled, &job).unwrap_or_else(|e| panic!("{e}"));
    assert!(!matches!(placed.mode, CrossSiteMode::Diloco { .. }));
    assert_eq!(
        SyncInput::from_plan(
            &placed,
            &job,
            &configured_links(&bundled),
            &CostParams::default()
        ),
        Err(SyncError::NotDiloco {
            job: "llama-70b".to_string()
        })
    );
    // Asked to train as DiLoCo there, it does, with the planner's schedule.
    let mut as_diloco = job.clone();
    as_diloco.constraints.cross_site_mode = Some(ModeConstraint::Diloco);
    let plan = place_and_plan(&bundled, &as_diloco);
    describe(
        "llama-70b as DiLoCo on the bundled campuses 500 km apart",
        &plan,
    );
    assert!(plan.meets_target);
    // Asked never to, on equal campuses that would, it does not.
    let mut as_pipeline = job.clone();
    as_pipeline.constraints.cross_site_mode = Some(ModeConstraint::Pipeline);
    let equal = two_sites(256, 500.0, 100);
    let placed = place(&equal, &as_pipeline).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(placed.mode, CrossSiteMode::Pipeline);
    assert_eq!(placed.sync, None);
    // Two equal campuses of 2,048 H100 each, 500 km apart on one
    // 100 Gbit/s link: DiLoCo replicas on both.
    let topology = two_sites(256, 500.0, 100);
    let plan = place_and_plan(&topology, &job);
    describe("llama-70b, two campuses 500 km, 100 Gbit/s", &plan);
    assert!(plan.meets_target);
    assert_eq!(plan.links.len(), 1);
    assert!(plan.reduction_vs_sync_dp >= 1000.0);
    // With the target at 99 % the exchange must hide behind compute.
    let mut strict = job.clone();
    if let Some(diloco) = &mut strict.diloco {
        diloco.target_compute_utilisation = Some(0.999);
    }
    let plan = place_and_plan(&topology, &strict);
    describe("llama-70b, 100 Gbit/s, target 99.9 %", &plan);
    assert!(plan.meets_target);
    assert!(plan.overlap_steps > 0);
}

#[test]
fn dense_400b_across_two_continents() {
    let topology = Topology::from_toml(
        "three-sites-two-continents.toml",
        include_str!("../../../deploy/examples/three-sites-two-continents.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let job = job_file(include_str!("../../../deploy/examples/dense-400b.job.toml"));
    let plan = place_and_plan(&topology, &job);
    describe("dense-400b, three sites on two continents", &plan);
    assert!(plan.reasons.iter().all(|r| !r.reason.is_empty()));
    let json = serde_json::to_string(&plan).unwrap_or_default();
    let back: SyncPlan = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, plan);
}

#[test]
fn measured_links_from_the_state_are_preferred_over_configured_ones() {
    let topology = two_sites(32, 500.0, 100);
    let job = dense_job(10, 40, 5120, 40, 500);
    let plan = place(&topology, &job).unwrap_or_else(|e| panic!("{e}"));
    let mut links = configured_links(&topology);
    let configured = plan_sync(
        &SyncInput::from_plan(&plan, &job, &links, &CostParams::default())
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The probes found 2 Gbit/s and 40 ms: H must rise.
    links[0].measured = Some(LinkMeasurement {
        rtt_ns: 40_000_000,
        loss_rate: 0.0,
        throughput_bps: 2_000_000_000,
        measured_at_unix_ms: 1,
    });
    let measured = plan_sync(
        &SyncInput::from_plan(&plan, &job, &links, &CostParams::default())
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    describe("10B, measured 2 Gbit/s", &measured);
    assert!(measured.inner_steps >= configured.inner_steps);
    assert_eq!(measured.links[0].rate_bits_per_second, 2e9);
    assert_eq!(measured.links[0].rtt_seconds, 0.04);
    assert!(
        measured.links[0]
            .reason
            .contains("measurement is preferred")
    );
}

#[test]
fn placement_reads_the_probes_and_a_slower_link_never_lowers_its_h() {
    let job = dense_job(10, 40, 5120, 40, 500);
    let mut last_h = 0;
    for gbit in [400, 100, 10, 1] {
        let topology = two_sites(32, 500.0, gbit);
        let plan = place(&topology, &job).unwrap_or_else(|e| panic!("{e}"));
        validate_plan(&topology, &job, &plan).unwrap_or_else(|e| panic!("{e:?}"));
        let CrossSiteMode::Diloco { inner_steps } = plan.mode else {
            panic!("{gbit} Gbit/s: placed as {:?}", plan.mode);
        };
        assert!(
            inner_steps >= last_h,
            "{gbit} Gbit/s: H {inner_steps} < {last_h}"
        );
        last_h = inner_steps;
    }
    // The same topology with a probe that found the link far slower than
    // configured: placement's planner reads it, and H rises.
    let topology = two_sites(32, 500.0, 100);
    let configured = place(&topology, &job).unwrap_or_else(|e| panic!("{e}"));
    let mut links = configured_links(&topology);
    links[0].measured = Some(LinkMeasurement {
        rtt_ns: 40_000_000,
        loss_rate: 0.0,
        throughput_bps: 50_000_000,
        measured_at_unix_ms: 1,
    });
    let measured = place_measured(&topology, &job, &CostParams::default(), &links)
        .unwrap_or_else(|e| panic!("{e}"));
    let (Some(before), Some(after)) = (&configured.sync, &measured.sync) else {
        panic!("both plans are DiLoCo");
    };
    assert!(
        after.inner_steps > before.inner_steps,
        "{} vs {}",
        after.inner_steps,
        before.inner_steps
    );
    assert!(after.links[0].measured);
    assert_eq!(after.links[0].rate_bits_per_second, 5e7);
    assert!(measured.step.total > configured.step.total);
}

#[test]
fn sixteen_sites_and_64_fragments_plan_quickly() {
    // 16 sites on a line 100 km apart, fully meshed, the farther pairs
    // lossy: the mesh and ring heuristics at every P up to 64.
    let sites = 16;
    let mut links = Vec::new();
    for a in 0..sites {
        for b in a + 1..sites {
            let km = 100.0 * (b - a) as f64;
            links.push(link(a, b, km, 400, 8, if km > 500.0 { 1e-5 } else { 0.0 }));
        }
    }
    let mut policy = Diloco::new(500);
    policy.max_fragments = Some(64);
    let mut input = SyncInput {
        parameters: 405_000_000_000,
        inner_step_seconds: 2.0,
        sync_dp_bits: 16,
        sites: (0..sites).map(|s| format!("s{s}")).collect(),
        links,
        streams_per_link: 1024,
        codecs: Codec::standard(),
        zstd_bytes_per_second: 32e9,
        policy,
    };
    for fixed in [None, Some(64)] {
        input.policy.fragments = fixed;
        let start = Instant::now();
        let plan = plan_sync(&input).unwrap_or_else(|e| panic!("{e}"));
        // Printed, not asserted: tests never time out on a busy machine.
        println!(
            "16 sites, fragments {fixed:?}: planned in {:.3} ms (H = {}, P = {}, τ = {}, {:?})",
            start.elapsed().as_secs_f64() * 1e3,
            plan.inner_steps,
            plan.fragments,
            plan.overlap_steps,
            plan.collective.kind
        );
        assert_eq!(
            plan.links.len(),
            if plan.collective.steps == 2 { 120 } else { 16 }
        );
    }
    // A ring is forced when a link of the mesh is missing.
    input.links.remove(7);
    input.policy.fragments = Some(64);
    let start = Instant::now();
    let plan = plan_sync(&input).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "16 sites, one link missing: planned in {:.3} ms, ring {:?}",
        start.elapsed().as_secs_f64() * 1e3,
        plan.collective.order
    );
    assert_eq!(plan.collective.steps, 30);
}
