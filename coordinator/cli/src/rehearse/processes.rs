//! The rehearsal's processes: coordinator replicas at the sites the
//! scenario puts them and one agent per site, each a process of this binary
//! with its config, reaching the other sites through the emulator: its
//! proxies, or in packet mode the other sites' addresses from inside the
//! process's own site namespace ([`Network`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use longhaul_coordinator::process::{KillOnDrop, append_log, free_loopback_port};

use super::network::Network;
use longhaul_coordinator::server::leases;
use longhaul_core::scenario::ScenarioExchange;
use longhaul_core::{Scenario, Topology, units};
use longhaul_simulations::emulator::{Emulator, EmulatorError, TcpProxy, UdpProxy};
use longhaul_site_agent::config::{AgentConfig, ExchangeConfig, ProbeConfig, TrainerConfig};
use longhaul_site_agent::inventory::InventoryConfig;

/// Where a rehearsal's processes get their ports: below the kernel's
/// ephemeral range (see [`free_loopback_port`]) and below the test kit's
/// (`longhaul_testkit::free_addr`, 20,000 up), so that cluster tests'
/// replicas and a rehearsal's processes running beside them never try the
/// same ports.
const PORTS: std::ops::Range<u16> = 10_000..20_000;

/// A port on 127.0.0.1 free for TCP and UDP a moment ago, from [`PORTS`]:
/// a process this rehearsal starts binds it later (an agent's data port
/// for QUIC, its status port for TCP).
pub(super) fn free_port() -> anyhow::Result<SocketAddr> {
    free_loopback_port(PORTS).context("no free port")
}

/// How many lines of a process's log [`Process::died`] quotes.
const LOG_TAIL_LINES: usize = 20;

/// A child process of this binary at a site, killed (SIGKILL) when
/// dropped, that the timeline may kill and start again with the same
/// arguments (in packet mode, in the site's namespace again).
#[derive(Debug)]
pub(super) struct Process {
    name: String,
    site: String,
    network: Network,
    args: Vec<String>,
    log: PathBuf,
    child: Option<KillOnDrop>,
}

impl Process {
    fn start(
        exe: &Path,
        network: &Network,
        (name, site): (String, &str),
        args: Vec<String>,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let mut process = Self {
            name,
            site: site.to_string(),
            network: network.clone(),
            args,
            log,
            child: None,
        };
        process.spawn(exe)?;
        Ok(process)
    }

    pub(super) fn spawn(&mut self, exe: &Path) -> anyhow::Result<()> {
        let log = append_log(&self.log)?;
        let child = self.network.spawn(
            &self.site,
            self.name.clone(),
            Command::new(exe)
                .args(&self.args)
                // The process watches for this parent (see `exit_with_parent`).
                .env(super::PARENT_PID_ENV, std::process::id().to_string())
                .stdout(Stdio::null())
                .stderr(log),
        )?;
        self.child = Some(child);
        Ok(())
    }

    pub(super) fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Why it is not running although the timeline did not stop it: how
    /// it ended and the last lines of its log.
    pub(super) fn died(&mut self) -> Option<String> {
        let ended = self.child.as_mut()?.exited()?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        Some(format!(
            "{ended}; the end of {}:\n{tail}",
            self.log.display()
        ))
    }

    pub(super) fn kill(&mut self) {
        self.child = None;
    }
}

#[derive(Debug)]
pub(super) struct ReplicaProcess {
    pub id: u64,
    pub site: String,
    /// Where it listens, and where the rehearsal reaches it (directly; in
    /// packet mode from inside its site's namespace).
    pub addr: SocketAddr,
    pub process: Process,
}

/// The emulated WAN as the processes see it: what one site dials to reach
/// an address at another site is a proxy of that pair of sites (proxy
/// mode) or that address itself (packet mode).
pub(super) struct Wan<'a> {
    pub emulator: &'a Emulator,
    pub network: Network,
    pub topology: &'a Topology,
    pub host: IpAddr,
    /// The proxies opened so far; they must outlive the processes that
    /// dial them.
    pub proxies: Vec<(TcpProxy, UdpProxy)>,
}

impl Wan<'_> {
    /// Whether a WAN link joins the two sites.
    pub(super) fn linked(&self, a: &str, b: &str) -> bool {
        self.topology.links.iter().any(|l| l.joins(a, b))
    }

    /// What `from` dials to reach `target` at `to`, over TCP and UDP in
    /// that order: the proxies opened for it, or in packet mode `target`.
    async fn expose(
        &mut self,
        from: &str,
        to: &str,
        target: SocketAddr,
    ) -> Result<(SocketAddr, SocketAddr), EmulatorError> {
        if !self.network.uses_proxies() {
            return Ok((target, target));
        }
        let (tcp, udp) = self.emulator.expose(from, to, self.host, target).await?;
        let addrs = (tcp.local_addr(), udp.local_addr());
        self.proxies.push((tcp, udp));
        Ok(addrs)
    }
}

