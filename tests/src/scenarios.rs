//! Fault scenarios written once over [`FaultCluster`], run on the
//! virtual-time cluster and on replicas over real gRPC
//! (`coordinator/tests/cluster/scenarios.rs`). Each takes a started cluster
//! of three replicas and panics, saying what went wrong, on a violation.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cluster::FaultCluster;
use crate::faults::Route;

/// How long a cut-off replica stays away: several election timeouts.
const AWAY: Duration = Duration::from_secs(3);
/// Time for a write to be acknowledged on a whole majority.
const WRITE: Duration = Duration::from_secs(5);

/// Waits until `follower` follows `leader` and has applied what it has,
/// with the same keys.
async fn caught_up<C: FaultCluster>(c: &mut C, leader: u64, follower: u64, what: &str) {
    c.until(Duration::from_secs(30), what, |c| {
        let (l, f) = (c.status(leader), c.status(follower));
        f.leader_id == leader && f.applied_index == l.applied_index
    })
    .await;
    assert_eq!(
        c.keys(follower),
        c.keys(leader),
        "{what}: the follower's state differs from the leader's"
    );
}

fn a_follower<C: FaultCluster>(c: &C, leader: u64) -> u64 {
    c.ids()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a cluster of three")
}

/// One follower is cut off for several election timeouts while the others
/// go on committing. Pre-vote keeps its term: when the network heals it
/// rejoins as a follower of the same leader in the same term, and catches
/// up on every write.
pub async fn a_partitioned_minority_heals_without_disrupting_the_majority<C: FaultCluster>(
    c: &mut C,
) {
    let leader = c.leader().await;
    let term = c.status(leader).term;
    let follower = a_follower(c, leader);
    assert!(c.write("before", WRITE).await, "a whole cluster writes");

    let isolation = c.faults().isolate(follower);
    let mut written = vec!["before".to_string()];
    let step = Duration::from_millis(100);
    let mut away = Duration::ZERO;
    while away < AWAY {
        let key = format!("during-{}", written.len());
        // The majority is whole: every write commits.
        assert!(
            c.write(&key, WRITE).await,
            "{key} failed while the majority is whole"
        );
        written.push(key);
        c.pass(step).await;
        away += step;
    }
    // The cut-off follower lost the leader and campaigns, but pre-vote
    // keeps it from raising its term: no one would vote for it.
    let cut = c.status(follower);
    assert!(
        cut.leader_id == 0 && cut.campaigning,
        "the isolated follower is a pre-candidate: {cut:?}"
    );
    assert_eq!(cut.term, term, "pre-vote keeps the term: {cut:?}");
    assert!(c.faults().dropped() > 0);
    let majority = c.status(leader);
    assert!(
        majority.is_leader && majority.term == term,
        "the majority lost its leader before the heal: {majority:?}"
    );

    c.faults().remove(isolation);
    caught_up(c, leader, follower, "the healed follower to catch up").await;
    for id in c.ids() {
        let now = c.status(id);
        assert_eq!(
            (now.leader_id, now.term),
            (leader, term),
            "replica {id} after the heal: {now:?}"
        );
    }
    let keys = c.keys(follower);
    for key in &written {
        assert!(keys.contains(key), "{key} is missing on the follower");
    }
}

/// The leader compacts its log past a follower that is cut off (the
/// cluster compacts every 20 entries), so after the heal the follower can
/// only catch up from a snapshot: it installs one, and ends with the
/// leader's state.
pub async fn a_follower_partitioned_while_the_log_is_compacted_catches_up_by_snapshot<
    C: FaultCluster,
