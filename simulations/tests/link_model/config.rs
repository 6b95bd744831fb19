use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use longhaul_simulations::link::{
    DeliveryTrace, Jitter, JitterMode, Link, LinkConfig, LossModel, Outage, RateChange,
};
use proptest::prelude::*;

use crate::config;

/// Each broken configuration and the message it must produce.
#[test]
fn validation_errors_name_the_field() {
    let base = || config(1_000_000_000, 100.0);
    type Break = fn(&mut LinkConfig);
    let cases: &[(Break, &str)] = &[
        (
            |c| c.rate = Some(DataRate::from_bits_per_second(0)),
            "`rate` must be a positive data rate, found 0",
        ),
        (
            |c| c.rate = None,
            "set `rate` or `delivery_trace`: a link needs a capacity",
        ),
        (
            |c| {
                c.delivery_trace = Some(DeliveryTrace {
                    opportunities_ms: vec![1],
                })
            },
            "set only one of `rate` and `delivery_trace`, not both",
        ),
        (
            |c| {
                c.rate = None;
                c.delivery_trace = Some(DeliveryTrace {
                    opportunities_ms: vec![],
                });
            },
            "`delivery_trace` must have at least one delivery opportunity",
        ),
        (
            |c| {
                c.rate = None;
                c.delivery_trace = Some(DeliveryTrace {
                    opportunities_ms: vec![1],
                });
                c.rate_schedule = vec![RateChange {
                    at: Duration::from_millis(1),
                    rate: DataRate::from_gbit_per_second(1),
                }];
            },
            "`rate_schedule` changes `rate`; it cannot be combined with `delivery_trace`",
        ),
        (
            |c| c.loss = LossModel::Bernoulli { p: 1.0 },
            "`loss.p` must be a probability in [0, 1), found 1",
        ),
        (
            |c| c.loss = LossModel::Bernoulli { p: -0.1 },
            "`loss.p` must be a probability in [0, 1), found -0.1",
        ),
        (
            |c| c.loss = LossModel::Bernoulli { p: f64::NAN },
            "`loss.p` must be a probability in [0, 1), found NaN",
        ),
        (
            |c| {
                c.loss = LossModel::GilbertElliott {
                    p: 0.1,
                    r: 0.0,
                    loss_in_bad: 1.0,
                    loss_in_good: 0.0,
                }
            },
            "`loss.r` must be a probability in (0, 1], found 0",
        ),
        (
            |c| {
                c.loss = LossModel::GilbertElliott {
                    p: 0.1,
                    r: 0.5,
                    loss_in_bad: 1.5,
                    loss_in_good: 0.0,
                }
            },
            "`loss.1-h` must be a probability in [0, 1], found 1.5",
        ),
        (
            |c| {
                c.loss = LossModel::GilbertElliott {
                    p: 0.1,
                    r: 0.5,
                    loss_in_bad: 1.0,
                    loss_in_good: 1.0,
                }
            },
            "`loss.1-k` must be a probability in [0, 1), found 1",
        ),
        (
            |c| c.loss = LossModel::Trace { drop: vec![] },
            "`loss.drop` must list at least one packet index",
        ),
        (
            |c| c.loss = LossModel::Trace { drop: vec![3, 3] },
            "`loss.drop[1]` = 3 must be greater than the previous index 3: list packet indices in increasing order",
        ),
        (
            |c| c.buffer = Some(ByteSize::from_bytes(0)),
            "`buffer` must be a positive size, found 0",
        ),
        (
            |c| c.ecn_threshold = Some(ByteSize::from_bytes(0)),
            "`ecn_threshold` must be a positive size, found 0",
        ),
        (
            |c| c.duplicate = f64::INFINITY,
            "`duplicate` must be a probability in [0, 1), found inf",
        ),
        (
            |c| {
                c.rate_schedule = vec![
                    RateChange {
                        at: Duration::from_millis(2),
                        rate: DataRate::from_gbit_per_second(1),
                    },
                    RateChange {
                        at: Duration::from_millis(2),
                        rate: DataRate::from_gbit_per_second(2),
                    },
                ]
            },
            "`rate_schedule[1].at` = 2 ms must be later than the previous change at 2 ms",
        ),
        (
            |c| {
                c.rate_schedule = vec![RateChange {
                    at: Duration::from_millis(2),
                    rate: DataRate::from_bits_per_second(0),
                }]
            },
            "`rate_schedule[0].rate` must be a positive data rate, found 0",
        ),
        (
            |c| {
                c.outages = vec![Outage {
                    from: Duration::from_millis(2),
                    until: Duration::from_millis(2),
                }]
            },
            "`outages[0]`: `until` (2 ms) must be after `from` (2 ms)",
        ),
        (
            |c| {
                c.outages = vec![
                    Outage {
                        from: Duration::from_millis(1),
                        until: Duration::from_millis(3),
                    },
                    Outage {
                        from: Duration::from_millis(2),
                        until: Duration::from_millis(4),
                    },
                ]
            },
            "`outages[1].from` = 2 ms must not be before the end of the previous outage (3 ms)",
        ),
        (
            |c| c.distance = Distance::from_km(1e12).unwrap(),
            "`distance` is too large: the one-way delay must stay under a day",
        ),
        (
            |c| {
                c.jitter = Some(Jitter {
                    max: Duration::from_secs(100_000),
                    mode: JitterMode::Fifo,
                })
            },
            "`jitter.max` is too large: the one-way delay must stay under a day",
        ),
    ];
    for (index, (break_it, message)) in cases.iter().enumerate() {
        let mut config = base();
        break_it(&mut config);
        let error = Link::new(config, 1).map(|_| ()).unwrap_err();
        assert_eq!(error.to_string(), *message, "case {index}");
    }
    assert!(Link::new(base(), 1).is_ok());
}

