//! Benchmark of `longhaul topology show` on the 100k-GPU example: parse,
//! validate, summarise and render, as the CLI does. Prints the mean and the
//! slowest of the timed runs.
//!
//! Run: `cargo bench -p longhaul-cli --bench topology_show`

use std::time::{Duration, Instant};

use longhaul_cli::topology::render;
use longhaul_core::Topology;

const FILE: &str = include_str!("../../../deploy/examples/hyperscale-plus-two.toml");
const RUNS: u32 = 200;

fn show_once() -> usize {
    let topology = match Topology::from_toml("hyperscale-plus-two.toml", FILE) {
        Ok(topology) => topology,
        Err(error) => panic!("bundled example is invalid: {error}"),
    };
    render(&topology, &topology.summary()).len()
}

fn main() {
    let mut rendered = show_once();
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    for _ in 0..RUNS {
        let run = Instant::now();
        rendered = rendered.max(show_once());
        slowest = slowest.max(run.elapsed());
    }
    let mean = start.elapsed() / RUNS;
    println!(
        "topology show, 100,008 GPUs (hyperscale-plus-two): mean {:.1} µs, slowest {:.1} µs over {RUNS} runs ({rendered} bytes of output)",
        mean.as_secs_f64() * 1e6,
        slowest.as_secs_f64() * 1e6
    );
}
