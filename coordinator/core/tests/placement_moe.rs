//! Mixture-of-experts models: compute from the active parameters, memory from all of them,
//! experts sharded by an expert-parallel degree that placement searches (or the job fixes),
//! whose groups stay inside a site and whose all-to-all rides NVLink only when each group sits
//! in one scale-up domain. The brute force and the checker see the same model.

use longhaul_core::cost::{self, CostParams};
use longhaul_core::placement::{
    CrossSiteMode, Plan, brute_force_place, every_site_order_place, place, place_with,
    validate_plan,
};
use longhaul_core::{JobSpec, Topology};

/// Sites of `domains` 8-GPU domains (one node each) of `hbm_gib` GiB GPUs, 1000 TFLOP/s,
/// 7200 Gbit/s NVLink, a 400 Gbit/s fabric; every pair linked at 1 km and 12.8 Tbit/s.
fn topology(sites: &[&str], domains: u32, hbm_gib: u32) -> Topology {
    let mut text = format!(
        r#"name = "moe"
[[gpu_types]]
name = "gpu"
hbm = "{hbm_gib} GiB"
dense_bf16 = "1000 TFLOP/s"
scale_up = "7200 Gbit/s"
max_domain_gpus = 8
"#
    );
    for id in sites {
        text += &format!(
            r#"
[[sites]]
id = "{id}"
[[sites.buildings]]
id = "{id}1"
fabric = {{ kind = "leaf-spine", link_rate = "400 Gbit/s" }}
domains = [{{ id = "d", count = {domains}, nodes_per_domain = 1, gpus_per_node = 8, gpu = "gpu" }}]
"#
        );
    }
    for (i, x) in sites.iter().enumerate() {
        for y in &sites[i + 1..] {
            text += &format!(
                "\n[[links]]\nbetween = [\"{x}\", \"{y}\"]\ndistance = \"1 km\"\nlink_rate = \"12800 Gbit/s\"\n"
            );
        }
    }
    Topology::from_toml("moe.toml", &text).expect("topology parses")
}

/// 16B parameters over 8 layers, 5B of them active (eight experts, top-2), at TP 2 and one
/// stage; `extra` is appended to `[constraints]`.
fn job(global_batch: u32, extra: &str) -> JobSpec {
    JobSpec::from_toml(
        "moe.job.toml",
        &format!(
            r#"
name = "moe-16b"
[model]
parameters = 16_000_000_000
layers = 8
hidden_size = 4096
attention_heads = 32
sequence_length = 2048
[model.moe]
experts = 8
top_k = 2
active_parameters = 5_000_000_000
[batch]
global_batch = {global_batch}
micro_batch = 1
[constraints]
tensor_parallel = 2
pipeline_parallel = 1
{extra}
"#
        ),
    )
    .expect("job parses")
}

fn reason<'p>(plan: &'p Plan, decision: &str) -> &'p str {
    plan.reason(decision)
        .map(|r| r.reason.as_str())
        .unwrap_or_else(|| panic!("no {decision:?} reason in {:#?}", plan.reasons))
}

#[test]
fn a_layer_computes_with_its_active_parameters_and_holds_all_of_them() {
    let moe = job(8, "");
    let mut dense_active = moe.clone();
    dense_active.model.moe = None;
    dense_active.model.parameters = 5_000_000_000;
    let mut dense_all = moe.clone();
    dense_all.model.moe = None;
    // FLOPs of the matrix multiplies: those of a dense model of the active parameters.
    assert_eq!(
        cost::layer_training_flops(&moe),
        cost::layer_training_flops(&dense_active)
    );
    // Per layer: 2B, 0.625B of them active; experts X = (2 − 0.625) · 8/6 = 1.8333B.
    let experts = cost::expert_layer_parameters(&moe);
    assert!((experts - 1.375e9 * 8.0 / 6.0).abs() < 1.0, "{experts}");
    // Without expert parallelism a GPU holds what the dense model of all parameters holds.
    let all = cost::state_bytes_per_layer(&dense_all, 2, 1, 8, 0.0);
    assert_eq!(cost::state_bytes_per_layer(&moe, 2, 1, 8, 0.0), all);
    // At ep = 8 the experts' weights and gradients (2 + 2 bytes) are split 8 ways, their
    // optimizer state stays at 12 bytes / (tp · dp) per parameter.
    let sharded = cost::state_bytes_per_layer(&moe, 2, 8, 8, 0.0);
    let expected = all - experts / 2.0 * 4.0 * (1.0 - 1.0 / 8.0);
    assert!(
        (sharded - expected).abs() < 1e-3 * expected,
        "{sharded} vs {expected}"
    );
    // A dense model has no all-to-all whatever the degree.
    let link = cost::Link::new(1e-6, 1e9);
    assert_eq!(
        cost::expert_all_to_all_seconds_per_layer(&dense_all, 2, 8, link),
        0.0
    );
    assert_eq!(
        cost::expert_all_to_all_seconds_per_layer(&moe, 2, 1, link),
        0.0
    );
}

