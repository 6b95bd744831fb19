//! The body of `site-agent run`: load the config, discover the inventory,
//! start the lease and watch tasks, the data endpoint (probes and the
//! exchange), the round driver when configured, and the status service,
//! and run until interrupted. In the library so that `longhaul rehearse` can
//! start agents as processes of its own binary; like a binary's `main`, it
//! reports errors with `anyhow`.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use longhaul_proto::v1::site_agent_server::SiteAgentServer;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::agent::{self, Agent, Discover, Settings};
use crate::catchup::{CatchUpClient, StateStore};
use crate::config::{AgentConfig, TrainerConfig};
use crate::coordinator::Coordinators;
use crate::data_endpoint::DataEndpoint;
use crate::inventory::{Inventory, InventorySource, source_from_config};
use crate::launch::RenderAndSubmit;
use crate::prober;
use crate::render::slurm::SlurmSubmitOptions;
use crate::rounds;
use crate::status::{StatusBoard, StatusService};
use crate::store::Store;
use crate::tls::AgentTls;
use crate::trainer::service::TrainerService;
use crate::trainer::{TrainerHub, WithTrainers};

/// Reads and checks an agent config file.
pub fn load(path: &Path) -> anyhow::Result<AgentConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    Ok(AgentConfig::from_toml(
        &path.display().to_string(),
        &text,
        base,
    )?)
}

/// The inventory source as the agent runtime calls it.
#[derive(Debug)]
struct Source(Box<dyn InventorySource>);

impl Discover for Source {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn discover(&self) -> Result<Inventory, String> {
        self.0.discover().map_err(|e| e.to_string())
    }
}

fn client_tls(config: &AgentConfig) -> anyhow::Result<Option<ClientTlsConfig>> {
    let Some(files) = &config.tls else {
        return Ok(None);
    };
    let read = |what: &str, path: &Path| {
        std::fs::read_to_string(path)
            .with_context(|| format!("tls.{what}: cannot read {}", path.display()))
    };
    let ca = read("ca", &files.ca)?;
    let cert = read("cert", &files.cert)?;
    let key = read("key", &files.key)?;
    Ok(Some(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key)),
    ))
}

/// Runs the agent of `config_path` until interrupted (Ctrl-C, SIGTERM).
pub async fn run(config_path: &Path) -> anyhow::Result<()> {
    let config = load(config_path)?;
    let source = Source(source_from_config(&config.inventory)?);
    let inventory = source
        .0
        .discover()
        .with_context(|| format!("inventory from {}", source.0.describe()))?;
    for unmapped in &inventory.unmapped {
        tracing::warn!(object = %unmapped.object, reason = %unmapped.reason, "not in the inventory");
    }
    tracing::info!(
        site = %config.site,
        source = %source.0.describe(),
        nodes = inventory.nodes.len(),
        gpus = inventory.site.gpus(),
        unmapped = inventory.unmapped.len(),
        "inventory discovered"
    );
    // The exporter first, so that what start-up records (the plaintext
    // gauge of `AgentTls::insecure_local`) reaches it.
    if let Some(addr) = config.metrics_listen {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .with_context(|| format!("metrics_listen: cannot serve metrics on {addr}"))?;
        crate::metrics::describe();
    }
    let state_dir = config.state_dir();
    let (store, state) = Store::open(&state_dir, &config.site)?;
    let tls = client_tls(&config)?;
    if tls.is_none() {
        tracing::warn!(
            "PLAINTEXT mode: the agent and the coordinator do not authenticate each other; use [tls] outside a lab"
        );
    }
    // The agent's identity for probes: its certificate (which must name
    // its site), or a throw-away one in plaintext mode.
    let agent_tls = match &config.tls {
        Some(files) => AgentTls::from_pem_files(&config.site, &files.ca, &files.cert, &files.key)?,
        None => AgentTls::insecure_local(&config.site)?,
    };
    let plaintext = tls.is_none();
    let call_timeout = config.call_timeout.into();
    let coordinators = Coordinators::new(&config.coordinators, tls, Duration::from_secs(1))?;
    let status = Arc::new(Mutex::new(StatusBoard {
        plaintext,
        ..StatusBoard::default()
    }));
    let handler = RenderAndSubmit {
        site_id: config.site.clone(),
        dir: state_dir.join("rendered"),
        options: config.render.clone(),
        submit: config.submit.as_ref().map(|s| SlurmSubmitOptions {
            sbatch: s.sbatch.clone(),
            args: s.args.clone(),
            timeout: s.timeout.into(),
        }),
    };
    let settings = Settings {
        site_id: config.site.clone(),
        data_address: config.data_address().to_string(),
        rescan_interval: config.rescan_interval.into(),
        call_timeout,
    };
    let mut probe_options = config.probe.scheduler_options();
    if !config.probe.enabled {
        // The server still answers the other sites' probes.
        probe_options.interval = Duration::from_secs(365 * 24 * 3600);
    }
    let hub = config.trainer.as_ref().map(|trainer| {
        Arc::new(TrainerHub::new(
            config.site.clone(),
            trainer.session_ttl.into(),
            trainer.shm_dir.clone(),
        ))
    });
    // What the trainers publish for other sites to catch up from (nothing
    // without trainers: every request is refused).
    let states = hub
        .as_ref()
        .map_or_else(StateStore::new, |hub| Arc::clone(hub.states()));
    // One QUIC endpoint on data_listen for the probes, the exchange and
    // the catch-up transfer.
    let (data_endpoint, probe_server, exchange_node) = DataEndpoint::bind(
        config.data_listen,
        &agent_tls,
        prober::server_options(&probe_options),
        config.exchange.options(),
        states,
    )
    .with_context(|| format!("data_listen: cannot listen on {}", config.data_listen))?;
    let catch_up = CatchUpClient {
        endpoint: data_endpoint.endpoint(),
        tls: agent_tls.clone(),
    };
    let prober = prober::start(
        config.site.clone(),
        probe_server,
        config.probe.peer_addresses.clone(),
        agent_tls,
        probe_options,
        coordinators.clone(),
        status.clone(),
    )
    .context("cannot start the link probes")?;
    let exchange_node = Arc::new(exchange_node);
    if config.metrics_listen.is_some() {
        sample_exchange_paths(Arc::clone(&exchange_node), prober.peers.clone());
    }
    let values = match (&hub, config.exchange.synthetic_elements) {
        (Some(hub), _) => {
            tracing::info!("taking part in outer rounds with what the trainers submit");
            Some(rounds::Values::Trainers(Arc::clone(hub)))
        }
        (None, Some(elements)) => {
            tracing::info!(
                elements,
                seed = config.exchange.seed,
                "taking part in outer rounds with synthetic pseudo-gradients"
            );
            Some(rounds::Values::Synthetic {
                elements,
                seed: config.exchange.seed,
            })
        }
        (None, None) => None,
    };
    let round_driver = values.map(|values| {
        rounds::spawn(
            rounds::RoundSettings {
                site_id: config.site.clone(),
                values,
                call_timeout,
                catch_up: Some(catch_up),
            },
            coordinators.clone(),
            Arc::clone(&exchange_node),
            prober.peers.clone(),
            Arc::clone(&prober.refresh_peers),
            status.clone(),
        )
    });
    let status_listener = tokio::net::TcpListener::bind(config.status_listen)
        .await
        .with_context(|| format!("status_listen: cannot listen on {}", config.status_listen))?;
    let handler: Box<dyn agent::Handle> = match &hub {
        Some(hub) => Box::new(WithTrainers {
            inner: Box::new(handler),
            hub: Arc::clone(hub),
        }),
        None => Box::new(handler),
    };
    let trainer_servers = match (&config.trainer, &hub) {
        (Some(trainer), Some(hub)) => serve_trainers(trainer, hub).await?,
        _ => Vec::new(),
    };
    let tasks = agent::spawn(Agent {
        settings,
        coordinators,
        discover: Arc::new(source),
        inventory,
        handler,
        store,
        state,
        status: status.clone(),
    });
    let service = StatusService::new(
        config.site.clone(),
        status,
        Some(prober.trigger.clone()),
        Duration::from_secs(90),
    );
    tracing::info!(site = %config.site, status = %config.status_listen, state_dir = %state_dir.display(), "site agent running");
    let server = tonic::transport::Server::builder()
        .add_service(SiteAgentServer::new(service))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(status_listener),
            shutdown(),
        );
    server.await.context("status server failed")?;
    for task in tasks.into_iter().chain(round_driver).chain(trainer_servers) {
        task.abort();
    }
    if let Some(socket) = config.trainer.as_ref().and_then(|t| t.socket.as_ref()) {
        let _ = std::fs::remove_file(socket);
    }
    drop(prober);
    drop(data_endpoint);
    tracing::info!("site agent stopped");
    Ok(())
}

