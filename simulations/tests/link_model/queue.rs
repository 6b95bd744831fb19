use longhaul_core::units::ByteSize;
use longhaul_simulations::link::{DropCause, Fate, Link, MIN_DEFAULT_BUFFER_BYTES};

use crate::{Send, config, drive, train};

fn queue_drop() -> Fate {
    Fate::Dropped {
        cause: DropCause::Queue,
    }
}

#[test]
fn drop_tail_burst_drops_what_does_not_fit() {
    // 10 000-byte buffer at 1 Gbit/s: 1500-byte packets take 12 µs each and
    // hold their buffer space until their last bit is out.
    let mut config = config(1_000_000_000, 0.0);
    config.buffer = Some(ByteSize::from_bytes(10_000));
    let mut link = Link::new(config, 1).unwrap();

    // Ten at t = 0: 6 × 1500 = 9000 fit, the 7th would make 10 500.
    let fates: Vec<Fate> = (0..10)
        .map(|id| link.handle_send(0, id, 1500, false))
        .collect();
    assert!(fates[..6].iter().all(Fate::is_delivered), "{fates:?}");
    assert!(fates[6..].iter().all(|f| *f == queue_drop()), "{fates:?}");
    assert_eq!(link.backlog_bytes(), 9000);

    // A 1000-byte packet still fits (9000 + 1000 = 10 000, not above).
    assert!(link.handle_send(0, 10, 1000, false).is_delivered());
    assert_eq!(link.handle_send(0, 11, 1, false), queue_drop());

    // At 12 µs the first packet's last bit is out: 1500 bytes free up.
    assert!(link.handle_send(12_000, 12, 1500, false).is_delivered());
    assert_eq!(link.handle_send(12_000, 13, 1, false), queue_drop());
    let stats = link.stats();
    assert_eq!(stats.drops.queue, 6);
    assert_eq!(stats.queue_high_water_bytes, 10_000);
    assert_eq!(link.backlog_bytes(), 10_000);
    // The second packet's last bit leaves at 24 µs, not a nanosecond earlier.
    assert_eq!(link.handle_send(23_999, 14, 1, false), queue_drop());
    assert!(link.handle_send(24_000, 15, 1500, false).is_delivered());
}

#[test]
fn framing_takes_line_time_but_no_buffer_space() {
    let mut config = config(1_000_000_000, 0.0);
    config.buffer = Some(ByteSize::from_bytes(3000));
    config.per_packet_overhead = ByteSize::from_bytes(500);
    let mut link = Link::new(config, 1).unwrap();
    let fates: Vec<Fate> = (0..3)
        .map(|id| link.handle_send(0, id, 1500, false))
        .collect();
    assert_eq!(crate::delivered_at(&fates[0]), Some(16_000));
    assert_eq!(crate::delivered_at(&fates[1]), Some(32_000));
    assert_eq!(fates[2], queue_drop());
}

#[test]
fn default_buffer_is_one_bandwidth_delay_product() {
    // 1 Gbit/s over 1000 km: RTT 10 ms, BDP 1.25 MB.
    let link = Link::new(config(1_000_000_000, 1000.0), 1).unwrap();
    assert_eq!(link.buffer_bytes(), 1_250_000);
    // A 1 ms overhead each way adds 2 ms of RTT: 250 kB more.
    let mut with_overhead = config(1_000_000_000, 1000.0);
    with_overhead.overhead = longhaul_core::units::Duration::from_millis(1);
    assert_eq!(
        Link::new(with_overhead, 1).unwrap().buffer_bytes(),
        1_500_000
    );
    // No delay: at least one full-size packet.
    let link = Link::new(config(1_000_000_000, 0.0), 1).unwrap();
    assert_eq!(link.buffer_bytes(), MIN_DEFAULT_BUFFER_BYTES);

    // Offered 2× the rate for 100 ms, the backlog never exceeds one BDP.
    let mut link = Link::new(config(1_000_000_000, 1000.0), 1).unwrap();
    let (fates, _) = drive(&mut link, &train(16_000, 6_000, 1500));
    let stats = link.stats();
    assert!(stats.queue_high_water_bytes <= 1_250_000);
    assert!(stats.queue_high_water_bytes > 1_250_000 - 1500);
    assert!(fates.contains(&queue_drop()));
}

#[test]
fn ecn_threshold_marks_capable_packets_and_drops_the_others() {
    let mut config = config(1_000_000_000, 0.0);
    config.buffer = Some(ByteSize::from_bytes(9000));
    config.ecn_threshold = Some(ByteSize::from_bytes(3000));
    let mut link = Link::new(config, 1).unwrap();
    let sends: Vec<Send> = [true, false, true, false, true, true, true, true, true]
        .into_iter()
        .map(|ecn_capable| Send {
            at_ns: 0,
            bytes: 1500,
            ecn_capable,
        })
        .collect();
    let (fates, deliveries) = drive(&mut link, &sends);
    let summary: Vec<&str> = fates
        .iter()
        .map(|fate| match fate {
            Fate::Delivered {
                marked_ecn: false, ..
            } => "ok",
            Fate::Delivered {
                marked_ecn: true, ..
            } => "marked",
            Fate::Dropped {
                cause: DropCause::Queue,
            } => "dropped",
            Fate::Dropped { .. } => "other",
        })
        .collect();
    // Backlog after each admission: 1500, 3000 (not above K), then 4500 →
    // mark; a non-ECN packet above K is dropped; marks go on until 9000 is
    // full.
    assert_eq!(
        summary,
        [
            "ok", "ok", "marked", "dropped", "marked", "marked", "marked", "dropped", "dropped"
        ]
    );
    assert_eq!(link.stats().ecn_marked, 4);
    assert_eq!(deliveries.iter().filter(|d| d.marked_ecn).count(), 4);
}

#[test]
fn fits_at_is_when_the_backlog_leaves_room() {
    // 10 000-byte buffer at 1 Gbit/s: a 1500-byte packet leaves every 12 µs.
    let mut config = config(1_000_000_000, 0.0);
    config.buffer = Some(ByteSize::from_bytes(10_000));
    let mut link = Link::new(config, 1).unwrap();
    assert_eq!(link.fits_at(0, 1500), Some(0));
    for id in 0..6 {
        assert!(link.handle_send(0, id, 1500, false).is_delivered());
    }
    // 9000 queued: 1000 fit now, 1500 once the first is out (12 µs), 4000
    // once two are (24 µs); more than the buffer never.
    assert_eq!(link.fits_at(0, 1000), Some(0));
    assert_eq!(link.fits_at(0, 1500), Some(12_000));
    assert_eq!(link.fits_at(5_000, 4000), Some(24_000));
    assert_eq!(link.fits_at(50_000, 4000), Some(50_000));
    assert_eq!(link.fits_at(0, 10_001), None);
    // Asking changes nothing: what fits at 12 µs is admitted then.
    assert!(link.handle_send(12_000, 6, 1500, false).is_delivered());
    assert_eq!(link.backlog_bytes(), 9000);
}