/// 8 GPUs of 40 GiB (36 usable) at TP 2 hold 4 replicas; with every expert on every GPU a
/// stage needs ~59 GB, at ep = 2 ~45 GB, at ep = 4 ~37 GB: only ep = 4 fits.
#[test]
fn expert_parallelism_shards_the_experts_where_memory_demands_it() {
    let topology = topology(&["a"], 1, 40);
    let job = job(4, "");
    let plan = place(&topology, &job).expect("feasible");
    assert_eq!(plan.degrees.expert_parallel, 4, "{:#?}", plan.reasons);
    validate_plan(&topology, &job, &plan).expect("valid");
    let params = CostParams::default();
    let brute = brute_force_place(&topology, &job, &params).expect("feasible");
    assert_eq!(brute.degrees.expert_parallel, 4);
    assert_eq!(brute.step.total, plan.step.total);
    assert!(plan.step.expert_parallel > 0.0);
    let why = reason(&plan, "expert parallelism");
    assert!(why.contains("each group of 4"), "{why}");
    // The same job held to ep = 2 does not fit.
    let fixed = place_with(&topology, &self::job(4, "expert_parallel = 2"), &params);
    assert!(fixed.is_err(), "{:?}", fixed.map(|p| p.degrees));
    // A plan claiming ep = 2 fails the checker on memory; one claiming ep = 3 on the degree.
    for (ep, needle) in [(2, "bytes per GPU"), (3, "does not divide the 8 expert")] {
        let mut forged = plan.clone();
        forged.degrees.expert_parallel = ep;
        let errors = validate_plan(&topology, &job, &forged).expect_err("refused");
        assert!(errors.iter().any(|e| e.contains(needle)), "{errors:?}");
    }
}

/// At TP 2 an 8-GPU domain holds 4 replicas' TP groups: ep = 4 keeps each expert group in a
/// domain (NVLink), ep = 8 spans two (the 400 Gbit/s fabric). The all-to-all is the closed
/// form m · L · 4 · ((e−1)α + (e−1)/e · S/B), S = top_k · b·s·h · 2 bytes / tp.
#[test]
fn the_all_to_all_rides_nvlink_only_when_each_expert_group_sits_in_one_domain() {
    let topology = topology(&["a"], 2, 192);
    let params = CostParams::default();
    let bytes = 2.0 * 2048.0 * 4096.0 * 2.0 / 2.0;
    let closed = |ep: f64, alpha: f64, rate: f64| {
        8.0 * 4.0 * ((ep - 1.0) * alpha + (ep - 1.0) / ep * bytes / rate)
    };
    for (ep, expected) in [
        (4u32, closed(4.0, params.scale_up_latency_seconds, 900e9)),
        (8, closed(8.0, params.fabric_latency_seconds, 50e9)),
    ] {
        let job = job(8, &format!("expert_parallel = {ep}\ndata_parallel = 8"));
        let plan = place(&topology, &job).expect("feasible");
        assert_eq!(plan.degrees.expert_parallel, ep);
        assert_eq!(plan.degrees.micro_batches, 1);
        let got = plan.step.expert_parallel;
        assert!(
            (got - expected).abs() <= 1e-9 * expected,
            "ep {ep}: {got} vs {expected}"
        );
        assert!(reason(&plan, "expert parallelism").contains("constraints.expert_parallel"));
    }
}

