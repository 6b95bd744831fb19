//! Outer rounds over real gRPC: agent stand-ins that register, renew and
//! report each round's fragments (contributed, then applied with a hash),
//! against in-process replicas (the API's validation, the round watch) and
//! against real `coordinator` processes (a site killed mid-round and back,
//! the leader killed mid-round).
//!
//! The job is the bundled 400B one on three sites an ocean apart
//! (`fixtures/three-continents.toml`): DiLoCo replicas on all three, and on
//! any two.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use longhaul_coordinator::server::Replica;
use longhaul_coordinator::server::convert::{job_to_wire, link_to_wire, site_to_wire};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::agent_service_client::AgentServiceClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::processes::{cluster, http_get, leader};
use crate::util::{client, eventually, free_addr, leader_of, replica_configs};

mod through_faults;
mod watched;

const TOPOLOGY: &str = include_str!("../fixtures/three-continents.toml");
const JOB: &str = include_str!("../../../../deploy/examples/dense-400b.job.toml");
const JOB_ID: &str = "dense-400b";
const SITES: [&str; 3] = ["paris", "virginia", "tokyo"];

fn topology() -> longhaul_core::Topology {
    longhaul_core::Topology::from_toml("three-continents.toml", TOPOLOGY).unwrap()
}

/// What every stand-in reports as the hash of a reduced fragment: they all
/// agree.
fn hash(round: u64, fragment: u32) -> String {
    format!("{JOB_ID}/{round}/{fragment}")
}

fn agent(addr: SocketAddr) -> AgentServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy();
    AgentServiceClient::new(channel)
}

fn timed<T>(body: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(body);
    request.set_timeout(timeout);
    request
}

/// A site agent's part in the rounds, without the agent: registers and
/// renews its lease while `renewing`, and while `reporting` sends the next
/// reports of the job's open round it counts in. Any replica will do; a
/// failed call moves on to the next.
struct StandIn {
    site: &'static str,
    renewing: Arc<AtomicBool>,
    reporting: Arc<AtomicBool>,
    /// Set while a pass of reports runs (it read `reporting` as true): a
    /// report sent before `reporting` was cleared may still land until it
    /// is clear.
    busy: Arc<AtomicBool>,
    /// How long each report that committed a round took to be answered:
    /// through the leader's raft commit of the report and its apply.
    commit_latencies: Latencies,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

type Latencies = Arc<std::sync::Mutex<Vec<Duration>>>;

impl StandIn {
    fn spawn(site: &'static str, addrs: Vec<SocketAddr>, ttl: Duration, reporting: bool) -> Self {
        let renewing = Arc::new(AtomicBool::new(true));
        let reporting = Arc::new(AtomicBool::new(reporting));
        let busy = Arc::new(AtomicBool::new(false));
        let commit_latencies = Latencies::default();
        // Renewals on their own task, as the agent has them: a slow report
        // never delays one.
        let tasks = [
            tokio::spawn(renew(site, addrs.clone(), ttl, renewing.clone())),
            tokio::spawn(reports(
                site,
                addrs,
                reporting.clone(),
                busy.clone(),
                commit_latencies.clone(),
            )),
        ];
        Self {
            site,
            renewing,
            reporting,
            busy,
            commit_latencies,
            tasks,
        }
    }

    /// As a SIGKILL of the agent looks from the coordinator: no renewal, no
    /// report.
    fn die(&self) {
        self.renewing.store(false, Ordering::SeqCst);
        self.reporting.store(false, Ordering::SeqCst);
    }

