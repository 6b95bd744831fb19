//! Probes through the emulator's UDP proxy: what a probe measures against
//! what the link was configured with.

use std::time::Duration;

use longhaul_core::units::{ByteSize, DataRate, Distance, Duration as LinkDuration};
use longhaul_simulations::emulator::{Emulator, LinkSpec, UdpProxy};
use longhaul_simulations::link::{LinkConfig, LossModel};
use longhaul_site_agent::probe::{
    ProbeOptions, ProbeResult, ProbeServer, ProbeServerOptions, probe,
};

use crate::{Pki, bounded, loopback, server, timing};

/// A link of `bits_per_second` with a fixed one-way delay (no fibre) and an
/// egress buffer of `buffer` bytes.
fn link(bits_per_second: u64, one_way_ms: u64, buffer: u64) -> LinkConfig {
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(bits_per_second),
        Distance::from_km(0.0).unwrap(),
    );
    config.overhead = LinkDuration::from_millis(one_way_ms);
    config.buffer = Some(ByteSize::from_bytes(buffer));
    config
}

/// Probes site b's server from site a through an emulated link, the same
/// configuration both ways.
async fn probe_through(
    config: LinkConfig,
    emulator_seed: u64,
    options: ProbeOptions,
) -> (ProbeResult, Emulator) {
    println!("emulator seed {emulator_seed}, probe seed {}", options.seed);
    let pki = Pki::new("test CA");
    let server_b: ProbeServer = server(&pki.agent("b"), ProbeServerOptions::default()).await;
    let emulator =
        Emulator::new(emulator_seed, vec![LinkSpec::symmetric("a", "b", config)]).unwrap();
    let proxy: UdpProxy = emulator
        .udp_proxy("a", "b", loopback(), server_b.local_addr())
        .await
        .unwrap();
    let result = bounded(
        90,
        probe(proxy.local_addr(), "b", &pki.agent("a"), &options),
    )
    .await
    .unwrap();
    println!("{result:?}");
    (result, emulator)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtt_through_a_20_ms_link_is_at_least_40_ms() {
    let _timing = timing().await;
    let options = ProbeOptions {
        pings: 20,
        loss_datagrams: 200,
        throughput_duration: Duration::from_millis(500),
        throughput_streams: 4,
        timeout: Duration::from_secs(60),
        seed: 21,
        ..ProbeOptions::default()
    };
    let (result, _emulator) = probe_through(link(1_000_000_000, 20, 64 << 20), 20, options).await;
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "RTT through 2 × 20 ms: min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms",
        ms(result.rtt_min_ns),
        ms(result.rtt_p50_ns),
        ms(result.rtt_p99_ns)
    );
    // Never below the emulated round trip; at most 25 ms above it at the
    // median (the proxy's release thread and a loaded debug build add
    // latency; an idle machine adds well under 1 ms).
    assert!(result.rtt_min_ns >= 40_000_000, "{result:?}");
    assert!(result.rtt_p50_ns <= 65_000_000, "{result:?}");
    assert!(result.samples >= 19, "{result:?}");
    assert_eq!(result.received, result.sent, "{result:?}");
    assert!(result.throughput_bps > 0.0, "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_percent_loss_is_measured_within_five_standard_errors() {
    let _timing = timing().await;
    let p = 0.05;
    let mut config = link(1_000_000_000, 5, 64 << 20);
    config.loss = LossModel::Bernoulli { p };
    // 2000 datagrams at 1000/s: small enough that QUIC's congestion
    // control, shrunk by the loss, does not pace them.
    let options = ProbeOptions {
        pings: 20,
        loss_datagrams: 2000,
        loss_rate_pps: 1000,
        throughput_duration: Duration::ZERO,
        timeout: Duration::from_secs(60),
        seed: 55,
        ..ProbeOptions::default()
    };
    let (result, emulator) = probe_through(config, 5, options).await;
    let n = f64::from(result.sent);
    assert_eq!(result.sent, 2000);
    // 5 standard errors of a binomial proportion, plus 1% for datagrams a
    // loaded host might drop itself.
    let bound = 5.0 * (p * (1.0 - p) / n).sqrt() + 0.01;
    println!(
        "loss through a 5% Bernoulli link: {:.4} ({} of {} arrived), expected {p} ± {bound:.4}",
        result.loss_rate, result.received, result.sent
    );
    assert!((result.loss_rate - p).abs() <= bound, "{result:?}");
    let forward = emulator.pipe("a", "b").unwrap().status();
    println!(
        "link a->b: {} packets in, {} lost by the model ({:.4})",
        forward.stats.packets_in,
        forward.stats.drops.loss,
        forward.stats.drops.loss as f64 / forward.stats.packets_in as f64
    );
    assert!(forward.stats.drops.loss > 0, "{forward:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_through_a_20_mbit_link_is_close_to_the_rate() {
    let _timing = timing().await;
    let rate = 20_000_000.0;
    // 10 ms each way; a 256 KiB buffer (about 5 bandwidth-delay products)
    // lets CUBIC keep the link busy without a minute-long queue.
    let config = link(rate as u64, 10, 256 << 10);
    let options = ProbeOptions {
        pings: 10,
        loss_datagrams: 100,
        throughput_duration: Duration::from_secs(2),
        throughput_streams: 4,
        timeout: Duration::from_secs(60),
        seed: 77,
        ..ProbeOptions::default()
    };
    let (result, _emulator) = probe_through(config, 9, options).await;
    println!(
        "throughput through a 20 Mbit/s link: {:.2} Mbit/s ({} bytes in {:.3} s)",
        result.throughput_bps / 1e6,
        result.bytes,
        result.duration_ns as f64 / 1e9
    );
    // Stream payload cannot beat the line rate (QUIC and UDP headers take
    // a few percent); slow start, loss recovery and a loaded debug build
    // may waste up to half of it.
    assert!(result.throughput_bps <= 1.02 * rate, "{result:?}");
    assert!(result.throughput_bps >= 0.5 * rate, "{result:?}");
}