/// Serves the trainer API on the configured Unix socket and loopback
/// address; the servers' tasks.
async fn serve_trainers(
    config: &TrainerConfig,
    hub: &Arc<TrainerHub>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut servers = Vec::new();
    if let Some(path) = &config.socket {
        // A socket file left by an earlier run would make bind fail.
        if std::fs::symlink_metadata(path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        {
            std::fs::remove_file(path)
                .with_context(|| format!("trainer.socket: cannot replace {}", path.display()))?;
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("trainer.socket: cannot create {}", parent.display()))?;
        }
        let listener = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("trainer.socket: cannot listen on {}", path.display()))?;
        let service = TrainerService::new(Arc::clone(hub)).server();
        tracing::info!(socket = %path.display(), shm_dir = %config.shm_dir.display(), "trainer API listening");
        servers.push(tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!(%error, "trainer API (socket) failed");
            }
        }));
    }
    if let Some(addr) = config.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("trainer.listen: cannot listen on {addr}"))?;
        let service = TrainerService::new(Arc::clone(hub)).server();
        tracing::info!(%addr, shm_dir = %config.shm_dir.display(), "trainer API listening");
        servers.push(tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!(%error, "trainer API (TCP) failed");
            }
        }));
    }
    Ok(servers)
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// `site-agent run` as a whole: logging to stderr, a runtime, [`run`].
pub fn run_blocking(config_path: &Path, log: &str) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(run(config_path))
}

/// How often the exchange pool's path statistics become metrics.
const PATH_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Samples the exchange pool's QUIC path statistics into per-peer metrics
/// every [`PATH_SAMPLE_INTERVAL`], for as long as the runtime runs.
fn sample_exchange_paths(
    node: Arc<crate::exchange::ExchangeNode>,
    peers: tokio::sync::watch::Receiver<std::collections::BTreeMap<String, std::net::SocketAddr>>,
) {
    tokio::spawn(async move {
        let mut sampler = crate::exchange::metrics::PathSampler::default();
        let mut interval = tokio::time::interval(PATH_SAMPLE_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let peers = peers.borrow().clone();
            sampler.sample(&node.pool_paths(), &peers);
        }
    });
}