    fn revive(&self) {
        self.renewing.store(true, Ordering::SeqCst);
        self.reporting.store(true, Ordering::SeqCst);
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Registers, then renews every fifth of the TTL, while `renewing`.
async fn renew(
    site: &'static str,
    addrs: Vec<SocketAddr>,
    ttl: Duration,
    renewing: Arc<AtomicBool>,
) {
    let inventory = topology().site(site).map(site_to_wire);
    let call = ttl / 5;
    let mut lease = None;
    let mut next = 0usize;
    loop {
        let c = &mut agent(addrs[next % addrs.len()]);
        if !renewing.load(Ordering::SeqCst) {
            lease = None;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let Some(lease_id) = lease else {
            let request = pb::RegisterRequest {
                site_id: site.into(),
                inventory: inventory.clone(),
                data_address: String::new(),
            };
            match c.register(timed(request, Duration::from_secs(2))).await {
                Ok(response) => lease = Some(response.into_inner().lease_id),
                Err(_) => {
                    next += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        };
        tokio::time::sleep(ttl / 5).await;
        if !renewing.load(Ordering::SeqCst) {
            continue;
        }
        let request = pb::KeepAliveRequest {
            site_id: site.into(),
            lease_id,
        };
        match c.keep_alive(timed(request, call)).await {
            Ok(_) => {}
            Err(status) if matches!(status.code(), Code::NotFound | Code::FailedPrecondition) => {
                lease = None;
            }
            Err(_) => next += 1,
        }
    }
}

/// Sends the site's reports of the open round every 40 ms, while `reporting`.
async fn reports(
    site: &'static str,
    addrs: Vec<SocketAddr>,
    reporting: Arc<AtomicBool>,
    busy: Arc<AtomicBool>,
    latencies: Latencies,
) {
    let mut next = 0usize;
    // The last refusal, shown when it changes: a failing test tells why
    // its reports did not land.
    let mut last_error = String::new();
    loop {
        tokio::time::sleep(Duration::from_millis(40)).await;
        // Busy before `reporting` is read, so that once the test has
        // cleared `reporting` and then seen `busy` clear, nothing more is
        // sent.
        busy.store(true, Ordering::SeqCst);
        if reporting.load(Ordering::SeqCst) {
            let addr = addrs[next % addrs.len()];
            if let Err(status) = report(site, addr, Duration::from_secs(2), &latencies).await {
                let error = format!("{:?}: {}", status.code(), status.message());
                if error != last_error {
                    eprintln!("{site}: a report to {addr} failed: {error}");
                    last_error = error;
                }
                next += 1;
            }
        }
        busy.store(false, Ordering::SeqCst);
    }
}

/// Sends every report the site owes the job's open round.
async fn report(
    site: &str,
    addr: SocketAddr,
    call: Duration,
    latencies: &Latencies,
) -> Result<(), tonic::Status> {
    let mut coordinator = client(addr).await;
    let rounds = coordinator
        .list_rounds(timed(
            pb::ListRoundsRequest {
                job_id: JOB_ID.into(),
                allow_stale: true,
            },
            call,
        ))
        .await?
        .into_inner()
        .rounds;
    let Some(round) = rounds.last().filter(|r| r.state() == pb::RoundState::Open) else {
        return Ok(());
    };
    let Some(me) = round
        .participant_states
        .iter()
        .find(|p| p.site_id == site && !p.excluded)
    else {
        return Ok(());
    };
    let mut c = agent(addr);
    for fragment in 0..round.fragments {
        if !me.contributed.contains(&fragment) {
            let request = pb::ReportContributedRequest {
                site_id: site.into(),
                job_id: JOB_ID.into(),
                round: round.round_id,
                fragment,
            };
            c.report_contributed(timed(request, call)).await?;
        }
        if !me.applied.iter().any(|a| a.fragment == fragment) {
            let request = pb::ReportAppliedRequest {
                site_id: site.into(),
                job_id: JOB_ID.into(),
                round: round.round_id,
                fragment,
                hash: hash(round.round_id, fragment),
                inner_step_us: 0,
            };
            let sent = std::time::Instant::now();
            let response = c.report_applied(timed(request, call)).await?.into_inner();
            if response
                .round
                .is_some_and(|r| r.state() == pb::RoundState::Committed)
            {
                let took = sent.elapsed();
                latencies.lock().unwrap().push(took);
            }
        }
    }
    Ok(())
}

/// Configures the links and submits the job once every site is up;
/// returns the plan's replica sites.
async fn place_job(addrs: &[SocketAddr]) -> Vec<String> {
    eventually(
        Duration::from_secs(30),
        "the three sites to register",
        || async {
            let sites = client(addrs[0])
                .await
                .list_sites(pb::ListSitesRequest { allow_stale: true })
                .await
                .ok()?
                .into_inner()
                .sites;
            let up = sites
                .iter()
                .filter(|s| s.state() == pb::SiteState::Up)
                .count();
            (up == SITES.len()).then_some(())
        },
    )
    .await;
    let topology = topology();
    for link in &topology.links {
        eventually(
            Duration::from_secs(30),
            "a link to be configured",
            || async {
                let request = pb::PutLinkRequest {
                    link: Some(link_to_wire(link)),
                    expected_revision: 0,
                };
                client(addrs[0])
                    .await
                    .put_link(timed(request, Duration::from_secs(2)))
                    .await
                    .ok()
            },
        )
        .await;
    }
    let mut spec = longhaul_core::JobSpec::from_toml("dense-400b.job.toml", JOB).unwrap();
    spec.constraints.allowed_sites = SITES.iter().map(|s| s.to_string()).collect();
    let job = eventually(Duration::from_secs(60), "the job to be placed", || async {
        let request = pb::SubmitJobRequest {
            spec: Some(job_to_wire(&spec)),
            expected_revision: 0,
        };
        // Placement of a 400B job takes a while in a debug build.
        match client(addrs[0])
            .await
            .submit_job(timed(request, Duration::from_secs(20)))
            .await
        {
            Ok(response) => response.into_inner().job,
            Err(status) if status.code() == Code::AlreadyExists => {
                client(addrs[0])
                    .await
                    .get_job(pb::GetJobRequest {
                        job_id: JOB_ID.into(),
                        allow_stale: false,
                    })
                    .await
                    .ok()?
                    .into_inner()
                    .job
            }
            Err(_) => None,
        }
    })
    .await;
    let plan = job.plan.expect("the job is placed");
    assert_eq!(plan.cross_site_mode, "diloco", "{plan:?}");
    let mut sites: Vec<String> = plan.stages.iter().map(|s| s.site_id.clone()).collect();
    sites.sort();
    sites.dedup();
    assert_eq!(
        sites.len(),
        3,
        "the job spreads over the three sites: {sites:?}"
    );
    sites
}

async fn rounds(addr: SocketAddr, allow_stale: bool) -> Option<Vec<pb::OuterRound>> {
    let request = pb::ListRoundsRequest {
        job_id: JOB_ID.into(),
        allow_stale,
    };
    Some(
        client(addr)
            .await
            .list_rounds(timed(request, Duration::from_secs(2)))
            .await
            .ok()?
            .into_inner()
            .rounds,
    )
}

/// The first of `addrs` that answers a linearizable read of the rounds.
async fn any_rounds(addrs: &[SocketAddr]) -> Option<Vec<pb::OuterRound>> {
    for addr in addrs {
        if let Some(rounds) = rounds(*addr, false).await {
            return Some(rounds);
        }
    }
    None
}

/// The round watch as an agent holds it: each round sent, with the reports
/// sent after it folded in.
struct RoundWatch {
    stream: tonic::Streaming<pb::RoundEvent>,
    rounds: std::collections::BTreeMap<u64, pb::OuterRound>,
}

impl RoundWatch {
    async fn start(addr: SocketAddr, site: &str) -> Self {
        let stream = agent(addr)
            .watch_rounds(pb::WatchRoundsRequest {
                site_id: site.into(),
                after_revision: 0,
            })
            .await
            .unwrap()
            .into_inner();
        Self {
            stream,
            rounds: Default::default(),
        }
    }

    /// The round the next event changed, as held after it (a default one
    /// for a sync point), within 30 s.
    async fn next_round(&mut self) -> pb::OuterRound {
        let event = tokio::time::timeout(Duration::from_secs(30), self.stream.message())
            .await
            .expect("a round event within 30 s")
            .unwrap()
            .expect("the round watch goes on");
        if let Some(round) = event.round {
            self.rounds.insert(round.round_id, round.clone());
            return round;
        }
        let Some(report) = event.report else {
            return pb::OuterRound::default();
        };
        let round = self
            .rounds
            .get_mut(&report.round_id)
            .expect("a report about a round the watch sent");
        longhaul_proto::rounds::apply_round_report(round, &report);
        round.clone()
    }
}

fn participant<'a>(round: &'a pb::OuterRound, site: &str) -> Option<&'a pb::RoundParticipant> {
    round.participant_states.iter().find(|p| p.site_id == site)
}
