//! The analytic tier against a published multi-site run: INTELLECT-1.
//!
//! Source: S. Jaghouar et al., "INTELLECT-1 Technical Report", Prime
//! Intellect, arXiv:2412.01152 (2024), §3 (INTELLECT-1 training): a 10B
//! Llama-3-shaped model trained with DiLoCo, H = 100 inner steps, int8
//! pseudo-gradients reduced by a ring all-reduce, up to 14 nodes of 8 H100
//! on three continents; its table of compute utilisation by geographic
//! setting (reproduced as Table 2 of DataCrunch's "Multi Data Center
//! Training: Prime Intellect"):
//!
//! | setting      | inner steps (100) | median all-reduce | compute util. |
//! | ------------ | ----------------- | ----------------- | ------------- |
//! | USA          | 38 min            | 103 s             | 95.7 %        |
//! | USA + Europe | 38 min            | 382 s             | 85.6 %        |
//! | Global       | 38 min            | 469 s             | 83.0 %        |
//!
//! and the bandwidth between nodes fluctuated between 500 Mbit/s and
//! 4 Gbit/s (same source). "Compute utilisation" there is the share of time
//! not spent communicating, the planner's H·t / (H·t + E).
//!
//! What the report does not give, and how the test chooses it:
//! - **the nodes per setting**: 14 (the most) in every setting; the ring's
//!   time scales with (M − 1)/M, so fewer nodes would shorten it by at most
//!   a quarter (M = 4);
//! - **the inner step**: the cost model predicts it from the batch and its
//!   MFU (0.4), and the batch is not what we compare, so the global batch
//!   (1,512 sequences of 8,192 tokens, 108 per node) is chosen to put the
//!   predicted inner step at the published 22.8 s (38 min / 100), checked
//!   within 2 %; each replica stays in its node (no pipeline stages), as
//!   the run's did, which also spares the comparison a search of pipeline
//!   splits over 14 sites that this test does not look at;
//! - **distances, loss and streams**: the analytic tier's ring costs
//!   2(M − 1)·RTT/2 of latency, seconds against hundreds, so the distances
//!   (4,000, 7,000 and 10,000 km per hop) are rough guesses that do not
//!   matter; the links are loss-free, since no loss was published;
//! - **the rate per hop**: the reported range, 0.5 to 4 Gbit/s.
//!
//! The bounds, stated honestly: the analytic tier's utilisation over the
//! reported rate range brackets the USA figure; it is never below the
//! published figure at the top of the range; at its bottom it is above the
//! transatlantic and global figures by up to 6 percentage points, because
//! their medians imply 0.39 and 0.32 Gbit/s per hop, below the reported
//! range (the tier does not model what else the all-reduce waited for:
//! quantisation on the CPU, TCP over long lossy paths, stragglers). At the
//! per-hop rate each median implies, the tier gives the published
//! utilisation within 0.5 percentage points, which checks the chain from
//! placement through the planner's ring and int8 codec to utilisation.
//! The discrete-event tier does not run here: a 10 GB ring over 14 hops is
//! ~10⁸ events, too long for a test.

use longhaul_core::cost::CostParams;
use longhaul_core::job::JobSpec;
use longhaul_core::sync::{Codec, compute_utilisation};
use longhaul_core::topology::Topology;
use longhaul_simulations::analytic::{Comparison, Mode, WanSetting};

const NODES: usize = 14;
const PARAMETERS: f64 = 10e9;
const INNER_STEPS: u32 = 100;
/// 38 minutes for 100 inner steps.
const INNER_STEP_SECONDS: f64 = 38.0 * 60.0 / 100.0;
const RATE_RANGE_GBIT: (f64, f64) = (0.5, 4.0);

struct Setting {
    name: &'static str,
    km: f64,
    all_reduce_seconds: f64,
    utilisation: f64,
}

const SETTINGS: [Setting; 3] = [
    Setting {
        name: "USA",
        km: 4000.0,
        all_reduce_seconds: 103.0,
        utilisation: 0.957,
    },
    Setting {
        name: "USA + Europe",
        km: 7000.0,
        all_reduce_seconds: 382.0,
        utilisation: 0.856,
    },
    Setting {
        name: "Global",
        km: 10_000.0,
        all_reduce_seconds: 469.0,
        utilisation: 0.830,
    },
];

/// 14 sites of one 8-GPU H100 node each, linked in a ring (as the run's
/// all-reduce was), so the planner has a ring to use and no mesh.
fn ring_topology() -> Topology {
    let mut text = String::from("name = \"intellect-1-ring\"\n");
    for i in 0..NODES {
        text.push_str(&format!(
            "[[sites]]\nid = \"node{i}\"\n[[sites.buildings]]\nid = \"b{i}\"\n\
             fabric = {{ kind = \"rail-aligned\", link_rate = \"400 Gbit/s\" }}\n\
             [[sites.buildings.domains]]\nid = \"hgx\"\ncount = 1\nnodes_per_domain = 1\n\
             gpus_per_node = 8\ngpu = \"h100\"\n"
        ));
    }
    for i in 0..NODES {
        text.push_str(&format!(
            "[[links]]\nbetween = [\"node{i}\", \"node{}\"]\ndistance = \"4000 km\"\n\
             link_rate = \"1 Gbit/s\"\nloss = 0.0\n",
            (i + 1) % NODES
        ));
    }
    Topology::from_toml("intellect-1-ring.toml", &text).expect("a valid topology")
}

