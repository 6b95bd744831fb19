//! The closed forms of the module documentation, exactly, and every
//! refusal naming its field.

use super::model::{Candidate, Model};
use super::*;
use crate::job::Diloco;
use crate::state::{LinkMeasurement, LinkRecord};
use crate::topology::WanLink;
use crate::units::{DataRate, Distance, Duration};

fn wan(a: &str, b: &str, km: f64, gbit: u64, loss: f64) -> LinkRecord {
    LinkRecord {
        configured: WanLink {
            between: [a.to_string(), b.to_string()],
            distance: Distance::from_km(km).unwrap(),
            overhead: Duration::from_nanos(0),
            parallel_links: 1,
            link_rate: DataRate::from_gbit_per_second(gbit),
            loss,
            buffer: None,
        },
        measured: None,
    }
}

/// Two sites, one loss-free 100 Gbit/s link 500 km long, 2³⁰ parameters,
/// 1 s inner steps, H fixed at 100.
fn input() -> SyncInput {
    let mut policy = Diloco::new(100);
    policy.max_inner_steps = Some(100);
    SyncInput {
        parameters: 1 << 30,
        inner_step_seconds: 1.0,
        sync_dp_bits: 16,
        sites: vec!["a".into(), "b".into()],
        links: vec![wan("a", "b", 500.0, 100, 0.0)],
        streams_per_link: 64,
        codecs: Codec::standard(),
        zstd_bytes_per_second: 8e9,
        policy,
    }
}

fn three_sites(links: &[(&str, &str)]) -> SyncInput {
    let mut i = input();
    i.sites = vec!["a".into(), "b".into(), "c".into()];
    i.links = links
        .iter()
        .map(|(x, y)| wan(x, y, 500.0, 100, 0.0))
        .collect();
    i
}

