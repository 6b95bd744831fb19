//! The body of the `coordinator` binary: one replica of longhaul's
//! Raft-replicated coordinator, from flags or a TOML file. It lives in the
//! library so that `longhaul rehearse` can start replicas as processes of
//! its own binary.
//!
//! With no flags it runs a single-replica coordinator on 127.0.0.1:7700 with
//! its store in `.longhaul-data/replica-1`. Flags or a TOML file (`--config`)
//! describe a replica of a 3- or 5-replica cluster.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::consensus::NodeConfig;
use crate::server::tls::TlsMaterial;
use crate::server::{Replica, ReplicaConfig};
use anyhow::{Context, bail};
use clap::Parser;
use serde::Deserialize;

/// One replica of longhaul's Raft-replicated coordinator.
///
/// Serves the `longhaul.v1.Coordinator` API, the replicas' raft transport,
/// the standard gRPC health service (NOT_SERVING while no leader is known)
/// and server reflection, all on `--listen`.
///
/// Timing: a tick is `--tick-interval`; the leader sends a heartbeat every
/// `--heartbeat-ticks` ticks and followers campaign after `--election-ticks`
/// ticks without one. The defaults (100 ms, 1, 10) suit replicas in one
/// building. For replicas in different sites follow etcd's guidance: a
/// heartbeat of about the largest RTT between replicas and an election
/// timeout of at least ten RTTs (e.g. 500 km ≈ 5 ms RTT: the defaults hold;
/// 7,000 km ≈ 70 ms RTT: `--tick-interval 100ms --election-ticks 15`).
#[derive(Debug, Parser)]
#[command(name = "coordinator", version)]
pub struct Args {
    /// A TOML file with the settings below (flags given too override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This replica's id (non-zero, unique in the cluster). [default: 1]
    #[arg(long)]
    id: Option<u64>,
    /// Directory of the replica's store: `store.wal/` (the Raft log's segments and the
    /// stored snapshot) and `store.state.redb` (the applied state). Back up the whole
    /// directory, with the replica stopped. [default: .longhaul-data/replica-ID]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on for clients and peers. [default: 127.0.0.1:7700]
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Founding replicas as ID=URL pairs, comma separated, e.g.
    /// `1=http://10.0.0.1:7700,2=http://10.0.0.2:7700,3=http://10.0.0.3:7700`.
    /// [default: this replica alone]
    #[arg(long, value_delimiter = ',')]
    initial_cluster: Vec<String>,
    /// Join a running cluster (after `longhaul cluster add-member`) instead
    /// of founding one.
    #[arg(long)]
    join: bool,
    /// Cluster identity; replicas refuse raft traffic from other clusters. [default: 1]
    #[arg(long)]
    cluster_id: Option<u64>,
    /// Raft tick, e.g. `100ms`. [default: 100ms]
    #[arg(long, value_parser = parse_duration)]
    tick_interval: Option<Duration>,
    /// Ticks between leader heartbeats. [default: 1]
    #[arg(long)]
    heartbeat_ticks: Option<usize>,
    /// Ticks without a leader before a follower campaigns. [default: 10]
    #[arg(long)]
    election_ticks: Option<usize>,
    /// Applied entries between automatic log compactions (a snapshot is built only when a
    /// follower behind the compacted log needs one). [default: 10000]
    #[arg(long)]
    snapshot_interval_entries: Option<u64>,
    /// Applied entries kept when the log is compacted, so that a follower
    /// only this far behind catches up from the log rather than by a
    /// snapshot (etcd's `--snapshot-catchup-entries`). [default: 5000]
    #[arg(long)]
    snapshot_catchup_entries: Option<u64>,
    /// Mutual TLS: the CA certificate (PEM) that signs every replica and
    /// client. With --tls-cert and --tls-key; peer URLs are then https://.
    /// Without them the replica serves plaintext and says so in its log.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// This replica's certificate (PEM), naming the host peers reach it at
    /// and `replica.longhaul` (the replica role; operators' certificates
    /// name `operator.longhaul`, agents' `<site>.site.longhaul`).
    #[arg(long, requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// This replica's private key (PEM).
    #[arg(long, requires = "tls_ca")]
    tls_key: Option<PathBuf>,
    /// TTL of the leases granted to site agents, e.g. `1600ms`: a site whose
    /// agent stops renewing is marked down this long after its last renewal
    /// (agents renew every fifth of it). After a leader change the new leader
    /// gives every site TTL − (election-ticks − 2) × (tick-interval − 5 ms), and
    /// at least half the TTL, to find it. At least 8 ticks. [default: 16 ticks,
    /// 1.6 s at the default tick]
    #[arg(long, value_parser = parse_duration)]
    lease_ttl: Option<Duration>,
    /// A fixed outer-round deadline, e.g. `5s`, instead of twice the sync
    /// planner's predicted outer step (at least 30 s): for rehearsals and
    /// tests, where the rounds' reports come from stand-ins.
    #[arg(long, value_parser = parse_duration)]
    round_deadline: Option<Duration>,
    /// Re-plan a DiLoCo job's sync schedule (H and τ; its fragments and
    /// codec stay) when the inner step its trainers measure is more than
    /// this factor off the one the schedule was planned at, either way;
    /// 0 turns re-planning off. At least 1. [default: 2]
    #[arg(long, value_parser = parse_replan_factor)]
    replan_factor: Option<f64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9700).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Log filter, e.g. `info` or `longhaul_coordinator=debug`.
    #[arg(long, env = "LONGHAUL_LOG", default_value = "info")]
    log: String,
}

