//! Round commit latency: three real replica processes, agent stand-ins
//! over real gRPC, on loopback and with the replicas behind the emulator.
//!
//! Each setting starts three `longhaul internal replica` processes (the
//! `coordinator` daemon's flags), one per site of the process test's
//! topology (paris, virginia, tokyo). On loopback they reach each other
//! directly; behind the emulator every replica reaches every other through
//! the emulator's TCP proxy of the link between their sites, as `longhaul
//! rehearse` places replicas, with every link set to the same distance
//! (80 km, 6,600 km), no loss and no extra overhead. Replica timers are the
//! rehearsal's: a tick of max(RTT, 100 ms).
//!
//! The bench process stands in for the agents of the three sites: it
//! registers them, renews their leases, configures the links and submits
//! the bundled 400B job as DiLoCo replicas on the three sites with P
//! fragments. For every round the leader opens, every site reports each
//! fragment contributed, then applied with the agreed hash, all at once, to
//! the leader (as agents at the leader's site would); the last applied
//! report is held back and sent alone, once every other report was
//! answered. Per round it measures, from that last report's sending:
//! - its answer: the leader answers once it applied the report, and so the
//!   commit;
//! - the commit on the leader's round watch (`WatchRounds`);
//! - the commit on every replica's round watch (the slowest of the three);
//!
//! and, on the leader's watch, the round from its opening to its commit
//! (2 × M × P reports in three waves, and the last one).
//!
//! The aim (issue 13): p99 ≤ one RTT to a majority + 25 ms, the RTT taken
//! from the emulator's link configuration (5 µs/km one way, both ways):
//! with three replicas the leader needs one other, so the RTT to the
//! nearest one; 0 on loopback.
//!
//! Run (release profile; the whole run takes about two minutes):
//!
//! ```text
//! cargo bench -p longhaul-cli --bench round_commit
//! ```
//!
//! Environment: `ROUND_BENCH_ROUNDS` (measured rounds per setting, default
//! 100, after 3 not measured), `ROUND_BENCH_FRAGMENTS` (P, default 4),
//! `ROUND_BENCH_SETTINGS` (default `loopback,80,6600`: loopback, or a
//! distance in km behind the emulator), `ROUND_BENCH_SEED` (the emulator's
//! seed, default 13), `ROUND_BENCH_BIN` (default: the `longhaul` cargo
//! built), `ROUND_BENCH_LOG` (the replicas' `--log` filter, default `warn`;
//! e.g. `warn,raft=debug`), `ROUND_BENCH_KEEP` (`true`: keep the replicas'
//! data and logs, and print where), `ROUND_BENCH_DATA_DIR` (where the
//! replicas' data directories go: `/dev/shm` takes the disk's fsync out of
//! the figures, to tell its share of a tail). A setting stops after 50 s with the rounds it measured. Not run
//! in CI.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_coordinator::process::KillOnDrop;
use longhaul_coordinator::server::convert::{job_to_wire, link_to_wire, site_to_wire};
use longhaul_core::units::Distance;
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::agent_service_client::AgentServiceClient;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use longhaul_simulations::emulator::{Emulator, LinkSpec, TcpProxy, UdpProxy};
use longhaul_simulations::link::{LinkConfig, LossModel};
use tokio::task::JoinSet;
use tonic::transport::Channel;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TOPOLOGY: &str = include_str!("../../tests/cluster/fixtures/three-continents.toml");
const JOB: &str = include_str!("../../../deploy/examples/dense-400b.job.toml");
const SITES: [&str; 3] = ["paris", "virginia", "tokyo"];
const WARMUP_ROUNDS: usize = 3;
const RUN_LIMIT: Duration = Duration::from_secs(170);
const SETTING_LIMIT: Duration = Duration::from_secs(50);
const READY_LIMIT: Duration = Duration::from_secs(30);
const CALL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
struct Settings {
    rounds: usize,
    fragments: u32,
    settings: Vec<Option<f64>>,
    seed: u64,
    bin: PathBuf,
    /// The replicas' `--log` filter.
    log: String,
    /// Keep the replicas' data and logs after the run.
    keep: bool,
    /// Where the replicas' data directories go (default: the system's temporary directory).
    data_dir: Option<PathBuf>,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|_| format!("{name}: cannot parse {text:?}").into()),
    }
}

