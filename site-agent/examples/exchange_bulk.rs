//! The exchange's connection pool through the emulator's UDP proxy, beside
//! one stock quinn connection on the same emulated link, in one run.
//!
//! Two sites, `a` and `b`, exchange one fragment (reduce-scatter and
//! all-gather, M = 2) of `--megabytes` of encoded data each way through
//! a link of `--rate-mbit` and `--rtt-ms` (egress buffer one
//! bandwidth-delay product, Bernoulli loss), for each loss of `--losses`.
//! Then one stock quinn connection (quinn's default transport and
//! sockets, one unidirectional stream) writes for `--seconds` through a
//! fresh emulator with the same link. Printed per loss: each site's
//! goodput (data bytes received from the peer × 8 / the exchange's time,
//! handshakes and slow start included), the stock connection's goodput,
//! Mathis's single-stream bound MSS/RTT × 1.22/√p (MSS 1460 B), the
//! pool's re-sent bytes and lost connections, and what the emulator did
//! (drops at its queue, by its loss model, and by the kernel at its
//! sockets, the last being the emulator's own ceiling, not the link's).
//! For the kernel's drops at every socket, see `quinn_bulk`.
//!
//! With `--competing` the stock connection runs instead *beside* the
//! pool, through the same emulated link and its one queue, from before
//! the exchange starts until it ends: its goodput is then its share of
//! the link against the pool (a→b, the direction they both load), which
//! says whether the pool's controller yields to other traffic.
//!
//! ```text
//! cargo run --release -p longhaul-site-agent --example exchange_bulk -- \
//!     --connections 8 --losses 0,0.001,0.01 --megabytes 128 --seed 1 [--congestion dedicated] [--competing]
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use longhaul_codec::EncoderConfig;
use longhaul_core::rng::SeedRng;
use longhaul_core::units::{DataRate, Distance};
use longhaul_exchange::{CollectivePlan, Contributor, LinkCodecs};
use longhaul_simulations::emulator::{Emulator, LinkSpec};
use longhaul_simulations::link::{LinkConfig, LossModel};
use longhaul_site_agent::exchange::{
    Congestion, ExchangeNode, ExchangeOptions, ExchangeOutcome, FragmentRequest,
};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

#[allow(
    clippy::unwrap_used,
    dead_code,
    reason = "the tests' CA; a failed certificate ends the bench"
)]
#[path = "../tests/support/pki.rs"]
mod pki;

#[derive(Debug, Parser)]
struct Args {
    /// Connections per peer of the pool.
    #[arg(long, default_value_t = 8)]
    connections: u32,
    /// Bernoulli losses to run, fractions (0.001 = 0.1 %).
    #[arg(long, value_delimiter = ',', default_value = "0,0.001,0.01")]
    losses: Vec<f64>,
    /// Encoded megabytes each way (bf16: 2 bytes per element).
    #[arg(long, default_value_t = 128)]
    megabytes: u64,
    /// The stock connection's transfer window.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1000)]
    rate_mbit: u64,
    #[arg(long, default_value_t = 50.0)]
    rtt_ms: f64,
    /// Emulator and data seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bound on one exchange.
    #[arg(long, default_value_t = 300)]
    deadline_seconds: u64,
    /// The pool's congestion controller: `cubic` (quinn's), `dedicated`
    /// (a fixed share of 1.25 × BDP per connection, for a link the job
    /// owns; `longhaul_site_agent::congestion`), `new-reno` (quinn's) or
    /// `bbr` (quinn's experimental BBR).
    #[arg(long, default_value = "cubic", value_parser = ["cubic", "dedicated", "new-reno", "bbr"])]
    congestion: String,
    /// Run the stock connection through the pool's link at the same time
    /// (for as long as the exchange takes) rather than after it on a
    /// fresh one (for `--seconds`).
    #[arg(long)]
    competing: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.losses.iter().all(|p| (0.0..0.5).contains(p)),
        "--losses must be fractions in [0, 0.5)"
    );
    anyhow::ensure!(
        (1..=4096).contains(&args.megabytes),
        "--megabytes must be 1..=4096"
    );
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 120.0,
        "--seconds must be in (0, 120]"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // bf16: every element is 2 bytes each way (half contributed, half
    // averaged back).
    let elements = args.megabytes * 1_000_000 / 2;
    let rtt = Duration::from_secs_f64(args.rtt_ms / 1000.0);
    println!(
        "seed {}: {} Mbit/s, RTT {} ms, buffer 1 BDP; pool of {} connections ({}), {} MB each way ({elements} bf16 elements), stock quinn {}",
        args.seed,
        args.rate_mbit,
        args.rtt_ms,
        args.connections,
        args.congestion,
        args.megabytes,
        if args.competing {
            "a->b beside the pool, on its link, while it exchanges".to_string()
        } else {
            format!("for {} s after it, on a fresh link", args.seconds)
        }
    );
    println!(
        "{:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>6} {:>8} {:>8} {:>8}",
        "loss%",
        "pool a",
        "pool b",
        "stock",
        "Mathis",
        "time s",
        "resent",
        "lost",
        "e.queue",
        "e.loss",
        "e.kernel"
    );
    for &loss in &args.losses {
        let row = runtime.block_on(one_loss(&args, elements, rtt, loss))?;
        let mathis = if loss > 0.0 {
            format!(
                "{:.1}",
                1460.0 * 8.0 / rtt.as_secs_f64() * 1.22 / loss.sqrt() / 1e6
            )
        } else {
            "-".to_string()
        };
        println!(
            "{:>7.3} {:>10.1} {:>10.1} {:>10.1} {:>10} {:>8.2} {:>9} {:>6} {:>8} {:>8} {:>8}",
            loss * 100.0,
            row.pool_mbit[0],
            row.pool_mbit[1],
            row.stock_mbit,
            mathis,
            row.seconds,
            row.resent_bytes,
            row.connections_lost,
            row.queue_drops,
            row.loss_drops,
            row.kernel_drops
        );
    }
    println!(
        "(Mbit/s of data received; Mathis with MSS 1460 B; e.* the emulator's drops in the pool's run{})",
        if args.competing {
            ", the stock connection's beside it included"
        } else {
            ""
        }
    );
    Ok(())
}