#[test]
fn parses_from_toml_with_units_and_netem_names() {
    let toml = r#"
        distance = "1200 km"
        fibre_delay_per_km = "4900 ns"
        overhead = "50 us"
        rate = "100 Gbit/s"
        per_packet_overhead = "38 B"
        buffer = "64 MiB"
        ecn_threshold = "1 MiB"
        duplicate = 0.001
        rate_schedule = [{ at = "10 s", rate = "40 Gbit/s" }]
        outages = [{ from = "20 s", until = "25 s" }]
        jitter = { max = "100 us", mode = "reorder" }

        [loss]
        model = "gilbert_elliott"
        p = 0.001
        r = 0.3
        "1-h" = 0.4
        "1-k" = 0.0001
    "#;
    let full: LinkConfig = toml::from_str(toml).unwrap();
    assert_eq!(full.propagation_ns(), 5_880_000);
    assert_eq!(full.one_way_ns(), 5_930_000);
    assert_eq!(full.buffer_bytes(), 64 << 20);
    assert_eq!(
        full.loss,
        LossModel::GilbertElliott {
            p: 0.001,
            r: 0.3,
            loss_in_bad: 0.4,
            loss_in_good: 0.0001
        }
    );
    assert_eq!(full.jitter.map(|j| j.mode), Some(JitterMode::Reorder));
    assert!(Link::new(full, 1).is_ok());

    let minimal: LinkConfig = toml::from_str("rate = \"1 Gbit/s\"\ndistance = \"10 km\"").unwrap();
    assert_eq!(minimal, config(1_000_000_000, 10.0));
    let traced: LinkConfig = toml::from_str("delivery_trace = [1, 1, 3]").unwrap();
    assert_eq!(traced.nominal_bits_per_second(), 12_000_000);
    let bernoulli: LinkConfig =
        toml::from_str("rate = \"1 Gbit/s\"\nloss = { model = \"bernoulli\", p = 0.01 }").unwrap();
    assert_eq!(bernoulli.loss, LossModel::Bernoulli { p: 0.01 });

    let typo = toml::from_str::<LinkConfig>("rate = \"1 Gbit/s\"\nbufer = \"1 MiB\"").unwrap_err();
    assert!(typo.to_string().contains("unknown field `bufer`"), "{typo}");
    let wrong_unit = toml::from_str::<LinkConfig>("rate = \"1 GiB\"").unwrap_err();
    assert!(
        wrong_unit.to_string().contains("expected a data rate"),
        "{wrong_unit}"
    );
}

