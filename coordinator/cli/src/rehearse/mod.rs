//! `longhaul rehearse`: a distance scenario played against the real
//! coordinator and agents, on this machine.
//!
//! Every component is a process of this binary (`longhaul internal replica`
//! and `longhaul internal agent`): the coordinator replicas at the sites the
//! scenario puts them, one agent per site. Whatever crosses sites goes
//! through the emulated link of that pair of sites: raft traffic between
//! replicas, an agent's calls to replicas elsewhere, probes between agents.
//! In proxy mode (the default) the processes dial the emulator's proxies;
//! in packet mode (`--mode packet`) each process runs in its site's
//! network namespace and the kernel's own TCP and UDP cross the links
//! end to end (see `network`). The rehearsal itself is the operator's
//! console: it talks to the replicas directly, never through a link, and
//! watches what they commit.
//!
//! It registers the inventories (each agent reads its site from the
//! scenario's topology), configures the WAN links, submits the job and shows
//! the plan, plays the fault timeline, and reports what happened with the
//! time each thing took: leader changes after a kill, sites going down after
//! a partition and up after a heal, re-plans after a site changed, and the
//! emulator's counters per link direction.
//!
//! This module holds the arguments, the `internal` roles, loading and the
//! order of a rehearsal; `network` is the emulator mode (where processes
//! live, how they and the console reach each other), `processes` starts the
//! replicas and agents behind the emulator, `observe` watches what the replicas commit, `timeline`
//! plays the faults, and `report` is what comes out.

mod network;
mod observe;
pub use observe::plan_sites;
mod processes;
mod report;
mod simulated;
mod timeline;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use clap::{Args, Subcommand};
use longhaul_core::units;
use longhaul_core::{JobSpec, Scenario, Topology};
use longhaul_proto::v1 as pb;
use longhaul_simulations::emulator::{self, Emulator};

use super::emulate::Mode;
use super::{Failure, Output};
use longhaul_coordinator::server::convert::{job_to_wire, link_to_wire};
use network::Network;
use observe::{
    LiveReplicas, Observed, Shared, job_state, lock, spawn_change_watch, spawn_leader_watch,
};
use processes::Wan;
pub use report::{
    ExchangeLinkRow, LinkReport, PlanReport, Record, Report, RoundRow, RoundsReport, SiteReport,
};

const REHEARSE_HELP: &str = "\
Modes:
  --mode proxy (the default) needs no privileges. Every replica and agent
  listens on a loopback port and reaches other sites through the emulator's
  proxies for that pair of sites. UDP (the agents' probes) is faithful; TCP
  (gRPC, raft) is a relay, so the processes' own TCP runs over loopback and
  never sees the link's loss or queue.

  --mode packet gives every site of the topology's links its own network
  namespace (lh-PID-RUN-SITE) with the address 198.18.0.N behind a TUN
  device; each replica and agent is started inside its site's namespace,
  listens on the site's address and reaches the others at theirs, so the
  kernel's TCP and UDP run end to end through the link model. The
  rehearsal's console reaches each replica from inside that replica's own
  namespace, never through a link. Faults are the same in both modes.
  --congestion-control sets the sites' default TCP congestion control (a
  namespace may only default to one in the host's
  net.ipv4.tcp_allowed_congestion_control).
  Needs Linux, root (CAP_SYS_ADMIN and CAP_NET_ADMIN), /dev/net/tun and
  iproute2; without them the error names what is missing, and --mode proxy
  still works. The namespaces are removed when the rehearsal ends, fails
  or is stopped (Ctrl-C, SIGTERM); ones a killed rehearsal left are removed
  by the next one.

Examples:
  longhaul rehearse
  longhaul rehearse deploy/scenarios/quick-failover.toml --output json
  sudo longhaul rehearse --mode packet
  sudo longhaul rehearse --mode packet --congestion-control reno";

const BUNDLED_SCENARIO: &str = include_str!("../../../../deploy/scenarios/two-campuses-80km.toml");
const BUNDLED_TOPOLOGY: &str = include_str!("../../../../deploy/examples/two-campuses-80km.toml");
const BUNDLED_JOB: &str = include_str!("../../../../deploy/examples/llama-70b.job.toml");