#[derive(Debug, Default)]
struct Row {
    pool_mbit: [f64; 2],
    stock_mbit: f64,
    seconds: f64,
    resent_bytes: u64,
    connections_lost: u64,
    queue_drops: u64,
    loss_drops: u64,
    kernel_drops: u64,
}

fn link(args: &Args, rtt: Duration, loss: f64) -> anyhow::Result<LinkConfig> {
    // RTT = 2 × 5 µs per km.
    let km = rtt.as_secs_f64() / 2.0 / 5e-6;
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(args.rate_mbit * 1_000_000),
        Distance::from_km(km).context("distance")?,
    );
    config.buffer = None;
    config.loss = if loss > 0.0 {
        LossModel::Bernoulli { p: loss }
    } else {
        LossModel::None
    };
    Ok(config)
}

async fn one_loss(args: &Args, elements: u64, rtt: Duration, loss: f64) -> anyhow::Result<Row> {
    let mut row = Row::default();
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let emulator = Emulator::new(
        args.seed,
        vec![LinkSpec::symmetric("a", "b", link(args, rtt, loss)?)],
    )?;
    let ca = pki::Pki::new("bench CA");
    let options = ExchangeOptions {
        connections_per_peer: args.connections,
        link_rate_bits_per_second: args.rate_mbit * 1_000_000,
        link_rtt: rtt,
        peer_timeout: Duration::from_secs(60),
        congestion: match args.congestion.as_str() {
            "dedicated" => Congestion::Dedicated,
            "new-reno" => Congestion::NewReno,
            "bbr" => Congestion::Bbr,
            _ => Congestion::Cubic,
        },
        ..ExchangeOptions::default()
    };
    let a = Arc::new(ExchangeNode::bind(
        loopback,
        &ca.agent("a"),
        options.clone(),
    )?);
    let b = Arc::new(ExchangeNode::bind(loopback, &ca.agent("b"), options)?);
    let to_b = emulator
        .udp_proxy("a", "b", loopback, b.local_addr()?)
        .await?;
    let to_a = emulator
        .udp_proxy("b", "a", loopback, a.local_addr()?)
        .await?;
    let peers_of_a: BTreeMap<String, SocketAddr> = [
        ("a".to_string(), a.local_addr()?),
        ("b".to_string(), to_b.local_addr()),
    ]
    .into();
    let peers_of_b: BTreeMap<String, SocketAddr> = [
        ("a".to_string(), to_a.local_addr()),
        ("b".to_string(), b.local_addr()?),
    ]
    .into();
    let plan = CollectivePlan::new(&["a", "b"], &[], elements, 1 << 18)?;
    let codecs = LinkCodecs::uniform(EncoderConfig::new(16, 0, false, false)?);
    let mut rng = SeedRng::new(args.seed);
    let values: Vec<Vec<f32>> = (0..2)
        .map(|_| {
            (0..elements)
                .map(|_| rng.uniform(-1.0, 1.0) as f32)
                .collect()
        })
        .collect();
    let deadline = Duration::from_secs(args.deadline_seconds);
    let run = |node: Arc<ExchangeNode>, values: Vec<f32>, peers: BTreeMap<String, SocketAddr>| {
        let (plan, codecs) = (plan.clone(), codecs.clone());
        tokio::spawn(async move {
            let mut contributor = Contributor::new(plan.elements());
            let request = FragmentRequest {
                job: "bench",
                round: 1,
                fragment: 0,
                plan: &plan,
                codecs: &codecs,
                contributor: &mut contributor,
                values: &values,
                peers: &peers,
                deadline,
            };
            node.exchange(request).await
        })
    };
    let mut values = values.into_iter();
    let a_values = values.next().context("values")?;
    let b_values = values.next().context("values")?;
    // The competing stock connection is up and writing before the
    // exchange starts, and stops when it ends.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let competing = args.competing.then(|| {
        let emulator = emulator.clone();
        tokio::spawn(async move {
            stock(&emulator, started_tx, async {
                let _ = done_rx.await;
            })
            .await
        })
    });
    let competing = match competing {
        Some(competing) => {
            if started_rx.await.is_err() {
                // It ended before its handshake: its own error says why.
                competing.await??;
                anyhow::bail!("the stock connection ended before it started");
            }
            Some(competing)
        }
        None => None,
    };
    let task_a = run(Arc::clone(&a), a_values, peers_of_a);
    let task_b = run(Arc::clone(&b), b_values, peers_of_b);
    let outcome_a: ExchangeOutcome = task_a.await??;
    let outcome_b: ExchangeOutcome = task_b.await??;
    let _ = done_tx.send(());
    if let Some(competing) = competing {
        row.stock_mbit = competing.await??;
    }
    anyhow::ensure!(
        outcome_a.hash.is_some() && outcome_a.hash == outcome_b.hash,
        "the exchange did not finish alike: {:?} / {:?} ({:?})",
        outcome_a.hash,
        outcome_b.hash,
        outcome_a.reason
    );
    for (k, (outcome, peer)) in [(&outcome_a, "b"), (&outcome_b, "a")].iter().enumerate() {
        let report = &outcome.peers[*peer];
        row.pool_mbit[k] = report.received_bytes as f64 * 8.0 / outcome.elapsed.as_secs_f64() / 1e6;
        row.resent_bytes += report.resent_bytes;
        row.connections_lost += report.connections_lost;
    }
    row.seconds = outcome_a.elapsed.max(outcome_b.elapsed).as_secs_f64();
    for status in emulator.statuses() {
        row.queue_drops += status.stats.drops.queue;
        row.loss_drops += status.stats.drops.loss;
        row.kernel_drops += status.kernel_drops;
    }
    drop((to_a, to_b, a, b));
    if !args.competing {
        let fresh = Emulator::new(
            args.seed,
            vec![LinkSpec::symmetric("a", "b", link(args, rtt, loss)?)],
        )?;
        let window = Duration::from_secs_f64(args.seconds);
        let (started, _) = tokio::sync::oneshot::channel();
        // The window starts once the stock connection is up and writing
        // (the sleep's deadline is fixed when first polled).
        row.stock_mbit = stock(&fresh, started, async move {
            tokio::time::sleep(window).await;
        })
        .await?;
    }
    Ok(row)
}

