//! `longhaul rehearse`: a distance scenario played against the real
//! coordinator and agents, on this machine.
//!
//! Every component is a process of this binary (`longhaul internal replica`
//! and `longhaul internal agent`): the coordinator replicas at the sites the
//! scenario puts them, one agent per site. Whatever crosses sites goes
//! through the emulator's proxies for that pair of sites: raft traffic
//! between replicas, an agent's calls to replicas elsewhere, probes between
//! agents. The rehearsal itself is the operator's console: it talks to the
//! replicas directly, and watches what they commit.
//!
//! It registers the inventories (each agent reads its site from the
//! scenario's topology), configures the WAN links, submits the job and shows
//! the plan, plays the fault timeline, and reports what happened with the
//! time each thing took: leader changes after a kill, sites going down after
//! a partition and up after a heal, re-plans after a site changed, and the
//! emulator's counters per link direction.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use clap::{Args, Subcommand};
use longhaul_core::scenario::{Action, TimelineEvent};
use longhaul_core::units;
use longhaul_core::{JobSpec, Scenario, Topology};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use longhaul_simulations::emulator::{self, Emulator, LinkChange, human_ns};
use serde::Serialize;
use tonic::transport::Channel;

use super::table::{Table, thousands};
use super::{Failure, Output};
use longhaul_coordinator::process::{KillOnDrop, append_log};
use longhaul_coordinator::server::convert::{job_to_wire, link_to_wire};

const BUNDLED_SCENARIO: &str = include_str!("../../../deploy/scenarios/two-campuses-80km.toml");
const BUNDLED_TOPOLOGY: &str = include_str!("../../../deploy/examples/two-campuses-80km.toml");
const BUNDLED_JOB: &str = include_str!("../../../deploy/examples/llama-70b.job.toml");

#[derive(Debug, Args)]
pub struct RehearseArgs {
    /// The scenario file; the bundled two-campuses-80km scenario (leader
    /// kill, then the south campus cut off and healed) when omitted.
    pub scenario: Option<PathBuf>,
    /// Seed of the emulated links and the probes; the scenario's when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
    /// TTL of the agents' leases: how long a silent site stays up.
    #[arg(long, default_value = "3 s")]
    pub lease_ttl: units::Duration,
    /// Keep the rehearsal's files (configs, stores, logs) in this directory
    /// (created; must be empty). A temporary directory, removed at the end,
    /// when omitted.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Processes the rehearsal starts: the same binary, another role.
#[derive(Debug, Subcommand)]
pub enum InternalCommand {
    /// A coordinator replica (the `coordinator` binary's flags).
    Replica(Box<longhaul_coordinator::daemon::Args>),
    /// A site agent (`site-agent run`).
    Agent {
        #[arg(long)]
        config: PathBuf,
        #[arg(long, env = "LONGHAUL_LOG", default_value = "info")]
        log: String,
    },
}

pub fn internal(command: InternalCommand) -> Result<(), Failure> {
    match command {
        InternalCommand::Replica(args) => longhaul_coordinator::daemon::run_blocking(*args)?,
        InternalCommand::Agent { config, log } => {
            longhaul_site_agent::daemon::run_blocking(&config, &log)?;
        }
    }
    Ok(())
}

/// What was loaded: the scenario, its topology and job.
struct Loaded {
    scenario: Scenario,
    topology: Topology,
    job: JobSpec,
}

fn load(path: Option<&Path>) -> Result<Loaded, Failure> {
    let Some(path) = path else {
        let scenario = Scenario::from_toml("bundled two-campuses-80km.toml", BUNDLED_SCENARIO)?;
        let topology = Topology::from_toml("bundled two-campuses-80km.toml", BUNDLED_TOPOLOGY)?;
        let job = JobSpec::from_toml("bundled llama-70b.job.toml", BUNDLED_JOB)?;
        return Ok(Loaded {
            scenario,
            topology,
            job,
        });
    };
    let super::ScenarioFile {
        scenario,
        topology,
        dir,
    } = super::load_scenario(path)?;
    let job_path = dir.join(&scenario.job);
    let job = JobSpec::from_toml(&job_path.display().to_string(), &super::read(&job_path)?)?;
    Ok(Loaded {
        scenario,
        topology,
        job,
    })
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("no free port")?;
    Ok(listener.local_addr()?)
}

/// A child process of this binary, killed (SIGKILL) when dropped, that the
/// timeline may kill and start again with the same arguments.
#[derive(Debug)]
struct Process {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<KillOnDrop>,
}

impl Process {
    fn start(exe: &Path, name: String, args: Vec<String>, log: PathBuf) -> anyhow::Result<Self> {
        let mut process = Self {
            name,
            args,
            log,
            child: None,
        };
        process.spawn(exe)?;
        Ok(process)
    }

