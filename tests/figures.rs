//! Property tests of derived network figures and of the model's invariants.

use longhaul_core::Topology;
use longhaul_core::topology::{Building, DomainGroup, Fabric, FabricKind, Site, WanLink};
use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use proptest::prelude::*;

fn link(km: f64, overhead_ns: u64, links: u32, gbps: u64, loss: f64) -> WanLink {
    WanLink {
        between: ["a".to_string(), "b".to_string()],
        distance: Distance::from_km(km).unwrap(),
        overhead: Duration::from_nanos(overhead_ns),
        parallel_links: links,
        link_rate: DataRate::from_gbit_per_second(gbps),
        loss,
        buffer: None,
    }
}

fn site(id: &str, groups: Vec<(u32, u32, u32)>) -> Site {
    Site {
        id: id.to_string(),
        name: None,
        location: None,
        campus_interconnect: None,
        buildings: vec![Building {
            id: "b1".to_string(),
            fabric: Fabric {
                kind: FabricKind::LeafSpine,
                link_rate: DataRate::from_gbit_per_second(400),
                oversubscription: 1.0,
            },
            domains: groups
                .into_iter()
                .enumerate()
                .map(|(i, (count, nodes, gpus))| DomainGroup {
                    id: format!("g{i}"),
                    count,
                    nodes_per_domain: nodes,
                    gpus_per_node: gpus,
                    gpu: "gb200".to_string(),
                })
                .collect(),
        }],
    }
}

/// Domain groups that respect the GB200 reach of 72 GPUs per domain.
fn groups() -> impl Strategy<Value = Vec<(u32, u32, u32)>> {
    prop::collection::vec((1u32..2000, 1u32..=18, 1u32..=4), 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn rtt_is_twice_propagation_plus_overhead(km in 0.0f64..20_000.0, overhead_ns in 0u64..10_000_000) {
        let figures = link(km, overhead_ns, 1, 400, 0.0).figures();
        let expected = 2.0 * (km * 5e-6 + overhead_ns as f64 * 1e-9);
        prop_assert!((figures.rtt_seconds - expected).abs() <= 1e-15 * expected.max(1.0),
            "rtt {} expected {}", figures.rtt_seconds, expected);
        prop_assert_eq!(figures.rtt_seconds, 2.0 * figures.one_way_seconds);
    }

    #[test]
    fn bdp_is_rate_times_rtt(km in 0.0f64..20_000.0, gbps in 1u64..3200, links in 1u32..64) {
        let figures = link(km, 0, links, gbps, 0.0).figures();
        let expected = gbps as f64 * 1e9 * figures.rtt_seconds / 8.0;
        prop_assert!((figures.bdp_bytes_per_link - expected).abs() <= 1e-9 * expected.max(1.0));
        prop_assert!((figures.bdp_bytes_total - expected * f64::from(links)).abs() <= 1e-9 * expected.max(1.0) * f64::from(links));
        // With no buffer configured, the buffer is one BDP per link.
        prop_assert_eq!(figures.buffer_bytes, figures.bdp_bytes_per_link);
    }

    #[test]
    fn rtt_grows_with_distance(a in 0.0f64..10_000.0, extra in 0.001f64..10_000.0) {
        prop_assert!(link(a + extra, 0, 1, 100, 0.0).rtt_seconds() > link(a, 0, 1, 100, 0.0).rtt_seconds());
    }

    #[test]
    fn a_single_stream_slows_with_loss_and_distance(km in 1.0f64..10_000.0, loss in 1e-6f64..0.1) {
        let near = link(km, 0, 1, 400, loss).figures().single_stream_bits_per_second.unwrap();
        let far = link(km * 2.0, 0, 1, 400, loss).figures().single_stream_bits_per_second.unwrap();
        let lossier = link(km, 0, 1, 400, loss * 4.0).figures().single_stream_bits_per_second.unwrap();
        // Mathis: rate ∝ 1/(RTT·√p).
        prop_assert!((near / far - 2.0).abs() < 1e-9);
        prop_assert!((near / lossier - 2.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_counts_add_up_across_levels(a in groups(), b in groups()) {
        let topology = Topology { name: "t".to_string(), gpu_types: vec![], sites: vec![site("a", a.clone()), site("b", b.clone())], links: vec![] };
        let summary = topology.summary();
        let expected: u64 = a.iter().chain(&b).map(|&(c, n, g)| u64::from(c) * u64::from(n) * u64::from(g)).sum();
        prop_assert_eq!(summary.gpus, expected);
        prop_assert_eq!(summary.gpus, summary.sites.iter().map(|s| s.gpus).sum::<u64>());
        for s in &summary.sites {
            prop_assert_eq!(s.gpus, s.buildings.iter().map(|b| b.gpus).sum::<u64>());
            prop_assert_eq!(s.gpus, s.buildings.iter().flat_map(|b| b.gpus_by_type.values()).sum::<u64>());
        }
    }

    #[test]
    fn valid_topologies_round_trip_through_toml(a in groups(), km in 1.0f64..5000.0, links in 1u32..32, buffer_mib in proptest::option::of(1u64..4096)) {
        let mut wan = link(km, 20_000, links, 400, 0.0);
        wan.buffer = buffer_mib.map(|m| ByteSize::from_bytes(m << 20));
        let topology = Topology { name: "t".to_string(), gpu_types: vec![], sites: vec![site("a", a.clone()), site("b", a)], links: vec![wan] };
        let text = topology.to_toml().unwrap();
        let again = Topology::from_toml("generated.toml", &text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(topology, again);
    }

    #[test]
    fn a_domain_never_exceeds_the_gpu_reach(nodes in 1u32..40, gpus in 1u32..9) {
        let topology = Topology { name: "t".to_string(), gpu_types: vec![], sites: vec![site("a", vec![(1, nodes, gpus)])], links: vec![] };
        let text = topology.to_toml().unwrap();
        let accepted = Topology::from_toml("generated.toml", &text).is_ok();
        prop_assert_eq!(accepted, nodes * gpus <= 72);
    }

    #[test]
    fn quantities_print_and_parse_back_exactly(bits in 0u64..u64::MAX / 4, bytes in 0u64..u64::MAX / 4, ns in 0u64..u64::MAX / 4, km in 0.0f64..1e6) {
        let rate = DataRate::from_bits_per_second(bits);
        prop_assert_eq!(rate.to_string().parse::<DataRate>().unwrap(), rate);
        let size = ByteSize::from_bytes(bytes);
        prop_assert_eq!(size.to_string().parse::<ByteSize>().unwrap(), size);
        let duration = Duration::from_nanos(ns);
        prop_assert_eq!(duration.to_string().parse::<Duration>().unwrap(), duration);
        let distance = Distance::from_km(km).unwrap();
        prop_assert_eq!(distance.to_string().parse::<Distance>().unwrap(), distance);
    }
}

#[test]
fn one_hundred_km_is_about_one_millisecond_of_rtt() {
    // The rule of thumb from the design brief, with no overhead.
    assert_eq!(link(100.0, 0, 1, 800, 0.0).rtt_seconds(), 0.001);
    // 800 Gbit/s at 10 ms RTT holds 1 GB in flight.
    assert_eq!(
        link(1000.0, 0, 1, 800, 0.0).figures().bdp_bytes_per_link,
        1e9
    );
}
