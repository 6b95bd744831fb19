//! The simulator's analytical tier: wall time of one sweep point (every mode re-costed on
//! one WAN setting) on the bundled 12k-GPU and 103k-GPU topologies, and of a 100-point
//! distance sweep, beside the one-off placement each comparison starts from. Medians of
//! repeated runs; the machine is shared, so read the medians, not the extremes. Run with
//! `cargo bench -p longhaul-simulations --bench analytic`.

use std::time::Instant;

use longhaul_core::cost::CostParams;
use longhaul_core::{JobSpec, Topology};
use longhaul_simulations::analytic::{Comparison, WanSetting};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(name: &str, topology: &str, job: &str) -> Result<(), Box<dyn std::error::Error>> {
    let topology = Topology::from_toml(name, topology)?;
    let job = JobSpec::from_toml("job.toml", job)?;
    let params = CostParams::default();
    let started = Instant::now();
    let comparison = Comparison::prepare(&topology, &job, &params)?;
    let prepare = started.elapsed().as_secs_f64();
    let distances: Vec<f64> = (0..100)
        .map(|i| 10f64.powf(f64::from(i) / 99.0 * 4.0))
        .collect();
    let mut point = Vec::new();
    let mut sweep = Vec::new();
    for _ in 0..7 {
        let started = Instant::now();
        for &km in &distances {
            let setting = WanSetting {
                distance_km: Some(km),
                ..WanSetting::default()
            };
            let t = Instant::now();
            std::hint::black_box(comparison.at(&setting)?);
            point.push(t.elapsed().as_secs_f64());
        }
        sweep.push(started.elapsed().as_secs_f64());
    }
    println!(
        "{name:<28} {:>7} GPUs  prepare (placement, once) {:>8.1} ms  one point median {:>7.3} ms (max {:>7.3})  100-point sweep median {:>7.1} ms",
        topology.gpus(),
        prepare * 1e3,
        median(point.clone()) * 1e3,
        point.iter().copied().fold(0.0, f64::max) * 1e3,
        median(sweep) * 1e3,
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(
        "three-sites-two-continents",
        include_str!("../../deploy/examples/three-sites-two-continents.toml"),
        include_str!("../../deploy/examples/dense-400b.job.toml"),
    )?;
    run(
        "hyperscale-plus-two",
        include_str!("../../deploy/examples/hyperscale-plus-two.toml"),
        include_str!("../../deploy/examples/llama-70b.job.toml"),
    )?;
    Ok(())
}
