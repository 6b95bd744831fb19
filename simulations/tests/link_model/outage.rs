use longhaul_core::units::Duration;
use longhaul_simulations::link::{self, DropCause, DuplexLink, Link, Outage};

use crate::{config, delivered_at, unbounded};

#[test]
fn packets_sent_while_down_are_dropped() {
    let mut link = Link::new(unbounded(config(1_000_000_000, 100.0)), 1).unwrap();
    // Accepted before the cut: keeps its fate.
    let before = link.handle_send(0, 0, 1500, false);
    link.set_down(1_000);
    assert!(link.is_down());
    assert_eq!(
        link.handle_send(2_000, 1, 1500, false).drop_cause(),
        Some(DropCause::Down)
    );
    link.set_up(3_000);
    assert_eq!(
        delivered_at(&link.handle_send(20_000, 2, 1500, false)),
        Some(20_000 + 12_000 + 500_000)
    );
    let mut ids = Vec::new();
    while let Some(wakeup) = link.next_wakeup() {
        while let Some(delivery) = link.poll_delivery(wakeup) {
            ids.push(delivery.packet_id);
        }
    }
    assert_eq!(delivered_at(&before), Some(512_000));
    assert_eq!(ids, [0, 2]);
    let stats = link.stats();
    assert_eq!((stats.drops.down, stats.packets_delivered), (1, 2));
    // A down link takes no buffer space.
    assert_eq!(stats.queue_high_water_bytes, 1500);
}

#[test]
fn scheduled_outages_cover_from_up_to_until() {
    let mut config = unbounded(config(1_000_000_000, 0.0));
    config.outages = vec![
        Outage {
            from: Duration::from_millis(1),
            until: Duration::from_millis(2),
        },
        Outage {
            from: Duration::from_millis(5),
            until: Duration::from_millis(6),
        },
    ];
    let mut link = Link::new(config, 1).unwrap();
    let down_at: Vec<u64> = [
        0, 999_999, 1_000_000, 1_999_999, 2_000_000, 4_000_000, 5_500_000, 6_000_000,
    ]
    .into_iter()
    .filter(|&t| link.handle_send(t, t, 100, false).drop_cause() == Some(DropCause::Down))
    .collect();
    assert_eq!(down_at, [1_000_000, 1_999_999, 5_500_000]);
}

#[test]
fn partition_cuts_both_directions_until_healed() {
    let mut duplex = DuplexLink::symmetric(config(1_000_000_000, 10.0), 7).unwrap();
    duplex.partition(0);
    for link in [&mut duplex.a_to_b, &mut duplex.b_to_a] {
        assert_eq!(
            link.handle_send(10, 0, 100, false).drop_cause(),
            Some(DropCause::Down)
        );
    }
    duplex.heal(20);
    for link in [&mut duplex.a_to_b, &mut duplex.b_to_a] {
        assert!(link.handle_send(30, 1, 100, false).is_delivered());
    }
    // The free function isolates any set of links, e.g. all of one site's.
    let mut others: Vec<Link> = (0..3)
        .map(|seed| Link::new(config(1_000_000_000, 10.0), seed).unwrap())
        .collect();
    link::partition(others.iter_mut(), 40);
    assert!(others.iter().all(Link::is_down));
    link::heal(others.iter_mut(), 50);
    assert!(!others.iter().any(Link::is_down));
}
