//! Three in-process replicas over real gRPC on loopback.

use std::time::Duration;

use longhaul_coordinator::server::Replica;
use longhaul_proto::v1 as pb;
use tonic::Code;

use crate::util::{client, eventually, leader_of, replica_configs, small_job};

fn link(a: &str, b: &str) -> pb::WanLink {
    pb::WanLink {
        site_a: a.into(),
        site_b: b.into(),
        distance_km: 80.0,
        parallel_links: 4,
        link_bps: 400_000_000_000,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reads_forwarding_and_failover() {
    let dir = tempfile::tempdir().unwrap();
    let configs = replica_configs(dir.path(), 3);
    let mut replicas = Vec::new();
    for config in &configs {
        replicas.push(Some(Replica::start(config.clone()).await.unwrap()));
    }
    let leader = leader_of(&replicas).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let mut to_follower = client(configs[follower as usize - 1].listen).await;

    // A write sent to a follower is forwarded to the leader; it refers to
    // sites that are not registered, so it is refused with NOT_FOUND naming
    // the field, and changes nothing.
    let before = to_follower
        .list_links(pb::ListLinksRequest::default())
        .await
        .unwrap()
        .into_inner();
    let refused = to_follower
        .put_link(pb::PutLinkRequest {
            link: Some(link("north", "south")),
            expected_revision: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(refused.message().contains("link.between[0]"), "{refused:?}");
    let after = to_follower
        .list_links(pb::ListLinksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        before.header.unwrap().revision,
        after.header.unwrap().revision
    );

    // A malformed request is refused before consensus.
    let malformed = to_follower
        .put_link(pb::PutLinkRequest {
            link: None,
            expected_revision: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (malformed.code(), malformed.message()),
        (Code::InvalidArgument, "field `link`: is required")
    );

    // A job submitted through the follower is visible on every replica with
    // linearizable reads, at the revision the write returned.
    let spec = pb::JobSpec {
        name: "llama".into(),
        model: Some(pb::ModelShape {
            parameters: 7_000_000_000,
            layers: 32,
            hidden_size: 4096,
            attention_heads: 32,
            sequence_length: 4096,
            vocabulary_size: 0,
            kv_heads: 0,
            moe: None,
        }),
        global_batch: 256,
        micro_batch: 1,
        ..Default::default()
    };
    let submitted = to_follower
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec.clone()),
            expected_revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let revision = submitted.header.unwrap().revision;
    assert!(revision > 0);
    for config in &configs {
        let job = client(config.listen)
            .await
            .get_job(pb::GetJobRequest {
                job_id: "llama".into(),
                allow_stale: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(job.header.unwrap().revision >= revision);
        // No site is registered, so placement found the job infeasible and
        // says why.
        let job = job.job.unwrap();
        assert_eq!(job.state, pb::JobState::Infeasible as i32);
        assert!(!job.infeasible_reason.is_empty());
    }
    // Compare-and-set with a stale revision fails and changes nothing.
    let stale = to_follower
        .cancel_job(pb::CancelJobRequest {
            job_id: "llama".into(),
            expected_revision: revision + 7,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");

    // Stop the leader: the others elect a new one and keep serving writes.
    replicas[leader as usize - 1].take().unwrap().stop().await;
    let new_leader = leader_of(&replicas).await;
    assert_ne!(new_leader, leader);
    let mut survivor = client(configs[new_leader as usize - 1].listen).await;
    survivor
        .cancel_job(pb::CancelJobRequest {
            job_id: "llama".into(),
            expected_revision: 0,
        })
        .await
        .unwrap();
    // The acknowledged submit survived the failover.
    let job = survivor
        .get_job(pb::GetJobRequest {
            job_id: "llama".into(),
            allow_stale: false,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.state, pb::JobState::Cancelled as i32);

    // The old leader restarts from its store alone and catches up.
    let restarted = Replica::start(configs[leader as usize - 1].clone())
        .await
        .unwrap();
    replicas[leader as usize - 1] = Some(restarted);
    let mut old = client(configs[leader as usize - 1].listen).await;
    let job = eventually(
        Duration::from_secs(20),
        "the restarted replica to catch up",
        || {
            let mut old = old.clone();
            async move {
                let job = old
                    .get_job(pb::GetJobRequest {
                        job_id: "llama".into(),
                        allow_stale: false,
                    })
                    .await
                    .ok()?;
                let job = job.into_inner().job?;
                (job.state == pb::JobState::Cancelled as i32).then_some(job)
            }
        },
    )
    .await;
    assert_eq!(job.id, "llama");
    let cluster = old
        .get_cluster(pb::GetClusterRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cluster.members.len(), 3);
    assert_ne!(cluster.leader_id, 0);

    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_requests_fail_fast_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let configs = replica_configs(dir.path(), 3);
    // Only one of three replicas runs: no leader can be elected.
    let lonely = Replica::start(configs[0].clone()).await.unwrap();
    let mut c = client(configs[0].listen).await;
    let mut request = tonic::Request::new(pb::ListSitesRequest { allow_stale: false });
    request.set_timeout(Duration::from_millis(500));
    let started = std::time::Instant::now();
    let error = c.list_sites(request).await.unwrap_err();
    assert!(
        matches!(error.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // Stale reads are still served.
    c.list_sites(pb::ListSitesRequest { allow_stale: true })
        .await
        .unwrap();
    lonely.stop().await;
}

/// Registers every site of `topology` and configures its links through
/// consensus, as agents and operators do over their own APIs.
async fn register(
    raft: &longhaul_coordinator::server::raft_loop::RaftHandle,
    topology: &longhaul_core::Topology,
) {
    use longhaul_core::state::{Command, Request};
    for site in &topology.sites {
        let command = Command::RegisterSite {
            site: site.clone(),
            data_address: String::new(),
            at_unix_ms: 0,
            lease_id: 0,
            lease_ttl_ms: 0,
        };
        raft.propose(Request::new(command)).await.unwrap();
    }
    for link in &topology.links {
        raft.propose(Request::new(Command::PutLink { link: link.clone() }))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitted_jobs_are_placed_on_the_registered_sites() {
    let dir = tempfile::tempdir().unwrap();
    let config = replica_configs(dir.path(), 1).remove(0);
    let replicas = [Some(Replica::start(config.clone()).await.unwrap())];
    leader_of(&replicas).await;
    let raft = &replicas[0].as_ref().unwrap().raft;
    // Sites register through consensus (agents do this over their own API).
    let topology = longhaul_core::Topology::from_toml(
        "two-campuses-80km.toml",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    register(raft, &topology).await;

    let job = longhaul_core::JobSpec::from_toml(
        "llama.toml",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    )
    .unwrap();
    let spec = longhaul_coordinator::server::convert::job_to_wire(&job);
    let mut c = client(config.listen).await;
    // A what-if plan stores nothing ...
    let before = c
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let what_if = c
        .plan(pb::PlanRequest {
            spec: Some(spec.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap();
    let after = c
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    assert_eq!(before, after);
    // ... and equals the plan stored at submission: placement is deterministic.
    let stored = c
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec),
            expected_revision: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(stored.state, pb::JobState::Placed as i32);
    let plan = stored.plan.unwrap();
    assert_eq!(plan, what_if);
    assert_eq!(plan.tensor_parallel, 8, "TP stays inside a scale-up domain");
    assert!(!plan.reasons.is_empty());
    // The stored plan replays from its canonical JSON and keeps every hard constraint.
    let replayed: longhaul_core::placement::Plan =
        serde_json::from_str(&plan.canonical_json).unwrap();
    let live = longhaul_core::Topology {
        name: "registered-sites".into(),
        ..topology
    };
    longhaul_core::placement::validate_plan(&live, &job, &replayed).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_schedule_is_the_planners_and_reads_the_probes() {
    use longhaul_core::job::ModeConstraint;
    use longhaul_core::state::{Command, LinkMeasurement, Request};
    let dir = tempfile::tempdir().unwrap();
    let config = replica_configs(dir.path(), 1).remove(0);
    let replicas = [Some(Replica::start(config.clone()).await.unwrap())];
    leader_of(&replicas).await;
    let raft = &replicas[0].as_ref().unwrap().raft;
    let topology = longhaul_core::Topology::from_toml(
        "two-campuses-500km.toml",
        include_str!("../../../deploy/examples/two-campuses-500km.toml"),
    )
    .unwrap();
    register(raft, &topology).await;
    let link = topology.links[0].clone();
    let mut job = longhaul_core::JobSpec::from_toml(
        "llama.toml",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    )
    .unwrap();
    let mut c = client(config.listen).await;
    let schedule = |job_id: &str| pb::GetSyncScheduleRequest {
        job_id: job_id.into(),
        allow_stale: false,
    };

    // Placed as a pipeline: no outer sync, a clear refusal.
    let submit = |job: &longhaul_core::JobSpec| pb::SubmitJobRequest {
        spec: Some(longhaul_coordinator::server::convert::job_to_wire(job)),
        expected_revision: 0,
    };
    c.submit_job(submit(&job)).await.unwrap();
    let refused = c
        .get_sync_schedule(schedule("llama-70b"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("pipeline"),
        "{}",
        refused.message()
    );

    // As DiLoCo: the schedule is the one placement costed the plan with.
    job.name = "llama-70b-diloco".into();
    job.constraints.cross_site_mode = Some(ModeConstraint::Diloco);
    let stored = c
        .submit_job(submit(&job))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let plan: longhaul_core::placement::Plan =
        serde_json::from_str(&stored.plan.unwrap().canonical_json).unwrap();
    let sync = plan
        .sync
        .clone()
        .expect("a DiLoCo plan carries its schedule");
    let got = c
        .get_sync_schedule(schedule("llama-70b-diloco"))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    assert!(got.planned);
    assert_eq!(got.inner_steps, sync.inner_steps);
    assert_eq!(got.fragments, sync.fragments);
    assert_eq!(got.overlap_steps, sync.overlap_steps);
    assert_eq!(got.schedule.len(), sync.fragments as usize);
    assert_eq!(got.links.len(), 1);
    assert_eq!(got.codec_bits, sync.links[0].bits);
    assert!(!got.links[0].measured);
    assert_eq!(
        serde_json::from_str::<longhaul_core::sync::SyncPlan>(&got.canonical_json).unwrap(),
        sync
    );
    assert!(got.predicted_compute_utilisation > 0.0 && got.predicted_compute_utilisation <= 1.0);

    // A probe that found the link 1,000 times slower than configured: a job
    // placed after it is planned from the probe, with a larger H.
    raft.propose(Request::new(Command::RecordLinkMeasurement {
        site_a: link.between[0].clone(),
        site_b: link.between[1].clone(),
        measurement: LinkMeasurement {
            rtt_ns: 6_000_000,
            loss_rate: 0.0,
            throughput_bps: link.link_rate.bits_per_second() / 1000,
            measured_at_unix_ms: 1,
        },
    }))
    .await
    .unwrap();
    job.name = "llama-70b-probed".into();
    c.submit_job(submit(&job)).await.unwrap();
    let probed = c
        .get_sync_schedule(schedule("llama-70b-probed"))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    assert!(probed.links[0].measured);
    // The slower link needs more hiding: a larger H, or more fragments
    // (each exchange shorter) and overlap.
    assert!(
        (probed.inner_steps, probed.fragments, probed.overlap_steps)
            > (got.inner_steps, got.fragments, got.overlap_steps),
        "H/P/τ {}/{}/{} after the probe, {}/{}/{} before",
        probed.inner_steps,
        probed.fragments,
        probed.overlap_steps,
        got.inner_steps,
        got.fragments,
        got.overlap_steps
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_going_down_re_plans_its_jobs_and_unaffected_plans_stay() {
    use longhaul_core::state::{Command, Request};
    let dir = tempfile::tempdir().unwrap();
    let config = replica_configs(dir.path(), 1).remove(0);
    let replicas = [Some(Replica::start(config.clone()).await.unwrap())];
    leader_of(&replicas).await;
    let raft = &replicas[0].as_ref().unwrap().raft;
    let topology = longhaul_core::Topology::from_toml(
        "two-campuses-80km.toml",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    let register = |site: &longhaul_core::topology::Site| {
        Request::new(Command::RegisterSite {
            site: site.clone(),
            data_address: String::new(),
            at_unix_ms: 0,
            lease_id: 0,
            lease_ttl_ms: 0,
        })
    };
    for site in &topology.sites {
        raft.propose(register(site)).await.unwrap();
    }
    raft.propose(Request::new(Command::PutLink {
        link: topology.links[0].clone(),
    }))
    .await
    .unwrap();
    let job = longhaul_core::JobSpec::from_toml(
        "llama.toml",
        include_str!("../../../deploy/examples/llama-70b.job.toml"),
    )
    .unwrap();
    let mut c = client(config.listen).await;
    let spec = Some(longhaul_coordinator::server::convert::job_to_wire(&job));
    let placed = c
        .submit_job(pb::SubmitJobRequest {
            spec,
            expected_revision: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let sites_of = |job: &pb::Job| -> std::collections::BTreeSet<String> {
        job.plan
            .as_ref()
            .map(|p| p.stages.iter().map(|s| s.site_id.clone()).collect())
            .unwrap_or_default()
    };
    assert!(
        sites_of(&placed).contains("south"),
        "the bundled job uses both campuses"
    );

    // South goes down: the job moves to what is left.
    let down = Command::MarkSiteDown {
        site_id: "south".into(),
        reason: "lease expired".into(),
        at_unix_ms: 1,
        lease_id: None,
    };
    raft.propose(Request::new(down)).await.unwrap();
    let moved = eventually(Duration::from_secs(30), "the job to be re-planned", || {
        let mut c = c.clone();
        async move {
            let job = c
                .get_job(pb::GetJobRequest {
                    job_id: "llama-70b".into(),
                    allow_stale: false,
                })
                .await
                .ok()?;
            let job = job.into_inner().job?;
            (job.revision > placed.revision).then_some(job)
        }
    })
    .await;
    let sites = sites_of(&moved);
    assert!(
        moved.state == pb::JobState::Infeasible as i32 || !sites.contains("south"),
        "re-planned job still uses the down site: {sites:?}"
    );

    // South returns: the job's current plan still holds, so it stays put.
    raft.propose(register(&topology.sites[1])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = c
        .get_job(pb::GetJobRequest {
            job_id: "llama-70b".into(),
            allow_stale: false,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    if moved.state == pb::JobState::Placed as i32 {
        assert_eq!(
            after.revision, moved.revision,
            "a plan that still holds does not move"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_deliver_every_change_in_order_and_resume_from_a_revision() {
    use tokio_stream::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let config = replica_configs(dir.path(), 1).remove(0);
    let replicas = [Some(Replica::start(config.clone()).await.unwrap())];
    leader_of(&replicas).await;
    let mut c = client(config.listen).await;
    let mut live = c
        .watch(pb::WatchRequest {
            after_revision: 0,
            kinds: vec!["job".into()],
        })
        .await
        .unwrap()
        .into_inner();
    for name in ["a", "b", "c"] {
        c.submit_job(pb::SubmitJobRequest {
            spec: Some(small_job(name)),
            expected_revision: 0,
        })
        .await
        .unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), live.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Some(pb::watch_event::Event::Job(job)) = event.event else {
            panic!("not a job event: {event:?}")
        };
        seen.push((event.revision, job.id));
    }
    assert_eq!(
        seen,
        vec![
            (1, "a".to_string()),
            (2, "b".to_string()),
            (3, "c".to_string())
        ]
    );
    // Resuming after revision 1 replays exactly what followed it.
    let mut resumed = c
        .watch(pb::WatchRequest {
            after_revision: 1,
            kinds: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), resumed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.revision, 2);
    // An unknown kind is refused, naming the field.
    let error = c
        .watch(pb::WatchRequest {
            after_revision: 0,
            kinds: vec!["gpu".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().starts_with("field `kinds[0]`"), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joins_and_the_leader_is_removed_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let mut configs = replica_configs(dir.path(), 4);
    // Replica 4 is not a founder: it joins once the cluster has added it.
    let mut joiner = configs.pop().unwrap();
    for config in &mut configs {
        config.initial_cluster.remove(&4);
    }
    let mut replicas = Vec::new();
    for config in &configs {
        replicas.push(Some(Replica::start(config.clone()).await.unwrap()));
    }
    let leader = leader_of(&replicas).await;
    let mut c = client(configs[0].listen).await;
    let added = c
        .add_member(pb::AddMemberRequest {
            name: "d".into(),
            peer_url: format!("http://{}", joiner.listen),
            client_url: String::new(),
            as_learner: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.member.unwrap().id, 4);
    joiner.join = true;
    replicas.push(Some(Replica::start(joiner.clone()).await.unwrap()));
    // The joiner catches up: it sees the leader and the membership.
    eventually(
        Duration::from_secs(30),
        "the joiner to follow the leader",
        || async {
            let status = replicas[3].as_ref()?.raft.status();
            (status.leader_id != 0 && status.conf_state.voters.len() == 4).then_some(())
        },
    )
    .await;

    // Remove the current leader: it hands over, and the rest go on.
    c.remove_member(pb::RemoveMemberRequest { id: leader })
        .await
        .unwrap();
    let mut rest: Vec<Option<Replica>> = Vec::new();
    for (i, replica) in replicas.into_iter().enumerate() {
        if i as u64 + 1 == leader {
            if let Some(replica) = replica {
                replica.stop().await;
            }
        } else {
            rest.push(replica);
        }
    }
    let new_leader = leader_of(&rest).await;
    assert_ne!(new_leader, leader);
    let survivor = rest.iter().flatten().next().unwrap().local_addr;
    let cluster = eventually(
        Duration::from_secs(30),
        "three voters without the old leader",
        || async {
            let mut c = client(survivor).await;
            let cluster = c
                .get_cluster(pb::GetClusterRequest { allow_stale: false })
                .await
                .ok()?
                .into_inner();
            (cluster.members.len() == 3).then_some(cluster)
        },
    )
    .await;
    assert!(
        cluster.members.iter().all(|m| m.id != leader),
        "{cluster:?}"
    );
    // Writes still commit.
    let mut c = client(survivor).await;
    c.submit_job(pb::SubmitJobRequest {
        spec: Some(small_job("after-removal")),
        expected_revision: 0,
    })
    .await
    .unwrap();
    for replica in rest.into_iter().flatten() {
        replica.stop().await;
    }
}
