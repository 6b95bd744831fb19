//! Synchronous data parallelism across sites as a mode placement searches: chosen where it is
//! the fastest plan (here, where DiLoCo's extra state does not fit), costed beside the chosen
//! mode otherwise, forced by `constraints.cross_site_mode = "data-parallel"`, and checked by the
//! same validator and brute force as the other modes.

use longhaul_core::cost::CostParams;
use longhaul_core::job::ModeConstraint;
use longhaul_core::placement::{
    CrossSiteMode, PlacementError, every_site_order_place, place, recost, validate_plan,
};
use longhaul_core::{JobSpec, Topology};

/// Two 8-GPU sites 1 km apart on a 12.8 Tbit/s link, GPUs of `hbm_gib` GiB.
fn twins(hbm_gib: u32) -> Topology {
    sites(&[("a", hbm_gib), ("b", hbm_gib)])
}

/// 8-GPU sites of GPUs with the given HBM (GiB), every pair 1 km apart on a 12.8 Tbit/s
/// link.
fn sites(hbm: &[(&str, u32)]) -> Topology {
    let mut text = String::from("name = \"twins\"\n");
    for (id, gib) in hbm {
        text += &format!(
            r#"
[[gpu_types]]
name = "gpu-{id}"
hbm = "{gib} GiB"
dense_bf16 = "1000 TFLOP/s"
scale_up = "7200 Gbit/s"
max_domain_gpus = 8
"#
        );
    }
    for (id, _) in hbm {
        text += &format!(
            r#"
[[sites]]
id = "{id}"
[[sites.buildings]]
id = "{id}1"
fabric = {{ kind = "leaf-spine", link_rate = "400 Gbit/s" }}
domains = [{{ id = "d", count = 1, nodes_per_domain = 1, gpus_per_node = 8, gpu = "gpu-{id}" }}]
"#
        );
    }
    for (i, (x, _)) in hbm.iter().enumerate() {
        for (y, _) in &hbm[i + 1..] {
            text += &format!(
                r#"
[[links]]
between = ["{x}", "{y}"]
distance = "1 km"
link_rate = "12800 Gbit/s"
"#
            );
        }
    }
    Topology::from_toml("twins.toml", &text).expect("topology parses")
}

/// 8B parameters over 8 layers, 4 sequences per step: a pipeline over both sites has a bubble
/// of a quarter, one site alone cannot hold it at 24 GiB.
fn job() -> JobSpec {
    JobSpec::from_toml(
        "eight-b.job.toml",
        r#"
name = "eight-b"
[model]
parameters = 8_000_000_000
layers = 8
hidden_size = 4096
attention_heads = 32
sequence_length = 2048
[batch]
global_batch = 4
micro_batch = 1
"#,
    )
    .expect("job parses")
}

fn reason<'p>(plan: &'p longhaul_core::placement::Plan, decision: &str) -> &'p str {
    plan.reason(decision)
        .map(|r| r.reason.as_str())
        .unwrap_or_else(|| panic!("no {decision:?} reason in {:#?}", plan.reasons))
}

/// At 24 GiB a replica with DiLoCo's 8 bytes per parameter of outer state does not fit, and
/// the every-step all-reduce over a fast, short link costs less than the pipeline's bubble.
#[test]
fn cross_site_data_parallelism_wins_where_diloco_state_does_not_fit() {
    let (topology, job) = (twins(24), job());
    let plan = place(&topology, &job).expect("feasible");
    assert_eq!(
        plan.mode,
        CrossSiteMode::DataParallel,
        "{:#?}",
        plan.reasons
    );
    validate_plan(&topology, &job, &plan).expect("valid");
    assert_eq!(plan.groups.len(), 2);
    assert!(plan.sync.is_none(), "no outer rounds to schedule");
    // The WAN all-reduce is what every step waits for, and the parts sum to the total.
    let s = &plan.step;
    assert!(s.outer_sync_amortised > 0.0);
    assert_eq!(s.outer_sync_amortised, plan.outer_sync_seconds);
    let sum = s.compute
        + s.tensor_parallel
        + s.expert_parallel
        + s.exposed_pipeline
        + s.bubble
        + s.exposed_data_parallel
        + s.outer_sync_amortised;
    assert!((sum - s.total).abs() <= 1e-9 * s.total, "{s:?}");
    // The whole bf16 gradient (P × 2 bytes) crosses the link every step.
    let bytes: f64 = plan.wan.iter().map(|w| w.bytes_per_step).sum();
    assert!(bytes >= 2.0 * 8e9, "{:?}", plan.wan);
    assert!(plan.wan.iter().all(|w| w.what.contains("every step")));
    assert!(reason(&plan, "mode").contains("every step"));
    assert!(reason(&plan, "mode").contains("every diloco candidate was infeasible"));
    // The plan does not come from a cut: every site order and subset, enumerated, agrees.
    let every = every_site_order_place(&topology, &job, &CostParams::default()).unwrap();
    assert_eq!(every.mode, plan.mode);
    assert_eq!(every.step.total, plan.step.total);
    // Re-costed on its own topology it is itself.
    let again = recost(&topology, &job, &CostParams::default(), &plan).unwrap();
    assert_eq!(again.step, plan.step);
    assert_eq!(again.wan, plan.wan);
    // Held to DiLoCo, the job does not fit at all.
    let mut diloco = job.clone();
    diloco.constraints.cross_site_mode = Some(ModeConstraint::Diloco);
    match place(&topology, &diloco) {
        Err(PlacementError::OutOfMemory { .. }) => {}
        other => panic!("expected out of memory, got {other:?}"),
    }
}