fn settings() -> Result<Settings, BoxError> {
    let list = env_or("ROUND_BENCH_SETTINGS", "loopback,80,6600".to_string())?;
    let settings = list
        .split(',')
        .map(|s| match s.trim() {
            "loopback" => Ok(None),
            km => km
                .parse::<f64>()
                .ok()
                .filter(|km| km.is_finite() && *km > 0.0)
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "ROUND_BENCH_SETTINGS: {km:?} is neither `loopback` nor a distance in km"
                    )
                }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let fragments = env_or("ROUND_BENCH_FRAGMENTS", 4u32)?;
    if fragments == 0 {
        return Err("ROUND_BENCH_FRAGMENTS must be at least 1".into());
    }
    Ok(Settings {
        rounds: env_or("ROUND_BENCH_ROUNDS", 100usize)?.max(1),
        fragments,
        settings,
        seed: env_or("ROUND_BENCH_SEED", 13u64)?,
        bin: PathBuf::from(env_or(
            "ROUND_BENCH_BIN",
            env!("CARGO_BIN_EXE_longhaul").to_string(),
        )?),
        log: env_or("ROUND_BENCH_LOG", "warn".to_string())?,
        keep: env_or("ROUND_BENCH_KEEP", false)?,
        data_dir: std::env::var_os("ROUND_BENCH_DATA_DIR").map(PathBuf::from),
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn free_addr() -> Result<SocketAddr, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn channel(addr: SocketAddr) -> Result<Channel, BoxError> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy(),
    )
}

fn timed<T>(body: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(body);
    request.set_timeout(CALL);
    request
}

fn hash(round: u64, fragment: u32) -> String {
    format!("bench/{round}/{fragment}")
}

/// The emulated link between two replica sites `km` apart: the fixture's
/// link rate, no loss, no overhead.
fn link_config(topology: &longhaul_core::Topology, a: &str, b: &str, km: f64) -> LinkConfig {
    let mut wan = topology
        .link(a, b)
        .cloned()
        .unwrap_or_else(|| topology.links[0].clone());
    wan.distance = Distance::from_km(km).unwrap_or(wan.distance);
    wan.overhead = longhaul_core::units::Duration::default();
    wan.loss = 0.0;
    let mut config = LinkConfig::from_wan_link(&wan);
    config.loss = LossModel::None;
    config
}

/// Three replica processes, and the emulator they reach each other through.
struct Cluster {
    addrs: Vec<SocketAddr>,
    _processes: Vec<KillOnDrop>,
    _proxies: Vec<(TcpProxy, UdpProxy)>,
    _emulator: Option<Emulator>,
    _dir: tempfile::TempDir,
    /// The RTT from each replica to its nearest peer, from the link config.
    rtt_to_majority: Duration,
}

async fn start_cluster(
    settings: &Settings,
    km: Option<f64>,
    topology: &longhaul_core::Topology,
) -> Result<Cluster, BoxError> {
    let mut dir = match &settings.data_dir {
        Some(parent) => tempfile::tempdir_in(parent)?,
        None => tempfile::tempdir()?,
    };
    if settings.keep {
        dir.disable_cleanup(true);
        eprintln!("replica logs and data kept in {}", dir.path().display());
    }
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect::<Result<_, _>>()?;
    let mut proxies = Vec::new();
    let mut reach: BTreeMap<(usize, usize), SocketAddr> = BTreeMap::new();
    let (emulator, rtt) = match km {
        None => {
            for i in 0..3 {
                for (j, addr) in addrs.iter().enumerate() {
                    reach.insert((i, j), *addr);
                }
            }
            (None, Duration::ZERO)
        }
        Some(km) => {
            let mut specs = Vec::new();
            let mut one_way = u64::MAX;
            for (i, a) in SITES.iter().enumerate() {
                for b in &SITES[i + 1..] {
                    let config = link_config(topology, a, b, km);
                    one_way = one_way.min(config.one_way_ns());
                    specs.push(LinkSpec::symmetric(a, b, config));
                }
            }
            let emulator = Emulator::new(settings.seed, specs)?;
            for (i, from) in SITES.iter().enumerate() {
                for (j, addr) in addrs.iter().enumerate() {
                    if i == j {
                        reach.insert((i, j), *addr);
                        continue;
                    }
                    let (tcp, udp) = emulator
                        .expose(from, SITES[j], "127.0.0.1".parse()?, *addr)
                        .await?;
                    reach.insert((i, j), tcp.local_addr());
                    proxies.push((tcp, udp));
                }
            }
            (Some(emulator), Duration::from_nanos(2 * one_way))
        }
    };
    let tick = rtt.max(Duration::from_millis(100));
    let mut processes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let cluster: Vec<String> = (0..3)
            .map(|j| format!("{}=http://{}", j + 1, reach[&(i, j)]))
            .collect();
        let log = std::fs::File::create(dir.path().join(format!("replica-{}.log", i + 1)))?;
        let child = KillOnDrop::spawn(
            format!("replica {}", i + 1),
            std::process::Command::new(&settings.bin)
                .args(["internal", "replica", "--id"])
                .arg((i + 1).to_string())
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--data-dir")
                .arg(dir.path().join(format!("replica-{}", i + 1)))
                .arg("--initial-cluster")
                .arg(cluster.join(","))
                .arg("--tick-interval")
                .arg(format!("{}ms", tick.as_millis()))
                // Leases long enough that a loaded machine does not expire
                // them: the bench is about rounds.
                .args(["--round-deadline", "60s", "--lease-ttl", "10s"])
                .arg("--log")
                .arg(&settings.log)
                .stdout(std::process::Stdio::null())
                .stderr(log),
        )?;
        processes.push(child);
    }
    Ok(Cluster {
        addrs,
        _processes: processes,
        _proxies: proxies,
        _emulator: emulator,
        _dir: dir,
        rtt_to_majority: rtt,
    })
}