>(
    c: &mut C,
) {
    let leader = c.leader().await;
    let follower = a_follower(c, leader);
    for i in 0..5 {
        assert!(c.write(&format!("before-{i}"), WRITE).await);
    }
    caught_up(c, leader, follower, "the follower to follow").await;

    let others: Vec<u64> = c.ids().into_iter().filter(|id| *id != follower).collect();
    let partition = c.faults().partition(&[&[follower], &others]);
    let behind = c.status(follower).applied_index;
    for i in 0..60 {
        assert!(
            c.write(&format!("during-{i}"), WRITE).await,
            "during-{i} failed while the majority is whole"
        );
    }
    let ahead = c.status(leader).applied_index;
    assert!(ahead >= behind + 60, "{behind} -> {ahead}");
    assert_eq!(c.status(follower).applied_index, behind);
    assert_eq!(c.status(follower).snapshots_installed, 0);

    c.faults().remove(partition);
    caught_up(c, leader, follower, "the healed follower to catch up").await;
    let healed = c.status(follower);
    assert!(
        healed.snapshots_installed >= 1,
        "the follower caught up without a snapshot: {healed:?}"
    );
}

/// Every raft message may be lost (10 %) or held back (0-20 ms): writes
/// still commit, mostly, and every acknowledged write is on every replica
/// once the cluster has settled, under the same faults.
pub async fn acknowledged_writes_survive_random_drops_and_delays<C: FaultCluster>(c: &mut C) {
    c.leader().await;
    c.faults().drop_randomly(Route::All, 0.10);
    c.faults()
        .delay(Route::All, Duration::ZERO, Duration::from_millis(20));
    let mut acknowledged = BTreeSet::new();
    const WRITES: usize = 40;
    // A write that times out is tried again (a put of the same key is idempotent), up to
    // three times: on a loaded machine a 10 % loss of every raft message can cost an
    // election or two, and the check is that writes get through, not how fast.
    // Retries stop after 90 s in all, so the test stays bounded.
    let retries_until = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut attempts = 0;
    for i in 0..WRITES {
        let key = format!("w-{i}");
        for attempt in 0..3 {
            if attempt > 0 && tokio::time::Instant::now() > retries_until {
                break;
            }
            attempts += 1;
            if c.write(&key, Duration::from_secs(3)).await {
                acknowledged.insert(key.clone());
                break;
            }
        }
    }
    assert!(
        acknowledged.len() * 2 >= WRITES,
        "most writes commit despite the faults: {} of {WRITES} in {attempts} attempts",
        acknowledged.len()
    );
    assert!(c.faults().dropped() > 0 && c.faults().delayed() > 0);
    c.until(
        Duration::from_secs(30),
        "every acknowledged write on every replica",
        |c| {
            c.ids()
                .into_iter()
                .all(|id| acknowledged.is_subset(&c.keys(id)))
        },
    )
    .await;
}

/// The leader is cut off from both followers: they elect a new leader in
/// a higher term that serves writes; when the old leader is back it
/// follows the new one and has every acknowledged write, before and after.
pub async fn an_isolated_leader_is_replaced_and_no_acknowledged_write_is_lost<C: FaultCluster>(
    c: &mut C,
) {
    let old = c.leader().await;
    let term = c.status(old).term;
    let mut acknowledged = Vec::new();
    for i in 0..5 {
        let key = format!("before-{i}");
        assert!(c.write(&key, WRITE).await);
        acknowledged.push(key);
    }
    let isolation = c.faults().isolate(old);
    c.until(
        Duration::from_secs(30),
        "a new leader among the others",
        |c| {
            c.ids().into_iter().any(|id| {
                let s = c.status(id);
                id != old && s.is_leader && s.term > term
            })
        },
    )
    .await;
    for i in 0..5 {
        let key = format!("after-{i}");
        // The old leader may still take a write it cannot commit; the new
        // one commits the rest.
        if c.write(&key, WRITE).await {
            acknowledged.push(key);
        }
    }
    assert!(acknowledged.len() > 5, "the new leader commits writes");
    c.faults().remove(isolation);
    let new = c
        .ids()
        .into_iter()
        .find(|id| *id != old && c.status(*id).is_leader)
        .expect("the new leader");
    c.until(Duration::from_secs(30), "the old leader to follow", |c| {
        let s = c.status(old);
        !s.is_leader && s.leader_id != old && s.leader_id != 0
    })
    .await;
    let leader = c.leader().await;
    caught_up(c, leader, old, "the old leader to catch up").await;
    let keys = c.keys(old);
    for key in &acknowledged {
        assert!(keys.contains(key), "{key} is missing on the old leader");
    }
    assert!(c.status(new).term > term);
}
