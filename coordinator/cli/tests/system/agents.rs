//! Three coordinator replicas and three `site-agent` processes, one per site
//! of the bundled three-site topology, on loopback. Each replica and agent is
//! a process of the built `longhaul` binary (`longhaul internal replica` and
//! `longhaul internal agent`, as a rehearsal starts them), so a kill is a
//! real SIGKILL: connections drop, nothing answers any more.
//!
//! - Kill the coordinator leader: no site is marked down, and every agent
//!   renews with the new leader.
//! - SIGKILL an agent: its site goes down within the lease TTL (plus a
//!   commit), and the job placed there is re-planned.
//! - Restart it: it registers the same inventory, and its assignment watch
//!   resumes after the last revision it handled: it acts on the re-plan,
//!   nothing older, nothing twice.
//!
//! - SIGKILL the leader and an agent together: the new leader marks the dead
//!   site down once its takeover grace is over, and no other.
//!
//! The replicas run the coordinator's default timers and lease TTL. The
//! figures (renewal after a leader kill, detection of a dead site with the
//! leader alive and with the leader dead too) are printed; the assertions
//! are bounds generous enough for a slow, shared 2-core machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use longhaul_cli::rehearse::plan_sites;
use longhaul_coordinator::server::ReplicaConfig;
use longhaul_coordinator::server::convert::{job_to_wire, link_to_wire};
use longhaul_coordinator::server::leases::default_lease_ttl;
use longhaul_core::{JobSpec, Topology, units};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::site_agent_client::SiteAgentClient;
use longhaul_site_agent::config::{AgentConfig, ProbeConfig};
use longhaul_site_agent::inventory::InventoryConfig;
use longhaul_testkit::{KillOnDrop, append_log, client, eventually, free_addr, replica_configs};

const TOPOLOGY: &str = "../../deploy/examples/three-sites-two-continents.toml";
const JOB: &str = "../../deploy/examples/dense-400b.job.toml";
const SITES: [&str; 3] = ["paris", "frankfurt", "virginia"];

/// The coordinator's default tick, which the replicas here run.
const TICK: Duration = Duration::from_millis(100);

fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// One `site-agent run` process; killed when dropped.
struct AgentProcess {
    site: &'static str,
    config: PathBuf,
    status: String,
    state_dir: PathBuf,
    log: PathBuf,
    child: Option<KillOnDrop>,
}

impl AgentProcess {
    fn new(dir: &Path, site: &'static str, coordinators: &[String], topology: &Path) -> Self {
        let status = free_addr();
        let state_dir = dir.join(format!("agent-{site}"));
        let settings = AgentConfig {
            plaintext: true,
            state_dir: Some(state_dir.clone()),
            rescan_interval: units::Duration::from_secs(1),
            call_timeout: units::Duration::from_secs(2),
            probe: ProbeConfig {
                interval: units::Duration::from_secs(2),
                pings: 5,
                loss_datagrams: 50,
                throughput_duration: units::Duration::from_millis(200),
                ..ProbeConfig::default()
            },
            ..AgentConfig::new(
                site,
                coordinators.to_vec(),
                free_addr(),
                status,
                InventoryConfig::static_file(site, topology),
            )
        };
        let config = dir.join(format!("{site}.toml"));
        std::fs::write(&config, settings.to_toml().unwrap()).unwrap();
        let mut agent = Self {
            site,
            config,
            status: status.to_string(),
            log: dir.join(format!("agent-{site}.log")),
            state_dir,
            child: None,
        };
        agent.start();
        agent
    }

