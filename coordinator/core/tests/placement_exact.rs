//! The solver against brute force on tiny instances, and the plan checker
//! on everything either emits.

use longhaul_core::JobSpec;
use longhaul_core::cost::CostParams;
use longhaul_core::gpu::GpuType;
use longhaul_core::job::{
    Batch, Constraints, Diloco, Goal, ModelShape, MoeShape, Objective, Precision, Training,
};
use longhaul_core::placement::{
    PlacementError, Plan, brute_force_place, every_site_order_place, place, place_with,
    validate_plan, validate_plan_with,
};
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Site, Topology, WanLink};
use longhaul_core::units::{ByteSize, DataRate, Distance, Duration, Throughput};
use proptest::prelude::*;

/// A small custom GPU so that memory actually binds on tiny instances.
fn small_gpu(hbm_gib: u64, tflops: f64) -> GpuType {
    GpuType {
        name: "small".to_string(),
        hbm: ByteSize::from_gib(hbm_gib),
        dense_bf16: Throughput::from_tflops(tflops).unwrap_or_default(),
        scale_up: DataRate::from_gbit_per_second(800),
        max_domain_gpus: 8,
    }
}

/// One site: (domain groups of (count, gpus per domain, gpu type name)).
#[derive(Debug, Clone)]
struct SiteShape {
    groups: Vec<(u32, u32, &'static str)>,
    oversubscription: f64,
    /// Put each domain group in its own building behind a campus link.
    split_buildings: bool,
}

fn topology(
    sites: &[SiteShape],
    links: &[(usize, usize, f64, u32, f64)],
    hbm_gib: u64,
) -> Topology {
    Topology {
        name: "tiny".to_string(),
        gpu_types: vec![small_gpu(hbm_gib, 200.0)],
        sites: sites
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let building =
                    |id: String, groups: &[(u32, u32, &'static str)], first: usize| Building {
                        id,
                        fabric: Fabric {
                            kind: FabricKind::LeafSpine,
                            link_rate: DataRate::from_gbit_per_second(400),
                            oversubscription: shape.oversubscription,
                        },
                        domains: groups
                            .iter()
                            .enumerate()
                            .map(|(g, &(count, gpus, gpu))| DomainGroup {
                                id: format!("g{}", first + g),
                                count,
                                nodes_per_domain: 1,
                                gpus_per_node: gpus,
                                gpu: gpu.to_string(),
                            })
                            .collect(),
                    };
                let split = shape.split_buildings && shape.groups.len() > 1;
                Site {
                    id: format!("s{i}"),
                    name: None,
                    location: None,
                    campus_interconnect: split.then(|| DataRate::from_gbit_per_second(200)),
                    buildings: if split {
                        shape
                            .groups
                            .iter()
                            .enumerate()
                            .map(|(g, group)| {
                                building(format!("b{g}"), std::slice::from_ref(group), g)
                            })
                            .collect()
                    } else {
                        vec![building("b".to_string(), &shape.groups, 0)]
                    },
                }
            })
            .collect(),
        links: links
            .iter()
            .filter(|&&(a, b, ..)| a != b && a < sites.len() && b < sites.len())
            .map(|&(a, b, km, gbit, loss)| WanLink {
                between: [format!("s{a}"), format!("s{b}")],
                distance: Distance::from_km(km).unwrap_or_default(),
                overhead: Duration::from_micros(20),
                parallel_links: 1,
                link_rate: DataRate::from_gbit_per_second(u64::from(gbit)),
                loss,
                buffer: None,
            })
            .collect(),
    }
}

#[allow(clippy::too_many_arguments)] // reason: a job is many small numbers.
fn job(
    params_billions: f64,
    layers: u32,
    heads: u32,
    hidden_per_head: u32,
    global_batch: u32,
    micro_batch: u32,
    constraints: Constraints,
    inner_steps: Option<u32>,
) -> JobSpec {
    JobSpec {
        name: "tiny-job".to_string(),
        model: ModelShape {
            parameters: (params_billions * 1e9) as u64,
            layers,
            hidden_size: heads * hidden_per_head,
            attention_heads: heads,
            sequence_length: 2048,
            vocabulary_size: None,
            kv_heads: None,
            moe: None,
        },
        batch: Batch {
            global_batch,
            micro_batch,
        },
        training: Training {
            precision: Precision::Bf16,
            optimizer_state_bytes_per_parameter: 12.0,
        },
        constraints,
        diloco: inner_steps.map(Diloco::new),
        objective: Objective::default(),
    }
}

