//! Three in-process replicas over real gRPC with faults on their raft
//! transport (the test kit's `faults`), where the gRPC services themselves
//! are under test: concurrent clients through random replicas, the status
//! codes of failed writes, linearizable reads. The scenarios that hold for
//! any cluster (a healed minority, a follower behind a compacted log, drops
//! and delays, an isolated leader) are the test kit's, run on both kinds of
//! cluster in `scenarios.rs`. Every test prints its seed; `LONGHAUL_SEED`
//! replays one.

use std::collections::BTreeSet;
use std::time::Duration;

use longhaul_coordinator::consensus::NodeConfig;
use longhaul_coordinator::server::{Replica, ReplicaConfig};
use longhaul_core::rng::SeedRng;
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use longhaul_testkit::faults::{Faults, Route};
use longhaul_testkit::seed;
use tonic::Code;
use tonic::transport::Channel;

use crate::util::{client, eventually, leader_of, replica_configs, small_job};

/// One connection per replica, shared by a test's requests (clones share it).
type Client = CoordinatorClient<Channel>;

/// Starts three replicas whose transports share `faults`.
async fn start(
    dir: &std::path::Path,
    faults: &Faults,
    tune: impl Fn(&mut NodeConfig),
) -> (Vec<ReplicaConfig>, Vec<Option<Replica>>) {
    let mut configs = replica_configs(dir, 3);
    let mut replicas = Vec::new();
    for config in &mut configs {
        tune(&mut config.node);
        config.message_filter = faults.filter();
        replicas.push(Some(Replica::start(config.clone()).await.unwrap()));
    }
    (configs, replicas)
}

/// Submits job `name` through `to`, waiting at most `timeout`.
async fn submit(to: &Client, name: &str, timeout: Duration) -> Result<u64, tonic::Status> {
    let mut request = tonic::Request::new(pb::SubmitJobRequest {
        spec: Some(small_job(name)),
        expected_revision: 0,
    });
    request.set_timeout(timeout);
    let response = to.clone().submit_job(request).await?;
    Ok(response.into_inner().header.unwrap_or_default().revision)
}

async fn stop(replicas: Vec<Option<Replica>>) {
    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}

/// Writes through random replicas while every raft message may be lost
/// (10 %) or held back (0–20 ms): each write succeeds or fails with a
/// status that says to retry, and every acknowledged write is then read
/// back, linearizably, on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_random_drops_and_delays() {
    const WRITERS: u64 = 3;
    const WRITES_EACH: usize = 15;
    let seed = seed("random drops and delays", 3);
    let faults = Faults::new(seed);
    faults.drop_randomly(Route::All, 0.10);
    faults.delay(Route::All, Duration::ZERO, Duration::from_millis(20));
    let dir = tempfile::tempdir().unwrap();
    let (configs, replicas) = start(dir.path(), &faults, |_| {}).await;
    leader_of(&replicas).await;
    let mut clients = Vec::new();
    for config in &configs {
        clients.push(client(config.listen).await);
    }

    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let clients = clients.clone();
        let mut rng = SeedRng::new(seed.wrapping_add(writer));
        writers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..WRITES_EACH {
                let name = format!("w{writer}-{i}");
                let to = &clients[rng.index(clients.len())];
                let outcome = submit(to, &name, Duration::from_secs(3)).await;
                outcomes.push((name, outcome));
            }
            outcomes
        }));
    }
    let mut acknowledged = BTreeSet::new();
    let mut failed = Vec::new();
    for writer in writers {
        for (name, outcome) in writer.await.unwrap() {
            match outcome {
                Ok(_) => {
                    acknowledged.insert(name);
                }
                Err(status) => {
                    assert!(
                        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
                        "{name}: not a clear failure: {status:?}"
                    );
                    failed.push((name, status.code()));
                }
            }
        }
    }
    eprintln!(
        "{} acknowledged, {} failed {failed:?}; {} messages dropped, {} delayed",
        acknowledged.len(),
        failed.len(),
        faults.dropped(),
        faults.delayed()
    );
    let total = WRITERS as usize * WRITES_EACH;
    assert!(
        acknowledged.len() * 2 >= total,
        "most writes commit despite the faults"
    );
    assert!(faults.dropped() > 0 && faults.delayed() > 0);

    // Still under the same faults, every replica serves every acknowledged
    // write on a linearizable read.
    for to in &clients {
        let acknowledged = &acknowledged;
        eventually(
            Duration::from_secs(30),
            "every acknowledged write on every replica",
            || async move {
                let mut request = tonic::Request::new(pb::ListJobsRequest { allow_stale: false });
                request.set_timeout(Duration::from_secs(3));
                let jobs = to.clone().list_jobs(request).await.ok()?;
                let ids: BTreeSet<String> =
                    jobs.into_inner().jobs.into_iter().map(|j| j.id).collect();
                acknowledged.is_subset(&ids).then_some(())
            },
        )
        .await;
    }
    stop(replicas).await;
}

