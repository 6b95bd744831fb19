use longhaul_core::units::{ByteSize, Distance, Duration};
use longhaul_simulations::link::{DropCause, Fate, Link};
use proptest::prelude::*;

use crate::{Send, config, delivered_at, drive, unbounded};

#[test]
fn hand_computed_delays_are_exact() {
    // 100 km at 5 µs/km = 500 µs, plus 20 µs overhead = 520 000 ns one way.
    // 1500 bytes + 38 bytes of framing = 12 304 bits = 12 304 ns at 1 Gbit/s.
    let mut config = unbounded(config(1_000_000_000, 100.0));
    config.overhead = Duration::from_micros(20);
    config.per_packet_overhead = ByteSize::from_bytes(38);
    let mut link = Link::new(config, 1).unwrap();
    assert_eq!(link.one_way_ns(), 520_000);

    let cases = [
        // (sent at, bytes, delivered at)
        (0, 1500, 12_304 + 520_000),
        // Queued behind the first: starts at 12 304.
        (0, 1500, 2 * 12_304 + 520_000),
        // Arrives while the second is on the wire (until 24 608): waits 4 608.
        (20_000, 1500, 3 * 12_304 + 520_000),
        // Link idle again: no queueing. 62 bytes + 38 = 800 bits.
        (100_000, 62, 100_000 + 800 + 520_000),
    ];
    for (id, (sent, bytes, expected)) in cases.into_iter().enumerate() {
        let fate = link.handle_send(sent, id as u64, bytes, false);
        assert_eq!(delivered_at(&fate), Some(expected), "packet {id}");
    }
    let mut polled = Vec::new();
    while let Some(wakeup) = link.next_wakeup() {
        while let Some(delivery) = link.poll_delivery(wakeup) {
            polled.push((delivery.packet_id, delivery.at_ns));
        }
    }
    assert_eq!(
        polled,
        vec![(0, 532_304), (1, 544_608), (2, 556_912), (3, 620_800)]
    );
}

#[test]
fn rounding_rules() {
    // Serialisation rounds up: 800 bits at 7 Mbit/s = 114 285.71 ns → 114 286.
    let mut link = Link::new(unbounded(config(7_000_000, 0.0)), 1).unwrap();
    assert_eq!(
        delivered_at(&link.handle_send(0, 0, 100, false)),
        Some(114_286)
    );

    // Propagation rounds to nearest, halves away from zero: 2.5 km × 3 ns = 7.5 → 8.
    let mut config = unbounded(config(1_000_000_000, 2.5));
    config.fibre_delay_per_km = Duration::from_nanos(3);
    let link = Link::new(config, 1).unwrap();
    assert_eq!(link.one_way_ns(), 8);

    // The default 5 µs/km: 1234.5 km → 6 172 500 ns.
    let link = Link::new(unbounded(crate::config(1_000_000_000, 1234.5)), 1).unwrap();
    assert_eq!(link.one_way_ns(), 6_172_500);
    assert_eq!(Distance::from_km(1234.5).map(|d| d.km()), Some(1234.5));
}

/// The reference model: Lindley's recursion for the FIFO server and a scan of
/// every admitted packet for the backlog (a different algorithm from the
/// link's running sum).
fn oracle(sends: &[Send], rate: u64, overhead: u64, buffer: u64, one_way: u64) -> Vec<Fate> {
    let mut admitted: Vec<(u64, u64)> = Vec::new(); // (finish, bytes)
    let mut free_at = 0u64;
    let mut fates = Vec::new();
    for send in sends {
        let backlog: u64 = admitted
            .iter()
            .filter(|(finish, _)| *finish > send.at_ns)
            .map(|(_, bytes)| bytes)
            .sum();
        if backlog + send.bytes > buffer {
            fates.push(Fate::Dropped {
                cause: DropCause::Queue,
            });
            continue;
        }
        let start = send.at_ns.max(free_at);
        let bits = u128::from(send.bytes + overhead) * 8;
        let serialisation = (bits * 1_000_000_000).div_ceil(u128::from(rate)) as u64;
        let finish = start + serialisation;
        free_at = finish;
        admitted.push((finish, send.bytes));
        fates.push(Fate::Delivered {
            at_ns: finish + one_way,
            marked_ecn: false,
            duplicate_at_ns: None,
        });
    }
    fates
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// delivered = sent + queueing + serialisation + propagation, exactly, and
    /// drop-tail drops exactly the packets that do not fit.
    #[test]
    fn delays_and_drops_match_the_oracle(
        gaps in proptest::collection::vec(0u64..40_000, 1..300),
        sizes in proptest::collection::vec(1u64..9_000, 300),
        rate in prop_oneof![Just(1_000_000u64), Just(7_000_000), Just(1_000_000_000), Just(400_000_000_000)],
        overhead in 0u64..100,
        buffer in 1_500u64..60_000,
        km in 0.0f64..5_000.0,
    ) {
        let mut now = 0;
        let sends: Vec<Send> = gaps.iter().zip(&sizes).map(|(gap, &bytes)| {
            now += gap;
            Send { at_ns: now, bytes, ecn_capable: false }
        }).collect();
        let mut config = config(rate, km);
        config.per_packet_overhead = ByteSize::from_bytes(overhead);
        config.buffer = Some(ByteSize::from_bytes(buffer));
        let mut link = Link::new(config, 9).unwrap();
        let one_way = link.one_way_ns();
        let (fates, deliveries) = drive(&mut link, &sends);
        prop_assert_eq!(&fates, &oracle(&sends, rate, overhead, buffer, one_way));

        // Every delivered packet comes out of poll_delivery once, at its time, in order.
        let mut expected: Vec<(u64, u64)> = fates.iter().enumerate()
            .filter_map(|(id, fate)| delivered_at(fate).map(|at| (at, id as u64)))
            .collect();
        expected.sort();
        let polled: Vec<(u64, u64)> = deliveries.iter().map(|d| (d.at_ns, d.packet_id)).collect();
        prop_assert_eq!(polled, expected);
        let stats = link.stats();
        prop_assert_eq!(stats.packets_in, sends.len() as u64);
        prop_assert_eq!(stats.packets_delivered + stats.drops.total(), stats.packets_in);
    }
}

#[test]
fn set_overhead_applies_to_later_packets_only() {
    // 1 Gbit/s, no fibre: 1000 bytes serialise in 8 µs; overhead 1 ms.
    let mut config = unbounded(config(1_000_000_000, 0.0));
    config.overhead = Duration::from_millis(1);
    let mut link = Link::new(config, 7).unwrap();
    let first = link.handle_send(0, 0, 1000, false);
    link.set_overhead(100_000, Duration::from_micros(10))
        .unwrap();
    let second = link.handle_send(100_000, 1, 1000, false);
    assert_eq!(delivered_at(&first), Some(8_000 + 1_000_000));
    assert_eq!(delivered_at(&second), Some(100_000 + 8_000 + 10_000));
    assert_eq!(link.one_way_ns(), 10_000);
    // The later packet overtakes: deliveries come out in arrival order.
    assert_eq!(link.poll_delivery(2_000_000).map(|d| d.packet_id), Some(1));
    assert_eq!(link.poll_delivery(2_000_000).map(|d| d.packet_id), Some(0));
    // A day-long overhead is refused and changes nothing.
    assert!(
        link.set_overhead(2_000_000, Duration::from_secs(90_000))
            .is_err()
    );
    assert_eq!(link.one_way_ns(), 10_000);
}