#[test]
fn builds_from_a_topology_wan_link() {
    let wan: longhaul_core::topology::WanLink = toml::from_str(
        r#"
        between = ["a", "b"]
        distance = "800 km"
        overhead = "10 us"
        link_rate = "400 Gbit/s"
        loss = 0.0001
        "#,
    )
    .unwrap();
    let link = Link::new(LinkConfig::from_wan_link(&wan), 1).unwrap();
    assert_eq!(link.one_way_ns(), 4_010_000);
    // The core's figure for the same link: 400 Gbit/s × 8.02 ms / 8.
    assert_eq!(
        link.buffer_bytes() as f64,
        wan.figures().bdp_bytes_per_link.round()
    );
    assert_eq!(link.config().loss, LossModel::Bernoulli { p: 0.0001 });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the numbers, building a link either fails with an error or
    /// gives a link that survives any input without panicking.
    #[test]
    fn nothing_panics(
        rate in prop_oneof![Just(0u64), 1u64..10, any::<u64>()],
        km in prop_oneof![Just(0.0f64), 0.0f64..1e9],
        buffer in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
        p in prop_oneof![Just(f64::NAN), Just(-1.0), Just(1.0), 0.0f64..1.0],
        jitter in any::<u64>(),
        overhead in any::<u64>(),
        sends in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<bool>()), 0..50),
    ) {
        let mut config = LinkConfig::new(DataRate::from_bits_per_second(rate), Distance::from_km(km).unwrap());
        config.buffer = buffer.map(ByteSize::from_bytes);
        config.per_packet_overhead = ByteSize::from_bytes(overhead);
        config.loss = LossModel::Bernoulli { p };
        config.jitter = Some(Jitter { max: Duration::from_nanos(jitter), mode: JitterMode::Fifo });
        config.duplicate = if p.is_finite() { p.abs() % 1.0 } else { 0.0 };
        if let Ok(mut link) = Link::new(config, 3) {
            for (id, (now, bytes, ecn)) in sends.into_iter().enumerate() {
                link.handle_send(now, id as u64, bytes, ecn);
                let _ = link.poll_delivery(now);
                let _ = link.next_wakeup();
            }
            link.handle_send(u64::MAX, 0, u64::MAX, true);
            while link.poll_delivery(u64::MAX).is_some() {}
            let stats = link.stats();
            prop_assert_eq!(stats.packets_delivered + stats.drops.total(), stats.packets_in);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The same for trace-driven links, with timestamps and sizes up to the
    /// extremes.
    #[test]
    fn nothing_panics_on_a_trace(
        mut trace in proptest::collection::vec(prop_oneof![0u64..10, any::<u64>()], 0..20),
        sends in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..50),
    ) {
        trace.sort_unstable();
        let mut config = LinkConfig::new(DataRate::from_bits_per_second(1), Distance::default());
        config.rate = None;
        config.delivery_trace = Some(DeliveryTrace { opportunities_ms: trace });
        config.buffer = Some(ByteSize::from_bytes(u64::MAX));
        if let Ok(mut link) = Link::new(config, 3) {
            for (id, (now, bytes)) in sends.into_iter().enumerate() {
                link.handle_send(now, id as u64, bytes, false);
                let _ = link.poll_delivery(now);
            }
            while link.poll_delivery(u64::MAX).is_some() {}
            let stats = link.stats();
            prop_assert_eq!(stats.packets_delivered + stats.drops.total(), stats.packets_in);
        }
    }
}