/// A watch on a follower that is cut off while the leader compacts its log
/// past it: when the network heals, the follower catches up by installing a
/// snapshot, and the watch goes on from where it was with every revision in
/// order, taken from the snapshot's history, never a jump to the snapshot's
/// revision (or it fails with OUT_OF_RANGE, and the client re-lists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_follower_that_installs_a_snapshot_skips_no_revision() {
    let faults = Faults::new(seed("watch across a snapshot", 5));
    let dir = tempfile::tempdir().unwrap();
    let compacting = |node: &mut NodeConfig| {
        node.tick_interval = Duration::from_millis(50);
        node.snapshot_interval_entries = 20;
        node.compaction_retained_entries = 5;
    };
    let (configs, replicas) = start(dir.path(), &faults, compacting).await;
    let leader = leader_of(&replicas).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let at_leader = client(configs[leader as usize - 1].listen).await;
    for i in 0..3 {
        submit(&at_leader, &format!("before-{i}"), Duration::from_secs(5))
            .await
            .unwrap();
    }
    let status = |id: u64| replicas[id as usize - 1].as_ref().unwrap().raft.status();
    eventually(
        Duration::from_secs(30),
        "the follower to catch up",
        || async { (status(follower).applied_index == status(leader).applied_index).then_some(()) },
    )
    .await;
    let from = replicas[follower as usize - 1]
        .as_ref()
        .unwrap()
        .raft
        .state()
        .read()
        .revision();

    let others: Vec<u64> = (1..=3).filter(|id| *id != follower).collect();
    let partition = faults.partition(&[&[follower], &others]);
    let mut at_follower = client(configs[follower as usize - 1].listen).await;
    let mut watch = at_follower
        .watch(pb::WatchRequest {
            after_revision: from,
            kinds: vec!["job".into()],
        })
        .await
        .unwrap()
        .into_inner();
    const DURING: u64 = 60;
    for i in 0..DURING {
        submit(&at_leader, &format!("during-{i}"), Duration::from_secs(5))
            .await
            .unwrap();
    }
    faults.remove(partition);

    // Every revision after `from`, in order, or a clear OUT_OF_RANGE.
    let mut seen = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        while (seen.len() as u64) < DURING {
            match watch.message().await {
                Ok(Some(event)) => seen.push(event.revision),
                Ok(None) => return Err("the watch ended".to_string()),
                Err(status) if status.code() == Code::OutOfRange => return Ok(false),
                Err(status) => return Err(format!("the watch failed: {status:?}")),
            }
        }
        Ok(true)
    })
    .await;
    let complete = match outcome {
        Ok(Ok(complete)) => complete,
        Ok(Err(error)) => panic!("{error} after {seen:?}"),
        Err(_) => panic!("the watch stalled after {seen:?}"),
    };
    let expected: Vec<u64> = (from + 1..=from + seen.len() as u64).collect();
    assert_eq!(seen, expected, "the watch skipped or repeated revisions");
    let healed = status(follower);
    assert!(
        healed.snapshots_installed >= 1,
        "the follower caught up without a snapshot, so the test showed nothing: {healed:?}"
    );
    if complete {
        assert_eq!(seen.len() as u64, DURING);
    }
    eprintln!(
        "watch from revision {from}: {} revisions in order, {}",
        seen.len(),
        if complete {
            "complete"
        } else {
            "then OUT_OF_RANGE"
        }
    );
    stop(replicas).await;
}

/// A leader acknowledges a renewal only once a quorum confirmed it still
/// leads (`longhaul_core::lease`, step 1): one cut off from the others
/// refuses, though the agent reaches it, and the renewal goes through again
/// once the cluster is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_quorum_acknowledges_no_renewal() {
    use longhaul_proto::v1::agent_service_client::AgentServiceClient;

    let faults = Faults::new(seed("no renewal without a quorum", 3));
    let dir = tempfile::tempdir().unwrap();
    let (configs, replicas) = start(dir.path(), &faults, |_| {}).await;
    let leader = leader_of(&replicas).await;
    let agent = |id: u64| {
        let addr = configs[id as usize - 1].listen;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        AgentServiceClient::new(channel)
    };
    let topology = longhaul_core::Topology::from_toml(
        "two-campuses-80km.toml",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    let lease_id = eventually(Duration::from_secs(20), "north to register", || async {
        let request = pb::RegisterRequest {
            site_id: "north".into(),
            inventory: topology
                .site("north")
                .map(longhaul_coordinator::server::convert::site_to_wire),
            data_address: String::new(),
        };
        Some(
            agent(leader)
                .register(request)
                .await
                .ok()?
                .into_inner()
                .lease_id,
        )
    })
    .await;
    let renew = |id: u64| async move {
        let mut request = tonic::Request::new(pb::KeepAliveRequest {
            site_id: "north".into(),
            lease_id,
        });
        request.set_timeout(Duration::from_millis(500));
        agent(id).keep_alive(request).await
    };
    renew(leader).await.unwrap();

    let cut = faults.isolate(leader);
    let refused = renew(leader).await.unwrap_err();
    assert!(
        matches!(refused.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{refused:?}"
    );
    faults.remove(cut);
    eventually(Duration::from_secs(20), "a renewal once healed", || async {
        renew(leader).await.ok()
    })
    .await;
    stop(replicas).await;
}