/// DiLoCo over two 8-GPU sites of 60 GiB: its 8 bytes per parameter of outer state leave
/// room only for ep = 4, a site's whole share of the replicas, so every site has every expert;
/// the plan passes the checker and every site order and subset, enumerated, agrees.
#[test]
fn replicas_per_site_come_in_whole_expert_parallel_groups() {
    let topology = topology(&["a", "b"], 1, 60);
    let job = job(8, "cross_site_mode = \"diloco\"\ndata_parallel = 8");
    let plan = place(&topology, &job).expect("feasible");
    assert!(matches!(plan.mode, CrossSiteMode::Diloco { .. }));
    assert_eq!(plan.degrees.expert_parallel, 4, "{:#?}", plan.reasons);
    assert_eq!(plan.groups.len(), 2);
    for group in &plan.groups {
        assert_eq!(group.replicas, 4);
    }
    validate_plan(&topology, &job, &plan).expect("valid");
    let every = every_site_order_place(&topology, &job, &CostParams::default()).expect("feasible");
    assert_eq!(every.step.total, plan.step.total);
    // A forged plan whose groups are not whole groups of ep is refused.
    let mut forged = plan.clone();
    forged.degrees.expert_parallel = 8;
    let errors = validate_plan(&topology, &job, &forged).expect_err("refused");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("not whole expert-parallel groups")),
        "{errors:?}"
    );
}

/// One site of two buildings, one 8-GPU domain each, on a 100 Gbit/s campus link.
fn two_buildings() -> Topology {
    let text = r#"name = "two-buildings"
[[gpu_types]]
name = "gpu"
hbm = "192 GiB"
dense_bf16 = "1000 TFLOP/s"
scale_up = "7200 Gbit/s"
max_domain_gpus = 8
[[sites]]
id = "a"
campus_interconnect = "100 Gbit/s"
[[sites.buildings]]
id = "a1"
fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s" }
domains = [{ id = "d", count = 1, nodes_per_domain = 1, gpus_per_node = 8, gpu = "gpu" }]
[[sites.buildings]]
id = "a2"
fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s" }
domains = [{ id = "d", count = 1, nodes_per_domain = 1, gpus_per_node = 8, gpu = "gpu" }]
"#;
    Topology::from_toml("two-buildings.toml", text).expect("topology parses")
}

/// With ep = dp every expert shard has one holder: no expert all-reduce, even where the stage
/// spans buildings, so the exposed data-parallel time is the dense part's alone: that of a
/// dense model of the same dense parameters.
#[test]
fn experts_with_one_holder_each_are_not_all_reduced() {
    let topology = two_buildings();
    let moe = job(8, "data_parallel = 8\nexpert_parallel = 8");
    let plan = place(&topology, &moe).expect("feasible");
    assert_eq!(plan.degrees.expert_parallel, 8);
    let buildings: std::collections::BTreeSet<&str> = plan.groups[0].stages[0]
        .slices
        .iter()
        .map(|s| s.building.as_str())
        .collect();
    assert_eq!(buildings.len(), 2, "the stage spans both buildings");
    let mut dense = moe.clone();
    let experts = cost::expert_layer_parameters(&moe) * f64::from(moe.model.layers);
    dense.model.parameters -= experts.round() as u64;
    dense.model.moe = None;
    dense.constraints.expert_parallel = None;
    let reference = place(&topology, &dense).expect("feasible");
    let (got, want) = (
        plan.step.exposed_data_parallel,
        reference.step.exposed_data_parallel,
    );
    assert!(
        (got - want).abs() <= 1e-6 * want,
        "{got} s against the dense part's {want} s"
    );
}

/// Bad expert-parallel degrees are refused with the reason, not a misleading one.
#[test]
fn a_degree_no_layout_can_hold_is_refused_saying_why() {
    // Two 8-GPU sites, 8 replicas in one group of 8: no site can hold a whole group of DiLoCo's.
    let topology = topology(&["a", "b"], 1, 192);
    let job = job(8, "cross_site_mode = \"diloco\"\nexpert_parallel = 8");
    let error = place(&topology, &job).expect_err("infeasible").to_string();
    assert!(error.contains("whole group"), "{error}");
    // A plan whose degree does not divide its groups cannot be re-costed.
    let fine = self::job(8, "data_parallel = 8\nexpert_parallel = 4");
    let plan = place(&topology, &fine).expect("feasible");
    let mut forged = plan.clone();
    forged.degrees.expert_parallel = 3;
    let error = longhaul_core::placement::recost(&topology, &fine, &CostParams::default(), &forged)
        .expect_err("refused")
        .to_string();
    assert!(error.contains("expert-parallel degree 3"), "{error}");
}
