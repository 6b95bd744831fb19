//! Delay and integrity through the TCP proxy.

use std::time::Instant;

use longhaul_core::units::Duration;
use longhaul_simulations::link::{Jitter, JitterMode, LossModel};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{bounded, checksum, emulator, link, loopback, pattern, tcp_echo, timing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_takes_twice_the_one_way_delay() {
    let _timing = timing().await;
    let emulator = emulator(link(1_000_000_000, Duration::from_millis(20)));
    let proxy = emulator
        .tcp_proxy("a", "b", loopback(), tcp_echo().await)
        .await
        .unwrap();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut round_trips = Vec::new();
    let mut response = [0u8; 100];
    for i in 0..5u8 {
        let sent = Instant::now();
        stream.write_all(&[i; 100]).await.unwrap();
        bounded(5, stream.read_exact(&mut response)).await.unwrap();
        round_trips.push(sent.elapsed());
        assert_eq!(response, [i; 100]);
    }
    round_trips.sort();
    // 20 ms each way; at most 30 ms of slack at the median.
    assert!(
        round_trips[0] >= std::time::Duration::from_millis(40),
        "{round_trips:?}"
    );
    assert!(
        round_trips[2] < std::time::Duration::from_millis(70),
        "{round_trips:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_arrive_intact_and_in_order_through_loss_reordering_and_duplicates() {
    // 5% loss, reordering jitter up to 2 ms and 2% duplicates on a 200 Mbit/s,
    // 1 ms link: segments are retransmitted, reordered and deduplicated.
    let mut config = link(200_000_000, Duration::from_millis(1));
    config.loss = LossModel::Bernoulli { p: 0.05 };
    config.jitter = Some(Jitter {
        max: Duration::from_millis(2),
        mode: JitterMode::Reorder,
    });
    config.duplicate = 0.02;
    let emulator = emulator(config);
    let proxy = emulator
        .tcp_proxy("a", "b", loopback(), tcp_echo().await)
        .await
        .unwrap();
    let data = pattern(2 << 20, 11);
    let stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let sending = data.clone();
    let writing = tokio::spawn(async move {
        writer.write_all(&sending).await.unwrap();
        writer.shutdown().await.unwrap();
    });
    let mut echoed = Vec::with_capacity(data.len());
    bounded(60, reader.read_to_end(&mut echoed)).await.unwrap();
    writing.await.unwrap();
    assert_eq!(echoed.len(), data.len());
    assert_eq!(checksum(&echoed), checksum(&data));

    let forward = emulator.pipe("a", "b").unwrap().status();
    assert!(forward.stats.drops.loss > 0, "{forward:?}");
    assert!(
        forward.retransmissions >= forward.stats.drops.loss,
        "{forward:?}"
    );
    assert!(forward.stats.duplicates_delivered > 0, "{forward:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_stalls_a_stream_and_healing_resumes_it_without_loss() {
    let emulator = emulator(link(1_000_000_000, Duration::from_millis(1)));
    let proxy = emulator
        .tcp_proxy("a", "b", loopback(), tcp_echo().await)
        .await
        .unwrap();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let mut buffer = [0u8; 1000];
    stream.write_all(&[1; 1000]).await.unwrap();
    bounded(5, stream.read_exact(&mut buffer)).await.unwrap();

    emulator.set_down("a", Some("b"), true).unwrap();
    stream.write_all(&[2; 1000]).await.unwrap();
    let stalled = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        stream.read(&mut buffer),
    )
    .await;
    assert!(stalled.is_err(), "data crossed a cut link");
    assert!(emulator.pipe("a", "b").unwrap().status().stats.drops.down > 0);

    emulator.set_down("a", Some("b"), false).unwrap();
    bounded(5, stream.read_exact(&mut buffer)).await.unwrap();
    assert_eq!(buffer, [2; 1000]);
}

/// Regression (issue 16): with a 15 kB buffer, 5 ms each way, the relay's
/// window (then rate × RTT + buffer, at least 256 KiB) and its unpaced
/// bursts overflowed the queue: 94 % of segments dropped, one stream at
/// 1.4 % of the link rate. Now the window fits what the link holds and
/// segments wait for room in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shallow_buffer_does_not_collapse_a_relayed_stream() {
    let _timing = timing().await;
    let mut config = link(20_000_000, Duration::from_millis(5));
    config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(15_000));
    let emulator = emulator(config);
    let (sink, received) = {
        let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
        let address = listener.local_addr().unwrap();
        let received = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut bytes = Vec::new();
            stream.read_to_end(&mut bytes).await.unwrap();
            bytes
        });
        (address, received)
    };
    let proxy = emulator
        .tcp_proxy("a", "b", loopback(), sink)
        .await
        .unwrap();
    let data = pattern(1 << 20, 16);
    let started = Instant::now();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    stream.write_all(&data).await.unwrap();
    stream.shutdown().await.unwrap();
    let bytes = bounded(60, received).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(checksum(&bytes), checksum(&data));
    let status = emulator.pipe("a", "b").unwrap().status();
    println!(
        "1 MiB over 20 Mbit/s with a 15 kB buffer: {elapsed:?}, {} segments in, {} queue drops, \
         {} re-sent, queue max {} B",
        status.stats.packets_in,
        status.stats.drops.queue,
        status.retransmissions,
        status.stats.queue_high_water_bytes
    );
    // 0.42 s at the link rate; the collapse took about 30 s.
    assert!(elapsed < std::time::Duration::from_secs(8), "{elapsed:?}");
    assert!(
        status.stats.drops.queue * 20 < status.stats.packets_in,
        "{} of {} segments dropped by the queue",
        status.stats.drops.queue,
        status.stats.packets_in
    );
}
