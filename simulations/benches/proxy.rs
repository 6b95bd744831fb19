//! The emulator's proxies on loopback.
//!
//! 1. Throughput: 256 MiB through the TCP proxy on a link with no impairment
//!    (1 Tbit/s, no delay), against a direct connection and a plain relay
//!    (`socat`, skipped with a message if it is not installed); the ratio
//!    proxy/socat is the figure of merit.
//! 2. Release lateness at 1 Gbit/s: 1200-byte datagrams offered at about
//!    1.05 Gbit/s, then at a tenth of that, for 2 s each to a 1 Gbit/s, 1 ms
//!    link through the UDP proxy; lateness p50/p99/max (µs) as the release
//!    thread recorded it. The offered rate achieved is printed: on a loaded
//!    machine the sender or the proxy's ingest may fall short of it.
//!
//! Run with `cargo bench -p longhaul-simulations --bench proxy`. Figures vary
//! with the machine and its load; nothing here asserts on them.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration as StdDuration, Instant};

use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use longhaul_simulations::emulator::{Emulator, LinkSpec};
use longhaul_simulations::link::LinkConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

type Error = Box<dyn std::error::Error>;

const BYTES: usize = 256 << 20;

fn link(bits_per_second: u64, one_way: Duration) -> Result<LinkConfig, Error> {
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(bits_per_second),
        Distance::from_km(0.0).ok_or("bad distance")?,
    );
    config.overhead = one_way;
    config.buffer = Some(ByteSize::from_bytes(256 << 20));
    Ok(config)
}

/// A server that reads to EOF and answers with one byte.
async fn sink() -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 1 << 16];
                while let Ok(len) = stream.read(&mut buffer).await {
                    if len == 0 {
                        break;
                    }
                }
                let _ = stream.write_all(&[1]).await;
            });
        }
    });
    Ok(address)
}

/// Seconds to push `BYTES` to `address` and get the sink's answer.
async fn transfer(address: SocketAddr) -> Result<f64, Error> {
    let stream = TcpStream::connect(address).await?;
    let (mut reader, mut writer) = stream.into_split();
    let chunk = vec![0x5a_u8; 1 << 16];
    let started = Instant::now();
    let mut sent = 0;
    while sent < BYTES {
        writer.write_all(&chunk).await?;
        sent += chunk.len();
    }
    writer.shutdown().await?;
    let mut answer = [0u8; 1];
    reader.read_exact(&mut answer).await?;
    Ok(started.elapsed().as_secs_f64())
}

fn report(name: &str, seconds: f64) -> f64 {
    let rate = BYTES as f64 * 8.0 / seconds;
    println!("  {name:<28} {:>8.2} Gbit/s ({seconds:.2} s)", rate / 1e9);
    rate
}

/// socat relaying a free port to `target`, if socat is installed.
fn socat(target: SocketAddr) -> Option<(Child, SocketAddr)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ok()?
        .port();
    let child = Command::new("socat")
        .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
        .arg(format!("TCP:{target}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some((child, SocketAddr::from(([127, 0, 0, 1], port))))
}

async fn throughput() -> Result<(), Error> {
    println!("TCP throughput, {} MiB, no impairment:", BYTES >> 20);
    let target = sink().await?;
    report("direct", transfer(target).await?);
    let emulator = Emulator::new(
        1,
        vec![LinkSpec::symmetric(
            "a",
            "b",
            link(1_000_000_000_000, Duration::from_nanos(0))?,
        )],
    )?;
    let proxy = emulator
        .tcp_proxy("a", "b", "127.0.0.1:0".parse()?, target)
        .await?;
    let proxied = report("emulator TCP proxy", transfer(proxy.local_addr()).await?);
    match socat(target) {
        Some((mut child, address)) => {
            // Give socat a moment to listen.
            let mut ready = false;
            for _ in 0..50 {
                if TcpStream::connect(address).await.is_ok() {
                    ready = true;
                    break;
                }
                tokio::time::sleep(StdDuration::from_millis(20)).await;
            }
            if ready {
                let relayed = report("socat relay", transfer(address).await?);
                println!("  ratio proxy / socat          {:>8.2}", proxied / relayed);
            } else {
                println!("  socat did not start listening; skipped");
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        None => {
            println!("  socat is not installed (apt-get install socat): relay comparison skipped")
        }
    }
    Ok(())
}

/// Offers `per_ms` 1200-byte datagrams per millisecond for 2 s.
async fn lateness(per_ms: u32) -> Result<(), Error> {
    let rate = 1_000_000_000u64;
    println!(
        "release lateness, 1 Gbit/s link, 1 ms one way, 1200-byte datagrams offered at ~{:.2} Gbit/s for 2 s:",
        f64::from(per_ms) * 1200.0 * 8.0 * 1000.0 / 1e9
    );
    let emulator = Emulator::new(
        1,
        vec![LinkSpec::symmetric(
            "a",
            "b",
            link(rate, Duration::from_millis(1))?,
        )],
    )?;
    let receiver = UdpSocket::bind("127.0.0.1:0").await?;
    let proxy = emulator
        .udp_proxy("a", "b", "127.0.0.1:0".parse()?, receiver.local_addr()?)
        .await?;
    let receiving = tokio::spawn(async move {
        let mut buffer = vec![0u8; 2048];
        let mut received = 0u64;
        while let Ok(Ok(len)) =
            tokio::time::timeout(StdDuration::from_millis(500), receiver.recv(&mut buffer)).await
        {
            received += len as u64;
        }
        received
    });
    let client = UdpSocket::bind("127.0.0.1:0").await?;
    client.connect(proxy.local_addr()).await?;
    let datagram = vec![0u8; 1200];
    let started = Instant::now();
    let mut ticker = tokio::time::interval(StdDuration::from_millis(1));
    let mut offered = 0u64;
    while started.elapsed() < StdDuration::from_secs(2) {
        ticker.tick().await;
        for _ in 0..per_ms {
            if client.send(&datagram).await.is_ok() {
                offered += datagram.len() as u64;
            }
        }
    }
    let offered_seconds = started.elapsed().as_secs_f64();
    let received = receiving.await?;
    let status = emulator.pipe("a", "b")?.status();
    println!(
        "  offered {:.2} Gbit/s; link took {} packets, delivered {:.2} Gbit/s over the offer time; received {} MB",
        offered as f64 * 8.0 / offered_seconds / 1e9,
        status.stats.packets_in,
        status.stats.bytes_delivered as f64 * 8.0 / offered_seconds / 1e9,
        received / 1_000_000,
    );
    println!(
        "  drops: queue {}, host {}; lateness over {} releases: p50 {} µs, p99 {} µs, max {} µs",
        status.stats.drops.queue,
        status.host_drops,
        status.lateness.samples,
        status.lateness.p50_us,
        status.lateness.p99_us,
        status.lateness.max_us
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        throughput().await?;
        // 1.05 Gbit/s = 109 datagrams of 1200 bytes per ms: the link is busy.
        lateness(109).await?;
        // A tenth of that: the timer's precision with an idle-ish link.
        lateness(10).await
    })
}