#[derive(Debug, Args)]
#[command(after_long_help = REHEARSE_HELP)]
pub struct RehearseArgs {
    /// The scenario file; the bundled two-campuses-80km scenario (leader
    /// kill, then the south campus cut off and healed) when omitted.
    pub scenario: Option<PathBuf>,
    /// How the processes reach the emulated links. `proxy`: loopback
    /// proxies, no privileges, TCP relayed. `packet`: every replica and
    /// agent inside its site's network namespace, kernel TCP and UDP end to
    /// end through the links; needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN),
    /// /dev/net/tun and iproute2. See "Modes" below.
    #[arg(long, value_enum, default_value_t = Mode::Proxy)]
    pub mode: Mode,
    /// `--mode packet`: the sites' default TCP congestion control (reno,
    /// cubic, bbr: one the kernel offers); the host's default when omitted.
    #[arg(long, value_name = "NAME")]
    pub congestion_control: Option<String>,
    /// Seed of the emulated links and the probes; the scenario's when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
    /// TTL of the agents' leases: how long a silent site stays up. The
    /// coordinator's default when omitted: 16 of the replicas' ticks (1.6 s
    /// with the 100 ms tick of replicas less than 10,000 km apart).
    #[arg(long)]
    pub lease_ttl: Option<units::Duration>,
    /// Keep the rehearsal's files (configs, stores, logs) in this directory
    /// (created; must be empty). A temporary directory, removed at the end,
    /// when omitted.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Serve every replica's and agent's Prometheus metrics on a loopback
    /// port (printed as they start), and at the end save a scrape of each,
    /// and the emulator's, in this directory (created) as NAME.prom:
    /// `replica-1.prom`, `agent-paris.prom`, `emulator.prom`. Proxy mode
    /// only (in packet mode the processes listen inside namespaces).
    #[arg(long, value_name = "DIR")]
    pub metrics: Option<PathBuf>,
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
    exit_with_parent();
    match command {
        InternalCommand::Replica(args) => longhaul_coordinator::daemon::run_blocking(*args)?,
        InternalCommand::Agent { config, log } => {
            longhaul_site_agent::daemon::run_blocking(&config, &log)?;
        }
    }
    Ok(())
}

/// The environment variable in which a rehearsal gives its processes its pid.
pub(super) const PARENT_PID_ENV: &str = "LONGHAUL_REHEARSAL_PID";

