//! Bulk transfer of stock quinn connections through the emulator's UDP proxy.
//!
//! `--connections` client endpoints (one UDP socket each, as separate
//! processes would have) each open one connection to one server endpoint
//! through a UDP proxy of a link of `--rate-mbit` and `--distance-km` (RTT
//! = 2 × 5 µs/km), egress buffer one bandwidth-delay product, Bernoulli
//! `--loss` (a fraction: 0.001 is 0.1 %). Each connection writes one
//! unidirectional stream as fast as quinn lets it for `--seconds`. quinn's
//! configuration is the stock one (windows, congestion controller, initial
//! RTT). `--sockets sized` (the default) binds both endpoints' UDP sockets
//! the way the agent does (`longhaul_site_agent::udp`, 32 MiB buffers);
//! `--sockets stock` keeps quinn's own, with the kernel's default buffers.
//!
//! Per run it prints the goodput (bytes the server read in the window), the
//! loss quinn saw (lost / sent packets over all client connections), the
//! emulator's drops by cause, and the kernel's receive-buffer drops of every
//! socket of this process from `/proc/net/udp` (the `drops` column, the
//! counter `SO_RXQ_OVFL` reports), split into the proxy's sockets, the
//! receiving endpoint and the sending endpoints, with the host-wide
//! `Udp: RcvbufErrors` of `/proc/net/snmp` as a cross-check (other
//! processes count there too), and the emulator's own count of kernel
//! drops at its sockets (`emu.k`, from `SO_RXQ_OVFL`). `--runs N` repeats
//! and prints medians.
//!
//! ```text
//! cargo run --release -p longhaul-site-agent --example quinn_bulk -- \
//!     --connections 8 --loss 0.001 --seconds 5 --runs 3 --seed 1
//! ```
//!
//! Linux only for the kernel counters (elsewhere they print as 0).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration as StdDuration, Instant};

use anyhow::Context as _;
use clap::Parser;
use longhaul_core::units::{DataRate, Distance};
use longhaul_simulations::emulator::{Emulator, LinkSpec};
use longhaul_simulations::link::{LinkConfig, LossModel};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

