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

const TOPOLOGY: &str = include_str!("fixtures/three-continents.toml");
const JOB: &str = include_str!("../../../deploy/examples/dense-400b.job.toml");
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

/// The API refuses bad reports naming the field and storing nothing,
/// answers a repeated report as the first, and agents learn of the round's
/// opening and commit from the round watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_reports_are_validated_and_rounds_commit_and_are_watched() {
    let dir = tempfile::tempdir().unwrap();
    let mut configs = replica_configs(dir.path(), 3);
    for config in &mut configs {
        // Long enough that the checks below run in one round.
        config.round_timing.fixed = Some(Duration::from_secs(30));
    }
    let mut replicas = Vec::new();
    for config in &configs {
        replicas.push(Some(Replica::start(config.clone()).await.unwrap()));
    }
    leader_of(&replicas).await;
    let addrs: Vec<SocketAddr> = configs.iter().map(|c| c.listen).collect();
    let ttl = configs[0].lease_ttl;
    let stand_ins: Vec<StandIn> = SITES
        .iter()
        .map(|site| StandIn::spawn(site, addrs.clone(), ttl, false))
        .collect();
    place_job(&addrs).await;

    let mut watch = RoundWatch::start(addrs[1], "paris").await;
    let mut opened = watch.next_round().await;
    while opened.round_id == 0 {
        opened = watch.next_round().await;
    }
    assert_eq!(opened.round_id, 1);
    assert_eq!(opened.state(), pb::RoundState::Open);
    assert_eq!(opened.participants.len(), 3, "{opened:?}");
    assert!(opened.fragments >= 1);

    let revision = || async {
        client(addrs[0])
            .await
            .list_rounds(pb::ListRoundsRequest {
                job_id: JOB_ID.into(),
                allow_stale: false,
            })
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision
    };
    let before = revision().await;
    let leave = |job: &str, reason: String| pb::LeaveRoundRequest {
        site_id: "tokyo".into(),
        job_id: job.into(),
        round: 1,
        reason,
    };
    let contributed =
        |job: &str, round: u64, site: &str, fragment: u32| pb::ReportContributedRequest {
            site_id: site.into(),
            job_id: job.into(),
            round,
            fragment,
        };
    let applied = |site: &str, fragment: u32, hash: &str| pb::ReportAppliedRequest {
        site_id: site.into(),
        job_id: JOB_ID.into(),
        round: 1,
        fragment,
        hash: hash.into(),
        inner_step_us: 0,
    };
    let refused = |status: tonic::Status, code: Code, field: &str| {
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(&format!("field `{field}`")),
            "{status:?}"
        );
    };
    // Through a follower and the leader alike.
    for addr in &addrs {
        let mut c = agent(*addr);
        refused(
            c.report_contributed(contributed("nope", 1, "paris", 0))
                .await
                .unwrap_err(),
            Code::NotFound,
            "job_id",
        );
        refused(
            c.report_contributed(contributed(JOB_ID, 9, "paris", 0))
                .await
                .unwrap_err(),
            Code::NotFound,
            "round",
        );
        refused(
            c.report_contributed(contributed(JOB_ID, 1, "paris", opened.fragments))
                .await
                .unwrap_err(),
            Code::NotFound,
            "fragment",
        );
        refused(
            c.report_contributed(contributed(JOB_ID, 1, "atlantis", 0))
                .await
                .unwrap_err(),
            Code::FailedPrecondition,
            "site_id",
        );
        refused(
            c.report_applied(applied("paris", 0, &hash(1, 0)))
                .await
                .unwrap_err(),
            Code::FailedPrecondition,
            "fragment",
        );
        refused(
            c.report_applied(applied("paris", 0, "")).await.unwrap_err(),
            Code::InvalidArgument,
            "hash",
        );
        for (job, reason, code, field) in [
            (JOB_ID, String::new(), Code::InvalidArgument, "reason"),
            (JOB_ID, "x".repeat(1025), Code::InvalidArgument, "reason"),
            (
                JOB_ID,
                "no\u{1b}[2J state".into(),
                Code::InvalidArgument,
                "reason",
            ),
            (
                "nope",
                "its catch-up failed".to_string(),
                Code::NotFound,
                "job_id",
            ),
        ] {
            refused(
                c.leave_round(leave(job, reason)).await.unwrap_err(),
                code,
                field,
            );
        }
    }
    assert_eq!(revision().await, before, "a refused report stored nothing");

    let mut c = agent(addrs[2]);
    c.report_contributed(contributed(JOB_ID, 1, "paris", 0))
        .await
        .unwrap();
    let first = c
        .report_applied(applied("paris", 0, &hash(1, 0)))
        .await
        .unwrap()
        .into_inner();
    let me = participant(first.round.as_ref().unwrap(), "paris")
        .unwrap()
        .clone();
    assert_eq!(me.applied.len(), 1);
    let stored = revision().await;
    // The same report again is answered as the first; another hash is refused.
    let again = c
        .report_applied(applied("paris", 0, &hash(1, 0)))
        .await
        .unwrap();
    assert_eq!(again.into_inner().round, first.round);
    refused(
        c.report_applied(applied("paris", 0, "another"))
            .await
            .unwrap_err(),
        Code::FailedPrecondition,
        "hash",
    );
    assert_eq!(revision().await, stored, "a second report stored nothing");

    // Tokyo sits the round out (its catch-up failed, say): it is excluded
    // at once, and the round no longer waits for it.
    let left = c
        .leave_round(leave(JOB_ID, "its catch-up failed: no state".into()))
        .await
        .unwrap()
        .into_inner();
    let tokyo = participant(left.round.as_ref().unwrap(), "tokyo").unwrap();
    assert!(tokyo.excluded, "{tokyo:?}");
    assert_eq!(tokyo.exclusion_reason, "sat_out");
    assert!(tokyo.exclusion_message.contains("no state"), "{tokyo:?}");
    assert!(
        !left
            .round
            .as_ref()
            .unwrap()
            .waiting_on
            .contains(&"tokyo".to_string())
    );
    let stored = revision().await;
    refused(
        c.leave_round(leave(JOB_ID, "again".into()))
            .await
            .unwrap_err(),
        Code::FailedPrecondition,
        "site_id",
    );
    assert_eq!(revision().await, stored, "leaving twice stored nothing");

    // The stand-ins report the rest: the round commits, and the watch says so.
    for stand_in in &stand_ins {
        stand_in.reporting.store(true, Ordering::SeqCst);
    }
    let committed = loop {
        let round = watch.next_round().await;
        if round.round_id == 1 && round.state() == pb::RoundState::Committed {
            break round;
        }
        assert!(round.round_id == 1 || round.round_id == 0, "{round:?}");
    };
    assert!(committed.waiting_on.is_empty());
    assert!(
        committed
            .fragment_states
            .iter()
            .enumerate()
            .all(|(f, s)| s.state == "committed" && s.hash == hash(1, f as u32))
    );
    // The next one opens; the sync schedule names the current round.
    let schedule = eventually(
        Duration::from_secs(30),
        "round 2 in the sync schedule",
        || async {
            let schedule = client(addrs[0])
                .await
                .get_sync_schedule(pb::GetSyncScheduleRequest {
                    job_id: JOB_ID.into(),
                    allow_stale: false,
                })
                .await
                .ok()?
                .into_inner()
                .schedule?;
            schedule
                .current_round
                .as_ref()
                .is_some_and(|r| r.round_id >= 2)
                .then_some(schedule)
        },
    )
    .await;
    assert_eq!(schedule.job_id, JOB_ID);
    // The round carries the schedule's codec of every link, its width the
    // widest.
    let round = schedule.current_round.as_ref().unwrap();
    let carried: Vec<_> = round
        .links
        .iter()
        .map(|l| {
            (
                &l.site_a,
                &l.site_b,
                l.bits,
                l.block_size,
                l.error_feedback,
                l.zstd,
            )
        })
        .collect();
    let planned: Vec<_> = schedule
        .links
        .iter()
        .map(|l| {
            (
                &l.site_a,
                &l.site_b,
                l.bits,
                l.block_size,
                l.error_feedback,
                l.zstd,
            )
        })
        .collect();
    assert!(!carried.is_empty());
    assert_eq!(carried, planned);
    assert_eq!(
        Some(round.codec_bits),
        round.links.iter().map(|l| l.bits).max()
    );
    drop(stand_ins);
    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}

