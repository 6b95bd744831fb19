//! Re-costing a plan on other WAN links (`placement::recost`): on the topology it was placed
//! on it reproduces the plan's predictions exactly, and a longer, slower or lossier WAN never
//! makes a plan faster.

use longhaul_core::cost::CostParams;
use longhaul_core::job::ModeConstraint;
use longhaul_core::placement::{CrossSiteMode, Plan, place, recost};
use longhaul_core::units::Distance;
use longhaul_core::{JobSpec, Topology};

const TOPOLOGIES: &[(&str, &str)] = &[
    (
        "two-campuses-80km",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
    ),
    (
        "two-campuses-500km",
        include_str!("../../../deploy/examples/two-campuses-500km.toml"),
    ),
    (
        "three-sites-two-continents",
        include_str!("../../../deploy/examples/three-sites-two-continents.toml"),
    ),
];
const JOBS: &[(&str, &str)] = &[
    (
        "llama-70b",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    ),
    (
        "dense-400b",
        include_str!("../../../deploy/examples/dense-400b.job.toml"),
    ),
];

/// Every example plan, placed freely and with each cross-site mode forced (where feasible).
fn plans() -> Vec<(String, Topology, JobSpec, Plan)> {
    let mut out = Vec::new();
    for (tname, ttext) in TOPOLOGIES {
        let topology = Topology::from_toml(tname, ttext).expect("example topology parses");
        for (jname, jtext) in JOBS {
            for mode in [
                None,
                Some(ModeConstraint::Diloco),
                Some(ModeConstraint::Pipeline),
                Some(ModeConstraint::DataParallel),
            ] {
                let mut job = JobSpec::from_toml(jname, jtext).expect("example job parses");
                job.constraints.cross_site_mode = mode;
                if let Ok(plan) = place(&topology, &job) {
                    out.push((
                        format!("{jname} on {tname} ({mode:?})"),
                        topology.clone(),
                        job,
                        plan,
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn a_plan_recosted_on_its_own_topology_is_the_plan() {
    let plans = plans();
    let diloco = plans
        .iter()
        .filter(|(_, _, _, p)| matches!(p.mode, CrossSiteMode::Diloco { .. }))
        .count();
    let data_parallel = plans
        .iter()
        .filter(|(_, _, _, p)| p.mode == CrossSiteMode::DataParallel)
        .count();
    assert!(
        diloco >= 2 && data_parallel >= 2 && plans.len() - diloco - data_parallel >= 2,
        "every mode is covered"
    );
    for (what, topology, job, plan) in &plans {
        let again = recost(topology, job, &CostParams::default(), plan).unwrap();
        assert_eq!(again.step, plan.step, "{what}");
        assert_eq!(again.mode, plan.mode, "{what}");
        assert_eq!(again.outer_sync_seconds, plan.outer_sync_seconds, "{what}");
        assert_eq!(again.sync, plan.sync, "{what}");
        for (a, b) in again.groups.iter().zip(&plan.groups) {
            assert_eq!(a.step_seconds, b.step_seconds, "{what}");
        }
        let bytes = |p: &Plan| p.wan.iter().map(|w| w.bytes_per_step).sum::<f64>();
        let (x, y) = (bytes(&again), bytes(plan));
        assert!(
            (x - y).abs() <= 1e-9 * y.max(1.0),
            "{what}: {x} against {y}"
        );
    }
}

#[test]
fn a_longer_slower_lossier_wan_never_makes_a_plan_faster() {
    for (what, topology, job, plan) in plans() {
        let mut worse = topology.clone();
        for link in &mut worse.links {
            link.distance = Distance::from_km(link.distance.km() * 4.0 + 100.0).unwrap();
            link.link_rate = longhaul_core::units::DataRate::from_bits_per_second(
                (link.link_rate.bits_per_second() / 2).max(1),
            );
            link.loss = (link.loss * 2.0 + 1e-4).min(0.5);
        }
        let before = recost(&topology, &job, &CostParams::default(), &plan).unwrap();
        let after = recost(&worse, &job, &CostParams::default(), &plan).unwrap();
        assert!(
            after.step.total >= before.step.total,
            "{what}: {} s on the worse WAN, {} s before",
            after.step.total,
            before.step.total
        );
        // A plan that crosses the WAN feels it.
        if !plan.wan.is_empty() {
            assert!(after.step.total > before.step.total, "{what}");
        }
    }
}