/// Exits this process once the rehearsal that started it is gone: a
/// rehearsal killed with SIGKILL cannot kill its children, which are then
/// reparented, so the parent id changes. Without this an orphaned replica
/// or agent would run on, holding its ports and, in packet mode, its
/// site's namespace (alive, if no longer named, while a process is in it).
/// Polled: `PR_SET_PDEATHSIG` would fire when the *thread* that started
/// the process ends, and packet mode starts processes from a short-lived
/// thread that entered the site's namespace.
///
/// The rehearsal names itself in [`PARENT_PID_ENV`]: a process started just
/// before its rehearsal was killed is already reparented when it first
/// looks, and would take its new parent for the one to watch.
fn exit_with_parent() {
    let parent = std::env::var(PARENT_PID_ENV)
        .ok()
        .and_then(|pid| pid.parse::<u32>().ok())
        .unwrap_or_else(std::os::unix::process::parent_id);
    let watch = std::thread::Builder::new()
        .name("parent watch".to_string())
        .spawn(move || {
            loop {
                if std::os::unix::process::parent_id() != parent {
                    eprintln!(
                        "the rehearsal that started this process (pid {parent}) is gone: exiting"
                    );
                    std::process::exit(1);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
    if let Err(error) = watch {
        eprintln!("cannot watch the parent process: {error}");
    }
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

/// Retries `f` until it gives `Some`, for at most `limit`.
async fn until<T, F, Fut>(limit: Duration, what: &str, f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    until_alive(limit, what, || None, f).await
}

/// [`until`], failing at once with what `died` says when it says that a
/// process the wait depends on has stopped.
async fn until_alive<T, F, Fut>(
    limit: Duration,
    what: &str,
    mut died: impl FnMut() -> Option<String>,
    mut f: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = f().await {
            return Ok(value);
        }
        if let Some(why) = died() {
            bail!("stopped waiting for {what}: {why}");
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
    if args.mode == Mode::Proxy && args.congestion_control.is_some() {
        return Err(anyhow!(
            "--congestion-control is for --mode packet: in --mode proxy, the processes' TCP \
             runs over loopback"
        )
        .into());
    }
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
            // Absolute: the agents resolve the paths in their configs
            // against the config file's folder, not this process's.
            let dir = std::fs::canonicalize(dir)
                .with_context(|| format!("--keep: cannot resolve {}", dir.display()))?;
            (dir, None)
        }
        None => {
            let temp = tempdir()?;
            (temp.clone(), Some(temp))
        }
    };
    // A stop signal drops the rehearsal where it is: its processes are
    // killed and, in packet mode, its namespaces removed.
    let (stopped, result) = runtime.block_on(async {
        tokio::select! {
            // The signal first: its handlers are in place before any
            // process starts.
            biased;
            stopped = super::emulate::stop_signal() => (true, match stopped {
                Ok(()) => Err(anyhow!(
                    "stopped by a signal before the end: its processes were killed (and in packet mode its namespaces removed)"
                )),
                Err(Failure::Other(error) | Failure::Unsatisfiable(error)) => Err(error),
                Err(Failure::Invalid(error)) => Err(error.into()),
            }),
            result = play(args, &loaded, &exe, &dir) => (false, result),
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    // A rehearsal that failed on its own keeps its directory: the
    // processes' logs say why. One stopped by a signal removes it.
    let result = match (result, temp) {
        (Err(error), Some(temp)) if !stopped => Err(error.context(format!(
            "the rehearsal failed; its processes' logs are kept in {}",
            temp.display()
        ))),
        (result, Some(temp)) => {
            let _ = std::fs::remove_dir_all(temp);
            result
        }
        (result, None) => result,
    };
    let mut report = result?;
    report.directory = args.keep.clone();
    match args.output {
        Output::Json => {
            let text = serde_json::to_string_pretty(&report).map_err(anyhow::Error::from)?;
            writeln!(out, "{text}")?;
        }
        Output::Text => report::print_report(&report, out)?,
    }
    Ok(())
}

/// `--metrics`: the processes' metrics addresses, and the rehearsal's own
/// exporter for the emulator it runs in-process.
struct MetricsSaver {
    dir: PathBuf,
    targets: processes::MetricsTargets,
    emulator: metrics_exporter_prometheus::PrometheusHandle,
}

impl MetricsSaver {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--metrics: cannot create {}", dir.display()))?;
        let emulator = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .context("--metrics: cannot install the emulator's metrics recorder")?;
        emulator::metrics::describe();
        Ok(Self {
            dir: dir.to_path_buf(),
            targets: Vec::new(),
            emulator,
        })
    }

    /// Saves a scrape of every running process (one that does not answer
    /// is reported and skipped) and the emulator's figures; returns how many
    /// processes answered.
    async fn save(&self, emulator: &Emulator) -> usize {
        let mut saved = 0;
        for (name, addr) in &self.targets {
            let path = self.dir.join(format!("{name}.prom"));
            let result = scrape(*addr)
                .await
                .and_then(|text| std::fs::write(&path, text).map_err(anyhow::Error::from));
            match result {
                Ok(()) => saved += 1,
                Err(error) => progress(false, &format!("  {name}: no metrics saved: {error:#}")),
            }
        }
        emulator::metrics::record(&emulator.statuses());
        let path = self.dir.join("emulator.prom");
        if let Err(error) = std::fs::write(&path, self.emulator.render()) {
            progress(
                false,
                &format!("  cannot write {}: {error}", path.display()),
            );
        }
        saved
    }
}

/// One GET of `http://addr/metrics` (HTTP/1.0: the body ends with the
/// connection), bounded by 5 s and 64 MiB.
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.take(64 << 20).read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| anyhow!("{addr}: no answer in 5 s"))??;
    let text = String::from_utf8(response).map_err(|_| anyhow!("{addr}: not UTF-8"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{addr}: not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        bail!("{addr}: {status}");
    }
    Ok(body.to_string())
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
    let lease_ttl = args.lease_ttl.map(Duration::from);

    // The emulator: every WAN link of the topology, with the impairments.
    let emulator = Emulator::new(seed, emulator::scenario_links(topology, Some(scenario)))
        .context("cannot start the emulator")?;
    // Packet mode: the one strong reference, declared before the processes
    // so that it drops (removing the namespaces) after they are killed,
    // on every path out of here.
    let packet = match args.mode {
        Mode::Packet => Some(network::start_packet(
            &emulator,
            args.congestion_control.as_deref(),
        )?),
        Mode::Proxy => None,
    };
    let network = packet.as_ref().map_or(Network::Proxy, Network::packet);
    let mut wan = Wan {
        emulator: &emulator,
        network: network.clone(),
        topology,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        proxies: Vec::new(),
    };

    let mut metrics = match &args.metrics {
        Some(_) if args.mode == Mode::Packet => {
            bail!(
                "--metrics: proxy mode only (in packet mode the processes listen inside their namespaces)"
            )
        }
        Some(metrics_dir) => Some(MetricsSaver::start(metrics_dir)?),
        None => None,
    };
    let mut replicas = processes::start_replicas(
        &mut wan,
        scenario,
        lease_ttl,
        (exe, dir),
        metrics.as_mut().map(|m| &mut m.targets),
    )
    .await?;
    let lease_ttl = replicas.lease_ttl;
    progress(
        quiet,
        &format!(
            "rehearsal {:?} in {} mode: {} sites, {} replicas ({}), lease TTL {} ms, seed {seed}, files in {}",
            scenario.name,
            mode_name(args.mode),
            topology.sites.len(),
            replicas.sites.len(),
            replicas.sites.join(", "),
            lease_ttl.as_millis(),
            dir.display()
        ),
    );

    // The console's view of the replicas (direct addresses of live ones).
    let live: LiveReplicas = Arc::new(Mutex::new(processes::running_addrs(&replicas.processes)));
    let shared: Shared = Arc::new(Mutex::new(Observed::default()));
    let leader_addr = || async {
        for r in &replicas.processes {
            let Ok(mut c) = network.client(r.addr) else {
                continue;
            };
            if let Ok(response) = c
                .get_cluster(pb::GetClusterRequest { allow_stale: true })
                .await
            {
                let leader = response.into_inner().leader_id;
                if let Some(l) = replicas.processes.iter().find(|x| x.id == leader) {
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
    if let Some(packet) = &packet {
        for site in packet.sites() {
            progress(
                quiet,
                &format!(
                    "  site {} at {} in network namespace {} (tcp {}; `ip netns exec {} ...` to look)",
                    site.site,
                    site.address,
                    site.namespace,
                    site.congestion_control,
                    site.namespace
                ),
            );
        }
    }
    progress(quiet, "  coordinator leader elected");

    // Agents: one per site, reaching remote replicas and agents through
    // the emulator.
    let (mut agents, agent_status) = processes::start_agents(
        &mut wan,
        &replicas,
        seed,
        &scenario.exchange,
        scenario.training.is_some(),
        (exe, dir),
        metrics.as_mut().map(|m| &mut m.targets),
    )
    .await?;
    if let Some(metrics) = &metrics {
        for (name, addr) in &metrics.targets {
            progress(
                quiet,
                &format!("  {name}: metrics at http://{addr}/metrics"),
            );
        }
    }
    let expected = topology.sites.len();
    let agents_died = || agents.values_mut().find_map(processes::Process::died);
    until_alive(
        Duration::from_secs(90),
        "every site registered",
        agents_died,
        || async {
            let mut c = network.client(leader).ok()?;
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
        },
    )
    .await?;
    progress(
        quiet,
        &format!("  {expected} sites registered by their agents"),
    );

    // Links, then the job.
    let mut c = network.client(leader)?;
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
    let plan_report = report::plan_report(&placed);
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
    spawn_leader_watch(network.clone(), live.clone(), shared.clone(), t0);
    spawn_change_watch(&network, live.clone(), shared.clone(), t0, revision);
    let mut trainers = match &scenario.training {
        Some(training) => {
            let trainers = processes::start_trainers(
                &training.command,
                &plan_report.sites,
                &placed.id,
                seed,
                dir,
            )?;
            progress(
                quiet,
                &format!(
                    "  {} trainers started ({}); logs in {}/trainer-SITE.log",
                    trainers.len(),
                    training.command.join(" "),
                    dir.display()
                ),
            );
            trainers
        }
        None => Vec::new(),
    };
    let mut stage = timeline::Stage {
        emulator: &emulator,
        replicas: &mut replicas.processes,
        agents: &mut agents,
        live: &live,
        shared: &shared,
        exe,
    };
    let stage_play = timeline::play(scenario, &mut stage, t0, quiet);
    if trainers.is_empty() {
        stage_play.await?;
    } else {
        // Until every trainer has exited, or the scenario's duration.
        let trainers_done = async {
            while trainers.iter_mut().any(processes::Trainer::poll) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::select! {
            played = stage_play => played?,
            () = trainers_done => progress(quiet, "  every trainer has exited"),
        }
    }

    let links = report::link_reports(&emulator);
    let exchanges = agent_exchanges(&network, &agent_status).await;
    let training = scenario
        .training
        .as_ref()
        .map(|_| report::training_report(&mut trainers, dir, &exchanges, &links));
    drop(trainers);
    let mut records = lock(&shared).records.clone();
    records.sort_by_key(|r| r.t_ms);
    if let Some(metrics) = &metrics {
        let saved = metrics.save(&emulator).await;
        progress(
            quiet,
            &format!(
                "  metrics of {saved} processes and the emulator saved in {}",
                metrics.dir.display()
            ),
        );
    }
    for agent in agents.values_mut() {
        agent.kill();
    }
    for replica in &mut replicas.processes {
        replica.process.kill();
    }
    // After the processes are stopped, so that they do not run while the
    // simulation times encoding on this machine.
    let played = emulator::scenario_links(topology, Some(scenario));
    let simulator = simulated::Simulator::new(
        &played,
        processes::connections_per_peer(&scenario.exchange),
        seed,
    )
    .with_coordinators(replicas.processes.iter().map(|r| r.site.clone()))
    .timing_encoding()
    .keeping_connections();
    // The planner's cost model on the links as played: at an impairment's
    // rate where the scenario sets one.
    let mut as_played = topology.clone();
    for (wan, configured) in as_played.links.iter_mut().zip(&topology.links) {
        if let Some(rate) = scenario
            .impairments_of(configured)
            .filter_map(|i| i.rate)
            .last()
        {
            wan.link_rate = rate;
        }
    }
    // Blocking: the simulation and the timed encoding run here.
    let rounds = tokio::task::block_in_place(|| {
        report::rounds_report(
            &lock(&shared).rounds,
            &exchanges,
            &as_played,
            if scenario.training.is_some() {
                0
            } else {
                scenario.exchange.elements
            },
            &simulator,
        )
    });
    drop(wan);
    let sites = packet
        .as_ref()
        .map_or_else(Vec::new, |p| report::site_reports(p));
    let unroutable_packets = packet.as_ref().map(|p| p.unroutable_packets());
    if let Some(packet) = packet {
        // Blocking: stops the TUN readers and runs `ip netns del`.
        tokio::task::block_in_place(|| drop(packet));
    }
    Ok(Report {
        scenario: scenario.name.clone(),
        emulator_mode: mode_name(network.mode()).to_string(),
        sites,
        unroutable_packets,
        seed,
        lease_ttl_ms: lease_ttl.as_millis() as u64,
        replicas: replicas
            .processes
            .iter()
            .map(|r| (r.id, r.site.clone()))
            .collect(),
        plan: plan_report,
        timeline: records,
        rounds,
        training,
        links,
        directory: None,
    })
}

/// What every agent that answers says it exchanged, by site.
async fn agent_exchanges(
    network: &Network,
    status: &std::collections::BTreeMap<String, SocketAddr>,
) -> std::collections::BTreeMap<String, Vec<pb::FragmentExchange>> {
    let mut out = std::collections::BTreeMap::new();
    for (site, addr) in status {
        let Ok(mut client) = network.agent_client(*addr) else {
            continue;
        };
        let mut request = tonic::Request::new(pb::GetAgentStatusRequest {});
        request.set_timeout(Duration::from_secs(2));
        if let Ok(response) = client.get_status(request).await {
            out.insert(site.clone(), response.into_inner().exchanges);
        }
    }
    out
}

/// The mode as `--mode` spells it.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Proxy => "proxy",
        Mode::Packet => "packet",
    }
}