    fn start(&mut self) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_longhaul"));
        command
            .args(["internal", "agent", "--config"])
            .arg(&self.config)
            .env("LONGHAUL_LOG", "info,longhaul_site_agent=debug")
            .stdout(Stdio::null())
            .stderr(append_log(&self.log).unwrap());
        let name = format!("agent {}", self.site);
        self.child = Some(KillOnDrop::spawn(name, &mut command).unwrap());
    }

    /// SIGKILL.
    fn kill(&mut self) {
        self.child = None;
    }

    async fn status(&self) -> Option<pb::AgentStatus> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.status))
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(2));
        let channel = endpoint.connect().await.ok()?;
        let mut client = SiteAgentClient::new(channel);
        Some(
            client
                .get_status(pb::GetAgentStatusRequest {})
                .await
                .ok()?
                .into_inner(),
        )
    }

    /// The last revision the agent persisted.
    fn persisted_revision(&self) -> u64 {
        let text = std::fs::read_to_string(self.state_dir.join("agent-state.json")).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value["last_revision"].as_u64().unwrap()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// A coordinator replica process (`longhaul internal replica`); killed when
/// dropped.
struct ReplicaProcess {
    id: u64,
    addr: std::net::SocketAddr,
    _process: KillOnDrop,
}

impl ReplicaProcess {
    fn start(dir: &Path, config: &ReplicaConfig) -> Self {
        let cluster = config
            .initial_cluster
            .iter()
            .map(|(id, url)| format!("{id}={url}"))
            .collect::<Vec<_>>()
            .join(",");
        let log = append_log(&dir.join(format!("replica-{}.log", config.id))).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_longhaul"));
        // The coordinator's default timers (100 ms ticks, elections after
        // 1-2 s) and lease TTL, not the 20 ms ticks of the consensus tests:
        // six processes share a slow machine here, and a starved replica
        // must not call spurious elections.
        command
            .args(["internal", "replica", "--id", &config.id.to_string()])
            .arg("--data-dir")
            .arg(&config.data_dir)
            .args(["--listen", &config.listen.to_string()])
            .args(["--initial-cluster", &cluster])
            .args(["--log", "info"])
            .stdout(Stdio::null())
            .stderr(log);
        let name = format!("replica {}", config.id);
        Self {
            id: config.id,
            addr: config.listen,
            _process: KillOnDrop::spawn(name, &mut command).unwrap(),
        }
    }
}

async fn sites(addr: std::net::SocketAddr) -> Option<Vec<pb::SiteStatus>> {
    let mut c = client(addr).await;
    let mut request = tonic::Request::new(pb::ListSitesRequest { allow_stale: false });
    request.set_timeout(Duration::from_secs(2));
    Some(c.list_sites(request).await.ok()?.into_inner().sites)
}

fn site_state(sites: &[pb::SiteStatus], id: &str) -> Option<(pb::SiteState, u64)> {
    sites
        .iter()
        .find(|s| s.site.as_ref().is_some_and(|site| site.id == id))
        .map(|s| (s.state(), s.state_revision))
}

/// The leader as the live replicas see it: (index, id).
async fn leader(replicas: &[Option<ReplicaProcess>]) -> (usize, u64) {
    eventually(Duration::from_secs(20), "a leader", || async {
        for replica in replicas.iter().flatten() {
            let mut c = client(replica.addr).await;
            let mut request = tonic::Request::new(pb::GetClusterRequest { allow_stale: true });
            request.set_timeout(Duration::from_secs(1));
            let Ok(response) = c.get_cluster(request).await else {
                continue;
            };
            let leader_id = response.into_inner().leader_id;
            if let Some(i) = replicas
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.id == leader_id))
            {
                return Some((i, leader_id));
            }
        }
        None
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_keep_their_leases_through_a_leader_kill_and_a_dead_agent_is_detected() {
    let _serial = crate::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let configs = replica_configs(dir.path(), 3);
    let ttl = default_lease_ttl(TICK);
    let urls: Vec<String> = configs
        .iter()
        .map(|c| format!("http://{}", c.listen))
        .collect();
    let mut replicas: Vec<Option<ReplicaProcess>> = configs
        .iter()
        .map(|config| Some(ReplicaProcess::start(dir.path(), config)))
        .collect();
    let (leader_index, _) = leader(&replicas).await;

    // The agents read their inventory from a copy of the example, which
    // the test edits later (a rack drained).
    let topology_copy = dir.path().join("topology.toml");
    std::fs::copy(repo_file(TOPOLOGY), &topology_copy).unwrap();
    let mut agents: Vec<AgentProcess> = SITES
        .iter()
        .map(|site| AgentProcess::new(dir.path(), site, &urls, &topology_copy))
        .collect();
    let any = |replicas: &[Option<ReplicaProcess>]| replicas.iter().flatten().next().unwrap().addr;
    let all_up = eventually(Duration::from_secs(60), "three sites up", || async {
        let sites = sites(replicas[leader_index].as_ref().unwrap().addr).await?;
        (sites.len() == 3 && sites.iter().all(|s| s.state() == pb::SiteState::Up)).then_some(sites)
    })
    .await;
    let inventory_before = |id: &str| {
        all_up
            .iter()
            .find(|s| s.site.as_ref().is_some_and(|site| site.id == id))
            .and_then(|s| s.site.clone())
            .unwrap()
    };

    // Links and the job, through the leader.
    let topology = Topology::from_toml(
        TOPOLOGY,
        &std::fs::read_to_string(repo_file(TOPOLOGY)).unwrap(),
    )
    .unwrap();
    let job = JobSpec::from_toml(JOB, &std::fs::read_to_string(repo_file(JOB)).unwrap()).unwrap();
    let mut c = client(replicas[leader_index].as_ref().unwrap().addr).await;
    for link in &topology.links {
        c.put_link(pb::PutLinkRequest {
            link: Some(link_to_wire(link)),
            expected_revision: 0,
        })
        .await
        .unwrap();
    }
    let placed = c
        .submit_job(pb::SubmitJobRequest {
            spec: Some(job_to_wire(&job)),
            expected_revision: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let used = plan_sites(&placed);
    assert!(used.len() >= 2, "the bundled job spans sites: {used:?}");
    for agent in agents.iter().filter(|a| used.iter().any(|u| u == a.site)) {
        let status = eventually(
            Duration::from_secs(60),
            "the agent to render its assignment",
            || async {
                let status = agent.status().await?;
                status
                    .assignments
                    .iter()
                    .any(|a| a.job_id == placed.id && a.ranks > 0 && !a.rendered_files.is_empty())
                    .then_some(status)
            },
        )
        .await;
        for file in &status.assignments[0].rendered_files {
            assert!(Path::new(file).exists(), "{file} was not written");
        }
    }

    // The agents probe each other; the coordinator stores the figures
    // beside the configured links.
    let measured = eventually(Duration::from_secs(60), "every link measured", || async {
        let mut c = client(any(&replicas)).await;
        let links = c
            .list_links(pb::ListLinksRequest { allow_stale: false })
            .await
            .ok()?
            .into_inner()
            .links;
        (links.len() == topology.links.len() && links.iter().all(|l| l.measured.is_some()))
            .then_some(links)
    })
    .await;
    for link in &measured {
        let m = link.measured.unwrap();
        assert!(m.rtt_ns > 0 && m.throughput_bps > 0, "{link:?}");
        assert!(m.loss_rate <= 0.05, "loopback loses nothing much: {link:?}");
    }

    // Kill the coordinator leader.
    let before_kill = sites(replicas[leader_index].as_ref().unwrap().addr)
        .await
        .unwrap();
    let (old_index, old_leader) = leader(&replicas).await;
    let killed_at = Instant::now();
    drop(replicas[old_index].take()); // SIGKILL
    let (_, new_leader) = eventually(Duration::from_secs(20), "a new leader", || async {
        let (i, id) = leader(&replicas).await;
        (id != old_leader).then_some((i, id))
    })
    .await;
    let renewed = eventually(
        Duration::from_secs(30),
        "every agent to renew with the new leader",
        || async {
            for agent in &agents {
                let status = agent.status().await?;
                let renewed_after_kill =
                    Duration::from_millis(status.since_last_renewal_ms) < killed_at.elapsed();
                if status.leader_id != new_leader || !renewed_after_kill {
                    return None;
                }
            }
            Some(killed_at.elapsed())
        },
    )
    .await;
    eprintln!(
        "leader {old_leader} killed: all agents renewed with leader {new_leader} within {} ms (lease TTL {} ms)",
        renewed.as_millis(),
        ttl.as_millis()
    );
    // A TTL after every agent renewed with the new leader (and at least
    // one and a half after the kill), no site changed state: a site the new
    // leader marked down would have registered again since.
    let quiet = (ttl + ttl / 2).max(renewed + ttl);
    tokio::time::sleep(quiet.saturating_sub(killed_at.elapsed())).await;
    let after = sites(any(&replicas)).await.unwrap();
    for site in SITES {
        assert_eq!(
            site_state(&after, site),
            site_state(&before_kill, site),
            "site {site} changed state after the leader kill"
        );
    }

    // SIGKILL the agent of a site the job uses now: a site transition since
    // it was submitted may have re-placed it on the links as probed.
    let current = {
        let mut c = client(any(&replicas)).await;
        c.get_job(pb::GetJobRequest {
            job_id: placed.id.clone(),
            allow_stale: false,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
    };
    let now_used = plan_sites(&current);
    let victim_site = now_used[now_used.len() - 1].clone();
    let victim = agents.iter().position(|a| a.site == victim_site).unwrap();
    eventually(
        Duration::from_secs(60),
        "the victim's agent to hold the job's current assignment",
        || async {
            let status = agents[victim].status().await?;
            (status.last_revision >= current.revision
                && status.assignments.iter().any(|a| a.job_id == placed.id))
            .then_some(())
        },
    )
    .await;
    let revision_before_death = {
        let status = agents[victim].status().await.unwrap();
        status.last_revision
    };
    let died_at = Instant::now();
    agents[victim].kill();
    let persisted = agents[victim].persisted_revision();
    assert!(persisted >= revision_before_death);
    let detected = eventually(ttl * 4, "the dead agent's site to go down", || async {
        let sites = sites(any(&replicas)).await?;
        (site_state(&sites, &victim_site)?.0 == pb::SiteState::Down).then(|| died_at.elapsed())
    })
    .await;
    eprintln!(
        "agent of {victim_site} killed, leader alive: site marked down after {} ms (lease TTL {} ms, renewals every {} ms)",
        detected.as_millis(),
        ttl.as_millis(),
        (ttl / 5).as_millis()
    );
    assert!(
        detected >= ttl / 2,
        "site marked down after {detected:?}, sooner than a lease could lapse ({ttl:?})"
    );
    assert!(
        detected <= ttl + Duration::from_secs(3),
        "site marked down after {detected:?}, far beyond the TTL {ttl:?}"
    );
    // The job moves off the dead site.
    let replanned = eventually(
        Duration::from_secs(60),
        "the job to be re-planned",
        || async {
            let mut c = client(any(&replicas)).await;
            let job = c
                .get_job(pb::GetJobRequest {
                    job_id: placed.id.clone(),
                    allow_stale: false,
                })
                .await
                .ok()?
                .into_inner()
                .job?;
            (job.revision > current.revision).then_some(job)
        },
    )
    .await;
    assert!(
        !plan_sites(&replanned).contains(&victim_site),
        "re-planned job still uses {victim_site}: {:?}",
        plan_sites(&replanned)
    );

    // Restart it: same inventory, watch resumes after what it handled.
    agents[victim].start();
    let back = eventually(Duration::from_secs(60), "the site to come back", || async {
        let sites = sites(any(&replicas)).await?;
        let site = sites
            .into_iter()
            .find(|s| s.site.as_ref().is_some_and(|site| site.id == victim_site))?;
        (site.state() == pb::SiteState::Up).then_some(site)
    })
    .await;
    assert_eq!(back.site.as_ref(), Some(&inventory_before(&victim_site)));
    let status = eventually(
        Duration::from_secs(60),
        "the restarted agent to catch up and hold its lease",
        || async {
            let status = agents[victim].status().await?;
            // On a loaded machine a renewal can miss its TTL right after the
            // restart; the agent then registers again, and must end up
            // holding a lease.
            (status.last_revision >= replanned.revision
                && status.lease_state() == pb::LeaseState::Held)
                .then_some(status)
        },
    )
    .await;
    let handled = &status.handled_revisions;
    assert!(
        handled.contains(&replanned.revision),
        "the restarted agent did not act on the re-plan at revision {}: handled {handled:?}\n{}",
        replanned.revision,
        agents[victim].log_tail()
    );
    assert!(
        handled.iter().all(|r| *r > persisted),
        "the restarted agent acted again on revisions up to {persisted}: {handled:?}"
    );
    assert!(
        handled.windows(2).all(|w| w[0] < w[1]),
        "an assignment was handled twice: {handled:?}"
    );
    assert!(
        status.assignments.iter().all(|a| a.job_id != placed.id),
        "the job left {victim_site} but the agent still lists it: {:?}",
        status.assignments
    );
    assert_eq!(status.lease_state(), pb::LeaseState::Held);

    // A rack of frankfurt is drained: the agent's rescan sends the change
    // as a delta under its lease; no re-registration, no transition.
    let before = sites(any(&replicas)).await.unwrap();
    let frankfurt = |sites: &[pb::SiteStatus]| {
        sites
            .iter()
            .find(|s| s.site.as_ref().is_some_and(|x| x.id == "frankfurt"))
            .cloned()
            .unwrap()
    };
    let text = std::fs::read_to_string(&topology_copy).unwrap();
    let mut edited = Topology::from_toml("copy", &text).unwrap();
    let group = &mut edited
        .sites
        .iter_mut()
        .find(|s| s.id == "frankfurt")
        .unwrap()
        .buildings[0]
        .domains[0];
    let per_domain = group.gpus_per_domain();
    group.count -= 1;
    // Replaced atomically, as a scheduler's view changes: an agent reading
    // a half-written file would see a building vanish.
    let staged = dir.path().join("topology.toml.new");
    std::fs::write(&staged, edited.to_toml().unwrap()).unwrap();
    std::fs::rename(&staged, &topology_copy).unwrap();
    let drained = eventually(
        Duration::from_secs(30),
        "the drained rack to reach the coordinator",
        || async {
            let site = frankfurt(&sites(any(&replicas)).await?);
            (site.gpus + per_domain == frankfurt(&before).gpus).then_some(site)
        },
    )
    .await;
    let log = || {
        agents
            .iter()
            .find(|a| a.site == "frankfurt")
            .unwrap()
            .log_tail()
    };
    assert_eq!(drained.state(), pb::SiteState::Up);
    assert_eq!(
        drained.state_revision,
        frankfurt(&before).state_revision,
        "frankfurt changed state while its rack drained:\n{}",
        log()
    );
    assert_eq!(
        drained.state_reason,
        frankfurt(&before).state_reason,
        "frankfurt registered again instead of sending a delta:\n{}",
        agents
            .iter()
            .find(|a| a.site == "frankfurt")
            .unwrap()
            .log_tail()
    );

    for agent in &mut agents {
        agent.kill();
    }
    drop(replicas);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_is_detected_soon_after_the_leader_that_died_with_it_is_replaced() {
    let _serial = crate::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let configs = replica_configs(dir.path(), 3);
    let ttl = default_lease_ttl(TICK);
    let urls: Vec<String> = configs
        .iter()
        .map(|c| format!("http://{}", c.listen))
        .collect();
    let mut replicas: Vec<Option<ReplicaProcess>> = configs
        .iter()
        .map(|config| Some(ReplicaProcess::start(dir.path(), config)))
        .collect();
    let topology = repo_file(TOPOLOGY);
    let mut agents: Vec<AgentProcess> = SITES
        .iter()
        .map(|site| AgentProcess::new(dir.path(), site, &urls, &topology))
        .collect();
    let any = |replicas: &[Option<ReplicaProcess>]| replicas.iter().flatten().next().unwrap().addr;
    // Steady: every site up, every agent renewing with the leader.
    let (leader_index, old_leader) = leader(&replicas).await;
    eventually(Duration::from_secs(60), "every agent renewing", || async {
        let sites = sites(replicas[leader_index].as_ref()?.addr).await?;
        if sites.len() != 3 || sites.iter().any(|s| s.state() != pb::SiteState::Up) {
            return None;
        }
        for agent in &agents {
            let status = agent.status().await?;
            (status.leader_id == old_leader && status.renewals > 0).then_some(())?;
        }
        Some(())
    })
    .await;
    let before = sites(any(&replicas)).await.unwrap();

    // SIGKILL the agent of virginia, then at once the leader.
    let victim_site = "virginia";
    let victim = agents.iter().position(|a| a.site == victim_site).unwrap();
    let died_at = Instant::now();
    agents[victim].kill();
    drop(replicas[leader_index].take());
    let (_, new_leader) = eventually(Duration::from_secs(20), "a new leader", || async {
        let (i, id) = leader(&replicas).await;
        (id != old_leader).then_some((i, id))
    })
    .await;
    let elected = died_at.elapsed();
    let detected = eventually(
        ttl * 4 + Duration::from_secs(5),
        "virginia to go down",
        || async {
            let sites = sites(any(&replicas)).await?;
            (site_state(&sites, victim_site)?.0 == pb::SiteState::Down).then(|| died_at.elapsed())
        },
    )
    .await;
    eprintln!(
        "leader {old_leader} and the agent of {victim_site} killed together: replica {new_leader} leads after {} ms, \
         {victim_site} marked down after {} ms ({} ms after the election was seen; lease TTL {} ms, election timeout {} ms)",
        elected.as_millis(),
        detected.as_millis(),
        detected.saturating_sub(elected).as_millis(),
        ttl.as_millis(),
        (TICK * 10).as_millis()
    );
    // Not before the new leader's grace of at least half a TTL, nor far
    // beyond two election timeouts, the grace and a commit.
    assert!(
        detected >= ttl / 2,
        "{victim_site} marked down after {detected:?}, within half a TTL ({ttl:?})"
    );
    assert!(
        detected <= TICK * 20 + ttl + Duration::from_secs(3),
        "{victim_site} marked down after {detected:?}, far beyond an election and a TTL"
    );

    // The live sites kept their leases through the leader change.
    tokio::time::sleep(ttl).await;
    let after = sites(any(&replicas)).await.unwrap();
    for site in SITES.iter().filter(|s| **s != victim_site) {
        assert_eq!(
            site_state(&after, site),
            site_state(&before, site),
            "site {site} changed state after the leader kill:\n{}",
            agents.iter().find(|a| a.site == *site).unwrap().log_tail()
        );
    }
    for agent in &mut agents {
        agent.kill();
    }
    drop(replicas);
}
