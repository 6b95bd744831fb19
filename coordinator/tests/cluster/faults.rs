//! Three in-process replicas over real gRPC with faults on their raft
//! transport (the test kit's `faults`): the virtual-time harness's partition and
//! drop/delay scenarios, on the real transport. Every test prints its seed;
//! `LONGHAUL_SEED` replays one.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use longhaul_coordinator::consensus::NodeConfig;
use longhaul_coordinator::server::{Replica, ReplicaConfig, Role, Status};
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

/// How long a cut-off follower stays away: several election timeouts of
/// [`steady`]'s timers (0.5–1 s).
const ISOLATION: Duration = Duration::from_secs(3);

/// Timers slow enough that a loaded two-core machine does not elect a new
/// leader by itself: 50 ms ticks, an election timeout of 0.5–1 s. The
/// tests that assert the term stays the same use them.
fn steady(node: &mut NodeConfig) {
    node.tick_interval = Duration::from_millis(50);
}

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

fn status(replicas: &[Option<Replica>], id: u64) -> Status {
    replicas[id as usize - 1].as_ref().unwrap().raft.status()
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

/// Waits until `follower` follows `leader` and has applied exactly what it
/// has (call it with no write in flight), then checks their states are equal.
async fn caught_up(replicas: &[Option<Replica>], leader: u64, follower: u64, what: &str) {
    eventually(Duration::from_secs(30), what, || async {
        let (l, f) = (status(replicas, leader), status(replicas, follower));
        (f.leader_id == leader && f.applied_index == l.applied_index).then_some(())
    })
    .await;
    let state = |id: u64| replicas[id as usize - 1].as_ref().unwrap().raft.state();
    let (ours, theirs) = (state(leader).read().clone(), state(follower).read().clone());
    assert_eq!(ours.revision(), theirs.revision());
    assert!(
        ours == theirs,
        "the follower's state differs from the leader's"
    );
}

async fn stop(replicas: Vec<Option<Replica>>) {
    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}

/// One follower is cut off for several election timeouts while the others
/// go on committing. Pre-vote keeps its term: when the network heals it
/// rejoins as a follower of the same leader in the same term, and catches
/// up on every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_minority_heals_without_disrupting_the_majority() {
    let faults = Faults::new(seed("partitioned minority", 1));
    let dir = tempfile::tempdir().unwrap();
    let (configs, replicas) = start(dir.path(), &faults, steady).await;
    let leader = leader_of(&replicas).await;
    let term = status(&replicas, leader).term;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let at_leader = client(configs[leader as usize - 1].listen).await;
    submit(&at_leader, "before", Duration::from_secs(5))
        .await
        .unwrap();

    let isolation = faults.isolate(follower);
    let started = Instant::now();
    let mut written = vec!["before".to_string()];
    while started.elapsed() < ISOLATION {
        let name = format!("during-{}", written.len());
        // The majority is whole: every write commits.
        submit(&at_leader, &name, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("{name} failed while the majority is whole: {e:?}"));
        written.push(name);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The cut-off follower lost the leader and campaigns, but pre-vote
    // keeps it from raising its term: no one would vote for it.
    let away = status(&replicas, follower);
    assert_eq!(
        (away.leader_id, away.role),
        (0, Role::Candidate),
        "the isolated follower is a pre-candidate: {away:?}"
    );
    assert_eq!(away.term, term, "pre-vote keeps the term: {away:?}");
    assert!(faults.dropped() > 0);
    // Nothing the follower does reaches the majority yet; were its leader
    // to change now, the machine stalled it for an election timeout.
    let majority = status(&replicas, leader);
    assert_eq!(
        (majority.role, majority.term),
        (Role::Leader, term),
        "the majority lost its leader before the heal: {majority:?}"
    );

    faults.remove(isolation);
    caught_up(
        &replicas,
        leader,
        follower,
        "the healed follower to catch up",
    )
    .await;
    for id in 1..=3 {
        let now = status(&replicas, id);
        assert_eq!(
            (now.leader_id, now.term),
            (leader, term),
            "replica {id} after the heal: {now:?}"
        );
    }
    assert_eq!(status(&replicas, leader).role, Role::Leader);
    let state = replicas[follower as usize - 1]
        .as_ref()
        .unwrap()
        .raft
        .state()
        .read()
        .clone();
    for name in &written {
        assert!(
            state.job(name).is_some(),
            "{name} is missing on the follower"
        );
    }
    eprintln!(
        "{} writes while one follower was away; {} messages dropped",
        written.len(),
        faults.dropped()
    );
    stop(replicas).await;
}

/// The leader compacts its log past a follower that is cut off, so after
/// the heal the follower can only catch up from a snapshot: it installs
/// one, and ends with the leader's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_partitioned_while_the_log_is_compacted_catches_up_by_snapshot() {
    let faults = Faults::new(seed("compacted log", 2));
    let dir = tempfile::tempdir().unwrap();
    let compacting = |node: &mut NodeConfig| {
        steady(node);
        node.snapshot_interval_entries = 20;
        node.compaction_retained_entries = 5;
    };
    let (configs, replicas) = start(dir.path(), &faults, compacting).await;
    let leader = leader_of(&replicas).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let at_leader = client(configs[leader as usize - 1].listen).await;
    for i in 0..5 {
        submit(&at_leader, &format!("before-{i}"), Duration::from_secs(5))
            .await
            .unwrap();
    }
    caught_up(&replicas, leader, follower, "the follower to follow").await;

    // The other two replicas are a partition of their own.
    let others: Vec<u64> = (1..=3).filter(|id| *id != follower).collect();
    let partition = faults.partition(&[&[follower], &others]);
    let behind = status(&replicas, follower).applied_index;
    // 60 entries with compaction every 20 beyond the last 5 retained: the
    // leader's log starts well past what the follower has.
    for i in 0..60 {
        submit(&at_leader, &format!("during-{i}"), Duration::from_secs(5))
            .await
            .unwrap();
    }
    let ahead = status(&replicas, leader).applied_index;
    assert!(ahead >= behind + 60, "{behind} -> {ahead}");
    assert_eq!(status(&replicas, follower).applied_index, behind);
    assert_eq!(status(&replicas, follower).snapshots_installed, 0);

    faults.remove(partition);
    caught_up(
        &replicas,
        leader,
        follower,
        "the healed follower to catch up",
    )
    .await;
    let healed = status(&replicas, follower);
    assert!(
        healed.snapshots_installed >= 1,
        "the follower caught up without a snapshot: {healed:?}"
    );
    eprintln!(
        "follower {follower}: applied {behind} -> {} through {} snapshot(s)",
        healed.applied_index, healed.snapshots_installed
    );
    stop(replicas).await;
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
