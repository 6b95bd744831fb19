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

/// 3 MB of datagrams sent as fast as the sender can, through the proxy at
/// loss 0: far more than the kernel's default socket buffer (~208 KiB), the
/// burst a QUIC window of a long fat link releases. Nothing may be dropped,
/// and every drop a loaded host still makes must be counted: sent −
/// received is exactly the sum of the counters of every cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_the_default_socket_buffer_arrives_whole_and_every_drop_is_counted() {
    use longhaul_simulations::emulator::socket;

    let _timing = timing().await;
    let mut config = link(1_000_000_000, Duration::from_millis(5));
    config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(8 << 20));
    let emulator = emulator(config);
    // The receiver sizes its own buffer and counts its own drops, so that a
    // loss anywhere on the path is either absent or counted.
    let (reader, granted) = socket::bind_sized(loopback(), 64 << 20, "test receiver").unwrap();
    let receiver = UdpSocket::from_std(reader.try_clone().unwrap()).unwrap();
    let proxy = emulator
        .udp_proxy("a", "b", loopback(), receiver.local_addr().unwrap())
        .await
        .unwrap();
    assert!(
        proxy.socket_buffers().receive >= 8 << 20,
        "{:?}",
        proxy.socket_buffers()
    );
    let client = UdpSocket::bind(loopback()).await.unwrap();
    client.connect(proxy.local_addr()).await.unwrap();

    const SIZE: usize = 1200;
    const BURST: u32 = 2500;
    let mut datagram = vec![0u8; SIZE];
    for sequence in 0..BURST {
        datagram[..4].copy_from_slice(&sequence.to_be_bytes());
        client.send(&datagram).await.unwrap();
    }
    // A last datagram after a pause: the kernel reports a socket's drops
    // with the next datagram it queues, so this one brings the burst's.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    datagram[..4].copy_from_slice(&BURST.to_be_bytes());
    client.send(&datagram).await.unwrap();
    let sent = u64::from(BURST) + 1;

    let mut buffers = socket::RecvBuffers::default();
    let mut batch = Vec::new();
    let mut counter = socket::DropCounter::default();
    let mut received = 0u64;
    let mut receiver_drops = 0u64;
    let mut seen_last = false;
    // Until the last datagram is in and 200 ms passed without another, or
    // 20 s in all on a very slow machine.
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    while Instant::now() < deadline {
        let wait = if seen_last { 200 } else { 2_000 };
        let read = tokio::time::timeout(
            std::time::Duration::from_millis(wait),
            socket::receive(&receiver, &reader, &mut buffers, &mut batch, &mut counter),
        )
        .await;
        let Ok(new_drops) = read else {
            if seen_last {
                break;
            }
            continue;
        };
        receiver_drops += new_drops;
        for datagram in batch.drain(..) {
            assert_eq!(datagram.data.len(), SIZE);
            received += 1;
            seen_last |= datagram.data[..4] == BURST.to_be_bytes();
        }
    }

    let status = emulator.pipe("a", "b").unwrap().status();
    let counted =
        status.stats.drops.total() + status.host_drops + status.kernel_drops + receiver_drops;
    assert_eq!(
        sent - received,
        counted,
        "{received} of {sent} arrived; receiver dropped {receiver_drops} (buffers {granted:?}); {status:?}"
    );
    assert_eq!(
        received, sent,
        "receiver dropped {receiver_drops} (buffers {granted:?}); {status:?}"
    );
    assert_eq!(status.stats.packets_in, sent, "{status:?}");
}
