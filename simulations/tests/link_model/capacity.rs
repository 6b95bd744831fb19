use longhaul_core::units::{DataRate, Duration};
use longhaul_simulations::link::{DeliveryTrace, Link, LinkConfig, LinkConfigError, RateChange};

use crate::{config, delivered_at, drive, train};

/// Bits per second delivered in `[from, from + window)`.
fn throughput(deliveries: &[longhaul_simulations::link::Delivery], from: u64, window: u64) -> f64 {
    let bytes: u64 = deliveries
        .iter()
        .filter(|d| (from..from + window).contains(&d.at_ns))
        .map(|d| d.bytes)
        .sum();
    bytes as f64 * 8.0 / (window as f64 * 1e-9)
}

#[test]
fn saturated_link_delivers_its_rate() {
    // 1 Gbit/s over 500 km, offered 1.5 Gbit/s for 200 ms with the default
    // buffer: the link never idles once the first packet is out.
    let mut link = Link::new(config(1_000_000_000, 500.0), 1).unwrap();
    let (_, deliveries) = drive(&mut link, &train(25_000, 8_000, 1500));
    let one_way = link.one_way_ns();
    let measured = throughput(&deliveries, one_way, 150_000_000);
    let error = (measured - 1e9).abs() / 1e9;
    assert!(error < 0.01, "measured {measured} bit/s");
    assert!(
        link.stats().drops.queue > 0,
        "the offered load must exceed the rate"
    );
}

#[test]
fn rate_schedule_changes_serialisation_at_the_switch_time() {
    let mut config = config(1_000_000_000, 0.0);
    config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(1 << 20));
    config.rate_schedule = vec![
        RateChange {
            at: Duration::from_millis(1),
            rate: DataRate::from_bits_per_second(100_000_000),
        },
        RateChange {
            at: Duration::from_millis(2),
            rate: DataRate::from_gbit_per_second(10),
        },
    ];
    let mut link = Link::new(config, 1).unwrap();
    // 1500 bytes: 12 µs at 1 Gbit/s, 120 µs at 100 Mbit/s, 1.2 µs at 10 Gbit/s.
    assert_eq!(
        delivered_at(&link.handle_send(500_000, 0, 1500, false)),
        Some(512_000)
    );
    // First bit 1 ns before the switch: the whole packet at the old rate.
    assert_eq!(
        delivered_at(&link.handle_send(999_999, 1, 1500, false)),
        Some(1_011_999)
    );
    // Queued behind it, it starts after the switch: the new rate.
    assert_eq!(
        delivered_at(&link.handle_send(1_000_000, 2, 1500, false)),
        Some(1_131_999)
    );
    assert_eq!(
        delivered_at(&link.handle_send(2_000_000, 3, 1500, false)),
        Some(2_001_200)
    );

    // A rate set by hand overrides the rest of the schedule.
    assert!(link.set_rate(3_000_000, 1_000_000_000));
    assert_eq!(
        delivered_at(&link.handle_send(3_000_000, 4, 1500, false)),
        Some(3_012_000)
    );
    assert!(!link.set_rate(3_000_000, 0));
}

#[test]
fn a_throughput_change_follows_the_schedule() {
    // Saturated for 40 ms; the rate halves at 20 ms.
    let mut config = config(1_000_000_000, 0.0);
    config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(30_000));
    config.rate_schedule = vec![RateChange {
        at: Duration::from_millis(20),
        rate: DataRate::from_bits_per_second(500_000_000),
    }];
    let mut link = Link::new(config, 1).unwrap();
    let (_, deliveries) = drive(&mut link, &train(5_000, 8_000, 1500));
    let before = throughput(&deliveries, 1_000_000, 18_000_000);
    let after = throughput(&deliveries, 21_000_000, 18_000_000);
    assert!((before - 1e9).abs() / 1e9 < 0.01, "{before}");
    assert!((after - 5e8).abs() / 5e8 < 0.01, "{after}");
}

#[test]
fn mahimahi_trace_sets_the_delivery_times() {
    // Opportunities at 1, 1 and 3 ms, repeating every 3 ms: 3 × 1500 bytes
    // per 3 ms = 12 Mbit/s on average.
    let trace = DeliveryTrace::from_mahimahi("1\n1\n\n3\n").unwrap();
    assert_eq!(trace.period_ms(), 3);
    assert_eq!(trace.mean_bits_per_second(), 12_000_000);
    let mut config = LinkConfig::new(DataRate::from_bits_per_second(1), Default::default());
    config.rate = None;
    config.delivery_trace = Some(trace);
    config.overhead = Duration::from_micros(100);
    config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(1 << 20));
    let mut link = Link::new(config.clone(), 1).unwrap();
    let at: Vec<Option<u64>> = (0..5)
        .map(|id| delivered_at(&link.handle_send(0, id, 1500, false)))
        .collect();
    let ms = 1_000_000;
    assert_eq!(
        at,
        [ms, ms, 3 * ms, 4 * ms, 4 * ms].map(|t| Some(t + 100_000))
    );

    // Saturated for 3 s, the trace delivers its mean rate.
    let mut link = Link::new(config, 1).unwrap();
    let (_, deliveries) = drive(&mut link, &train(4_000, 750_000, 1500));
    let measured = throughput(&deliveries, 100_000, 2_400_000_000);
    assert!((measured - 12e6).abs() / 12e6 < 0.01, "{measured}");
}

#[test]
fn mahimahi_parse_errors_name_the_line() {
    let error = DeliveryTrace::from_mahimahi("1\n2\nthree\n").unwrap_err();
    assert_eq!(
        error.to_string(),
        "mahimahi trace line 3: expected a whole number of milliseconds, found \"three\""
    );
    assert_eq!(
        DeliveryTrace::from_mahimahi("\n"),
        Err(LinkConfigError::EmptyDeliveryTrace)
    );
    assert_eq!(
        DeliveryTrace::from_mahimahi("0\n0\n"),
        Err(LinkConfigError::ZeroTracePeriod)
    );
    assert!(matches!(
        DeliveryTrace::from_mahimahi("5\n4\n"),
        Err(LinkConfigError::UnsortedDeliveryTrace {
            index: 1,
            value: 4,
            previous: 5
        })
    ));
}