/// Waits (20 s at most) until the replica's `/metrics` at `addr` shows
/// every one of `wanted`.
async fn metrics_show(addr: SocketAddr, wanted: &[&str]) {
    let mut last = String::new();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(body) = http_get(addr, "/metrics").await {
                if wanted.iter().all(|w| body.contains(w)) {
                    return;
                }
                last = body;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "{addr}/metrics lacks some of {wanted:?}:\n{last}"
    );
}

/// Real replica processes and three stand-ins: rounds commit; a site that
/// dies mid-round is excluded and the round commits without it within its
/// deadline plus one lease TTL; the site comes back and takes part in a
/// later round after catching up; the leader killed mid-round, the round
/// still commits, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_commit_through_a_site_loss_its_return_and_a_leader_kill() {
    const DEADLINE: Duration = Duration::from_secs(6);
    const TTL: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let mut processes = cluster(dir.path(), 3);
    let metrics: Vec<SocketAddr> = processes.iter().map(|_| free_addr()).collect();
    for (p, metrics) in processes.iter_mut().zip(&metrics) {
        p.extra_args = vec![
            "--round-deadline".into(),
            "6s".into(),
            "--lease-ttl".into(),
            "3s".into(),
            "--metrics-listen".into(),
            metrics.to_string(),
        ];
        p.start();
    }
    leader(&processes).await;
    let addrs: Vec<SocketAddr> = processes.iter().map(|p| p.addr).collect();
    let stand_ins: Vec<StandIn> = SITES
        .iter()
        .map(|site| StandIn::spawn(site, addrs.clone(), TTL, true))
        .collect();
    place_job(&addrs).await;

    // Rounds open and commit.
    eventually(Duration::from_secs(60), "two committed rounds", || async {
        let rounds = any_rounds(&addrs).await?;
        (rounds
            .iter()
            .filter(|r| r.state() == pb::RoundState::Committed)
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    // Every replica counts the rounds it applied; the leader, which opened
    // them, also shows the bytes the schedule plans per outer step.
    let leading = leader(&processes).await as usize - 1;
    for (i, addr) in metrics.iter().enumerate() {
        let mut wanted = vec![
            "longhaul_rounds_opened_total",
            "longhaul_rounds_ended_total{outcome=\"committed\"}",
            "longhaul_round_duration_seconds",
        ];
        if i == leading {
            wanted.push("longhaul_sync_planned_bytes{link=");
        }
        metrics_show(*addr, &wanted).await;
    }

    // paris stops reporting; once a round waits only on paris, it dies.
    let victim = &stand_ins[0];
    victim.reporting.store(false, Ordering::SeqCst);
    // A report already on its way would still count: wait until none is.
    eventually(
        Duration::from_secs(20),
        "paris's last reports to land",
        || async { (!victim.busy.load(Ordering::SeqCst)).then_some(()) },
    )
    .await;
    let stuck = eventually(
        Duration::from_secs(60),
        "a round waiting on paris alone",
        || async {
            let rounds = any_rounds(&addrs).await?;
            let open = rounds
                .last()
                .filter(|r| r.state() == pb::RoundState::Open)?;
            (open.waiting_on == vec![victim.site.to_string()]).then(|| open.clone())
        },
    )
    .await;
    victim.die();
    let ended = eventually(
        DEADLINE + TTL + Duration::from_secs(20),
        "the round to commit without paris",
        || async {
            let rounds = any_rounds(&addrs).await?;
            rounds
                .into_iter()
                .find(|r| r.round_id == stuck.round_id && r.state() != pb::RoundState::Open)
        },
    )
    .await;
    assert_eq!(ended.state(), pb::RoundState::Committed, "{ended:?}");
    let excluded = participant(&ended, victim.site).unwrap();
    assert!(excluded.excluded, "{ended:?}");
    eprintln!(
        "round {} committed {} ms after opening without paris ({}; deadline {} ms, lease TTL {} ms)",
        ended.round_id,
        ended.ended_at_unix_ms - ended.opened_at_unix_ms,
        excluded.exclusion_reason,
        DEADLINE.as_millis(),
        TTL.as_millis()
    );
    assert!(
        ended.ended_at_unix_ms <= ended.deadline_unix_ms + TTL.as_millis() as u64,
        "committed at {} ms, after its deadline {} + one TTL",
        ended.ended_at_unix_ms,
        ended.deadline_unix_ms
    );
    for p in ended
        .participant_states
        .iter()
        .filter(|p| p.site_id != victim.site)
    {
        assert!(!p.excluded, "{p:?}");
    }
    // The exclusion is counted, by its reason, on every replica.
    let exclusion = format!(
        "longhaul_round_exclusions_total{{reason=\"{}\"}}",
        excluded.exclusion_reason
    );
    for addr in &metrics {
        metrics_show(*addr, &[exclusion.as_str()]).await;
    }

    // paris comes back: the job is placed on it again, and it takes part in a
    // later round, told to catch up from a committed round at a site that
    // applied it.
    victim.revive();
    let rejoined = eventually(
        Duration::from_secs(90),
        "a round committed with paris back",
        || async {
            let rounds = any_rounds(&addrs).await?;
            rounds.into_iter().find(|r| {
                r.round_id > ended.round_id
                    && r.state() == pb::RoundState::Committed
                    && participant(r, victim.site).is_some_and(|p| !p.excluded)
            })
        },
    )
    .await;
    let catch_up = participant(&rejoined, victim.site).unwrap();
    assert!(
        catch_up.catch_up_from_round >= ended.round_id,
        "{rejoined:?}"
    );
    assert_ne!(catch_up.catch_up_from_site, victim.site);

    // The commit latency of a round as its last reporter sees it (3
    // replicas on loopback, on whatever load the machine has): printed,
    // not asserted.
    let mut latencies: Vec<Duration> = stand_ins
        .iter()
        .flat_map(|s| s.commit_latencies.lock().unwrap().clone())
        .collect();
    latencies.sort();
    if !latencies.is_empty() {
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        eprintln!(
            "round commit latency (the committing report's round trip), {} rounds: p50 {:.1} ms, p99 {:.1} ms",
            latencies.len(),
            at(0.5).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3
        );
    }

    // The leader dies mid-round (tokyo holds the round open); the round
    // still commits, exactly once.
    let holder = &stand_ins[2];
    holder.reporting.store(false, Ordering::SeqCst);
    let open = eventually(
        Duration::from_secs(60),
        "a round waiting on tokyo",
        || async {
            let rounds = any_rounds(&addrs).await?;
            let open = rounds
                .last()
                .filter(|r| r.state() == pb::RoundState::Open)?;
            open.waiting_on
                .contains(&holder.site.to_string())
                .then(|| open.clone())
        },
    )
    .await;
    let old = leader(&processes).await;
    processes[old as usize - 1].kill();
    holder.reporting.store(true, Ordering::SeqCst);
    let survivors: Vec<SocketAddr> = processes
        .iter()
        .filter(|p| p.child.is_some())
        .map(|p| p.addr)
        .collect();
    // Over once it shows as over, or once a later round exists (one is
    // open at a time): the reporters commit rounds back to back, so by the
    // time a loaded machine looks, it may have left the 16 rounds kept.
    // Whether it committed, once and with nobody excluded, the history
    // below says.
    let ended = eventually(
        Duration::from_secs(60),
        "the round to end after the leader kill",
        || async {
            let rounds = any_rounds(&survivors).await?;
            match rounds.iter().find(|r| r.round_id == open.round_id) {
                Some(r) if r.state() != pb::RoundState::Open => Some(Some(r.clone())),
                Some(_) => None,
                None => rounds
                    .iter()
                    .any(|r| r.round_id > open.round_id)
                    .then_some(None),
            }
        },
    )
    .await;
    if let Some(committed) = &ended {
        assert_eq!(
            committed.state(),
            pb::RoundState::Committed,
            "{committed:?}"
        );
        assert!(
            committed.participant_states.iter().all(|p| !p.excluded),
            "{committed:?}"
        );
    }
    // Once: one transition to committed in the whole history, and round
    // numbers without a gap or a repeat.
    let revision = client(survivors[0])
        .await
        .get_cluster(pb::GetClusterRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let mut watch = client(survivors[0])
        .await
        .watch(pb::WatchRequest {
            after_revision: 0,
            kinds: vec!["round".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let mut commits = 0;
    let mut opened = Vec::new();
    let mut last = 0;
    while last < revision {
        let Ok(Ok(Some(event))) =
            tokio::time::timeout(Duration::from_secs(2), watch.message()).await
        else {
            break;
        };
        last = event.revision;
        // A round commits with a report (or an exclusion, whose event
        // carries the whole round): counted on the event that committed it.
        let (round_id, committed) = match event.event {
            Some(pb::watch_event::Event::Round(round)) => {
                if round.opened_revision == event.revision {
                    opened.push(round.round_id);
                }
                if round.round_id == open.round_id {
                    assert!(
                        round.participant_states.iter().all(|p| !p.excluded),
                        "round {} excluded a participant: {round:?}",
                        open.round_id
                    );
                }
                let committed =
                    round.state() == pb::RoundState::Committed && round.revision == event.revision;
                (round.round_id, committed)
            }
            Some(pb::watch_event::Event::RoundReport(report)) => {
                (report.round_id, report.state() == pb::RoundState::Committed)
            }
            _ => continue,
        };
        if round_id == open.round_id && committed {
            commits += 1;
        }
    }
    assert_eq!(
        commits, 1,
        "round {} committed {commits} times",
        open.round_id
    );
    assert_eq!(
        opened,
        (1..=opened.len() as u64).collect::<Vec<_>>(),
        "rounds opened once each, in order"
    );

    // The killed replica restarts from its store with the same rounds.
    processes[old as usize - 1].start();
    let restarted = processes[old as usize - 1].addr;
    let seen = std::sync::Mutex::new(String::new());
    eventually(
        Duration::from_secs(30),
        "the restarted replica to have the rounds",
        || async {
            let rounds = rounds(restarted, true).await;
            let now = format!(
                "{:?}",
                rounds.as_ref().map(|r| r
                    .iter()
                    .map(|r| (r.round_id, r.state()))
                    .collect::<Vec<_>>())
            );
            let mut seen = seen.lock().unwrap();
            if *seen != now {
                eprintln!("the restarted replica has rounds {now}");
                *seen = now;
            }
            // Caught up to the held round or past it (the reporters go on
            // committing rounds, which may take it out of the 16 kept),
            // and every round it keeps before the last is committed.
            let rounds = rounds?;
            let (last, before) = rounds.split_last()?;
            (last.round_id >= open.round_id
                && before
                    .iter()
                    .all(|r| r.state() == pb::RoundState::Committed)
                && (last.round_id != open.round_id || last.state() == pb::RoundState::Committed))
                .then_some(())
        },
    )
    .await;
    drop(stand_ins);
}