/// The replicas started, and how each site reaches them.
#[derive(Debug)]
pub(super) struct Replicas {
    pub processes: Vec<ReplicaProcess>,
    /// The site of each replica, by index (replica id − 1).
    pub sites: Vec<String>,
    /// reach[(from site, replica index)] = address
    pub reach: BTreeMap<(String, usize), SocketAddr>,
    /// The lease TTL the replicas grant: the one asked for (at least the
    /// coordinator's minimum), or the coordinator's default.
    pub lease_ttl: Duration,
}

/// Where each process serves its Prometheus metrics (`--metrics`): the
/// file name its scrape is saved as (`replica-1`, `agent-paris`) and the
/// address.
pub(super) type MetricsTargets = Vec<(String, SocketAddr)>;

/// Starts the scenario's replicas (at least one), each reaching the others
/// through the emulator, with timers for the largest RTT between them.
pub(super) async fn start_replicas(
    wan: &mut Wan<'_>,
    scenario: &Scenario,
    lease_ttl: Option<Duration>,
    (exe, dir): (&Path, &Path),
    metrics: Option<&mut MetricsTargets>,
) -> anyhow::Result<Replicas> {
    let mut metrics = metrics;
    let topology = wan.topology;
    // Replicas: where they are and how each reaches the others.
    let count = scenario.coordinator.replicas.max(1) as usize;
    let first_site = topology
        .sites
        .first()
        .map(|s| s.id.clone())
        .ok_or_else(|| anyhow!("the topology has no sites"))?;
    let replica_sites: Vec<String> = (0..count)
        .map(|i| {
            scenario
                .coordinator
                .sites
                .get(i)
                .cloned()
                .unwrap_or_else(|| first_site.clone())
        })
        .collect();
    let replica_addrs: Vec<SocketAddr> = replica_sites
        .iter()
        .enumerate()
        .map(|(i, site)| wan.network.replica_listen(site, i))
        .collect::<Result<_, _>>()?;
    let mut reach: BTreeMap<(String, usize), SocketAddr> = BTreeMap::new();
    for site in &topology.sites {
        for (j, target) in replica_addrs.iter().enumerate() {
            let at = &replica_sites[j];
            if *at == site.id {
                reach.insert((site.id.clone(), j), *target);
            } else if wan.linked(&site.id, at) {
                let (tcp, _) = wan
                    .expose(&site.id, at, *target)
                    .await
                    .with_context(|| format!("cannot expose replica {} to {}", j + 1, site.id))?;
                reach.insert((site.id.clone(), j), tcp);
            }
        }
    }
    // Timers for the replicas' largest RTT (etcd's guidance: heartbeat ≈
    // RTT, election ≥ 10 RTT).
    let max_rtt = replica_sites
        .iter()
        .flat_map(|a| replica_sites.iter().map(move |b| (a, b)))
        .filter_map(|(a, b)| topology.link(a, b))
        .map(|l| Duration::from_secs_f64(l.rtt_seconds()))
        .max()
        .unwrap_or_default();
    let tick = max_rtt.max(Duration::from_millis(100));
    let lease_ttl = lease_ttl
        .unwrap_or_else(|| leases::default_lease_ttl(tick))
        .max(tick * leases::MIN_LEASE_TTL_TICKS);
    let mut replicas = Vec::new();
    for (i, addr) in replica_addrs.iter().enumerate() {
        let id = i as u64 + 1;
        let site = &replica_sites[i];
        let mut cluster = Vec::new();
        for (j, peer_site) in replica_sites.iter().enumerate() {
            let peer = reach.get(&(site.clone(), j)).ok_or_else(|| {
                anyhow!(
                    "replica {id} at {site} cannot reach replica {} at {peer_site}: no link between the sites",
                    j + 1,
                )
            })?;
            cluster.push(format!("{}=http://{peer}", j + 1));
        }
        let mut args: Vec<String> = vec![
            "internal".into(),
            "replica".into(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            addr.to_string(),
            "--data-dir".into(),
            dir.join(format!("replica-{id}")).display().to_string(),
            "--initial-cluster".into(),
            cluster.join(","),
            "--tick-interval".into(),
            format!("{}ms", tick.as_millis()),
            "--lease-ttl".into(),
            format!("{}ms", lease_ttl.as_millis()),
            "--log".into(),
            "info".into(),
        ];
        if let Some(targets) = metrics.as_deref_mut() {
            let addr = free_port()?;
            args.extend(["--metrics-listen".into(), addr.to_string()]);
            targets.push((format!("replica-{id}"), addr));
        }
        let process = Process::start(
            exe,
            &wan.network,
            (format!("replica {id}"), site),
            args,
            dir.join(format!("replica-{id}.log")),
        )?;
        replicas.push(ReplicaProcess {
            id,
            site: site.clone(),
            addr: *addr,
            process,
        });
    }
    Ok(Replicas {
        processes: replicas,
        sites: replica_sites,
        reach,
        lease_ttl,
    })
}

/// Starts one agent per site, reaching remote replicas and agents through
/// the emulator; the agents by site, with where each serves its status.
pub(super) async fn start_agents(
    wan: &mut Wan<'_>,
    replicas: &Replicas,
    seed: u64,
    exchange: &ScenarioExchange,
    training: bool,
    (exe, dir): (&Path, &Path),
    mut metrics: Option<&mut MetricsTargets>,
) -> anyhow::Result<(BTreeMap<String, Process>, BTreeMap<String, SocketAddr>)> {
    let topology = wan.topology;
    let count = replicas.sites.len();
    let topology_file = dir.join("topology.toml");
    std::fs::write(&topology_file, topology.to_toml()?)
        .with_context(|| format!("cannot write {}", topology_file.display()))?;
    let listen: BTreeMap<String, (SocketAddr, SocketAddr)> = topology
        .sites
        .iter()
        .map(|s| Ok((s.id.clone(), wan.network.agent_listen(&s.id)?)))
        .collect::<anyhow::Result<_>>()?;
    let data: BTreeMap<&String, SocketAddr> = listen.iter().map(|(s, a)| (s, a.0)).collect();
    let mut agents: BTreeMap<String, Process> = BTreeMap::new();
    for site in &topology.sites {
        let coordinators: Vec<String> = (0..count)
            .filter_map(|j| replicas.reach.get(&(site.id.clone(), j)))
            .map(|a| format!("http://{a}"))
            .collect();
        let mut peers = BTreeMap::new();
        for other in &topology.sites {
            if other.id == site.id || !wan.linked(&site.id, &other.id) {
                continue;
            }
            let (_, udp) = wan
                .expose(&site.id, &other.id, data[&other.id])
                .await
                .with_context(|| format!("cannot expose {}'s agent to {}", other.id, site.id))?;
            peers.insert(other.id.clone(), udp);
        }
        // The exchange's windows fit the site's longest link, at a rate
        // this machine can carry through the emulator.
        let longest = topology
            .links
            .iter()
            .filter(|l| l.between.contains(&site.id))
            .map(|l| l.rtt_seconds())
            .fold(0.0, f64::max);
        let exchange = ExchangeConfig {
            synthetic_elements: (exchange.elements > 0 && !training).then_some(exchange.elements),
            seed,
            link_rate: units::DataRate::from_gbit_per_second(1),
            link_rtt: units::Duration::from_nanos((longest.max(0.001) * 1e9) as u64),
            connections_per_peer: connections_per_peer(exchange),
            ..ExchangeConfig::default()
        };
        let metrics_listen = match metrics.as_deref_mut() {
            Some(targets) => {
                let addr = free_port()?;
                targets.push((format!("agent-{}", site.id), addr));
                Some(addr)
            }
            None => None,
        };
        let config = AgentConfig {
            plaintext: true,
            metrics_listen,
            exchange,
            trainer: training.then(|| TrainerConfig::on_socket(trainer_socket(dir, &site.id))),
            state_dir: Some(dir.join(format!("agent-{}", site.id))),
            rescan_interval: units::Duration::from_secs(30),
            call_timeout: units::Duration::from_secs(2),
            probe: ProbeConfig {
                interval: units::Duration::from_secs(10),
                pings: 10,
                loss_datagrams: 100,
                throughput_duration: units::Duration::from_millis(300),
                seed,
                peer_addresses: peers,
                ..ProbeConfig::default()
            },
            ..AgentConfig::new(
                &site.id,
                coordinators,
                listen[&site.id].0,
                listen[&site.id].1,
                InventoryConfig::static_file(&site.id, &topology_file),
            )
        };
        let config = config
            .to_toml()
            .with_context(|| format!("cannot write {}'s agent config", site.id))?;
        let path = dir.join(format!("agent-{}.toml", site.id));
        std::fs::write(&path, config)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let process = Process::start(
            exe,
            &wan.network,
            (format!("agent {}", site.id), &site.id),
            vec![
                "internal".into(),
                "agent".into(),
                "--config".into(),
                path.display().to_string(),
            ],
            dir.join(format!("agent-{}.log", site.id)),
        )?;
        agents.insert(site.id.clone(), process);
    }
    let status = listen
        .into_iter()
        .map(|(site, (_, status))| (site, status))
        .collect();
    Ok((agents, status))
}

/// Where a site's agent serves the trainer API in a rehearsal.
pub(super) fn trainer_socket(dir: &Path, site: &str) -> PathBuf {
    dir.join(format!("trainer-{site}.sock"))
}

/// Where a site's trainer writes its run (`LONGHAUL_OUTPUT`).
pub(super) fn trainer_output(dir: &Path, site: &str) -> PathBuf {
    dir.join(format!("trainer-{site}.json"))
}

/// A trainer process of the scenario's `[training]` at one site, killed
/// when dropped.
#[derive(Debug)]
pub(super) struct Trainer {
    pub site: String,
    child: KillOnDrop,
    pub exited: Option<String>,
}

impl Trainer {
    /// Whether it is still running; records how it ended.
    pub(super) fn poll(&mut self) -> bool {
        if self.exited.is_none() {
            self.exited = self.child.exited();
        }
        self.exited.is_none()
    }
}

/// Starts the scenario's trainer command once per site of the job, with
/// its environment (see `ScenarioTraining`); output to `trainer-SITE.log`.
pub(super) fn start_trainers(
    command: &[String],
    sites: &[String],
    job: &str,
    seed: u64,
    dir: &Path,
) -> anyhow::Result<Vec<Trainer>> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| anyhow!("training.command is empty"))?;
    let mut trainers = Vec::new();
    for site in sites {
        let log_path = dir.join(format!("trainer-{site}.log"));
        let log = append_log(&log_path)?;
        let name = format!("trainer {site}");
        let child = KillOnDrop::spawn(
            name,
            Command::new(program)
                .args(args)
                .env("LONGHAUL_TRAINER_SOCKET", trainer_socket(dir, site))
                .env("LONGHAUL_JOB", job)
                .env("LONGHAUL_SITE", site)
                .env("LONGHAUL_SEED", seed.to_string())
                .env("LONGHAUL_OUTPUT", trainer_output(dir, site))
                .stdout(log.try_clone()?)
                .stderr(log),
        )
        .with_context(|| format!("training.command: cannot start {program:?} for {site}"))?;
        trainers.push(Trainer {
            site: site.clone(),
            child,
            exited: None,
        });
    }
    Ok(trainers)
}