/// One stock quinn connection writing one stream from a to b through
/// `emulator`'s link, from its handshake (then `started` is sent) until
/// `until` completes: Mbit/s of data the server read meanwhile.
async fn stock(
    emulator: &Emulator,
    started: tokio::sync::oneshot::Sender<()>,
    until: impl Future<Output = ()>,
) -> anyhow::Result<f64> {
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let certificate: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let server_config =
        quinn::ServerConfig::with_single_cert(vec![certificate.clone()], key.into())?;
    let server = quinn::Endpoint::server(server_config, loopback)?;
    let received = Arc::new(AtomicU64::new(0));
    let serving = {
        let (server, received) = (server.clone(), Arc::clone(&received));
        tokio::spawn(async move {
            let Some(incoming) = server.accept().await else {
                return;
            };
            let Ok(connection) = incoming.await else {
                return;
            };
            let Ok(mut stream) = connection.accept_uni().await else {
                return;
            };
            let mut buffer = vec![0u8; 1 << 16];
            while let Ok(Some(len)) = stream.read(&mut buffer).await {
                received.fetch_add(len as u64, Ordering::Relaxed);
            }
        })
    };
    let proxy = emulator
        .udp_proxy("a", "b", loopback, server.local_addr()?)
        .await?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate)?;
    let mut client = quinn::Endpoint::client(loopback)?;
    client.set_default_client_config(quinn::ClientConfig::with_root_certificates(Arc::new(
        roots,
    ))?);
    let connection = tokio::time::timeout(
        Duration::from_secs(10),
        client.connect(proxy.local_addr(), "localhost")?,
    )
    .await
    .context("stock handshake timed out")??;
    let start = Instant::now();
    let writer = {
        let connection = connection.clone();
        tokio::spawn(async move {
            let chunk = vec![0x5a_u8; 1 << 16];
            let Ok(mut stream) = connection.open_uni().await else {
                return;
            };
            while stream.write_all(&chunk).await.is_ok() {}
        })
    };
    let _ = started.send(());
    until.await;
    let bytes = received.load(Ordering::Relaxed);
    let mbit = bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e6;
    writer.abort();
    connection.close(0u32.into(), b"done");
    server.close(0u32.into(), b"done");
    serving.abort();
    Ok(mbit)
}