/// The TOML form of the settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    #[serde(default)]
    initial_cluster: HashMap<String, String>,
    #[serde(default)]
    join: bool,
    cluster_id: Option<u64>,
    tick_interval: Option<longhaul_core::units::Duration>,
    heartbeat_ticks: Option<usize>,
    election_ticks: Option<usize>,
    snapshot_interval_entries: Option<u64>,
    snapshot_catchup_entries: Option<u64>,
    lease_ttl: Option<longhaul_core::units::Duration>,
    round_deadline: Option<longhaul_core::units::Duration>,
    replan_factor: Option<f64>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed: longhaul_core::units::Duration = text.parse().map_err(|e| format!("{e}"))?;
    Ok(parsed.into())
}

/// The default of `--replan-factor`.
const DEFAULT_REPLAN_FACTOR: f64 = 2.0;

fn parse_replan_factor(text: &str) -> Result<f64, String> {
    let factor: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    replan_factor_problem(factor).map_or(Ok(factor), Err)
}

/// Why `factor` is not a re-plan factor: 0 (off) or a finite number of at
/// least 1.
fn replan_factor_problem(factor: f64) -> Option<String> {
    (factor != 0.0 && !(factor.is_finite() && factor >= 1.0))
        .then(|| format!("must be 0 (never re-plan) or a number of at least 1, found {factor}"))
}

fn parse_member(pair: &str) -> anyhow::Result<(u64, String)> {
    let (id, url) = pair
        .split_once('=')
        .with_context(|| format!("initial-cluster: expected ID=URL, found {pair:?}"))?;
    let id: u64 = id
        .trim()
        .parse()
        .with_context(|| format!("initial-cluster: {id:?} is not a replica id"))?;
    if id == 0 {
        bail!("initial-cluster: replica id 0 is not allowed");
    }
    let url = url.trim();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("initial-cluster: URL {url:?} of replica {id} must start with http:// or https://");
    }
    Ok((id, url.to_string()))
}