/// The run's job: 10B parameters (Llama-3-8B's width, 42 layers), bf16 with
/// Adam, one node per replica, DiLoCo held at H = 100, one fragment, no
/// overlap, int8.
fn intellect_1() -> JobSpec {
    let text = "name = \"intellect-1\"\n\
        [model]\nparameters = 10_000_000_000\nlayers = 42\nhidden_size = 4096\n\
        attention_heads = 32\nsequence_length = 8192\nvocabulary_size = 128256\n\
        [batch]\nglobal_batch = 1512\nmicro_batch = 1\n\
        [training]\nprecision = \"bf16\"\noptimizer_state_bytes_per_parameter = 12\n\
        [constraints]\nmax_tensor_parallel = 8\npipeline_parallel = 1\ncross_site_mode = \"diloco\"\n\
        [diloco]\ninner_steps = 100\nmax_inner_steps = 100\nfragments = 1\n\
        max_overlap_steps = 0\nbits = 8\n";
    JobSpec::from_toml("intellect-1.job.toml", text).expect("a valid job")
}

/// The report's utilisation is the planner's formula: 100 inner steps of
/// 22.8 s and the median all-reduce, unhidden, give the published figure
/// within 0.1 percentage point in every setting.
#[test]
fn intellect_1s_utilisation_is_the_planners_formula() {
    for setting in &SETTINGS {
        let utilisation =
            compute_utilisation(INNER_STEPS, INNER_STEP_SECONDS, setting.all_reduce_seconds);
        println!(
            "published | INTELLECT-1 {} | utilisation from its own times | {:.4} | published {:.3}",
            setting.name, utilisation, setting.utilisation
        );
        assert!(
            (utilisation - setting.utilisation).abs() <= 0.001,
            "{}: {utilisation} against {}",
            setting.name,
            setting.utilisation
        );
    }
}

/// INTELLECT-1's three settings on the analytic tier: see the module docs
/// for what is chosen and why the bounds are what they are.
#[test]
fn intellect_1_on_the_analytic_tier_within_the_stated_bounds() {
    let comparison = Comparison::prepare(&ring_topology(), &intellect_1(), &CostParams::default())
        .expect("the job places as DiLoCo");
    let plan = comparison.plan(Mode::Diloco).expect("a DiLoCo plan");
    let inner = plan
        .groups
        .iter()
        .map(|group| group.step_seconds)
        .fold(0.0, f64::max);
    assert!(
        (inner / INNER_STEP_SECONDS - 1.0).abs() <= 0.02,
        "the calibrated inner step is {inner} s, not {INNER_STEP_SECONDS} s"
    );
    println!(
        "published | INTELLECT-1 | inner step {inner:.2} s (published {INNER_STEP_SECONDS} s)"
    );
    let sites = plan.sync.as_ref().map_or(0, |sync| sync.sites.len());
    assert_eq!(sites, NODES, "every node is a DiLoCo replica");

    let utilisation_at = |km: f64, gbit: f64| {
        let point = comparison
            .at(&WanSetting {
                distance_km: Some(km),
                link_rate_bits_per_second: Some((gbit * 1e9) as u64),
                ..WanSetting::default()
            })
            .expect("a valid setting");
        let diloco = point.outcome(Mode::Diloco).expect("DiLoCo at every point");
        assert_eq!(
            (diloco.inner_steps, diloco.bits),
            (Some(INNER_STEPS), Some(8)),
            "{diloco:?}"
        );
        diloco.compute_utilisation
    };
    // What every node sends around the ring per outer step, at the
    // planner's int8 wire bits (scales included).
    let int8 = Codec::standard()
        .into_iter()
        .find(|codec| codec.bits == 8)
        .expect("an int8 codec");
    let ring_bits =
        2.0 * (NODES as f64 - 1.0) / NODES as f64 * PARAMETERS * int8.bits_per_parameter();
    for setting in &SETTINGS {
        let low = utilisation_at(setting.km, RATE_RANGE_GBIT.0);
        let high = utilisation_at(setting.km, RATE_RANGE_GBIT.1);
        let implied_gbit = ring_bits / setting.all_reduce_seconds / 1e9;
        let at_implied = utilisation_at(setting.km, implied_gbit);
        println!(
            "published | INTELLECT-1 {} | published {:.3} | analytic at 0.5 Gbit/s {:.3}, at 4 Gbit/s {:.3} \
             | implied {:.2} Gbit/s per hop, analytic there {:.3} | bounds: ≤ U(4), ≥ U(0.5) − 0.06, \
             ±0.005 at the implied rate",
            setting.name, setting.utilisation, low, high, implied_gbit, at_implied
        );
        assert!(
            setting.utilisation <= high,
            "{}: published {} above the tier's best case {high}",
            setting.name,
            setting.utilisation
        );
        assert!(
            setting.utilisation >= low - 0.06,
            "{}: published {} more than 6 points below the tier's worst case {low}",
            setting.name,
            setting.utilisation
        );
        assert!(
            (at_implied - setting.utilisation).abs() <= 0.005,
            "{}: {at_implied} at {implied_gbit} Gbit/s against {}",
            setting.name,
            setting.utilisation
        );
    }
    // The USA setting's median is inside the reported rate range.
    let usa = &SETTINGS[0];
    let (low, high) = (
        utilisation_at(usa.km, RATE_RANGE_GBIT.0),
        utilisation_at(usa.km, RATE_RANGE_GBIT.1),
    );
    assert!(
        (low..=high).contains(&usa.utilisation),
        "USA: {} outside [{low}, {high}]",
        usa.utilisation
    );
}