    fn spawn(&mut self, exe: &Path) -> anyhow::Result<()> {
        let log = append_log(&self.log)?;
        let child = KillOnDrop::spawn(
            self.name.clone(),
            Command::new(exe)
                .args(&self.args)
                .stdout(Stdio::null())
                .stderr(log),
        )?;
        self.child = Some(child);
        Ok(())
    }

    fn running(&self) -> bool {
        self.child.is_some()
    }

    fn kill(&mut self) {
        self.child = None;
    }
}

#[derive(Debug)]
struct ReplicaProcess {
    id: u64,
    site: String,
    /// Where the rehearsal reaches it (directly).
    addr: SocketAddr,
    process: Process,
}

/// One thing that happened, at `t` since the job was placed.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub t_ms: u64,
    /// `action`, `leader`, `site`, `job`.
    pub kind: &'static str,
    pub detail: String,
    /// For a consequence: the action or change it follows, and how long after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
    /// Structured fields for checks: the site, the leader id, the job's sites.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_sites: Option<Vec<String>>,
}

impl Record {
    fn new(t: Duration, kind: &'static str, detail: String) -> Self {
        Self {
            t_ms: t.as_millis() as u64,
            kind,
            detail,
            after: None,
            took_ms: None,
            site: None,
            up: None,
            leader: None,
            job_sites: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    pub direction: String,
    pub packets_in: u64,
    pub bytes_delivered: u64,
    pub drops_queue: u64,
    pub drops_loss: u64,
    pub drops_down: u64,
    pub retransmissions: u64,
    pub queue_high_water_bytes: u64,
    pub lateness_p50_us: u64,
    pub lateness_p99_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub mode: String,
    pub sites: Vec<String>,
    pub gpus: u64,
    pub step_seconds: f64,
}

/// The rehearsal's result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub lease_ttl_ms: u64,
    pub replicas: Vec<(u64, String)>,
    pub plan: PlanReport,
    pub timeline: Vec<Record>,
    pub links: Vec<LinkReport>,
    pub directory: Option<PathBuf>,
}

/// What the observers know now.
#[derive(Debug, Default)]
struct Observed {
    leader: u64,
    term: u64,
    sites: BTreeMap<String, bool>,
    job_sites: Vec<String>,
    job_state: String,
    job_revision: u64,
    records: Vec<Record>,
    /// The last action and last site change, for "took".
    actions: Vec<(Duration, Action, Option<String>)>,
    site_changes: Vec<(Duration, String, bool)>,
}

type Shared = Arc<Mutex<Observed>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Observed> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn client(addr: SocketAddr) -> anyhow::Result<CoordinatorClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500));
    Ok(CoordinatorClient::new(endpoint.connect_lazy()).max_decoding_message_size(64 << 20))
}

fn plan_sites(job: &pb::Job) -> Vec<String> {
    let mut sites: Vec<String> = job
        .plan
        .as_ref()
        .map(|p| p.stages.iter().map(|s| s.site_id.clone()).collect())
        .unwrap_or_default();
    sites.sort();
    sites.dedup();
    sites
}