/// The index of the leader, as a replica that knows one says.
async fn leader(addrs: &[SocketAddr]) -> Result<usize, BoxError> {
    let started = Instant::now();
    while started.elapsed() < READY_LIMIT {
        for addr in addrs {
            let mut c = CoordinatorClient::new(channel(*addr)?);
            if let Ok(cluster) = c
                .get_cluster(timed(pb::GetClusterRequest { allow_stale: true }))
                .await
            {
                let id = cluster.into_inner().leader_id as usize;
                if (1..=addrs.len()).contains(&id) {
                    return Ok(id - 1);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("no leader within {READY_LIMIT:?}").into())
}

/// Retries `attempt` every 100 ms until it succeeds or `READY_LIMIT` passed.
async fn retry<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let started = Instant::now();
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(status) if started.elapsed() > READY_LIMIT => {
                return Err(format!("{what}: {status}").into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Registers the sites and renews their leases at the leader, configures the
/// links and submits the job; returns the renewal tasks.
async fn set_up(
    leader: SocketAddr,
    topology: &longhaul_core::Topology,
    fragments: u32,
) -> Result<JoinSet<()>, BoxError> {
    let mut renewals = JoinSet::new();
    for site in SITES {
        let inventory = topology.site(site).map(site_to_wire);
        let agent = AgentServiceClient::new(channel(leader)?);
        let register = move || {
            let request = pb::RegisterRequest {
                site_id: site.into(),
                inventory: inventory.clone(),
                data_address: String::new(),
            };
            let mut agent = agent.clone();
            async move { agent.register(timed(request)).await }
        };
        let mut registered = retry("register", register.clone()).await?.into_inner();
        let every =
            Duration::from_millis(registered.lease_ttl_ms / 5).max(Duration::from_millis(50));
        let mut agent = AgentServiceClient::new(channel(leader)?);
        renewals.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let request = pb::KeepAliveRequest {
                    site_id: site.into(),
                    lease_id: registered.lease_id,
                };
                let Err(status) = agent.keep_alive(timed(request)).await else {
                    continue;
                };
                eprintln!(
                    "  warning: {site}'s lease renewal failed: {}",
                    status.message()
                );
                // The lease is gone (the site was marked down): register
                // again, as an agent does.
                if matches!(
                    status.code(),
                    tonic::Code::FailedPrecondition | tonic::Code::NotFound
                ) && let Ok(again) = register().await
                {
                    registered = again.into_inner();
                }
            }
        });
    }
    let mut coordinator = CoordinatorClient::new(channel(leader)?);
    for link in &topology.links {
        let request = pb::PutLinkRequest {
            link: Some(link_to_wire(link)),
            expected_revision: 0,
        };
        coordinator.put_link(timed(request)).await?;
    }
    let mut spec = longhaul_core::JobSpec::from_toml("dense-400b.job.toml", JOB)?;
    spec.constraints.allowed_sites = SITES.iter().map(|s| s.to_string()).collect();
    if let Some(diloco) = spec.diloco.as_mut() {
        diloco.fragments = Some(fragments);
        diloco.max_fragments = Some(fragments.max(64));
    }
    let mut request = tonic::Request::new(pb::SubmitJobRequest {
        spec: Some(job_to_wire(&spec)),
        expected_revision: 0,
    });
    request.set_timeout(Duration::from_secs(30));
    let job = coordinator
        .submit_job(request)
        .await?
        .into_inner()
        .job
        .ok_or("SubmitJob answered no job")?;
    let plan = job.plan.ok_or("the job was not placed")?;
    let mut sites: Vec<&str> = plan.stages.iter().map(|s| s.site_id.as_str()).collect();
    sites.sort_unstable();
    sites.dedup();
    if plan.cross_site_mode != "diloco" || sites.len() != SITES.len() {
        return Err(format!(
            "the job is placed as {} on {sites:?}, not DiLoCo replicas on the three sites",
            plan.cross_site_mode
        )
        .into());
    }
    Ok(renewals)
}

/// When each replica's round watch first saw a round open and committed.
#[derive(Debug, Default)]
struct Seen {
    opened: BTreeMap<(usize, u64), Instant>,
    committed: BTreeMap<(usize, u64), Instant>,
    /// Rounds as the leader's watch holds them.
    rounds: BTreeMap<u64, pb::OuterRound>,
}

type Shared = Arc<(Mutex<Seen>, tokio::sync::Notify)>;

/// Follows replica `index`'s round watch for paris (every round has all
/// three sites), folding reports into the rounds it holds.
async fn watch(
    index: usize,
    addr: SocketAddr,
    leader: usize,
    seen: Shared,
) -> Result<(), BoxError> {
    let mut agent = AgentServiceClient::new(channel(addr)?);
    let mut stream = agent
        .watch_rounds(pb::WatchRoundsRequest {
            site_id: SITES[0].into(),
            after_revision: 0,
        })
        .await?
        .into_inner();
    let mut rounds: BTreeMap<u64, pb::OuterRound> = BTreeMap::new();
    while let Some(event) = stream.message().await? {
        let at = Instant::now();
        let round = if let Some(round) = event.round {
            rounds.insert(round.round_id, round.clone());
            round
        } else if let Some(report) = event.report {
            let Some(round) = rounds.get_mut(&report.round_id) else {
                continue;
            };
            longhaul_proto::rounds::apply_round_report(round, &report);
            round.clone()
        } else {
            continue;
        };
        let (lock, notify) = &*seen;
        let mut seen = lock.lock().unwrap_or_else(|p| p.into_inner());
        let key = (index, round.round_id);
        match round.state() {
            pb::RoundState::Open => {
                seen.opened.entry(key).or_insert(at);
            }
            pb::RoundState::Committed => {
                seen.committed.entry(key).or_insert(at);
            }
            _ => {}
        }
        if index == leader {
            seen.rounds.insert(round.round_id, round);
        }
        drop(seen);
        notify.notify_waiters();
    }
    Ok(())
}

/// Waits until `done` holds of what the watches saw, at most `limit`.
async fn wait_seen<T>(
    seen: &Shared,
    limit: Duration,
    what: &str,
    mut done: impl FnMut(&Seen) -> Option<T>,
) -> Result<T, BoxError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let (lock, notify) = &**seen;
        let notified = notify.notified();
        if let Some(value) = done(&lock.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(value);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(format!("{what}: not within {limit:?}").into());
        }
    }
}