fn site_shape() -> impl Strategy<Value = SiteShape> {
    (
        prop::collection::vec(
            (
                1u32..=2,
                prop::sample::select(vec![1u32, 2, 4]),
                prop::sample::select(vec!["small", "h100", "b200"]),
            ),
            1..=2,
        ),
        prop::sample::select(vec![1.0, 2.0]),
        any::<bool>(),
    )
        .prop_map(|(groups, oversubscription, split_buildings)| SiteShape {
            groups,
            oversubscription,
            split_buildings,
        })
}

fn gpus(sites: &[SiteShape]) -> u32 {
    sites
        .iter()
        .flat_map(|s| &s.groups)
        .map(|&(c, g, _)| c * g)
        .sum()
}

type Instance = (Topology, JobSpec);

fn instance() -> impl Strategy<Value = Instance> {
    (
        prop::collection::vec(site_shape(), 1..=3),
        prop::collection::vec(
            (
                any::<bool>(),
                any::<bool>(),
                prop::sample::select(vec![1.0, 80.0, 2000.0]),
                prop::sample::select(vec![10u32, 100, 400]),
                prop::sample::select(vec![0.0, 1e-4]),
            ),
            3,
        ),
        prop::sample::select(vec![16u64, 40, 80]),
        (
            0.5f64..30.0,
            1u32..=12,
            prop::sample::select(vec![1u32, 2, 4, 8]),
            prop::sample::select(vec![64u32, 128]),
        ),
        (
            prop::sample::select(vec![1u32, 2, 4, 6, 8, 12, 16]),
            prop::sample::select(vec![1u32, 2]),
        ),
        (
            prop::option::of(prop::sample::select(vec![1u32, 2, 4])),
            prop::option::of(prop::sample::select(vec![1u32, 2, 3])),
            prop::option::of(prop::sample::select(vec![2u32, 10, 100])),
            prop::option::of(prop::sample::select(vec![32_000u32, 256_000])),
            moe(),
        ),
    )
        .prop_filter("at most 12 GPUs", |(sites, ..)| gpus(sites) <= 12)
        .prop_map(
            |(
                sites,
                links,
                hbm,
                (p, layers, heads, hph),
                (gb, mb),
                (max_tp, fixed_pp, h, vocabulary, moe),
            )| {
                let gb = if gb % mb == 0 { gb } else { gb * mb };
                let constraints = Constraints {
                    max_tensor_parallel: max_tp,
                    pipeline_parallel: fixed_pp.filter(|&pp| pp <= layers),
                    ..Constraints::default()
                };
                // Each site pair is linked with probability 3/4.
                let pairs = [(0, 1), (0, 2), (1, 2)];
                let links: Vec<_> = pairs
                    .iter()
                    .zip(links)
                    .filter(|(_, (a, b, ..))| *a || *b)
                    .map(|(&(x, y), (_, _, km, gbit, loss))| (x, y, km, gbit, loss))
                    .collect();
                let mut job = job(p, layers, heads, hph, gb, mb, constraints, h);
                job.model.vocabulary_size = vocabulary;
                job.model.moe = moe.map(|(experts, top_k, share)| MoeShape {
                    experts,
                    top_k,
                    active_parameters: (job.model.parameters as f64 * share) as u64,
                });
                (topology(&sites, &links, hbm), job)
            },
        )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

fn objective() -> impl Strategy<Value = Objective> {
    (
        prop::sample::select(vec![
            Goal::StepTime,
            Goal::ThroughputPerGpu,
            Goal::FewestGpus,
        ]),
        prop::option::of(prop::sample::select(vec![2u64, 4, 6])),
        prop::option::of(prop::sample::select(vec![0.01, 0.3])),
    )
        .prop_map(|(goal, max_gpus, within)| Objective {
            goal,
            max_gpus,
            within: within.filter(|_| goal == Goal::FewestGpus),
        })
}

type Placer = fn(&Topology, &JobSpec, &CostParams) -> Result<Plan, PlacementError>;

/// The solver's plan and `reference`'s agree on the job's objective and its
/// tie-break (or both fail), and the solver's passes the checker; the
/// solver's plan, when there is one.
fn agrees_with(
    topology: &Topology,
    job: &JobSpec,
    reference: Placer,
    name: &str,
) -> Result<Option<Plan>, TestCaseError> {
    let params = CostParams::default();
    let objective = job.objective;
    let vocabulary = job.model.vocabulary_size;
    match (
        place_with(topology, job, &params),
        reference(topology, job, &params),
    ) {
        (Ok(s), Ok(r)) => {
            let (x, y) = (score(&objective, &s), score(&objective, &r));
            prop_assert!(
                close(x.0, y.0) && close(x.1, y.1),
                "{objective:?}, vocabulary {vocabulary:?}: solver {x:?} vs {name} {y:?}"
            );
            prop_assert_eq!(validate_plan_with(topology, job, &s, &params), Ok(()));
            Ok(Some(s))
        }
        (Err(_), Err(_)) => Ok(None),
        (s, r) => Err(TestCaseError::fail(format!(
            "solver {:?} but {name} {:?}",
            s.map(|p| p.step.total),
            r.map(|p| p.step.total)
        ))),
    }
}

/// A mixture of experts, or none: (experts, top_k, share of the parameters active).
fn moe() -> impl Strategy<Value = Option<(u32, u32, f64)>> {
    prop::option::of(prop::sample::select(vec![(4u32, 1u32, 0.4), (8, 2, 0.3)]))
}

fn vocabulary() -> impl Strategy<Value = Option<u32>> {
    prop::option::of(prop::sample::select(vec![32_000u32, 128_000, 256_000]))
}

/// A plan's score under `objective`, lower is better, with its tie-break.
fn score(objective: &Objective, plan: &Plan) -> (f64, f64) {
    let (total, gpus) = (plan.step.total, plan.gpus() as f64);
    match objective.goal {
        Goal::StepTime => (total, gpus),
        Goal::ThroughputPerGpu => (total * gpus, gpus),
        Goal::FewestGpus => (gpus, total),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn solver_matches_brute_force_and_plans_are_valid((topology, mut job) in instance(), objective in objective()) {
        job.objective = objective;
        let params = CostParams::default();
        let solved = place_with(&topology, &job, &params);
        let brute = brute_force_place(&topology, &job, &params);
        match (&solved, &brute) {
            (Ok(s), Ok(b)) => {
                let (x, y) = (score(&objective, s), score(&objective, b));
                prop_assert!(close(x.0, y.0) && close(x.1, y.1), "{objective:?}: solver {x:?} vs brute force {y:?}");
                if let Some(max) = objective.max_gpus {
                    prop_assert!(s.gpus() <= max, "{} GPUs over the budget {max}", s.gpus());
                }
                prop_assert_eq!(validate_plan_with(&topology, &job, s, &params), Ok(()));
                prop_assert_eq!(validate_plan_with(&topology, &job, b, &params), Ok(()));
                let parts = s.step.compute + s.step.tensor_parallel + s.step.expert_parallel + s.step.exposed_pipeline + s.step.bubble + s.step.exposed_data_parallel + s.step.outer_sync_amortised;
                prop_assert!(close(parts, s.step.total), "breakdown {} sums to total {}", parts, s.step.total);
                prop_assert_eq!(s.bindings().count() as u64, s.gpus());
            }
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "solver {:?} but brute force {:?}", solved.as_ref().map(|p| p.step.total), brute.as_ref().map(|p| p.step.total)),
        }
    }
}

/// Sites too small for the job alone, all linked: the solver must place
/// across sites, so cross-site pipelines and DiLoCo get exercised.
fn multi_site_instance() -> impl Strategy<Value = Instance> {
    (
        prop::collection::vec(
            (
                1u32..=2,
                prop::sample::select(vec![2u32, 4]),
                prop::sample::select(vec!["small", "h100"]),
            ),
            2..=3,
        ),
        prop::sample::select(vec![1.0, 80.0, 2000.0]),
        prop::sample::select(vec![0.0, 1e-4]),
        (
            4.0f64..20.0,
            2u32..=12,
            prop::sample::select(vec![8u32, 12, 16]),
        ),
        prop::option::of(prop::sample::select(vec![2u32, 10])),
    )
        .prop_filter("at most 12 GPUs", |(sites, ..)| {
            sites.iter().map(|&(c, g, _)| c * g).sum::<u32>() <= 12
        })
        .prop_map(|(sites, km, loss, (p, layers, gb), h)| {
            let shapes: Vec<SiteShape> = sites
                .into_iter()
                .map(|g| SiteShape {
                    groups: vec![g],
                    oversubscription: 1.0,
                    split_buildings: false,
                })
                .collect();
            let links = [
                (0, 1, km, 100, loss),
                (0, 2, km * 2.0, 100, loss),
                (1, 2, km, 100, loss),
            ];
            (
                topology(&shapes, &links, 24),
                job(p, layers, 4, 128, gb, 1, Constraints::default(), h),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn solver_matches_brute_force_across_sites((topology, mut job) in multi_site_instance(), vocabulary in vocabulary(), objective in objective(), moe in moe()) {
        job.model.vocabulary_size = vocabulary;
        job.model.moe = moe.map(|(experts, top_k, share)| MoeShape {
            experts,
            top_k,
            active_parameters: (job.model.parameters as f64 * share) as u64,
        });
        job.objective = objective;
        agrees_with(&topology, &job, brute_force_place, "brute force")?;
    }
}

#[test]
fn same_inputs_give_the_same_plan() {
    let sites = [
        SiteShape {
            groups: vec![(2, 4, "h100")],
            oversubscription: 1.0,
            split_buildings: false,
        },
        SiteShape {
            groups: vec![(1, 4, "b200")],
            oversubscription: 2.0,
            split_buildings: false,
        },
    ];
    let topology = topology(&sites, &[(0, 1, 80.0, 400, 0.0)], 80);
    let job = job(7.0, 8, 8, 128, 16, 1, Constraints::default(), None);
    let first = place(&topology, &job).expect("feasible");
    let second = place(&topology, &job).expect("feasible");
    assert_eq!(first, second);
    assert_eq!(validate_plan(&topology, &job, &first), Ok(()));
}

#[test]
fn memory_that_cannot_fit_is_reported_with_the_shortfall() {
    let sites = [SiteShape {
        groups: vec![(1, 2, "small")],
        oversubscription: 1.0,
        split_buildings: false,
    }];
    let topology = topology(&sites, &[], 16);
    let job = job(30.0, 4, 2, 128, 4, 1, Constraints::default(), None);
    match place(&topology, &job) {
        Err(PlacementError::OutOfMemory {
            short_bytes,
            candidate,
        }) => {
            assert!(short_bytes > 0.0);
            assert!(!candidate.is_empty());
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

#[test]
fn fixed_degrees_larger_than_the_topology_are_rejected_with_the_count() {
    let sites = [SiteShape {
        groups: vec![(1, 4, "h100")],
        oversubscription: 1.0,
        split_buildings: false,
    }];
    let topology = topology(&sites, &[], 80);
    let constraints = Constraints {
        tensor_parallel: Some(2),
        pipeline_parallel: Some(2),
        data_parallel: Some(2),
        ..Constraints::default()
    };
    let job = job(1.0, 4, 2, 128, 4, 1, constraints, None);
    let error = place(&topology, &job).expect_err("8 GPUs do not exist");
    assert!(error.to_string().contains('8'), "{error}");
}

#[test]
fn tensor_parallelism_wider_than_every_domain_is_rejected() {
    let sites = [SiteShape {
        groups: vec![(4, 2, "h100")],
        oversubscription: 1.0,
        split_buildings: false,
    }];
    let topology = topology(&sites, &[], 80);
    let constraints = Constraints {
        tensor_parallel: Some(4),
        ..Constraints::default()
    };
    let job = job(1.0, 4, 4, 128, 4, 1, constraints, None);
    let error = place(&topology, &job).expect_err("TP 4 cannot fit 2-GPU domains");
    assert!(
        matches!(
            error,
            PlacementError::InvalidJob(_) | PlacementError::TensorParallel { .. }
        ),
        "{error}"
    );
}

#[test]
fn grouped_query_attention_keeps_tensor_parallelism_within_the_key_value_heads() {
    // 8-GPU domains, 16 attention heads: TP 8 is the fastest split without
    // key-value heads; with 2 of them TP must divide 2.
    let sites = [SiteShape {
        groups: vec![(2, 8, "h100")],
        oversubscription: 1.0,
        split_buildings: false,
    }];
    let topology = topology(&sites, &[], 80);
    let mha = job(3.0, 8, 16, 128, 16, 1, Constraints::default(), None);
    let plan = place(&topology, &mha).expect("feasible without GQA");
    assert!(plan.degrees.tensor_parallel > 2, "{:?}", plan.degrees);

    let mut gqa = mha.clone();
    gqa.model.kv_heads = Some(2);
    let plan = place(&topology, &gqa).expect("feasible with 2 key-value heads");
    assert!(
        matches!(plan.degrees.tensor_parallel, 1 | 2),
        "TP {} does not divide 2 key-value heads",
        plan.degrees.tensor_parallel
    );
    let mut wide = plan.clone();
    wide.degrees.tensor_parallel = 4;
    let errors = validate_plan(&topology, &gqa, &wide).expect_err("TP 4 splits 2 KV heads");
    assert!(
        errors.iter().any(|e| e.contains("key-value heads")),
        "{errors:?}"
    );

    let mut fixed = gqa.clone();
    fixed.constraints.tensor_parallel = Some(4);
    let error = place(&topology, &fixed).expect_err("TP 4 is not allowed with 2 KV heads");
    assert!(error.to_string().contains("key-value heads"), "{error}");
}

#[test]
fn a_tampered_plan_is_caught_by_the_checker() {
    let sites = [SiteShape {
        groups: vec![(2, 4, "h100")],
        oversubscription: 1.0,
        split_buildings: false,
    }];
    let topology = topology(&sites, &[], 80);
    let job = job(3.0, 8, 8, 128, 8, 1, Constraints::default(), None);
    let plan = place(&topology, &job).expect("feasible");
    let mut wide = plan.clone();
    wide.degrees.tensor_parallel = 8;
    assert!(validate_plan(&topology, &job, &wide).is_err());
    let mut doubled = plan.clone();
    if let Some(stage) = doubled.groups[0].stages.get_mut(0) {
        stage.slices.extend(stage.slices.clone());
    }
    assert!(validate_plan(&topology, &job, &doubled).is_err());
    let mut short = plan;
    short.groups[0].stages[0].layers += 1;
    assert!(validate_plan(&topology, &job, &short).is_err());
}

/// Eight fully meshed sites: the branch and bound over sites emits plans
/// that pass every hard constraint.
#[test]
fn site_search_over_eight_meshed_sites_emits_valid_plans() {
    let shapes: Vec<SiteShape> = (0..8)
        .map(|i| SiteShape {
            groups: vec![(2, 4, if i % 2 == 0 { "b200" } else { "h100" })],
            oversubscription: 1.0,
            split_buildings: false,
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            links.push((a, b, 100.0 * (b - a) as f64, 100, 1e-5));
        }
    }
    let topology = topology(&shapes, &links, 80);
    for (params_billions, inner_steps) in [(3.0, None), (40.0, Some(20))] {
        let job = job(
            params_billions,
            12,
            8,
            128,
            64,
            1,
            Constraints::default(),
            inner_steps,
        );
        let plan = place(&topology, &job).expect("feasible");
        assert_eq!(validate_plan(&topology, &job, &plan), Ok(()));
        assert_eq!(plan.bindings().count() as u64, plan.gpus());
    }
}

/// Four to eight small sites, linked at random (each pair with probability
/// 5/8, at one of three distances), and a job shallow enough that every
/// site order can be enumerated.
fn many_site_instance() -> impl Strategy<Value = Instance> {
    (
        prop::collection::vec(
            (
                1u32..=2,
                prop::sample::select(vec![2u32, 4]),
                prop::sample::select(vec!["small", "h100", "b200"]),
            ),
            4..=8,
        ),
        prop::collection::vec(
            (
                0u8..8,
                prop::sample::select(vec![1.0, 300.0, 3000.0]),
                prop::sample::select(vec![0.0, 1e-4]),
            ),
            28,
        ),
        (1.0f64..20.0, 2u32..=4, prop::sample::select(vec![8u32, 16])),
        prop::option::of(prop::sample::select(vec![2u32, 10])),
    )
        .prop_map(|(sites, pairs, (p, layers, gb), h)| {
            let shapes: Vec<SiteShape> = sites
                .into_iter()
                .map(|g| SiteShape {
                    groups: vec![g],
                    oversubscription: 1.0,
                    split_buildings: false,
                })
                .collect();
            let mut links = Vec::new();
            let mut draws = pairs.into_iter();
            for a in 0..shapes.len() {
                for b in a + 1..shapes.len() {
                    if let Some((coin, km, loss)) = draws.next()
                        && coin < 5
                    {
                        links.push((a, b, km, 100, loss));
                    }
                }
            }
            (
                topology(&shapes, &links, 24),
                job(p, layers, 4, 128, gb, 1, Constraints::default(), h),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, max_shrink_iters: 100, ..ProptestConfig::default() })]

    /// The branch and bound over sites cuts nothing optimal: it finds the
    /// same plan (by the objective and its tie-break) as the solver with
    /// every site order and subset enumerated, with and without embeddings,
    /// dense or mixture of experts.
    #[test]
    fn site_branch_and_bound_matches_every_site_order((topology, mut job) in many_site_instance(), vocabulary in vocabulary(), objective in objective(), moe in moe()) {
        job.model.vocabulary_size = vocabulary;
        job.model.moe = moe.map(|(experts, top_k, share)| MoeShape {
            experts,
            top_k,
            active_parameters: (job.model.parameters as f64 * share) as u64,
        });
        job.objective = objective;
        if let Some(plan) = agrees_with(&topology, &job, every_site_order_place, "every site order")? {
            prop_assert_eq!(plan.reason("site search").map(|r| r.choice.as_str()), Some("exact"));
        }
    }
}

/// Twelve sites of three GPU types on a chain with a few shortcuts: the
/// plan over all of them is exact, and no plan restricted by hand to some
/// of its sites beats it (the old nearest-neighbour search lost to such
/// subsets beyond six sites).
#[test]
fn no_allowed_sites_subset_beats_the_plan_over_twelve_sites() {
    let kinds = ["b200", "h100", "small", "h100", "b200", "b200"];
    let shapes: Vec<SiteShape> = (0..12)
        .map(|i| SiteShape {
            groups: vec![(1 + (i % 2) as u32, 4, kinds[i % kinds.len()])],
            oversubscription: 1.0,
            split_buildings: false,
        })
        .collect();
    let mut links: Vec<(usize, usize, f64, u32, f64)> = (0..11)
        .map(|a| (a, a + 1, 80.0 + 40.0 * (a % 3) as f64, 100, 0.0))
        .collect();
    links.extend([
        (0, 4, 900.0, 100, 1e-4),
        (2, 9, 1500.0, 400, 1e-4),
        (5, 11, 700.0, 100, 0.0),
    ]);
    let topology = topology(&shapes, &links, 80);
    let job = job(30.0, 16, 8, 128, 64, 1, Constraints::default(), Some(20));
    let params = CostParams::default();
    let full = place_with(&topology, &job, &params).expect("feasible on twelve sites");
    assert_eq!(validate_plan_with(&topology, &job, &full, &params), Ok(()));
    assert_eq!(
        full.reason("site search").map(|r| r.choice.as_str()),
        Some("exact"),
        "{:?}",
        full.reason("site search")
    );
    // Seeded subsets of two to five sites, the first ones those of the old
    // search's blind spots: same-type sites that are not neighbours.
    let mut subsets: Vec<Vec<usize>> = vec![vec![0, 4, 5], vec![0, 5], vec![4, 5, 11], vec![1, 3]];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    while subsets.len() < 16 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mask = state & 0xfff;
        if (2..=5).contains(&mask.count_ones()) {
            subsets.push((0..12).filter(|s| mask & (1 << s) != 0).collect());
        }
    }
    let mut compared = 0;
    for subset in subsets {
        let mut restricted = job.clone();
        restricted.constraints.allowed_sites = subset.iter().map(|s| format!("s{s}")).collect();
        if let Ok(plan) = place_with(&topology, &restricted, &params) {
            compared += 1;
            assert!(
                full.step.total <= plan.step.total * (1.0 + 1e-9),
                "all sites {} s but {subset:?} alone {} s",
                full.step.total,
                plan.step.total
            );
        }
    }
    assert!(compared >= 8, "only {compared} subsets were feasible");
}

/// The embedding and the LM head sit on the end stages: with a large
/// vocabulary the last stage (which also runs the head) takes fewer layers
/// than without one, the first stage holds more memory per layer than a
/// middle one, and the checker agrees with the memory the plan states.
#[test]
fn embeddings_and_the_lm_head_weigh_on_the_end_stages() {
    let sites = [SiteShape {
        groups: vec![(4, 8, "h100")],
        oversubscription: 1.0,
        split_buildings: false,
    }];
    let topology = topology(&sites, &[], 80);
    let constraints = Constraints {
        tensor_parallel: Some(8),
        pipeline_parallel: Some(4),
        ..Constraints::default()
    };
    let plain = job(8.0, 32, 16, 128, 32, 1, constraints, None);
    let mut wide = plain.clone();
    wide.model.vocabulary_size = Some(256_000);
    let layers =
        |plan: &Plan| -> Vec<u32> { plan.groups[0].stages.iter().map(|s| s.layers).collect() };
    let without = place(&topology, &plain).expect("feasible");
    let with = place(&topology, &wide).expect("feasible");
    assert_eq!(validate_plan(&topology, &wide, &with), Ok(()));
    let (a, b) = (layers(&without), layers(&with));
    assert_eq!(a, vec![8, 8, 8, 8], "no vocabulary: an even split");
    assert!(
        b[3] < b[1] && b[3] < b[2],
        "the head's stage takes fewer layers: {b:?}"
    );
    let per_layer = |plan: &Plan, j: usize| {
        let stage = &plan.groups[0].stages[j];
        stage.memory_bytes_per_gpu / f64::from(stage.layers)
    };
    // Stage 0 holds the most in-flight activations anyway; the embedding
    // adds to it beyond what it holds without a vocabulary.
    assert!(
        per_layer(&with, 0) > per_layer(&without, 0),
        "{} vs {}",
        per_layer(&with, 0),
        per_layer(&without, 0)
    );
    assert!(with.step.total > without.step.total);
}

/// Sixty meshed sites whose fastest fifty-six cannot hold the job (1 GiB
/// of HBM): the site search spends its budget on them, and must still try
/// the four that can, not report the job as out of memory.
#[test]
fn a_spent_budget_still_tries_every_first_site() {
    let shapes: Vec<SiteShape> = (0..60)
        .map(|i| SiteShape {
            groups: vec![(4, 1, if i < 56 { "tiny" } else { "roomy" })],
            oversubscription: 1.0,
            split_buildings: false,
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..60 {
        for b in a + 1..60 {
            links.push((a, b, 300.0, 100, 0.0));
        }
    }
    let mut topology = topology(&shapes, &links, 80);
    let mut tiny = small_gpu(1, 2000.0);
    tiny.name = "tiny".to_string();
    let mut roomy = small_gpu(80, 200.0);
    roomy.name = "roomy".to_string();
    topology.gpu_types = vec![tiny, roomy];
    let constraints = Constraints {
        cross_site_mode: Some(longhaul_core::job::ModeConstraint::Pipeline),
        ..Constraints::default()
    };
    let mut job = job(12.0, 12, 4, 128, 16, 1, constraints, None);
    let params = CostParams {
        max_virtual_stages: 1,
        ..CostParams::default()
    };
    let plan = place_with(&topology, &job, &params).expect("the roomy sites hold it");
    assert_eq!(validate_plan_with(&topology, &job, &plan, &params), Ok(()));
    job.constraints.allowed_sites = (56..60).map(|s| format!("s{s}")).collect();
    let alone = place_with(&topology, &job, &params).expect("feasible on the roomy four");
    assert!(
        plan.step.total <= alone.step.total * (1.0 + 1e-9),
        "all sites {} s, the roomy four alone {} s",
        plan.step.total,
        alone.step.total
    );
}

/// More allowed sites than placement searches: a clear refusal naming the
/// limit and the field to narrow, at once.
#[test]
fn more_sites_than_placement_searches_are_refused_with_the_limit() {
    use longhaul_core::placement::MAX_PLACEMENT_SITES;
    let n = MAX_PLACEMENT_SITES + 1;
    let shapes: Vec<SiteShape> = (0..n)
        .map(|_| SiteShape {
            groups: vec![(1, 4, "h100")],
            oversubscription: 1.0,
            split_buildings: false,
        })
        .collect();
    let links: Vec<_> = (1..n).map(|a| (a - 1, a, 100.0, 100, 0.0)).collect();
    let topology = topology(&shapes, &links, 80);
    let job = job(3.0, 8, 8, 128, 16, 1, Constraints::default(), None);
    let error = place(&topology, &job).expect_err("too many sites");
    assert_eq!(
        error,
        PlacementError::TooManySites {
            sites: n,
            limit: MAX_PLACEMENT_SITES
        }
    );
    assert!(
        error.to_string().contains("constraints.allowed_sites"),
        "{error}"
    );
    let mut narrowed = job.clone();
    narrowed.constraints.allowed_sites = (0..8).map(|s| format!("s{s}")).collect();
    assert!(place(&topology, &narrowed).is_ok());
}