/// With room for DiLoCo's state, DiLoCo wins, the mode reason says why data parallelism
/// lost and the "synchronous data parallelism" reason what it would cost; forced, data
/// parallelism is placed and is no faster.
#[test]
fn where_diloco_fits_it_wins_and_data_parallelism_is_costed_beside_it() {
    let (topology, job) = (twins(28), job());
    let plan = place(&topology, &job).expect("feasible");
    assert!(
        matches!(plan.mode, CrossSiteMode::Diloco { .. }),
        "{:?}",
        plan.mode
    );
    // Cut by its bound (the whole gradient's exchange alone exceeds DiLoCo's step), the
    // kind is named as provably slower; the same replicas' sync-DP step is quoted.
    assert!(
        reason(&plan, "mode")
            .contains("every cross-site data-parallel candidate was infeasible or provably slower"),
        "{}",
        reason(&plan, "mode")
    );
    let quoted = reason(&plan, "synchronous data parallelism");
    assert!(
        quoted.contains("every step") && quoted.contains("against this plan"),
        "{quoted}"
    );
    let mut forced = job.clone();
    forced.constraints.cross_site_mode = Some(ModeConstraint::DataParallel);
    let dp = place(&topology, &forced).expect("feasible");
    assert_eq!(dp.mode, CrossSiteMode::DataParallel);
    validate_plan(&topology, &forced, &dp).expect("valid");
    assert!(dp.step.total >= plan.step.total);
    // Only data-parallel kinds were considered: the reason names no other as infeasible.
    assert!(!reason(&dp, "mode").contains("pipeline candidate"));
    assert!(!reason(&dp, "mode").contains("diloco candidate"));
}

#[test]
fn data_parallelism_held_to_one_site_is_refused_naming_the_field() {
    let topology = twins(24);
    let mut job = job();
    job.constraints.cross_site_mode = Some(ModeConstraint::DataParallel);
    job.constraints.allowed_sites = vec!["a".to_string()];
    let error = place(&topology, &job).unwrap_err().to_string();
    assert!(
        error.contains("constraints.cross_site_mode") && error.contains("\"data-parallel\""),
        "{error}"
    );
    // And the constraint round-trips the job file's spelling.
    assert_eq!(
        ModeConstraint::parse("data-parallel"),
        Some(ModeConstraint::DataParallel)
    );
    assert_eq!(ModeConstraint::DataParallel.as_str(), "data-parallel");
}

/// The baseline is the training precision as it is: fp32 gradients cross at 32 bits, which
/// no DiLoCo codec is.
#[test]
fn fp32_gradients_cross_at_32_bits() {
    let topology = twins(80);
    let mut job = job();
    job.training.precision = longhaul_core::job::Precision::Fp32;
    job.constraints.cross_site_mode = Some(ModeConstraint::DataParallel);
    let plan = place(&topology, &job).expect("feasible");
    assert_eq!(plan.mode, CrossSiteMode::DataParallel);
    validate_plan(&topology, &job, &plan).expect("valid");
    let bytes: f64 = plan.wan.iter().map(|w| w.bytes_per_step).sum();
    // Both directions of one link, half the gradient each way and back: 2 × 4 bytes a
    // parameter.
    assert!((bytes - 8.0 * 8e9).abs() <= 1e-6 * bytes, "{bytes}");
}

/// A third site with room for DiLoCo's state cannot hold DiLoCo alone, and the two small
/// sites cannot hold its replicas at all; data-parallel replicas fit there. The branch and
/// bound (whose memory filter holds for the lighter replica) costs them, and finds the plan
/// that every site subset enumerated finds.
#[test]
fn the_site_search_keeps_sites_only_data_parallelism_can_use() {
    let topology = sites(&[("a", 24), ("b", 24), ("c", 80)]);
    let job = job();
    let params = CostParams::default();
    let plan = place(&topology, &job).expect("feasible");
    let every = every_site_order_place(&topology, &job, &params).expect("feasible");
    // A three-site pipeline wins here; data parallelism on the small sites was costed, not
    // filtered out with DiLoCo.
    assert!(
        reason(&plan, "mode").contains("best cross-site data-parallel plan"),
        "{}",
        reason(&plan, "mode")
    );
    assert_eq!(plan.mode, every.mode);
    assert_eq!(plan.step.total, every.step.total);
    assert_eq!(plan.gpus(), every.gpus());
    validate_plan(&topology, &job, &plan).expect("valid");
}

/// Held to data parallelism on a topology with one usable site, placement says replicas
/// need two.
#[test]
fn data_parallelism_on_one_usable_site_says_it_needs_two() {
    let mut job = job();
    job.constraints.cross_site_mode = Some(ModeConstraint::DataParallel);
    let error = place(&sites(&[("a", 80)]), &job).unwrap_err().to_string();
    assert!(
        error.contains("\"data-parallel\"") && error.contains("two or more"),
        "{error}"
    );
}
