//! `site-agent`: runs beside a campus's scheduler and speaks for its site.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::site_agent_client::SiteAgentClient;
use longhaul_site_agent::daemon;
use longhaul_site_agent::inventory::source_from_config;

/// The longhaul site agent.
///
/// One agent runs beside each campus's scheduler (Slurm, Kubernetes, or a
/// static topology file). It registers the site's inventory with the
/// coordinator and keeps the site's lease alive, watches the jobs placed on
/// the site and renders each into a Slurm batch script or a Kubernetes
/// JobSet (and submits to Slurm when configured), and reports changes of
/// its inventory.
#[derive(Debug, Parser)]
#[command(name = "site-agent", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (until interrupted).
    Run {
        /// The agent's TOML config.
        #[arg(long)]
        config: PathBuf,
        /// Log filter, e.g. `info` or `longhaul_site_agent=debug`.
        #[arg(long, env = "LONGHAUL_LOG", default_value = "info")]
        log: String,
    },
    /// Show a running agent's lease, coordinator, last revision, inventory,
    /// assignments and probe results.
    Status {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Discover the inventory as the agent would, and show it (nothing is
    /// registered). Exits 1 when the inventory is refused.
    Inventory {
        /// The agent's TOML config.
        #[arg(long)]
        config: PathBuf,
        /// List every node, not just the summary.
        #[arg(long)]
        nodes: bool,
    },
    /// Ask a running agent to probe every peer site now.
    Probe {
        #[command(flatten)]
        target: Target,
    },
}

/// Which running agent to ask.
#[derive(Debug, clap::Args)]
struct Target {
    /// The agent's config (its `status_listen` is used).
    #[arg(long, conflicts_with = "address")]
    config: Option<PathBuf>,
    /// The agent's status address, host:port. [default: 127.0.0.1:7900]
    #[arg(long)]
    address: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 5)]
    timeout: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

async fn agent_client(
    target: &Target,
) -> anyhow::Result<SiteAgentClient<tonic::transport::Channel>> {
    let address = match (&target.config, &target.address) {
        (Some(path), _) => daemon::load(path)?.status_listen.to_string(),
        (None, Some(address)) => address.clone(),
        (None, None) => longhaul_site_agent::config::DEFAULT_STATUS_LISTEN.to_string(),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .with_context(|| format!("--address: {address:?} is not host:port"))?
        .connect_timeout(Duration::from_secs(target.timeout))
        .timeout(Duration::from_secs(target.timeout));
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("no site agent answers at {address}"))?;
    // A status keeps up to 8192 exchanged fragments: a few MB.
    Ok(SiteAgentClient::new(channel).max_decoding_message_size(64 << 20))
}

fn print_probe(p: &pb::PeerProbe) {
    match (&p.measurement, p.error.is_empty()) {
        (Some(m), true) => println!(
            "  {:<12} {:<22} rtt {:>8.2} ms  loss {:>5.2}%  {:>8.2} Gbit/s",
            p.peer_site_id,
            p.peer_address,
            m.rtt_ns as f64 / 1e6,
            m.loss_rate * 100.0,
            m.throughput_bps as f64 / 1e9
        ),
        _ => println!(
            "  {:<12} {:<22} failed: {}",
            p.peer_site_id, p.peer_address, p.error
        ),
    }
}

fn print_status(s: &pb::AgentStatus) {
    let lease = match pb::LeaseState::try_from(s.lease_state) {
        Ok(pb::LeaseState::Held) => "HELD",
        Ok(pb::LeaseState::Lapsed) => "LAPSED",
        Ok(pb::LeaseState::Registering) => "REGISTERING",
        _ => "UNKNOWN",
    };
    println!("site        {}", s.site_id);
    println!(
        "lease       {lease} (id {:#x}, ttl {} ms, renewed {} ms ago; {} renewals, {} reconnects)",
        s.lease_id, s.lease_ttl_ms, s.since_last_renewal_ms, s.renewals, s.reconnects
    );
    println!(
        "coordinator {} (leader {}){}",
        s.coordinator_endpoint,
        s.leader_id,
        if s.plaintext { "  PLAINTEXT" } else { "" }
    );
    println!(
        "revision    {} (last seen on the assignment watch)",
        s.last_revision
    );
    if let Some(inv) = &s.inventory {
        println!(
            "inventory   {}: {} buildings, {} domains, {} nodes, {} GPUs, {} unmapped",
            inv.source,
            inv.buildings,
            inv.domains,
            inv.nodes,
            inv.gpus,
            inv.unmapped.len()
        );
        for line in &inv.unmapped {
            println!("  unmapped  {line}");
        }
    }
    println!("assignments {}", s.assignments.len());
    for a in &s.assignments {
        println!(
            "  {:<16} revision {:<6} {:>7} ranks  {}{}",
            a.job_id,
            a.revision,
            a.ranks,
            a.rendered_files.join(" "),
            if a.submitted_as.is_empty() {
                String::new()
            } else {
                format!("  submitted as {}", a.submitted_as)
            }
        );
    }
    println!("probes      {}", s.probes.len());
    for p in &s.probes {
        print_probe(p);
    }
    println!("exchanges   {} fragments applied", s.exchanges.len());
    // The last few; `--output json` has every one kept.
    for e in s.exchanges.iter().rev().take(5).rev() {
        let sent: u64 = e.peers.iter().map(|p| p.sent_bytes).sum();
        let received: u64 = e.peers.iter().map(|p| p.received_bytes).sum();
        println!(
            "  {} round {} fragment {} with {}: {} ms, {sent} B sent, {received} B received, hash {}",
            e.job_id,
            e.round,
            e.fragment,
            e.live_sites.join("+"),
            e.ended_at_unix_ms.saturating_sub(e.started_at_unix_ms),
            e.hash.chars().take(24).collect::<String>(),
        );
    }
}