fn field_of(result: Result<SyncPlan, SyncError>) -> String {
    match result {
        Err(SyncError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn exposed_time_is_transfer_minus_overlap_or_zero() {
    assert_eq!(exposed_seconds(3.0, 0, 0.5), 3.0);
    assert_eq!(exposed_seconds(3.0, 2, 0.5), 2.0);
    assert_eq!(exposed_seconds(3.0, 6, 0.5), 0.0);
    assert_eq!(exposed_seconds(3.0, 7, 0.5), 0.0);
    assert_eq!(exposed_seconds(0.0, 0, 0.5), 0.0);
}

#[test]
fn utilisation_is_compute_over_compute_plus_exposed() {
    assert_eq!(compute_utilisation(100, 1.0, 0.0), 1.0);
    // H·t = 300, E = 100: 300 / 400.
    assert_eq!(compute_utilisation(100, 3.0, 100.0), 0.75);
    assert_eq!(compute_utilisation(4, 1.0, 1.0), 0.8);
    assert!((compute_utilisation(19, 1.0, 1.0) - 0.95).abs() < 1e-15);
}

#[test]
fn bytes_per_site_and_reduction_are_the_closed_forms() {
    assert_eq!(bytes_sent_per_site(2, 8.0), 8.0);
    assert_eq!(bytes_sent_per_site(4, 8.0), 12.0);
    assert_eq!(reduction_vs_sync_dp(500, 16, 4.0), 2000.0);
    assert_eq!(reduction_vs_sync_dp(100, 16, 16.0), 100.0);
}

#[test]
fn two_sites_exchange_each_fragment_by_reduce_scatter_and_all_gather() {
    let mut i = input();
    i.policy.bits = Some(16);
    i.policy.fragments = Some(4);
    let plan = plan_sync(&i).unwrap();
    assert_eq!(plan.collective.kind, CollectiveKind::ReduceScatterAllGather);
    // F = 2²⁸ parameters × 2 bytes; T = 2 · (α + (F/2)/B), α = 500 km × 5 µs.
    let f = (1u64 << 28) as f64 * 2.0;
    let b = 100e9 / 8.0;
    let alpha = 500.0 * 5e-6;
    assert_eq!(plan.fragment_bytes, f);
    assert_eq!(plan.fragment_transfer_seconds, 2.0 * (alpha + f / 2.0 / b));
    // Each site sends 2(M−1)/M × payload = the payload; the link carries
    // both directions.
    let payload = (1u64 << 30) as f64 * 2.0;
    let link = &plan.links[0];
    assert_eq!(
        link.bytes_per_outer_step / 2.0,
        bytes_sent_per_site(2, payload)
    );
    assert_eq!(link.sync_dp_bytes_per_step, link.bytes_per_outer_step);
    // 16 bits against 16: the reduction is H.
    assert_eq!(plan.reduction_vs_sync_dp, 100.0);
    assert_eq!(link.reduction_vs_sync_dp, 100.0);
    assert!(!link.error_feedback);
}

#[test]
fn exposed_time_and_utilisation_of_a_plan_follow_the_closed_forms() {
    let mut i = input();
    i.inner_step_seconds = 0.005;
    i.policy.fragments = Some(2);
    i.policy.max_overlap_steps = Some(3);
    i.policy.target_compute_utilisation = Some(1.0);
    let plan = plan_sync(&i).unwrap();
    let t = plan.fragment_transfer_seconds;
    assert!(t > 3.0 * 0.005, "the example must expose something: {t}");
    assert_eq!(plan.overlap_steps, 3);
    let x = exposed_seconds(t, 3, 0.005);
    assert_eq!(x, t - 3.0 * 0.005);
    assert_eq!(plan.exposed_seconds_per_fragment, x);
    assert_eq!(plan.exposed_seconds_per_outer_step, 2.0 * x);
    assert_eq!(
        plan.predicted_compute_utilisation,
        compute_utilisation(100, 0.005, 2.0 * x)
    );
    let ht = 100.0 * 0.005;
    assert!((plan.predicted_compute_utilisation - ht / (ht + 2.0 * x)).abs() < 1e-15);
    assert_eq!(plan.outer_step_seconds, ht + 2.0 * x);
    assert!(!plan.meets_target);
}

#[test]
fn a_ring_of_three_takes_four_steps_and_sends_the_same_bytes_per_site() {
    // Three equal links: both the ring and the mesh are candidates.
    let mut i = three_sites(&[("a", "b"), ("b", "c"), ("c", "a")]);
    i.parameters = 3 << 28;
    i.policy.bits = Some(4);
    i.policy.fragments = Some(1);
    let model = Model::new(&i).unwrap();
    let ring = Candidate::Ring(vec![0, 1, 2]);
    let f = model.fragment_bytes(1);
    assert_eq!(f, (3u64 << 28) as f64 * 4.25 / 8.0);
    let alpha = 500.0 * 5e-6;
    let b = 100e9 / 8.0;
    // 2 · [(M−1)α + (M−1)/M · F/B] with M = 3.
    let expected = 2.0 * (2.0 * alpha + 2.0 / 3.0 * f / b);
    assert_eq!(model.fragment_seconds(&ring, 1), expected);
    // The mesh: 2 · (α + (F/3)/B).
    assert_eq!(
        model.fragment_seconds(&Candidate::Direct, 1),
        2.0 * (alpha + f / 3.0 / b)
    );
    // Per site, on the ring and on the mesh: 2(M−1)/M × payload.
    let payload = (3u64 << 28) as f64 * 4.25 / 8.0;
    assert_eq!(
        model.link_bytes(&ring, 4.25),
        bytes_sent_per_site(3, payload)
    );
    let mesh_per_site = 2.0 * model.link_bytes(&Candidate::Direct, 4.25) / 2.0;
    assert_eq!(mesh_per_site, bytes_sent_per_site(3, payload));
}

#[test]
fn an_incomplete_mesh_of_three_cannot_ring_and_says_which_links_are_missing() {
    let i = three_sites(&[("a", "b"), ("b", "c")]);
    match plan_sync(&i) {
        Err(SyncError::NoCollective(message)) => {
            assert!(message.contains("a–c"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn four_sites_on_a_cycle_ring_when_the_mesh_is_incomplete() {
    let mut i = input();
    i.sites = vec!["a".into(), "b".into(), "c".into(), "d".into()];
    i.links = vec![
        wan("a", "c", 100.0, 100, 0.0),
        wan("c", "b", 100.0, 100, 0.0),
        wan("b", "d", 100.0, 100, 0.0),
        wan("d", "a", 100.0, 100, 0.0),
    ];
    let plan = plan_sync(&i).unwrap();
    assert_eq!(plan.collective.kind, CollectiveKind::Ring);
    assert_eq!(plan.collective.order, ["a", "c", "b", "d"]);
    assert_eq!(plan.collective.steps, 6);
    assert_eq!(plan.links.len(), 4);
    let reason = &plan.reason("collective").unwrap().reason;
    assert!(reason.contains("mesh is incomplete"), "{reason}");
}

#[test]
fn the_reduction_is_h_times_sync_dp_bits_over_wire_bits() {
    let mut i = input();
    i.policy.inner_steps = 500;
    i.policy.max_inner_steps = Some(500);
    let plan = plan_sync(&i).unwrap();
    assert_eq!(plan.links[0].bits, 4);
    assert_eq!(plan.links[0].wire_bits_per_parameter, 4.25);
    assert_eq!(plan.reduction_vs_sync_dp, 500.0 * 16.0 / 4.25);
    assert_eq!(plan.links[0].reduction_vs_sync_dp, 500.0 * 16.0 / 4.25);
    // Bytes: sync DP per step × H / planned = the reduction, to rounding.
    let ratio = plan.sync_dp_bytes_per_step * 500.0 / plan.bytes_per_outer_step;
    assert!((ratio / plan.reduction_vs_sync_dp - 1.0).abs() < 1e-12);
    assert!(plan.links[0].error_feedback);
}

#[test]
fn the_schedule_staggers_fragments_at_f_h_over_p() {
    let mut i = input();
    i.parameters = 1_000_003;
    i.policy.fragments = Some(7);
    i.policy.max_overlap_steps = Some(2);
    let plan = plan_sync(&i).unwrap();
    assert_eq!(plan.schedule.len(), 7);
    let tau = plan.overlap_steps;
    let mut next = 0;
    for (f, sync) in plan.schedule.iter().enumerate() {
        assert_eq!(sync.fragment as usize, f);
        assert_eq!(sync.first_parameter, next);
        assert_eq!(sync.sync_at_inner_step as usize, f * 100 / 7);
        assert_eq!(sync.apply_at_inner_step, sync.sync_at_inner_step + tau);
        next += sync.parameters;
    }
    assert_eq!(next, 1_000_003);
    // The largest fragment is ⌈N/P⌉.
    let largest = plan.schedule.iter().map(|s| s.parameters).max().unwrap();
    assert_eq!(largest, 1_000_003u64.div_ceil(7));
}

#[test]
fn measured_figures_are_preferred_and_the_reason_says_so() {
    let mut i = input();
    i.links[0].measured = Some(LinkMeasurement {
        rtt_ns: 12_000_000,
        loss_rate: 0.0,
        throughput_bps: 40_000_000_000,
        measured_at_unix_ms: 1,
    });
    let plan = plan_sync(&i).unwrap();
    let link = &plan.links[0];
    assert_eq!(link.rtt_seconds, 0.012);
    assert_eq!(link.rate_bits_per_second, 40e9);
    assert!(link.measured);
    assert!(
        link.reason.contains("RTT 12 ms measured"),
        "{}",
        link.reason
    );
    assert!(
        link.reason.contains("capacity 40 Gbit/s measured"),
        "{}",
        link.reason
    );
    assert!(
        link.reason.contains("measurement is preferred"),
        "{}",
        link.reason
    );
    // A measurement without RTT or throughput keeps the configured ones.
    i.links[0].measured = Some(LinkMeasurement {
        rtt_ns: 0,
        loss_rate: 0.0,
        throughput_bps: 0,
        measured_at_unix_ms: 1,
    });
    let plan = plan_sync(&i).unwrap();
    assert_eq!(plan.links[0].rtt_seconds, 2.0 * 500.0 * 5e-6);
    assert_eq!(plan.links[0].rate_bits_per_second, 100e9);
}

#[test]
fn loss_caps_each_stream_and_the_budget_paces_the_sync() {
    let mut i = input();
    i.links[0].configured.loss = 1e-4;
    i.streams_per_link = 8;
    let plan = plan_sync(&i).unwrap();
    let per_stream = crate::cost::mathis_bytes_per_second(2.0 * 500.0 * 5e-6, 1e-4).unwrap() * 8.0;
    assert_eq!(plan.links[0].rate_bits_per_second, 8.0 * per_stream);
    assert!(
        plan.links[0].reason.contains("Mathis"),
        "{}",
        plan.links[0].reason
    );

    let mut i = input();
    i.policy.link_budget = Some(DataRate::from_gbit_per_second(2));
    let plan = plan_sync(&i).unwrap();
    assert_eq!(plan.links[0].rate_bits_per_second, 2e9);
    assert!(
        plan.links[0].reason.contains("link_budget"),
        "{}",
        plan.links[0].reason
    );
}

#[test]
fn zstd_pays_only_on_links_slower_than_the_compressor() {
    let mut i = input();
    i.policy.zstd_ratio = Some(1.25);
    i.links[0].configured.link_rate = DataRate::from_gbit_per_second(10);
    let slow = plan_sync(&i).unwrap();
    assert!(slow.links[0].zstd, "{}", slow.links[0].reason);
    assert_eq!(slow.links[0].wire_bits_per_parameter, 4.25 / 1.25);
    assert_eq!(slow.reduction_vs_sync_dp, 100.0 * 16.0 / (4.25 / 1.25));
    i.links[0].configured.link_rate = DataRate::from_gbit_per_second(400);
    let fast = plan_sync(&i).unwrap();
    assert!(!fast.links[0].zstd);
    assert!(fast.links[0].reason.contains("no faster than the link"));
    // The default ratio of 1.0 never pays.
    let plain = plan_sync(&input()).unwrap();
    assert!(!plain.links[0].zstd);
    assert!(plain.links[0].reason.contains("gains nothing"));
}

#[test]
fn h_is_raised_only_as_far_as_the_target_needs() {
    let mut i = input();
    // 10 Gbit/s, 4 bits: one exchange of 2³⁰ × 4.25 bits takes 0.46 s.
    i.links[0].configured.link_rate = DataRate::from_gbit_per_second(10);
    i.inner_step_seconds = 0.001;
    i.policy.inner_steps = 10;
    i.policy.max_inner_steps = Some(100_000);
    i.policy.max_overlap_steps = Some(0);
    i.policy.fragments = Some(1);
    let plan = plan_sync(&i).unwrap();
    assert!(plan.meets_target);
    let h = plan.inner_steps;
    assert!(h > 10);
    let e = plan.exposed_seconds_per_outer_step;
    assert!(compute_utilisation(h, 0.001, e) >= 0.95);
    assert!(compute_utilisation(h - 1, 0.001, e) < 0.95);
    let reason = &plan.reason("inner_steps").unwrap().reason;
    assert!(
        reason.contains("raised from the job's inner_steps 10"),
        "{reason}"
    );
}

#[test]
fn a_missed_target_is_said_and_h_is_the_most_allowed() {
    let mut i = input();
    i.links[0].configured.link_rate = DataRate::from_gbit_per_second(1);
    i.inner_step_seconds = 0.001;
    i.policy.max_overlap_steps = Some(0);
    let plan = plan_sync(&i).unwrap();
    assert!(!plan.meets_target);
    assert_eq!(plan.inner_steps, 100);
    let reason = &plan.reason("inner_steps").unwrap().reason;
    assert!(reason.contains("missed"), "{reason}");
    assert!(
        plan.reason("utilisation")
            .unwrap()
            .reason
            .ends_with("missed")
    );
}

#[test]
fn a_plan_serialises_to_json_and_back() {
    let mut i = three_sites(&[("a", "b"), ("b", "c"), ("c", "a")]);
    i.links[2].configured.loss = 1e-5;
    let plan = plan_sync(&i).unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    let back: SyncPlan = serde_json::from_str(&json).unwrap();
    assert_eq!(back, plan);
    for key in [
        "\"inner_steps\"",
        "\"fragments\"",
        "\"overlap_steps\"",
        "\"bits\"",
        "\"bytes_per_outer_step\"",
        "\"predicted_compute_utilisation\"",
        "\"reduction_vs_sync_dp\"",
        "\"reason\"",
    ] {
        assert!(json.contains(key), "{key} missing from {json}");
    }
    assert_eq!(plan.reasons.len(), 7);
    assert!(plan.reasons.iter().all(|r| !r.reason.is_empty()));
}

#[test]
fn bad_input_names_the_field() {
    type Change = Box<dyn Fn(&mut SyncInput)>;
    let cases: Vec<(&str, Change)> = vec![
        ("parameters", Box::new(|i| i.parameters = 0)),
        (
            "inner_step_seconds",
            Box::new(|i| i.inner_step_seconds = f64::NAN),
        ),
        (
            "inner_step_seconds",
            Box::new(|i| i.inner_step_seconds = f64::INFINITY),
        ),
        (
            "inner_step_seconds",
            Box::new(|i| i.inner_step_seconds = -1.0),
        ),
        ("sync_dp_bits", Box::new(|i| i.sync_dp_bits = 0)),
        ("streams_per_link", Box::new(|i| i.streams_per_link = 0)),
        (
            "zstd_bytes_per_second",
            Box::new(|i| i.zstd_bytes_per_second = f64::NAN),
        ),
        ("sites", Box::new(|i| i.sites.truncate(1))),
        ("sites[1]", Box::new(|i| i.sites[1] = "a".into())),
        ("sites[1]", Box::new(|i| i.sites[1] = String::new())),
        (
            "links[0].configured.between[1]",
            Box::new(|i| i.links[0].configured.between[1] = "z".into()),
        ),
        (
            "links[1].configured.between",
            Box::new(|i| i.links.push(wan("b", "a", 1.0, 1, 0.0))),
        ),
        (
            "links[0].configured.loss",
            Box::new(|i| i.links[0].configured.loss = f64::NAN),
        ),
        (
            "links[0].configured.loss",
            Box::new(|i| i.links[0].configured.loss = 1.0),
        ),
        (
            "links[0].configured.link_rate",
            Box::new(|i| i.links[0].configured.link_rate = DataRate::from_bits_per_second(0)),
        ),
        (
            "links[0].measured.loss_rate",
            Box::new(|i| {
                i.links[0].measured = Some(LinkMeasurement {
                    rtt_ns: 1,
                    loss_rate: f64::NAN,
                    throughput_bps: 1,
                    measured_at_unix_ms: 0,
                })
            }),
        ),
        ("codecs", Box::new(|i| i.codecs.clear())),
        ("codecs[0].bits", Box::new(|i| i.codecs[0].bits = 5)),
        ("codecs[1].bits", Box::new(|i| i.codecs[1].bits = 16)),
        (
            "codecs[1].block_size",
            Box::new(|i| i.codecs[1].block_size = 0),
        ),
        (
            "codecs[0].scale_bits",
            Box::new(|i| i.codecs[0].scale_bits = 16),
        ),
        (
            "codecs[2].zstd_ratio",
            Box::new(|i| i.codecs[2].zstd_ratio = f64::INFINITY),
        ),
        ("policy.inner_steps", Box::new(|i| i.policy.inner_steps = 0)),
        (
            "policy.max_inner_steps",
            Box::new(|i| i.policy.max_inner_steps = Some(99)),
        ),
        (
            "policy.target_compute_utilisation",
            Box::new(|i| i.policy.target_compute_utilisation = Some(f64::NAN)),
        ),
        (
            "policy.target_compute_utilisation",
            Box::new(|i| i.policy.target_compute_utilisation = Some(1.5)),
        ),
        (
            "policy.max_exposed_communication_fraction",
            Box::new(|i| {
                i.policy.target_compute_utilisation = Some(0.9);
                i.policy.max_exposed_communication_fraction = Some(0.1);
            }),
        ),
        (
            "policy.fragments",
            Box::new(|i| i.policy.fragments = Some(0)),
        ),
        (
            "policy.fragments",
            Box::new(|i| i.policy.fragments = Some(101)),
        ),
        (
            "policy.fragments",
            Box::new(|i| {
                i.parameters = 3;
                i.policy.fragments = Some(4);
            }),
        ),
        (
            "policy.max_overlap_steps",
            Box::new(|i| i.policy.max_overlap_steps = Some(65)),
        ),
        ("policy.bits", Box::new(|i| i.policy.bits = Some(2))),
        (
            "policy.bits",
            Box::new(|i| {
                i.codecs.remove(1);
                i.policy.bits = Some(8);
            }),
        ),
        (
            "policy.link_budget",
            Box::new(|i| i.policy.link_budget = Some(DataRate::from_bits_per_second(0))),
        ),
        (
            "policy.zstd_ratio",
            Box::new(|i| i.policy.zstd_ratio = Some(0.5)),
        ),
    ];
    for (field, change) in cases {
        let mut i = input();
        change(&mut i);
        assert_eq!(field_of(plan_sync(&i)), field, "{i:?}");
        assert_eq!(field_of(brute_force_plan_sync(&i)), field);
    }
}

#[test]
fn a_policy_in_a_job_file_parses_with_defaults_and_is_validated() {
    let base = "name = \"j\"\n[model]\nparameters = 1000\nlayers = 2\nhidden_size = 8\n\
                attention_heads = 2\nsequence_length = 16\n[batch]\nglobal_batch = 4\n\
                micro_batch = 1\n[diloco]\ninner_steps = 100\n";
    let job = JobSpec::from_toml("j.toml", base).unwrap();
    let diloco = job.diloco.clone().unwrap();
    assert_eq!(diloco, Diloco::new(100));
    assert_eq!(diloco.max_inner_steps(), 400);
    assert_eq!(diloco.target_compute_utilisation(), 0.95);
    assert_eq!(diloco.max_fragments(), 64);
    assert_eq!(diloco.max_overlap_steps(), 5);
    assert!(diloco.error_feedback());
    assert_eq!(
        JobSpec::from_toml("j.toml", &job.to_toml().unwrap()).unwrap(),
        job
    );

    let full = format!(
        "{base}max_inner_steps = 800\nmax_exposed_communication_fraction = 0.02\n\
         fragments = 8\nmax_overlap_steps = 2\nbits = 8\nerror_feedback = false\n\
         link_budget = \"20 Gbit/s\"\nzstd_ratio = 1.1\n"
    );
    let job = JobSpec::from_toml("j.toml", &full).unwrap();
    let diloco = job.diloco.clone().unwrap();
    assert_eq!(diloco.target_compute_utilisation(), 1.0 - 0.02);
    assert_eq!(diloco.link_budget, Some(DataRate::from_gbit_per_second(20)));
    assert_eq!(
        JobSpec::from_toml("j.toml", &job.to_toml().unwrap()).unwrap(),
        job
    );

    for (line, path) in [
        ("bits = 3\n", "diloco.bits"),
        (
            "target_compute_utilisation = 1.2\n",
            "diloco.target_compute_utilisation",
        ),
        ("max_inner_steps = 10\n", "diloco.max_inner_steps"),
        ("fragments = 0\n", "diloco.fragments"),
        ("zstd_ratio = 0.9\n", "diloco.zstd_ratio"),
        ("link_budget = \"0 Gbit/s\"\n", "diloco.link_budget"),
    ] {
        let error = JobSpec::from_toml("j.toml", &format!("{base}{line}")).unwrap_err();
        let text = error.to_string();
        assert!(text.contains(path), "{path}: {text}");
    }
}

/// The training precision's own width without blocks is accepted only as the one codec of
/// synchronous data parallelism's every-step exchange (`SyncInput::sync_dp`): a DiLoCo input
/// offering it is refused as before, and fp32 and fp8 baselines plan.
#[test]
fn the_raw_training_width_is_a_codec_only_for_synchronous_data_parallelism() {
    for bits in [32, 8] {
        let mut diloco = input();
        diloco.sync_dp_bits = bits;
        diloco.codecs = vec![Codec {
            bits,
            block_size: 0,
            scale_bits: 0,
            zstd_ratio: 1.0,
        }];
        match plan_sync(&diloco) {
            Err(SyncError::Invalid { field, .. }) => assert!(field.starts_with("codecs[0]")),
            other => panic!("{bits} bits for DiLoCo: {other:?}"),
        }
        let mut dp = input();
        dp.sync_dp_bits = bits;
        let plan = plan_sync(&dp.sync_dp()).expect("the baseline plans");
        assert_eq!((plan.inner_steps, plan.bits()), (1, bits));
    }
}

#[test]
fn a_replan_is_asked_only_beyond_the_factor_either_way() {
    let plan = plan_sync(&input()).unwrap();
    let t = plan.inner_step_seconds;
    assert!(t > 0.0);
    for (measured, factor, asks) in [
        (t, 2.0, false),
        (t * 1.99, 2.0, false),
        (t * 2.01, 2.0, true),
        (t / 1.99, 2.0, false),
        (t / 2.01, 2.0, true),
        (t * 1.2, 1.0, true),
        // Off, or nothing measured.
        (t * 100.0, 0.0, false),
        (t * 100.0, 0.5, false),
        (t * 100.0, f64::NAN, false),
        (0.0, 2.0, false),
        (f64::INFINITY, 2.0, false),
    ] {
        assert_eq!(
            needs_replan(&plan, measured, factor),
            asks,
            "measured {measured} s against {t} s, factor {factor}"
        );
    }
    // A schedule with no usable planned step asks at any measurement.
    let mut unplanned = plan.clone();
    unplanned.inner_step_seconds = 0.0;
    assert!(needs_replan(&unplanned, t, 2.0));
}

#[test]
fn a_replan_at_the_measured_step_moves_tau_keeps_the_fragments_and_records_what_it_replaced() {
    let topology = crate::Topology::from_toml(
        "t.toml",
        include_str!("../../../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    let job = JobSpec::from_toml(
        "j.toml",
        include_str!("../../../../deploy/examples/chars-diloco.job.toml"),
    )
    .unwrap();
    let plan = crate::placement::place(&topology, &job).unwrap();
    let links = configured_links(&topology);
    let params = CostParams::default();
    let placed = plan.sync.clone().unwrap();
    // Placement predicts microseconds per step, so τ hides what it can.
    assert!(placed.overlap_steps > 0, "{placed:?}");
    // The NumPy trainers take 10 ms: the exchange hides behind one step.
    let next = replan_sync(&plan, &job, &links, &params, 0.010, 3).unwrap();
    assert_eq!(next.inner_steps, 250, "the job fixes H");
    assert_eq!(next.overlap_steps, 0);
    assert_eq!(next.fragments, placed.fragments);
    assert_eq!(next.schedule[0].parameters, placed.schedule[0].parameters);
    assert_eq!(next.bits(), placed.bits());
    assert_eq!(next.inner_step_seconds, 0.010);
    assert_eq!(
        next.replanned,
        Some(Replanned {
            after_round: 3,
            previous_inner_step_seconds: placed.inner_step_seconds,
            previous_inner_steps: 250,
            previous_overlap_steps: placed.overlap_steps,
        })
    );
    let reason = next.reason("replan").unwrap();
    assert!(reason.reason.contains("from round 5"), "{reason:?}");
    // The round after the re-plan runs the schedule before.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            field_of(replan_sync(&plan, &job, &links, &params, bad, 3)),
            "inner_step_seconds"
        );
    }
}
