//! Sync planner wall time: 16 sites × up to 64 fragments (the issue's
//! target is under 10 ms), the planner free to choose P and with P fixed
//! at 64, over a full mesh and over a mesh with one link missing (which
//! forces a ring). Run with `cargo bench -p longhaul-core --bench
//! sync_planner`; `SYNC_PLANNER_RUNS` sets the repetitions (default 50).
//! Prints the median and the slowest run of each case.

use std::time::Instant;

use longhaul_core::job::Diloco;
use longhaul_core::state::LinkRecord;
use longhaul_core::sync::{Codec, SyncInput, plan_sync};
use longhaul_core::topology::WanLink;
use longhaul_core::units::{DataRate, Distance, Duration};

/// 16 sites on a line 100 km apart, fully meshed, pairs beyond 500 km
/// lossy; a 405B-parameter pseudo-gradient, 2 s inner steps.
fn input() -> SyncInput {
    let sites = 16;
    let mut links = Vec::new();
    for a in 0..sites {
        for b in a + 1..sites {
            let km = 100.0 * (b - a) as f64;
            links.push(LinkRecord {
                configured: WanLink {
                    between: [format!("s{a}"), format!("s{b}")],
                    distance: Distance::from_km(km).unwrap_or_default(),
                    overhead: Duration::from_micros(20),
                    parallel_links: 8,
                    link_rate: DataRate::from_gbit_per_second(400),
                    loss: if km > 500.0 { 1e-5 } else { 0.0 },
                    buffer: None,
                },
                measured: None,
            });
        }
    }
    let mut policy = Diloco::new(500);
    policy.max_fragments = Some(64);
    SyncInput {
        parameters: 405_000_000_000,
        inner_step_seconds: 2.0,
        sync_dp_bits: 16,
        sites: (0..sites).map(|s| format!("s{s}")).collect(),
        links,
        streams_per_link: 1024,
        codecs: Codec::standard(),
        zstd_bytes_per_second: 32e9,
        policy,
    }
}

fn main() {
    let runs: usize = std::env::var("SYNC_PLANNER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
        .max(1);
    let base = input();
    let mut fixed = base.clone();
    fixed.policy.fragments = Some(64);
    let mut ring = fixed.clone();
    ring.links.remove(7);
    for (name, input) in [
        ("16 sites, P chosen (≤ 64), full mesh", &base),
        ("16 sites, P = 64, full mesh", &fixed),
        ("16 sites, P = 64, one link missing (ring)", &ring),
    ] {
        let mut times = Vec::with_capacity(runs);
        let mut last = None;
        for _ in 0..runs {
            let start = Instant::now();
            let plan = plan_sync(input);
            times.push(start.elapsed().as_secs_f64() * 1e3);
            last = Some(plan);
        }
        times.sort_by(f64::total_cmp);
        let summary = match last {
            Some(Ok(plan)) => format!(
                "H = {}, P = {}, τ = {}, {} steps per fragment",
                plan.inner_steps, plan.fragments, plan.overlap_steps, plan.collective.steps
            ),
            Some(Err(error)) => format!("no plan: {error}"),
            None => String::new(),
        };
        println!(
            "{name}: median {:.3} ms, slowest {:.3} ms over {runs} runs ({summary})",
            times[times.len() / 2],
            times[times.len() - 1]
        );
    }
}
