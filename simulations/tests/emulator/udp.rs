//! Delay, rate and loss through the UDP proxy.

use std::time::Instant;

use longhaul_core::units::Duration;
use longhaul_simulations::link::LossModel;
use tokio::net::UdpSocket;

use crate::{bounded, emulator, link, loopback, timing};

/// Sends `count` datagrams of `size` bytes from a client through a proxy
/// (a → b) to a receiver, `burst` datagrams per millisecond, and returns the
/// (arrival time, sequence number) of each datagram received within
/// `settle` after the last send.
async fn through_proxy(
    config: longhaul_simulations::link::LinkConfig,
    count: u32,
    size: usize,
    burst: u32,
    settle: std::time::Duration,
) -> (
    Vec<(Instant, u32)>,
    longhaul_simulations::emulator::PipeStatus,
) {
    let emulator = emulator(config);
    let receiver = UdpSocket::bind(loopback()).await.unwrap();
    let proxy = emulator
        .udp_proxy("a", "b", loopback(), receiver.local_addr().unwrap())
        .await
        .unwrap();
    let client = UdpSocket::bind(loopback()).await.unwrap();
    client.connect(proxy.local_addr()).await.unwrap();

    let receiving = tokio::spawn(async move {
        let mut arrivals = Vec::new();
        let mut buffer = vec![0u8; 65_536];
        while let Ok(Ok(len)) = tokio::time::timeout(settle, receiver.recv(&mut buffer)).await {
            assert_eq!(len, size);
            let sequence = u32::from_be_bytes(buffer[..4].try_into().unwrap());
            arrivals.push((Instant::now(), sequence));
        }
        arrivals
    });
    let mut datagram = vec![0u8; size];
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(1));
    for sequence in 0..count {
        if sequence % burst == 0 {
            ticker.tick().await;
        }
        datagram[..4].copy_from_slice(&sequence.to_be_bytes());
        client.send(&datagram).await.unwrap();
    }
    let arrivals = bounded(60, receiving).await.unwrap();
    let status = emulator.pipe("a", "b").unwrap().status();
    (arrivals, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_delay_is_the_configured_20_ms() {
    let _timing = timing().await;
    let emulator = emulator(link(1_000_000_000, Duration::from_millis(20)));
    let receiver = UdpSocket::bind(loopback()).await.unwrap();
    let proxy = emulator
        .udp_proxy("a", "b", loopback(), receiver.local_addr().unwrap())
        .await
        .unwrap();
    let client = UdpSocket::bind(loopback()).await.unwrap();
    client.connect(proxy.local_addr()).await.unwrap();
    let mut delays = Vec::new();
    let mut buffer = [0u8; 64];
    for i in 0..20u8 {
        let sent = Instant::now();
        client.send(&[i; 32]).await.unwrap();
        let len = bounded(5, receiver.recv(&mut buffer)).await.unwrap();
        delays.push(sent.elapsed());
        assert_eq!(&buffer[..len], &[i; 32]);
    }
    delays.sort();
    let median = delays[delays.len() / 2];
    // Never early; late by at most 15 ms at the median (the release thread
    // wakes within tens of µs on an idle machine; the rest is slack).
    assert!(
        delays[0] >= std::time::Duration::from_millis(20),
        "{delays:?}"
    );
    assert!(median < std::time::Duration::from_millis(35), "{delays:?}");
    let status = emulator.pipe("a", "b").unwrap().status();
    assert_eq!(status.stats.packets_delivered, 20);
    assert_eq!(status.lateness.samples, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_mbit_link_delivers_20_mbit_per_second() {
    let _timing = timing().await;
    // 1800 datagrams of 1400 bytes offered at ~39 Mbit/s (7 per ms): the
    // queue stays busy, so arrivals are paced by the link for ~1 s.
    let (arrivals, status) = through_proxy(
        link(20_000_000, Duration::from_millis(1)),
        1800,
        1400,
        7,
        std::time::Duration::from_millis(500),
    )
    .await;
    assert!(arrivals.len() > 1500, "only {} arrived", arrivals.len());
    assert_eq!(status.stats.drops.total(), 0);
    let first = arrivals.first().unwrap().0;
    let last = arrivals.last().unwrap().0;
    // Bytes after the first arrival, over the time they took.
    let bits = ((arrivals.len() - 1) * 1400 * 8) as f64;
    let rate = bits / (last - first).as_secs_f64();
    assert!(
        (rate - 20e6).abs() <= 0.15 * 20e6,
        "measured {rate:.0} bit/s over {:?}",
        last - first
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bernoulli_loss_of_10_percent_is_observed() {
    let _timing = timing().await;
    let mut config = link(1_000_000_000, Duration::from_millis(1));
    config.loss = LossModel::Bernoulli { p: 0.1 };
    let sent = 2000u32;
    let (arrivals, status) =
        through_proxy(config, sent, 200, 5, std::time::Duration::from_millis(300)).await;
    // Out of the datagrams that reached the proxy (a loaded host may drop a
    // few before), the share that did not arrive.
    let offered = status.stats.packets_in as f64;
    assert!(offered >= 0.95 * f64::from(sent), "{status:?}");
    let observed = 1.0 - arrivals.len() as f64 / offered;
    // 5 standard errors of a binomial proportion, plus 2% for datagrams the
    // host itself might drop on a loaded machine.
    let bound = 5.0 * (0.1f64 * 0.9 / offered).sqrt() + 0.02;
    assert!(
        (observed - 0.1).abs() <= bound,
        "observed loss {observed}, expected 0.1 ± {bound}"
    );
    // The model's own count is exact about the cause.
    let model_loss = status.stats.drops.loss as f64 / offered;
    assert!((model_loss - 0.1).abs() <= bound, "{status:?}");
    assert_eq!(status.stats.drops.queue + status.stats.drops.down, 0);
}
