use longhaul_core::units::Duration;
use longhaul_simulations::link::{Fate, Jitter, JitterMode, Link, LinkConfig};

use crate::{assert_within, config, drive, train, unbounded};

/// 10 Gbit/s, 100 km; packets every 10 µs with up to 1 ms of jitter, so
/// without FIFO order they would overtake each other often.
fn jittery(mode: JitterMode) -> LinkConfig {
    let mut config = unbounded(config(10_000_000_000, 100.0));
    config.jitter = Some(Jitter {
        max: Duration::from_millis(1),
        mode,
    });
    config
}

/// Delivery time without jitter of packet `i` of `train(_, 10_000, 1500)`.
fn base_arrival(i: u64) -> u64 {
    i * 10_000 + 1_200 + 500_000
}

#[test]
fn fifo_jitter_never_reorders() {
    let mut link = Link::new(jittery(JitterMode::Fifo), 3).unwrap();
    let (fates, deliveries) = drive(&mut link, &train(10_000, 10_000, 1500));
    let ids: Vec<u64> = deliveries.iter().map(|d| d.packet_id).collect();
    assert_eq!(ids, (0..10_000).collect::<Vec<_>>());
    assert!(deliveries.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
    let mut delayed = 0;
    for (i, fate) in fates.iter().enumerate() {
        let at = crate::delivered_at(fate).unwrap();
        let base = base_arrival(i as u64);
        assert!(
            (base..=base + 1_000_000).contains(&at),
            "packet {i} at {at}"
        );
        delayed += usize::from(at > base);
    }
    assert!(
        delayed > 9_000,
        "jitter was applied to only {delayed} packets"
    );
}

#[test]
fn reorder_jitter_reorders_within_its_bound() {
    let mut config = jittery(JitterMode::Reorder);
    config.duplicate = 0.1;
    let mut link = Link::new(config, 3).unwrap();
    let (fates, deliveries) = drive(&mut link, &train(10_000, 10_000, 1500));
    let overtaken = deliveries
        .windows(2)
        .filter(|w| w[1].packet_id < w[0].packet_id)
        .count();
    assert!(overtaken > 1_000, "only {overtaken} inversions");
    // Each packet (and copy) within its jitter bound; deliveries come out in
    // time order, ties in the order they were scheduled (a packet, then its
    // copy, then the next packet).
    let mut expected = Vec::new();
    for (i, fate) in fates.iter().enumerate() {
        let Fate::Delivered {
            at_ns,
            duplicate_at_ns,
            ..
        } = *fate
        else {
            panic!("packet {i} dropped");
        };
        let base = base_arrival(i as u64);
        for at in std::iter::once(at_ns).chain(duplicate_at_ns) {
            assert!(
                (base..=base + 1_000_000).contains(&at),
                "packet {i} at {at}"
            );
        }
        expected.push((at_ns, i as u64, false));
        expected.extend(duplicate_at_ns.map(|at| (at, i as u64, true)));
    }
    expected.sort();
    let polled: Vec<(u64, u64, bool)> = deliveries
        .iter()
        .map(|d| (d.at_ns, d.packet_id, d.duplicate))
        .collect();
    assert_eq!(polled, expected);
}

#[test]
fn duplication_rate_is_within_five_sigma() {
    // Binomial: standard error sqrt(d(1-d)/n) = 0.000689 for d = 0.05, n = 100 000.
    let (d, n) = (0.05, 100_000u64);
    let mut config = unbounded(config(10_000_000_000, 10.0));
    config.duplicate = d;
    let mut link = Link::new(config, 11).unwrap();
    let (fates, deliveries) = drive(&mut link, &train(n, 2_000, 1500));
    let duplicated: Vec<u64> = fates
        .iter()
        .enumerate()
        .filter_map(|(id, fate)| match fate {
            Fate::Delivered {
                duplicate_at_ns: Some(_),
                ..
            } => Some(id as u64),
            _ => None,
        })
        .collect();
    let copies: Vec<u64> = deliveries
        .iter()
        .filter(|d| d.duplicate)
        .map(|d| d.packet_id)
        .collect();
    assert_eq!(copies, duplicated);
    assert_eq!(link.stats().duplicates_delivered, copies.len() as u64);
    assert_eq!(link.stats().packets_delivered, n);
    let standard_error = (d * (1.0 - d) / n as f64).sqrt();
    assert_within(
        copies.len() as f64 / n as f64,
        d,
        standard_error,
        5.0,
        "duplication",
    );
}

#[test]
fn without_jitter_a_duplicate_arrives_with_its_original() {
    let mut config = unbounded(config(1_000_000_000, 0.0));
    config.duplicate = 0.999_999;
    let mut link = Link::new(config, 1).unwrap();
    let (fates, deliveries) = drive(&mut link, &train(3, 0, 1500));
    assert_eq!(
        fates[0],
        Fate::Delivered {
            at_ns: 12_000,
            marked_ecn: false,
            duplicate_at_ns: Some(12_000)
        }
    );
    let order: Vec<(u64, bool)> = deliveries
        .iter()
        .map(|d| (d.packet_id, d.duplicate))
        .collect();
    assert_eq!(
        order,
        [
            (0, false),
            (0, true),
            (1, false),
            (1, true),
            (2, false),
            (2, true)
        ]
    );
}