#[derive(Debug, Default)]
struct Measured {
    answered: Vec<Duration>,
    leader_watch: Vec<Duration>,
    every_replica: Vec<Duration>,
    open_to_commit: Vec<Duration>,
    /// Rounds that ended before this bench's reports did.
    skipped: usize,
}

/// Runs rounds until `rounds` were measured after the warm-up (or the
/// setting's time ran out).
async fn run_rounds(
    settings: &Settings,
    leader: SocketAddr,
    leader_index: usize,
    seen: &Shared,
) -> Result<Measured, BoxError> {
    let agent = AgentServiceClient::new(channel(leader)?);
    let mut measured = Measured::default();
    let started = Instant::now();
    let mut next = 1u64;
    while measured.answered.len() < settings.rounds && started.elapsed() < SETTING_LIMIT {
        let round = wait_seen(
            seen,
            Duration::from_secs(20),
            "the next round to open",
            |s| {
                s.rounds
                    .values()
                    .find(|r| r.round_id >= next && r.state() == pb::RoundState::Open)
                    .cloned()
            },
        )
        .await?;
        next = round.round_id + 1;
        let last = (SITES[SITES.len() - 1], round.fragments - 1);
        // Every contribution, then every applied report but the last, all
        // at once.
        let mut failed = None;
        for applied in [false, true] {
            let mut calls = JoinSet::new();
            for site in SITES {
                for fragment in 0..round.fragments {
                    if applied && (site, fragment) == last {
                        continue;
                    }
                    let mut agent = agent.clone();
                    let round_id = round.round_id;
                    calls.spawn(async move {
                        if applied {
                            let request = pb::ReportAppliedRequest {
                                site_id: site.into(),
                                job_id: "dense-400b".into(),
                                round: round_id,
                                fragment,
                                hash: hash(round_id, fragment),
                                inner_step_us: 0,
                            };
                            agent.report_applied(timed(request)).await.map(|_| ())
                        } else {
                            let request = pb::ReportContributedRequest {
                                site_id: site.into(),
                                job_id: "dense-400b".into(),
                                round: round_id,
                                fragment,
                            };
                            agent.report_contributed(timed(request)).await.map(|_| ())
                        }
                    });
                }
            }
            while let Some(joined) = calls.join_next().await {
                if let Err(status) = joined? {
                    failed = Some(status);
                }
            }
        }
        if let Some(status) = failed {
            // The round ended without this bench's reports (a site excluded
            // under load): say why, and go on with the next.
            measured.skipped += 1;
            let rounds = CoordinatorClient::new(channel(leader)?)
                .list_rounds(timed(pb::ListRoundsRequest {
                    job_id: "dense-400b".into(),
                    allow_stale: true,
                }))
                .await?
                .into_inner()
                .rounds;
            let ended = rounds.iter().find(|r| r.round_id == round.round_id);
            let excluded: Vec<String> = ended
                .iter()
                .flat_map(|r| &r.participant_states)
                .filter(|p| p.excluded)
                .map(|p| {
                    format!(
                        "{} ({}: {})",
                        p.site_id, p.exclusion_reason, p.exclusion_message
                    )
                })
                .collect();
            eprintln!(
                "  warning: round {} was not measured: a report was refused ({}); state {:?}, excluded {excluded:?}",
                round.round_id,
                status.message(),
                ended.map(|r| r.state())
            );
            // A round still open (a report's outcome was unknown across a
            // leader change) is reported again: the same reports are
            // answered as the first.
            if ended.is_some_and(|r| r.state() == pb::RoundState::Open) {
                next = round.round_id;
            }
            continue;
        }
        let request = pb::ReportAppliedRequest {
            site_id: last.0.into(),
            job_id: "dense-400b".into(),
            round: round.round_id,
            fragment: last.1,
            hash: hash(round.round_id, last.1),
            inner_step_us: 0,
        };
        let sent = Instant::now();
        let sent_unix = std::time::SystemTime::now();
        let answer = agent
            .clone()
            .report_applied(timed(request))
            .await?
            .into_inner();
        let answered = sent.elapsed();
        if settings.keep {
            // To find a slow round in the kept replica logs.
            let unix = sent_unix
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!(
                "  round {} last report sent at {}.{:06} (unix s), answered in {:.2} ms",
                round.round_id,
                unix.as_secs(),
                unix.subsec_micros(),
                answered.as_secs_f64() * 1000.0
            );
        }
        if answer
            .round
            .is_none_or(|r| r.state() != pb::RoundState::Committed)
        {
            return Err(format!(
                "round {}: the last report did not commit it",
                round.round_id
            )
            .into());
        }
        let id = round.round_id;
        let (leader_seen, slowest, opened) = wait_seen(
            seen,
            Duration::from_secs(20),
            "the commit on every replica",
            |s| {
                let at: Vec<Instant> = (0..3)
                    .map(|i| s.committed.get(&(i, id)).copied())
                    .collect::<Option<_>>()?;
                Some((
                    at[leader_index],
                    at.iter().copied().max()?,
                    s.opened.get(&(leader_index, id)).copied(),
                ))
            },
        )
        .await?;
        if id as usize > WARMUP_ROUNDS {
            measured.answered.push(answered);
            measured
                .leader_watch
                .push(leader_seen.saturating_duration_since(sent));
            measured
                .every_replica
                .push(slowest.saturating_duration_since(sent));
            if let Some(opened) = opened {
                measured
                    .open_to_commit
                    .push(leader_seen.saturating_duration_since(opened));
            }
        }
    }
    Ok(measured)
}