fn job_state(job: &pb::Job) -> &'static str {
    match pb::JobState::try_from(job.state) {
        Ok(pb::JobState::Placed) => "placed",
        Ok(pb::JobState::Infeasible) => "infeasible",
        Ok(pb::JobState::Pending) => "pending",
        Ok(pb::JobState::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// Polls the live replicas for the leader every 100 ms.
fn spawn_leader_watch(addrs: Arc<Mutex<Vec<SocketAddr>>>, shared: Shared, t0: Instant) {
    tokio::spawn(async move {
        loop {
            let live: Vec<SocketAddr> = addrs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let mut best: Option<(u64, u64)> = None;
            for addr in live {
                let Ok(mut c) = client(addr) else { continue };
                let mut request = tonic::Request::new(pb::GetClusterRequest { allow_stale: true });
                request.set_timeout(Duration::from_millis(300));
                if let Ok(response) = c.get_cluster(request).await {
                    let response = response.into_inner();
                    let term = response.header.map_or(0, |h| h.raft_term);
                    if response.leader_id != 0 && best.is_none_or(|(t, _)| term > t) {
                        best = Some((term, response.leader_id));
                    }
                }
            }
            if let Some((term, leader)) = best {
                let mut observed = lock(&shared);
                if leader != observed.leader {
                    let t = t0.elapsed();
                    let mut record =
                        Record::new(t, "leader", format!("replica {leader} leads (term {term})"));
                    record.leader = Some(leader);
                    // The most recent action that can move leadership.
                    if observed.leader != 0
                        && let Some((at, action, site)) =
                            observed.actions.iter().rev().find(|(_, a, _)| {
                                matches!(
                                    a,
                                    Action::KillLeader
                                        | Action::RestartCoordinators
                                        | Action::Partition
                                        | Action::Heal
                                )
                            })
                    {
                        record.after = Some(match site {
                            Some(site) => format!("{} {site}", action_name(*action)),
                            None => action_name(*action).to_string(),
                        });
                        record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
                    }
                    observed.records.push(record);
                    observed.leader = leader;
                    observed.term = term;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// Watches site and job changes from `after`, reconnecting to another live
/// replica when the one in use goes away.
fn spawn_change_watch(
    addrs: Arc<Mutex<Vec<SocketAddr>>>,
    shared: Shared,
    t0: Instant,
    mut after: u64,
) {
    tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            let live: Vec<SocketAddr> = addrs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            if live.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let addr = live[next % live.len()];
            next += 1;
            let Ok(mut c) = client(addr) else { continue };
            let request = pb::WatchRequest {
                after_revision: after,
                kinds: vec!["site".into(), "job".into()],
            };
            let Ok(response) = c.watch(request).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut stream = response.into_inner();
            while let Ok(Some(event)) = stream.message().await {
                after = after.max(event.revision);
                let t = t0.elapsed();
                let mut observed = lock(&shared);
                match event.event {
                    Some(pb::watch_event::Event::Site(site)) => {
                        let id = site.site.as_ref().map(|s| s.id.clone()).unwrap_or_default();
                        let up = site.state() == pb::SiteState::Up;
                        if observed.sites.get(&id) == Some(&up) {
                            continue;
                        }
                        observed.sites.insert(id.clone(), up);
                        let mut record = Record::new(
                            t,
                            "site",
                            format!(
                                "site {id} {} ({})",
                                if up { "up" } else { "down" },
                                site.state_reason
                            ),
                        );
                        record.site = Some(id.clone());
                        record.up = Some(up);
                        let cause = observed.actions.iter().rev().find(|(_, a, s)| {
                            s.as_deref() == Some(id.as_str())
                                && match a {
                                    Action::Partition | Action::KillAgent => !up,
                                    Action::Heal | Action::RestartAgent => up,
                                    _ => false,
                                }
                        });
                        if let Some((at, action, _)) = cause {
                            record.after = Some(format!("{} {id}", action_name(*action)));
                            record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
                        }
                        observed.records.push(record);
                        observed.site_changes.push((t, id, up));
                    }
                    Some(pb::watch_event::Event::Job(job)) => {
                        let sites = plan_sites(&job);
                        let state = job_state(&job).to_string();
                        if observed.job_revision != 0
                            && (sites != observed.job_sites || state != observed.job_state)
                        {
                            let mut record = Record::new(
                                t,
                                "job",
                                format!(
                                    "job {} re-planned: {} on {} (was {} on {})",
                                    job.id,
                                    state,
                                    if sites.is_empty() {
                                        "-".into()
                                    } else {
                                        sites.join("+")
                                    },
                                    observed.job_state,
                                    if observed.job_sites.is_empty() {
                                        "-".into()
                                    } else {
                                        observed.job_sites.join("+")
                                    }
                                ),
                            );
                            if let Some((at, site, up)) = observed.site_changes.last() {
                                record.after = Some(format!(
                                    "site {site} {}",
                                    if *up { "up" } else { "down" }
                                ));
                                record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
                            }
                            record.job_sites = Some(sites.clone());
                            observed.records.push(record);
                        }
                        observed.job_sites = sites;
                        observed.job_state = state;
                        observed.job_revision = job.revision;
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

fn action_name(action: Action) -> &'static str {
    match action {
        Action::KillLeader => "kill-leader",
        Action::RestartCoordinators => "restart-coordinators",
        Action::Partition => "partition",
        Action::Heal => "heal",
        Action::KillAgent => "kill-agent",
        Action::RestartAgent => "restart-agent",
        Action::SetLoss => "set-loss",
        Action::SetRate => "set-rate",
    }
}

/// Retries `f` until it gives `Some`, for at most `limit`.
async fn until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = f().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {} s waiting for {what}", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A progress line on stderr.
fn progress(quiet: bool, line: &str) {
    if !quiet {
        eprintln!("{line}");
    }
}

pub fn rehearse(args: &RehearseArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let loaded = load(args.scenario.as_deref())?;
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (dir, temp) = match &args.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--keep: cannot create {}", dir.display()))?;
            if std::fs::read_dir(dir)
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
            {
                return Err(anyhow!("--keep: {} is not empty", dir.display()).into());
            }
            (dir.clone(), None)
        }
        None => {
            let temp = tempdir()?;
            (temp.clone(), Some(temp))
        }
    };
    let result = runtime.block_on(play(args, &loaded, &exe, &dir));
    runtime.shutdown_timeout(Duration::from_secs(2));
    if let Some(temp) = temp {
        let _ = std::fs::remove_dir_all(temp);
    }
    let mut report = result?;
    report.directory = args.keep.clone();
    match args.output {
        Output::Json => {
            let text = serde_json::to_string_pretty(&report).map_err(anyhow::Error::from)?;
            writeln!(out, "{text}")?;
        }
        Output::Text => print_report(&report, out)?,
    }
    Ok(())
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let dir = base.join(format!(
            "longhaul-rehearsal-{}-{attempt}",
            std::process::id()
        ));
        if std::fs::create_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    bail!("cannot create a directory under {}", base.display())
}

async fn play(
    args: &RehearseArgs,
    loaded: &Loaded,
    exe: &Path,
    dir: &Path,
) -> anyhow::Result<Report> {
    // Progress goes to stderr whatever the output format (the report, to
    // stdout, comes at the end).
    let quiet = false;
    let Loaded {
        scenario,
        topology,
        job,
    } = loaded;
    let seed = args.seed.unwrap_or(scenario.seed);
    let lease_ttl = Duration::from(args.lease_ttl);
    let host = IpAddr::V4(Ipv4Addr::LOCALHOST);

    // The emulator: every WAN link of the topology, with the impairments.
    let emulator = Emulator::new(seed, emulator::scenario_links(topology, Some(scenario)))
        .context("cannot start the emulator")?;
    let linked = |a: &str, b: &str| topology.links.iter().any(|l| l.joins(a, b));
    let mut proxies = Vec::new();

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
    let replica_addrs: Vec<SocketAddr> =
        (0..count).map(|_| free_port()).collect::<Result<_, _>>()?;
    // reach[(from site, replica index)] = address
    let mut reach: BTreeMap<(String, usize), SocketAddr> = BTreeMap::new();
    for site in &topology.sites {
        for (j, target) in replica_addrs.iter().enumerate() {
            let at = &replica_sites[j];
            if *at == site.id {
                reach.insert((site.id.clone(), j), *target);
            } else if linked(&site.id, at) {
                let (tcp, udp) = emulator
                    .expose(&site.id, at, host, *target)
                    .await
                    .with_context(|| format!("cannot expose replica {} to {}", j + 1, site.id))?;
                reach.insert((site.id.clone(), j), tcp.local_addr());
                proxies.push((tcp, udp));
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
    let lease_ttl = lease_ttl.max(tick * 30);
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
        let args = vec![
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
        let process = Process::start(
            exe,
            format!("replica {id}"),
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
    progress(
        quiet,
        &format!(
            "rehearsal {:?}: {} sites, {} replicas ({}), lease TTL {} ms, seed {seed}, files in {}",
            scenario.name,
            topology.sites.len(),
            count,
            replica_sites.join(", "),
            lease_ttl.as_millis(),
            dir.display()
        ),
    );

    // The console's view of the replicas (direct addresses of live ones).
    let live: Arc<Mutex<Vec<SocketAddr>>> = Arc::new(Mutex::new(replica_addrs.clone()));
    let shared: Shared = Arc::new(Mutex::new(Observed::default()));
    let leader_addr = || async {
        for r in &replicas {
            let Ok(mut c) = client(r.addr) else { continue };
            if let Ok(response) = c
                .get_cluster(pb::GetClusterRequest { allow_stale: true })
                .await
            {
                let leader = response.into_inner().leader_id;
                if let Some(l) = replicas.iter().find(|x| x.id == leader) {
                    return Some(l.addr);
                }
            }
        }
        None
    };
    let leader = until(
        Duration::from_secs(60),
        "a coordinator leader",
        &leader_addr,
    )
    .await?;
    progress(quiet, "  coordinator leader elected");

    // Agents: one per site, reaching remote replicas and agents through
    // the emulator.
    let topology_file = dir.join("topology.toml");
    std::fs::write(&topology_file, topology.to_toml()?)
        .with_context(|| format!("cannot write {}", topology_file.display()))?;
    let data: BTreeMap<String, SocketAddr> = topology
        .sites
        .iter()
        .map(|s| Ok((s.id.clone(), free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let mut agents: BTreeMap<String, Process> = BTreeMap::new();
    for site in &topology.sites {
        let coordinators: Vec<String> = (0..count)
            .filter_map(|j| reach.get(&(site.id.clone(), j)))
            .map(|a| format!("\"http://{a}\""))
            .collect();
        let mut peers = Vec::new();
        for other in &topology.sites {
            if other.id == site.id || !linked(&site.id, &other.id) {
                continue;
            }
            let (tcp, udp) = emulator
                .expose(&site.id, &other.id, host, data[&other.id])
                .await
                .with_context(|| format!("cannot expose {}'s agent to {}", other.id, site.id))?;
            peers.push(format!("{} = \"{}\"", other.id, udp.local_addr()));
            proxies.push((tcp, udp));
        }
        let config = format!(
            r#"site = "{site}"
coordinators = [{coordinators}]
plaintext = true
data_listen = "{data}"
status_listen = "{status}"
state_dir = {state:?}
rescan_interval = "30 s"
call_timeout = "2 s"

[inventory]
source = "static"
site = "{site}"
static = {{ file = {topology:?} }}

[probe]
interval = "10 s"
pings = 10
loss_datagrams = 100
throughput_duration = "300 ms"
seed = {seed}
peer_addresses = {{ {peers} }}
"#,
            site = site.id,
            coordinators = coordinators.join(", "),
            data = data[&site.id],
            status = free_port()?,
            state = dir.join(format!("agent-{}", site.id)),
            topology = topology_file,
            peers = peers.join(", "),
        );
        let path = dir.join(format!("agent-{}.toml", site.id));
        std::fs::write(&path, config)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let process = Process::start(
            exe,
            format!("agent {}", site.id),
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
    let expected = topology.sites.len();
    until(Duration::from_secs(90), "every site registered", || async {
        let mut c = client(leader).ok()?;
        let sites = c
            .list_sites(pb::ListSitesRequest { allow_stale: true })
            .await
            .ok()?
            .into_inner()
            .sites;
        (sites
            .iter()
            .filter(|s| s.state() == pb::SiteState::Up)
            .count()
            == expected)
            .then_some(())
    })
    .await?;
    progress(
        quiet,
        &format!("  {expected} sites registered by their agents"),
    );

    // Links, then the job.
    let mut c = client(leader)?;
    for link in &topology.links {
        c.put_link(pb::PutLinkRequest {
            link: Some(link_to_wire(link)),
            expected_revision: 0,
        })
        .await
        .map_err(|s| anyhow!("cannot configure a link: {}", s.message()))?;
    }
    let submitted = c
        .submit_job(pb::SubmitJobRequest {
            spec: Some(job_to_wire(job)),
            expected_revision: 0,
        })
        .await
        .map_err(|s| anyhow!("cannot submit the job: {}", s.message()))?
        .into_inner();
    let placed = submitted
        .job
        .ok_or_else(|| anyhow!("the coordinator returned no job"))?;
    let revision = submitted.header.map_or(0, |h| h.revision);
    let plan = placed.plan.clone().unwrap_or_default();
    let plan_report = PlanReport {
        mode: plan.cross_site_mode.clone(),
        sites: plan_sites(&placed),
        gpus: u64::from(plan.tensor_parallel)
            * u64::from(plan.pipeline_parallel)
            * u64::from(plan.data_parallel),
        step_seconds: plan.predicted_step.map_or(0.0, |s| s.total_ns as f64 / 1e9),
    };
    progress(
        quiet,
        &format!(
            "  job {} {}: {} tp={} pp={} dp={} on {}, predicted step {:.2} s",
            placed.id,
            job_state(&placed),
            plan_report.mode,
            plan.tensor_parallel,
            plan.pipeline_parallel,
            plan.data_parallel,
            plan_report.sites.join(" + "),
            plan_report.step_seconds
        ),
    );

    // Observe, then play the timeline.
    let t0 = Instant::now();
    {
        let mut observed = lock(&shared);
        observed.job_sites = plan_report.sites.clone();
        observed.job_state = job_state(&placed).to_string();
        observed.job_revision = placed.revision;
        for site in &topology.sites {
            observed.sites.insert(site.id.clone(), true);
        }
    }
    spawn_leader_watch(live.clone(), shared.clone(), t0);
    spawn_change_watch(live.clone(), shared.clone(), t0, revision);
    let duration = Duration::from(scenario.duration);
    let mut timeline: Vec<&TimelineEvent> = scenario.timeline.iter().collect();
    timeline.sort_by_key(|e| e.at.as_nanos());
    let mut next_progress = Duration::from_secs(1);
    let mut pending = timeline.into_iter().peekable();
    while t0.elapsed() < duration {
        if let Some(event) = pending.next_if(|e| Duration::from(e.at) <= t0.elapsed()) {
            let t = t0.elapsed();
            let detail = perform(
                event,
                &emulator,
                &mut replicas,
                &mut agents,
                &live,
                &shared,
                exe,
            )?;
            progress(quiet, &format!("  {:>6.1} s  {detail}", t.as_secs_f64()));
            let mut observed = lock(&shared);
            observed.actions.push((t, event.action, event.site.clone()));
            let mut record = Record::new(t, "action", detail);
            record.site = event.site.clone();
            observed.records.push(record);
            continue;
        }
        if t0.elapsed() >= next_progress {
            next_progress += Duration::from_secs(1);
            let observed = lock(&shared);
            let up = observed.sites.values().filter(|u| **u).count();
            progress(
                quiet,
                &format!(
                    "  {:>6.1} s  leader {}  sites up {up}/{}  job {} on {}",
                    t0.elapsed().as_secs_f64(),
                    observed.leader,
                    observed.sites.len(),
                    observed.job_state,
                    if observed.job_sites.is_empty() {
                        "-".into()
                    } else {
                        observed.job_sites.join("+")
                    }
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let links = emulator
        .statuses()
        .into_iter()
        .map(|s| LinkReport {
            direction: s.id(),
            packets_in: s.stats.packets_in,
            bytes_delivered: s.stats.bytes_delivered,
            drops_queue: s.stats.drops.queue,
            drops_loss: s.stats.drops.loss,
            drops_down: s.stats.drops.down,
            retransmissions: s.retransmissions,
            queue_high_water_bytes: s.stats.queue_high_water_bytes,
            lateness_p50_us: s.lateness.p50_us,
            lateness_p99_us: s.lateness.p99_us,
        })
        .collect();
    let mut records = lock(&shared).records.clone();
    records.sort_by_key(|r| r.t_ms);
    for agent in agents.values_mut() {
        agent.kill();
    }
    for replica in &mut replicas {
        replica.process.kill();
    }
    drop(proxies);
    Ok(Report {
        scenario: scenario.name.clone(),
        seed,
        lease_ttl_ms: lease_ttl.as_millis() as u64,
        replicas: replicas.iter().map(|r| (r.id, r.site.clone())).collect(),
        plan: plan_report,
        timeline: records,
        links,
        directory: None,
    })
}

/// Performs one timeline step; says what was done.
fn perform(
    event: &TimelineEvent,
    emulator: &Emulator,
    replicas: &mut [ReplicaProcess],
    agents: &mut BTreeMap<String, Process>,
    live: &Arc<Mutex<Vec<SocketAddr>>>,
    shared: &Shared,
    exe: &Path,
) -> anyhow::Result<String> {
    let site = event.site.clone().unwrap_or_default();
    let set_live = |replicas: &[ReplicaProcess]| {
        *live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = replicas
            .iter()
            .filter(|r| r.process.running())
            .map(|r| r.addr)
            .collect();
    };
    Ok(match event.action {
        Action::KillLeader => {
            let leader = lock(shared).leader;
            match replicas
                .iter_mut()
                .find(|r| r.id == leader && r.process.running())
            {
                Some(replica) => {
                    replica.process.kill();
                    set_live(replicas);
                    format!("killed the leader, replica {leader} (SIGKILL)")
                }
                None => "kill-leader: no leader is known; nothing killed".to_string(),
            }
        }
        Action::RestartCoordinators => {
            let mut restarted = Vec::new();
            for replica in replicas.iter_mut().filter(|r| !r.process.running()) {
                replica.process.spawn(exe)?;
                restarted.push(replica.id.to_string());
            }
            set_live(replicas);
            if restarted.is_empty() {
                "restart-coordinators: none was down".to_string()
            } else {
                format!("restarted replica(s) {}", restarted.join(", "))
            }
        }
        Action::Partition => {
            emulator.set_down(&site, None, true)?;
            format!("partitioned {site}: every link of {site} cut")
        }
        Action::Heal => {
            emulator.set_down(&site, None, false)?;
            format!("healed {site}")
        }
        Action::KillAgent => {
            if let Some(agent) = agents.get_mut(&site) {
                agent.kill();
            }
            format!("killed {site}'s agent (SIGKILL)")
        }
        Action::RestartAgent => {
            if let Some(agent) = agents.get_mut(&site)
                && !agent.running()
            {
                agent.spawn(exe)?;
            }
            format!("restarted {site}'s agent")
        }
        Action::SetLoss | Action::SetRate => {
            let [a, b] = event.link.clone().unwrap_or_default();
            let change = LinkChange {
                loss: event.loss,
                rate_bits_per_second: event.rate.map(|r| r.bits_per_second()),
                ..LinkChange::default()
            };
            emulator.set(&a, &b, false, &change)?;
            match (event.loss, event.rate) {
                (Some(loss), _) => format!("loss on {a}–{b} set to {loss}"),
                (_, Some(rate)) => format!("rate of {a}–{b} set to {rate}"),
                _ => format!("{a}–{b} unchanged"),
            }
        }
    })
}

fn print_report(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "rehearsal {:?}, seed {}, lease TTL {} ms",
        report.scenario, report.seed, report.lease_ttl_ms
    )?;
    writeln!(
        out,
        "replicas: {}",
        report
            .replicas
            .iter()
            .map(|(id, site)| format!("{id}@{site}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        out,
        "plan: {} on {} ({} GPUs), predicted step {:.2} s",
        report.plan.mode,
        report.plan.sites.join(" + "),
        thousands(report.plan.gpus),
        report.plan.step_seconds
    )?;
    writeln!(out, "\nwhat happened (t since the job was placed)")?;
    let mut table = Table::new(&[
        ("t", true),
        ("what", false),
        ("took", true),
        ("after", false),
    ]);
    for r in &report.timeline {
        table.row(vec![
            format!("{:.1} s", r.t_ms as f64 / 1000.0),
            r.detail.clone(),
            r.took_ms.map_or(String::new(), |t| format!("{t} ms")),
            r.after.clone().unwrap_or_default(),
        ]);
    }
    write!(out, "{}", table.render(2))?;
    writeln!(out, "\nemulated links")?;
    let mut links = Table::new(&[
        ("direction", false),
        ("packets", true),
        ("delivered", true),
        ("drops queue/loss/down", true),
        ("retransmits", true),
        ("queue peak", true),
        ("late p50/p99", true),
    ]);
    for l in &report.links {
        links.row(vec![
            l.direction.clone(),
            thousands(l.packets_in),
            units::human_bytes(l.bytes_delivered as f64),
            format!("{}/{}/{}", l.drops_queue, l.drops_loss, l.drops_down),
            thousands(l.retransmissions),
            units::human_bytes(l.queue_high_water_bytes as f64),
            format!(
                "{}/{}",
                human_ns(l.lateness_p50_us * 1000),
                human_ns(l.lateness_p99_us * 1000)
            ),
        ]);
    }
    write!(out, "{}", links.render(2))?;
    if let Some(dir) = &report.directory {
        writeln!(out, "\nconfigs, stores and logs kept in {}", dir.display())?;
    }
    Ok(())
}