fn status_json(s: &pb::AgentStatus) -> serde_json::Value {
    serde_json::json!({
        "site_id": s.site_id,
        "lease_state": pb::LeaseState::try_from(s.lease_state).map(|l| l.as_str_name()).unwrap_or("LEASE_STATE_UNSPECIFIED"),
        "lease_id": s.lease_id,
        "lease_ttl_ms": s.lease_ttl_ms,
        "since_last_renewal_ms": s.since_last_renewal_ms,
        "leader_id": s.leader_id,
        "coordinator_endpoint": s.coordinator_endpoint,
        "last_revision": s.last_revision,
        "renewals": s.renewals,
        "reconnects": s.reconnects,
        "plaintext": s.plaintext,
        "inventory": s.inventory.as_ref().map(|i| serde_json::json!({
            "source": i.source, "buildings": i.buildings, "domains": i.domains,
            "nodes": i.nodes, "gpus": i.gpus, "unmapped": i.unmapped,
        })),
        "assignments": s.assignments.iter().map(|a| serde_json::json!({
            "job_id": a.job_id, "revision": a.revision, "ranks": a.ranks,
            "rendered_files": a.rendered_files, "submitted_as": a.submitted_as,
        })).collect::<Vec<_>>(),
        "probes": s.probes.iter().map(|p| serde_json::json!({
            "peer_site_id": p.peer_site_id, "peer_address": p.peer_address, "error": p.error,
            "rtt_ns": p.measurement.as_ref().map(|m| m.rtt_ns),
            "loss_rate": p.measurement.as_ref().map(|m| m.loss_rate),
            "throughput_bps": p.measurement.as_ref().map(|m| m.throughput_bps),
        })).collect::<Vec<_>>(),
        "exchanges": s.exchanges.iter().map(|e| serde_json::json!({
            "job_id": e.job_id, "round": e.round, "fragment": e.fragment,
            "live_sites": e.live_sites, "hash": e.hash,
            "started_at_unix_ms": e.started_at_unix_ms, "ended_at_unix_ms": e.ended_at_unix_ms,
            "attempts_failed": e.attempts_failed,
            "encoded_us": e.encoded_us, "first_data_us": e.first_data_us,
            "reduced_us": e.reduced_us, "assembled_us": e.assembled_us,
            "peers": e.peers.iter().map(|p| serde_json::json!({
                "site_id": p.site_id, "sent_bytes": p.sent_bytes,
                "received_bytes": p.received_bytes, "resent_bytes": p.resent_bytes,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn show_inventory(config_path: &Path, nodes: bool) -> anyhow::Result<()> {
    let config = daemon::load(config_path)?;
    let source = source_from_config(&config.inventory)?;
    let inventory = source
        .discover()
        .with_context(|| format!("inventory from {}", source.describe()))?;
    println!("source      {}", source.describe());
    println!(
        "site        {}: {} GPUs in {} nodes",
        inventory.site.id,
        inventory.site.gpus(),
        inventory.nodes.len()
    );
    for building in &inventory.site.buildings {
        println!("building    {}", building.id);
        for g in &building.domains {
            println!(
                "  group {:<24} {} × {} nodes × {} {} GPUs",
                g.id, g.count, g.nodes_per_domain, g.gpus_per_node, g.gpu
            );
        }
    }
    for u in &inventory.unmapped {
        println!("unmapped    {}: {}", u.object, u.reason);
    }
    if nodes {
        for n in &inventory.nodes {
            println!(
                "node        {:<20} {}/{}[{}]/{}  {} × {}{}",
                n.name,
                n.building,
                n.domain_group,
                n.domain,
                n.node,
                n.gpus,
                n.gpu_type,
                n.scheduler_domain
                    .as_ref()
                    .map(|d| format!("  ({d})"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = match &cli.command {
        Command::Run { log, .. } => log.clone(),
        _ => "warn".to_string(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run { config, .. } => daemon::run(&config).await,
            Command::Status { target, output } => {
                let mut client = agent_client(&target).await?;
                let status = client
                    .get_status(pb::GetAgentStatusRequest {})
                    .await
                    .context("status")?
                    .into_inner();
                match output {
                    Output::Text => print_status(&status),
                    Output::Json => println!("{:#}", status_json(&status)),
                }
                Ok(())
            }
            Command::Inventory { config, nodes } => show_inventory(&config, nodes),
            Command::Probe { target } => {
                let mut client = agent_client(&target).await?;
                let probes = client
                    .probe_now(pb::ProbeNowRequest {})
                    .await
                    .context("probe")?
                    .into_inner();
                for p in &probes.probes {
                    print_probe(p);
                }
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(1)
        }
    }
}