/// Nearest-rank percentile, in ms.
fn percentile_ms(values: &mut [Duration], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_unstable();
    let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1].as_secs_f64() * 1000.0
}

fn pair(values: &mut [Duration]) -> String {
    format!(
        "{:>7.2} / {:<7.2}",
        percentile_ms(values, 0.5),
        percentile_ms(values, 0.99)
    )
}

async fn run_setting(settings: &Settings, km: Option<f64>) -> Result<(String, bool), BoxError> {
    let topology = longhaul_core::Topology::from_toml("three-continents.toml", TOPOLOGY)?;
    let cluster = start_cluster(settings, km, &topology).await?;
    let leader_index = leader(&cluster.addrs).await?;
    let leader_addr = cluster.addrs[leader_index];
    let seen: Shared = Arc::default();
    let mut watches = JoinSet::new();
    for (i, addr) in cluster.addrs.iter().enumerate() {
        let seen = seen.clone();
        let addr = *addr;
        watches.spawn(async move {
            if let Err(error) = watch(i, addr, leader_index, seen).await {
                eprintln!("  warning: replica {}'s round watch ended: {error}", i + 1);
            }
        });
    }
    let _renewals = set_up(leader_addr, &topology, settings.fragments).await?;
    let mut measured = run_rounds(settings, leader_addr, leader_index, &seen).await?;
    let now_leader = leader(&cluster.addrs).await?;
    if now_leader != leader_index {
        eprintln!(
            "  warning: the leader changed during the run (replica {} → {}); reports were forwarded",
            leader_index + 1,
            now_leader + 1
        );
    }
    watches.abort_all();
    let rtt_ms = cluster.rtt_to_majority.as_secs_f64() * 1000.0;
    let aim_ms = rtt_ms + 25.0;
    let name = km.map_or_else(|| "loopback".to_string(), |km| format!("{km} km"));
    let rounds = measured.answered.len();
    if measured.skipped > 0 {
        eprintln!(
            "  {} rounds not measured (see the warnings)",
            measured.skipped
        );
    }
    let met = percentile_ms(&mut measured.answered, 0.99) <= aim_ms
        && percentile_ms(&mut measured.leader_watch, 0.99) <= aim_ms;
    let line = format!(
        "{name:>9} | {rtt_ms:>9.2} | {aim_ms:>7.2} | {} | {} | {} | {} | {rounds:>6} | {:>3} | {}",
        pair(&mut measured.answered),
        pair(&mut measured.leader_watch),
        pair(&mut measured.every_replica),
        pair(&mut measured.open_to_commit),
        if met { "yes" } else { "no" },
        loadavg().split(' ').next().unwrap_or("?"),
    );
    println!("  done: {line}");
    if let Some(emulator) = &cluster._emulator {
        // What the emulator itself did to the replicas' traffic: a segment the link model
        // drops is re-sent by the TCP relay after max(RTT, 1 ms), doubling, which shows in
        // the tail as whole extra RTTs.
        let (mut drops, mut resent, mut late) = (0, 0, 0u64);
        for status in emulator.statuses() {
            drops += status.stats.drops.total() + status.host_drops + status.kernel_drops;
            resent += status.retransmissions;
            late = late.max(status.lateness.p99_us);
        }
        println!(
            "        emulator: {drops} segments dropped, {resent} re-sent by the TCP relay, release lateness p99 {late} µs (worst direction)"
        );
    }
    Ok((line, met))
}