#[derive(Debug, Parser)]
struct Args {
    /// Parallel connections, each from its own client endpoint.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Bernoulli loss of the emulated link, as a fraction (0.001 = 0.1 %).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Length of the transfer window of one run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Emulator seed (run i uses seed + i).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs; medians are printed after the last.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Link rate in Mbit/s.
    #[arg(long, default_value_t = 1000)]
    rate_mbit: u64,
    /// Fibre distance between the two sites.
    #[arg(long, default_value_t = 2500.0)]
    distance_km: f64,
    /// The endpoints' UDP sockets: `sized` as the agent binds them, or
    /// quinn's `stock` ones.
    #[arg(long, value_enum, default_value_t = Sockets::Sized)]
    sockets: Sockets,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Sockets {
    Sized,
    Stock,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
struct Outcome {
    goodput_mbit: f64,
    quinn_sent: u64,
    quinn_lost: u64,
    queue_drops: u64,
    loss_drops: u64,
    kernel_drops_proxy: u64,
    kernel_drops_receiver: u64,
    kernel_drops_senders: u64,
    rcvbuf_errors: u64,
    emulator_kernel_drops: u64,
}

impl Outcome {
    fn quinn_loss(&self) -> f64 {
        if self.quinn_sent == 0 {
            0.0
        } else {
            self.quinn_lost as f64 / self.quinn_sent as f64
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        (0.0..1.0).contains(&args.loss),
        "--loss must be a fraction in [0, 1), found {}",
        args.loss
    );
    anyhow::ensure!(args.connections > 0, "--connections must be at least 1");
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 60.0,
        "--seconds must be in (0, 60], found {}",
        args.seconds
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rtt_ms = args.distance_km * 2.0 * 5e-3;
    println!(
        "stock quinn, {:?} sockets, {} connection(s), {} Mbit/s, {} km (RTT {rtt_ms:.1} ms), buffer 1 BDP, loss {:.3} %, {} s per run",
        args.sockets,
        args.connections,
        args.rate_mbit,
        args.distance_km,
        args.loss * 100.0,
        args.seconds
    );
    println!(
        "{:>3} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "run",
        "Mbit/s",
        "quinn%",
        "lost",
        "queue",
        "loss",
        "k.proxy",
        "k.recv",
        "k.send",
        "rcvbufE",
        "emu.k"
    );
    let mut outcomes = Vec::new();
    for run in 0..args.runs {
        let outcome = runtime.block_on(one_run(&args, args.seed + run as u64))?;
        print_row(&format!("{run}"), &outcome);
        outcomes.push(outcome);
    }
    if outcomes.len() > 1 {
        print_row("med", &median(&outcomes));
    }
    Ok(())
}

fn print_row(label: &str, o: &Outcome) {
    println!(
        "{label:>3} {:>9.1} {:>9.4} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7}",
        o.goodput_mbit,
        o.quinn_loss() * 100.0,
        o.quinn_lost,
        o.queue_drops,
        o.loss_drops,
        o.kernel_drops_proxy,
        o.kernel_drops_receiver,
        o.kernel_drops_senders,
        o.rcvbuf_errors,
        o.emulator_kernel_drops
    );
}

/// The median of each column on its own.
fn median(outcomes: &[Outcome]) -> Outcome {
    fn mid_f(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }
    fn mid_u(mut values: Vec<u64>) -> u64 {
        values.sort_unstable();
        values[values.len() / 2]
    }
    let loss = mid_f(outcomes.iter().map(Outcome::quinn_loss).collect());
    let sent = mid_u(outcomes.iter().map(|o| o.quinn_sent).collect());
    Outcome {
        goodput_mbit: mid_f(outcomes.iter().map(|o| o.goodput_mbit).collect()),
        quinn_sent: sent,
        // So that the printed ratio is the median ratio.
        quinn_lost: (loss * sent as f64).round() as u64,
        queue_drops: mid_u(outcomes.iter().map(|o| o.queue_drops).collect()),
        loss_drops: mid_u(outcomes.iter().map(|o| o.loss_drops).collect()),
        kernel_drops_proxy: mid_u(outcomes.iter().map(|o| o.kernel_drops_proxy).collect()),
        kernel_drops_receiver: mid_u(outcomes.iter().map(|o| o.kernel_drops_receiver).collect()),
        kernel_drops_senders: mid_u(outcomes.iter().map(|o| o.kernel_drops_senders).collect()),
        rcvbuf_errors: mid_u(outcomes.iter().map(|o| o.rcvbuf_errors).collect()),
        emulator_kernel_drops: mid_u(outcomes.iter().map(|o| o.emulator_kernel_drops).collect()),
    }
}

fn link(args: &Args) -> anyhow::Result<LinkConfig> {
    let distance = Distance::from_km(args.distance_km).context("--distance-km")?;
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(args.rate_mbit * 1_000_000),
        distance,
    );
    // `buffer: None` is one bandwidth-delay product.
    config.buffer = None;
    config.loss = if args.loss > 0.0 {
        LossModel::Bernoulli { p: args.loss }
    } else {
        LossModel::None
    };
    Ok(config)
}

async fn one_run(args: &Args, seed: u64) -> anyhow::Result<Outcome> {
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let emulator = Emulator::new(seed, vec![LinkSpec::symmetric("a", "b", link(args)?)])?;

    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let certificate: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let server_config =
        quinn::ServerConfig::with_single_cert(vec![certificate.clone()], key.into())?;
    let server = endpoint(args.sockets, Some(server_config), loopback)?;
    let server_address = server.local_addr()?;
    let received = Arc::new(AtomicU64::new(0));
    let serving = tokio::spawn(serve(server.clone(), Arc::clone(&received)));

    let proxy = emulator
        .udp_proxy("a", "b", loopback, server_address)
        .await?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate)?;
    let client_config = quinn::ClientConfig::with_root_certificates(Arc::new(roots))?;

    let mut clients = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..args.connections {
        let mut client = endpoint(args.sockets, None, loopback)?;
        client.set_default_client_config(client_config.clone());
        let connection = tokio::time::timeout(
            StdDuration::from_secs(10),
            client.connect(proxy.local_addr(), "localhost")?,
        )
        .await
        .context("handshake timed out")??;
        clients.push(client);
        connections.push(connection);
    }

    let before = kernel_drops()?;
    let rcvbuf_before = rcvbuf_errors();
    let window = StdDuration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let start_bytes = received.load(Ordering::Relaxed);
    let mut writers = Vec::new();
    for connection in &connections {
        let connection = connection.clone();
        writers.push(tokio::spawn(async move {
            let chunk = vec![0x5a_u8; 1 << 16];
            let Ok(mut stream) = connection.open_uni().await else {
                return;
            };
            while start.elapsed() < window {
                if stream.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        }));
    }
    tokio::time::sleep_until((start + window).into()).await;
    let bytes = received.load(Ordering::Relaxed) - start_bytes;
    let elapsed = start.elapsed().as_secs_f64();

    let mut outcome = Outcome {
        goodput_mbit: bytes as f64 * 8.0 / elapsed / 1e6,
        ..Outcome::default()
    };
    for connection in &connections {
        let stats = connection.stats();
        outcome.quinn_sent += stats.path.sent_packets;
        outcome.quinn_lost += stats.path.lost_packets;
    }
    let after = kernel_drops()?;
    outcome.rcvbuf_errors = rcvbuf_errors().saturating_sub(rcvbuf_before);
    let client_ports: Vec<u16> = clients
        .iter()
        .filter_map(|c| c.local_addr().ok().map(|a| a.port()))
        .collect();
    for (inode, (port, drops)) in &after {
        let earlier = before.get(inode).map_or(0, |(_, d)| *d);
        let delta = drops.saturating_sub(earlier);
        if *port == server_address.port() {
            outcome.kernel_drops_receiver += delta;
        } else if client_ports.contains(port) {
            outcome.kernel_drops_senders += delta;
        } else {
            // The proxy's listening socket and its upstream sessions.
            outcome.kernel_drops_proxy += delta;
        }
    }
    for status in emulator.statuses() {
        outcome.queue_drops += status.stats.drops.queue;
        outcome.loss_drops += status.stats.drops.loss;
        outcome.emulator_kernel_drops += status.kernel_drops;
    }

    for writer in writers {
        writer.abort();
    }
    for connection in &connections {
        connection.close(0u32.into(), b"done");
    }
    server.close(0u32.into(), b"done");
    serving.abort();
    drop(proxy);
    Ok(outcome)
}

fn endpoint(
    sockets: Sockets,
    server_config: Option<quinn::ServerConfig>,
    addr: SocketAddr,
) -> anyhow::Result<quinn::Endpoint> {
    Ok(match (sockets, server_config) {
        (Sockets::Stock, Some(config)) => quinn::Endpoint::server(config, addr)?,
        (Sockets::Stock, None) => quinn::Endpoint::client(addr)?,
        (Sockets::Sized, config) => {
            longhaul_site_agent::udp::quic_endpoint(
                addr,
                config,
                longhaul_site_agent::probe::DEFAULT_SOCKET_BUFFER_BYTES,
                "bench endpoint",
            )?
            .0
        }
    })
}

/// Reads every unidirectional stream of every connection, counting bytes.
async fn serve(server: quinn::Endpoint, received: Arc<AtomicU64>) {
    while let Some(incoming) = server.accept().await {
        let received = Arc::clone(&received);
        tokio::spawn(async move {
            let Ok(connection) = incoming.await else {
                return;
            };
            while let Ok(mut stream) = connection.accept_uni().await {
                let received = Arc::clone(&received);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 1 << 16];
                    while let Ok(Some(len)) = stream.read(&mut buffer).await {
                        received.fetch_add(len as u64, Ordering::Relaxed);
                    }
                });
            }
        });
    }
}

/// Socket inodes this process holds.
fn own_socket_inodes() -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.ok()?.path()).ok()?;
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// inode → (local port, drops) for this process's UDP sockets, from
/// `/proc/net/udp` and `/proc/net/udp6`.
fn kernel_drops() -> anyhow::Result<HashMap<u64, (u16, u64)>> {
    let inodes = own_socket_inodes();
    let mut drops = HashMap::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            let (Some(local), Some(inode), Some(count)) =
                (fields.get(1), fields.get(9), fields.get(12))
            else {
                continue;
            };
            let Ok(inode) = inode.parse::<u64>() else {
                continue;
            };
            if !inodes.contains(&inode) {
                continue;
            }
            let port = local
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
                .unwrap_or(0);
            drops.insert(inode, (port, count.parse().unwrap_or(0)));
        }
    }
    Ok(drops)
}

/// The host's `Udp: RcvbufErrors` (0 where there is no `/proc/net/snmp`).
fn rcvbuf_errors() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/net/snmp") else {
        return 0;
    };
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "RcvbufErrors")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0)
}
