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