/// The direct addresses of the replicas running now.
pub(super) fn running_addrs(replicas: &[ReplicaProcess]) -> Vec<SocketAddr> {
    replicas
        .iter()
        .filter(|r| r.process.running())
        .map(|r| r.addr)
        .collect()
}

/// The pool each agent keeps to each peer: the scenario's `[exchange]
/// connections`, or the agents' default.
pub(super) fn connections_per_peer(exchange: &ScenarioExchange) -> u32 {
    exchange
        .connections
        .unwrap_or(ExchangeConfig::default().connections_per_peer)
}

// The scenario's bound on `[exchange] connections` is the agents' own.
const _: () = assert!(
    longhaul_core::scenario::MAX_EXCHANGE_CONNECTIONS
        == longhaul_site_agent::exchange::MAX_CONNECTIONS_PER_PEER
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn a_rehearsals_ports_lie_below_the_ephemeral_and_the_test_kits_ranges() {
        let ephemeral: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(PORTS.end <= ephemeral, "{PORTS:?} reaches {ephemeral}");
        for _ in 0..8 {
            let addr = free_port().unwrap();
            assert!(PORTS.contains(&addr.port()), "{addr} is not in {PORTS:?}");
        }
    }

    #[test]
    fn a_process_that_died_says_how_and_quotes_the_end_of_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut process = Process::start(
            Path::new("/bin/sh"),
            &Network::Proxy,
            ("agent north".into(), "north"),
            vec![
                "-c".into(),
                "for i in $(seq 30); do echo line $i >&2; done; echo cannot bind >&2; exit 3"
                    .into(),
            ],
            dir.path().join("agent-north.log"),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let why = loop {
            if let Some(why) = process.died() {
                break why;
            }
            assert!(std::time::Instant::now() < deadline, "still running");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(why.contains("agent north exited"), "{why}");
        assert!(why.contains("cannot bind"), "{why}");
        // Only the end of the log.
        assert!(
            why.contains("line 30") && !why.contains("line 5\n"),
            "{why}"
        );
        // One the timeline killed did not die.
        process.kill();
        assert_eq!(process.died(), None);
    }
}