fn config(args: &Args) -> anyhow::Result<ReplicaConfig> {
    let file: FileConfig = match &args.config {
        None => FileConfig::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
    };
    let id = args.id.or(file.id).unwrap_or(1);
    if id == 0 {
        bail!("id: must not be 0");
    }
    let replan_factor = args
        .replan_factor
        .or(file.replan_factor)
        .unwrap_or(DEFAULT_REPLAN_FACTOR);
    if let Some(problem) = replan_factor_problem(replan_factor) {
        bail!("replan_factor: {problem}");
    }
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7700)));
    let mut initial_cluster = HashMap::new();
    let pairs: Vec<String> = if args.initial_cluster.is_empty() {
        file.initial_cluster
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    } else {
        args.initial_cluster.clone()
    };
    for pair in &pairs {
        let (member, url) = parse_member(pair)?;
        if initial_cluster.insert(member, url).is_some() {
            bail!("initial-cluster: replica {member} is listed twice");
        }
    }
    let join = args.join || file.join;
    if initial_cluster.is_empty() {
        let scheme = if args.tls_ca.is_some() {
            "https"
        } else {
            "http"
        };
        initial_cluster.insert(id, format!("{scheme}://{listen}"));
    }
    if !join && !initial_cluster.contains_key(&id) {
        bail!("initial-cluster: does not list this replica's id {id}");
    }
    let mut node = NodeConfig::new(id);
    if let Some(tick) = args
        .tick_interval
        .or(file.tick_interval.map(Duration::from))
    {
        if tick.is_zero() {
            bail!("tick-interval: must be positive");
        }
        node.tick_interval = tick;
    }
    if let Some(ticks) = args.heartbeat_ticks.or(file.heartbeat_ticks) {
        node.heartbeat_ticks = ticks;
    }
    if let Some(ticks) = args.election_ticks.or(file.election_ticks) {
        node.election_ticks = ticks;
    }
    if node.heartbeat_ticks == 0 || node.election_ticks <= node.heartbeat_ticks {
        bail!(
            "election-ticks ({}) must be greater than heartbeat-ticks ({}), which must be at least 1",
            node.election_ticks,
            node.heartbeat_ticks
        );
    }
    if let Some(entries) = args
        .snapshot_interval_entries
        .or(file.snapshot_interval_entries)
    {
        node.snapshot_interval_entries = entries;
    }
    if let Some(entries) = args
        .snapshot_catchup_entries
        .or(file.snapshot_catchup_entries)
    {
        node.compaction_retained_entries = entries;
    }
    let tls = match (&args.tls_ca, &args.tls_cert, &args.tls_key) {
        (Some(ca), Some(cert), Some(key)) => Some(TlsMaterial::from_files(ca, cert, key)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https://" } else { "http://" };
    if let Some((member, url)) = initial_cluster
        .iter()
        .find(|(_, url)| !url.starts_with(scheme))
    {
        bail!(
            "initial-cluster: URL {url:?} of replica {member} must start with {scheme} (TLS is {})",
            if tls.is_some() { "on" } else { "off" }
        );
    }
    let lease_ttl = args
        .lease_ttl
        .or(file.lease_ttl.map(Duration::from))
        .unwrap_or_else(|| crate::server::leases::default_lease_ttl(node.tick_interval));
    let shortest = node
        .tick_interval
        .saturating_mul(crate::server::leases::MIN_LEASE_TTL_TICKS);
    if lease_ttl < shortest {
        bail!(
            "lease-ttl ({} ms) must be at least {} ticks ({} ms): a renewal takes a round trip to a quorum, and an agent gives one a sixth of the TTL",
            lease_ttl.as_millis(),
            crate::server::leases::MIN_LEASE_TTL_TICKS,
            shortest.as_millis()
        );
    }
    Ok(ReplicaConfig {
        lease_ttl,
        tls,
        id,
        data_dir: args
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(format!(".longhaul-data/replica-{id}"))),
        listen,
        initial_cluster,
        join,
        cluster_id: args.cluster_id.or(file.cluster_id).unwrap_or(1),
        node,
        message_filter: None,
        round_timing: crate::server::rounds::RoundTiming {
            fixed: args
                .round_deadline
                .or(file.round_deadline.map(Duration::from)),
            replan_factor: Some(replan_factor).filter(|&f| f != 0.0),
            ..Default::default()
        },
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = config(&args)?;
    eprintln!(
        "coordinator replica {} on {} (store {}, {} founding replica(s))",
        config.id,
        config.listen,
        config.data_dir.display(),
        config.initial_cluster.len()
    );
    if let Some(addr) = args.metrics_listen {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        longhaul_core::telemetry::describe(crate::metrics::TABLE);
        eprintln!("metrics at http://{addr}/metrics");
    }
    let mut replica = Replica::start(config).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let outcome = tokio::select! {
        result = replica.wait() => result.map_err(anyhow::Error::from),
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted; stopping");
            Ok(())
        }
        _ = terminate.recv() => {
            eprintln!("terminated; stopping");
            Ok(())
        }
    };
    // Either way the store is closed (its applied state committed and
    // fsynced) before the process exits.
    replica.stop().await;
    outcome
}

/// Runs a replica until it fails or is interrupted: logging to stderr, a
/// runtime, the replica.
pub fn run_blocking(args: Args) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(run(args))
}

/// [`run_blocking`], with the error on stderr and an exit status.
pub fn main(args: Args) -> ExitCode {
    match run_blocking(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