async fn run(settings: Settings) -> Result<bool, BoxError> {
    println!(
        "round commit latency: 3 replica processes (one each at paris, virginia, tokyo), agent stand-ins for {} sites × {} fragments over gRPC to the leader, {} measured rounds per setting after {WARMUP_ROUNDS}; {} cores, load average {}",
        SITES.len(),
        settings.fragments,
        settings.rounds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    println!(
        "behind the emulator (seed {}): each replica reaches the others through the emulator's TCP proxies, every link the same distance, no loss. \
         The emulator's TCP path is a relay, not a packet path (issue 16): each proxy terminates the connection, cuts the stream into segments that the link model delays, and writes them out on a second connection; congestion control and the handshake are not modelled, so these figures are propagation + the relay + the coordinator.",
        settings.seed
    );
    let mut lines = Vec::new();
    let mut all_met = true;
    for km in &settings.settings {
        let (line, met) = run_setting(&settings, *km).await?;
        all_met &= met;
        lines.push(line);
    }
    println!();
    println!(
        "{:>9} | {:>9} | {:>7} | {:^17} | {:^17} | {:^17} | {:^17} | {:>6} | {:>3} | load",
        "setting",
        "RTT maj.",
        "aim p99",
        "answered p50/p99",
        "leader watch",
        "every replica",
        "open → commit",
        "rounds",
        "met"
    );
    for line in &lines {
        println!("{line}");
    }
    println!(
        "times in ms from sending the last applied report: its answer (the leader applied the commit), the commit on the leader's round watch, on every replica's (the slowest); open → commit on the leader's watch. \
         RTT maj.: the RTT from the leader to the nearest other replica, from the emulator's link config (5 µs/km each way); aim: p99 ≤ RTT maj. + 25 ms, for the answer and the leader's watch."
    );
    Ok(all_met)
}

fn main() -> ExitCode {
    let settings = match settings() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Dropping `run` on timeout or error drops its clusters: every process is killed.
    let outcome = runtime.block_on(async { tokio::time::timeout(RUN_LIMIT, run(settings)).await });
    match outcome {
        Ok(Ok(_)) => ExitCode::SUCCESS,
        Ok(Err(error)) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("error: the benchmark did not finish within {RUN_LIMIT:?}");
            ExitCode::FAILURE
        }
    }
}
